package probe

import (
	"context"
	"errors"
	"fmt"
)

// Stages of a call, in order. They label the setup-time metrics and the
// load report, and say where a failed call stopped.
const (
	StageSetup       = "setup"       // local: creating the peer connection and offer
	StageSignaling   = "signaling"   // POST of the offer until the answer
	StageICE         = "ice"         // answer applied until ICE connected
	StageDTLS        = "dtls"        // ICE connected until DTLS (peer connection) connected
	StageDataChannel = "datachannel" // DTLS connected until the events channel opened
	StageFirstEcho   = "first_echo"  // connected until the first echoed audio packet
	StageHangup      = "hangup"      // DELETE of the session
	StageTurns       = "turns"       // a talker's turns (Config.Talk), after the connection
)

// SetupStages are the stages whose durations a probe reports, each measured
// from the moment the offer is posted.
var SetupStages = []string{StageSignaling, StageICE, StageDTLS, StageFirstEcho}

// ErrConnectionFailed is returned (inside a CallError) when the peer
// connection reached the failed state during setup.
var ErrConnectionFailed = errors.New("peer connection failed")

// CallError is a failed call: the stage it failed in and why.
type CallError struct {
	Stage string
	Err   error
}

func (e *CallError) Error() string { return fmt.Sprintf("probe: %s: %v", e.Stage, e.Err) }

func (e *CallError) Unwrap() error { return e.Err }

// FailureReason classifies a call's error into a short label for metrics
// and reports: "<stage>_http_<status>" for an error answer from signaling
// (to the offer, or to the hang-up), "<stage>_timeout", "<stage>_failed"
// (the connection failed), "canceled", or "<stage>_error".
func FailureReason(err error) string {
	stage := "other"
	var ce *CallError
	if errors.As(err, &ce) {
		stage = ce.Stage
	}
	var he *HTTPError
	if errors.As(err, &he) {
		return fmt.Sprintf("%s_http_%d", stage, he.Status)
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return stage + "_timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, ErrConnectionFailed):
		return stage + "_failed"
	}
	return stage + "_error"
}

package probe_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/rtcedge/rtcedge/probe"
)

func TestFailureReason(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{&probe.CallError{Stage: probe.StageSignaling, Err: &probe.HTTPError{Status: 429}}, "signaling_http_429"},
		{&probe.CallError{Stage: probe.StageHangup, Err: &probe.HTTPError{Status: 404}}, "hangup_http_404"},
		{&probe.CallError{Stage: probe.StageICE, Err: fmt.Errorf("waiting: %w", context.DeadlineExceeded)}, "ice_timeout"},
		{&probe.CallError{Stage: probe.StageFirstEcho, Err: context.DeadlineExceeded}, "first_echo_timeout"},
		{&probe.CallError{Stage: probe.StageDTLS, Err: probe.ErrConnectionFailed}, "dtls_failed"},
		{&probe.CallError{Stage: probe.StageSignaling, Err: errors.New("connection refused")}, "signaling_error"},
		{&probe.CallError{Stage: probe.StageSignaling, Err: context.Canceled}, "canceled"},
		{errors.New("anything else"), "other_error"},
	}
	for _, tt := range tests {
		if got := probe.FailureReason(tt.err); got != tt.want {
			t.Errorf("FailureReason(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

// The handlers per SIP method. Each answers with the status RFC 3261 gives
// its case and counts the request under one result.

package sipfront

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/emiago/sipgo/sip"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/placement"
)

// allowed is the Allow header of every 405 and OPTIONS answer.
const allowed = "INVITE, ACK, BYE, CANCEL, OPTIONS, NOTIFY"

// respond answers req on tx with status and the given headers (name,
// value pairs), best effort: a transaction that has ended takes nothing.
func respond(req *sip.Request, tx sip.ServerTransaction, status int, reason string, headers ...string) {
	res := sip.NewResponseFromRequest(req, status, reason, nil)
	for i := 0; i+1 < len(headers); i += 2 {
		res.AppendHeader(sip.NewHeader(headers[i], headers[i+1]))
	}
	_ = tx.Respond(res)
}

func (f *Front) count(method, result string) {
	f.m.requests.WithLabelValues(methodLabel(method), result).Inc()
}

// source is the address a request came from.
func source(req *sip.Request) netip.AddrPort {
	ap, _ := netip.ParseAddrPort(req.Source())
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// handleOptions answers a trunk's keep-alive pings; anyone else is refused.
func (f *Front) handleOptions(req *sip.Request, tx sip.ServerTransaction) {
	if trunkFor(f.trunks, source(req).Addr()) == nil {
		respond(req, tx, sip.StatusForbidden, "Forbidden")
		f.count("OPTIONS", resultForbidden)
		return
	}
	respond(req, tx, sip.StatusOK, "OK", "Allow", allowed, "Accept", "application/sdp")
	f.count("OPTIONS", resultOK)
}

// handleOther answers every method the front does not take.
func (f *Front) handleOther(req *sip.Request, tx sip.ServerTransaction) {
	respond(req, tx, sip.StatusMethodNotAllowed, "Method Not Allowed", "Allow", allowed)
	f.count(req.Method.String(), resultNotAllowed)
}

// handleCancel sees only a CANCEL that matched no INVITE transaction
// (sipgo answers a matching one itself: 200, and 487 to the INVITE).
func (f *Front) handleCancel(req *sip.Request, tx sip.ServerTransaction) {
	respond(req, tx, sip.StatusCallTransactionDoesNotExists, "Call/Transaction Does Not Exist")
	f.count("CANCEL", resultNoDialog)
}

// lookup is the live dialog a mid-dialog request belongs to, or nil.
func (f *Front) lookup(req *sip.Request) *dialog {
	id, err := sip.DialogIDFromRequestUAS(req)
	if err != nil {
		return nil
	}
	return f.dialogs.get(id)
}

// handleAck confirms an answered dialog. An ACK is never answered; one for
// no dialog (or of a non-2xx, which sipgo's transaction takes) is counted.
func (f *Front) handleAck(req *sip.Request, tx sip.ServerTransaction) {
	d := f.lookup(req)
	if d == nil {
		f.count("ACK", resultNoDialog)
		return
	}
	d.mu.Lock()
	ds := d.ds
	d.mu.Unlock()
	if ds == nil || ds.ReadAck(req, tx) != nil || !d.confirm() {
		f.count("ACK", resultNoDialog)
		return
	}
	f.count("ACK", resultOK)
}

// handleBye ends a call from the carrier's side: 200, then the session is
// deleted at its cluster.
func (f *Front) handleBye(req *sip.Request, tx sip.ServerTransaction) {
	d := f.lookup(req)
	if d == nil || d.current() == statePlacing {
		// A BYE before our 200 names no dialog yet (RFC 3261 15.1.2: the
		// caller CANCELs instead).
		respond(req, tx, sip.StatusCallTransactionDoesNotExists, "Call/Transaction Does Not Exist")
		f.count("BYE", resultNoDialog)
		return
	}
	respond(req, tx, sip.StatusOK, "OK")
	f.count("BYE", resultOK)
	f.finish(context.Background(), d)
}

// finish ends d if it has not ended: deletes its session at its cluster,
// frees its trunk call and its table entry. Exactly one caller does it.
func (f *Front) finish(ctx context.Context, d *dialog) (from state, ended bool) {
	session, cluster, from, ok := d.end()
	if !ok {
		return from, false
	}
	d.stopWatch()
	if session != "" {
		f.deleteSession(ctx, session, cluster)
	}
	d.trunk.release()
	f.dialogs.remove(d.id)
	if d.callID != "" {
		f.pending.remove(d.callID)
	}
	f.m.dialogs.Set(float64(f.dialogs.len()))
	return from, true
}

// deleteSession ends a call's session at its cluster; a failure is
// logged (the pod ends the session on RTP timeout anyway).
func (f *Front) deleteSession(ctx context.Context, session string, cluster geo.Cluster) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	status, _, err := f.deps.Clusters.Exchange(ctx, cluster, http.MethodDelete, "/"+session, nil, 64<<10)
	if err != nil || (status != http.StatusNoContent && status != http.StatusOK && status != http.StatusNotFound) {
		f.log.Warn("delete the session of an ended call", "session", session, "cluster", cluster.ID, "status", status, "err", err)
	}
}

// hangup ends a call from our side: BYE to the carrier when it was
// answered, and the session deleted.
func (f *Front) hangup(ctx context.Context, d *dialog) {
	d.mu.Lock()
	ds := d.ds
	d.mu.Unlock()
	from, ok := f.finish(ctx, d)
	if !ok || ds == nil || (from != stateAnswered && from != stateConfirmed) {
		return
	}
	if err := ds.Bye(ctx); err != nil {
		f.m.byeErrors.Inc()
		f.log.Debug("BYE", "err", err)
	}
}

// isSDP reports whether a Content-Type names an SDP body.
func isSDP(req *sip.Request) bool {
	ct := req.ContentType()
	if ct == nil {
		return false
	}
	mt, _, _ := strings.Cut(ct.Value(), ";")
	return strings.EqualFold(strings.TrimSpace(mt), "application/sdp")
}

// placeFailure maps a placement error to a SIP status and a result.
func placeFailure(err error) (int, string, string) {
	var rejected *placement.RejectedError
	var tooLarge *placement.TooLargeError
	switch {
	case errors.As(err, &rejected):
		return sip.StatusNotAcceptableHere, "Not Acceptable Here", resultRejected
	case errors.As(err, &tooLarge):
		return sip.StatusRequestEntityTooLarge, "Request Entity Too Large", resultTooLarge
	case errors.Is(err, placement.ErrNoCluster), errors.Is(err, placement.ErrNoCapacity), errors.Is(err, context.DeadlineExceeded):
		return sip.StatusServiceUnavailable, "Service Unavailable", resultNoCapacity
	default:
		return sip.StatusInternalServerError, "Server Internal Error", resultServerError
	}
}

// placeCall places an admitted INVITE's call with session and answers
// it: 200 with the pod's SDP, then the wait for the ACK (sipgo
// retransmits the 200). ctx ends with the INVITE's transaction (a
// CANCEL). placed, when not nil, hears the outcome once: nil as the 200
// goes out, else why the call was not answered (an accept's caller waits
// on it).
func (f *Front) placeCall(ctx context.Context, d *dialog, req *sip.Request, src netip.AddrPort, session json.RawMessage, placed chan<- error) string {
	report := func(err error) {
		if placed != nil {
			placed <- err
			placed = nil
		}
	}
	defer report(errNotAnswered)
	loc := geo.Location{IP: src.Addr(), Source: geo.SourceDefault}
	if f.deps.Locate != nil {
		loc = f.deps.Locate(src.Addr())
	}
	// The placement is not cut short by a CANCEL: a create the cluster
	// has taken would leave a session no one deletes. It is bounded by
	// InviteTimeout, and its session deleted when the call was canceled
	// meanwhile.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.cfg.InviteTimeout)
	defer cancel()
	res, err := f.deps.Placer.Place(pctx, placement.Request{Loc: loc, What: "SDP", Pin: f.pins[d.trunk.name],
		Create: sessionapi.CreateRequest{Kind: sessionapi.KindRTP, Offer: string(req.Body()), Config: session}})
	if ctx.Err() != nil {
		// CANCEL: sipgo has answered 487; a session created meanwhile is
		// deleted.
		if err == nil {
			f.deleteSession(ctx, res.Session.ID, res.Cluster)
		}
		f.finish(ctx, d)
		report(errCallCanceled)
		return resultCanceled
	}
	if err != nil {
		status, reason, result := placeFailure(err)
		headers := []string{}
		if status == sip.StatusServiceUnavailable {
			headers = append(headers, "Retry-After", "2")
		}
		_ = d.ds.Respond(status, reason, nil, headersOf(headers)...)
		f.finish(ctx, d)
		report(err)
		return result
	}
	if err := d.placed(res.Session.ID, res.Cluster); err != nil {
		// Drained meanwhile (the front is stopping): the INVITE still
		// gets its final answer.
		f.deleteSession(ctx, res.Session.ID, res.Cluster)
		_ = d.ds.Respond(sip.StatusServiceUnavailable, "Service Unavailable", nil, sip.NewHeader("Retry-After", "2"))
		report(errCallCanceled)
		return resultCanceled
	}
	report(nil)
	if err := d.ds.RespondSDP([]byte(res.Session.Answer)); err != nil {
		// No ACK within 64*T1, or the transaction ended: the call is
		// over (RFC 3261 13.3.1.4 asks for a BYE).
		f.hangup(ctx, d)
		if ctx.Err() != nil {
			return resultCanceled
		}
		return resultNoAck
	}
	d.confirm()
	f.watch(d)
	return resultAnswered
}

func headersOf(kv []string) []sip.Header {
	var out []sip.Header
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, sip.NewHeader(kv[i], kv[i+1]))
	}
	return out
}

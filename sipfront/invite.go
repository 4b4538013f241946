// An INVITE from its arrival to the dialog it opens: who may call, what
// they may offer, then the placement (handlers.go).

package sipfront

import (
	"context"
	"errors"
	"fmt"

	"github.com/emiago/sipgo/sip"
)

// handleInvite admits an INVITE (trunk, digest, body, offer, limits),
// opens its dialog and places the call. It runs on its own goroutine (one
// per request, sipgo's) until the call is answered and acknowledged or
// refused.
func (f *Front) handleInvite(req *sip.Request, tx sip.ServerTransaction) {
	// calls.Add only while open (under mu, as Close sets closed): an
	// INVITE racing Close must not Add while Close Waits.
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		respond(req, tx, sip.StatusServiceUnavailable, "Service Unavailable", "Retry-After", "2")
		f.count("INVITE", resultDialogsFull)
		return
	}
	f.calls.Add(1)
	f.mu.Unlock()
	defer f.calls.Done()
	start := f.cfg.Now()
	result := f.invite(req, tx)
	f.count("INVITE", result)
	f.m.invite.WithLabelValues(result).Observe(f.cfg.Now().Sub(start).Seconds())
}

// invite handles one INVITE and returns its result.
func (f *Front) invite(req *sip.Request, tx sip.ServerTransaction) string {
	if to := req.To(); to != nil && to.Params.Has("tag") {
		return f.reinvite(req, tx)
	}
	src := source(req)
	t := trunkFor(f.trunks, src.Addr())
	if t == nil {
		respond(req, tx, sip.StatusForbidden, "Forbidden")
		return resultForbidden
	}
	if t.user != "" {
		if result, ok := f.checkAuth(t, req, tx); !ok {
			return result
		}
	}
	if result, ok := f.checkBody(t, req, tx); !ok {
		return result
	}
	dua := f.dialogUA(req.Transport())
	if dua == nil {
		respond(req, tx, sip.StatusServiceUnavailable, "Service Unavailable", "Retry-After", "2")
		return resultServerError
	}
	if ok, why := t.acquire(f.cfg.Now()); !ok {
		respond(req, tx, sip.StatusServiceUnavailable, "Service Unavailable", "Retry-After", "2")
		return why
	}
	ds, err := dua.ReadInvite(req, tx)
	if err != nil {
		t.release()
		respond(req, tx, sip.StatusBadRequest, "Bad Request")
		return resultBadRequest
	}
	d := newDialog(ds.ID, t, ds)
	if t.hook != nil {
		d.callID = f.newCallID()
	}
	if !f.dialogs.add(d) {
		t.release()
		respond(req, tx, sip.StatusServiceUnavailable, "Service Unavailable", "Retry-After", "2")
		return resultDialogsFull
	}
	f.m.dialogs.Set(float64(f.dialogs.len()))
	_ = ds.Respond(sip.StatusTrying, "Trying", nil)
	ctx, cancel := txContext(tx)
	defer cancel()
	if t.hook == nil {
		return f.placeCall(ctx, d, req, src, t.session, nil)
	}
	dec, result, ok := f.ring(ctx, d, req)
	if !ok {
		return result
	}
	return f.placeCall(ctx, d, req, src, dec.session, dec.placed)
}

// txContext is a context that ends when the INVITE's transaction is
// canceled (CANCEL) or terminates. (sipgo v1.7.3's
// sip.ServerTransactionContext ends its context at once when it could
// register its hook, the opposite of what it means to do.)
func txContext(tx sip.ServerTransaction) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	onCancel := func(*sip.Request) { cancel() }
	if !tx.OnCancel(onCancel) || !tx.OnTerminate(func(string, error) { cancel() }) {
		cancel()
	}
	return ctx, cancel
}

// reinvite answers an INVITE inside a dialog (hold, resume, a codec
// change): not taken yet, so 488 and the call goes on as it was (RFC 3261
// 14.2); 481 when the dialog is not ours.
func (f *Front) reinvite(req *sip.Request, tx sip.ServerTransaction) string {
	if f.lookup(req) == nil {
		respond(req, tx, sip.StatusCallTransactionDoesNotExists, "Call/Transaction Does Not Exist")
		return resultNoDialog
	}
	respond(req, tx, sip.StatusNotAcceptableHere, "Not Acceptable Here", "Warning", `399 rtcedge "re-INVITE is not supported yet"`)
	return resultInDialog
}

// checkAuth verifies a trunk's digest credentials: 401 with a fresh
// challenge when there are none (or the nonce is stale), 403 when they are
// wrong.
func (f *Front) checkAuth(t *trunk, req *sip.Request, tx sip.ServerTransaction) (string, bool) {
	auth := ""
	if h := req.GetHeader("Authorization"); h != nil {
		auth = h.Value()
	}
	err := f.nonces.checkDigest(t, auth, req.Method.String(), req.Recipient.String(), f.cfg.Now())
	switch {
	case err == nil:
		return "", true
	case errors.Is(err, errNoCredentials):
		respond(req, tx, sip.StatusUnauthorized, "Unauthorized", "WWW-Authenticate", f.nonces.challenge(f.cfg.Now()))
		return resultChallenged, false
	default:
		respond(req, tx, sip.StatusForbidden, "Forbidden")
		return resultForbidden, false
	}
}

// checkBody checks the INVITE's offer: an SDP body (415 for another type,
// 488 for none: an offer in the ACK is not taken yet), at most maxOffer
// bytes (413), and an offer the front can take (488 with a Warning that
// says why).
func (f *Front) checkBody(t *trunk, req *sip.Request, tx sip.ServerTransaction) (string, bool) {
	body := req.Body()
	switch {
	case len(body) == 0:
		respond(req, tx, sip.StatusNotAcceptableHere, "Not Acceptable Here", "Warning", `399 rtcedge "an SDP offer in the INVITE is required"`)
		return resultNoOffer, false
	case !isSDP(req):
		respond(req, tx, sip.StatusUnsupportedMediaType, "Unsupported Media Type", "Accept", "application/sdp")
		return resultUnsupported, false
	case len(body) > maxOffer:
		respond(req, tx, sip.StatusRequestEntityTooLarge, "Request Entity Too Large")
		return resultTooLarge, false
	}
	if _, err := checkOffer(body, t.mediaAllowed); err != nil {
		respond(req, tx, sip.StatusNotAcceptableHere, "Not Acceptable Here", "Warning", fmt.Sprintf("%d rtcedge %q", warnCode(err), err.Error()))
		return offerReason(err), false
	}
	return "", true
}

// warnCode is the RFC 3261 20.43 warning code of an offer refusal.
func warnCode(err error) int {
	switch {
	case errors.Is(err, errOfferCodec):
		return 305 // incompatible media format
	case errors.Is(err, errOfferAddress):
		return 301 // incompatible network address formats (closest)
	case errors.Is(err, errOfferNoAudio):
		return 304 // media type not available
	default:
		return 399
	}
}

// Call control of a ringing call: the webhook goes out, and the INVITE
// waits for the one decision (accept, reject, the accept timeout, a
// webhook that failed, a CANCEL) with everything bounded by the INVITE's
// own timers.

package sipfront

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/emiago/sipgo/sip"
)

// Sentinel outcomes an accept's caller may hear.
var (
	// errNotAnswered: the call ended before its 200 (a placement error
	// names itself instead).
	errNotAnswered = errors.New("sipfront: the call was not answered")
	// errCallCanceled: the carrier canceled, or the front is stopping.
	errCallCanceled = errors.New("sipfront: the carrier canceled the call")
)

// callIDs are the calls under call control by call_id, for the API.
// Safe for concurrent use.
type callIDs struct {
	mu sync.Mutex
	m  map[string]*dialog // guarded by mu
}

func newCallIDs() *callIDs { return &callIDs{m: map[string]*dialog{}} }

func (c *callIDs) add(d *dialog) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[d.callID] = d
}

func (c *callIDs) get(id string) *dialog {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[id]
}

func (c *callIDs) remove(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, id)
}

func (c *callIDs) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

// Pending is the number of calls under call control (ringing or live):
// the API's table, emptied as calls end.
func (f *Front) Pending() int { return f.pending.len() }

// ring rings an admitted call (180), sends the webhook and waits for the
// call's decision. ok is true for an accept, whose session the call is
// placed with; otherwise the INVITE has had its final answer, the dialog
// is finished, and result says why.
func (f *Front) ring(ctx context.Context, d *dialog, req *sip.Request) (dec decision, result string, ok bool) {
	f.pending.add(d)
	_ = d.ds.Respond(sip.StatusRinging, "Ringing", nil)
	ev := incomingEvent{Object: "event", ID: randomID("evt_"), Type: "realtime.call.incoming", CreatedAt: f.cfg.Now().Unix(),
		Data: incomingData{CallID: d.callID, SIPHeaders: eventHeaders(req)}}
	// The delivery is bounded by WebhookTimeout, not by the INVITE's
	// transaction: an application that accepts from its webhook handler
	// and then answers 200 must not see its request cut when the call is
	// answered. A refusal (timeout, CANCEL) abandons it.
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.cfg.WebhookTimeout)
	delivered := make(chan error, 1)
	start := f.cfg.Now()
	go func() { delivered <- d.trunk.hook.deliver(hctx, ev, f.cfg.Now) }()
	hook := delivered
	defer func() {
		if hook == nil {
			cancel()
			return
		}
		if ok && f.track(func() { f.webhookDone(<-hook, start); cancel() }) {
			return // accepted: the delivery ends on its own, Close waits for it
		}
		cancel()
		f.webhookDone(<-hook, start)
	}()
	timer := time.NewTimer(f.cfg.AcceptTimeout)
	defer timer.Stop()
	refuse := func(status int, reason, why string) (decision, string, bool) {
		if !d.claim(nil) {
			select {
			case dec := <-d.decide: // queued in the same step as its claim
				return f.decided(ctx, d, dec)
			case <-d.ended:
				return f.drained(d)
			}
		}
		if status != 0 {
			_ = d.ds.Respond(status, reason, nil)
		}
		f.finish(ctx, d)
		return decision{}, why, false
	}
	for {
		select {
		case dec := <-d.decide:
			return f.decided(ctx, d, dec)
		case err := <-hook:
			hook = nil
			f.webhookDone(err, start)
			if err != nil {
				return refuse(sip.StatusTemporarilyUnavailable, "Temporarily Unavailable", resultWebhookFailed)
			}
		case <-timer.C:
			return refuse(sip.StatusTemporarilyUnavailable, "Temporarily Unavailable", resultNoDecision)
		case <-ctx.Done():
			// CANCEL: sipgo has answered 487.
			return refuse(0, "", resultCanceled)
		case <-d.ended:
			return f.drained(d)
		}
	}
}

// drained answers a ringing call the front ended (it is stopping): the
// INVITE still gets its final answer, and an accept queued meanwhile
// hears that it came too late.
func (f *Front) drained(d *dialog) (decision, string, bool) {
	select {
	case dec := <-d.decide:
		if dec.status == 0 {
			dec.placed <- errCallCanceled
		}
	default:
	}
	_ = d.ds.Respond(sip.StatusServiceUnavailable, "Service Unavailable", nil, sip.NewHeader("Retry-After", "2"))
	return decision{}, resultCanceled, false
}

// decided carries out a claimed decision: a refusal is answered and the
// dialog finished; an accept goes on to its placement unless the call was
// canceled meanwhile.
func (f *Front) decided(ctx context.Context, d *dialog, dec decision) (decision, string, bool) {
	if dec.status == 0 {
		if ctx.Err() == nil {
			return dec, "", true
		}
		dec.placed <- errCallCanceled
		f.finish(ctx, d)
		return decision{}, resultCanceled, false
	}
	if ctx.Err() == nil {
		_ = d.ds.Respond(dec.status, dec.reason, nil)
	}
	f.finish(ctx, d)
	return decision{}, resultDeclined, false
}

// webhookDone counts a delivery and times it.
func (f *Front) webhookDone(err error, start time.Time) {
	result := "delivered"
	switch {
	case err == nil:
	case errors.Is(err, context.DeadlineExceeded):
		result = "timeout"
	case errors.Is(err, ErrWebhookAddress):
		result = "address"
	case errors.Is(err, ErrWebhookStatus):
		result = "refused"
	case errors.Is(err, context.Canceled):
		result = "abandoned"
	default:
		result = "failed"
	}
	f.m.webhooks.WithLabelValues(result).Inc()
	f.m.webhookSeconds.Observe(f.cfg.Now().Sub(start).Seconds())
}

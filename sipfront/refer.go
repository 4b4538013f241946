// Transfer of an answered call (/refer): a REFER in the dialog (RFC
// 3515), the carrier's NOTIFYs with a message/sipfrag body followed to the
// final status, then a BYE once the transfer has succeeded.

package sipfront

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/emiago/sipgo/sip"

	"github.com/rtcedge/rtcedge/internal/apierr"
)

const (
	// maxTargetURI caps a target_uri.
	maxTargetURI = 512
	// referTimeout bounds the REFER's own transaction.
	referTimeout = 8 * time.Second
	// referOutcomeTimeout bounds the wait for the NOTIFY with the
	// transfer's final status; past it the call goes on as it was.
	referOutcomeTimeout = 60 * time.Second
	// maxSipfrag caps what of a NOTIFY body is read.
	maxSipfrag = 1024
)

// checkTarget accepts a sip:, sips: or tel: URI of bounded length
// without line breaks or angle brackets (it goes into a Refer-To header).
func checkTarget(target string) error {
	if target == "" || len(target) > maxTargetURI || strings.ContainsAny(target, "\r\n<>\x00 ") {
		return fmt.Errorf("target_uri must be one sip:, sips: or tel: URI of at most %d characters", maxTargetURI)
	}
	scheme, rest, _ := strings.Cut(target, ":")
	switch strings.ToLower(scheme) {
	case "tel":
		if rest == "" {
			return fmt.Errorf("target_uri %q has no number", target)
		}
		return nil
	case "sip", "sips":
		var u sip.Uri
		if err := sip.ParseUri(target, &u); err != nil || u.Host == "" {
			return fmt.Errorf("target_uri %q is not a SIP URI", target)
		}
		return nil
	}
	return fmt.Errorf("target_uri %q: only sip:, sips: and tel: URIs", target)
}

// referCall sends a REFER for an answered call and answers 200 once the
// carrier took it (202); the transfer's outcome arrives in NOTIFYs
// (handleNotify) and a successful one ends the call with a BYE.
func (f *Front) referCall(w http.ResponseWriter, r *http.Request, d *dialog, _ apiKey, body []byte) string {
	var req struct {
		TargetURI string `json:"target_uri"`
	}
	if !decodeStrict(w, body, &req) {
		return "invalid"
	}
	if err := checkTarget(req.TargetURI); err != nil {
		apierr.WriteParam(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_target_uri", err.Error(), "target_uri")
		return "invalid"
	}
	outcome, ok := d.startRefer()
	if !ok {
		return conflict(w, "the call is not answered, or a transfer is under way")
	}
	ctx, cancel := context.WithTimeout(r.Context(), referTimeout)
	defer cancel()
	refer := sip.NewRequest(sip.REFER, d.ds.InviteRequest.Contact().Address)
	refer.AppendHeader(sip.NewHeader("Refer-To", "<"+req.TargetURI+">"))
	res, err := d.ds.Do(ctx, refer)
	if err != nil || (res.StatusCode != sip.StatusAccepted && res.StatusCode != sip.StatusOK) {
		d.endRefer()
		msg := "the carrier did not answer the REFER"
		if err == nil {
			msg = "the carrier refused the REFER: SIP " + strconv.Itoa(res.StatusCode)
		}
		apierr.Write(w, http.StatusBadGateway, apierr.TypeServer, "refer_failed", msg, 0)
		return "failed"
	}
	if !f.track(func() { f.awaitTransfer(d, outcome) }) {
		d.endRefer()
	}
	w.WriteHeader(http.StatusOK)
	return "ok"
}

// awaitTransfer waits for the transfer's final status: a 2xx ends the
// call (BYE); a failure, or none within referOutcomeTimeout, leaves it
// as it was.
func (f *Front) awaitTransfer(d *dialog, outcome <-chan int) {
	timer := time.NewTimer(referOutcomeTimeout)
	defer timer.Stop()
	defer d.endRefer()
	select {
	case status := <-outcome:
		if status >= 200 && status <= 299 {
			f.m.transfers.WithLabelValues("transferred").Inc()
			f.hangup(context.Background(), d)
			return
		}
		f.m.transfers.WithLabelValues("failed").Inc()
	case <-timer.C:
		f.m.transfers.WithLabelValues("timeout").Inc()
	case <-d.ended:
		f.m.transfers.WithLabelValues("ended").Inc()
	}
}

// track runs fn on a goroutine Close waits for; false when the front is
// closing (fn is not run).
func (f *Front) track(fn func()) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.calls.Add(1)
	go func() {
		defer f.calls.Done()
		fn()
	}()
	return true
}

// startRefer opens the dialog's one transfer: false unless it is answered
// and no transfer is under way.
func (d *dialog) startRefer() (<-chan int, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if (d.state != stateConfirmed && d.state != stateAnswered) || d.referring != nil {
		return nil, false
	}
	d.referring = make(chan int, 1)
	return d.referring, true
}

func (d *dialog) endRefer() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.referring = nil
}

// referStatus hands a transfer's final status to its waiter, if any.
func (d *dialog) referStatus(status int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.referring != nil {
		select {
		case d.referring <- status:
		default:
		}
	}
}

// handleNotify takes the carrier's NOTIFYs of a transfer (Event: refer):
// 200 for each, and a final sipfrag status ends the wait. 481 outside a
// dialog, 489 for another event package, 400 for a body that is not a
// sipfrag status line.
func (f *Front) handleNotify(req *sip.Request, tx sip.ServerTransaction) {
	d := f.lookup(req)
	if d == nil {
		respond(req, tx, sip.StatusCallTransactionDoesNotExists, "Call/Transaction Does Not Exist")
		f.count("NOTIFY", resultNoDialog)
		return
	}
	if ev := req.GetHeader("Event"); ev == nil || !strings.EqualFold(strings.TrimSpace(strings.Split(ev.Value(), ";")[0]), "refer") {
		respond(req, tx, 489, "Bad Event", "Allow-Events", "refer")
		f.count("NOTIFY", resultBadRequest)
		return
	}
	status, ok := sipfragStatus(req.Body())
	if !ok {
		respond(req, tx, sip.StatusBadRequest, "Bad Request")
		f.count("NOTIFY", resultBadRequest)
		return
	}
	respond(req, tx, sip.StatusOK, "OK")
	f.count("NOTIFY", resultOK)
	if status >= 200 {
		d.referStatus(status)
	}
}

// sipfragStatus reads the status of a message/sipfrag body's first line
// ("SIP/2.0 200 OK").
func sipfragStatus(body []byte) (int, bool) {
	if len(body) > maxSipfrag {
		body = body[:maxSipfrag]
	}
	line, _, _ := strings.Cut(string(body), "\n")
	fields := strings.Fields(line)
	if len(fields) < 2 || !strings.EqualFold(fields[0], "SIP/2.0") {
		return 0, false
	}
	status, err := strconv.Atoi(fields[1])
	if err != nil || status < 100 || status > 699 {
		return 0, false
	}
	return status, true
}

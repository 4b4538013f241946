// The realtime.call.incoming webhook: its event as OpenAI shapes it, its
// Standard Webhooks signature, and a delivery bounded in time, size and
// reach (no redirects, no private addresses unless configured).

package sipfront

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/emiago/sipgo/sip"
)

// Sentinel errors of a webhook delivery.
var (
	// ErrWebhookAddress: the webhook URL resolved to a loopback, private,
	// link-local or otherwise internal address and WebhookAllowPrivate is
	// off (SSRF guard, checked on the connected address).
	ErrWebhookAddress = errors.New("sipfront: webhook address not allowed")
	// ErrWebhookStatus: the webhook answered other than 2xx (a redirect
	// included: redirects are never followed).
	ErrWebhookStatus = errors.New("sipfront: webhook refused the event")
)

const (
	secretPrefix = "whsec_"
	// minSecretBytes is the least key length a webhook secret may decode
	// to (Standard Webhooks asks for 24 to 64 bytes).
	minSecretBytes = 24
	// maxWebhookAnswer is what is read of a webhook's answer (then the
	// connection is dropped).
	maxWebhookAnswer = 64 << 10
	// maxHeaderValue caps each SIP header value copied into the event.
	maxHeaderValue = 1024
	// maxEventHeaders caps the headers copied into the event.
	maxEventHeaders = 64
	// maxAcceptTimeout bounds accept_timeout.
	maxAcceptTimeout = time.Minute
)

// webhookKey decodes a "whsec_<base64>" secret to its HMAC key.
func webhookKey(secret string) ([]byte, error) {
	b64, ok := strings.CutPrefix(secret, secretPrefix)
	if !ok {
		return nil, errors.New("a webhook secret starts with whsec_")
	}
	key, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, fmt.Errorf("webhook secret: %w", err)
	}
	if len(key) < minSecretBytes {
		return nil, fmt.Errorf("webhook secret: %d bytes, want at least %d", len(key), minSecretBytes)
	}
	return key, nil
}

// signWebhook is the webhook-signature header value of a delivery:
// "v1," and the base64 of HMAC-SHA256(key, id "." timestamp "." body).
func signWebhook(key []byte, id string, ts int64, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write([]byte(strconv.FormatInt(ts, 10)))
	m.Write([]byte{'.'})
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// randomID is prefix and 16 random bytes in hex.
func randomID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return prefix + hex.EncodeToString(b[:])
}

// sipHeader is one entry of the event's sip_headers.
type sipHeader struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// incomingEvent is OpenAI's realtime.call.incoming webhook event.
type incomingEvent struct {
	Object    string       `json:"object"`
	ID        string       `json:"id"`
	Type      string       `json:"type"`
	CreatedAt int64        `json:"created_at"`
	Data      incomingData `json:"data"`
}

type incomingData struct {
	CallID     string      `json:"call_id"`
	SIPHeaders []sipHeader `json:"sip_headers"`
}

// eventHeaders are the INVITE's headers as the event carries them: in
// order, repeats kept, credentials (Authorization, Proxy-Authorization)
// and the body's framing left out, each value capped. They are the
// carrier's, untrusted.
func eventHeaders(req *sip.Request) []sipHeader {
	out := []sipHeader{}
	for _, h := range req.Headers() {
		name := h.Name()
		switch strings.ToLower(name) {
		case "authorization", "proxy-authorization", "content-length", "l":
			continue
		}
		if len(out) == maxEventHeaders {
			break
		}
		v := h.Value()
		if len(v) > maxHeaderValue {
			v = v[:maxHeaderValue]
		}
		out = append(out, sipHeader{Name: name, Value: v})
	}
	return out
}

// webhook delivers signed events to one URL.
type webhook struct {
	url    string
	key    []byte
	client *http.Client
}

// newWebhookClient is the HTTP client of deliveries: timeout, no proxy
// from the environment, no redirects, and (unless allowPrivate) no
// connection to an internal address, checked on the address actually
// dialled so DNS cannot steer it there.
func newWebhookClient(timeout time.Duration, allowPrivate bool) *http.Client {
	d := &net.Dialer{Timeout: timeout}
	if !allowPrivate {
		d.Control = func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil || internalAddr(ap.Addr()) {
				return fmt.Errorf("%w: %s", ErrWebhookAddress, address)
			}
			return nil
		}
	}
	tr := &http.Transport{Proxy: nil, DialContext: d.DialContext, ForceAttemptHTTP2: true,
		TLSHandshakeTimeout: timeout, ResponseHeaderTimeout: timeout, MaxIdleConnsPerHost: 4, IdleConnTimeout: 90 * time.Second}
	return &http.Client{Transport: tr, Timeout: timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// internalAddr reports addresses a webhook may not reach by default.
func internalAddr(a netip.Addr) bool {
	a = a.Unmap()
	return !a.IsValid() || a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsInterfaceLocalMulticast() || a.IsMulticast() || a.IsUnspecified() || cgnat.Contains(a)
}

// cgnat is RFC 6598's shared address space, internal to carriers and
// often to clouds.
var cgnat = netip.MustParsePrefix("100.64.0.0/10")

// deliver POSTs ev signed until an attempt is answered 2xx, at most
// webhookAttempts times: a transport failure, 408, 429 or a 5xx is tried
// again after a short pause, with the same webhook-id and a fresh
// timestamp and signature (Standard Webhooks); any other answer, an
// address refused or ctx's end is final. ctx (webhook_timeout) bounds all
// attempts together.
func (w *webhook) deliver(ctx context.Context, ev incomingEvent, now func() time.Time) error {
	body, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("encode event: %w", err)
	}
	id := randomID("wh_")
	for attempt := 1; ; attempt++ {
		retry, err := w.attempt(ctx, id, body, now().Unix())
		if !retry || attempt == webhookAttempts {
			return err
		}
		pause := time.NewTimer(time.Duration(attempt) * webhookRetryPause)
		select {
		case <-ctx.Done():
			pause.Stop()
			return err
		case <-pause.C:
		}
	}
}

const (
	// webhookAttempts bounds the attempts of one delivery.
	webhookAttempts = 3
	// webhookRetryPause is the pause before the second attempt (twice it
	// before the third).
	webhookRetryPause = 200 * time.Millisecond
)

// attempt POSTs one signed delivery and says whether a failure may be
// tried again.
func (w *webhook) attempt(ctx context.Context, id string, body []byte, ts int64) (retry bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		return false, fmt.Errorf("webhook request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "rtcedge-webhooks/1")
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("webhook-signature", signWebhook(w.key, id, ts, body))
	res, err := w.client.Do(req)
	if err != nil {
		return !errors.Is(err, ErrWebhookAddress) && ctx.Err() == nil, fmt.Errorf("webhook: %w", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, maxWebhookAnswer))
	_ = res.Body.Close()
	if res.StatusCode < 200 || res.StatusCode > 299 {
		retry := res.StatusCode >= 500 || res.StatusCode == http.StatusTooManyRequests || res.StatusCode == http.StatusRequestTimeout
		return retry, fmt.Errorf("%w: status %d", ErrWebhookStatus, res.StatusCode)
	}
	return false, nil
}

// webhookFor is the webhook of a trunk's calls (nil: none, the trunk's
// session answers every call); the config was validated.
func (c *Config) webhookFor(t Trunk, client *http.Client) *webhook {
	u, secret := c.WebhookURL, fromEnv(c.WebhookSecretEnv, c.WebhookSecret)
	if t.WebhookURL != "" {
		u = t.WebhookURL
		if s := fromEnv(t.WebhookSecretEnv, t.WebhookSecret); s != "" {
			secret = s
		}
	}
	if u == "" {
		return nil
	}
	key, _ := webhookKey(secret)
	return &webhook{url: u, key: key, client: client}
}

// validateControl checks the call-control keys: every webhook URL with a
// valid secret, API keys long enough and unique, timeouts positive.
func (c *Config) validateControl() error {
	var errs []error
	if c.AcceptTimeout <= 0 || c.WebhookTimeout <= 0 {
		errs = append(errs, errors.New("accept_timeout and webhook_timeout must be positive"))
	}
	if c.AcceptTimeout > maxAcceptTimeout {
		// A ringing call sends no 1xx after its 180; RFC 3261 13.3.1.1
		// asks for one every minute, or proxies on the way give up.
		errs = append(errs, fmt.Errorf("accept_timeout is over %v", maxAcceptTimeout))
	}
	check := func(what, u, secret string) {
		if u == "" {
			return
		}
		if p, err := url.Parse(u); err != nil || (p.Scheme != "https" && p.Scheme != "http") || p.Host == "" {
			errs = append(errs, fmt.Errorf("%s: webhook_url %q is not an http(s) URL", what, u))
		}
		if _, err := webhookKey(secret); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
		}
	}
	check("webhook", c.WebhookURL, fromEnv(c.WebhookSecretEnv, c.WebhookSecret))
	for i, t := range c.Trunks {
		if t.WebhookURL != "" {
			secret := fromEnv(t.WebhookSecretEnv, t.WebhookSecret)
			if secret == "" {
				secret = fromEnv(c.WebhookSecretEnv, c.WebhookSecret)
			}
			check(fmt.Sprintf("trunks[%d]", i), t.WebhookURL, secret)
		}
	}
	seen := map[string]bool{}
	for i, k := range c.APIKeys {
		switch key := k.key(); {
		case len(key) < 16:
			errs = append(errs, fmt.Errorf("api_keys[%d]: a key of at least 16 characters is required", i))
		case seen[key]:
			errs = append(errs, fmt.Errorf("api_keys[%d]: the key is used twice", i))
		default:
			seen[key] = true
		}
	}
	if c.hasWebhook() && len(c.APIKeys) == 0 {
		errs = append(errs, errors.New("a webhook_url needs api_keys: no one could accept its calls"))
	}
	return errors.Join(errs...)
}

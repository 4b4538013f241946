package realtime

// Backend URLs in logs and errors: a deployment may carry a key in the
// URL (Azure's ?api-key=, a proxy's ?token=, user:password@), so every
// URL the connector prints is redacted first, and so is every error that
// quotes one (net/http's errors quote the URL they failed on).

import (
	"net/url"
	"strings"
)

// redacted replaces what may be a secret in a URL.
const redacted = "REDACTED"

// RedactURL returns rawURL fit for a log line or an error: the user
// information and every query value but the model's replaced by
// REDACTED. A URL that does not parse is not shown at all.
func RedactURL(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "<unparseable URL>"
	}
	if u.User != nil {
		u.User = url.User(redacted)
	}
	if u.RawQuery != "" {
		q := u.Query()
		for k, vs := range q {
			if k == "model" {
				continue
			}
			for i := range vs {
				vs[i] = redacted
			}
		}
		u.RawQuery = q.Encode()
	}
	u.Fragment, u.RawFragment = "", ""
	return u.String()
}

// secrets lists the parts of rawURL RedactURL hides, as they may appear
// in an error's text (raw and unescaped).
func secrets(rawURL string) []string {
	var out []string
	add := func(s string) {
		if len(s) >= 3 { // shorter values would redact ordinary words
			out = append(out, s)
		}
	}
	if i := strings.Index(rawURL, "://"); i >= 0 {
		rest := rawURL[i+3:]
		if at := strings.LastIndex(strings.SplitN(rest, "/", 2)[0], "@"); at >= 0 {
			add(rest[:at])
		}
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		add(rawURL) // the whole URL: nothing of it can be told apart
		return out
	}
	if u.User != nil {
		add(u.User.Username())
		if p, ok := u.User.Password(); ok {
			add(p)
		}
	}
	for _, kv := range strings.Split(u.RawQuery, "&") {
		k, v, _ := strings.Cut(kv, "=")
		if k == "model" {
			continue
		}
		add(v)
		if uv, err := url.QueryUnescape(v); err == nil {
			add(uv)
		}
	}
	return out
}

// redactError is an error whose text has a URL's secrets replaced.
type redactError struct {
	msg string
	err error
}

func (e *redactError) Error() string { return e.msg }

// Unwrap keeps errors.Is working; the wrapped error's own text is not
// redacted, so it is never printed on its own.
func (e *redactError) Unwrap() error { return e.err }

// redactErr returns err with the secrets of rawURL replaced in its text.
func redactErr(err error, rawURL string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	for _, s := range secrets(rawURL) {
		msg = strings.ReplaceAll(msg, s, redacted)
	}
	if msg == err.Error() {
		return err
	}
	return &redactError{msg: msg, err: err}
}

package sessionapi

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
)

// TLS is the transport security of a session API hop: the server's
// certificate and key (the listener speaks TLS when both are set), and the
// CA bundle clients verify session API servers with (the cluster CA, or a
// mesh's). Paths are PEM files. The bearer secret (RequireSecret) rides
// inside it; docs/operations.md says why TLS plus a secret rather than
// mutual TLS.
type TLS struct {
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
	CA   string `yaml:"ca"`
}

// Validate checks that cert and key come together and the files load.
func (t TLS) Validate(what string) error {
	if (t.Cert == "") != (t.Key == "") {
		return fmt.Errorf("%s: cert and key go together", what)
	}
	if t.Cert != "" {
		if _, err := tls.LoadX509KeyPair(t.Cert, t.Key); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	if t.CA != "" {
		if _, err := t.pool(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	return nil
}

// Serves reports whether the listener speaks TLS.
func (t TLS) Serves() bool { return t.Cert != "" }

// Listener wraps ln in TLS when a certificate is configured, else returns
// it unchanged.
func (t TLS) Listener(ln net.Listener) (net.Listener, error) {
	if !t.Serves() {
		return ln, nil
	}
	cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
	if err != nil {
		return nil, fmt.Errorf("session API certificate: %w", err)
	}
	return tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}), nil
}

// URL turns an advertised http:// URL into https:// when the listener
// speaks TLS.
func (t TLS) URL(u string) string {
	if t.Serves() {
		if rest, ok := strings.CutPrefix(u, "http://"); ok {
			return "https://" + rest
		}
	}
	return u
}

// Client returns base made to verify servers with the CA (a copy of its
// transport); without a CA, base itself (system roots). A nil base with a
// CA is a client with the default transport's settings and no proxy.
func (t TLS) Client(base *http.Client) (*http.Client, error) {
	if t.CA == "" {
		return base, nil
	}
	if base == nil {
		base = &http.Client{}
	}
	pool, err := t.pool()
	if err != nil {
		return nil, err
	}
	var tr *http.Transport
	if bt, ok := base.Transport.(*http.Transport); ok {
		tr = bt.Clone()
	} else if base.Transport == nil {
		tr = http.DefaultTransport.(*http.Transport).Clone()
		tr.Proxy = nil
	} else {
		return nil, errors.New("session API client: cannot add a CA to a custom transport")
	}
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}
	c := *base
	c.Transport = tr
	return &c, nil
}

func (t TLS) pool() (*x509.CertPool, error) {
	pem, err := os.ReadFile(t.CA)
	if err != nil {
		return nil, fmt.Errorf("session API CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("session API CA %s: no PEM certificates", t.CA)
	}
	return pool, nil
}

package sessionapi

import (
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
)

// writeCA writes a dev CA and a server certificate for 127.0.0.1 into a
// directory of its own under dir.
func writeCA(t *testing.T, dir, name string) (ca, cert, key string) {
	t.Helper()
	sub := filepath.Join(dir, name)
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	server, client, err := WriteDevCA(sub, net.IPv4(127, 0, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	return client.CA, server.Cert, server.Key
}

// TestTLS: a session API listener with a certificate speaks TLS; a client
// with the cluster CA reaches it, one trusting another CA or speaking plain
// HTTP does not.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	ca, cert, key := writeCA(t, dir, "cluster")
	otherCA, _, _ := writeCA(t, dir, "other")
	server := TLS{Cert: cert, Key: key}
	if err := server.Validate("api_tls"); err != nil {
		t.Fatal(err)
	}
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := server.Listener(raw)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: RequireSecret("s3cret-of-cluster-1", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	defer func() { _ = srv.Close(); <-done }()
	url := server.URL("http://" + raw.Addr().String())
	if url[:8] != "https://" {
		t.Fatalf("advertised URL %s is not https", url)
	}
	call := func(c *http.Client, url string) (int, error) {
		req, _ := http.NewRequest(http.MethodGet, url+StatusPath, nil)
		Authorize(req, "s3cret-of-cluster-1")
		res, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		res.Body.Close()
		return res.StatusCode, nil
	}
	plain := &http.Client{Transport: &http.Transport{Proxy: nil}}
	defer plain.CloseIdleConnections()
	good, err := TLS{CA: ca}.Client(plain)
	if err != nil {
		t.Fatal(err)
	}
	defer good.CloseIdleConnections()
	if code, err := call(good, url); err != nil || code != http.StatusNoContent {
		t.Fatalf("client with the cluster CA: %d %v", code, err)
	}
	// No base client (a node given none): the CA still applies.
	if fresh, err := (TLS{CA: ca}).Client(nil); err != nil {
		t.Fatal(err)
	} else if code, err := call(fresh, url); err != nil || code != http.StatusNoContent {
		t.Fatalf("client from no base with the cluster CA: %d %v", code, err)
	} else {
		fresh.CloseIdleConnections()
	}
	wrong, _ := TLS{CA: otherCA}.Client(plain)
	if _, err := call(wrong, url); err == nil {
		t.Fatal("a client trusting another CA reached the session API")
	}
	if code, err := call(plain, "http://"+raw.Addr().String()); err == nil && code < 400 {
		t.Fatalf("plain HTTP to the TLS listener answered %d", code)
	}
	if err := (TLS{Cert: cert}).Validate("api_tls"); err == nil {
		t.Fatal("a cert without a key validated")
	}
}

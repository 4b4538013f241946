package sessionapi

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// WriteDevCA writes a throwaway CA and one server certificate for ips,
// valid for a day, into dir, for dev worlds and tests that run the session
// APIs over TLS as production does. It returns the server's TLS (cert and
// key) and the clients' (the CA). The files are read when nodes are built.
func WriteDevCA(dir string, ips ...net.IP) (server, client TLS, err error) {
	// issue makes a P-256 key and its certificate (self-signed: parent nil).
	issue := func(tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*ecdsa.PrivateKey, []byte, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		if parent == nil {
			parent, parentKey = tmpl, key
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
		return key, der, err
	}
	now := time.Now()
	caKey, caDER, err := issue(&x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rtcedge dev session API CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}, nil, nil)
	if err != nil {
		return TLS{}, TLS{}, fmt.Errorf("dev CA: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return TLS{}, TLS{}, err
	}
	leafKey, leafDER, err := issue(&x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "rtcedge session API"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IPAddresses: ips,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, caCert, caKey)
	if err != nil {
		return TLS{}, TLS{}, fmt.Errorf("dev certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(leafKey)
	if err != nil {
		return TLS{}, TLS{}, err
	}
	write := func(name, typ string, der []byte) (string, error) {
		p := filepath.Join(dir, name)
		return p, os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
	}
	if client.CA, err = write("ca.pem", "CERTIFICATE", caDER); err != nil {
		return TLS{}, TLS{}, err
	}
	if server.Cert, err = write("cert.pem", "CERTIFICATE", leafDER); err != nil {
		return TLS{}, TLS{}, err
	}
	if server.Key, err = write("key.pem", "EC PRIVATE KEY", keyDER); err != nil {
		return TLS{}, TLS{}, err
	}
	return server, client, nil
}

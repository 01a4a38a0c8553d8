package cluster

import (
	"crypto"
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

// pki is the throw-away key material of one cluster, generated at start:
// a CA that signs the API server's serving certificate and the client
// certificates, and the service-account signing key.
type pki struct {
	caFile            string
	servingCertFile   string
	servingKeyFile    string
	saKeyFile         string // private key, signs service-account tokens
	saPubFile         string // public key, verifies them
	caPEM             []byte
	admin, controller keyPair
}

type keyPair struct{ certPEM, keyPEM []byte }

// certLifetime is long enough for any test run; the clock is the host's.
const certLifetime = 24 * time.Hour

// newPKI writes the CA, serving pair and service-account keys into dir. The
// serving certificate is valid for hosts (IP addresses or DNS names) plus the
// names in-cluster clients use.
func newPKI(dir string, hosts []string, serviceIP net.IP) (*pki, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("cluster: pki: CA key: %w", err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "edgeproxy-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("cluster: pki: CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("cluster: pki: CA certificate: %w", err)
	}
	p := &pki{
		caFile:          filepath.Join(dir, "ca.crt"),
		servingCertFile: filepath.Join(dir, "apiserver.crt"),
		servingKeyFile:  filepath.Join(dir, "apiserver.key"),
		saKeyFile:       filepath.Join(dir, "sa.key"),
		saPubFile:       filepath.Join(dir, "sa.pub"),
		caPEM:           pemBlock("CERTIFICATE", caDER),
	}
	if err := os.WriteFile(p.caFile, p.caPEM, 0o600); err != nil {
		return nil, fmt.Errorf("cluster: pki: %w", err)
	}

	serving := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, serviceIP},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			serving.IPAddresses = append(serving.IPAddresses, ip)
		} else if h != "" {
			serving.DNSNames = append(serving.DNSNames, h)
		}
	}
	kp, err := issue(ca, caKey, serving, 2)
	if err != nil {
		return nil, fmt.Errorf("cluster: pki: serving certificate: %w", err)
	}
	if err := os.WriteFile(p.servingCertFile, kp.certPEM, 0o600); err != nil {
		return nil, fmt.Errorf("cluster: pki: %w", err)
	}
	if err := os.WriteFile(p.servingKeyFile, kp.keyPEM, 0o600); err != nil {
		return nil, fmt.Errorf("cluster: pki: %w", err)
	}

	// Both clients are in system:masters: the controller manager runs with
	// its own credentials (no per-controller service accounts), and the
	// bootstrap RBAC role of system:kube-controller-manager alone does not
	// let it write EndpointSlices.
	client := func(cn string, serial int64) (keyPair, error) {
		return issue(ca, caKey, &x509.Certificate{
			Subject:     pkix.Name{CommonName: cn, Organization: []string{"system:masters"}},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}, serial)
	}
	if p.admin, err = client("edgeproxy-test-admin", 3); err != nil {
		return nil, fmt.Errorf("cluster: pki: admin certificate: %w", err)
	}
	if p.controller, err = client("system:kube-controller-manager", 4); err != nil {
		return nil, fmt.Errorf("cluster: pki: controller-manager certificate: %w", err)
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("cluster: pki: service-account key: %w", err)
	}
	saKeyPEM, err := keyPEM(saKey)
	if err != nil {
		return nil, fmt.Errorf("cluster: pki: service-account key: %w", err)
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, fmt.Errorf("cluster: pki: service-account key: %w", err)
	}
	if err := os.WriteFile(p.saKeyFile, saKeyPEM, 0o600); err != nil {
		return nil, fmt.Errorf("cluster: pki: %w", err)
	}
	if err := os.WriteFile(p.saPubFile, pemBlock("PUBLIC KEY", saPubDER), 0o600); err != nil {
		return nil, fmt.Errorf("cluster: pki: %w", err)
	}
	return p, nil
}

// issue signs a fresh P-256 key for tmpl with the CA.
func issue(ca *x509.Certificate, caKey crypto.Signer, tmpl *x509.Certificate, serial int64) (keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return keyPair{}, err
	}
	now := time.Now()
	tmpl.SerialNumber = big.NewInt(serial)
	tmpl.NotBefore = now.Add(-time.Hour)
	tmpl.NotAfter = now.Add(certLifetime)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return keyPair{}, err
	}
	kp, err := keyPEM(key)
	if err != nil {
		return keyPair{}, err
	}
	return keyPair{certPEM: pemBlock("CERTIFICATE", der), keyPEM: kp}, nil
}

func keyPEM(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pemBlock("EC PRIVATE KEY", der), nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

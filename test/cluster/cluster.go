// Package cluster runs a real Kubernetes control plane for edgeproxy's tests:
// etcd, kube-apiserver and kube-controller-manager (only the EndpointSlice
// controllers), built from the pinned upstream sources by
// test/cluster/build.sh. Pods need no kubelet: a test creates a Pod bound to
// a Node and writes its status (CreateReadyPod), and the real controller
// turns it into EndpointSlices.
//
// Everything a cluster needs — certificates, keys, kubeconfigs, etcd data and
// the logs of each process — lives in one temporary directory. Processes are
// stopped by PID (SIGTERM, then SIGKILL) and die with the test binary.
//
// Use New for a cluster of one's own (tests that restart the API server) and
// Shared, with RunShared in TestMain, for one cluster shared by a package.
package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Options configures Start. The zero value is a cluster on loopback.
type Options struct {
	// BindAddress is the address kube-apiserver listens on; default
	// 127.0.0.1. Use an address reachable from a network namespace (say a
	// host-side veth address) to let an agent inside it connect. With an
	// unspecified address (0.0.0.0, ::) the cluster's own clients use
	// loopback; add the addresses others dial to ExtraSANs.
	BindAddress string
	// ExtraSANs are more host names or IP addresses for the API server's
	// serving certificate (BindAddress and loopback are always in it).
	ExtraSANs []string
	// ServiceCIDR is --service-cluster-ip-range; default 10.96.0.0/16. Two
	// ranges, one per IP family and comma-separated (10.96.0.0/16,fd00:96::/112),
	// make the cluster dual-stack; the first is the primary family.
	ServiceCIDR string
	// Dir holds everything the cluster writes. Default: a new temporary
	// directory that Stop removes.
	Dir string
	// KeepDir keeps a default Dir after Stop (to read the logs).
	KeepDir bool
	// StartTimeout bounds the wait for each process to be ready; default 2m
	// (a busy two-core machine needs tens of seconds).
	StartTimeout time.Duration
	// Audit makes kube-apiserver write an audit log of every read's
	// metadata (Dir/audit.log; read with AuditEvents): what a client
	// asked for, to tell a full list from a resumed watch.
	Audit bool
}

func (o *Options) setDefaults() {
	if o.BindAddress == "" {
		o.BindAddress = "127.0.0.1"
	}
	if o.ServiceCIDR == "" {
		o.ServiceCIDR = "10.96.0.0/16"
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 2 * time.Minute
	}
}

// Cluster is a running control plane. Its methods are safe for concurrent use.
type Cluster struct {
	// Dir holds the certificates, kubeconfigs, etcd data and logs.
	Dir string
	// Kubeconfig is the path of an admin kubeconfig for URL.
	Kubeconfig string
	// URL is the API server's address as the cluster's own clients dial it,
	// e.g. https://127.0.0.1:41234.
	URL string

	opts       Options
	binDir     string
	pki        *pki
	port       int
	removeDir  bool
	restConfig *rest.Config
	client     kubernetes.Interface
	probe      *http.Client // admin-authenticated, for /readyz

	mu            sync.Mutex
	apiserverArgs []string
	etcd          *process
	apiserver     *process
	kcm           *process
	kcmPort       int
	stopped       bool
}

// Start starts etcd, kube-apiserver and kube-controller-manager on free ports
// and returns once the API server reports ready. On error nothing is left
// running. ctx bounds the start only; the cluster runs until Stop.
//
// The processes run in the caller's network namespace and are killed when
// the OS thread that started them exits (Pdeathsig): do not call Start or
// StartAPIServer from a goroutine locked to a thread that will end (as
// network-namespace helpers do).
//
// The API server creates Service default/kubernetes (the first address of
// ServiceCIDR) as usual, but gives it no endpoints
// (--endpoint-reconciler-type=none): a loopback address is not a valid
// endpoint, and nothing serves there.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	opts.setDefaults()
	bind, err := netip.ParseAddr(opts.BindAddress)
	if err != nil {
		return nil, fmt.Errorf("cluster: BindAddress %q: %w", opts.BindAddress, err)
	}
	var svcPrefix netip.Prefix
	for i, r := range strings.Split(opts.ServiceCIDR, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(r))
		if err != nil {
			return nil, fmt.Errorf("cluster: ServiceCIDR %q: %w", opts.ServiceCIDR, err)
		}
		if i > 1 {
			return nil, fmt.Errorf("cluster: ServiceCIDR %q: at most one range per IP family", opts.ServiceCIDR)
		}
		if i == 0 {
			svcPrefix = p
		}
	}
	binDir, err := BinDir()
	if err != nil {
		return nil, err
	}

	c := &Cluster{opts: opts, binDir: binDir, Dir: opts.Dir}
	if c.Dir == "" {
		if c.Dir, err = os.MkdirTemp("", "edgeproxy-cluster-"); err != nil {
			return nil, fmt.Errorf("cluster: temp dir: %w", err)
		}
		c.removeDir = !opts.KeepDir
	} else if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("cluster: dir: %w", err)
	}
	defer func() {
		if err != nil {
			if tails := c.LogTails(30); tails != "" {
				err = fmt.Errorf("%w\n%s", err, tails)
			}
			err = errors.Join(err, c.Stop())
		}
	}()

	// The cluster's own clients dial loopback when bound to "any".
	dial := bind
	if bind.IsUnspecified() {
		dial = netip.IPv6Loopback()
		if bind.Is4() {
			dial = netip.AddrFrom4([4]byte{127, 0, 0, 1})
		}
	}
	// The first address of the service range is the kubernetes Service's.
	svcIP := svcPrefix.Masked().Addr().Next()
	if c.pki, err = newPKI(c.Dir, append([]string{dial.String()}, opts.ExtraSANs...), net.IP(svcIP.AsSlice())); err != nil {
		return nil, err
	}

	etcdClient, err := freePort("127.0.0.1")
	if err != nil {
		return nil, err
	}
	etcdPeer, err := freePort("127.0.0.1")
	if err != nil {
		return nil, err
	}
	if c.port, err = freePort(bind.String()); err != nil {
		return nil, err
	}
	if c.kcmPort, err = freePort("127.0.0.1"); err != nil {
		return nil, err
	}
	c.URL = "https://" + net.JoinHostPort(dial.String(), strconv.Itoa(c.port))
	c.Kubeconfig = filepath.Join(c.Dir, "admin.kubeconfig")

	if err := c.initClients(); err != nil {
		return nil, err
	}

	etcdURL, err := c.startEtcd(ctx, etcdClient, etcdPeer)
	if err != nil {
		return nil, err
	}
	c.apiserverArgs = apiserverArgs(opts, etcdURL, dial, c.port, c.pki, c.Dir)
	if opts.Audit {
		args, err := writeAuditPolicy(c.Dir)
		if err != nil {
			return nil, err
		}
		c.apiserverArgs = append(c.apiserverArgs, args...)
	}
	if err := c.startAPIServer(ctx); err != nil {
		return nil, err
	}
	if err := c.startControllerManager(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// startEtcd starts etcd: one member, loopback only; fsync off, the data is
// thrown away. It returns the client URL once etcd is healthy.
func (c *Cluster) startEtcd(ctx context.Context, clientPort, peerPort int) (string, error) {
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(clientPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	etcdArgs := []string{
		"--name=edgeproxy-test",
		"--data-dir=" + filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls=" + etcdURL,
		"--advertise-client-urls=" + etcdURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=edgeproxy-test=" + peerURL,
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	}
	var err error
	if c.etcd, err = startProcess("etcd", filepath.Join(c.binDir, EtcdBinary), etcdArgs, filepath.Join(c.Dir, "etcd.log")); err != nil {
		return "", err
	}
	if err := c.waitHealthy(ctx, c.etcd, http.DefaultClient, etcdURL+"/health"); err != nil {
		return "", err
	}
	return etcdURL, nil
}

// apiserverArgs are kube-apiserver's flags: etcd at etcdURL, serving on
// port at opts.BindAddress and advertising dial.
func apiserverArgs(opts Options, etcdURL string, dial netip.Addr, port int, pki *pki, dir string) []string {
	return []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=" + opts.BindAddress,
		"--advertise-address=" + dial.String(),
		"--secure-port=" + strconv.Itoa(port),
		"--service-cluster-ip-range=" + opts.ServiceCIDR,
		"--client-ca-file=" + pki.caFile,
		"--tls-cert-file=" + pki.servingCertFile,
		"--tls-private-key-file=" + pki.servingKeyFile,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + pki.saPubFile,
		"--service-account-signing-key-file=" + pki.saKeyFile,
		"--authorization-mode=RBAC",
		"--cert-dir=" + filepath.Join(dir, "apiserver-certs"),
		// No one serves the kubernetes Service, and a loopback advertise
		// address is not a valid endpoint: do not reconcile its endpoints.
		"--endpoint-reconciler-type=none",
		// On SIGTERM, end open watches within a second instead of holding
		// the connections until --request-timeout (60s): StopAPIServer is
		// then quick and clients see the watch end as they would in a
		// rolling restart.
		"--shutdown-watch-termination-grace-period=1s",
		"--profiling=false",
		"--v=1",
	}
}

// startControllerManager starts kube-controller-manager with only the
// EndpointSlice controllers, secure port on loopback, and waits until it
// is healthy.
func (c *Cluster) startControllerManager(ctx context.Context) error {
	port := c.kcmPort
	kcmKubeconfig := filepath.Join(c.Dir, "controller-manager.kubeconfig")
	if err := c.writeKubeconfig(kcmKubeconfig, c.URL, "system:kube-controller-manager", c.pki.controller); err != nil {
		return err
	}
	kcmArgs := []string{
		"--kubeconfig=" + kcmKubeconfig,
		"--controllers=endpointslice-controller,endpointslice-mirroring-controller",
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(c.Dir, "controller-manager-certs"),
		"--profiling=false",
		"--v=1",
	}
	var err error
	if c.kcm, err = startProcess("kube-controller-manager", filepath.Join(c.binDir, ControllerManagerBinary), kcmArgs, filepath.Join(c.Dir, "kube-controller-manager.log")); err != nil {
		return err
	}
	// Its serving certificate is self-signed; /healthz needs no credentials.
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	if err := c.waitHealthy(ctx, c.kcm, insecure, "https://127.0.0.1:"+strconv.Itoa(port)+"/healthz"); err != nil {
		return err
	}
	return nil
}

// initClients builds the admin REST config, the clientset, the /readyz
// probe client and the admin kubeconfig file.
func (c *Cluster) initClients() error {
	cert, err := tls.X509KeyPair(c.pki.admin.certPEM, c.pki.admin.keyPEM)
	if err != nil {
		return fmt.Errorf("cluster: admin key pair: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.pki.caPEM)
	c.probe = &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs:      pool,
			Certificates: []tls.Certificate{cert},
		}},
	}
	c.restConfig = &rest.Config{
		Host: c.URL,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   c.pki.caPEM,
			CertData: c.pki.admin.certPEM,
			KeyData:  c.pki.admin.keyPEM,
		},
		QPS:   100,
		Burst: 200,
	}
	if c.client, err = kubernetes.NewForConfig(c.restConfig); err != nil {
		return fmt.Errorf("cluster: client: %w", err)
	}
	return c.WriteKubeconfig(c.Kubeconfig, c.URL)
}

// Client returns an admin clientset for the cluster.
func (c *Cluster) Client() kubernetes.Interface { return c.client }

// RESTConfig returns a copy of the admin client configuration.
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.restConfig) }

// Port is the API server's port; it stays the same across StartAPIServer.
func (c *Cluster) Port() int { return c.port }

// CACert returns the PEM of the CA that signed the serving certificate.
func (c *Cluster) CACert() []byte { return c.pki.caPEM }

// WriteKubeconfig writes an admin kubeconfig for server, a URL such as
// https://10.0.0.1:<Port()>. The server's host must be one the serving
// certificate covers: BindAddress, loopback or one of Options.ExtraSANs.
// Use it to give an agent inside a network namespace the address it can
// reach.
func (c *Cluster) WriteKubeconfig(path, server string) error {
	return c.writeKubeconfig(path, server, "admin", c.pki.admin)
}

func (c *Cluster) writeKubeconfig(path, server, user string, kp keyPair) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["edgeproxy-test"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: c.pki.caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: kp.certPEM, ClientKeyData: kp.keyPEM}
	cfg.Contexts["edgeproxy-test"] = &clientcmdapi.Context{Cluster: "edgeproxy-test", AuthInfo: user}
	cfg.CurrentContext = "edgeproxy-test"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("cluster: write kubeconfig %s: %w", path, err)
	}
	return nil
}

// StopAPIServer stops kube-apiserver only; etcd and the controller manager
// keep running. StartAPIServer brings it back on the same address and port.
func (c *Cluster) StopAPIServer() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.apiserver == nil {
		return nil
	}
	err := c.apiserver.stop()
	c.apiserver = nil
	return err
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, with the
// same flags, address and port, and waits until it is ready. Then it
// restarts kube-controller-manager, as a controller manager with leader
// election does after an outage longer than its renew deadline (it exits
// and its supervisor starts it again). This one runs without leader
// election; left running, it resumes on client-go's reflector backoff and
// the EndpointSlice controller's per-Service retry backoff (doubling to
// 1000s), which made slice updates after a restart take from 20s to
// minutes — its time, not the proxy's under test.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return errors.New("cluster: StartAPIServer after Stop")
	}
	if c.apiserver != nil {
		return errors.New("cluster: kube-apiserver is already running")
	}
	if err := c.startAPIServer(ctx); err != nil {
		return err
	}
	if c.kcm != nil {
		if err := c.kcm.stop(); err != nil {
			return err
		}
		c.kcm = nil
	}
	return c.startControllerManager(ctx)
}

func (c *Cluster) startAPIServer(ctx context.Context) error {
	p, err := startProcess("kube-apiserver", filepath.Join(c.binDir, APIServerBinary), c.apiserverArgs, filepath.Join(c.Dir, "kube-apiserver.log"))
	if err != nil {
		return err
	}
	c.apiserver = p
	return c.waitHealthy(ctx, p, c.probe, c.URL+"/readyz")
}

// waitHealthy polls url until it answers 200, p exits, ctx ends or
// StartTimeout passes.
func (c *Cluster) waitHealthy(ctx context.Context, p *process, client *http.Client, url string) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.StartTimeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		if ended, err := p.exited(); ended {
			return fmt.Errorf("cluster: %s exited before it was ready: %v", p.name, err)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("cluster: %s: %w", p.name, err)
		}
		resp, err := client.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: %s not ready: %w (last: %v)", p.name, ctx.Err(), last)
		case <-tick.C:
		}
	}
}

// Stop stops the controller manager, the API server and etcd, in that
// order, and removes Dir if Start created it. It is idempotent.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil
	}
	c.stopped = true
	var errs []error
	for _, p := range []*process{c.kcm, c.apiserver, c.etcd} {
		if p != nil {
			errs = append(errs, p.stop())
		}
	}
	c.kcm, c.apiserver, c.etcd = nil, nil, nil
	if c.removeDir {
		if err := os.RemoveAll(c.Dir); err != nil {
			errs = append(errs, fmt.Errorf("cluster: remove %s: %w", c.Dir, err))
		}
	}
	return errors.Join(errs...)
}

// LogTails returns the last n lines of each process's log, headed by the
// file name; "" when there are no logs (yet).
func (c *Cluster) LogTails(n int) string {
	var b strings.Builder
	for _, name := range []string{"etcd", "kube-apiserver", "kube-controller-manager"} {
		path := filepath.Join(c.Dir, name+".log")
		if _, err := os.Stat(path); err != nil {
			continue
		}
		fmt.Fprintf(&b, "---- last %d lines of %s ----\n%s\n", n, path, tailFile(path, n))
	}
	return b.String()
}

// freePort returns a TCP port on host that was free a moment ago.
func freePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("cluster: free port on %s: %w", host, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Package healthcheck serves the healthCheckNodePort of every service with
// externalTrafficPolicy Local, as kube-proxy does: an HTTP server per port
// answering 200 with a JSON body when the node has local endpoints for the
// service and 503 when it has none, so that external load balancers only
// send traffic to nodes that can take it.
package healthcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Info is what one health-check port reports.
type Info struct {
	Namespace, Name string // the Service's
	LocalEndpoints  int
}

// service is "namespace/name", for logs and errors.
func (i Info) service() string { return i.Namespace + "/" + i.Name }

// Options configure a Server set.
type Options struct {
	// Addresses to listen on; empty listens on all addresses.
	Addresses []netip.Addr
	Logger    *slog.Logger
	// Listen opens a listener; nil uses net.Listen. The agent may pass one
	// that applies socket options; tests may pick namespaces.
	Listen func(network, addr string) (net.Listener, error)
	// ProxyHealthy reports the proxy's own health (its /livez); while it
	// is false every port answers 503, as kube-proxy's. Nil: always true.
	ProxyHealthy func() bool
}

// Servers owns one HTTP server per health-check node port.
type Servers struct {
	opts Options
	log  *slog.Logger

	mu    sync.Mutex
	ports map[uint16]*port
	wg    sync.WaitGroup
}

type port struct {
	mu      sync.RWMutex
	info    Info
	healthy func() bool
	srvs    []*http.Server
}

// New returns an empty set; Update starts listeners.
func New(opts Options) *Servers {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	if opts.Listen == nil {
		opts.Listen = net.Listen
	}
	return &Servers{opts: opts, log: log.With("component", "healthcheck"), ports: map[uint16]*port{}}
}

// Update makes the set of served ports equal to the keys of want and
// updates what each answers. Ports that fail to open are reported, joined;
// the others are served regardless, and a failed port is retried on the
// next Update.
func (s *Servers) Update(want map[uint16]Info) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, n := range slices.Sorted(maps.Keys(s.ports)) {
		if _, ok := want[n]; !ok {
			s.stop(n)
		}
	}
	for _, n := range slices.Sorted(maps.Keys(want)) {
		info := want[n]
		if p, ok := s.ports[n]; ok {
			p.mu.Lock()
			p.info = info
			p.mu.Unlock()
			continue
		}
		p, err := s.start(n, info)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.ports[n] = p
	}
	return errors.Join(errs...)
}

func (s *Servers) start(n uint16, info Info) (*port, error) {
	p := &port{info: info, healthy: s.opts.ProxyHealthy}
	addrs := []string{""}
	if len(s.opts.Addresses) > 0 {
		addrs = addrs[:0]
		for _, a := range s.opts.Addresses {
			addrs = append(addrs, a.String())
		}
	}
	var ls []net.Listener
	for _, a := range addrs {
		l, err := s.opts.Listen("tcp", net.JoinHostPort(a, strconv.Itoa(int(n))))
		if err != nil {
			for _, l := range ls {
				l.Close()
			}
			return nil, fmt.Errorf("healthcheck: listen on %s port %d for %s: %w", a, n, info.service(), err)
		}
		ls = append(ls, l)
	}
	for _, l := range ls {
		srv := &http.Server{Handler: p, ReadHeaderTimeout: 5 * time.Second, ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
		p.srvs = append(p.srvs, srv)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("health check server stopped", "port", n, "err", err)
			}
		}()
	}
	s.log.Info("serving health check node port", "port", n, "service", info.service())
	return p, nil
}

func (s *Servers) stop(n uint16) {
	p := s.ports[n]
	delete(s.ports, n)
	for _, srv := range p.srvs {
		_ = srv.Close()
	}
	s.log.Info("stopped health check node port", "port", n, "service", p.info.service())
}

// Close stops every server and waits for them.
func (s *Servers) Close() error {
	s.mu.Lock()
	for _, n := range slices.Sorted(maps.Keys(s.ports)) {
		s.stop(n)
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// Run closes the servers when ctx is done.
func (s *Servers) Run(ctx context.Context) error {
	<-ctx.Done()
	return s.Close()
}

// response is the JSON body, with kube-proxy's field names.
type response struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints int  `json:"localEndpoints"`
	ProxyHealthy   bool `json:"serviceProxyHealthy"`
}

func (p *port) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.RLock()
	info, healthy := p.info, p.healthy
	p.mu.RUnlock()
	var body response
	body.Service.Namespace, body.Service.Name = info.Namespace, info.Name
	body.LocalEndpoints = info.LocalEndpoints
	body.ProxyHealthy = healthy == nil || healthy()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if info.LocalEndpoints > 0 && body.ProxyHealthy {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(body)
}

// Package conntrack removes UDP conntrack entries that would keep clients
// talking to endpoints a service no longer has, over netlink (no exec).
//
// UDP has no connection teardown: once the kernel has a conntrack entry for
// a client's 5-tuple, every later datagram follows it, even after the
// endpoint it was DNATed to is gone, or when the entry was made while the
// service had no endpoints (the datagram then went nowhere, and keeps going
// nowhere). After the datapath has programmed a plan, Reconcile deletes
// exactly those entries: UDP, original destination a service frontend (a
// VIP:port, or a node-port address:NodePort) and reply source not one of the
// service port's serving endpoints (Frontend.Serving), as kube-proxy's
// pkg/proxy/conntrack/cleanup.go: traffic policies, topology and weights
// do not count, so a flow to a short-circuited or terminating-but-serving
// endpoint lives on; a frontend without serving endpoints is left alone. It
// never flushes the table.
//
// Any datapath can use it: call Reconcile after each successful apply with
// the frontends just programmed.
package conntrack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	ct "github.com/ti-mo/conntrack"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/edgeproxy/edgeproxy/datapath"
)

const protoUDP = 17

// Options configure a Cleaner.
type Options struct {
	Logger *slog.Logger
	// Registerer receives the metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// NodePortAddresses restricts which local addresses count as node-port
	// addresses; empty means every address of the node.
	NodePortAddresses []netip.Prefix
	// LocalAddrs lists the node's addresses; nil asks netlink, in the
	// network namespace of the calling thread.
	LocalAddrs func() ([]netip.Addr, error)
}

// Cleaner reconciles UDP conntrack entries with the programmed frontends.
// It is safe for concurrent use; calls are serialized.
type Cleaner struct {
	log        *slog.Logger
	localAddrs func() ([]netip.Addr, error)

	mu   sync.Mutex
	npa  []netip.Prefix          // Options.NodePortAddresses, or SetNodePortAddresses'
	last map[datapath.Key]string // endpoint signature per UDP frontend at the last successful pass

	deleted  prometheus.Counter
	failures prometheus.Counter
	duration prometheus.Histogram
}

// Metric names.
const (
	MetricDeleted  = "edgeproxy_conntrack_deleted_entries_total"
	MetricDuration = "edgeproxy_conntrack_reconcile_duration_seconds"
	MetricFailures = "edgeproxy_conntrack_reconcile_failures_total"
)

// New returns a Cleaner. It opens nothing until the first Reconcile.
func New(opts Options) (*Cleaner, error) {
	c := &Cleaner{
		log:        opts.Logger,
		npa:        opts.NodePortAddresses,
		localAddrs: opts.LocalAddrs,
		deleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricDeleted,
			Help: "UDP conntrack entries deleted because their service endpoint is gone or they bypassed the service rules.",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricFailures,
			Help: "Conntrack cleanups that failed (a dump or a delete refused, e.g. a full or busy table); the sync goes on and the next one tries again.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    MetricDuration,
			Help:    "Time to dump the conntrack table and delete stale UDP service entries.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	c.log = c.log.With("component", "conntrack")
	if c.localAddrs == nil {
		c.localAddrs = netlinkAddrs
	}
	if opts.Registerer != nil {
		for _, m := range []prometheus.Collector{c.deleted, c.failures, c.duration} {
			if err := opts.Registerer.Register(m); err != nil {
				return nil, fmt.Errorf("conntrack: register metrics: %w", err)
			}
		}
	}
	return c, nil
}

// SetNodePortAddresses replaces Options.NodePortAddresses from the next
// Reconcile on (a config reload).
func (c *Cleaner) SetNodePortAddresses(npa []netip.Prefix) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.npa = npa
}

// target is one UDP frontend's set of valid reply sources.
type target struct {
	key       datapath.Key
	endpoints map[netip.AddrPort]bool
}

func signature(f *datapath.Frontend) string {
	eps := make([]string, len(f.Serving))
	for i, e := range f.Serving {
		eps[i] = e.String()
	}
	slices.Sort(eps)
	return strings.Join(eps, ",")
}

// Reconcile deletes the stale UDP entries of the given frontends. Like
// kube-proxy it leaves alone frontends without serving endpoints and those
// no longer in the plan. It does nothing when no UDP frontend's serving
// endpoints changed since the last successful call, unless force is set.
// It returns the number of entries deleted.
func (c *Cleaner) Reconcile(ctx context.Context, frontends []datapath.Frontend, force bool) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()

	cur := map[datapath.Key]string{}
	var targets []*target
	changed := force || c.last == nil
	for i := range frontends {
		f := &frontends[i]
		if f.Protocol != datapath.UDP {
			continue
		}
		sig := signature(f)
		cur[f.Key()] = sig
		if old, ok := c.last[f.Key()]; !ok || old != sig {
			changed = true
		}
		if len(f.Serving) == 0 {
			continue
		}
		t := &target{key: f.Key(), endpoints: map[netip.AddrPort]bool{}}
		for _, e := range f.Serving {
			t.endpoints[unmapAP(e)] = true
		}
		targets = append(targets, t)
	}
	for k := range c.last {
		if _, ok := cur[k]; !ok {
			changed = true
		}
	}
	if !changed {
		return 0, nil
	}
	start := time.Now()
	n, err := c.sweep(ctx, targets)
	c.duration.Observe(time.Since(start).Seconds())
	c.deleted.Add(float64(n))
	if err != nil {
		c.failures.Inc()
		c.last = nil // try everything again next time
		return n, err
	}
	c.last = cur
	if n > 0 {
		c.log.Info("deleted stale UDP conntrack entries", "count", n, "took", time.Since(start))
	}
	return n, nil
}

func (c *Cleaner) sweep(ctx context.Context, targets []*target) (int, error) {
	if len(targets) == 0 {
		return 0, nil
	}
	byVIP := map[netip.AddrPort]*target{}
	byNodePort := map[datapath.Family]map[uint16]*target{}
	for _, t := range targets {
		if t.key.Addr.IsValid() {
			byVIP[netip.AddrPortFrom(t.key.Addr.Unmap(), t.key.Port)] = t
			continue
		}
		if byNodePort[t.key.Family] == nil {
			byNodePort[t.key.Family] = map[uint16]*target{}
		}
		byNodePort[t.key.Family][t.key.Port] = t
	}
	local := map[netip.Addr]bool{}
	if len(byNodePort) > 0 {
		addrs, err := c.localAddrs()
		if err != nil {
			return 0, fmt.Errorf("conntrack: list node addresses: %w", err)
		}
		for _, a := range addrs {
			a = a.Unmap()
			if len(c.npa) == 0 || slices.ContainsFunc(c.npa, func(p netip.Prefix) bool { return p.Contains(a) }) {
				local[a] = true
			}
		}
	}

	conn, err := ct.Dial(nil)
	if err != nil {
		return 0, fmt.Errorf("conntrack: dial netlink: %w", err)
	}
	defer conn.Close()
	flows, err := conn.Dump(nil)
	if err != nil {
		return 0, fmt.Errorf("conntrack: dump: %w", err)
	}
	var errs []error
	n := 0
	for _, fl := range flows {
		if fl.TupleOrig.Proto.Protocol != protoUDP {
			continue
		}
		dst := netip.AddrPortFrom(fl.TupleOrig.IP.DestinationAddress.Unmap(), fl.TupleOrig.Proto.DestinationPort)
		t := byVIP[dst]
		if t == nil && local[dst.Addr()] {
			t = byNodePort[datapath.FamilyOf(dst.Addr())][dst.Port()]
		}
		if t == nil {
			continue
		}
		reply := netip.AddrPortFrom(fl.TupleReply.IP.SourceAddress.Unmap(), fl.TupleReply.Proto.SourcePort)
		if t.endpoints[reply] {
			continue
		}
		if err := ctx.Err(); err != nil {
			return n, fmt.Errorf("conntrack: sweep interrupted: %w", err)
		}
		if err := conn.Delete(fl); err != nil {
			// The entry may have expired between dump and delete.
			if !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("conntrack: delete %s -> %s (reply from %s): %w", netip.AddrPortFrom(fl.TupleOrig.IP.SourceAddress, fl.TupleOrig.Proto.SourcePort), dst, reply, err))
			}
			continue
		}
		c.log.Debug("deleted UDP conntrack entry", "client", netip.AddrPortFrom(fl.TupleOrig.IP.SourceAddress, fl.TupleOrig.Proto.SourcePort), "frontend", dst, "replyFrom", reply)
		n++
	}
	return n, errors.Join(errs...)
}

func unmapAP(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func netlinkAddrs() ([]netip.Addr, error) {
	list, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(list))
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

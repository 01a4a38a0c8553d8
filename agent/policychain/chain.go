// Package chain runs the configured Wasm policy chains for the agent: it
// loads and checks the modules named in config.Policy (through package
// policy), picks the chain that matches a service, converts the agent's
// model into the policy ABI's input and the modules' outputs back into one
// weight per endpoint, applies each chain's failure policy, and records
// metrics and the per-module verdicts for the explain view.
//
// One Evaluator serves the sync loop; Reload swaps in a new module set only
// when every module of it passed its checks.
package policychain

import (
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/policy"
)

// DefaultServiceKeyPrefix is used when WithServiceKeyPrefix is not given.
const DefaultServiceKeyPrefix = "edgeproxy.io/"

// Option adjusts an Evaluator.
type Option func(*options)

type options struct {
	prefix     string
	nodeLabels []string
	now        func() time.Time
}

// WithServiceKeyPrefix sets which service labels and annotations modules
// see: only keys starting with prefix (config.Config.ServiceKeyPrefix). An
// empty prefix passes them all.
func WithServiceKeyPrefix(prefix string) Option { return func(o *options) { o.prefix = prefix } }

// WithNodeLabels sets which node labels modules see (config.Config.NodeLabels).
func WithNodeLabels(keys []string) Option {
	return func(o *options) { o.nodeLabels = slices.Clone(keys) }
}

// WithClock sets the clock of the modules' circuit breakers (tests).
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// Evaluator evaluates service ports through the configured chains. It is
// safe for concurrent use.
type Evaluator struct {
	log      *slog.Logger
	metrics  *metrics
	stateDir string

	// mu guards cur and opts, and is held only to take or swap them: an
	// evaluation holds its generation (loaded.users), not mu, so a reload
	// never waits for one and no evaluation waits for a load.
	mu   sync.RWMutex
	cur  *loaded
	opts options
	// reloading is held from Prepare to Swap.Done: one reload at a time.
	reloading sync.Mutex

	lgMu     sync.Mutex
	lastGood map[lastGoodKey]lastGood

	shadows shadowLog
}

// loaded is one generation of chains: a checked module set and the
// options it was loaded with.
type loaded struct {
	cfg    config.Policy
	opts   options
	host   *policy.Host
	chains []*chain
	// users is held shared by every evaluation and report that uses this
	// generation (Evaluator.acquire); its modules are closed under the
	// exclusive lock, so never while one runs (closing unmaps a guest's
	// memory).
	users sync.RWMutex
	// budgetWarned: a shadow skipped for want of budget was logged.
	budgetWarned atomic.Bool
}

type chain struct {
	cfg   config.Chain
	steps []step
}

type step struct {
	module string
	inst   *policy.Instance
	// The module's series, looked up once: WithLabelValues hashes its
	// labels on every call, and Evaluate runs once per service port.
	calls, cacheHits prometheus.Counter
	duration         prometheus.Observer
	// shadows run after the step on its inputs (config.Module.ShadowOf).
	shadows []shadowStep
}

// lastGoodKey is a chain and a service port: a struct, not a joined
// string, so that recording an answer (once per evaluated port) builds no
// string.
type lastGoodKey struct {
	chain string
	port  model.ServicePortName
}

type lastGood struct {
	addrs     []netip.AddrPort
	weights   []uint32 // by addrs
	scheduler string
	flags     []string
}

package config

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"
)

// Allowed values of the enumerated keys.
var (
	Modes          = []string{string(ModeIPTables), string(ModeIPVS), string(ModePlan)}
	PolicyEngines  = []string{"compiler", "interpreter"}
	ChainFailures  = []string{FailureKeepBuiltin, FailureLastGood}
	LogLevels      = []string{"debug", "info", "warn", "error"}
	LogFormats     = []string{"text", "json"}
	IPVSSchedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh", "twos"}
)

// Chain failure policies.
const (
	// FailureKeepBuiltin: when a module fails, the service keeps the
	// endpoints built-in selection chose.
	FailureKeepBuiltin = "keep-builtin"
	// FailureLastGood: when a module fails, the service keeps the chain's
	// last good output (built-in selection if there is none yet).
	FailureLastGood = "last-good"
)

// Wasm memory bounds: one 64 KiB page up to the 4 GiB of wasm32.
const (
	minMemoryLimit = Size(64 << 10)
	maxMemoryLimit = Size(4 << 30)
)

func reflectValue(c *Config) reflect.Value { return reflect.ValueOf(c).Elem() }

// Validate checks c and returns every problem joined (errors.Join), each a
// *FieldError naming the dotted key and the bad value. Load calls it; call
// it yourself after building a Config by hand. It does not touch the file
// system or the network: module files, the kubeconfig and the manifest
// directory are checked by whoever opens them.
// MinSyncPeriod is the shortest sync.period: a shorter one would keep a
// core busy with full resyncs.
const MinSyncPeriod = 100 * time.Millisecond

func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fieldErr(key, format, args...))
	}
	oneOf := func(key, v string, allowed []string) {
		if !slices.Contains(allowed, v) {
			bad(key, "%q is not one of %s", v, strings.Join(allowed, ", "))
		}
	}
	nonNegative := func(key string, v fmt.Stringer, neg bool) {
		if neg {
			bad(key, "%s is negative", v)
		}
	}

	if strings.TrimSpace(c.NodeName) == "" {
		bad("nodeName", "must not be empty")
	}
	oneOf("mode", string(c.Mode), Modes)
	if c.Kubeconfig != "" && c.Manifests != "" {
		bad("manifests", "%q cannot be used together with kubeconfig %q: pick one source", c.Manifests, c.Kubeconfig)
	}
	if c.ProxyName == "" {
		bad("proxyName", "must not be empty")
	}
	if c.ClusterCIDR != "" {
		seen := map[bool]string{}
		for p := range strings.SplitSeq(c.ClusterCIDR, ",") {
			p = strings.TrimSpace(p)
			pfx, err := netip.ParsePrefix(p)
			if err != nil {
				bad("clusterCIDR", "%q is not a CIDR", p)
				continue
			}
			v4 := pfx.Addr().Is4()
			if prev, dup := seen[v4]; dup {
				bad("clusterCIDR", "%q and %q are of the same IP family: give at most one CIDR per family", prev, p)
			}
			seen[v4] = p
		}
	}
	for i, a := range c.NodePortAddresses {
		if strings.TrimSpace(a) == NodePortPrimary {
			continue
		}
		if _, err := netip.ParsePrefix(strings.TrimSpace(a)); err != nil {
			bad(fmt.Sprintf("nodePortAddresses[%d]", i), "%q is neither a CIDR nor %q", a, NodePortPrimary)
		}
	}

	s := c.Sync
	nonNegative("sync.minPeriod", s.MinPeriod, s.MinPeriod < 0)
	nonNegative("offline.startTimeout", c.Offline.StartTimeout, c.Offline.StartTimeout < 0)
	nonNegative("offline.snapshotInterval", c.Offline.SnapshotInterval, c.Offline.SnapshotInterval < 0)
	validateHealth(c.Health, bad)
	if s.Period < MinSyncPeriod {
		bad("sync.period", "%s is shorter than %s", s.Period, MinSyncPeriod)
	} else if s.MinPeriod > s.Period {
		bad("sync.minPeriod", "%s is longer than sync.period (%s)", s.MinPeriod, s.Period)
	}
	if s.HealthTimeout <= 0 {
		bad("sync.healthTimeout", "%s must be positive", s.HealthTimeout)
	}

	if b := c.IPTables.MasqueradeBit; b < 0 || b > 31 {
		bad("iptables.masqueradeBit", "%d is not in 0..31", b)
	}
	nonNegative("iptables.lockWait", c.IPTables.LockWait, c.IPTables.LockWait < 0)
	ct := c.Conntrack
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"conntrack.tcpEstablishedTimeout", ct.TCPEstablishedTimeout}, {"conntrack.tcpCloseWaitTimeout", ct.TCPCloseWaitTimeout},
		{"conntrack.udpTimeout", ct.UDPTimeout}, {"conntrack.udpStreamTimeout", ct.UDPStreamTimeout}} {
		nonNegative(d.key, d.v, d.v < 0)
	}
	if ct.MaxPerCore < 0 {
		bad("conntrack.maxPerCore", "%d is negative", ct.MaxPerCore)
	}
	if ct.Min < 0 {
		bad("conntrack.min", "%d is negative", ct.Min)
	}

	v := c.IPVS
	oneOf("ipvs.scheduler", v.Scheduler, IPVSSchedulers)
	for i, f := range v.SchedulerFlags {
		if strings.TrimSpace(f) == "" {
			bad(fmt.Sprintf("ipvs.schedulerFlags[%d]", i), "must not be empty")
		}
	}
	if err := checkIfName(v.Interface); err != nil {
		bad("ipvs.interface", "%q %v", v.Interface, err)
	}
	nonNegative("ipvs.gracePeriod", v.GracePeriod, v.GracePeriod < 0)
	nonNegative("ipvs.tcpTimeout", v.TCPTimeout, v.TCPTimeout < 0)
	nonNegative("ipvs.tcpFinTimeout", v.TCPFinTimeout, v.TCPFinTimeout < 0)
	nonNegative("ipvs.udpTimeout", v.UDPTimeout, v.UDPTimeout < 0)

	errs = append(errs, c.Policy.validate()...)

	if c.Memory.Limit != 0 && c.Memory.Limit < MinMemoryLimit {
		bad("memory.limit", "%s is below %s (0 picks one)", c.Memory.Limit, MinMemoryLimit)
	}
	if c.MaxManifestSize <= 0 {
		bad("maxManifestSize", "%s must be positive", c.MaxManifestSize)
	}
	if strings.TrimSpace(c.StateDir) == "" {
		bad("stateDir", "must not be empty")
	}
	for key, addr := range map[string]string{"server.healthz": c.Server.Healthz, "server.metrics": c.Server.Metrics} {
		if addr == "" {
			continue
		}
		if err := checkListen(addr); err != nil {
			bad(key, "%q is not a listen address (%v)", addr, err)
		}
	}
	oneOf("log.level", c.Log.Level, LogLevels)
	oneOf("log.format", c.Log.Format, LogFormats)
	for i, l := range c.NodeLabels {
		if strings.TrimSpace(l) == "" {
			bad(fmt.Sprintf("nodeLabels[%d]", i), "must not be empty")
		}
	}
	slices.SortStableFunc(errs, func(a, b error) int {
		var fa, fb *FieldError
		if errors.As(a, &fa) && errors.As(b, &fb) {
			return strings.Compare(fa.Key, fb.Key)
		}
		return 0
	})
	return errors.Join(errs...)
}

// Validate checks the policy section alone, as a reload of the policy engine
// does (agent/chain): every problem, each naming its key.
func (p Policy) Validate() error { return errors.Join(p.validate()...) }

func (p Policy) validate() []error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fieldErr(key, format, args...))
	}
	if !slices.Contains(PolicyEngines, p.Engine) {
		bad("policy.engine", "%q is not one of %s", p.Engine, strings.Join(PolicyEngines, ", "))
	}
	if p.Timeout <= 0 {
		bad("policy.timeout", "%s must be positive", p.Timeout)
	}
	if p.MemoryLimit < minMemoryLimit || p.MemoryLimit > maxMemoryLimit {
		bad("policy.memoryLimit", "%s is not in %s..%s", p.MemoryLimit, minMemoryLimit, maxMemoryLimit)
	}
	if p.MaxModuleSize <= 0 {
		bad("policy.maxModuleSize", "%s must be positive", p.MaxModuleSize)
	}
	if p.ShadowBudget < 0 {
		bad("policy.shadowBudget", "%s must not be negative", p.ShadowBudget)
	}

	modules := map[string]int{}
	for i, m := range p.Modules {
		key := fmt.Sprintf("policy.modules[%d]", i)
		switch prev, dup := modules[m.Name]; {
		case m.Name == "":
			bad(key+".name", "must not be empty")
		case dup:
			bad(key+".name", "%q is already the name of policy.modules[%d]", m.Name, prev)
		default:
			modules[m.Name] = i
		}
		if m.Path == "" {
			bad(key+".path", "must not be empty")
		}
		if m.SHA256 != "" {
			if b, err := hex.DecodeString(m.SHA256); err != nil || len(b) != 32 {
				bad(key+".sha256", "%q is not a sha256 (64 hex digits)", m.SHA256)
			}
		}
	}

	errs = append(errs, p.validateShadows(modules)...)

	chains := map[string]int{}
	for i, c := range p.Chains {
		key := fmt.Sprintf("policy.chains[%d]", i)
		switch prev, dup := chains[c.Name]; {
		case c.Name == "":
			bad(key+".name", "must not be empty")
		case dup:
			bad(key+".name", "%q is already the name of policy.chains[%d]", c.Name, prev)
		default:
			chains[c.Name] = i
		}
		if len(c.Modules) == 0 {
			bad(key+".modules", "must name at least one module")
		}
		for j, step := range c.Modules {
			switch i, ok := modules[step.Module]; {
			case !ok:
				bad(fmt.Sprintf("%s.modules[%d].module", key, j), "%q is not defined in policy.modules", step.Module)
			case p.Modules[i].ShadowOf != "":
				bad(fmt.Sprintf("%s.modules[%d].module", key, j), "%q is a shadow (policy.modules[%d].shadowOf); to promote it, drop its shadowOf", step.Module, i)
			}
		}
		if c.Failure != "" && !slices.Contains(ChainFailures, c.Failure) { // "" is keep-builtin
			bad(key+".failure", "%q is not one of %s", c.Failure, strings.Join(ChainFailures, ", "))
		}
		for j, ns := range c.Match.Namespaces {
			if strings.TrimSpace(ns) == "" {
				bad(fmt.Sprintf("%s.match.namespaces[%d]", key, j), "must not be empty")
			}
		}
		for k := range c.Match.Labels {
			if k == "" {
				bad(key+".match.labels", "a label key must not be empty")
			}
		}
		for k := range c.Match.Annotations {
			if k == "" {
				bad(key+".match.annotations", "an annotation key must not be empty")
			}
		}
	}
	return errs
}

// validateShadows checks policy.modules[].shadowOf and config, given the
// index of each module name.
func (p Policy) validateShadows(modules map[string]int) []error {
	var errs []error
	for i, m := range p.Modules {
		key := fmt.Sprintf("policy.modules[%d]", i)
		if m.ShadowOf == "" {
			if m.Config != nil {
				errs = append(errs, fieldErr(key+".config", "only a shadow (shadowOf) takes a config here; a chain step has its own"))
			}
			continue
		}
		j, ok := modules[m.ShadowOf]
		switch {
		case !ok:
			errs = append(errs, fieldErr(key+".shadowOf", "%q is not defined in policy.modules", m.ShadowOf))
		case m.ShadowOf == m.Name:
			errs = append(errs, fieldErr(key+".shadowOf", "a module cannot shadow itself"))
		case p.Modules[j].ShadowOf != "":
			errs = append(errs, fieldErr(key+".shadowOf", "%q is itself a shadow (of %q); a shadow shadows an active module", m.ShadowOf, p.Modules[j].ShadowOf))
		}
	}
	return errs
}

// checkListen accepts "host:port" where host is empty (every address) or an
// IP literal, and port is 0..65535. Host names are refused: what a name
// resolves to can change under a running agent.
func checkListen(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if host != "" {
		if _, err := netip.ParseAddr(host); err != nil {
			return fmt.Errorf("host %q is not an IP address", host)
		}
	}
	if _, err := netip.ParseAddrPort("0.0.0.0:" + port); err != nil {
		return fmt.Errorf("port %q is not a number in 0..65535", port)
	}
	return nil
}

// checkIfName applies Linux's rules for interface names: 1..15 bytes, no
// '/', ':' or white space, not "." or "..".
func checkIfName(name string) error {
	switch {
	case name == "":
		return errors.New("must not be empty")
	case len(name) > 15:
		return errors.New("is longer than 15 bytes")
	case name == "." || name == "..":
		return errors.New("is not an interface name")
	case strings.ContainsAny(name, "/: \t\n"):
		return errors.New("contains '/', ':' or white space")
	}
	return nil
}

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
	Modes            = []string{string(ModeIPTables), string(ModeIPVS), string(ModeNFTables), string(ModePlan)}
	PolicyEngines    = []string{"compiler", "interpreter"}
	ChainFailures    = []string{FailureKeepBuiltin, FailureLastGood}
	LogLevels        = []string{"debug", "info", "warn", "error"}
	LogFormats       = []string{"text", "json"}
	DetectLocalModes = []string{LocalModeClusterCIDR, LocalModeNodeCIDR, LocalModeBridgeInterface, LocalModeInterfaceNamePrefix}
	IPVSSchedulers   = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh", "twos"}
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

// MinSyncPeriod is the shortest sync.period: a shorter one would keep a
// core busy with full resyncs.
const MinSyncPeriod = 100 * time.Millisecond

// problems collects the errors of one validation, each a *FieldError.
type problems []error

func (ps *problems) bad(key, format string, args ...any) {
	*ps = append(*ps, fieldErr(key, format, args...))
}

func (ps *problems) oneOf(key, v string, allowed []string) {
	if !slices.Contains(allowed, v) {
		ps.bad(key, "%q is not one of %s", v, strings.Join(allowed, ", "))
	}
}

func (ps *problems) nonNegative(key string, v time.Duration) {
	if v < 0 {
		ps.bad(key, "%s is negative", v)
	}
}

// uniqueName checks the name of item i of list (at key): not empty and
// not taken by an earlier item of seen, where it is then recorded.
func (ps *problems) uniqueName(key, list, name string, i int, seen map[string]int) {
	switch prev, dup := seen[name]; {
	case name == "":
		ps.bad(key, "must not be empty")
	case dup:
		ps.bad(key, "%q is already the name of %s[%d]", name, list, prev)
	default:
		seen[name] = i
	}
}

// Validate checks c and returns every problem joined (errors.Join), each a
// *FieldError naming the dotted key and the bad value, sorted by key. Load
// calls it; call it yourself after building a Config by hand. It does not
// touch the file system or the network: module files, the kubeconfig and
// the manifest directory are checked by whoever opens them.
func (c *Config) Validate() error {
	var ps problems
	c.validateSource(&ps)
	c.validateAddresses(&ps)
	c.validateSync(&ps)
	validateHealth(c.Health, ps.bad)
	c.validateKernel(&ps)
	ps = append(ps, c.Policy.validate()...)
	c.validateHost(&ps)
	slices.SortStableFunc(ps, func(a, b error) int {
		var fa, fb *FieldError
		if errors.As(a, &fa) && errors.As(b, &fb) {
			return strings.Compare(fa.Key, fb.Key)
		}
		return 0
	})
	return errors.Join(ps...)
}

// validateSource checks who the agent is and where its input comes from.
func (c *Config) validateSource(ps *problems) {
	if strings.TrimSpace(c.NodeName) == "" {
		ps.bad("nodeName", "must not be empty")
	}
	ps.oneOf("mode", string(c.Mode), Modes)
	if c.Kubeconfig != "" && c.Manifests != "" {
		ps.bad("manifests", "%q cannot be used together with kubeconfig %q: pick one source", c.Manifests, c.Kubeconfig)
	}
	if c.ProxyName != "" {
		if !labelValue(c.ProxyName) {
			ps.bad("proxyName", "%q is not a label value (at most 63 letters, digits, '-', '_' or '.', beginning and ending with a letter or digit), so no Service can be labelled with it", c.ProxyName)
		}
	}
	if c.MaxManifestSize <= 0 {
		ps.bad("maxManifestSize", "%s must be positive", c.MaxManifestSize)
	}
	for i, l := range c.NodeLabels {
		if strings.TrimSpace(l) == "" {
			ps.bad(fmt.Sprintf("nodeLabels[%d]", i), "must not be empty")
		}
	}
}

// validateAddresses checks clusterCIDR (at most one CIDR per family) and
// nodePortAddresses.
func (c *Config) validateAddresses(ps *problems) {
	if c.ClusterCIDR != "" {
		seen := map[bool]string{}
		for p := range strings.SplitSeq(c.ClusterCIDR, ",") {
			p = strings.TrimSpace(p)
			pfx, err := netip.ParsePrefix(p)
			if err != nil {
				ps.bad("clusterCIDR", "%q is not a CIDR", p)
				continue
			}
			v4 := pfx.Addr().Is4()
			if prev, dup := seen[v4]; dup {
				ps.bad("clusterCIDR", "%q and %q are of the same IP family: give at most one CIDR per family", prev, p)
			}
			seen[v4] = p
		}
	}
	ps.oneOf("detectLocalMode", c.DetectLocalMode, DetectLocalModes)
	// Only the mode's own key must be set, as kube-proxy checks it.
	switch c.DetectLocalMode {
	case LocalModeBridgeInterface:
		validIface(ps, "detectLocal.bridgeInterface", c.DetectLocal.BridgeInterface, maxIfaceName)
	case LocalModeInterfaceNamePrefix:
		// iptables matches it as "prefix+", which must fit too.
		validIface(ps, "detectLocal.interfaceNamePrefix", c.DetectLocal.InterfaceNamePrefix, maxIfaceName-1)
	}
	for i, a := range c.NodePortAddresses {
		if strings.TrimSpace(a) == NodePortPrimary {
			continue
		}
		if _, err := netip.ParsePrefix(strings.TrimSpace(a)); err != nil {
			ps.bad(fmt.Sprintf("nodePortAddresses[%d]", i), "%q is neither a CIDR nor %q", a, NodePortPrimary)
		}
	}
}

// maxIfaceName is the longest interface name the kernel takes (IFNAMSIZ
// with its NUL).
const maxIfaceName = 15

// validIface checks an interface name (or name prefix) of at most max
// characters, as the kernel names interfaces: no blanks, '/' or ':', and
// no '+' or '!' (iptables' wildcard and negation).
func validIface(ps *problems, key, name string, max int) {
	switch {
	case name == "":
		ps.bad(key, "must not be empty in this detectLocalMode")
	case len(name) > max:
		ps.bad(key, "%q is longer than %d characters", name, max)
	case name == "." || name == ".." || strings.ContainsFunc(name, func(r rune) bool { return r <= ' ' || r > '~' || strings.ContainsRune("/:+!\"'", r) }):
		ps.bad(key, "%q is not an interface name", name)
	}
}

// validateSync checks the sync and offline periods.
func (c *Config) validateSync(ps *problems) {
	s := c.Sync
	ps.nonNegative("sync.minPeriod", s.MinPeriod)
	ps.nonNegative("offline.startTimeout", c.Offline.StartTimeout)
	ps.nonNegative("offline.snapshotInterval", c.Offline.SnapshotInterval)
	if s.Period < MinSyncPeriod {
		ps.bad("sync.period", "%s is shorter than %s", s.Period, MinSyncPeriod)
	} else if s.MinPeriod > s.Period {
		ps.bad("sync.minPeriod", "%s is longer than sync.period (%s)", s.MinPeriod, s.Period)
	}
	if s.HealthTimeout <= 0 {
		ps.bad("sync.healthTimeout", "%s must be positive", s.HealthTimeout)
	}
}

// validateKernel checks the iptables, conntrack and ipvs sections.
func (c *Config) validateKernel(ps *problems) {
	if b := c.IPTables.MasqueradeBit; b < 0 || b > 31 {
		ps.bad("iptables.masqueradeBit", "%d is not in 0..31", b)
	}
	ps.nonNegative("iptables.lockWait", c.IPTables.LockWait)
	ct := c.Conntrack
	ps.nonNegative("conntrack.tcpEstablishedTimeout", ct.TCPEstablishedTimeout)
	ps.nonNegative("conntrack.tcpCloseWaitTimeout", ct.TCPCloseWaitTimeout)
	ps.nonNegative("conntrack.udpTimeout", ct.UDPTimeout)
	ps.nonNegative("conntrack.udpStreamTimeout", ct.UDPStreamTimeout)
	if ct.MaxPerCore < 0 {
		ps.bad("conntrack.maxPerCore", "%d is negative", ct.MaxPerCore)
	}
	if ct.Min < 0 {
		ps.bad("conntrack.min", "%d is negative", ct.Min)
	}

	v := c.IPVS
	ps.oneOf("ipvs.scheduler", v.Scheduler, IPVSSchedulers)
	for i, f := range v.SchedulerFlags {
		if strings.TrimSpace(f) == "" {
			ps.bad(fmt.Sprintf("ipvs.schedulerFlags[%d]", i), "must not be empty")
		}
	}
	if err := checkIfName(v.Interface); err != nil {
		ps.bad("ipvs.interface", "%q %v", v.Interface, err)
	}
	ps.nonNegative("ipvs.gracePeriod", v.GracePeriod)
	ps.nonNegative("ipvs.tcpTimeout", v.TCPTimeout)
	ps.nonNegative("ipvs.tcpFinTimeout", v.TCPFinTimeout)
	ps.nonNegative("ipvs.udpTimeout", v.UDPTimeout)
}

// validateHost checks what the agent uses on its own host: memory, the
// state directory, its listeners and its log.
func (c *Config) validateHost(ps *problems) {
	if c.Memory.Limit != 0 && c.Memory.Limit < MinMemoryLimit {
		ps.bad("memory.limit", "%s is below %s (0 picks one)", c.Memory.Limit, MinMemoryLimit)
	}
	if strings.TrimSpace(c.StateDir) == "" {
		ps.bad("stateDir", "must not be empty")
	}
	for key, addr := range map[string]string{"server.healthz": c.Server.Healthz, "server.metrics": c.Server.Metrics} {
		if addr == "" {
			continue
		}
		if err := checkListen(addr); err != nil {
			ps.bad(key, "%q is not a listen address (%v)", addr, err)
		}
	}
	ps.oneOf("log.level", c.Log.Level, LogLevels)
	ps.oneOf("log.format", c.Log.Format, LogFormats)
}

// Validate checks the policy section alone, as a reload of the policy engine
// does (agent/policychain): every problem, each naming its key.
func (p Policy) Validate() error { return errors.Join(p.validate()...) }

func (p Policy) validate() []error {
	var ps problems
	ps.oneOf("policy.engine", p.Engine, PolicyEngines)
	if p.Timeout <= 0 {
		ps.bad("policy.timeout", "%s must be positive", p.Timeout)
	}
	if p.MemoryLimit < minMemoryLimit || p.MemoryLimit > maxMemoryLimit {
		ps.bad("policy.memoryLimit", "%s is not in %s..%s", p.MemoryLimit, minMemoryLimit, maxMemoryLimit)
	}
	if p.MaxModuleSize <= 0 {
		ps.bad("policy.maxModuleSize", "%s must be positive", p.MaxModuleSize)
	}
	if p.ShadowBudget < 0 {
		ps.bad("policy.shadowBudget", "%s must not be negative", p.ShadowBudget)
	}
	modules := p.validateModules(&ps)
	ps = append(ps, p.validateShadows(modules)...)
	chains := map[string]int{}
	for i, c := range p.Chains {
		p.validateChain(&ps, fmt.Sprintf("policy.chains[%d]", i), i, c, chains, modules)
	}
	return ps
}

// validateModules checks policy.modules and returns the index of each
// module name.
func (p Policy) validateModules(ps *problems) map[string]int {
	modules := map[string]int{}
	for i, m := range p.Modules {
		key := fmt.Sprintf("policy.modules[%d]", i)
		ps.uniqueName(key+".name", "policy.modules", m.Name, i, modules)
		if m.Path == "" {
			ps.bad(key+".path", "must not be empty")
		}
		if m.SHA256 != "" {
			if b, err := hex.DecodeString(m.SHA256); err != nil || len(b) != 32 {
				ps.bad(key+".sha256", "%q is not a sha256 (64 hex digits)", m.SHA256)
			}
		}
	}
	return modules
}

// validateChain checks chain i (at key), recording its name in chains and
// resolving its steps against the module index.
func (p Policy) validateChain(ps *problems, key string, i int, c Chain, chains, modules map[string]int) {
	ps.uniqueName(key+".name", "policy.chains", c.Name, i, chains)
	if len(c.Modules) == 0 {
		ps.bad(key+".modules", "must name at least one module")
	}
	for j, step := range c.Modules {
		switch m, ok := modules[step.Module]; {
		case !ok:
			ps.bad(fmt.Sprintf("%s.modules[%d].module", key, j), "%q is not defined in policy.modules", step.Module)
		case p.Modules[m].ShadowOf != "":
			ps.bad(fmt.Sprintf("%s.modules[%d].module", key, j), "%q is a shadow (policy.modules[%d].shadowOf); to promote it, drop its shadowOf", step.Module, m)
		}
	}
	if c.Failure != "" && !slices.Contains(ChainFailures, c.Failure) { // "" is keep-builtin
		ps.bad(key+".failure", "%q is not one of %s", c.Failure, strings.Join(ChainFailures, ", "))
	}
	for j, ns := range c.Match.Namespaces {
		if strings.TrimSpace(ns) == "" {
			ps.bad(fmt.Sprintf("%s.match.namespaces[%d]", key, j), "must not be empty")
		}
	}
	for k := range c.Match.Labels {
		if k == "" {
			ps.bad(key+".match.labels", "a label key must not be empty")
		}
	}
	for k := range c.Match.Annotations {
		if k == "" {
			ps.bad(key+".match.annotations", "an annotation key must not be empty")
		}
	}
}

// validateShadows checks policy.modules[].shadowOf and config, given the
// index of each module name. A shadow that could never run is refused as
// a dangling reference is: one of a module no chain uses included.
func (p Policy) validateShadows(modules map[string]int) []error {
	var errs []error
	used := map[string]bool{}
	for _, c := range p.Chains {
		for _, step := range c.Modules {
			used[step.Module] = true
		}
	}
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
		case !used[m.ShadowOf]:
			errs = append(errs, fieldErr(key+".shadowOf", "%q is in no chain (policy.chains[].modules), so the shadow would never run; add it to a chain or drop the shadow", m.ShadowOf))
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

// labelValue reports whether v can be a Kubernetes label's value (empty
// aside): at most 63 ASCII letters, digits, '-', '_' or '.', beginning
// and ending with a letter or digit.
func labelValue(v string) bool {
	if len(v) > 63 {
		return false
	}
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !alnum(c) && ((i == 0 || i == len(v)-1) || c != '-' && c != '_' && c != '.') {
			return false
		}
	}
	return len(v) > 0
}

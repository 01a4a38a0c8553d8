package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func validBase() Config {
	c := Default()
	c.NodeName = "n1"
	c.Policy.Modules = []Module{{Name: "m1", Path: "/m1.wasm"}, {Name: "m2", Path: "/m2.wasm"}}
	c.Policy.Chains = []Chain{{Name: "c1", Modules: []ChainStep{{Module: "m1"}}, Failure: FailureKeepBuiltin}}
	return c
}

func TestValidateAcceptsGoodValues(t *testing.T) {
	good := []func(*Config){
		func(c *Config) {},
		func(c *Config) { c.Mode = "plan"; c.Manifests = "configs/demo" },
		func(c *Config) { c.ClusterCIDR = "10.244.0.0/16, fd00:10:244::/56" },
		func(c *Config) { c.NodePortAddresses = []string{"192.168.1.0/24", "::/0"} },
		func(c *Config) { c.DetectLocalMode = LocalModeNodeCIDR },
		func(c *Config) { c.DetectLocalMode, c.DetectLocal.BridgeInterface = LocalModeBridgeInterface, "cni0" },
		func(c *Config) {
			c.DetectLocalMode, c.DetectLocal.InterfaceNamePrefix = LocalModeInterfaceNamePrefix, "veth"
		},
		// A key of another mode is not looked at, as kube-proxy.
		func(c *Config) { c.DetectLocal.BridgeInterface = "not/a name" },
		func(c *Config) { c.NodePortAddresses = []string{"primary", "10.0.0.0/8"} },
		func(c *Config) { c.IPTables.MasqueradeBit = 0 },
		func(c *Config) { c.IPTables.MasqueradeBit = 31 },
		func(c *Config) { c.Sync.MinPeriod = c.Sync.Period },
		func(c *Config) { c.Server = Server{Healthz: "[::1]:0", Metrics: ":10249"} },
		func(c *Config) { c.Server = Server{} },
		func(c *Config) { c.Policy.Engine = "interpreter"; c.Policy.MemoryLimit = 64 << 10 },
		func(c *Config) { c.Policy.Modules[0].SHA256 = strings.Repeat("0f", 32) },
		func(c *Config) { c.Policy.Chains[0].Failure = FailureLastGood },
		func(c *Config) { c.Policy.Modules[1].ShadowOf = "m1" },
		func(c *Config) {
			c.Policy.Modules[1].ShadowOf, c.Policy.Modules[1].Config = "m1", map[string]any{"default": 1}
		},
		func(c *Config) { c.Policy.ShadowBudget = 0 },
		func(c *Config) { c.Log = Log{Level: "debug", Format: "json"} },
		func(c *Config) { c.IPVS.Scheduler = "mh"; c.IPVS.Interface = "kube-ipvs0" },
		func(c *Config) { c.Memory.Limit = MinMemoryLimit },
		func(c *Config) { c.ProxyName = "" },
		func(c *Config) { c.ProxyName = "edgeproxy" },
		func(c *Config) { c.ProxyName = "a" },
		func(c *Config) { c.ProxyName = "Edge_proxy.v-2" },
		func(c *Config) { c.ProxyName = strings.Repeat("a", 63) },
	}
	for i, mutate := range good {
		c := validBase()
		mutate(&c)
		if err := c.Validate(); err != nil {
			t.Errorf("case %d: %v", i, err)
		}
	}
}

func TestValidateNamesKeyAndValue(t *testing.T) {
	cases := []struct {
		mutate func(*Config)
		want   string // the whole error text
	}{
		{func(c *Config) { c.Mode = "foo" }, `config: mode: "foo" is not one of iptables, ipvs, nftables, plan`},
		{func(c *Config) { c.NodeName = " " }, `config: nodeName: must not be empty`},
		{func(c *Config) { c.Kubeconfig, c.Manifests = "/k", "/m" },
			`config: manifests: "/m" cannot be used together with kubeconfig "/k": pick one source`},
		{func(c *Config) { c.ClusterCIDR = "10.0.0.0/33" }, `config: clusterCIDR: "10.0.0.0/33" is not a CIDR`},
		{func(c *Config) { c.ClusterCIDR = "10.0.0.0/8,192.168.0.0/16" },
			`config: clusterCIDR: "10.0.0.0/8" and "192.168.0.0/16" are of the same IP family: give at most one CIDR per family`},
		{func(c *Config) { c.DetectLocalMode = "clustercidr" },
			`config: detectLocalMode: "clustercidr" is not one of ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix`},
		{func(c *Config) { c.DetectLocalMode = LocalModeBridgeInterface },
			`config: detectLocal.bridgeInterface: must not be empty in this detectLocalMode`},
		{func(c *Config) { c.DetectLocalMode, c.DetectLocal.BridgeInterface = LocalModeBridgeInterface, "cni0+" },
			`config: detectLocal.bridgeInterface: "cni0+" is not an interface name`},
		{func(c *Config) {
			c.DetectLocalMode, c.DetectLocal.InterfaceNamePrefix = LocalModeInterfaceNamePrefix, "abcdefghijklmno"
		}, `config: detectLocal.interfaceNamePrefix: "abcdefghijklmno" is longer than 14 characters`},
		{func(c *Config) { c.NodePortAddresses = []string{"10.0.0.0/8", "eth0"} },
			`config: nodePortAddresses[1]: "eth0" is neither a CIDR nor "primary"`},
		{func(c *Config) { c.Conntrack.MaxPerCore = -1 }, `config: conntrack.maxPerCore: -1 is negative`},
		{func(c *Config) { c.Conntrack.UDPTimeout = -time.Second }, `config: conntrack.udpTimeout: -1s is negative`},
		{func(c *Config) { c.NodePortAddresses = []string{"prim"} },
			`config: nodePortAddresses[0]: "prim" is neither a CIDR nor "primary"`},
		{func(c *Config) { c.Sync.MinPeriod = time.Minute },
			`config: sync.minPeriod: 1m0s is longer than sync.period (30s)`},
		{func(c *Config) { c.Sync.Period = 0 }, `config: sync.period: 0s is shorter than 100ms`},
		{func(c *Config) { c.Sync.Period = 1 }, `config: sync.period: 1ns is shorter than 100ms`},
		{func(c *Config) { c.Sync.MinPeriod = -time.Second }, `config: sync.minPeriod: -1s is negative`},
		{func(c *Config) { c.IPTables.MasqueradeBit = 32 }, `config: iptables.masqueradeBit: 32 is not in 0..31`},
		{func(c *Config) { c.IPTables.MasqueradeBit = -1 }, `config: iptables.masqueradeBit: -1 is not in 0..31`},
		{func(c *Config) { c.IPVS.Scheduler = "fastest" },
			`config: ipvs.scheduler: "fastest" is not one of rr, wrr, lc, wlc, lblc, lblcr, dh, sh, sed, nq, fo, ovf, mh, twos`},
		{func(c *Config) { c.IPVS.Interface = "a-very-long-name0" },
			`config: ipvs.interface: "a-very-long-name0" is longer than 15 bytes`},
		{func(c *Config) { c.Policy.Engine = "jit" }, `config: policy.engine: "jit" is not one of compiler, interpreter`},
		{func(c *Config) { c.Policy.MemoryLimit = 1000 }, `config: policy.memoryLimit: 1000 is not in 64Ki..4Gi`},
		{func(c *Config) { c.Policy.Timeout = 0 }, `config: policy.timeout: 0s must be positive`},
		{func(c *Config) { c.Memory.Limit = 1 << 20 }, `config: memory.limit: 1Mi is below 16Mi (0 picks one)`},
		{func(c *Config) { c.Memory.Limit = -1 }, `config: memory.limit: -1 is below 16Mi (0 picks one)`},
		{func(c *Config) { c.Policy.Modules[1].Name = "m1" },
			`config: policy.modules[1].name: "m1" is already the name of policy.modules[0]`},
		{func(c *Config) { c.Policy.Modules[0].SHA256 = "abc" },
			`config: policy.modules[0].sha256: "abc" is not a sha256 (64 hex digits)`},
		{func(c *Config) { c.Policy.Modules[0].Path = "" }, `config: policy.modules[0].path: must not be empty`},
		{func(c *Config) { c.Policy.Chains[0].Modules[0].Module = "m3" },
			`config: policy.chains[0].modules[0].module: "m3" is not defined in policy.modules`},
		{func(c *Config) { c.Policy.Chains = append(c.Policy.Chains, c.Policy.Chains[0]) },
			`config: policy.chains[1].name: "c1" is already the name of policy.chains[0]`},
		{func(c *Config) { c.Policy.Chains[0].Failure = "fail-open" },
			`config: policy.chains[0].failure: "fail-open" is not one of keep-builtin, last-good`},
		{func(c *Config) { c.Policy.Chains[0].Modules = nil }, `config: policy.chains[0].modules: must name at least one module`},
		{func(c *Config) { c.Policy.Modules[1].ShadowOf = "m3" },
			`config: policy.modules[1].shadowOf: "m3" is not defined in policy.modules`},
		{func(c *Config) { c.Policy.Modules[1].ShadowOf = "m2" }, `config: policy.modules[1].shadowOf: a module cannot shadow itself`},
		{func(c *Config) {
			c.Policy.Modules[1].ShadowOf = "m1"
			c.Policy.Modules = append(c.Policy.Modules, Module{Name: "m3", Path: "/m3.wasm", ShadowOf: "m2"})
		}, `config: policy.modules[2].shadowOf: "m2" is itself a shadow (of "m1"); a shadow shadows an active module`},
		{func(c *Config) {
			c.Policy.Modules = append(c.Policy.Modules, Module{Name: "m3", Path: "/m3.wasm", ShadowOf: "m2"})
		}, `config: policy.modules[2].shadowOf: "m2" is in no chain (policy.chains[].modules), so the shadow would never run; add it to a chain or drop the shadow`},
		{func(c *Config) { c.Policy.Modules[0].ShadowOf = "m2" },
			"config: policy.chains[0].modules[0].module: \"m1\" is a shadow (policy.modules[0].shadowOf); to promote it, drop its shadowOf\n" +
				`config: policy.modules[0].shadowOf: "m2" is in no chain (policy.chains[].modules), so the shadow would never run; add it to a chain or drop the shadow`},
		{func(c *Config) { c.Policy.Modules[0].Config = map[string]any{"default": 1} },
			`config: policy.modules[0].config: only a shadow (shadowOf) takes a config here; a chain step has its own`},
		{func(c *Config) { c.Policy.ShadowBudget = -time.Second }, `config: policy.shadowBudget: -1s must not be negative`},
		{func(c *Config) { c.Server.Healthz = "localhost:10256" },
			`config: server.healthz: "localhost:10256" is not a listen address (host "localhost" is not an IP address)`},
		{func(c *Config) { c.Server.Metrics = "127.0.0.1:99999" },
			`config: server.metrics: "127.0.0.1:99999" is not a listen address (port "99999" is not a number in 0..65535)`},
		{func(c *Config) { c.Server.Metrics = "127.0.0.1" },
			`config: server.metrics: "127.0.0.1" is not a listen address (address 127.0.0.1: missing port in address)`},
		{func(c *Config) { c.Log.Level = "verbose" }, `config: log.level: "verbose" is not one of debug, info, warn, error`},
		{func(c *Config) { c.Log.Format = "xml" }, `config: log.format: "xml" is not one of text, json`},
		{func(c *Config) { c.StateDir = "" }, `config: stateDir: must not be empty`},
	}
	for _, name := range []string{"edge proxy", "-edge", "edge.", "édge", strings.Repeat("a", 64)} {
		cases = append(cases, struct {
			mutate func(*Config)
			want   string
		}{func(c *Config) { c.ProxyName = name }, fmt.Sprintf(`config: proxyName: %q is not a label value (at most 63 letters, digits, '-', '_' or '.', beginning and ending with a letter or digit), so no Service can be labelled with it`, name)})
	}
	for _, tc := range cases {
		c := validBase()
		tc.mutate(&c)
		err := c.Validate()
		if err == nil || err.Error() != tc.want {
			t.Errorf("got  %v\nwant %s", err, tc.want)
			continue
		}
		var fe *FieldError
		if !errors.As(err, &fe) {
			t.Errorf("%v: not a FieldError", err)
		}
	}
}

func TestValidateReportsEveryProblemSorted(t *testing.T) {
	c := validBase()
	c.Mode = "foo"
	c.Log.Level = "loud"
	c.IPTables.MasqueradeBit = 40
	err := c.Validate()
	want := `config: iptables.masqueradeBit: 40 is not in 0..31
config: log.level: "loud" is not one of debug, info, warn, error
config: mode: "foo" is not one of iptables, ipvs, nftables, plan`
	if err == nil || err.Error() != want {
		t.Fatalf("got\n%v\nwant\n%s", err, want)
	}
}

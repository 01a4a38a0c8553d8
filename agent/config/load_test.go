package config

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func fixedHost(name string) func() (string, error) {
	return func() (string, error) { return name, nil }
}

// mustLoad loads with a fixed hostname and fails the test on error.
func mustLoad(t *testing.T, opts LoadOptions) *Config {
	t.Helper()
	if opts.Hostname == nil {
		opts.Hostname = fixedHost("host-a")
	}
	c, err := Load(opts)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return c
}

// loadErr loads and returns the error text, failing when Load succeeds.
func loadErr(t *testing.T, opts LoadOptions) string {
	t.Helper()
	if opts.Hostname == nil {
		opts.Hostname = fixedHost("host-a")
	}
	c, err := Load(opts)
	if err == nil {
		t.Fatalf("Load succeeded, want an error; config %+v", c)
	}
	return err.Error()
}

func TestLoadDefaultsAndHostname(t *testing.T) {
	got := mustLoad(t, LoadOptions{Hostname: fixedHost("  Edge-Node-1 \n")})
	want := Default()
	want.NodeName = "edge-node-1" // trimmed and lower-cased, like kube-proxy
	if d := Diff(got, &want); len(d) > 0 {
		t.Fatalf("differs from Default() at %v", d)
	}

	_, err := Load(LoadOptions{Hostname: func() (string, error) { return "", errors.New("no uts") }})
	if err == nil || !strings.Contains(err.Error(), "config: nodeName: empty, and the hostname is unknown: no uts") {
		t.Fatalf("err = %v", err)
	}
}

func TestPrecedence(t *testing.T) {
	dir := t.TempDir()
	path := writeFile(t, dir, "c.yaml", `
mode: ipvs
nodeName: from-file
kubeconfig: /file/kubeconfig
sync:
  minPeriod: 3s
  period: 40s
log:
  level: debug
nodePortAddresses: [10.0.0.0/8]
`)
	env := []string{
		"EDGEPROXY_MODE=plan",
		"EDGEPROXY_SYNC_MINPERIOD=2s",
		"EDGEPROXY_NODENAME=from-env",
		"PATH=/usr/bin",
		"edgeproxy_mode=iptables", // prefix is case-sensitive: not ours
	}
	flags := map[string]string{"mode": "iptables", "node-name": "from-flag"}

	cases := []struct {
		name  string
		opts  LoadOptions
		check func(*Config) string
	}{
		{"file over defaults", LoadOptions{File: path}, func(c *Config) string {
			if c.Mode != "ipvs" || c.NodeName != "from-file" || c.Sync.MinPeriod != 3*time.Second ||
				c.Sync.Period != 40*time.Second || c.Log.Level != "debug" || c.Log.Format != "text" ||
				!slices.Equal(c.NodePortAddresses, []string{"10.0.0.0/8"}) {
				return "file values not applied over defaults"
			}
			return ""
		}},
		{"env over file", LoadOptions{File: path, Env: env}, func(c *Config) string {
			if c.Mode != "plan" || c.NodeName != "from-env" || c.Sync.MinPeriod != 2*time.Second ||
				c.Sync.Period != 40*time.Second || c.Kubeconfig != "/file/kubeconfig" {
				return "env values not applied over file"
			}
			return ""
		}},
		{"flags over env", LoadOptions{File: path, Env: env, Flags: flags}, func(c *Config) string {
			if c.Mode != "iptables" || c.NodeName != "from-flag" || c.Sync.MinPeriod != 2*time.Second {
				return "flags not applied over env"
			}
			return ""
		}},
		{"flag clears a file value", LoadOptions{File: path, Flags: map[string]string{"kubeconfig": "", "manifests": "/m"}},
			func(c *Config) string {
				if c.Kubeconfig != "" || c.Manifests != "/m" {
					return "empty flag did not override the file"
				}
				return ""
			}},
		{"file named by the config flag", LoadOptions{File: "/does/not/exist", Env: []string{"EDGEPROXY_CONFIG=/nor/this"},
			Flags: map[string]string{"config": path}}, func(c *Config) string {
			if c.Mode != "ipvs" {
				return "config flag not read"
			}
			return ""
		}},
		{"file named by EDGEPROXY_CONFIG", LoadOptions{Env: []string{"EDGEPROXY_CONFIG=" + path}}, func(c *Config) string {
			if c.Mode != "ipvs" {
				return "EDGEPROXY_CONFIG not read"
			}
			return ""
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := mustLoad(t, tc.opts)
			if msg := tc.check(c); msg != "" {
				t.Fatalf("%s: got %+v", msg, c)
			}
		})
	}
}

func TestEnvMapping(t *testing.T) {
	env := []string{
		"EDGEPROXY_NODE_NAME=n1",
		"EDGEPROXY_SYNC_MIN_PERIOD=250ms",
		"EDGEPROXY_SYNC_PERIOD=1m",
		"EDGEPROXY_IPTABLES_MASQUERADEBIT=5",
		"EDGEPROXY_IPTABLES_LOCALHOSTNODEPORTS=false",
		"EDGEPROXY_MASQUERADEALL=true",
		"EDGEPROXY_NODEPORTADDRESSES=192.168.0.0/16, fd00::/8",
		"EDGEPROXY_POLICY_MEMORYLIMIT=32Mi",
		"EDGEPROXY_IPVS_TCPFINTIMEOUT=15s",
		"EDGEPROXY_SERVER_HEALTHZ=",
		"EDGEPROXY_LOG_LEVEL=warn",
		"EDGEPROXY_REQUIRE_ALL=1", // names no key: ignored with a warning
	}
	var logs strings.Builder
	c := mustLoad(t, LoadOptions{Env: env, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if !strings.Contains(logs.String(), "name=EDGEPROXY_REQUIRE_ALL") {
		t.Errorf("no warning for EDGEPROXY_REQUIRE_ALL: %q", logs.String())
	}
	if c.NodeName != "n1" || c.Sync.MinPeriod != 250*time.Millisecond || c.Sync.Period != time.Minute ||
		c.IPTables.MasqueradeBit != 5 || c.IPTables.LocalhostNodePorts || !c.MasqueradeAll ||
		!slices.Equal(c.NodePortAddresses, []string{"192.168.0.0/16", "fd00::/8"}) ||
		c.Policy.MemoryLimit != 32<<20 || c.IPVS.TCPFinTimeout != 15*time.Second ||
		c.Server.Healthz != "" || c.Log.Level != "warn" {
		t.Fatalf("env not mapped: %+v", c)
	}

	got := loadErr(t, LoadOptions{Env: []string{"EDGEPROXY_SYNC_MINPERIOD=abc", "EDGEPROXY_MASQUERADEALL=yes please"}})
	want := `config: masqueradeAll: "yes please" is not a boolean (true or false)` + "\n" +
		`config: sync.minPeriod: "abc" is not a duration`
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

func TestEveryEnvNameReachesItsKey(t *testing.T) {
	for _, key := range Keys() {
		name := EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
		l, ok := schema.byNorm[normKey(strings.TrimPrefix(name, EnvPrefix))]
		if !ok || l.key != key {
			t.Errorf("%s does not map to %s", name, key)
		}
	}
}

func TestFlags(t *testing.T) {
	c := mustLoad(t, LoadOptions{Flags: map[string]string{
		"kubeconfig": "/k", "node-name": " Flag-Node ", "mode": "plan", "sync.period": "45s",
	}})
	// Defect 9 of issue 14: kube-proxy's rule, trimmed and lower-cased,
	// applies to a name given explicitly too (else every local endpoint is
	// lost).
	if c.Kubeconfig != "/k" || c.NodeName != "flag-node" || c.Mode != "plan" || c.Sync.Period != 45*time.Second {
		t.Fatalf("flags not applied: %+v", c)
	}
	got := loadErr(t, LoadOptions{Flags: map[string]string{"node-nam": "x"}})
	if got != "config: node-nam: unknown key (given as a flag)" {
		t.Fatalf("got %q", got)
	}
}

func TestFileErrors(t *testing.T) {
	dir := t.TempDir()

	missing := filepath.Join(dir, "nope.yaml")
	_, err := Load(LoadOptions{File: missing, Hostname: fixedHost("h")})
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("missing file: err = %v", err)
	}

	syntax := writeFile(t, dir, "syntax.yaml", "mode: plan\nsync:\n  period: 30s\n   minPeriod: 1s\n")
	got := loadErr(t, LoadOptions{File: syntax})
	if !strings.HasPrefix(got, "config: "+syntax+": ") || !strings.Contains(got, "line 4") {
		t.Fatalf("syntax error should name the file and line 4: %s", got)
	}

	cases := []struct{ name, yaml, want string }{
		{"unknown key", "frobnicate: plan\n", "config: frobnicate: unknown key"},
		{"misspelt key", "mod: plan\n", "config: mod: unknown key (did you mean mode?)"},
		{"misspelt nested key", "sync:\n  minPeriod: 1s\n  perod: 3s\n", "config: sync.perod: unknown key (did you mean sync.period?)"},
		{"wrong case", "sync:\n  minperiod: 1s\n", "config: sync.minperiod: unknown key (did you mean sync.minPeriod?)"},
		{"bad duration", "sync:\n  minPeriod: abc\n", `config: sync.minPeriod: "abc" is not a duration`},
		{"duration without unit", "sync:\n  period: 30\n", "config: sync.period: 30 is not a duration (write it with a unit, e.g. 30s or 500ms)"},
		{"bad int", "iptables:\n  masqueradeBit: high\n", `config: iptables.masqueradeBit: "high" is not an integer`},
		// Issue 29 §7: an overflow was "not a duration".
		{"duration overflows", "policy:\n  shadowBudget: 9999999h\n", `config: policy.shadowBudget: "9999999h" is too long (a duration is at most 2562047h, about 292 years)`},
		{"duration overflows in a sum", "sync:\n  period: 2562047h47m17s\n", `config: sync.period: "2562047h47m17s" is too long (a duration is at most 2562047h, about 292 years)`},
		{"duration with a bad unit", "sync:\n  period: 3d\n", `config: sync.period: "3d" is not a duration`},
		// Issue 29 §7: YAML reads 0x10 as 16 and 010 as 8; a config means
		// decimal, so those are refused and the decimal value is named.
		{"hex size", "memory:\n  limit: 0x10\n", `config: memory.limit: "0x10" is not a size: write it in decimal (16), with an optional unit (e.g. 16Mi)`},
		{"hex size above the minimum", "memory:\n  limit: 0x4000000\n", `config: memory.limit: "0x4000000" is not a size: write it in decimal (67108864), with an optional unit (e.g. 16Mi)`},
		{"octal size", "policy:\n  memoryLimit: 0o100000000\n", `config: policy.memoryLimit: "0o100000000" is not a size: write it in decimal (16777216), with an optional unit (e.g. 16Mi)`},
		{"binary int", "iptables:\n  masqueradeBit: 0b1110\n", `config: iptables.masqueradeBit: "0b1110" is not an integer (write numbers in decimal: 14)`},
		{"hex int", "iptables:\n  masqueradeBit: 0xe\n", `config: iptables.masqueradeBit: "0xe" is not an integer (write numbers in decimal: 14)`},
		{"int with separators", "iptables:\n  masqueradeBit: 1_4\n", `config: iptables.masqueradeBit: "1_4" is not an integer (write numbers in decimal: 14)`},
		{"bad bool", "masqueradeAll: 3\n", "config: masqueradeAll: 3 is not a boolean (true or false)"},
		{"struct given a scalar", "sync: fast\n", `config: sync: "fast" is not a mapping`},
		{"list given a mapping", "nodePortAddresses: {a: b}\n", "config: nodePortAddresses: a mapping is not a list"},
		{"bad size", "policy:\n  memoryLimit: 16MB\n", `config: policy.memoryLimit: "16MB" is not a size (e.g. 16Mi, 512Ki, 1G or a number of bytes)`},
		{"unknown key in a list item", "policy:\n  modules:\n    - name: a\n      path: /a.wasm\n      sha265: x\n",
			"config: policy.modules[0].sha265: unknown key (did you mean policy.modules[0].sha256?)"},
		{"string list with a mapping", "nodeLabels: [a, {b: c}]\n", "config: nodeLabels[1]: a mapping is not a string"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := writeFile(t, dir, "c.yaml", tc.yaml)
			if got := loadErr(t, LoadOptions{File: p}); got != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
		})
	}

	// All problems are reported at once, each its own FieldError.
	p := writeFile(t, dir, "many.yaml", "mode: foo\nsync:\n  minPeriod: abc\n  period: 500ms\nlogg: {}\n")
	_, err = Load(LoadOptions{File: p, Hostname: fixedHost("h")})
	var keys []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var fe *FieldError
		if !errors.As(e, &fe) {
			t.Fatalf("%v is not a FieldError", e)
		}
		keys = append(keys, fe.Key)
	}
	// sync.minPeriod is reported once, for "abc": not again for its
	// default (1s) being longer than the file's sync.period.
	if !slices.Equal(keys, []string{"logg", "sync.minPeriod", "mode"}) {
		t.Fatalf("keys = %v, want decode errors, then validation errors", keys)
	}
}

func TestFileValues(t *testing.T) {
	dir := t.TempDir()
	p := writeFile(t, dir, "c.yaml", `
clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
sync:
  minPeriod: 0
iptables:
  masqueradeBit: 010
memory:
  limit: 0100000000
ipvs:
  scheduler: wrr
  schedulerFlags: [flag-1]
policy:
  memoryLimit: 1048576
  maxModuleSize: 1G
  modules:
    - {name: canary, path: /m/canary.wasm, sha256: "`+strings.Repeat("ab", 32)+`"}
  chains:
    - name: c1
      match: {namespaces: [shop], labels: {app: web, version: 2}}
      modules:
        - module: canary
          config: {weight: 10, tracks: [a, b], nested: {x: true}, hex: 0x10}
    - name: c2
      modules: [{module: canary}]
      failure: last-good
      allowEmpty: true
`)
	c := mustLoad(t, LoadOptions{File: p})
	pol := c.Policy
	// Issue 29 §7: a leading zero is decimal (YAML 1.2; yaml.v3 read 010
	// as 8), and a module's config is left as YAML reads it.
	if c.IPTables.MasqueradeBit != 10 || c.Memory.Limit != 100_000_000 {
		t.Errorf("masqueradeBit: 010 read as %d, memory.limit: 0100000000 as %d; want 10 and 100000000", c.IPTables.MasqueradeBit, c.Memory.Limit)
	}
	if v := pol.Chains[0].Modules[0].Config["hex"]; v != 16 {
		t.Errorf("a module's config hex: 0x10 reads as %#v, want 16 as YAML reads it", v)
	}
	if c.Sync.MinPeriod != 0 || c.IPVS.Scheduler != "wrr" || !slices.Equal(c.IPVS.SchedulerFlags, []string{"flag-1"}) ||
		pol.MemoryLimit != 1<<20 || pol.MaxModuleSize != 1e9 || len(pol.Modules) != 1 || len(pol.Chains) != 2 {
		t.Fatalf("values: %+v", c)
	}
	c1, c2 := pol.Chains[0], pol.Chains[1]
	if c1.Failure != FailureKeepBuiltin || c1.Match.Labels["version"] != "2" || c1.Modules[0].Config["weight"] != 10 {
		t.Fatalf("chain c1: %+v", c1)
	}
	if tr, ok := c1.Modules[0].Config["tracks"].([]any); !ok || len(tr) != 2 {
		t.Fatalf("chain c1 config: %#v", c1.Modules[0].Config)
	}
	if c2.Failure != FailureLastGood || !c2.AllowEmpty || c2.Modules[0].Config != nil {
		t.Fatalf("chain c2: %+v", c2)
	}
}

func TestEmptyFileAndNulls(t *testing.T) {
	dir := t.TempDir()
	for _, content := range []string{"", "# only a comment\n", "sync:\nlog:\n", "nodePortAddresses: []\n"} {
		p := writeFile(t, dir, "c.yaml", content)
		c := mustLoad(t, LoadOptions{File: p})
		want := Default()
		want.NodeName = "host-a"
		if d := Diff(c, &want); len(d) > 0 {
			t.Errorf("%q: differs from defaults at %v", content, d)
		}
	}
}

// TestFileDetectLocal: kube-proxy's detect-local settings as a file
// writes them, and as env vars.
func TestFileDetectLocal(t *testing.T) {
	p := writeFile(t, t.TempDir(), "c.yaml", "detectLocalMode: InterfaceNamePrefix\ndetectLocal: {interfaceNamePrefix: cali}\n")
	c := mustLoad(t, LoadOptions{File: p})
	if c.DetectLocalMode != LocalModeInterfaceNamePrefix || c.DetectLocal.InterfaceNamePrefix != "cali" {
		t.Fatalf("detectLocal: %q, %+v", c.DetectLocalMode, c.DetectLocal)
	}
	c = mustLoad(t, LoadOptions{File: p, Env: []string{"EDGEPROXY_DETECTLOCALMODE=BridgeInterface", "EDGEPROXY_DETECTLOCAL_BRIDGEINTERFACE=cni0"}})
	if c.DetectLocalMode != LocalModeBridgeInterface || c.DetectLocal.BridgeInterface != "cni0" {
		t.Fatalf("detectLocal from env vars: %q, %+v", c.DetectLocalMode, c.DetectLocal)
	}
}

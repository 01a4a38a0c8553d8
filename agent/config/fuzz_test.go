package config

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzLoad: any config file content and any EDGEPROXY_ variable load
// without a panic; what loads validates.
func FuzzLoad(f *testing.F) {
	f.Add([]byte("nodeName: n1\nsync: {minPeriod: 1s, period: 30s}\n"), "EDGEPROXY_SYNC_MINPERIOD=2s")
	f.Add([]byte("policy:\n  modules: [{name: m, path: /m.wasm}]\n  chains: [{name: c, modules: [{module: m, config: {a: [1, 2]}}]}]\n"), "EDGEPROXY_NODEPORTADDRESSES=10.0.0.0/8,fd00::/8")
	f.Add([]byte("a: &a [*a, *a, *a, *a]\nb: &b [*a, *a, *a, *a]\n"), "EDGEPROXY_MODE=plan")
	f.Add([]byte("sync: [\n"), "EDGEPROXY_POLICY_MEMORYLIMIT=1Gi")
	f.Add([]byte(""), "EDGEPROXY_NODENAME= Demo-Node ")
	f.Fuzz(func(t *testing.T, file []byte, env string) {
		if len(file) > 1<<16 {
			return
		}
		path := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(path, file, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(LoadOptions{File: path, Env: strings.Split(env, "\n"), Hostname: fixedHost("h"), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return
		}
		if verr := c.Validate(); verr != nil {
			t.Fatalf("Load returned a config that does not validate: %v", verr)
		}
		if c.NodeName != strings.ToLower(strings.TrimSpace(c.NodeName)) {
			t.Fatalf("nodeName %q not folded", c.NodeName)
		}
	})
}

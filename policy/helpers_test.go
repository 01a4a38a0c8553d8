package policy_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/logbuf"
	"github.com/edgeproxy/edgeproxy/modules/modbuild"
	"github.com/edgeproxy/edgeproxy/policy"
)

var engines = []string{policy.Compiler, policy.Interpreter}

// cacheDir is one compilation cache for the whole test binary, so each
// module is compiled once per run.
var cacheDir string

func TestMain(m *testing.M) {
	d, err := os.MkdirTemp("", "edgeproxy-policy-test")
	if err != nil {
		panic(err)
	}
	cacheDir = filepath.Join(d, "wasm")
	code := m.Run()
	os.RemoveAll(d)
	os.Exit(code)
}

func newHost(t testing.TB, engine string, mod func(*policy.Options)) (*policy.Host, *logbuf.Buffer) {
	t.Helper()
	logs := &logbuf.Buffer{}
	opts := policy.Options{
		Engine: engine, CacheDir: cacheDir,
		Log: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if mod != nil {
		mod(&opts)
	}
	h, err := policy.NewHost(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	if h.Engine() != engine {
		t.Fatalf("engine %s, want %s", h.Engine(), engine)
	}
	return h, logs
}

// clock is a settable clock for the breaker.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func build(t testing.TB, dir string) []byte { return modbuild.Build(t, dir) }

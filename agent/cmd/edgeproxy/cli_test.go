package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runCLI runs one command line and returns its exit code and output.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// Defect 2 of issue 14: --server given as a URL crashed status.
func TestStatusServerAsURL(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"version":"x","mode":"plan","node":"n1","refused":[{"service":"new/b","frontend":"TCP 10.0.0.1:80 ClusterIP","reason":"ClusterIP 10.0.0.1:80/TCP is already served by old/a","conflict":true}]}`))
	}))
	defer srv.Close()
	code, out, errs := runCLI(t, "status", "--server", srv.URL)
	if code != 0 {
		t.Fatalf("status --server %s: exit %d: %s", srv.URL, code, errs)
	}
	if !strings.Contains(out, "new/b TCP 10.0.0.1:80 ClusterIP: ClusterIP 10.0.0.1:80/TCP is already served by old/a") {
		t.Errorf("status does not show the conflict:\n%s", out)
	}
	code, _, errs = runCLI(t, "status", "--server", "http://[::1")
	if code == 0 || !strings.Contains(errs, "--server") {
		t.Errorf("a malformed --server: exit %d, %q", code, errs)
	}
}

// Defect 12 of issue 14: flags after positional arguments, as kubectl
// accepts them.
func TestFlagsAfterArguments(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"shop/web":[{"service":"shop/web","family":4,"internal":[],"frontends":[],"weights":{}}]}`))
	}))
	defer srv.Close()
	code, out, errs := runCLI(t, "explain", "shop/web", "-o", "json", "--server", srv.URL)
	if code != 0 {
		t.Fatalf("explain shop/web -o json: exit %d: %s", code, errs)
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Errorf("explain shop/web -o json did not print JSON: %v\n%s", err, out)
	}
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(cfg, []byte("nodeName: n1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errs = runCLI(t, "module", "check", "/nonexistent.wasm", "--config", cfg)
	if code == 2 || !strings.Contains(errs, "nonexistent.wasm") {
		t.Errorf("module check FILE --config X: exit %d: %s", code, errs)
	}
}

// Defect 10 of issue 14 (the CLI part): values that make no sense are
// refused, naming the flag.
func TestPlanRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"plan", "--timeout", "-1s"},
		{"plan", "--timeout", "0s"},
		{"plan", "-o", "bogus"},
		{"status", "-o", "bogus", "--server", "127.0.0.1:1"},
		{"explain", "a/b", "-o", "yaml", "--server", "127.0.0.1:1"},
	} {
		code, _, errs := runCLI(t, args...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2 (usage): %s", args, code, errs)
		}
	}
}

// Defects 3 and 11 of issue 14: plan with --config naming a FIFO ends
// (an error, within its --timeout); plan needs no writable stateDir when
// there are no modules, and a stateDir that is a file is named as such.
func TestPlanBounded(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skipf("cannot make a FIFO: %v", err)
	}
	done := make(chan int, 1)
	go func() {
		code, _, _ := runCLI(t, "plan", "--config", fifo, "--timeout", "2s")
		done <- code
	}()
	select {
	case code := <-done:
		if code == 0 {
			t.Errorf("plan --config FIFO succeeded")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("plan --config FIFO hangs")
	}

	mdir := filepath.Join(dir, "m")
	if err := os.Mkdir(mdir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mdir, "s.yaml"), []byte("apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: t}\nspec: {clusterIP: 10.96.0.5, ports: [{port: 80}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	asFile := filepath.Join(dir, "state-is-a-file")
	if err := os.WriteFile(asFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(cfg, []byte("stateDir: "+asFile+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI(t, "plan", "--config", cfg, "--manifests", mdir, "--node-name", "n1", "--timeout", "20s")
	if code != 0 || !strings.Contains(out, "10.96.0.5:80") {
		t.Errorf("plan without modules and with an unusable stateDir: exit %d\n%s%s", code, out, errs)
	}
	if err := os.WriteFile(cfg, []byte("stateDir: "+asFile+"\npolicy:\n  modules: [{name: m, path: /nonexistent.wasm}]\n  chains: [{name: c, modules: [{module: m}]}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errs = runCLI(t, "plan", "--config", cfg, "--manifests", mdir, "--node-name", "n1", "--timeout", "20s")
	if code == 0 || !strings.Contains(errs, "not a directory") {
		t.Errorf("a stateDir that is a file is not named as such: exit %d: %s", code, errs)
	}
	// A module refused at start: no previous chains keep running.
	if err := os.WriteFile(cfg, []byte("stateDir: "+filepath.Join(dir, "state")+"\npolicy:\n  modules: [{name: m, path: /nonexistent.wasm}]\n  chains: [{name: c, modules: [{module: m}]}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errs = runCLI(t, "plan", "--config", cfg, "--manifests", mdir, "--node-name", "n1", "--timeout", "20s")
	if code == 0 || !strings.Contains(errs, "/nonexistent.wasm") || strings.Contains(errs, "keep running") {
		t.Errorf("a module refused at start: exit %d, want an error naming it and no word of chains kept running:\n%s", code, errs)
	}

	// Issue 29 §7: a stateDir that is a symlink loop said "mkdir …: file
	// exists", and the refusal at start was logged as "the previous chains
	// keep running" (there are none: the command exits).
	loop := filepath.Join(dir, "state-loop")
	if err := os.Symlink(loop, loop); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte("stateDir: "+loop+"\npolicy:\n  modules: [{name: m, path: /nonexistent.wasm}]\n  chains: [{name: c, modules: [{module: m}]}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errs = runCLI(t, "plan", "--config", cfg, "--manifests", mdir, "--node-name", "n1", "--timeout", "20s")
	if code == 0 || !strings.Contains(errs, loop+" is a loop of symbolic links") || strings.Contains(errs, "keep running") {
		t.Errorf("a stateDir that is a symlink loop: exit %d, want an error naming the loop and no word of chains kept running:\n%s", code, errs)
	}
}

// explain prints each shadow module's answer, marked as never programmed,
// after the policy line; a port without shadows gets no such line.
func TestExplainShowsShadows(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"shop/web:http":[{"service":"shop/web:http","family":4,"internal":[],"frontends":[],"weights":{},
"policy":{"weights":[10,10],"chain":"c","steps":[{"module":"weighted","weights":[10,10]}],
 "shadows":[{"module":"next","of":"weighted","weights":[30,10],"diff":"weights differ at 1 of 2 endpoints: 10.0.0.1:80 10->30","inputSha256":"0123456789abcdef0123"},
            {"module":"spin","of":"weighted","failure":"timeout","error":"deadline"}]}}],
"shop/web:plain":[{"service":"shop/web:plain","family":4,"internal":[],"frontends":[],"weights":{},"policy":{"weights":[1],"chain":"c"}}]}`))
	}))
	defer srv.Close()
	code, out, errs := runCLI(t, "explain", "shop/web", "--server", srv.URL)
	if code != 0 {
		t.Fatalf("explain: exit %d: %s", code, errs)
	}
	for _, want := range []string{
		"  shadow next (of weighted, never programmed): [30 10] differs (weights differ at 1 of 2 endpoints: 10.0.0.1:80 10->30) input 0123456789ab\n",
		"  shadow spin (of weighted, never programmed): FAILED timeout (deadline)\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("explain output lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "shadow "); n != 2 {
		t.Errorf("%d shadow lines, want 2:\n%s", n, out)
	}
}

// Issue 29 §7: status and explain refuse a reply that is not an agent's
// ({} or null: exit 0 with an empty or unhealthy agent before), say so when
// the reply is too large (it was cut and reported as "unexpected end of JSON
// input"), and status refuses an extra argument.
func TestClientRefusesNonAgentReplies(t *testing.T) {
	var reply []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(reply)
	}))
	defer srv.Close()
	big := append([]byte(`{"version":"`), bytes.Repeat([]byte("x"), 64<<20)...)
	big = append(big, `","mode":"plan","node":"n1"}`...)
	for _, tc := range []struct {
		reply string
		args  []string
		want  string
	}{
		{`{}`, []string{"status"}, "no agent status"},
		{`null`, []string{"status"}, "no agent status"},
		{`{}`, []string{"status", "-o", "json"}, "no agent status"},
		{`{}`, []string{"explain", "a/b"}, "names no service port"},
		{`null`, []string{"explain", "a/b"}, "names no service port"},
		{string(big), []string{"status"}, "larger than 64 MiB"},
	} {
		reply = []byte(tc.reply)
		args := append(tc.args, "--server", srv.Listener.Addr().String())
		code, out, errs := runCLI(t, args...)
		if code != 1 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v against %.20q: exit %d, stderr %q, stdout %.200q; want exit 1 and %q", tc.args, tc.reply, code, errs, out, tc.want)
		}
	}
	reply = []byte(`{"version":"x","mode":"plan","node":"n1","skipped":[{"kind":"Service","object":"t/web","reason":"metadata.annotations[edgeproxy.io/offline-probe]: \"x\" is none of true","partly":true}]}`)
	if code, out, errs := runCLI(t, "status", "--server", srv.Listener.Addr().String()); code != 0 ||
		!strings.Contains(out, `Service t/web: metadata.annotations[edgeproxy.io/offline-probe]: "x" is none of true`) {
		t.Errorf("status against an agent's reply: exit %d: %s\n%s", code, errs, out)
	}
	code, _, errs := runCLI(t, "status", "extra-arg", "--server", srv.Listener.Addr().String())
	if code != 2 || !strings.Contains(errs, `unexpected argument "extra-arg"`) {
		t.Errorf("status extra-arg: exit %d, %q; want 2 (usage) naming the argument", code, errs)
	}
}

package source

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/edgeproxy/edgeproxy/agent/model"
)

// memSink keeps what a source hands it.
type memSink struct {
	mu       sync.Mutex
	services map[string]*model.Service
}

func (s *memSink) SetService(key string, svc *model.Service) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.services == nil {
		s.services = map[string]*model.Service{}
	}
	if svc == nil {
		delete(s.services, key)
	} else {
		s.services[key] = svc
	}
}
func (s *memSink) SetSlice(string, *model.EndpointSlice) {}
func (s *memSink) SetNode(*model.Node)                   {}
func (s *memSink) has(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.services[key] != nil
}
func (s *memSink) port(key string) uint16 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if svc := s.services[key]; svc != nil && len(svc.Ports) > 0 {
		return svc.Ports[0].Port
	}
	return 0
}

func svcYAML(ns, name, ip string, port int) string {
	return fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: %s}\nspec: {clusterIP: %s, ports: [{port: %d}]}\n", name, ns, ip, port)
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// runDir starts a Dir on path and stops it (bounded) when the test ends.
func runDir(t *testing.T, path string, maxSize int64) (*Dir, *memSink, *Metrics) {
	t.Helper()
	sink := &memSink{}
	m := NewMetrics(nil)
	d, err := NewDir(path, "n1", &Converter{ProxyName: "edgeproxy"}, sink, slog.New(slog.NewTextHandler(io.Discard, nil)), m)
	if err != nil {
		t.Fatal(err)
	}
	d.SetMaxFileSize(maxSize)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the manifest source does not stop")
		}
	})
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if !d.WaitForSync(wctx) {
		t.Fatal("the manifest source never loaded (blocked?)")
	}
	return d, sink, m
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Defect 3 of issue 14: a FIFO (or a file over the cap) in the directory
// is skipped; the other files load, edits are seen, and the source stops.
func TestDirSkipsFIFOAndHugeFiles(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.yaml"), 0o644); err != nil {
		t.Skipf("cannot make a FIFO: %v", err)
	}
	write(t, filepath.Join(dir, "huge.yaml"), svcYAML("t", "huge", "10.96.0.2", 80)+strings.Repeat("#", 4096)+"\n")
	write(t, filepath.Join(dir, "web.yaml"), svcYAML("t", "web", "10.96.0.1", 80))
	_, sink, _ := runDir(t, dir, 1024)
	if !sink.has("t/web") || sink.has("t/huge") {
		t.Fatalf("want t/web loaded and t/huge (over the cap) skipped: %v", sink.services)
	}
	write(t, filepath.Join(dir, "web.yaml"), svcYAML("t", "web", "10.96.0.1", 81))
	waitUntil(t, "the edit loaded", func() bool { return sink.port("t/web") == 81 })
}

// Defect 7 of issue 14: a syntax error in one document keeps the others,
// before and after it.
func TestDirKeepsDocumentsAroundASyntaxError(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "all.yaml"), svcYAML("t", "a", "10.96.0.1", 80)+"---\nkind: [unclosed\n---\n"+svcYAML("t", "c", "10.96.0.3", 80))
	_, sink, m := runDir(t, dir, 1<<20)
	if !sink.has("t/a") || !sink.has("t/c") {
		t.Errorf("documents around the bad one were dropped: %v", sink.services)
	}
	if n := testutil.ToFloat64(m.Skipped.WithLabelValues("manifest", "bad")); n < 1 {
		t.Errorf("the bad document is not counted")
	}
}

// Defect 8 of issue 14: the same Service in two files is warned about and
// counted; issue 29 §7: twice in one file too (the last one silently won).
// Either way the last one read is used.
func TestDirCountsDuplicates(t *testing.T) {
	for name, files := range map[string]map[string]string{
		"two files": {"a.yaml": svcYAML("t", "web", "10.96.0.1", 80), "b.yaml": svcYAML("t", "web", "10.96.0.1", 81)},
		"one file":  {"a.yaml": svcYAML("t", "web", "10.96.0.1", 80) + "---\n" + svcYAML("t", "web", "10.96.0.1", 81)},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for f, content := range files {
				write(t, filepath.Join(dir, f), content)
			}
			var logs bytes.Buffer
			m := NewMetrics(nil)
			sink := &memSink{}
			d, err := NewDir(dir, "n1", &Converter{ProxyName: "edgeproxy"}, sink, slog.New(slog.NewTextHandler(&logs, nil)), m)
			if err != nil {
				t.Fatal(err)
			}
			d.Load()
			if n := testutil.ToFloat64(m.Skipped.WithLabelValues("Service", "duplicate")); n != 1 {
				t.Errorf("duplicates counted %v times, want 1", n)
			}
			if !strings.Contains(logs.String(), "object defined more than once") || !strings.Contains(logs.String(), "the last one read is used") {
				t.Errorf("the duplicate is not logged:\n%s", logs.String())
			}
			if p := sink.port("t/web"); p != 81 {
				t.Errorf("t/web has port %d, want 81 (the last one read)", p)
			}
		})
	}
}

// Defect 5 of issue 14: the directory replaced under its name, and a
// ConfigMap-style ..data symlink swap, are both followed.
func TestDirFollowsReplacement(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "m")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "web.yaml"), svcYAML("t", "web", "10.96.0.1", 80))
	_, sink, _ := runDir(t, dir, 1<<20)
	if err := os.Rename(dir, dir+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "web.yaml"), svcYAML("t", "web", "10.96.0.1", 82))
	waitUntil(t, "the new directory's file loaded", func() bool { return sink.port("t/web") == 82 })
	write(t, filepath.Join(dir, "other.yaml"), svcYAML("t", "other", "10.96.0.4", 80))
	waitUntil(t, "a file added to the new directory loaded", func() bool { return sink.has("t/other") })
}

func TestDirFollowsConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	mk := func(name string, port int) {
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(dir, name, "web.yaml"), svcYAML("t", "web", "10.96.0.1", port))
	}
	mk("..v1", 80)
	if err := os.Symlink("..v1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..data/web.yaml", filepath.Join(dir, "web.yaml")); err != nil {
		t.Fatal(err)
	}
	_, sink, _ := runDir(t, dir, 1<<20)
	if sink.port("t/web") != 80 {
		t.Fatalf("not loaded through the symlinks: %v", sink.services)
	}
	// What the kubelet does: a new timestamped dir, a temporary link, and a
	// rename over ..data.
	mk("..v2", 83)
	if err := os.Symlink("..v2", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the swapped ConfigMap loaded", func() bool { return sink.port("t/web") == 83 })
}

// Defect 10 of issue 14: addresses that cannot be served are refused at
// conversion with the field named.
func TestConvertRefusesUnusableAddresses(t *testing.T) {
	conv := &Converter{ProxyName: "edgeproxy"}
	for _, ip := range []string{"0.0.0.0", "127.0.0.1", "255.255.255.255", "224.0.0.1", "fe80::1%eth0", "::1", "::"} {
		s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "t", Name: "s"}, Spec: v1.ServiceSpec{ClusterIP: ip, Ports: []v1.ServicePort{{Port: 80}}}}
		if _, _, err := conv.Service(s); err == nil || !strings.Contains(err.Error(), "spec.clusterIPs[0]") {
			t.Errorf("ClusterIP %s: %v, want refused naming spec.clusterIPs[0]", ip, err)
		}
	}
	for _, ip := range []string{"0.0.0.0", "127.0.0.1"} {
		sl := &discovery.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "t", Name: "s-1", Labels: map[string]string{LabelServiceName: "s"}},
			AddressType: discovery.AddressTypeIPv4,
			Endpoints:   []discovery.Endpoint{{Addresses: []string{ip}}, {Addresses: []string{"10.244.0.1"}}},
		}
		m, ws, err := conv.EndpointSlice(sl)
		if err != nil || len(m.Endpoints) != 1 || len(ws) != 1 || !strings.Contains(ws[0], "endpoints[0]") {
			t.Errorf("endpoint %s: %v %v %v, want it skipped with endpoints[0] named", ip, m, ws, err)
		}
	}
}

package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/recorder"
)

// conflictManifests: old/a and new/b claim the same ClusterIP:port; old/a
// is older, so it keeps the frontend. Every other Service is fine.
func conflictManifests(webPort int) string {
	var b strings.Builder
	b.WriteString(`apiVersion: v1
kind: Service
metadata: {name: b, namespace: new, creationTimestamp: "2024-05-01T00:00:00Z"}
spec: {clusterIP: 10.96.9.9, ports: [{port: 80}, {name: other, port: 81}]}
---
apiVersion: v1
kind: Service
metadata: {name: a, namespace: old, creationTimestamp: "2023-01-01T00:00:00Z"}
spec: {clusterIP: 10.96.9.9, ports: [{port: 80}]}
`)
	for i := range 100 {
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Service\nmetadata: {name: good%d, namespace: t}\nspec: {clusterIP: 10.96.1.%d, ports: [{port: %d}]}\n", i, i+1, webPort)
	}
	return b.String()
}

// Defect 1 of issue 14: two Services with one frontend must not stop the
// others from being programmed. The older one keeps the frontend, the
// loser's conflicting port is left out and reported, and a later change to
// a good Service is programmed.
func TestConflictingServicesDoNotStopTheRest(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "all.yaml")
	if err := os.WriteFile(path, []byte(conflictManifests(80)), 0o644); err != nil {
		t.Fatal(err)
	}
	rec := recorder.New()
	a := startAgent(t, rec, dir)
	<-a.Synced()

	if err := os.WriteFile(path, []byte(conflictManifests(8080)), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the change to good Services programmed", func() bool {
		p, _ := rec.Last()
		return p != nil && strings.Contains(p.String(), "10.96.1.7:8080 ClusterIP t/good6")
	})
	p, _ := rec.Last()
	text := p.String()
	if !strings.Contains(text, "10.96.9.9:80 ClusterIP old/a ") {
		t.Errorf("the older Service lost its frontend:\n%s", text)
	}
	if strings.Contains(text, "10.96.9.9:80 ClusterIP new/b ") {
		t.Errorf("the newer Service's conflicting port was programmed:\n%s", text)
	}
	if !strings.Contains(text, "10.96.9.9:81 ClusterIP new/b:other ") {
		t.Errorf("the newer Service's other port was left out too:\n%s", text)
	}
	var found bool
	for _, r := range a.Refused() {
		if r.Service == (datapath.ServicePortName{Namespace: "new", Name: "b"}) && strings.Contains(r.Reason, "old/a") {
			found = true
		}
	}
	if !found {
		t.Errorf("the conflict is not reported: %+v", a.Refused())
	}
	if n := testutil.ToFloat64(a.quarantine.conflicts); n != 1 {
		t.Errorf("edgeproxy_frontend_conflicts = %v, want 1", n)
	}
}

// A conflict that one change brings is found in the sync of that change
// (which reads only the changed service ports), and so is its end.
func TestConflictComesAndGoesWithAChange(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "all.yaml")
	// new/b's first port moved off old/a's: no conflict.
	apart := strings.Replace(conflictManifests(80), "ports: [{port: 80}, {name: other", "ports: [{port: 82}, {name: other", 1)
	if err := os.WriteFile(path, []byte(apart), 0o644); err != nil {
		t.Fatal(err)
	}
	rec := recorder.New()
	a := startAgent(t, rec, dir)
	<-a.Synced()
	programmed := func(what string) func() bool {
		return func() bool {
			p, _ := rec.Last()
			return p != nil && strings.Contains(p.String(), what)
		}
	}
	eventually(t, "new/b on port 82", programmed("10.96.9.9:82 ClusterIP new/b "))
	if n := testutil.ToFloat64(a.quarantine.conflicts); n != 0 {
		t.Fatalf("edgeproxy_frontend_conflicts = %v before any conflict", n)
	}

	if err := os.WriteFile(path, []byte(conflictManifests(80)), 0o644); err != nil {
		t.Fatal(err)
	}
	// The plan of the edit: new/b's port 82 gone, the rest still there
	// (not a plan of a half-written file).
	var p *datapath.Plan
	eventually(t, "new/b's port 82 gone", func() bool {
		p, _ = rec.Last()
		text := p.String()
		return !strings.Contains(text, "10.96.9.9:82 ") && strings.Contains(text, "10.96.9.9:81 ClusterIP new/b:other ") &&
			strings.Contains(text, "10.96.9.9:80 ClusterIP old/a ")
	})
	if strings.Contains(p.String(), "10.96.9.9:80 ClusterIP new/b ") {
		t.Errorf("the conflict came with a change and new/b was given old/a's 10.96.9.9:80:\n%s", p)
	}
	if p.Full {
		t.Errorf("the change came in a full plan; want the partial sync that reads only changed ports")
	}
	if n := testutil.ToFloat64(a.quarantine.conflicts); n != 1 {
		t.Errorf("edgeproxy_frontend_conflicts = %v, want 1", n)
	}

	if err := os.WriteFile(path, []byte(apart), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "new/b back on port 82", programmed("10.96.9.9:82 ClusterIP new/b "))
	if n := testutil.ToFloat64(a.quarantine.conflicts); n != 0 {
		t.Errorf("edgeproxy_frontend_conflicts = %v after the conflict ended, want 0", n)
	}
	if r := a.Refused(); len(r) != 0 {
		t.Errorf("still refused after the conflict ended: %+v", r)
	}
}

package e2e_test

import (
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/agent/snapshot"
)

// resumable waits until the snapshot on disk holds the three Services'
// endpoints before the outage and a resume point for the Services and for the EndpointSlices.
func (w *outageWorld) resumable(t *testing.T) map[string]string {
	t.Helper()
	var points map[string]string
	waitFor(t, 60*time.Second, "a snapshot with resume points", func() error {
		s, err := snapshot.Load(w.stateDir)
		if err != nil {
			return err
		}
		if len(s.Services) < 3 {
			return fmt.Errorf("%d services in the snapshot", len(s.Services))
		}
		// The first snapshot can be of a sync before every endpoint came;
		// the next is put off by offline.snapshotInterval.
		raw, err := os.ReadFile(snapshot.Path(w.stateDir))
		if err != nil {
			return err
		}
		for _, a := range []netip.Addr{outKeep, outChanged, outGone} {
			if !strings.Contains(string(raw), `"`+a.String()+`"`) {
				return fmt.Errorf("%s not in the snapshot yet", a)
			}
		}
		var svc, eps bool
		for k := range s.Resume {
			svc = svc || strings.Contains(k, " services ")
			eps = eps || strings.Contains(k, " endpointslices ")
		}
		if !svc || !eps {
			return fmt.Errorf("resume points %v", s.Resume)
		}
		points = s.Resume
		return nil
	})
	return points
}

// reboot kills the agent, flushes its rules (the node reboots) and starts
// it again; with the API server out of reach it programs the snapshot.
func (w *outageWorld) reboot(t *testing.T) {
	t.Helper()
	w.ag.kill(t)
	flushRules(t, w.node, w.bin, w.cfg)
	if err := w.rules(nil, []netip.Addr{outKeep})(); err != nil {
		t.Fatalf("after the flush: %v", err)
	}
	w.started = time.Now()
	w.ag = startAgent(t, w.node, w.bin, w.cfg, w.logPath)
	waitFor(t, 30*time.Second, "the snapshot's rules after the reboot",
		w.rules([]netip.Addr{outKeep, outChanged, outGone}, nil))
}

// listsOf counts reads' LISTs of resource ("services", "endpointslices",
// "nodes").
func listsOf(reads map[string]int, resource string) int {
	n := 0
	for q, c := range listsOnce(reads) {
		if strings.Contains(q, "/"+resource+"?") || strings.HasSuffix(q, "/"+resource) {
			n += c
		}
	}
	return n
}

// A reboot during a short outage resumes from the snapshot: the agent is
// killed while the link is a blackhole, its rules flushed (a reboot), and
// started again; meanwhile a Service is added, one moves to a new
// endpoint and one is deleted. When the link is back, the agent reads no
// Service or EndpointSlice in full (the API server's audit log): it
// watches from the snapshot's resourceVersions, and the rules hold all
// three changes, the deletion included, as after a relist. Its one LIST
// is of its own Node (one object), which it does not resume. See
// RATIONALE.md, "Why a restart resumes from the snapshot".
func TestAPIOutageRebootResumes(t *testing.T) {
	w := newOutageWorld(t)
	points := w.resumable(t)
	outage := time.Now()
	end := w.blackhole(t)
	w.changeAll(t)
	w.reboot(t)
	// The restarted agent resumed from the snapshot without a word from
	// the API server: it must not take the snapshot for an answer.
	w.unreachable(t)
	time.Sleep(20 * time.Second)
	if err := w.rules([]netip.Addr{outKeep, outChanged, outGone}, []netip.Addr{outMoved, outAdded})(); err != nil {
		t.Fatalf("during the outage after the reboot: %v, want the snapshot's rules", err)
	}
	end()
	back := time.Now()
	w.changed(t, 120*time.Second)
	t.Logf("outage %v; rules right %v after the link came back", back.Sub(outage).Round(time.Second), time.Since(back).Round(100*time.Millisecond))

	after := w.reads(t, outage)
	if n, m := listsOf(after, "services"), listsOf(after, "endpointslices"); n != 0 || m != 0 || after["watch-list"] != 0 || after["watch"] == 0 {
		t.Errorf("reads after the outage: %v; %d Service and %d EndpointSlice lists, want watches only", after, n, m)
	}
	// The first watch of each resumed informer after the reboot starts
	// where the snapshot was.
	first := w.watchesFrom(t, outage)
	for key, rv := range points {
		for _, res := range []string{"services", "endpointslices"} {
			if strings.Contains(key, " "+res+" ") && !first[res][rv] {
				t.Errorf("no watch of %s from the snapshot's resourceVersion %s: %v", res, rv, first[res])
			}
		}
	}
	t.Logf("resume points %v; reads of the agent since the outage began: %v", points, after)
	w.statusReads(t)
}

// watchesFrom returns the resourceVersions the agent's watches of each
// resource asked from since since.
func (w *outageWorld) watchesFrom(t *testing.T, since time.Time) map[string]map[string]bool {
	t.Helper()
	evs, err := w.cl.AuditEvents("edgeproxy", since)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]bool{}
	for _, e := range evs {
		if e.Read() != "watch" {
			continue
		}
		u, err := url.Parse(e.RequestURI)
		if err != nil {
			t.Fatal(err)
		}
		if out[e.Resource()] == nil {
			out[e.Resource()] = map[string]bool{}
		}
		out[e.Resource()][u.Query().Get("resourceVersion")] = true
	}
	return out
}

// A reboot during an outage beyond the watch cache: the snapshot's
// resourceVersions are gone from the API server when the link is back,
// its watches from them are answered 410 Gone, and the agent reads each
// resource once, with a LIST, as without the reboot
// (TestAPIOutageBeyondWatchCache); the rules then hold the changes made
// during the outage.
func TestAPIOutageRebootBeyondWatchCache(t *testing.T) {
	w := newOutageWorld(t)
	w.resumable(t)
	atStart := listsOnce(w.reads(t, w.started))
	outage := time.Now()
	end := w.cut(t)
	rvRead := time.Now()
	rv, err := w.cl.Watermark(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	w.unreachable(t)
	w.changeAll(t)
	w.reboot(t)
	w.unreachable(t)
	w.logReadsOnFailure(t, outage)

	w.churnPastWatchCache(t, rv, rvRead, outage)
	if err := w.rules([]netip.Addr{outKeep, outChanged, outGone}, []netip.Addr{outMoved, outAdded})(); err != nil {
		t.Fatalf("during the outage after the reboot: %v, want the snapshot's rules", err)
	}

	w.relistedOnce(t, end, outage, atStart)
}

// logReadsOnFailure logs the agent's requests since since from the audit
// log (time, code, URI) if the test fails.
func (w *outageWorld) logReadsOnFailure(t *testing.T, since time.Time) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		evs, err := w.cl.AuditEvents("edgeproxy", since)
		if err != nil {
			t.Logf("audit: %v", err)
			return
		}
		for _, e := range evs {
			code := int32(0)
			if e.ResponseStatus != nil {
				code = e.ResponseStatus.Code
			}
			t.Logf("audit %s %s %d %s %s", e.Received.Format("15:04:05.000"), e.Stage, code, e.Verb, e.RequestURI)
		}
	})
}

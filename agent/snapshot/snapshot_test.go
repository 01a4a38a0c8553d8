package snapshot_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/agent/snapshot"
	"github.com/edgeproxy/edgeproxy/datapath"
)

var written = time.Date(2026, 11, 22, 12, 0, 0, 123456789, time.UTC)

// sample covers every kind of value the snapshot holds: both families, a
// NodePort frontend without an address, source ranges, affinity, hints.
func sample() *snapshot.Snapshot {
	a := netip.MustParseAddr
	ap := netip.MustParseAddrPort
	p := &datapath.Plan{
		Generation: 42,
		Full:       true,
		Changed:    map[datapath.ServicePortName]bool{{Namespace: "default", Name: "web", Port: "http"}: true},
		Frontends: []datapath.Frontend{
			{
				Service: datapath.ServicePortName{Namespace: "default", Name: "web", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP,
				Addr: a("10.96.0.10"), Family: datapath.IPv4, Port: 80,
				Affinity: 3 * time.Hour, Scheduler: "mh", SchedulerFlags: []string{"mh-port"},
				Endpoints: []datapath.Endpoint{
					{Addr: ap("10.244.1.5:8080"), Weight: 100, Local: true},
					{Addr: ap("10.244.2.7:8080"), Weight: 50},
				},
			},
			{
				Service: datapath.ServicePortName{Namespace: "default", Name: "web", Port: "http"}, Kind: datapath.NodePort, Protocol: datapath.TCP,
				Family: datapath.IPv4, Port: 30080, LocalOnly: true,
				Endpoints: []datapath.Endpoint{{Addr: ap("10.244.1.5:8080"), Weight: 1, Local: true}},
			},
			{
				Service: datapath.ServicePortName{Namespace: "default", Name: "web", Port: "http"}, Kind: datapath.LoadBalancer, Protocol: datapath.TCP,
				Addr: a("2001:db8::1"), Family: datapath.IPv6, Port: 80,
				SourceRanges: []netip.Prefix{netip.MustParsePrefix("2001:db8:1::/48")},
				Endpoints:    []datapath.Endpoint{{Addr: ap("[fd00::5]:8080"), Weight: 1}},
			},
		},
	}
	p.Sort()
	return &snapshot.Snapshot{
		Written: written,
		Node: model.Node{
			Name: "edge-1", Zone: "z1", Region: "r1",
			Labels:    map[string]string{"topology.kubernetes.io/zone": "z1"},
			Addresses: []netip.Addr{a("192.168.1.10"), a("2001:db8::10")},
		},
		Services: []model.Service{{
			Namespace: "default", Name: "web",
			ClusterIPs:      []netip.Addr{a("10.96.0.10")},
			LoadBalancerIPs: []netip.Addr{a("2001:db8::1")},
			SourceRanges:    []netip.Prefix{netip.MustParsePrefix("2001:db8:1::/48")},
			ExternalLocal:   true, HealthCheckNodePort: 32000,
			Affinity: 3 * time.Hour, TrafficDistribution: model.PreferSameZone,
			Annotations: map[string]string{"edgeproxy.io/canary": "10"},
			Ports:       []model.ServicePort{{Name: "http", Protocol: "TCP", Port: 80, NodePort: 30080}},
		}},
		Slices: []model.EndpointSlice{{
			Namespace: "default", Name: "web-abc", Service: "web", Family: model.IPv4,
			Ports: []model.EndpointPort{{Name: "http", Protocol: "TCP", Port: 8080}},
			Endpoints: []model.Endpoint{
				{Addr: a("10.244.1.5"), NodeName: "edge-1", Zone: "z1", Ready: true, Serving: true, Hints: &model.Hints{Zones: []string{"z1"}}},
				{Addr: a("10.244.2.7"), NodeName: "edge-2", Zone: "z2", Serving: true, Terminating: true},
			},
		}},
		Modules: map[string]string{"canary": strings.Repeat("ab", 32)},
		Plan:    *p,
	}
}

func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	want := sample()
	if err := snapshot.Save(dir, want); err != nil {
		t.Fatal(err)
	}
	got, err := snapshot.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip changed the snapshot:\ngot  %+v\nwant %+v", got, want)
	}
	if got.Plan.String() != want.Plan.String() {
		t.Fatalf("plan renders differently:\n%s\nvs\n%s", got.Plan.String(), want.Plan.String())
	}

	data, err := os.ReadFile(snapshot.Path(dir))
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(data, []byte("\n")); n != 1 || !bytes.HasSuffix(data, []byte("}\n")) {
		t.Errorf("file is not one line of JSON (%d newlines)", n)
	}
	if !bytes.HasPrefix(data, []byte(`{"version":1,"sha256":"`)) {
		t.Errorf("file does not start with the envelope: %.60s", data)
	}
	// Addresses are stored as text, readable by people and other tools.
	for _, s := range []string{`"10.244.1.5:8080"`, `"[fd00::5]:8080"`, `"2001:db8:1::/48"`} {
		if !bytes.Contains(data, []byte(s)) {
			t.Errorf("file lacks %s", s)
		}
	}
}

func TestSaveReplaces(t *testing.T) {
	dir := t.TempDir()
	first := sample()
	if err := snapshot.Save(dir, first); err != nil {
		t.Fatal(err)
	}
	second := sample()
	second.Plan.Generation = 43
	second.Written = written.Add(time.Minute)
	if err := snapshot.Save(dir, second); err != nil {
		t.Fatal(err)
	}
	got, err := snapshot.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.Plan.Generation != 43 || !got.Written.Equal(second.Written) {
		t.Fatalf("Load returned generation %d written %s, want the second save", got.Plan.Generation, got.Written)
	}
	assertOnlySnapshot(t, dir)
}

func TestFileMode(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state", "edgeproxy")
	if err := snapshot.Save(dir, sample()); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(snapshot.Path(dir))
	if err != nil {
		t.Fatal(err)
	}
	if m := fi.Mode().Perm(); m != 0o600 {
		t.Errorf("snapshot mode %v, want 0600", m)
	}
	di, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m := di.Mode().Perm(); m != 0o700 {
		t.Errorf("created state directory mode %v, want 0700", m)
	}
}

func TestMissing(t *testing.T) {
	s, err := snapshot.Load(t.TempDir())
	if !errors.Is(err, snapshot.ErrNotFound) || s != nil {
		t.Fatalf("Load of an empty dir = %v, %v; want nil, ErrNotFound", s, err)
	}
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ErrNotFound error does not also match os.ErrNotExist: %v", err)
	}
}

// save writes the sample and returns the file's bytes.
func save(t *testing.T, dir string) []byte {
	t.Helper()
	if err := snapshot.Save(dir, sample()); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(snapshot.Path(dir))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func rewrite(t *testing.T, dir string, data []byte) {
	t.Helper()
	if err := os.WriteFile(snapshot.Path(dir), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestCorruptByteFlip(t *testing.T) {
	dir := t.TempDir()
	orig := save(t, dir)
	// Flip one byte in several places of the payload: inside an address,
	// a name, a number. Each must be caught, whether the JSON stays valid
	// (checksum) or not (syntax).
	for _, needle := range []string{"10.244.2.7", `"web-abc"`, `"Generation":42`, `"Weight":50`} {
		t.Run(needle, func(t *testing.T) {
			i := bytes.Index(orig, []byte(needle))
			if i < 0 {
				t.Fatalf("%s not in file", needle)
			}
			data := bytes.Clone(orig)
			data[i+len(needle)-2] ^= 0x01
			rewrite(t, dir, data)
			s, err := snapshot.Load(dir)
			if !errors.Is(err, snapshot.ErrCorrupt) || s != nil {
				t.Fatalf("Load after flipping a byte in %s = %v, %v; want nil, ErrCorrupt", needle, s, err)
			}
		})
	}
	t.Run("checksum", func(t *testing.T) {
		data := bytes.Clone(orig)
		i := bytes.Index(data, []byte(`"sha256":"`)) + len(`"sha256":"`)
		if data[i] == 'a' {
			data[i] = 'b'
		} else {
			data[i] = 'a'
		}
		rewrite(t, dir, data)
		if _, err := snapshot.Load(dir); !errors.Is(err, snapshot.ErrCorrupt) {
			t.Fatalf("Load with a damaged checksum = %v, want ErrCorrupt", err)
		}
	})
}

func TestTruncated(t *testing.T) {
	dir := t.TempDir()
	orig := save(t, dir)
	for _, n := range []int{0, 1, 20, len(orig) / 2, len(orig) - 3} {
		rewrite(t, dir, orig[:n])
		s, err := snapshot.Load(dir)
		if !errors.Is(err, snapshot.ErrCorrupt) || s != nil {
			t.Errorf("Load of the first %d of %d bytes = %v, %v; want nil, ErrCorrupt", n, len(orig), s, err)
		}
	}
}

func TestWrongVersion(t *testing.T) {
	dir := t.TempDir()
	orig := save(t, dir)
	for _, v := range []string{"0", "2", "999"} {
		data := bytes.Replace(orig, []byte(`{"version":1,`), []byte(`{"version":`+v+`,`), 1)
		rewrite(t, dir, data)
		s, err := snapshot.Load(dir)
		if !errors.Is(err, snapshot.ErrIncompatible) || s != nil {
			t.Errorf("Load of version %s = %v, %v; want nil, ErrIncompatible", v, s, err)
		}
	}
	// A later schema may lay the envelope out differently; it is still
	// recognised as another version, not as damage.
	rewrite(t, dir, []byte(`{"schema":{"format":"x"},"version":2}`))
	if _, err := snapshot.Load(dir); !errors.Is(err, snapshot.ErrIncompatible) {
		t.Errorf("Load of a reordered version-2 envelope = %v, want ErrIncompatible", err)
	}
	// A file that is JSON but not a snapshot at all.
	rewrite(t, dir, []byte(`{"services":[]}`))
	if _, err := snapshot.Load(dir); !errors.Is(err, snapshot.ErrCorrupt) {
		t.Errorf("Load of a JSON file without version = %v, want ErrCorrupt", err)
	}
}

// A payload whose checksum holds but whose plan breaks the Backend's
// invariants (e.g. written by a buggy agent) is refused too.
func TestInvalidPlanRefused(t *testing.T) {
	s := sample()
	s.Plan.Frontends[0].Endpoints[0].Weight = 0
	if err := snapshot.Save(t.TempDir(), s); err == nil {
		t.Fatal("Save accepted a plan with a zero weight")
	}
}

func TestSaveErrors(t *testing.T) {
	if err := snapshot.Save(t.TempDir(), nil); err == nil {
		t.Error("Save(nil) succeeded")
	}
	// The state "directory" is a file.
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := snapshot.Save(f, sample()); err == nil {
		t.Error("Save into a regular file succeeded")
	}
	// The snapshot's name is taken by a directory: the rename fails, and
	// no temp file may be left behind.
	dir := t.TempDir()
	if err := os.Mkdir(snapshot.Path(dir), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(snapshot.Path(dir), "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := snapshot.Save(dir, sample()); err == nil {
		t.Error("Save over a non-empty directory succeeded")
	}
	assertOnlySnapshot(t, dir)
}

// assertOnlySnapshot fails if dir holds anything but the snapshot file
// (e.g. a leftover temp file).
func assertOnlySnapshot(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() != snapshot.FileName {
			t.Errorf("stray file %s left in the state directory", e.Name())
		}
	}
}

// big builds a snapshot of n services with one port and m endpoints each,
// with one ClusterIP frontend per service.
func big(n, m int) *snapshot.Snapshot {
	s := &snapshot.Snapshot{
		Written: written,
		Node:    model.Node{Name: "edge-1", Zone: "z1", Addresses: []netip.Addr{netip.MustParseAddr("192.168.1.10")}},
		Modules: map[string]string{"canary": strings.Repeat("ab", 32)},
	}
	s.Plan.Generation = 1
	for i := range n {
		name := fmt.Sprintf("svc-%05d", i)
		cip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		s.Services = append(s.Services, model.Service{
			Namespace: "default", Name: name, ClusterIPs: []netip.Addr{cip},
			Ports: []model.ServicePort{{Name: "http", Protocol: "TCP", Port: 80}},
		})
		sl := model.EndpointSlice{
			Namespace: "default", Name: name + "-x", Service: name, Family: model.IPv4,
			Ports: []model.EndpointPort{{Name: "http", Protocol: "TCP", Port: 8080}},
		}
		f := datapath.Frontend{
			Service: datapath.ServicePortName{Namespace: "default", Name: name, Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP,
			Addr: cip, Family: datapath.IPv4, Port: 80,
		}
		for j := range m {
			ip := netip.AddrFrom4([4]byte{10, byte(128 + j), byte(i >> 8), byte(i)})
			sl.Endpoints = append(sl.Endpoints, model.Endpoint{
				Addr: ip, NodeName: fmt.Sprintf("node-%d", j), Zone: "z1", Ready: true, Serving: true,
			})
			f.Endpoints = append(f.Endpoints, datapath.Endpoint{Addr: netip.AddrPortFrom(ip, 8080), Weight: 1})
		}
		s.Slices = append(s.Slices, sl)
		s.Plan.Frontends = append(s.Plan.Frontends, f)
	}
	s.Plan.Sort()
	return s
}

func BenchmarkSave5kx10(b *testing.B) {
	dir := b.TempDir()
	s := big(5000, 10)
	b.ReportAllocs()
	for b.Loop() {
		if err := snapshot.Save(dir, s); err != nil {
			b.Fatal(err)
		}
	}
	reportSize(b, dir)
}

func BenchmarkLoad5kx10(b *testing.B) {
	dir := b.TempDir()
	if err := snapshot.Save(dir, big(5000, 10)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		s, err := snapshot.Load(dir)
		if err != nil {
			b.Fatal(err)
		}
		if len(s.Plan.Frontends) != 5000 {
			b.Fatalf("loaded %d frontends", len(s.Plan.Frontends))
		}
	}
	reportSize(b, dir)
}

func reportSize(b *testing.B, dir string) {
	fi, err := os.Stat(snapshot.Path(dir))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(fi.Size()), "file-bytes")
}

// TestReadsStringKeyedSnapshot: a snapshot written before the service-port
// key became a struct (testdata/v1-string-keys.json, written by that code
// from sample()) loads as the same snapshot, and saving it again writes the
// same bytes: the file format did not change.
func TestReadsStringKeyedSnapshot(t *testing.T) {
	old, err := os.ReadFile(filepath.Join("testdata", "v1-string-keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rewrite(t, dir, old)
	got, err := snapshot.Load(dir)
	if err != nil {
		t.Fatalf("load the string-keyed snapshot: %v", err)
	}
	if want := sample(); !reflect.DeepEqual(got, want) {
		t.Fatalf("loaded\n%+v\nwant\n%+v", got, want)
	}
	if again := save(t, t.TempDir()); !bytes.Equal(again, old) {
		t.Fatalf("saved again:\n%s\nwant the old bytes:\n%s", again, old)
	}
}

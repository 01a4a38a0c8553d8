package source

import (
	"bytes"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/edgeproxy/edgeproxy/agent/model"
)

func TestParseOfflineProbe(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want OfflineProbe
		bad  bool
	}{
		{in: "", want: OfflineProbe{}},
		{in: " True ", want: OfflineProbe{}},
		{in: "FALSE", want: OfflineProbe{Off: true}},
		{in: "9090", want: OfflineProbe{Port: 9090}},
		{in: "9090/TCP", want: OfflineProbe{Port: 9090}},
		{in: "53/udp", want: OfflineProbe{Port: 53, UDP: true}},
		{in: "0", bad: true},
		{in: "70000", bad: true},
		{in: "53/sctp", bad: true},
		{in: "no", bad: true},
	} {
		got, err := ParseOfflineProbe(tc.in)
		if (err != nil) != tc.bad || (!tc.bad && got != tc.want) {
			t.Errorf("ParseOfflineProbe(%q) = %+v, %v; want %+v, error %v", tc.in, got, err, tc.want, tc.bad)
		}
	}
	// A value of any size makes a short message.
	big := strings.Repeat("é", 100_000) // 200,000 bytes
	_, err := ParseOfflineProbe(big)
	if err == nil || len(err.Error()) > 200 || !strings.Contains(err.Error(), "(200000 bytes)") {
		t.Errorf("a 200 KB value: error of %d bytes: %.300v", len(err.Error()), err)
	}
}

// Issue 29 §7: the offline-probe annotation is checked when the Service is
// read, from manifests and from the API: a bad value is left out (the
// Service is used, with the default probe), logged once per distinct
// value, counted, and standing in Problems until it is fixed; a value that
// turns bad again is logged again; the log never carries a whole value.
// It is kept whatever the policy prefix is.
func TestOfflineProbeCheckedWhenRead(t *testing.T) {
	big := strings.Repeat("x", 200_000)
	steps := []struct {
		value string
		bad   bool
	}{
		{"bogus", true}, {"bogus", true}, {"9090", false}, {"bogus", true}, {big, true}, {big, true},
	}
	const logsOfBad = 3 // bogus, bogus again after 9090, big

	t.Run("manifests", func(t *testing.T) {
		dir := t.TempDir()
		var logs bytes.Buffer
		m := NewMetrics(nil)
		sink := &memSink{}
		d, err := NewDir(dir, "n1", &Converter{ProxyName: "edgeproxy", KeepPrefix: "other.io/"}, sink, slog.New(slog.NewTextHandler(&logs, nil)), m)
		if err != nil {
			t.Fatal(err)
		}
		for i, s := range steps {
			write(t, filepath.Join(dir, "web.yaml"), fmt.Sprintf(
				"apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: t, annotations: {edgeproxy.io/offline-probe: %q}}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n", s.value))
			d.Load()
			check(t, i, s.value, s.bad, sink.get("t/web"), d.Problems())
		}
		checkLogs(t, &logs, logsOfBad, testutil.ToFloat64(m.Skipped.WithLabelValues("Service-part", "bad")))
	})

	t.Run("api", func(t *testing.T) {
		var logs bytes.Buffer
		m := NewMetrics(nil)
		sink := &memSink{}
		conv := &Converter{ProxyName: "edgeproxy", KeepPrefix: "other.io/"}
		a := &API{conv: conv, sink: sink, report: newReporter(slog.New(slog.NewTextHandler(&logs, nil)), m)}
		for i, s := range steps {
			svc := &v1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "t", Annotations: map[string]string{AnnotationOfflineProbe: s.value}},
				Spec:       v1.ServiceSpec{ClusterIP: "10.96.0.1", Ports: []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}}},
			}
			obj, err := conv.Transform(svc)
			if err != nil {
				t.Fatal(err)
			}
			a.onService("t/web", obj)
			check(t, i, s.value, s.bad, sink.get("t/web"), a.Problems())
		}
		checkLogs(t, &logs, logsOfBad, testutil.ToFloat64(m.Skipped.WithLabelValues("Service-part", "bad")))
		a.onService("t/web", nil) // deleted: nothing stands
		if p := a.Problems(); len(p) != 0 {
			t.Errorf("problems after the Service was deleted: %v", p)
		}
	})
}

func check(t *testing.T, step int, value string, bad bool, svc *model.Service, problems []Problem) {
	t.Helper()
	if svc == nil {
		t.Fatalf("step %d: the Service is not used", step)
	}
	got, kept := svc.Annotations[AnnotationOfflineProbe]
	if bad && kept {
		t.Errorf("step %d: the bad value %.20q reached the model", step, got)
	}
	if !bad && got != value {
		t.Errorf("step %d: the annotation is %q in the model, want %q", step, got, value)
	}
	if n := len(problems); bad && (n != 1 || !problems[0].Partly || !strings.Contains(problems[0].Reason, AnnotationOfflineProbe)) || !bad && n != 0 {
		t.Errorf("step %d: problems %.300v", step, problems)
	}
}

func checkLogs(t *testing.T, logs *bytes.Buffer, want int, counted float64) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	n := 0
	for _, l := range lines {
		if strings.Contains(l, AnnotationOfflineProbe) {
			n++
		}
		if len(l) > 1000 {
			t.Errorf("a log line of %d bytes: %.200s…", len(l), l)
		}
	}
	if n != want {
		t.Errorf("logged %d times, want %d:\n%.2000s", n, want, logs.String())
	}
	if counted != 5 {
		t.Errorf("edgeproxy_source_objects_skipped_total{kind=Service-part,reason=bad} = %v, want 5 (every bad read)", counted)
	}
}

func (s *memSink) get(key string) *model.Service {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.services[key]
}

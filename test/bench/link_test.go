package bench

import (
	"testing"

	"github.com/edgeproxy/edgeproxy/test/cluster"
)

// The link's IP bytes are the veth's counters less an Ethernet header a
// frame; in is what the host side sent (to the node).
func TestLinkCountSince(t *testing.T) {
	c0 := LinkCount{RxBytes: 1000, TxBytes: 5000, RxPackets: 10, TxPackets: 20}
	c1 := LinkCount{RxBytes: 1000 + 3*66, TxBytes: 5000 + 2*1514, RxPackets: 13, TxPackets: 22}
	in, out := c1.Since(c0)
	if in != 2*1500 || out != 3*52 {
		t.Fatalf("in %d out %d, want 3000 and 156", in, out)
	}
}

// Full reads and resumed watches are told apart per resource kind the
// proxies read; other resources and stages are not counted.
func TestCountRequests(t *testing.T) {
	ev := func(resource, verb, stage, uri string, code int32) cluster.AuditEvent {
		e := cluster.AuditEvent{Verb: verb, Stage: stage, RequestURI: uri}
		e.ObjectRef = &struct {
			Resource string `json:"resource"`
		}{resource}
		e.ResponseStatus = &struct {
			Code int32 `json:"code"`
		}{code}
		return e
	}
	q := CountRequests([]cluster.AuditEvent{
		ev("services", "list", "ResponseComplete", "/api/v1/services", 200),
		ev("endpointslices", "watch", "ResponseStarted", "/apis/discovery.k8s.io/v1/endpointslices?sendInitialEvents=true&watch=true", 200),
		ev("endpointslices", "watch", "ResponseComplete", "/apis/discovery.k8s.io/v1/endpointslices?sendInitialEvents=true&watch=true", 200),
		ev("nodes", "watch", "ResponseStarted", "/api/v1/nodes?resourceVersion=7&watch=true", 200),
		ev("servicecidrs", "watch", "ResponseStarted", "/apis/networking.k8s.io/v1/servicecidrs?resourceVersion=7&watch=true", 200),
		ev("services", "watch", "ResponseComplete", "/api/v1/services?resourceVersion=3&watch=true", 410),
		ev("pods", "list", "ResponseComplete", "/api/v1/pods", 200),
	})
	want := Requests{Lists: 1, WatchLists: 1, Watches: 2, Gone: 1}
	if q != want || q.FullReads() != 2 {
		t.Fatalf("%+v, want %+v", q, want)
	}
}

func TestNum(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1789328: "1,789,328", -36940: "-36,940"} {
		if got := num(n); got != want {
			t.Errorf("num(%d) = %q, want %q", n, got, want)
		}
	}
}

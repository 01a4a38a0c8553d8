package source

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/edgeproxy/edgeproxy/agent/model"
)

// The resume point is a resourceVersion up to which the handler has had
// every event: the first list's once the handler has all of it; not a
// relist's until a watch event follows it; after that the highest
// handed on; never one that is not a number.
func TestMarkPoint(t *testing.T) {
	synced := false
	m := &mark{synced: func() bool { return synced }}
	if p := m.point(); p != "" {
		t.Fatalf("before any list: %q", p)
	}
	m.listed("100")
	m.handed("90") // a listed object, in key order
	if p := m.point(); p != "" {
		t.Fatalf("first list being handed on: %q, want none", p)
	}
	m.handed("40")
	synced = true
	if p := m.point(); p != "100" {
		t.Fatalf("first list handed on: %q, want the list's 100", p)
	}
	m.handed("105")
	m.handed("104") // not newer: a replayed deletion, say
	if p := m.point(); p != "105" {
		t.Fatalf("after events: %q, want 105", p)
	}
	m.listed("200") // a relist after 410 Gone
	m.handed("150")
	if p := m.point(); p != "" {
		t.Fatalf("relist being handed on: %q, want none", p)
	}
	m.handed("201")
	if p := m.point(); p != "201" {
		t.Fatalf("after the relist's first event: %q, want 201", p)
	}
	m.handed("") // a snapshot's object: no resourceVersion
	if p := m.point(); p != "201" {
		t.Fatalf("after an object without resourceVersion: %q, want 201", p)
	}
	m.handed("abc")
	m.handed("300")
	if p := m.point(); p != "" {
		t.Fatalf("after an opaque resourceVersion: %q, want none", p)
	}
}

// stubLW counts what reaches the API server.
type stubLW struct {
	mu             sync.Mutex
	lists, watches int
	watchRV        string
	watchTimeout   int64
	bookmarks      bool // the last watch asked for bookmarks
	err            error
}

func (s *stubLW) ListWithContext(context.Context, metav1.ListOptions) (runtime.Object, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lists++
	if s.err != nil {
		return nil, s.err
	}
	return &metav1.List{ListMeta: metav1.ListMeta{ResourceVersion: "500"}}, nil
}

func (s *stubLW) WatchWithContext(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.watches++
	s.watchRV = o.ResourceVersion
	s.bookmarks = o.AllowWatchBookmarks
	if o.TimeoutSeconds != nil {
		s.watchTimeout = *o.TimeoutSeconds
	}
	if s.err != nil {
		return nil, s.err
	}
	return watch.NewEmptyWatch(), nil
}

func (s *stubLW) listCount() int  { s.mu.Lock(); defer s.mu.Unlock(); return s.lists }
func (s *stubLW) watchCount() int { s.mu.Lock(); defer s.mu.Unlock(); return s.watches }
func (s *stubLW) watchFrom() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.watchRV
}

// A seeded informer's first list is the seed, not a request; its next
// lists and its watches go to the API server, and only their answers
// count as the server's.
func TestResumableSeed(t *testing.T) {
	inner := &stubLW{err: errors.New("unreachable")}
	r := &resumable{inner: inner}
	r.setSeed("42", []runtime.Object{&Converted{Meta: Meta{Namespace: "ns", Name: "a"}}})
	obj, err := r.ListWithContext(context.Background(), metav1.ListOptions{ResourceVersion: "0"})
	if err != nil || inner.lists != 0 {
		t.Fatalf("seeded list: %v, %d requests", err, inner.lists)
	}
	items, err := cacheItems(obj)
	if err != nil || len(items) != 1 {
		t.Fatalf("seed items %v, %v", items, err)
	}
	if r.answered.Load() || r.seeded() {
		t.Fatal("the seed counted as an answer, or is still there")
	}
	if _, err := r.WatchWithContext(context.Background(), metav1.ListOptions{ResourceVersion: "42"}); err == nil || r.answered.Load() {
		t.Fatalf("an unreachable watch: %v, answered %v", err, r.answered.Load())
	}
	inner.err = nil
	w, err := r.WatchWithContext(context.Background(), metav1.ListOptions{ResourceVersion: "42"})
	if err != nil || !r.answered.Load() || inner.watchRV != "42" {
		t.Fatalf("watch: %v, answered %v, from %q", err, r.answered.Load(), inner.watchRV)
	}
	w.Stop()
	if _, err := r.ListWithContext(context.Background(), metav1.ListOptions{}); err != nil || inner.lists != 1 {
		t.Fatalf("the second list: %v, %d requests, want 1", err, inner.lists)
	}
	if p := r.mark.point(); p != "" {
		t.Fatalf("a relist pending, point %q", p)
	}
}

// cacheItems reads a list's items as the reflector does.
func cacheItems(obj runtime.Object) ([]runtime.Object, error) {
	l, ok := obj.(*seedList)
	if !ok {
		return nil, errors.New("not a seed list")
	}
	return l.Items, nil
}

// Resume seeds each informer whose key has a point with the snapshot's
// objects it reads: Services labelled for this proxy to the second
// Service informer, the others to the first; the rest list.
func TestResumeSeeds(t *testing.T) {
	key := func(k string) func() string { return func() string { return k } }
	main, named, eps := &resumable{key: key("svc")}, &resumable{key: key("named")}, &resumable{key: key("eps")}
	a := &API{conv: &Converter{ProxyName: "edge"}, resumables: []*resumable{main, named, eps},
		svcResumables: []*resumable{main, named}, epsResumable: eps}
	services := []model.Service{{Namespace: "ns", Name: "plain"},
		{Namespace: "ns", Name: "ours", Labels: map[string]string{LabelServiceProxyName: "edge"}}}
	slices := []model.EndpointSlice{{Namespace: "ns", Name: "plain-1"}}
	if n := a.Resume(map[string]string{"svc": "7", "named": "8", "other": "9"}, services, slices); n != 2 {
		t.Fatalf("resumed %d, want 2", n)
	}
	if eps.seeded() {
		t.Error("the slices had no point and were seeded")
	}
	for _, tc := range []struct {
		r    *resumable
		rv   string
		name string
	}{{main, "7", "plain"}, {named, "8", "ours"}} {
		l := tc.r.seed
		if l == nil || l.ResourceVersion != tc.rv || len(l.Items) != 1 || l.Items[0].(*Converted).Service.Name != tc.name {
			t.Errorf("seed %+v, want %s at %s", l, tc.name, tc.rv)
		}
	}
	var _ cache.ListerWatcher = main
}

// client-go's informer takes a seed as its first list: its store holds
// the snapshot's objects, no list reaches the API server, and the watch
// asks from the seed's resourceVersion.
func TestInformerTakesSeed(t *testing.T) {
	inner := &stubLW{}
	r := &resumable{inner: inner}
	r.setSeed("42", []runtime.Object{&Converted{Meta: Meta{Namespace: "ns", Name: "a"}, Service: &model.Service{Namespace: "ns", Name: "a"}}})
	inf := cache.NewSharedIndexInformer(r, &Converted{}, 0, cache.Indexers{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("not synced")
	}
	if keys := inf.GetStore().ListKeys(); len(keys) != 1 || keys[0] != "ns/a" {
		t.Fatalf("store %v, want ns/a", keys)
	}
	for deadline := time.Now().Add(10 * time.Second); inner.watchCount() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no watch within 10s")
		}
	}
	if inner.listCount() != 0 || inner.watchFrom() != "42" {
		t.Fatalf("%d lists, watch from %q; want none and 42", inner.listCount(), inner.watchFrom())
	}
}

// A list asks for pages of listPage, and for what the reflector meant
// without a limit: "0" becomes the most recent (the watch cache ignores a
// limit at "0"), another version NotOlderThan (with a limit alone it is
// that exact, older state); next pages are left as they are.
func TestPaged(t *testing.T) {
	for _, tc := range []struct {
		in, want metav1.ListOptions
	}{
		{metav1.ListOptions{ResourceVersion: "0", Limit: 500}, metav1.ListOptions{Limit: listPage}},
		{metav1.ListOptions{ResourceVersion: "213"}, metav1.ListOptions{ResourceVersion: "213", ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, Limit: listPage}},
		{metav1.ListOptions{}, metav1.ListOptions{Limit: listPage}},
		{metav1.ListOptions{Continue: "abc", Limit: 500}, metav1.ListOptions{Continue: "abc", Limit: listPage}},
		{metav1.ListOptions{ResourceVersion: "9", ResourceVersionMatch: metav1.ResourceVersionMatchExact, Limit: 10},
			metav1.ListOptions{ResourceVersion: "9", ResourceVersionMatch: metav1.ResourceVersionMatchExact, Limit: listPage}},
	} {
		got := tc.in
		paged(&got)
		if got != tc.want {
			t.Errorf("paged(%+v) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

// Watches ask for 30 to 60 minutes (the API server's default), not the
// reflector's 5 to 10: each restart costs the link a request.
func TestLongWatch(t *testing.T) {
	inner := &stubLW{}
	for _, lw := range []cache.ListerWatcherWithContext{&resumable{inner: inner}, longWatcher{ListerWatcherWithContext: inner}} {
		five := int64(300)
		w, err := lw.WatchWithContext(context.Background(), metav1.ListOptions{TimeoutSeconds: &five})
		if err != nil {
			t.Fatal(err)
		}
		w.Stop()
		if inner.watchTimeout < 1800 || inner.watchTimeout >= 3600 {
			t.Errorf("%T: watch of %d s, want 1800 to 3600", lw, inner.watchTimeout)
		}
	}
}

// The watches of informers that hold one object or none (quiet) ask for no
// bookmarks, which the API server would send once a minute each; the
// others keep the reflector's request for them.
func TestQuietWatch(t *testing.T) {
	for _, tc := range []struct {
		lw    func(*stubLW) cache.ListerWatcherWithContext
		quiet bool
	}{
		{func(s *stubLW) cache.ListerWatcherWithContext { return &resumable{inner: s} }, false},
		{func(s *stubLW) cache.ListerWatcherWithContext { return &resumable{inner: s, quiet: true} }, true},
		{func(s *stubLW) cache.ListerWatcherWithContext { return longWatcher{ListerWatcherWithContext: s} }, false},
		{func(s *stubLW) cache.ListerWatcherWithContext {
			return longWatcher{ListerWatcherWithContext: s, quiet: true}
		}, true},
	} {
		inner := &stubLW{}
		lw := tc.lw(inner)
		w, err := lw.WatchWithContext(context.Background(), metav1.ListOptions{AllowWatchBookmarks: true})
		if err != nil {
			t.Fatal(err)
		}
		w.Stop()
		if inner.bookmarks == tc.quiet {
			t.Errorf("%T quiet=%v: watch asks for bookmarks: %v", lw, tc.quiet, inner.bookmarks)
		}
	}
}

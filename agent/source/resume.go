package source

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/edgeproxy/edgeproxy/agent/model"
)

// A restart resumes each informer from the snapshot on disk instead of
// reading it in full (RATIONALE.md, "Why a restart resumes from the
// snapshot"): the snapshot keeps, per informer, a resourceVersion up to
// which its objects hold every event (a resume point); the informer's
// first list is then the snapshot's objects at that resourceVersion,
// answered here without asking the API server, and its reflector watches
// from there. A server that no longer has that resourceVersion answers
// 410 Gone, and the reflector lists then, as after any outage beyond the
// watch cache.

// resumable is an informer's ListerWatcher: the API server's, but for its
// first list when a seed is set, and keeping the informer's resume point.
type resumable struct {
	inner cache.ListerWatcherWithContext
	// key names what the informer reads (resource, selectors, what the
	// objects were converted with, the server): a resume point is used
	// only by an informer with the same key.
	key  func() string
	mu   sync.Mutex
	seed *seedList // the first list's answer; nil once used, or without one
	// answered: the API server answered a list or a watch request.
	answered atomic.Bool
	mark     mark
	// quiet: the watches ask for no bookmarks (quietWatch).
	quiet bool
}

// ListWithContext answers the first list with the seed, if any; every
// other list goes to the API server.
func (r *resumable) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	r.mu.Lock()
	seed := r.seed
	r.seed = nil
	r.mu.Unlock()
	if seed != nil {
		r.mark.listed(seed.ResourceVersion)
		return seed, nil
	}
	first := opts.Continue == ""
	paged(&opts)
	obj, err := r.inner.ListWithContext(ctx, opts)
	if err != nil {
		return nil, err
	}
	r.answered.Store(true)
	if first { // the later pages are the same list
		rv := ""
		if l, err := meta.ListAccessor(obj); err == nil {
			rv = l.GetResourceVersion()
		}
		r.mark.listed(rv)
	}
	return obj, nil
}

// listPage is the most objects a LIST asks for at once. A LIST is not a
// watch: the API server gives up a request it has not finished writing
// after its --request-timeout (60 s by default), and at 64 kbit/s (8 KB/s)
// 60 s is 480 KB, less than the gzipped list of 5,000 EndpointSlices
// (RATIONALE.md, "Why a full read comes in pages"). A page of 1,000
// slices of 10 endpoints is about 190 KB gzipped; of 500 it was smaller
// still, but the API server gzips only a response over 128 KB, and 500
// Services were less: not gzipped, 43% more bytes at 1,000 Services.
const listPage = 1000

// paged makes a list ask for listPage objects at a time (the reflector's
// pager asks for the next page while the answer says there is more). A
// limit changes what a resourceVersion means to the API server, so the
// first page says what the reflector meant without one:
//
//   - "0" (any version): the watch cache ignores the limit of such a
//     list; it asks for the most recent instead (""), which it pages;
//   - another version (after a watch was answered 410 Gone): with a limit
//     and no resourceVersionMatch that is the state at exactly that
//     version, which etcd still has until it compacts: the objects as
//     they were before the outage, and a watch from there is Gone again.
//     It asks for NotOlderThan, as the reflector's list without a limit
//     does.
//
// The next pages (continue=) carry their version in the token.
func paged(o *metav1.ListOptions) {
	o.Limit = listPage // the reflector's pager asks for 500
	switch {
	case o.Continue != "":
	case o.ResourceVersion == "0":
		o.ResourceVersion = ""
	case o.ResourceVersion != "" && o.ResourceVersionMatch == "":
		o.ResourceVersionMatch = metav1.ResourceVersionMatchNotOlderThan
	}
}

// WatchWithContext asks the API server, for a longer watch (longWatch),
// without bookmarks when quiet.
func (r *resumable) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	longWatch(&opts)
	if r.quiet {
		quietWatch(&opts)
	}
	w, err := r.inner.WatchWithContext(ctx, opts)
	if err == nil {
		r.answered.Store(true)
	}
	return w, err
}

// List and Watch are the forms without a context, which the informer's
// constructor asks for; the reflector uses the ones with.
func (r *resumable) List(opts metav1.ListOptions) (runtime.Object, error) {
	return r.ListWithContext(context.Background(), opts)
}

func (r *resumable) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return r.WatchWithContext(context.Background(), opts)
}

// longWatch asks for a watch of 30 to 60 minutes, the API server's own
// default (--min-request-timeout 1800 s, times 1 to 2), where client-go's
// reflector asks for 5 to 10 to end watches that hang. A hanging
// connection is the Link's to find (keepalive, TCP_USER_TIMEOUT), and
// every watch that ends costs the link a request and its answer; on a
// quiet node those restarts were a tenth of its bytes (RATIONALE.md, "A
// quiet day").
func longWatch(o *metav1.ListOptions) {
	t := int64(1800 + rand.IntN(1800))
	o.TimeoutSeconds = &t
}

// quietWatch asks for a watch without bookmarks. The API server sends
// every watch that asks for them a bookmark about once a minute (its
// watch cache, cache_watcher.go), each about 170 bytes on the link with
// its TLS record, TCP/IP headers and acknowledgement, whatever changed:
// a third of a megabyte a day per watch. A bookmark keeps a watch's
// resourceVersion fresh when what changes in the resource is filtered out
// by its selectors, so that the watch's next start (after its timeout or
// an outage) is not answered 410 Gone. That matters for the Services and
// EndpointSlices, whose full read is the cold start's; the informers that
// hold one object or none (this Node, the Services labelled with our
// proxyName) go without, and pay a 410 with a LIST of that object or
// none (RATIONALE.md, "A quiet day").
func quietWatch(o *metav1.ListOptions) {
	o.AllowWatchBookmarks = false
}

// longWatcher is a ListerWatcher whose watches are long (longWatch), and
// without bookmarks when quiet.
type longWatcher struct {
	cache.ListerWatcherWithContext
	quiet bool
}

func (l longWatcher) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	longWatch(&opts)
	if l.quiet {
		quietWatch(&opts)
	}
	return l.ListerWatcherWithContext.WatchWithContext(ctx, opts)
}

func (l longWatcher) List(opts metav1.ListOptions) (runtime.Object, error) {
	return l.ListWithContext(context.Background(), opts)
}

func (l longWatcher) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return l.WatchWithContext(context.Background(), opts)
}

// setSeed makes the first list answer objs at resourceVersion rv.
func (r *resumable) setSeed(rv string, objs []runtime.Object) {
	r.mu.Lock()
	r.seed = &seedList{ListMeta: metav1.ListMeta{ResourceVersion: rv}, Items: objs}
	r.mu.Unlock()
}

// seeded reports whether the first list is still to be answered by a seed.
func (r *resumable) seeded() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seed != nil
}

// seedList is a list answered from the snapshot: what the reflector needs
// of a list (its resourceVersion and items), nothing more.
type seedList struct {
	metav1.TypeMeta
	metav1.ListMeta
	Items []runtime.Object
}

func (l *seedList) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (l *seedList) DeepCopyObject() runtime.Object {
	c := *l
	c.Items = append([]runtime.Object(nil), l.Items...)
	return &c
}

// mark is an informer's resume point: the resourceVersion up to which the
// objects handed to its handler (and so the state) hold every event.
//
// After a list at resourceVersion L, the objects come in the order of
// their keys, not of their resourceVersions, so no object's tells how far
// the handler has got; L is the point once the handler has every listed
// object: the first list's end is known (the handler's registration has
// synced); a relist's is not (unchanged objects are not handed on), so
// its point is the first watch event after it. Between watch events the
// point is the highest resourceVersion handed on: a watch sends its
// events in resourceVersion order, and client-go's reflector itself
// resumes from the last one's. Until then there is no point, and a
// restart lists.
type mark struct {
	mu      sync.Mutex
	rv      string // the point; "" when none
	listRV  string // the last list's resourceVersion while its objects are handed on
	pending bool   // a list's objects are being handed on
	lists   int    // lists so far (the seed included)
	bad     bool   // a resourceVersion that is not a number: never resume
	synced  func() bool
}

func (m *mark) listed(rv string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lists++
	m.rv, m.listRV, m.pending = "", rv, true
	if !wellFormed(rv) {
		m.bad = true
	}
}

// handed records that an object at resourceVersion rv was handed on; ""
// (the snapshot's objects have none) tells nothing.
func (m *mark) handed(rv string) {
	if rv == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !wellFormed(rv) {
		m.bad = true
		return
	}
	if m.pending {
		if c, _ := resourceversion.CompareResourceVersion(rv, m.listRV); c <= 0 {
			return // one of the list's objects
		}
		m.pending, m.rv = false, rv // a watch event: the list is all handed on
		return
	}
	if c, _ := resourceversion.CompareResourceVersion(rv, m.rv); m.rv == "" || c > 0 {
		m.rv = rv
	}
}

// point returns the resume point, "" when there is none.
func (m *mark) point() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pending && m.lists == 1 && m.synced != nil && m.synced() {
		m.pending, m.rv = false, m.listRV
	}
	if m.bad || m.pending {
		return ""
	}
	return m.rv
}

func wellFormed(rv string) bool {
	_, err := resourceversion.CompareResourceVersion(rv, rv)
	return err == nil
}

// ResumePoints returns, for each informer that has one, its resume point
// by what it reads. Read them before the objects they are the points of
// (the state): objects handed on after the read are newer, which a
// resumed watch replays.
func (a *API) ResumePoints() map[string]string {
	out := map[string]string{}
	for _, r := range a.resumables {
		if rv := r.mark.point(); rv != "" {
			out[r.key()] = rv
		}
	}
	return out
}

// Resume makes each informer whose key has a point in points start from
// it, with the snapshot's objects that informer reads, instead of a list;
// the others list. Call it before Run.
func (a *API) Resume(points map[string]string, services []model.Service, slices []model.EndpointSlice) (resumed int) {
	objs := make(map[*resumable][]runtime.Object)
	for i := range services {
		s := &services[i]
		r := a.svcResumables[0]
		if len(a.svcResumables) > 1 && a.conv.ProxyName != "" && s.Labels[LabelServiceProxyName] == a.conv.ProxyName {
			r = a.svcResumables[1]
		}
		objs[r] = append(objs[r], &Converted{Meta: Meta{Namespace: s.Namespace, Name: s.Name}, Service: s})
	}
	for i := range slices {
		s := &slices[i]
		objs[a.epsResumable] = append(objs[a.epsResumable], &Converted{Meta: Meta{Namespace: s.Namespace, Name: s.Name}, Slice: s})
	}
	for _, r := range a.resumables {
		if rv, ok := points[r.key()]; ok && wellFormed(rv) {
			r.setSeed(rv, objs[r])
			resumed++
		}
	}
	return resumed
}

// GetObjectKind and DeepCopyObject make a Converted a runtime.Object, as
// the items of a list the reflector reads must be; a seed's objects are
// Converted already (the informers' transform passes them on as they are).
func (c *Converted) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies the Converted; its model values are never changed
// in place, so they are shared.
func (c *Converted) DeepCopyObject() runtime.Object {
	out := *c
	return &out
}

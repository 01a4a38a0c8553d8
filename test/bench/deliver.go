package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// Deliveries is the bench's own watch of the driver's EndpointSlices: when
// the API server handed each written version to a watcher. A proxy's
// watch waits for the same hand-over, so a flip's time splits into the
// control plane's share (write to delivery) and the proxy's (delivery to
// kernel-visible).
type Deliveries struct {
	w    watch.Interface
	done chan struct{}

	mu      sync.Mutex
	at      map[string]time.Time // resource version → delivered
	changed chan struct{}        // closed and replaced at each delivery
	err     error                // why the watch ended
}

// maxDeliveries bounds what Deliveries keeps: the flips of one S2 run.
const maxDeliveries = 10000

// WatchDeliveries starts watching the namespace's EndpointSlices from now
// on (from the collection's current version: no replay of what exists).
func (d *Driver) WatchDeliveries(ctx context.Context) (*Deliveries, error) {
	slices := d.client.DiscoveryV1().EndpointSlices(d.Namespace)
	l, err := slices.List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return nil, fmt.Errorf("bench: list endpointslices: %w", err)
	}
	w, err := slices.Watch(ctx, metav1.ListOptions{ResourceVersion: l.ResourceVersion})
	if err != nil {
		return nil, fmt.Errorf("bench: watch endpointslices: %w", err)
	}
	del := &Deliveries{w: w, done: make(chan struct{}), at: map[string]time.Time{}, changed: make(chan struct{})}
	go del.read()
	return del, nil
}

func (del *Deliveries) read() {
	defer close(del.done)
	for ev := range del.w.ResultChan() {
		now := time.Now()
		s, ok := ev.Object.(*discoveryv1.EndpointSlice)
		del.mu.Lock()
		switch {
		case ev.Type == watch.Error:
			del.err = fmt.Errorf("bench: endpointslice watch: %v", ev.Object)
		case ok && len(del.at) < maxDeliveries:
			del.at[s.ResourceVersion] = now
		}
		close(del.changed)
		del.changed = make(chan struct{})
		del.mu.Unlock()
	}
	del.mu.Lock()
	if del.err == nil {
		del.err = fmt.Errorf("bench: endpointslice watch closed")
	}
	close(del.changed)
	del.changed = make(chan struct{})
	del.mu.Unlock()
}

// Wait returns when version was delivered, waiting up to timeout for it.
func (del *Deliveries) Wait(ctx context.Context, version string, timeout time.Duration) (time.Time, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		del.mu.Lock()
		at, ok := del.at[version]
		err, ch := del.err, del.changed
		del.mu.Unlock()
		switch {
		case ok:
			return at, nil
		case err != nil:
			return time.Time{}, err
		}
		select {
		case <-ch:
		case <-t.C:
			return time.Time{}, fmt.Errorf("bench: endpointslice version %s not delivered in %s", version, timeout)
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
}

// Stop ends the watch.
func (del *Deliveries) Stop() {
	del.w.Stop()
	<-del.done
}

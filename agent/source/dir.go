package source

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/edgeproxy/edgeproxy/agent/model"
)

// Dir reads Services, EndpointSlices and Nodes from a directory of YAML or
// JSON manifests (several documents per file allowed) and watches it. It
// stands in for the API on stand-alone boxes and in the demo. Unlike the
// API server, nothing allocates addresses here: a Service must carry its
// clusterIP.
type Dir struct {
	path     string
	nodeName string
	conv     *Converter
	sink     Sink
	log      *slog.Logger
	report   *reporter

	services map[string]*model.Service
	slices   map[string]*model.EndpointSlice
	loaded   chan struct{}
}

// NewDir prepares a manifest source for path.
func NewDir(path, nodeName string, conv *Converter, sink Sink, log *slog.Logger, m *Metrics) (*Dir, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("source: manifests: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("source: manifests: %s is not a directory", path)
	}
	return &Dir{
		path: path, nodeName: nodeName, conv: conv, sink: sink, log: log,
		report: newReporter(log, m), loaded: make(chan struct{}),
	}, nil
}

// Run loads the directory, then reloads it whenever a file in it changes,
// until ctx is done.
func (d *Dir) Run(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("source: manifests: watch: %w", err)
	}
	defer w.Close()
	if err := w.Add(d.path); err != nil {
		return fmt.Errorf("source: manifests: watch %s: %w", d.path, err)
	}
	d.Load()
	close(d.loaded)

	// Editors write in bursts (temp file, rename, chmod): reload once the
	// directory has been quiet for a moment.
	const quiet = 200 * time.Millisecond
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if isManifest(ev.Name) {
				timer.Reset(quiet)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			d.log.Warn("manifest watch error", "dir", d.path, "error", err)
		case <-timer.C:
			d.Load()
		}
	}
}

// WaitForSync blocks until the first load is done or ctx ends.
func (d *Dir) WaitForSync(ctx context.Context) bool {
	select {
	case <-d.loaded:
		return true
	case <-ctx.Done():
		return false
	}
}

// Load reads every manifest and hands the differences since the last load to
// the sink. A file that cannot be read or a document that cannot be decoded
// is reported and skipped; the rest still load.
func (d *Dir) Load() {
	services := make(map[string]*model.Service)
	slicesByKey := make(map[string]*model.EndpointSlice)
	var node *model.Node

	entries, err := os.ReadDir(d.path)
	if err != nil {
		d.log.Warn("cannot read manifest directory; keeping what was loaded", "dir", d.path, "error", err)
		return
	}
	for _, e := range entries {
		if e.IsDir() || !isManifest(e.Name()) {
			continue
		}
		file := filepath.Join(d.path, e.Name())
		objs, errs := decodeFile(file)
		for _, err := range errs {
			d.report.problem("manifest", file, err)
		}
		for _, l := range objs {
			switch o := l.obj.(type) {
			case *v1.Service:
				key := keyOf(o)
				if m, err := d.conv.Service(o); err != nil {
					d.report.problem("Service", key, fmt.Errorf("%s: %w", l.where, err))
				} else {
					d.report.clear("Service", key)
					services[key] = m
				}
			case *discovery.EndpointSlice:
				key := keyOf(o)
				m, ws, err := d.conv.EndpointSlice(o)
				if err != nil {
					d.report.problem("EndpointSlice", key, fmt.Errorf("%s: %w", l.where, err))
					continue
				}
				d.report.warnings("EndpointSlice", key, ws)
				slicesByKey[key] = m
			case *v1.Node:
				if o.Name == d.nodeName {
					node = d.conv.Node(o)
				}
			default:
				d.report.problem("manifest", l.where, fmt.Errorf("%w: %s is not read", ErrSkip, l.obj.GetObjectKind().GroupVersionKind().Kind))
			}
		}
	}
	d.apply(services, slicesByKey, node)
}

func (d *Dir) apply(services map[string]*model.Service, sl map[string]*model.EndpointSlice, node *model.Node) {
	for k := range d.services {
		if _, ok := services[k]; !ok {
			d.sink.SetService(k, nil)
		}
	}
	for k, v := range services {
		d.sink.SetService(k, v)
	}
	for k := range d.slices {
		if _, ok := sl[k]; !ok {
			d.sink.SetSlice(k, nil)
		}
	}
	for k, v := range sl {
		d.sink.SetSlice(k, v)
	}
	if node == nil {
		// No Node manifest for us: a bare node with only its name, so
		// selection still knows which endpoints are local.
		node = &model.Node{Name: d.nodeName}
	}
	d.sink.SetNode(node)
	d.services, d.slices = services, sl
}

// located is a decoded object with where it came from, for error messages.
type located struct {
	obj   runtime.Object
	where string
}

func decodeFile(file string) ([]located, []error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, []error{err}
	}
	var out []located
	var errs []error
	r := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	deser := scheme.Codecs.UniversalDeserializer()
	for i := 1; ; i++ {
		var doc runtime.RawExtension
		if err := r.Decode(&doc); err != nil {
			if !errors.Is(err, io.EOF) {
				errs = append(errs, fmt.Errorf("%s: document %d: %w", file, i, err))
			}
			break
		}
		body := bytes.TrimSpace(doc.Raw)
		if len(body) == 0 || string(body) == "null" {
			continue
		}
		where := fmt.Sprintf("%s: document %d", file, i)
		obj, _, err := deser.Decode(doc.Raw, nil, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
			continue
		}
		out = append(out, located{obj: obj, where: where})
	}
	return out, errs
}

func isManifest(name string) bool {
	base := filepath.Base(name)
	if strings.HasPrefix(base, ".") {
		return false
	}
	return slices.Contains([]string{".yaml", ".yml", ".json"}, filepath.Ext(base))
}

package source

import (
	"bufio"
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

	"github.com/edgeproxy/edgeproxy/agent/config"
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

	// maxSize caps each file; 0: config.MaxFileSize.
	maxSize int64

	services map[string]*model.Service
	slices   map[string]*model.EndpointSlice
	loaded   chan struct{}
}

// SetMaxFileSize caps each manifest file (bytes); a bigger file is
// skipped and reported.
func (d *Dir) SetMaxFileSize(n int64) { d.maxSize = n }

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
// until ctx is done. The parent directory is watched too, so that a
// directory replaced under the same name (mv d d.old; mkdir d) is followed;
// a ConfigMap-style "..data" symlink swap inside it reloads as well.
func (d *Dir) Run(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("source: manifests: watch: %w", err)
	}
	defer w.Close()
	parent := filepath.Dir(filepath.Clean(d.path))
	if err := w.Add(parent); err != nil {
		return fmt.Errorf("source: manifests: watch %s: %w", parent, err)
	}
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
	base := filepath.Base(filepath.Clean(d.path))
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			switch {
			case filepath.Dir(ev.Name) == parent && filepath.Base(ev.Name) == base:
				// The directory itself was replaced, moved or removed:
				// watch whatever now has its name (the watch on the old
				// one goes with it).
				_ = w.Remove(d.path)
				if err := w.Add(d.path); err != nil {
					d.log.Warn("manifest directory gone; keeping what was loaded until it is back", "dir", d.path, "err", err)
				}
				timer.Reset(quiet)
			case filepath.Dir(ev.Name) == parent:
			case isManifest(ev.Name) || filepath.Base(ev.Name) == "..data":
				timer.Reset(quiet)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			d.log.Warn("manifest watch error", "dir", d.path, "err", err)
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
		d.log.Warn("cannot read manifest directory; keeping what was loaded", "dir", d.path, "err", err)
		return
	}
	d.report.begin()
	// Where each object came from, to report one defined twice: in two
	// files or twice in one, the same rule.
	from := map[string]string{}
	seen := func(kind, key, where string) {
		id := kind + " " + key
		if prev, dup := from[id]; dup {
			d.report.duplicate(kind, key, fmt.Errorf("defined again in %s (first in %s); the last one read is used", where, prev))
		}
		from[id] = where
	}
	maxSize := d.maxSize
	if maxSize <= 0 {
		maxSize = config.MaxFileSize
	}
	for _, e := range entries {
		if e.IsDir() || !isManifest(e.Name()) {
			continue
		}
		file := filepath.Join(d.path, e.Name())
		objs, errs := decodeFile(file, maxSize)
		for _, err := range errs {
			d.report.problem("manifest", file, err)
		}
		for _, l := range objs {
			switch o := l.obj.(type) {
			case *v1.Service:
				key := keyOf(o)
				seen("Service", key, l.where)
				if m, ws, err := d.conv.Service(o); err != nil {
					d.report.problem("Service", key, fmt.Errorf("%s: %w", l.where, err))
				} else {
					d.report.warnings("Service", key, ws)
					services[key] = m
				}
			case *discovery.EndpointSlice:
				key := keyOf(o)
				seen("EndpointSlice", key, l.where)
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
	d.report.end()
	d.apply(services, slicesByKey, node)
}

// Problems returns the manifests' problems standing after the last load:
// documents, Services and EndpointSlices skipped whole or in part, and
// objects defined twice.
func (d *Dir) Problems() []Problem { return d.report.problems() }

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

// decodeFile reads one manifest file: a regular file of at most maxSize
// bytes. YAML documents are split before they are parsed, so a syntax error
// in one is reported and the others are kept.
func decodeFile(file string, maxSize int64) ([]located, []error) {
	raw, err := config.ReadRegular(file, maxSize)
	if err != nil {
		return nil, []error{err}
	}
	return decodeDocs(file, raw)
}

func decodeDocs(file string, raw []byte) ([]located, []error) {
	var out []located
	var errs []error
	deser := scheme.Codecs.UniversalDeserializer()
	docs := [][]byte{raw}
	if trimmed := bytes.TrimSpace(raw); len(trimmed) == 0 || trimmed[0] != '{' {
		docs = docs[:0]
		yr := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
		for {
			doc, err := yr.Read()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					errs = append(errs, fmt.Errorf("%s: document %d: %w", file, len(docs)+1, err))
				}
				break
			}
			docs = append(docs, doc)
		}
	}
	n := 0
	for _, d := range docs {
		r := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(d), 4096)
		for {
			var doc runtime.RawExtension
			if err := r.Decode(&doc); err != nil {
				if !errors.Is(err, io.EOF) {
					n++
					errs = append(errs, fmt.Errorf("%s: document %d: %w", file, n, err))
				}
				break
			}
			n++
			body := bytes.TrimSpace(doc.Raw)
			if len(body) == 0 || string(body) == "null" {
				continue
			}
			where := fmt.Sprintf("%s: document %d", file, n)
			obj, _, err := deser.Decode(doc.Raw, nil, nil)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", where, err))
				continue
			}
			out = append(out, located{obj: obj, where: where})
		}
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

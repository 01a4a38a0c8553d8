// Package snapshot keeps the agent's last-known state on disk so that a node
// that reboots while the control plane is out of reach can program its
// services again from what it last saw.
//
// The file is one line of JSON, an envelope around the payload:
//
//	{"version":1,"sha256":"<hex of the payload bytes>","payload":{...}}
//
// Save writes it atomically (a temp file in the same directory, fsync,
// rename, fsync of the directory), so a crash leaves either the old file or
// the new one, never a mix. Load checks the version and the checksum and
// decodes the payload only when both hold; it never returns a partly valid
// snapshot. Its errors match ErrNotFound, ErrCorrupt or ErrIncompatible with
// errors.Is.
//
// Adding fields to the payload keeps Version; removing or changing the
// meaning of one must bump it, so that an older snapshot is refused rather
// than misread.
package snapshot

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/datapath"
)

// Version is the schema version this package writes and accepts.
const Version = 1

// FileName is the snapshot's name inside the state directory.
const FileName = "snapshot.json"

// Errors returned by Load, for errors.Is.
var (
	// ErrNotFound: there is no snapshot file (e.g. the first start).
	ErrNotFound = errors.New("snapshot not found")
	// ErrCorrupt: the file is truncated, damaged or fails its checksum.
	ErrCorrupt = errors.New("snapshot corrupt")
	// ErrIncompatible: the file was written with another schema version.
	ErrIncompatible = errors.New("snapshot incompatible")
)

// Snapshot is the state the agent last programmed successfully.
type Snapshot struct {
	// Written is when the snapshot was taken.
	Written time.Time `json:"written"`
	// Node is this node as last read.
	Node model.Node `json:"node"`
	// Services and Slices are the objects the plan was computed from.
	Services []model.Service       `json:"services"`
	Slices   []model.EndpointSlice `json:"slices"`
	// Modules maps a policy module's name to the sha256 (hex) of the Wasm
	// file that was loaded, so a restart can tell whether the modules it
	// finds are the ones the plan was computed with.
	Modules map[string]string `json:"modules,omitempty"`
	// Plan is what was programmed.
	Plan datapath.Plan `json:"plan"`
	// Resume maps what an API informer reads (its resource, selectors
	// and server) to the resourceVersion up to which Services and Slices
	// hold every event of it: where a restart resumes its watch instead
	// of listing (source.API.Resume). Empty for an informer without one.
	Resume map[string]string `json:"resume,omitempty"`
}

// Path returns the snapshot file's path in dir.
func Path(dir string) string { return filepath.Join(dir, FileName) }

// wrapWriter lets an internal test make the write of the temp file fail
// part-way; nil in production.
var wrapWriter func(io.Writer) io.Writer

// Save writes s to dir (creating dir with mode 0700 if needed) as
// dir/FileName with mode 0600, replacing any previous snapshot atomically.
// If Save fails, the previous snapshot is left as it was.
func Save(dir string, s *Snapshot) error {
	if s == nil {
		return errors.New("snapshot: save: nil snapshot")
	}
	if s.Written.IsZero() {
		return errors.New("snapshot: save: Written is not set")
	}
	// Load refuses an invalid plan; do not write one.
	if err := s.Plan.Validate(); err != nil {
		return fmt.Errorf("snapshot: save: %w", err)
	}
	// The payload is streamed into the file through its hash (encoder):
	// neither the payload nor its encoding is held whole. The envelope's
	// checksum, known only at the end, is written over a placeholder of
	// the same length.
	head := fmt.Appendf(nil, `{"version":%d,"sha256":"%s","payload":`, Version, strings.Repeat("0", 2*sha256.Size))

	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("snapshot: create state directory: %w", err)
	}
	f, err := os.CreateTemp(dir, "."+FileName+".*.tmp")
	if err != nil {
		return fmt.Errorf("snapshot: create temp file: %w", err)
	}
	tmp := f.Name()
	done := false
	defer func() {
		if !done {
			f.Close()
			os.Remove(tmp)
		}
	}()
	// CreateTemp already uses 0600; say so explicitly in case the umask or
	// the implementation ever differ.
	if err := f.Chmod(0o600); err != nil {
		return fmt.Errorf("snapshot: chmod %s: %w", tmp, err)
	}
	var w io.Writer = f
	if wrapWriter != nil {
		w = wrapWriter(f)
	}
	if _, err := w.Write(head); err != nil {
		return fmt.Errorf("snapshot: write %s: %w", tmp, err)
	}
	sum := sha256.New()
	e := &encoder{w: bufio.NewWriterSize(io.MultiWriter(w, sum), 64<<10)}
	e.snapshot(s)
	if e.err != nil {
		return fmt.Errorf("snapshot: encode: %w", e.err)
	}
	if err := e.w.Flush(); err != nil {
		return fmt.Errorf("snapshot: write %s: %w", tmp, err)
	}
	if _, err := w.Write([]byte("}\n")); err != nil {
		return fmt.Errorf("snapshot: write %s: %w", tmp, err)
	}
	head = fmt.Appendf(head[:0], `{"version":%d,"sha256":"%s","payload":`, Version, hex.EncodeToString(sum.Sum(nil)))
	if _, err := f.WriteAt(head, 0); err != nil {
		return fmt.Errorf("snapshot: write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("snapshot: fsync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("snapshot: close %s: %w", tmp, err)
	}
	path := Path(dir)
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("snapshot: rename %s to %s: %w", tmp, path, err)
	}
	done = true
	// The rename is durable only once the directory entry is on disk.
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("snapshot: open directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("snapshot: fsync directory %s: %w", dir, err)
	}
	return nil
}

// Load reads and verifies dir/FileName. It returns an error matching
// ErrNotFound when there is no file, ErrIncompatible when the file has
// another schema version, and ErrCorrupt when it is truncated, damaged,
// fails its checksum or holds an invalid plan. On error the snapshot is nil.
func Load(dir string) (*Snapshot, error) {
	path := Path(dir)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("snapshot: %s: %w: %w", path, ErrNotFound, err)
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot: read %s: %w", path, err)
	}
	s, err := decode(data)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %s: %w", path, err)
	}
	return s, nil
}

func decode(data []byte) (*Snapshot, error) {
	version, sum, payload, ok := split(data)
	if !ok {
		return nil, classify(data)
	}
	if version != Version {
		return nil, fmt.Errorf("%w: schema version %d, this agent reads %d", ErrIncompatible, version, Version)
	}
	want, err := hex.DecodeString(sum)
	if err != nil || len(want) != sha256.Size {
		return nil, fmt.Errorf("%w: bad checksum field %q", ErrCorrupt, sum)
	}
	got := sha256.Sum256(payload)
	if !bytes.Equal(got[:], want) {
		return nil, fmt.Errorf("%w: checksum mismatch (file says %s, payload hashes to %s)", ErrCorrupt, sum, hex.EncodeToString(got[:]))
	}
	s := new(Snapshot)
	if err := json.Unmarshal(payload, s); err != nil {
		return nil, fmt.Errorf("%w: payload: %w", ErrCorrupt, err)
	}
	if s.Written.IsZero() {
		return nil, fmt.Errorf("%w: no write time", ErrCorrupt)
	}
	if err := s.Plan.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return s, nil
}

// split takes apart the envelope exactly as Save lays it out, without
// parsing the payload: the checksum is checked before the payload is
// decoded, and the (large) payload is scanned by the JSON decoder only once.
func split(data []byte) (version int, sum string, payload []byte, ok bool) {
	rest, ok := bytes.CutPrefix(data, []byte(`{"version":`))
	if !ok {
		return 0, "", nil, false
	}
	i := 0
	for i < len(rest) && i < 9 && rest[i] >= '0' && rest[i] <= '9' {
		version = version*10 + int(rest[i]-'0')
		i++
	}
	if i == 0 {
		return 0, "", nil, false
	}
	if rest, ok = bytes.CutPrefix(rest[i:], []byte(`,"sha256":"`)); !ok {
		return 0, "", nil, false
	}
	end := bytes.IndexByte(rest, '"')
	if end < 0 {
		return 0, "", nil, false
	}
	sum = string(rest[:end])
	if rest, ok = bytes.CutPrefix(rest[end:], []byte(`","payload":`)); !ok {
		return 0, "", nil, false
	}
	rest = bytes.TrimSuffix(rest, []byte("\n"))
	if payload, ok = bytes.CutSuffix(rest, []byte("}")); !ok {
		return 0, "", nil, false
	}
	return version, sum, payload, true
}

// classify explains a file that is not laid out as Save writes it: another
// schema version if it says so, corrupt otherwise.
func classify(data []byte) error {
	var head struct {
		Version *int `json:"version"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if head.Version == nil {
		return fmt.Errorf("%w: no schema version", ErrCorrupt)
	}
	if *head.Version != Version {
		return fmt.Errorf("%w: schema version %d, this agent reads %d", ErrIncompatible, *head.Version, Version)
	}
	return fmt.Errorf("%w: unexpected envelope layout", ErrCorrupt)
}

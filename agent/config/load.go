// Package config loads, validates and hot-reloads the agent's configuration.
//
// A Config is built in layers, each overriding the one before:
//
//  1. Default(),
//  2. the YAML file (optional),
//  3. EDGEPROXY_-prefixed environment variables,
//  4. command-line flags.
//
// The result is validated in full: every bad key is reported, each as
// "config: <dotted.key>: <problem>" (see FieldError), and unknown keys in the
// file are errors, so a typo never passes silently. Watcher re-reads the
// file when it changes and swaps the new Config in atomically, or keeps the
// old one when the new file is bad.
//
// koanf merges the layers: the file through its YAML parser's library
// (yamlParser: integers only in decimal), env vars and flags through
// confmap. Env vars come from
// LoadOptions.Env rather than koanf's env provider, which reads the process
// environment itself; that keeps tests independent of it. The merged map is
// decoded by this package rather than mapstructure, so every error can name
// its key and value.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/v2"
	"go.yaml.in/yaml/v3"
)

// EnvPrefix starts every environment variable Load reads.
const EnvPrefix = "EDGEPROXY_"

// EnvConfig names the config file when LoadOptions.File is empty.
const EnvConfig = EnvPrefix + "CONFIG"

// flagConfig is the Flags key that names the config file.
const flagConfig = "config"

// LoadOptions says where Load finds each layer. The zero value loads
// Default() plus the hostname as nodeName.
type LoadOptions struct {
	// File is the YAML config file. Flags["config"], when set, wins over
	// it; when both are empty, EDGEPROXY_CONFIG from Env names the file,
	// and if that is empty too there is no file. A named file must exist.
	File string
	// Env holds "NAME=value" pairs, normally os.Environ(); nil means none
	// (tests stay independent of the process environment). Variables
	// starting with EDGEPROXY_ set the key they name with '.' written as
	// '_', matched ignoring case and '_': EDGEPROXY_SYNC_MINPERIOD=2s,
	// EDGEPROXY_NODENAME or EDGEPROXY_NODE_NAME, EDGEPROXY_MODE=plan. Lists
	// are comma-separated (EDGEPROXY_NODEPORTADDRESSES=10.0.0.0/8,fd00::/8).
	// policy.modules and policy.chains can only be set in the file. An
	// EDGEPROXY_ variable that names no key is logged at warn and ignored
	// (the environment is shared with other tools, e.g. test gates).
	Env []string
	// Flags maps keys to values given on the command line; they override
	// everything else. Keys match like env names, so "nodeName",
	// "node-name" and "sync.minPeriod" all work; an unknown key is an
	// error. Pass only the flags the user actually set. The key "config"
	// names the file (see File).
	Flags map[string]string
	// Hostname supplies nodeName when no layer sets it; nil: os.Hostname.
	// Like kube-proxy, the name is trimmed and lower-cased.
	Hostname func() (string, error)
	// Logger receives warnings; nil: slog.Default().
	Logger *slog.Logger
	// RefuseEmpty refuses an empty (or all-blank) file instead of reading
	// it as "all defaults": on a reload it is usually an editor's
	// half-written save.
	RefuseEmpty bool
}

// Path returns the config file Load will read, or "" for none.
func (o LoadOptions) Path() string {
	if p := o.Flags[flagConfig]; p != "" {
		return p
	}
	if o.File != "" {
		return o.File
	}
	for _, kv := range o.Env {
		if v, ok := strings.CutPrefix(kv, EnvConfig+"="); ok {
			return v
		}
	}
	return ""
}

// Load builds the Config from the layers described in the package comment
// and validates it. When nodeName is still empty after every layer, it is
// set to the hostname (lower case). chain.failure left empty becomes
// keep-builtin. The error joins one FieldError per problem; a file that
// cannot be read or parsed gives an error naming the file (and for YAML
// syntax errors, the line).
func Load(opts LoadOptions) (*Config, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	k := koanf.New(".")
	if path := opts.Path(); path != "" {
		b, err := ReadRegular(path, MaxFileSize)
		if err == nil && opts.RefuseEmpty && len(bytes.TrimSpace(b)) == 0 {
			err = ErrEmpty
		}
		if err != nil {
			return nil, fmt.Errorf("config: %s: %w", path, err)
		}
		if err := k.Load(bytesProvider(b), yamlParser{}); err != nil {
			return nil, fmt.Errorf("config: %s: %w", path, err)
		}
	}

	if err := k.Load(confmap.Provider(envLayer(opts.Env, log), "."), nil); err != nil {
		return nil, fmt.Errorf("config: environment: %w", err)
	}
	flags, errs := flagLayer(opts.Flags)
	if err := k.Load(confmap.Provider(flags, "."), nil); err != nil {
		return nil, fmt.Errorf("config: flags: %w", err)
	}

	cfg := Default()
	var d decoder
	d.decodeValue("", reflectValue(&cfg), k.Raw())
	errs = append(errs, d.errs...)

	// kube-proxy's rule for the node name: trimmed and lower-cased, from
	// whichever layer it came.
	cfg.NodeName = strings.ToLower(strings.TrimSpace(cfg.NodeName))
	if cfg.NodeName == "" {
		hostname := opts.Hostname
		if hostname == nil {
			hostname = os.Hostname
		}
		h, err := hostname()
		if err != nil {
			errs = append(errs, fmt.Errorf("config: nodeName: empty, and the hostname is unknown: %w", err))
		}
		cfg.NodeName = strings.ToLower(strings.TrimSpace(h))
	}
	for i := range cfg.Policy.Chains {
		if cfg.Policy.Chains[i].Failure == "" {
			cfg.Policy.Chains[i].Failure = FailureKeepBuiltin
		}
	}

	errs = append(errs, validateDecoded(&cfg, errs)...)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &cfg, nil
}

// envLayer maps the EDGEPROXY_* variables of env to config keys, warning
// once about each variable that names no key.
func envLayer(env []string, log *slog.Logger) map[string]any {
	layer := map[string]any{}
	for _, kv := range env {
		name, val, _ := strings.Cut(kv, "=")
		rest, ok := strings.CutPrefix(name, EnvPrefix)
		if !ok || name == EnvConfig {
			continue
		}
		l, ok := schema.byNorm[normKey(rest)]
		if !ok {
			log.Warn("config: ignoring environment variable that names no config key", "name", name)
			continue
		}
		layer[l.key] = val
	}
	return layer
}

// flagLayer maps command-line flags to config keys; a flag that names no
// key is an error.
func flagLayer(flags map[string]string) (map[string]any, []error) {
	var errs []error
	layer := map[string]any{}
	for name, val := range flags {
		if name == flagConfig {
			continue
		}
		l, ok := schema.byNorm[normKey(name)]
		if !ok {
			errs = append(errs, fieldErr(name, "unknown key (given as a flag)"))
			continue
		}
		layer[l.key] = val
	}
	return layer, errs
}

// validateDecoded validates cfg but says nothing more about a key that
// did not decode (named in decodeErrs): its default may not fit the
// file's other values.
func validateDecoded(cfg *Config, decodeErrs []error) []error {
	bad := map[string]bool{}
	for _, e := range decodeErrs {
		if fe, ok := e.(*FieldError); ok {
			bad[fe.Key] = true
		}
	}
	err := cfg.Validate()
	if err == nil {
		return nil
	}
	var errs []error
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		if fe, ok := e.(*FieldError); !ok || !bad[fe.Key] {
			errs = append(errs, e)
		}
	}
	return errs
}

// yamlParser is koanf's YAML parser (the same go.yaml.in/yaml/v3) with one
// difference: an integer of a key of the schema (memory.limit,
// iptables.masqueradeBit, …) not written in plain decimal stays the string
// it was written as. YAML reads 0x10 as 16, 0o10 as 8, 0b10 as 2 and 1_000
// as 1000, and yaml.v3 reads 010 as 8; a kube-proxy-style config means
// decimal, so the key's decoder refuses 0x, 0o, 0b and separators, saying
// how to write the number, and reads 010 as ten (as YAML 1.2 does). What
// the schema does not type (a module's config, match labels) is left as
// YAML reads it.
type yamlParser struct{}

func (yamlParser) Unmarshal(b []byte) (map[string]any, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	if doc.Kind == 0 { // empty, or only comments
		return nil, nil
	}
	for _, n := range doc.Content {
		plainDecimal(n, "")
	}
	var out map[string]any
	if err := doc.Decode(&out); err != nil {
		return nil, err
	}
	return out, nil
}

func (yamlParser) Marshal(m map[string]any) ([]byte, error) { return yaml.Marshal(m) }

// plainDecimal retags as strings the untagged integers at schema keys of n
// (at path, dotted) that are not isDecimal, for the keys' decoders, which
// read numbers in base 10 only.
func plainDecimal(n *yaml.Node, path string) {
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Tag == "!!int" && n.Style == 0 && !isDecimal(n.Value) && isLeaf(path) {
			n.Tag = "!!str"
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := n.Content[i].Value
			if path != "" {
				key = path + "." + key
			}
			plainDecimal(n.Content[i+1], key)
		}
	case yaml.SequenceNode:
		for _, c := range n.Content {
			plainDecimal(c, path)
		}
	}
}

func isLeaf(key string) bool {
	return slices.ContainsFunc(schema.leaves, func(l leaf) bool { return l.key == key })
}

// isDecimal reports whether s is decimal digits, with an optional sign
// and no leading zero: what every YAML reader reads alike.
func isDecimal(s string) bool {
	s = strings.TrimLeft(s, "+-")
	return s != "" && strings.Trim(s, "0123456789") == "" && (s == "0" || s[0] != '0')
}

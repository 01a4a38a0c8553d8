package source

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// AnnotationOfflineProbe chooses how a Service's endpoints are probed
// while the API server is away (see the agent's probing): "false" never
// (they are never left out), "true" or absent the default (TCP service
// ports, at the target port), "PORT", "PORT/tcp" or "PORT/udp" that port
// and protocol on each endpoint's address instead. It is kept whatever
// serviceKeyPrefix is, and checked when the Service is read: a value that
// does not parse is left out of the model (the default applies), logged
// once, counted and shown in status and explain.
const AnnotationOfflineProbe = "edgeproxy.io/offline-probe"

// OfflineProbe is a parsed AnnotationOfflineProbe.
type OfflineProbe struct {
	Off  bool
	Port uint16 // 0: each endpoint's own (target) port, TCP ports only
	UDP  bool
}

// ParseOfflineProbe parses an AnnotationOfflineProbe value. Its error
// quotes at most the first 64 bytes of v.
func ParseOfflineProbe(v string) (OfflineProbe, error) {
	t := strings.ToLower(strings.TrimSpace(v))
	switch t {
	case "", "true":
		return OfflineProbe{}, nil
	case "false":
		return OfflineProbe{Off: true}, nil
	}
	num, proto, _ := strings.Cut(t, "/")
	n, err := strconv.ParseUint(num, 10, 16)
	if err != nil || n == 0 || (proto != "" && proto != "tcp" && proto != "udp") {
		return OfflineProbe{}, fmt.Errorf("%s: %s is none of true, false, PORT, PORT/tcp, PORT/udp", AnnotationOfflineProbe, QuoteShort(v))
	}
	return OfflineProbe{Port: uint16(n), UDP: proto == "udp"}, nil
}

// maxQuoted is how much of a value QuoteShort quotes.
const maxQuoted = 64

// QuoteShort quotes v for a log line or a message: whole up to 64 bytes,
// else its first 64 bytes (cut at a character) and its length, so that a
// value of any size makes a short line.
func QuoteShort(v string) string {
	if len(v) <= maxQuoted {
		return strconv.Quote(v)
	}
	cut := maxQuoted
	for cut > 0 && !utf8.RuneStart(v[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(v[:cut]), len(v))
}

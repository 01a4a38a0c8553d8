package main

import (
	"fmt"
	"strings"
	"time"
)

// manPage renders `edgeproxy help` as a section 1 man page. The first line
// of the help is "edgeproxy — SUMMARY"; the rest goes in verbatim, so the
// page always says what the binary says.
func manPage(help, version string, date time.Time) string {
	first, rest, _ := strings.Cut(help, "\n")
	_, summary, ok := strings.Cut(first, "—")
	if !ok {
		summary = first
	}
	var b strings.Builder
	fmt.Fprintf(&b, ".TH EDGEPROXY 1 %q %q \"User Commands\"\n", date.Format(time.DateOnly), "edgeproxy "+version)
	fmt.Fprintf(&b, ".SH NAME\nedgeproxy \\- %s\n", roff(strings.TrimSpace(summary)))
	b.WriteString(".SH SYNOPSIS\n.nf\n")
	for line := range strings.Lines(strings.TrimLeft(rest, "\n")) {
		b.WriteString(roffLine(strings.TrimRight(line, "\n")) + "\n")
	}
	b.WriteString(".fi\n")
	b.WriteString(`.SH DESCRIPTION
edgeproxy replaces kube\-proxy on a Kubernetes node. It watches Services,
EndpointSlices and its Node, selects endpoints as kube\-proxy does, lets
WebAssembly policy modules weigh them, and programs iptables or IPVS.
Settings come from the config file, overridden by EDGEPROXY_<KEY>
environment variables and by the flags above.
.SH FILES
.TP
.I /etc/edgeproxy/config.yaml
the config file; every key is described in it
.TP
.I /var/lib/edgeproxy
state: the snapshot served while the API server is away
.TP
.I /usr/lib/edgeproxy/modules
example policy modules
.TP
.I /usr/share/edgeproxy
RBAC manifest and kubeconfig template for a node's credentials
.SH SEE ALSO
.BR systemctl (1),
.BR iptables (8),
.BR ipvsadm (8)
`)
	return b.String()
}

// roff escapes text for roff: backslashes, hyphens and dashes.
func roff(s string) string {
	return strings.NewReplacer(`\`, `\e`, "-", `\-`, "—", `\(em`, "'", `\(aq`).Replace(s)
}

// roffLine escapes a line of text, which must also not start with a
// control character.
func roffLine(s string) string {
	s = roff(s)
	if strings.HasPrefix(s, ".") {
		s = `\&` + s
	}
	return s
}

package source

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"
	"unique"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/edgeproxy/edgeproxy/agent/model"
)

// Well-known labels and annotations the proxy reads.
const (
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	// LabelHeadless on an EndpointSlice hides it from proxies, as
	// kube-proxy's slice informer selects !service.kubernetes.io/headless
	// (the EndpointSlice controller sets it on headless Services' slices).
	LabelHeadless          = v1.IsHeadlessService
	LabelServiceName       = discovery.LabelServiceName // kubernetes.io/service-name
	LabelZone              = v1.LabelTopologyZone
	LabelRegion            = v1.LabelTopologyRegion
	AnnotationTopologyMode = "service.kubernetes.io/topology-mode"
	// AnnotationTopologyHints is the older spelling of AnnotationTopologyMode.
	AnnotationTopologyHints = "service.kubernetes.io/topology-aware-hints"
	AnnotationTriggerTime   = v1.EndpointsLastChangeTriggerTime
)

// ErrSkip marks an object that is valid but not for this proxy (headless,
// ExternalName, another proxy's). It is not counted as bad.
var ErrSkip = errors.New("not proxied")

// Converter turns API objects into model values. Its fields decide what is
// kept: the proxy name, and which label and annotation keys survive.
type Converter struct {
	// ProxyName: Services labelled service-proxy-name with another value are
	// skipped; an empty ProxyName skips every labelled Service, as
	// kube-proxy does.
	ProxyName string
	// KeepPrefix: annotations under this prefix are kept for policy modules.
	KeepPrefix string
}

// Service converts a Service. It returns an error wrapping ErrSkip for a
// Service the proxy must ignore, and a plain error naming the field for one
// it cannot use. The warnings name the parts of a Service it uses that
// were left out (an AnnotationOfflineProbe that does not parse).
func (c *Converter) Service(s *v1.Service) (*model.Service, []string, error) {
	if name, ok := s.Labels[LabelServiceProxyName]; ok && name != c.ProxyName {
		return nil, nil, fmt.Errorf("%w: labelled %s=%q", ErrSkip, LabelServiceProxyName, name)
	}
	if s.Spec.Type == v1.ServiceTypeExternalName {
		return nil, nil, fmt.Errorf("%w: type ExternalName", ErrSkip)
	}
	if s.Spec.ClusterIP == v1.ClusterIPNone {
		return nil, nil, fmt.Errorf("%w: headless", ErrSkip)
	}
	out := &model.Service{
		Namespace:           shared(s.Namespace),
		Name:                kept(s.Name),
		Created:             s.CreationTimestamp.Time,
		InternalLocal:       s.Spec.InternalTrafficPolicy != nil && *s.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal,
		HealthCheckNodePort: uint16(s.Spec.HealthCheckNodePort),
		Labels:              keptLabels(s.Labels),
		Annotations:         c.keptAnnotations(s.Annotations),
	}
	if s.Spec.TrafficDistribution != nil {
		out.TrafficDistribution = model.TrafficDistribution(shared(*s.Spec.TrafficDistribution))
	}
	if err := serviceAddrs(s, out); err != nil {
		return nil, nil, err
	}
	external := s.Spec.Type == v1.ServiceTypeNodePort || s.Spec.Type == v1.ServiceTypeLoadBalancer || len(s.Spec.ExternalIPs) > 0
	out.ExternalLocal = external && s.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
	if s.Spec.SessionAffinity == v1.ServiceAffinityClientIP {
		timeout := int32(v1.DefaultClientIPServiceAffinitySeconds)
		if cfg := s.Spec.SessionAffinityConfig; cfg != nil && cfg.ClientIP != nil && cfg.ClientIP.TimeoutSeconds != nil {
			timeout = *cfg.ClientIP.TimeoutSeconds
		}
		out.Affinity = time.Duration(timeout) * time.Second
	}
	ports, err := servicePorts(s.Spec.Ports)
	if err != nil {
		return nil, nil, err
	}
	out.Ports = ports
	var warnings []string
	if v, ok := out.Annotations[AnnotationOfflineProbe]; ok {
		if _, err := ParseOfflineProbe(v); err != nil {
			// out.Annotations is this Service's own copy.
			delete(out.Annotations, AnnotationOfflineProbe)
			warnings = append(warnings, fmt.Sprintf("metadata.annotations[%s]: %v; ignored, the default probe applies", AnnotationOfflineProbe, err))
		}
	}
	return out, warnings, nil
}

// serviceAddrs fills out's ClusterIPs, ExternalIPs, LoadBalancerIPs and
// SourceRanges from s, refusing an address a Service cannot use.
func serviceAddrs(s *v1.Service, out *model.Service) error {
	var err error
	ips := s.Spec.ClusterIPs
	if len(ips) == 0 && s.Spec.ClusterIP != "" {
		ips = []string{s.Spec.ClusterIP}
	}
	if len(ips) == 0 {
		return errors.New("spec.clusterIP: no address allocated (manifests must set it)")
	}
	if out.ClusterIPs, err = parseAddrs("spec.clusterIPs", ips); err != nil {
		return err
	}
	if out.ExternalIPs, err = parseAddrs("spec.externalIPs", s.Spec.ExternalIPs); err != nil {
		return err
	}
	for i, a := range out.ClusterIPs {
		if why := unusableVIP(a); why != "" {
			return fmt.Errorf("spec.clusterIPs[%d]: %s %s", i, a, why)
		}
	}
	for i, a := range out.ExternalIPs {
		if why := unusableVIP(a); why != "" {
			return fmt.Errorf("spec.externalIPs[%d]: %s %s", i, a, why)
		}
	}
	for i, ing := range s.Status.LoadBalancer.Ingress {
		if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode == v1.LoadBalancerIPModeProxy) {
			continue
		}
		a, err := netip.ParseAddr(ing.IP)
		if err != nil {
			return fmt.Errorf("status.loadBalancer.ingress[%d].ip: %q is not an IP address", i, ing.IP)
		}
		if why := unusableVIP(a.Unmap()); why != "" {
			return fmt.Errorf("status.loadBalancer.ingress[%d].ip: %s %s", i, a, why)
		}
		out.LoadBalancerIPs = append(out.LoadBalancerIPs, a.Unmap())
	}
	for i, r := range s.Spec.LoadBalancerSourceRanges {
		p, err := netip.ParsePrefix(strings.TrimSpace(r))
		if err != nil {
			return fmt.Errorf("spec.loadBalancerSourceRanges[%d]: %q is not a CIDR", i, r)
		}
		out.SourceRanges = append(out.SourceRanges, p.Masked())
	}
	return nil
}

// servicePorts converts spec.ports (protocol TCP when unset).
func servicePorts(ports []v1.ServicePort) ([]model.ServicePort, error) {
	var out []model.ServicePort
	for i, p := range ports {
		proto := string(p.Protocol)
		if proto == "" {
			proto = string(v1.ProtocolTCP)
		}
		if err := checkProtocol(proto); err != nil {
			return nil, fmt.Errorf("spec.ports[%d].protocol: %w", i, err)
		}
		if p.Port < 1 || p.Port > 65535 {
			return nil, fmt.Errorf("spec.ports[%d].port: %d is out of range", i, p.Port)
		}
		if p.NodePort < 0 || p.NodePort > 65535 {
			return nil, fmt.Errorf("spec.ports[%d].nodePort: %d is out of range", i, p.NodePort)
		}
		out = append(out, model.ServicePort{
			Name: shared(p.Name), Protocol: shared(proto), Port: uint16(p.Port), NodePort: uint16(p.NodePort),
		})
	}
	return out, nil
}

// EndpointSlice converts a discovery/v1 EndpointSlice. Endpoints whose
// address does not parse and ports without a number are dropped and
// reported in the returned warnings; a slice the proxy cannot use at all
// (FQDN, no service-name label) is an error.
func (c *Converter) EndpointSlice(s *discovery.EndpointSlice) (*model.EndpointSlice, []string, error) {
	if _, ok := s.Labels[LabelHeadless]; ok {
		return nil, nil, fmt.Errorf("%w: labelled %s", ErrSkip, LabelHeadless)
	}
	svc := s.Labels[LabelServiceName]
	if svc == "" {
		return nil, nil, fmt.Errorf("metadata.labels: no %s label", LabelServiceName)
	}
	out := &model.EndpointSlice{Namespace: shared(s.Namespace), Name: kept(s.Name), Service: kept(svc)}
	switch s.AddressType {
	case discovery.AddressTypeIPv4:
		out.Family = model.IPv4
	case discovery.AddressTypeIPv6:
		out.Family = model.IPv6
	default:
		return nil, nil, fmt.Errorf("addressType: %q is not supported (only IPv4 and IPv6)", s.AddressType)
	}
	if t, ok := s.Annotations[AnnotationTriggerTime]; ok {
		if tt, err := time.Parse(time.RFC3339Nano, t); err == nil {
			out.TriggerTime = tt
		}
	}
	var warnings []string
	if len(s.Endpoints) > 0 {
		// Kept as long as the slice is: sized once, not grown by append.
		out.Endpoints = make([]model.Endpoint, 0, len(s.Endpoints))
	}
	for i, p := range s.Ports {
		if p.Port == nil {
			warnings = append(warnings, fmt.Sprintf("ports[%d]: no port number", i))
			continue
		}
		if *p.Port < 1 || *p.Port > 65535 {
			warnings = append(warnings, fmt.Sprintf("ports[%d].port: %d is out of range", i, *p.Port))
			continue
		}
		ep := model.EndpointPort{Protocol: string(v1.ProtocolTCP), Port: uint16(*p.Port)}
		if p.Name != nil {
			ep.Name = shared(*p.Name)
		}
		if p.Protocol != nil {
			ep.Protocol = shared(string(*p.Protocol))
		}
		out.Ports = append(out.Ports, ep)
	}
	for i, e := range s.Endpoints {
		if len(e.Addresses) == 0 {
			warnings = append(warnings, fmt.Sprintf("endpoints[%d]: no address", i))
			continue
		}
		// Like kube-proxy, only the first address is used: the API allows
		// more, but every producer writes exactly one.
		a, err := netip.ParseAddr(e.Addresses[0])
		if err != nil {
			warnings = append(warnings, fmt.Sprintf("endpoints[%d].addresses[0]: %q is not an IP address", i, e.Addresses[0]))
			continue
		}
		a = a.Unmap()
		if why := unusableEndpoint(a); why != "" {
			warnings = append(warnings, fmt.Sprintf("endpoints[%d].addresses[0]: %s %s", i, a, why))
			continue
		}
		if (out.Family == model.IPv4) != a.Is4() {
			warnings = append(warnings, fmt.Sprintf("endpoints[%d].addresses[0]: %s is not of addressType %s", i, a, s.AddressType))
			continue
		}
		out.Endpoints = append(out.Endpoints, endpointOf(a, &e))
	}
	if len(out.Endpoints) == 0 {
		out.Endpoints = nil // as without the sizing: compared with DeepEqual
	}
	return out, warnings, nil
}

// endpointOf converts one endpoint, whose address a has been checked.
func endpointOf(a netip.Addr, e *discovery.Endpoint) model.Endpoint {
	me := model.Endpoint{Addr: a}
	// Conditions as kube-proxy reads them: a missing ready means ready,
	// a missing serving means "same as ready", terminating defaults false.
	me.Ready = e.Conditions.Ready == nil || *e.Conditions.Ready
	me.Serving = me.Ready
	if e.Conditions.Serving != nil {
		me.Serving = *e.Conditions.Serving
	}
	me.Terminating = e.Conditions.Terminating != nil && *e.Conditions.Terminating
	// Node and zone names repeat across every endpoint of the cluster:
	// each is kept once (the decoder allocates one string per field).
	if e.NodeName != nil {
		me.NodeName = unique.Make(*e.NodeName).Value()
	}
	if e.Zone != nil {
		me.Zone = unique.Make(*e.Zone).Value()
	}
	if e.Hints != nil && len(e.Hints.ForZones)+len(e.Hints.ForNodes) > 0 {
		h := &model.Hints{}
		for _, z := range e.Hints.ForZones {
			h.Zones = append(h.Zones, unique.Make(z.Name).Value())
		}
		for _, n := range e.Hints.ForNodes {
			h.Nodes = append(h.Nodes, unique.Make(n.Name).Value())
		}
		me.Hints = h
	}
	return me
}

// TaintToBeDeleted marks a node the cluster autoscaler is removing.
const TaintToBeDeleted = "ToBeDeletedByClusterAutoscaler"

// Node converts this node.
func (c *Converter) Node(n *v1.Node) *model.Node {
	out := &model.Node{
		Name:   n.Name,
		Zone:   n.Labels[LabelZone],
		Region: n.Labels[LabelRegion],
		Labels: n.Labels,
	}
	out.Ineligible = n.DeletionTimestamp != nil
	for _, t := range n.Spec.Taints {
		out.Ineligible = out.Ineligible || t.Key == TaintToBeDeleted
	}
	// spec.podCIDRs (its first is spec.podCIDR, which an older writer
	// may have set alone).
	podCIDRs := n.Spec.PodCIDRs
	if len(podCIDRs) == 0 && n.Spec.PodCIDR != "" {
		podCIDRs = []string{n.Spec.PodCIDR}
	}
	for _, c := range podCIDRs {
		if p, err := netip.ParsePrefix(c); err == nil {
			out.PodCIDRs = append(out.PodCIDRs, p.Masked())
		}
	}
	// InternalIPs first: the first address of a family is the node's
	// primary one (nodePortAddresses: primary).
	for _, typ := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, a := range n.Status.Addresses {
			if a.Type != typ {
				continue
			}
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				out.Addresses = append(out.Addresses, ip.Unmap())
			}
		}
	}
	return out
}

func (c *Converter) keptAnnotations(in map[string]string) map[string]string {
	var out map[string]string
	for k, v := range in {
		if keepAnnotation(k, c.KeepPrefix) {
			if out == nil {
				out = make(map[string]string)
			}
			out[shared(k)] = kept(v)
		}
	}
	return out
}

// keptLabels copies a Service's labels (see kept).
func keptLabels(in map[string]string) map[string]string {
	if in == nil {
		return nil
	}
	out := make(map[string]string, len(in))
	for k, v := range in {
		out[shared(k)] = kept(v)
	}
	return out
}

// kept copies a string of a decoded API object that a model value keeps,
// and shared interns one that repeats across objects (namespaces, port
// names, protocols, label keys). The decoder's strings sit among the
// object's other small allocations, which are garbage once it is
// converted, and one kept string holds its whole span (a page of small
// objects) in use; interned, a namespace or "TCP" is held once.
func kept(s string) string { return strings.Clone(s) }

func shared(s string) string { return unique.Make(s).Value() }

// keepAnnotation lists the annotations anything after the source reads:
// topology mode, the trigger time, the offline probe, and the policy
// prefix.
func keepAnnotation(key, prefix string) bool {
	switch key {
	case AnnotationTopologyMode, AnnotationTopologyHints, AnnotationTriggerTime, AnnotationOfflineProbe:
		return true
	}
	return prefix != "" && strings.HasPrefix(key, prefix)
}

func parseAddrs(field string, in []string) ([]netip.Addr, error) {
	var out []netip.Addr
	for i, s := range in {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %q is not an IP address", field, i, s)
		}
		out = append(out, a.Unmap())
	}
	return out, nil
}

// unusableVIP says why a is no address to serve a Service on, or "".
func unusableVIP(a netip.Addr) string {
	if a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return "is the broadcast address"
	}
	return unusableEndpoint(a)
}

// unusableEndpoint says why a is no address to send Service traffic to, or
// "" (the API server's endpoint validation refuses the same).
func unusableEndpoint(a netip.Addr) string {
	switch {
	case a.Zone() != "":
		return "has a zone"
	case a.IsUnspecified():
		return "is the unspecified address"
	case a.IsLoopback():
		return "is a loopback address"
	case a.IsMulticast():
		return "is a multicast address"
	}
	return ""
}

func checkProtocol(p string) error {
	switch p {
	case "TCP", "UDP", "SCTP":
		return nil
	}
	return fmt.Errorf("%q is not TCP, UDP or SCTP", p)
}

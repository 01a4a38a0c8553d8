package config

import "time"

// Config is the agent's whole configuration. Field tags are the YAML/koanf
// keys users write; keep them stable (see ARCHITECTURE.md, "Stable
// contracts"), add new ones freely.
type Config struct {
	NodeName   string `koanf:"nodeName"`
	Kubeconfig string `koanf:"kubeconfig"`
	Manifests  string `koanf:"manifests"`
	Mode       Mode   `koanf:"mode"` // iptables | ipvs | plan
	// ProxyName is matched against the service.kubernetes.io/service-proxy-name
	// label: Services carrying the label are skipped unless it names us.
	// Empty (the default) skips every labelled Service, as kube-proxy
	// does; a name costs a fourth watch (of the Services labelled with it).
	ProxyName   string `koanf:"proxyName"`
	ClusterCIDR string `koanf:"clusterCIDR"`
	// DetectLocalMode is how traffic from pods is told from other traffic
	// (kube-proxy's --detect-local-mode): one of DetectLocalModes.
	DetectLocalMode   string      `koanf:"detectLocalMode"`
	DetectLocal       DetectLocal `koanf:"detectLocal"`
	MasqueradeAll     bool        `koanf:"masqueradeAll"`
	NodePortAddresses []string    `koanf:"nodePortAddresses"` // CIDRs, and NodePortPrimary
	// ExternalIPs enables programming spec.externalIPs (upstream deprecated
	// them; off by default).
	ExternalIPs bool `koanf:"externalIPs"`
	// KeepKubeProxy keeps the rules kube-proxy left on the node (to
	// inspect them) instead of removing them after the first sync.
	KeepKubeProxy bool `koanf:"keepKubeProxy"`

	Sync     Sync     `koanf:"sync"`
	IPTables IPTables `koanf:"iptables"`
	IPVS     IPVS     `koanf:"ipvs"`
	Policy   Policy   `koanf:"policy"`
	StateDir string   `koanf:"stateDir"`
	Offline  Offline  `koanf:"offline"`
	Health   Health   `koanf:"health"`
	Server   Server   `koanf:"server"`
	Log      Log      `koanf:"log"`
	Memory   Memory   `koanf:"memory"`
	// Labels lists the node labels, and ServiceKeyPrefix the service label
	// and annotation prefix, that are kept and handed to policy modules.
	NodeLabels       []string `koanf:"nodeLabels"`
	ServiceKeyPrefix string   `koanf:"serviceKeyPrefix"`

	// Conntrack sets the netfilter conntrack parameters kube-proxy sets.
	Conntrack Conntrack `koanf:"conntrack"`
	// MaxManifestSize caps each file of the manifest directory; a bigger
	// one is skipped and reported.
	MaxManifestSize Size `koanf:"maxManifestSize"`
}

// DetectLocal holds what the interface modes of DetectLocalMode match
// (kube-proxy's --pod-bridge-interface and --pod-interface-name-prefix).
type DetectLocal struct {
	BridgeInterface     string `koanf:"bridgeInterface"`
	InterfaceNamePrefix string `koanf:"interfaceNamePrefix"`
}

// The values of detectLocalMode, kube-proxy's spellings.
const (
	LocalModeClusterCIDR         = "ClusterCIDR"         // the source is in clusterCIDR
	LocalModeNodeCIDR            = "NodeCIDR"            // the source is in the Node's spec.podCIDRs
	LocalModeBridgeInterface     = "BridgeInterface"     // it arrives on detectLocal.bridgeInterface
	LocalModeInterfaceNamePrefix = "InterfaceNamePrefix" // it arrives on an interface named detectLocal.interfaceNamePrefix*
)

// Sync sets the sync runner's timing.
type Sync struct {
	MinPeriod time.Duration `koanf:"minPeriod"` // at most one sync per MinPeriod
	Period    time.Duration `koanf:"period"`    // a full resync at least this often
	// HealthTimeout: /healthz fails when a queued change has waited longer.
	HealthTimeout time.Duration `koanf:"healthTimeout"`
}

// IPTables configures the iptables datapath (and the iptables part of IPVS mode).
type IPTables struct {
	MasqueradeBit      int  `koanf:"masqueradeBit"` // 0..31
	LocalhostNodePorts bool `koanf:"localhostNodePorts"`
	// LockWait bounds the wait on the xtables lock.
	LockWait time.Duration `koanf:"lockWait"`
}

// IPVS configures the IPVS datapath.
type IPVS struct {
	Scheduler      string        `koanf:"scheduler"`
	SchedulerFlags []string      `koanf:"schedulerFlags"`
	Interface      string        `koanf:"interface"`
	StrictARP      bool          `koanf:"strictARP"`
	GracePeriod    time.Duration `koanf:"gracePeriod"`
	TCPTimeout     time.Duration `koanf:"tcpTimeout"`
	TCPFinTimeout  time.Duration `koanf:"tcpFinTimeout"`
	UDPTimeout     time.Duration `koanf:"udpTimeout"`
}

// Conntrack holds the kernel's connection-tracking parameters, as
// kube-proxy's conntrack configuration; 0 leaves the kernel's value.
type Conntrack struct {
	// MaxPerCore times the CPUs, but at least Min, is nf_conntrack_max.
	MaxPerCore int `koanf:"maxPerCore"`
	Min        int `koanf:"min"`
	// TCPBeLiberal sets nf_conntrack_tcp_be_liberal; the datapath then no
	// longer drops out-of-window (INVALID) packets itself.
	TCPBeLiberal          bool          `koanf:"tcpBeLiberal"`
	TCPEstablishedTimeout time.Duration `koanf:"tcpEstablishedTimeout"`
	TCPCloseWaitTimeout   time.Duration `koanf:"tcpCloseWaitTimeout"`
	UDPTimeout            time.Duration `koanf:"udpTimeout"`
	UDPStreamTimeout      time.Duration `koanf:"udpStreamTimeout"`
}

// Policy configures the Wasm policy engine.
type Policy struct {
	Engine        string        `koanf:"engine"` // compiler | interpreter
	Timeout       time.Duration `koanf:"timeout"`
	MemoryLimit   Size          `koanf:"memoryLimit"`
	MaxModuleSize Size          `koanf:"maxModuleSize"`
	// ShadowBudget caps the time one sync spends on shadow modules (see
	// Module.ShadowOf); shadows past it are skipped for that sync, and
	// counted.
	ShadowBudget time.Duration `koanf:"shadowBudget"`
	Modules      []Module      `koanf:"modules"`
	Chains       []Chain       `koanf:"chains"`
}

// Module names a Wasm module file.
type Module struct {
	Name   string `koanf:"name"`
	Path   string `koanf:"path"`
	SHA256 string `koanf:"sha256"` // optional pin, hex
	// ShadowOf makes this module a shadow of the named one: it runs after
	// it, on the same inputs, in every chain step of that module; its
	// output is checked and compared, never programmed. A shadow is not a
	// chain step itself; promoting it is pointing the step at it and
	// dropping shadowOf.
	ShadowOf string `koanf:"shadowOf"`
	// Config is a shadow's module config; when empty it gets the config of
	// each step it shadows. Only a shadow takes it: a chain step has its
	// own.
	Config map[string]any `koanf:"config"`
}

// Chain runs modules, in order, for the services it matches.
type Chain struct {
	Name    string      `koanf:"name"`
	Match   Match       `koanf:"match"`
	Modules []ChainStep `koanf:"modules"`
	// Failure is keep-builtin (default) or last-good.
	Failure string `koanf:"failure"`
	// AllowEmpty lets a module drop every endpoint of a service; otherwise an
	// all-zero output counts as a failure.
	AllowEmpty bool `koanf:"allowEmpty"`
}

// Match selects services; every non-empty part must match.
type Match struct {
	Namespaces  []string          `koanf:"namespaces"`
	Labels      map[string]string `koanf:"labels"`
	Annotations map[string]string `koanf:"annotations"`
}

// ChainStep is one module of a chain with its own config, handed to the
// module once at init as JSON.
type ChainStep struct {
	Module string         `koanf:"module"`
	Config map[string]any `koanf:"config"`
}

// Health configures endpoint probing while the API server is away (see
// agent/prober): EndpointSlices are frozen then, and a dead pod would keep
// its share of traffic until the link returns.
type Health struct {
	// Mode is "offline" (probe once the API server has been unreachable
	// for After, or at a start from the snapshot), "always" or "off".
	Mode               string        `koanf:"mode"`
	After              time.Duration `koanf:"after"`
	Interval           time.Duration `koanf:"interval"`
	Timeout            time.Duration `koanf:"timeout"`
	FailureThreshold   int           `koanf:"failureThreshold"`
	SuccessThreshold   int           `koanf:"successThreshold"`
	ProbesPerSecond    int           `koanf:"probesPerSecond"`
	Concurrency        int           `koanf:"concurrency"`
	JitterPercent      int           `koanf:"jitterPercent"`
	PerEndpointMetrics bool          `koanf:"perEndpointMetrics"`
}

// Health modes.
const (
	HealthOffline = "offline"
	HealthAlways  = "always"
	HealthOff     = "off"
)

// Offline governs running without the API server: the last known state is
// written to stateDir and programmed from at start when the API server
// cannot be reached.
type Offline struct {
	// StartTimeout is how long the agent waits at start for the API server
	// before it programs the last snapshot when the kernel still holds our
	// rules (after a reboot it programs the snapshot at once); 0 never uses
	// the snapshot.
	StartTimeout time.Duration `koanf:"startTimeout"`
	// SnapshotInterval is the least time between two snapshot writes (each
	// write is the whole state: spare the flash of small edge nodes).
	SnapshotInterval time.Duration `koanf:"snapshotInterval"`
}

// Server sets the HTTP listen addresses; empty disables a server.
type Server struct {
	Healthz string `koanf:"healthz"`
	Metrics string `koanf:"metrics"`
}

// Log sets logging.
type Log struct {
	Level  string `koanf:"level"`  // debug | info | warn | error
	Format string `koanf:"format"` // text | json
}

// Memory sets the Go runtime's memory use.
type Memory struct {
	// Limit is the Go runtime's soft memory limit (debug.SetMemoryLimit):
	// near it the garbage collector runs more often rather than let the
	// heap grow. 0 picks one: 90% of the memory.max of the agent's cgroup
	// when it has one (systemd MemoryMax=, a container limit), else none
	// (a GOMEMLIMIT in the environment then stays in force).
	Limit Size `koanf:"limit"`
}

// MinMemoryLimit is the least memory.limit: below it the garbage
// collector would run all the time.
const MinMemoryLimit = Size(16 << 20)

// NodePortPrimary in NodePortAddresses stands for the node's primary
// addresses (its Node object's first InternalIP of each family), as
// kube-proxy's --nodeport-addresses=primary.
const NodePortPrimary = "primary"

// Size is a byte count written as 16Mi, 512Ki, 1G or a plain number.
type Size int64

// Default returns the configuration used when nothing else is said.
func Default() Config {
	return Config{
		Mode:            ModeIPTables,
		DetectLocalMode: LocalModeClusterCIDR, // kube-proxy's default on Linux
		Sync:            Sync{MinPeriod: time.Second, Period: 30 * time.Second, HealthTimeout: 60 * time.Second},
		IPTables:        IPTables{MasqueradeBit: 14, LocalhostNodePorts: true, LockWait: 5 * time.Second},
		IPVS: IPVS{
			Scheduler: "rr", Interface: "edgeproxy0", GracePeriod: 30 * time.Second,
		},
		// kube-proxy's defaults.
		Conntrack: Conntrack{MaxPerCore: 32 * 1024, Min: 128 * 1024,
			TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour},
		Policy: Policy{
			Engine: "compiler", Timeout: 50 * time.Millisecond, ShadowBudget: 100 * time.Millisecond,
			MemoryLimit: 16 << 20, MaxModuleSize: 8 << 20,
		},
		StateDir: "/var/lib/edgeproxy",
		Offline:  Offline{StartTimeout: 10 * time.Second, SnapshotInterval: 10 * time.Second},
		Health: Health{Mode: HealthOffline, After: 30 * time.Second, Interval: 5 * time.Second, Timeout: time.Second,
			FailureThreshold: 3, SuccessThreshold: 1, ProbesPerSecond: 100, Concurrency: 16, JitterPercent: 20},
		Server:           Server{Healthz: "0.0.0.0:10256", Metrics: "127.0.0.1:10249"},
		Log:              Log{Level: "info", Format: "text"},
		ServiceKeyPrefix: "edgeproxy.io/",
		MaxManifestSize:  64 << 20,
	}
}

// Mode is the datapath the agent programs.
type Mode string

// The modes (config key mode).
const (
	ModeIPTables Mode = "iptables"
	ModeIPVS     Mode = "ipvs"
	ModeNFTables Mode = "nftables" // nf_tables over netlink, tables ip/ip6 edgeproxy
	ModePlan     Mode = "plan"     // compute and publish the plan, program nothing
)

// Package nftables is the native nf_tables datapath: it programs a
// datapath.Plan over netlink (github.com/google/nftables, no nft binary),
// one transaction per Apply; the agent's `mode: nftables`. It leaves out,
// by name, the frontends it does not program (ErrUnsupported: an unknown
// frontend kind or protocol), each service
// port concerned returned as a *datapath.PortError (a refusal in status),
// and programs the rest of the plan.
//
// Tables: "ip edgeproxy" and "ip6 edgeproxy", as kube-proxy's nftables
// mode has one per family, and beside each Shards (16) service tables,
// "edgeproxy-svc-0" … "edgeproxy-svc-15". A Plan's frontends are per
// family already, the address fields of the maps differ in size anyway,
// and a family's tables can be rebuilt or dropped alone; an inet table
// would add an nfproto match to every dispatch for nothing. The kernel
// validates, at commit, every chain reachable from the base chains of
// each table a transaction touched: one table of every Service made that
// walk the floor of a one-Service change (54–64 ms at 10k Services). A
// service table holds the dispatch of the Services FNV-1a of
// "namespace/name" picks (every port and family of a Service in the same
// one, so its ext- chains jump to its svc- chains), so a change walks
// about 1/16 of them; the main table keeps what does not grow with a
// change or is not reached from the dispatch.
//
// Layout (the measured winner of issue 27: sets O(1) in the number of
// Services):
//
//	edgeproxy-svc-N (one of 16, the Service's):
//	nat-prerouting, nat-output (nat, dstnat)  → services
//	services     ip daddr . meta l4proto . th dport vmap @service-ips
//	             fib daddr type local ip daddr != 127.0.0.0/8
//	                 meta l4proto . th dport vmap @service-nodeports
//	             (nodePortAddresses: ip daddr @nodeport-ips instead of fib)
//	svc-NS/NAME/PORT   [ip daddr VIP ip saddr != clusterCIDR mark]
//	                   meta l4proto P dnat ip to numgen random mod R
//	                   map { 0 : EP . PORT, … } (exact weights: a range
//	                   of slots per endpoint; one endpoint: dnat to EP)
//	             (ExternalIP and LoadBalancer IPs: → ext-… in @service-ips)
//	ext-NS/NAME/PORT   mark; goto svc-…   (NodePort, ExternalIP, LB IP)
//	                   Local: pods and the node short-circuit to the
//	                   cluster-wide svc- chain, the rest to the local one
//	             (a connection's first DNAT wins: nf_nat consults the
//	             next table's nat chain only while none bound it)
//
//	edgeproxy (the main table):
//	filter-input/forward/output (filter, after DNAT), ct state new:
//	             … vmap @no-endpoint-services / @no-endpoint-nodeports
//	             → goto reject-chain (reject) | drop
//	             forward/output: ip daddr @cluster-ips reject (a port of
//	             a cluster IP no Service has, left untranslated)
//	nat-postrouting (srcnat) → masquerading:
//	             ct status dnat ip saddr . ip daddr @hairpin mark;
//	             unmarked return; clear the mark; masquerade fully-random
//
//	filter-prerouting/output-pre-dnat (dstnat-10): load balancers with source ranges,
//	             @firewall-ips and the interval set @firewall-allow
//
//	svc- with session affinity: a set of clients per endpoint,
//	             @aff-NS/NAME/ADDR/PORT, "ip saddr @aff-… update … dnat to"
//	             first (every hit renews the timeout), then a numgen
//	             cascade of "dnat to" instead of the map, each rule
//	             updating the set of the endpoint it picks, as
//	             kube-proxy's nftables mode
//
// Five maps and five sets in all, whatever the number of Services (two
// maps and a set in each service table, the rest in the main one; and
// one set per endpoint of a Service with affinity); a Service adds
// one or two chains, its elements, and an anonymous map per svc- chain
// (its rule's own, gone with the rule). State is kept in memory (what each
// service port wrote: its chains' rule texts and its elements), so a
// partial sync sends only the differences of the changed service ports and
// never reads the table back; the first Apply writes the tables whole in
// bounded transactions, from nothing when the kernel holds no table of
// ours (coldStart), over the one it holds otherwise (warmStart: a restart,
// Service by Service, after a dump of names and map elements). A later
// rewrite of every Service (a failed apply, tampering, a reload that
// changes every rule) goes through warmStart too; only one after a failed
// warmStart replaces the tables in one transaction.
package nftables

// Package agentguest holds the agent-level IPVS proofs: bin/edgeproxy run
// with mode ipvs on a manifest directory, in a node namespace inside the
// test VM, with real traffic from pod and client namespaces. Its tests run
// only in the guest (test/vm's TestAgentIPVS boots the VM and runs them);
// on the host they skip.
package agentguest

package e2e_test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// apiStatus is the API part of the agent's /debug/status.
type apiStatus struct {
	APIReachable bool `json:"apiReachable"`
	Health       struct {
		APIServerLastContact time.Time `json:"apiserverLastContact"`
	} `json:"health"`
}

func readAPIStatus(node *netns.Node) (apiStatus, error) {
	var st apiStatus
	return st, readStatus(node, &st)
}

// The link to the API server goes silent: every packet between the node
// and the API server is dropped, nothing is reset, as when an edge site's
// uplink fails. The agent asks nothing of a healthy quiet API server, so
// it is its connection's TCP keepalive that must notice: within a bound
// the agent says the API server is unreachable (and keeps its rules), and
// once the link is back it says so again. Before the drop, a quiet while
// keeps the last contact fresh (the API server's kernel answers the
// probes).
func TestAPILinkGoesSilent(t *testing.T) {
	bin := rootAgent(t, "iptables", "iptables-restore", "iptables-save")

	node := netns.NewNode(t, "node")
	w := newAPIWorld(t, node, "", 5*time.Minute)
	hostIP := w.hostIP
	dir, cfg := apiAgentConfig(t, w, "")
	startAgent(t, node, bin, cfg, filepath.Join(dir, "agent.log"))
	waitFor(t, 60*time.Second, "the agent hears the API server", func() error {
		st, err := readAPIStatus(node)
		if err == nil && (!st.APIReachable || st.Health.APIServerLastContact.IsZero()) {
			err = fmt.Errorf("%+v", st)
		}
		return err
	})

	time.Sleep(25 * time.Second) // quiet: no event, no heartbeat
	st, err := readAPIStatus(node)
	if err != nil {
		t.Fatal(err)
	}
	if age := time.Since(st.Health.APIServerLastContact); !st.APIReachable || age > 20*time.Second {
		t.Fatalf("after 25s of quiet: reachable %v, last contact %v ago; want reachable and heard within the keepalive interval", st.APIReachable, age.Round(time.Second))
	}

	drop := func(op string) {
		t.Helper()
		for _, rule := range [][]string{{"INPUT", "-s", hostIP.String()}, {"OUTPUT", "-d", hostIP.String()}} {
			args := append([]string{op, rule[0]}, append(rule[1:], "-p", "tcp", "-j", "DROP")...)
			if out, err := node.Run("iptables", args...); err != nil {
				t.Fatalf("iptables %v: %v: %s", args, err, out)
			}
		}
	}
	// The kernel gives the connection up after 20 s of silence, and the
	// /readyz asked then times out after 5 s: 25 s, 45 s with room for a
	// loaded machine. Without keepalive only client-go's HTTP/2 health
	// check would notice (a PING after 30 s without a frame, given up 15 s
	// later), and the readyz after it would end past 50 s.
	drop("-I")
	silent := time.Now()
	waitFor(t, 45*time.Second, "the agent says the API server is unreachable", func() error {
		st, err := readAPIStatus(node)
		if err == nil && st.APIReachable {
			err = fmt.Errorf("still reachable, last contact %v ago", time.Since(st.Health.APIServerLastContact).Round(time.Second))
		}
		return err
	})
	t.Logf("unreachable %v after the link went silent", time.Since(silent).Round(100*time.Millisecond))

	drop("-D")
	back := time.Now()
	waitFor(t, 60*time.Second, "the agent hears the API server again", func() error {
		st, err := readAPIStatus(node)
		if err == nil && !st.APIReachable {
			err = fmt.Errorf("unreachable")
		}
		return err
	})
	t.Logf("reachable %v after the link came back", time.Since(back).Round(100*time.Millisecond))
}

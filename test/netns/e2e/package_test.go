package e2e_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/debroot"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// TestPackageUpgradeUnderStream upgrades the .deb under a running agent and
// a stream of connections through a NodePort, and counts them: none fails.
//
// The first build (from `make package`) is installed with dpkg into a
// throwaway root (package debroot) and its /usr/bin/edgeproxy runs in the
// node namespace with the packaged config file, edited for this node. Then
// dpkg installs a second build of another version over it; its postinst
// asks the service manager to restart the running service (checked on
// debroot's systemctl stand-in, which runs the new binary's `version`). The
// restart itself is done here as systemd does it for this unit
// (KillMode=mixed: SIGTERM to the agent, wait, start the unit's ExecStart
// again), with the upgraded binary at the same path.
func TestPackageUpgradeUnderStream(t *testing.T) {
	gate.Root(t)
	gate.Binaries(t, "iptables", "iptables-restore")
	r := debroot.New(t)
	u := debroot.NewUpgrade(t)
	newV := u.NewVersion
	r.MustDpkg(t, "-i", u.Old)

	node := netns.NewNode(t, "node")
	a := node.AddPod("a")
	client := node.AddClient("client")
	serve(t, a)
	m := newManifestsAgent(t)
	m.manifest(t, "web.yaml", webManifest(a.IP, nodeName))
	dir, manifests := m.dir, m.manifests
	// The packaged conffile, as an admin would edit it for this node.
	cfg := r.Path("etc/edgeproxy/config.yaml")
	packaged, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	edited := string(packaged)
	for key, value := range map[string]string{
		"nodeName":    nodeName,
		"manifests":   manifests,
		"mode":        "iptables",
		"clusterCIDR": "10.244.0.0/16",
		"stateDir":    r.Path("var/lib/edgeproxy"),
	} {
		re := regexp.MustCompile(`(?m)^` + key + `:.*$`)
		if !re.MatchString(edited) {
			t.Fatalf("the packaged config has no top-level %s", key)
		}
		edited = re.ReplaceAllLiteralString(edited, key+": "+value)
	}
	writeFile(t, cfg, edited)
	bin := r.Path("usr/bin/edgeproxy") // the unit's ExecStart, inside the root
	logPath := filepath.Join(dir, "agent.log")
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			t.Logf("agent log:\n%s", out)
		}
	})
	ag := startAgent(t, node, bin, cfg, logPath)
	r.Systemctl(t, "start", "edgeproxy.service") // the service manager's view: running
	nodePort := netip.AddrPortFrom(node.LinkIP, 30080)
	waitFor(t, 60*time.Second, "client -> NodePort answered by a", func() error {
		rep, err := client.TCP(nodePort, time.Second)
		if err == nil && rep.Name != "a" {
			err = fmt.Errorf("answered by %s", rep.Name)
		}
		return err
	})

	underStream(t, client, nodePort, "a package upgrade and restart", func() {
		out := r.MustDpkg(t, "-i", u.New)
		if s := r.Service(); s.Running != "edgeproxy "+newV {
			t.Fatalf("after dpkg -i the service manager runs %q, want a restart onto edgeproxy %s\n%s", s.Running, newV, out)
		}
		if err := ag.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := ag.cmd.Wait(); err != nil {
			t.Fatalf("old agent after SIGTERM: %v", err)
		}
		ag = startAgent(t, node, bin, cfg, logPath)
		waitFor(t, 60*time.Second, "upgraded agent healthy (healthz 200)", func() error { return healthz(node) })
	})
	log, _ := os.ReadFile(logPath)
	if !strings.Contains(string(log), `msg="edgeproxy starting" version=`+newV+" ") {
		t.Errorf("no start of version %s in the agent log", newV)
	}
}

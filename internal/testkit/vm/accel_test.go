package vm

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestChooseAccel holds the choice's rules that need no boot: the
// environment forces it, a kept verdict is used as it is, a bad value is
// refused, and without /dev/kvm the choice is TCG, saying why.
func TestChooseAccel(t *testing.T) {
	needVM(t)
	p, err := findParts(Options{CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for env, want := range map[string]string{"tcg": "tcg", "kvm": "kvm"} {
		t.Setenv(AccelEnv, env)
		a, err := chooseAccel(ctx, p, p.cache)
		if err != nil || a.name != want {
			t.Errorf("%s=%s: got %v, %v; want %s", AccelEnv, env, a, err, want)
		}
	}
	t.Setenv(AccelEnv, "hvf")
	if _, err := chooseAccel(ctx, p, p.cache); err == nil {
		t.Errorf("%s=hvf was accepted", AccelEnv)
	}
	t.Setenv(AccelEnv, "")
	if _, err := os.Stat("/dev/kvm"); err != nil {
		a, err := chooseAccel(ctx, p, p.cache)
		if err != nil || a.name != "tcg" || !strings.Contains(a.why, "no KVM") {
			t.Errorf("without /dev/kvm: got %v, %v", a, err)
		}
		return
	}
	key, err := accelKey(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, kept := range []string{"kvm a probe boot reached the initramfs in 1.2s", "tcg KVM probe failed: it did not"} {
		if err := os.WriteFile(filepath.Join(p.cache, "accel-"+key), []byte(kept+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		a, err := chooseAccel(ctx, p, p.cache)
		if err != nil {
			t.Fatal(err)
		}
		name, why, _ := strings.Cut(kept, " ")
		if a.name != name || !strings.HasPrefix(a.why, why) {
			t.Errorf("kept %q: got %v", kept, a)
		}
		if d := time.Since(start); d > probeTimeout {
			t.Errorf("kept %q: took %s, as long as a probe", kept, d)
		}
	}
	if a := parseVerdict("hvf fast\n", "x"); a.name != "tcg" {
		t.Errorf("an unknown kept verdict gave %v, want tcg", a)
	}
}

// TestProbeKVM probes this machine's KVM for real and checks that the
// verdict holds: when the probe says KVM, a whole run under KVM must boot
// and finish. Without /dev/kvm it skips: chooseAccel then never probes.
func TestProbeKVM(t *testing.T) {
	needVM(t)
	if _, err := os.Stat("/dev/kvm"); err != nil {
		t.Skipf("no /dev/kvm (%v): nothing to probe", err)
	}
	p, err := findParts(Options{})
	if err != nil {
		t.Fatal(err)
	}
	release, _, err := lockVM(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	a := probeKVM(context.Background(), p)
	release()
	t.Logf("probe: %v after %s", a, time.Since(start).Round(time.Millisecond))
	if a.name == "tcg" {
		if !strings.Contains(a.why, "KVM probe failed") {
			t.Errorf("a failed probe does not say so: %v", a)
		}
		return
	}
	t.Setenv(AccelEnv, "kvm")
	res, err := Run(context.Background(), Options{Dir: t.TempDir(), Script: "test -e /proc/net/ip_vs && grep -c ^processor /proc/cpuinfo", Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatalf("the probe said KVM, but a run under it did not finish: %v", err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("run under KVM: exit %d\n%s", res.ExitCode, res.Output)
	}
	t.Logf("under KVM: boot %s, run %s\n%s", res.Boot, res.Elapsed, res.Output)
}

package xtables

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// TestRestoreAbortAndCommit runs iptables-restore in a namespace under
// each backend: a Restore started before its input, given a table without
// its COMMIT line and aborted, leaves the kernel as it was; the same input
// with COMMIT, committed, is in the kernel; a line the tool refuses comes
// back as a RestoreError naming it.
func TestRestoreAbortAndCommit(t *testing.T) {
	gate.Root(t)
	for _, v := range []Variant{Legacy, NFT} {
		t.Run(string(v), func(t *testing.T) {
			ipt, restore := Binaries(v, datapath.IPv4)
			gate.Binaries(t, ipt, restore)
			ns := netns.New(t, "restore")
			var x *Tool
			start := func() *Restore {
				t.Helper()
				var r *Restore
				if err := ns.Do(func() (err error) {
					if x == nil {
						if x, err = Open(v, datapath.IPv4, 0); err != nil {
							return err
						}
					}
					r, err = x.StartRestore(context.Background())
					return err
				}); err != nil {
					t.Fatal(err)
				}
				return r
			}
			chains := func() string {
				t.Helper()
				out, err := ns.Run(ipt, "-t", "nat", "-S")
				if err != nil {
					t.Fatalf("%s -S: %v: %s", ipt, err, out)
				}
				return out
			}
			const table = "*nat\n:EP-TEST - [0:0]\n-A EP-TEST -j RETURN\n"

			r := start()
			if _, err := r.Write([]byte(table)); err != nil {
				t.Fatal(err)
			}
			r.Abort()
			if got := chains(); strings.Contains(got, "EP-TEST") {
				t.Fatalf("an aborted restore committed its input:\n%s", got)
			}
			start().Abort() // nothing written
			if got := chains(); strings.Contains(got, "EP-TEST") {
				t.Fatalf("an aborted empty restore left:\n%s", got)
			}

			r = start()
			if _, err := r.Write([]byte(table + "COMMIT\n")); err != nil {
				t.Fatal(err)
			}
			st, err := r.Commit()
			if err != nil {
				t.Fatal(err)
			}
			if got := chains(); !strings.Contains(got, "-A EP-TEST -j RETURN") {
				t.Fatalf("a committed restore is not in the kernel:\n%s", got)
			}
			if st.Wall <= 0 || st.CPU < 0 {
				t.Errorf("stats %+v: want a wall time", st)
			}
			r.Abort() // after Commit: nothing to do

			r = start()
			_, _ = r.Write([]byte("*nat\n:EP-BAD - [0:0]\n-A EP-BAD -s fd00::/64 -j RETURN\nCOMMIT\n"))
			var re *RestoreError
			if _, err := r.Commit(); !errors.As(err, &re) || re.Line != 3 {
				t.Fatalf("Commit of a bad line 3 = %v, want a RestoreError of line 3", err)
			}
		})
	}
}

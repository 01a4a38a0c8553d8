package vm_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/vm"
)

// Boot once, run a script that uses IPVS and a dummy link, and read what
// it wrote into the shared directory. (Not run by go test: it boots a VM.)
func ExampleRun() {
	dir, _ := os.MkdirTemp("", "vm")
	defer os.RemoveAll(dir)
	res, err := vm.Run(context.Background(), vm.Options{
		Dir:     dir,
		Script:  "ip link add ep0 type dummy && cat /proc/net/ip_vs > ipvs.txt",
		Timeout: 2 * time.Minute,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	out, _ := os.ReadFile(dir + "/ipvs.txt")
	fmt.Printf("exit %d after %s boot:\n%s", res.ExitCode, res.Boot, out)
}

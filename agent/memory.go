package agent

import (
	"bufio"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/edgeproxy/edgeproxy/agent/config"
)

// goLimit is the runtime's limit before the agent set one: math.MaxInt64,
// or GOMEMLIMIT's.
var goLimit = debug.SetMemoryLimit(-1)

// setMemoryLimit applies memory.limit (see config.Memory) and returns the
// limit in force; 0 when there is none of ours. At start and on reload.
func setMemoryLimit(m config.Memory, log *slog.Logger) int64 {
	limit := int64(m.Limit)
	if limit == 0 {
		max, err := cgroupMemoryMax("/proc/self/cgroup", "/sys/fs/cgroup")
		if err != nil {
			log.Debug("no cgroup memory limit to derive memory.limit from", "err", err)
		}
		if max <= 0 {
			debug.SetMemoryLimit(goLimit) // none of ours
			return 0
		}
		limit = max / 10 * 9
	}
	debug.SetMemoryLimit(limit)
	return limit
}

// cgroupMemoryMax reads memory.max of the cgroup (v2) that the process in
// procCgroup belongs to, under root; 0 when it is "max" (no limit).
func cgroupMemoryMax(procCgroup, root string) (int64, error) {
	f, err := os.Open(procCgroup)
	if err != nil {
		return 0, fmt.Errorf("memory limit: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		path, ok := strings.CutPrefix(sc.Text(), "0::")
		if !ok {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, filepath.Clean("/"+path), "memory.max"))
		if err != nil {
			return 0, fmt.Errorf("memory limit: %w", err)
		}
		v := strings.TrimSpace(string(b))
		if v == "max" {
			return 0, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("memory limit: memory.max of %s: %w", path, err)
		}
		return n, nil
	}
	return 0, fmt.Errorf("memory limit: %s names no cgroup v2", procCgroup)
}

// releaseAfterStart gives back what the cold start used and a quiet agent
// does not: the heap the first list and sync left free (debug.FreeOSMemory)
// and the executable's pages that start-up touched (unmapExecutable).
// Once, after the first successful apply: doing it after every sync would
// only make the next one fault its code back in.
//
// Two collections, not one: a GC moves what the sync.Pools hold into
// their victim caches, which stay live until the next one. The pools'
// items after a cold start are its buffers (client-go's decoding, netlink
// messages, encoders): 30 MB at 10,000 Services were left in the heap by
// FreeOSMemory's one GC, and a quiet agent collects rarely.
func releaseAfterStart(log *slog.Logger) {
	runtime.GC()
	debug.FreeOSMemory()
	n, noFaultAround, err := unmapExecutable()
	if err != nil {
		log.Debug("executable pages stay mapped", "err", err)
		return
	}
	if noFaultAround != nil {
		log.Debug("released start-up memory; code run again comes back 64 KiB at a time", "executableBytes", n, "err", noFaultAround)
		return
	}
	log.Debug("released start-up memory", "executableBytes", n)
}

package nftables

import (
	"encoding/binary"
	"hash/maphash"
	"net/netip"

	"github.com/edgeproxy/edgeproxy/datapath"
)

// inputSeed keys every unit's input hash in this process.
var inputSeed = maphash.MakeSeed()

// inputHash sums up everything buildUnit reads of a service port's
// frontends. A compare (plan.Full) leaves a unit whose frontends hash as
// when it was built: buildUnit is deterministic, and the Options it reads
// change only through Reconfigure, after which the tables are rebuilt and
// every unit built again. Without it, the sync.period compare built every
// unit of the table (about 170 ms of CPU at 5k Services) and held the
// change that came with it for as long. TestInputHashSeesEveryField keeps
// it in step with datapath.Frontend.
func inputHash(fs []datapath.Frontend) uint64 {
	var h maphash.Hash
	h.SetSeed(inputSeed)
	w := inputWriter{h: &h}
	w.int(len(fs))
	for i := range fs {
		f := &fs[i]
		w.str(f.Service.Namespace)
		w.str(f.Service.Name)
		w.str(f.Service.Port)
		w.str(string(f.Kind))
		w.str(string(f.Protocol))
		w.addr(f.Addr)
		w.int(int(f.Family))
		w.int(int(f.Port))
		w.endpoints(f.Endpoints)
		w.bool(f.Drop)
		w.bool(f.LocalOnly)
		w.endpoints(f.Cluster)
		w.int(len(f.Serving))
		for _, a := range f.Serving {
			w.addrPort(a)
		}
		w.int(int(f.Affinity))
		w.int(len(f.SourceRanges))
		for _, p := range f.SourceRanges {
			w.addr(p.Addr())
			w.int(p.Bits())
		}
		w.bool(f.SourceRangesHoldNode)
		w.str(f.Scheduler)
		w.int(len(f.SchedulerFlags))
		for _, s := range f.SchedulerFlags {
			w.str(s)
		}
	}
	return h.Sum64()
}

// inputWriter writes values into a hash, each unambiguously (lengths
// before strings and lists).
type inputWriter struct {
	h   *maphash.Hash
	buf [8]byte
}

func (w *inputWriter) int(v int) {
	binary.LittleEndian.PutUint64(w.buf[:], uint64(v))
	w.h.Write(w.buf[:])
}

func (w *inputWriter) bool(b bool) {
	if b {
		w.h.WriteByte(1)
	} else {
		w.h.WriteByte(0)
	}
}

func (w *inputWriter) str(s string) {
	w.int(len(s))
	w.h.WriteString(s)
}

func (w *inputWriter) addr(a netip.Addr) {
	w.int(a.BitLen())
	b := a.As16()
	w.h.Write(b[:])
	w.str(a.Zone())
}

func (w *inputWriter) addrPort(a netip.AddrPort) {
	w.addr(a.Addr())
	w.int(int(a.Port()))
}

func (w *inputWriter) endpoints(eps []datapath.Endpoint) {
	w.int(len(eps))
	for _, e := range eps {
		w.addrPort(e.Addr)
		w.int(int(e.Weight))
		w.bool(e.Local)
	}
}

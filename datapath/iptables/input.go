package iptables

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"

	"github.com/edgeproxy/edgeproxy/datapath"
)

// inputSum is a hash of what a unit is rendered from: the rendering
// config and the unit's frontends, in their canonical order. A unit's
// rules are a pure function of both, so a compare (Plan.Full) takes the
// kept summary of a unit whose input hash has not moved instead of
// rendering it again: the guard against a change the partial syncs missed
// costs a hash per unit, not a render. Kept in memory only; the seed is
// per process.
type inputSum uint64

var inputSeed = maphash.MakeSeed()

// configSum hashes the rendering config once per render.
func configSum(cfg *Config) uint64 {
	return maphash.String(inputSeed, fmt.Sprintf("%+v", *cfg))
}

// sumInput hashes a unit's sorted frontends under the config hash cs.
func sumInput(cs uint64, fs []*datapath.Frontend) inputSum {
	var h maphash.Hash
	h.SetSeed(inputSeed)
	var b [8]byte
	u64 := func(v uint64) {
		binary.LittleEndian.PutUint64(b[:], v)
		h.Write(b[:])
	}
	str := func(s string) {
		u64(uint64(len(s)))
		h.WriteString(s)
	}
	eps := func(es []datapath.Endpoint) {
		u64(uint64(len(es)))
		for _, e := range es {
			h.Write(e.Addr.Addr().AsSlice())
			u64(uint64(e.Addr.Port())<<33 | uint64(e.Weight)<<1 | b2u(e.Local))
		}
	}
	u64(cs)
	for _, f := range fs {
		// Every field of datapath.Frontend (TestSumInputCoversFrontend).
		str(f.Service.Namespace)
		str(f.Service.Name)
		str(f.Service.Port)
		str(string(f.Kind))
		str(string(f.Protocol))
		h.Write(f.Addr.AsSlice())
		u64(uint64(f.Family)<<32 | uint64(f.Port)<<8 | b2u(f.Drop)<<1 | b2u(f.LocalOnly))
		eps(f.Endpoints)
		eps(f.Cluster)
		u64(uint64(len(f.Serving)))
		for _, s := range f.Serving {
			h.Write(s.Addr().AsSlice())
			u64(uint64(s.Port()))
		}
		u64(uint64(f.Affinity))
		u64(uint64(len(f.SourceRanges))<<1 | b2u(f.SourceRangesHoldNode))
		for _, p := range f.SourceRanges {
			h.Write(p.Addr().AsSlice())
			u64(uint64(p.Bits()))
		}
		str(f.Scheduler)
		u64(uint64(len(f.SchedulerFlags)))
		for _, s := range f.SchedulerFlags {
			str(s)
		}
	}
	return inputSum(h.Sum64())
}

func b2u(v bool) uint64 {
	if v {
		return 1
	}
	return 0
}

package source

import (
	"sync"

	clientfeatures "k8s.io/client-go/features"
)

// A full read is a LIST, not a watch with sendInitialEvents (client-go's
// WatchListClient, on by default since 0.35): API servers up to 1.36 gzip
// a LIST response over 128 KB and not a watch stream, so on the wire the
// LIST is the smaller (RATIONALE.md, "Why a full read is a LIST"). Set once
// for the process, before the first API client is made: client-go reads
// its gates from then on, and a later replacement logs an error.
var listOnce sync.Once

// PreferList turns client-go's WatchListClient off for the process.
func PreferList() {
	listOnce.Do(func() {
		clientfeatures.ReplaceFeatureGates(withoutWatchList{clientfeatures.FeatureGates()})
	})
}

// withoutWatchList is client-go's feature gates with WatchListClient off.
type withoutWatchList struct{ clientfeatures.Gates }

func (g withoutWatchList) Enabled(key clientfeatures.Feature) bool {
	return key != clientfeatures.WatchListClient && g.Gates.Enabled(key)
}

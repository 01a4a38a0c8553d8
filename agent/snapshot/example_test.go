package snapshot_test

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/agent/snapshot"
)

func Example() {
	dir, err := os.MkdirTemp("", "edgeproxy-state")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	// On start, before the API answers: is there a state to serve from?
	if _, err := snapshot.Load(dir); errors.Is(err, snapshot.ErrNotFound) {
		fmt.Println("no snapshot yet")
	}

	// After each successful sync.
	s := &snapshot.Snapshot{Written: time.Now(), Node: model.Node{Name: "edge-1"}}
	if err := snapshot.Save(dir, s); err != nil {
		panic(err)
	}

	got, err := snapshot.Load(dir)
	if err != nil {
		panic(err)
	}
	fmt.Println("node", got.Node.Name)
	// Output:
	// no snapshot yet
	// node edge-1
}

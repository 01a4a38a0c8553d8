package conntrack_test

import (
	"context"
	"log"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/conntrack"
)

// A datapath calls Reconcile after each successful apply with the frontends
// it just programmed; force after a full sync.
func ExampleCleaner_Reconcile() {
	c, err := conntrack.New(conntrack.Options{})
	if err != nil {
		log.Print(err)
		return
	}
	var plan datapath.Plan // the plan just applied
	if _, err := c.Reconcile(context.Background(), plan.Frontends, plan.Full); err != nil {
		log.Print(err)
	}
}

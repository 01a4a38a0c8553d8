package iptables

import (
	"context"

	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// fakeIO is tablesIO on an xtables.Fake, so that a family's sync logic
// runs without root.
type fakeIO struct{ *xtables.Fake }

var _ tablesIO = fakeIO{}

func (k fakeIO) StartRestore(ctx context.Context) (restorer, error) {
	r, err := k.Fake.StartRestore(ctx)
	return r, err
}

// newFakeFamily is a family of cfg whose tables are k.
func newFakeFamily(cfg Config, k *xtables.Fake) *family {
	return &family{cfg: cfg, io: fakeIO{k}, log: discardLog}
}

package source

import (
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	clientfeatures "k8s.io/client-go/features"
)

// The Services labelled for this proxy are selected by its name; a name no
// label can carry selects nothing, and needs no watch.
func TestNamedServices(t *testing.T) {
	for _, tc := range []struct {
		name string
		want string
		ok   bool
	}{
		{"edgeproxy", LabelServiceProxyName + "=edgeproxy", true},
		{"", "", false},
		{"not a label value", "", false},
	} {
		got, ok := namedServices(tc.name)
		if got != tc.want || ok != tc.ok {
			t.Errorf("namedServices(%q) = %q, %v; want %q, %v", tc.name, got, ok, tc.want, tc.ok)
			continue
		}
		if !ok {
			continue
		}
		sel, err := labels.Parse(got)
		if err != nil {
			t.Fatal(err)
		}
		for labelled, want := range map[string]bool{tc.name: true, "cilium": false, "": false} {
			ls := labels.Set{}
			if labelled != "" {
				ls[LabelServiceProxyName] = labelled
			}
			if sel.Matches(ls) != want {
				t.Errorf("%q matches %v: %v, want %v", got, ls, !want, want)
			}
		}
	}
}

// A server that cannot select Services on spec.clusterIP (before 1.27)
// refuses the list with 400; the selector is then dropped for good, and
// other errors leave it in place.
func TestRefusedFieldSelector(t *testing.T) {
	a := &API{}
	a.clusterIPField.Store(true)
	for _, err := range []error{
		errors.New("connection refused"),
		apierrors.NewBadRequest("unable to parse requirement: label selector"),
		apierrors.NewTimeoutError("timeout", 1),
	} {
		if a.refusedField(err) || !a.clusterIPField.Load() {
			t.Fatalf("%v dropped the field selector", err)
		}
	}
	refused := apierrors.NewBadRequest("field label not supported: spec.clusterIP")
	if !a.refusedField(refused) || a.clusterIPField.Load() {
		t.Fatal("a refused field selector was kept")
	}
	if a.refusedField(refused) {
		t.Error("reported twice")
	}
}

// Once an API source is made, client-go's reflectors read with a LIST
// (gzipped by the API server), not a watch with initial events; every
// other client-go feature keeps its setting.
func TestPreferList(t *testing.T) {
	before := clientfeatures.FeatureGates().Enabled(clientfeatures.InformerResourceVersion)
	PreferList()
	PreferList() // once: no second replacement
	g := clientfeatures.FeatureGates()
	if g.Enabled(clientfeatures.WatchListClient) {
		t.Error("WatchListClient still on")
	}
	if g.Enabled(clientfeatures.InformerResourceVersion) != before {
		t.Error("another feature changed")
	}
}

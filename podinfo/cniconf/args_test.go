package cniconf

import (
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

// libraryK8sArgs is how a plugin reads CNI_ARGS with the CNI library
// (Istio's istio-cni does so): types.LoadArgs into CommonArgs plus the keys,
// named as the CNI_ARGS keys are.
type libraryK8sArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE          types.UnmarshallableString
	K8S_POD_NAME               types.UnmarshallableString
	K8S_POD_UID                types.UnmarshallableString
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString
}

// TestLoadArgsStillDiffers pins why ParseK8sArgs is not types.LoadArgs
// (docs/dependencies.md): each case fails once the CNI library reads
// CNI_ARGS as ParseK8sArgs does, saying what then to drop.
func TestLoadArgsStillDiffers(t *testing.T) {
	t.Run("a repeated key: the last wins, silently", func(t *testing.T) {
		const in = "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-1;K8S_POD_NAME=db-0"
		var a libraryK8sArgs
		if err := types.LoadArgs(in, &a); err != nil {
			t.Fatalf("types.LoadArgs now refuses a repeated key (%v): ParseK8sArgs could be LoadArgs with CommonArgs", err)
		}
		if a.K8S_POD_NAME != "db-0" {
			t.Fatalf("types.LoadArgs kept %q of a repeated K8S_POD_NAME; the ledger says the last", a.K8S_POD_NAME)
		}
		if _, err := ParseK8sArgs(in); err == nil || !strings.Contains(err.Error(), "K8S_POD_NAME given twice") {
			t.Fatalf("ParseK8sArgs(%q) error = %v, want K8S_POD_NAME given twice", in, err)
		}
	})
	t.Run("unknown keys fail without IgnoreUnknown", func(t *testing.T) {
		const in = "K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-1;K8S_POD_FUTURE=x"
		var a libraryK8sArgs
		if err := types.LoadArgs(in, &a); err == nil {
			t.Fatal("types.LoadArgs now ignores unknown keys without IgnoreUnknown")
		}
		if got, err := ParseK8sArgs(in); err != nil || got.PodName != "web-1" {
			t.Fatalf("ParseK8sArgs(%q) = %+v, %v; want web-1 and no error", in, got, err)
		}
	})
	t.Run("an empty pair and a value holding '=' are errors", func(t *testing.T) {
		for _, in := range []string{"IgnoreUnknown=1;K8S_POD_NAME=web-1;", "IgnoreUnknown=1;K8S_POD_NAME=web-1;FOO=a=b"} {
			var a libraryK8sArgs
			if err := types.LoadArgs(in, &a); err == nil {
				t.Errorf("types.LoadArgs(%q) now accepts it", in)
			}
			if _, err := ParseK8sArgs(in); err != nil {
				t.Errorf("ParseK8sArgs(%q): %v", in, err)
			}
		}
	})
}

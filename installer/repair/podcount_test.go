package repair

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestReadSlimPodListCount: a list answer holds at most MaxListPods pods,
// in protobuf and in JSON; one more fails naming the bound, before the
// pods past it are decoded. Before, any number was read (64 MiB of
// near-empty pods: four million, 12.9 GB).
func TestReadSlimPodListCount(t *testing.T) {
	list := func(n int) *corev1.PodList {
		l := &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "9"}}
		for i := range n {
			l.Items = append(l.Items, corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%d", i), Namespace: "shop"}})
		}
		return l
	}
	for _, n := range []int{MaxListPods, MaxListPods + 1} {
		pb := encodedPodList(t, list(n))
		js, err := json.Marshal(list(n))
		if err != nil {
			t.Fatal(err)
		}
		for enc, data := range map[string][]byte{"protobuf": pb, "JSON": js} {
			l, err := ReadSlimPodList(bytes.NewReader(data))
			switch {
			case n <= MaxListPods && (err != nil || len(l.Items) != n || l.ResourceVersion != "9"):
				t.Errorf("%s, %d pods: %v", enc, n, err)
			case n > MaxListPods && (err == nil || !strings.Contains(err.Error(), fmt.Sprintf("over the %d pods one node's list may hold", MaxListPods))):
				t.Errorf("%s, %d pods: err = %v, want the bound named", enc, n, err)
			}
		}
	}
}

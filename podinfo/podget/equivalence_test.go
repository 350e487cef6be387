package podget_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
)

// The plugin decodes the API server's JSON with its own mirror of the Pod
// (podget); the agent hands it podinfo.Mesh of client-go's corev1.Pod. For
// every pod both must give the same decision fields, UID included.
func samePod(t *testing.T, name string, pod *corev1.Pod) {
	t.Helper()
	pod.Kind, pod.APIVersion = "Pod", "v1"
	data, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	got, uid, err := meshpod.DecodeAPIPod(data)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	want := podinfo.Mesh(pod)
	if uid != string(pod.UID) || !reflect.DeepEqual(emptyAsNil(got), emptyAsNil(want)) {
		t.Fatalf("%s: podget decoded %+v (uid %s), podinfo.Mesh gives %+v (uid %s)", name, got, uid, want, pod.UID)
	}
}

// emptyAsNil is a deep copy of v with every empty map and slice made nil:
// the decision fields do not tell them apart (corev1 keeps an empty
// annotations map the JSON it is marshalled to leaves out).
func emptyAsNil[T any](v T) T {
	in := reflect.ValueOf(&v).Elem()
	out := reflect.New(in.Type()).Elem()
	copyEmptyAsNil(out, in)
	return out.Interface().(T)
}

func copyEmptyAsNil(dst, src reflect.Value) {
	switch src.Kind() {
	case reflect.Pointer:
		if !src.IsNil() {
			dst.Set(reflect.New(src.Type().Elem()))
			copyEmptyAsNil(dst.Elem(), src.Elem())
		}
	case reflect.Struct:
		for i := range src.NumField() {
			if dst.Field(i).CanSet() {
				copyEmptyAsNil(dst.Field(i), src.Field(i))
			}
		}
	case reflect.Slice:
		if src.Len() > 0 {
			dst.Set(reflect.MakeSlice(src.Type(), src.Len(), src.Len()))
			for i := range src.Len() {
				copyEmptyAsNil(dst.Index(i), src.Index(i))
			}
		}
	case reflect.Map:
		if src.Len() > 0 {
			dst.Set(reflect.MakeMapWithSize(src.Type(), src.Len()))
			for it := src.MapRange(); it.Next(); {
				e := reflect.New(src.Type().Elem()).Elem()
				copyEmptyAsNil(e, it.Value())
				dst.SetMapIndex(it.Key(), e)
			}
		}
	default:
		dst.Set(src)
	}
}

func TestDecodeMatchesCorev1(t *testing.T) {
	for _, dir := range []string{filepath.Join("..", "..", "testdata", "pods"), filepath.Join("..", "..", "testdata", "istio", "injected")} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range entries {
			pod, err := kubetest.ReadPodFile(filepath.Join(dir, e.Name()))
			if err != nil {
				continue // not a single Pod (a Deployment, a stream)
			}
			pod.UID = "0b7c1a2e-5f1d-4a8e-9a55-2c6f5e8d9a01"
			pod.Status.PodIP, pod.Status.PodIPs = "198.51.100.7", []corev1.PodIP{{IP: "198.51.100.7"}, {IP: "2001:db8::7"}}
			samePod(t, e.Name(), pod)
			n++
		}
		if n == 0 && dir == filepath.Join("..", "..", "testdata", "pods") {
			t.Fatalf("no pods read from %s", dir)
		}
	}
}

// FuzzDecodeMatchesCorev1: any JSON corev1 decodes as a Pod decodes to the
// same decision fields in podget.
func FuzzDecodeMatchesCorev1(f *testing.F) {
	entries, _ := os.ReadDir(filepath.Join("..", "..", "testdata", "pods"))
	for _, e := range entries {
		if pod, err := kubetest.ReadPodFile(filepath.Join("..", "..", "testdata", "pods", e.Name())); err == nil {
			pod.Kind, pod.APIVersion = "Pod", "v1"
			if b, err := json.Marshal(pod); err == nil {
				f.Add(b)
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var pod corev1.Pod
		if json.Unmarshal(data, &pod) != nil {
			return
		}
		samePod(t, "fuzz", &pod)
	})
}

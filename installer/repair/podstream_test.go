package repair

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"reflect"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// encodedPodList is l as the API server writes it in protobuf.
func encodedPodList(t testing.TB, l *corev1.PodList) []byte {
	t.Helper()
	l.APIVersion, l.Kind = "v1", "PodList"
	var buf bytes.Buffer
	if err := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme).Encode(l, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// nodePodList is n copies of the sample and injected pods, with managed
// fields, as a node's list answer (version 77, a continue token).
func nodePodList(t testing.TB, pods []*corev1.Pod, n int) *corev1.PodList {
	l := &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "77", Continue: "next"}}
	for i := range n {
		p := pods[i%len(pods)].DeepCopy()
		p.Name = fmt.Sprintf("%s-%04d", p.Name, i)
		l.Items = append(l.Items, *p)
	}
	return l
}

// TestReadSlimPodList: a protobuf list answer read a pod at a time is the
// answer decoded whole with every pod slimmed, list metadata included; so
// is a JSON answer.
func TestReadSlimPodList(t *testing.T) {
	full := nodePodList(t, slimTestPods(t), 25)
	data := encodedPodList(t, full)
	// The answer decoded whole (as the typed client does), then slimmed.
	want := &corev1.PodList{}
	if _, _, err := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme).Decode(data, nil, want); err != nil {
		t.Fatal(err)
	}
	for i := range want.Items {
		slim, _ := SlimPod(&want.Items[i])
		want.Items[i] = *slim.(*corev1.Pod)
	}
	got, err := ReadSlimPodList(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Items) != len(full.Items) {
		t.Fatalf("streamed %d pods, want %d", len(got.Items), len(full.Items))
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("streamed list differs from the slimmed whole list (%d pods, want %d; meta %+v, want %+v)", len(got.Items), len(want.Items), got.ListMeta, want.ListMeta)
	}
	js, err := json.Marshal(full)
	if err != nil {
		t.Fatal(err)
	}
	got, err = ReadSlimPodList(bytes.NewReader(js))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatal("JSON list differs from the slimmed whole list")
	}
	empty, err := ReadSlimPodList(bytes.NewReader(encodedPodList(t, &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "9"}})))
	if err != nil || len(empty.Items) != 0 || empty.ResourceVersion != "9" {
		t.Fatalf("empty list: %+v, %v", empty, err)
	}
}

// TestReadSlimPodListBad: a cut, corrupt or foreign answer is an error
// naming what was being read, never a panic or a partial list.
func TestReadSlimPodListBad(t *testing.T) {
	good := encodedPodList(t, nodePodList(t, slimTestPods(t)[:2], 2))
	magic := string(protobufMagic)
	// The answer's fields: typeMeta (1), raw (2), content encoding (3).
	field := func(num int, body string) string {
		return string([]byte{byte(num<<3 | 2), byte(len(body))}) + body
	}
	typeMeta := field(1, field(1, "v1")+field(2, "PodList"))
	cases := []struct {
		name, data, want string
	}{
		{"cut in a pod", string(good[:len(good)/2]), "unexpected EOF"},
		{"cut in a tag", string(good[:len(magic)+1]), "unexpected EOF"},
		{"no list", magic + typeMeta, "no list in it"},
		{"other kind", magic + field(1, field(2, "Status")), `kind "Status": not a PodList`},
		{"content encoding", magic + typeMeta + field(2, "") + field(3, "gzip"), `content encoding "gzip": not supported`},
		{"two lists", magic + typeMeta + field(2, "") + field(2, ""), "two lists in one answer"},
		{"item past the list", magic + typeMeta + field(2, "\x12\x05ab"), "length 5 past the end of its list"},
		// A list of 128 MiB whose first pod claims 64 MiB and a byte.
		{"item over the bound", magic + typeMeta + "\x12\x80\x80\x80\x40" + "\x12\x81\x80\x80\x20" + "abcd", "over the 67108864 bytes one pod may take"},
		{"bad pod", magic + typeMeta + field(2, field(2, "\x0a\x05a")), "decoding pod 1"},
		{"field number 0", magic + "\x02\x00", "field number 0 out of range"},
		{"group wire type", magic + "\x0b", "wire type 3 not supported"},
		{"fixed past the list", magic + typeMeta + field(2, "\x1d\x00"), "past the end of its list"},
		{"varint too long", magic + "\x12\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", "overflows"},
		{"not JSON either", "{\"items\": [", "as JSON"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, err := ReadSlimPodList(strings.NewReader(c.data))
			if err == nil || !strings.Contains(err.Error(), c.want) || l != nil {
				t.Fatalf("got %v, %v; want an error with %q and no list", l, err, c.want)
			}
		})
	}
	// Every cut of a good answer before its list's end fails: the list's
	// length is checked (a protobuf message has no end marker, so only the
	// answer's two empty fields after the list, content encoding and type,
	// can go unnoticed).
	const trailer = "\x1a\x00\x22\x00"
	if !strings.HasSuffix(string(good), trailer) {
		t.Fatalf("the answer does not end with empty content encoding and type: % x", good[len(good)-4:])
	}
	for n := len(magic); n < len(good)-len(trailer); n++ {
		if l, err := ReadSlimPodList(bytes.NewReader(good[:n])); err == nil {
			t.Fatalf("answer cut at byte %d of %d read as %d pods", n, len(good), len(l.Items))
		}
	}
}

func FuzzReadSlimPodList(f *testing.F) {
	f.Add(encodedPodList(f, nodePodList(f, []*corev1.Pod{{ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: map[string]string{"a": "b"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "istio-proxy", Args: []string{"proxy", "sidecar"}, Env: []corev1.EnvVar{{Name: "A", Value: "1"}}}}}}}, 2)))
	f.Add([]byte("k8s\x00\x12\x00"))
	f.Add([]byte(`{"items":[{"metadata":{"name":"p"}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		l, err := ReadSlimPodList(bytes.NewReader(data))
		if (err == nil) == (l == nil) {
			t.Fatalf("list %v with error %v", l, err)
		}
	})
}

// peakHeapChild marks the process TestNodePodsListPeakHeap measures in.
const peakHeapChild = "NFTMESH_PEAK_HEAP_CHILD"

// TestNodePodsListPeakHeap: the informer's list of a full node, answered in
// one piece as the API server answers a list at resourceVersion "0" (from
// its watch cache, whatever the limit), does not raise the heap by more
// than a few times the slimmed pods it keeps. The heap is sampled while
// the list runs, garbage included (what the process's memory follows);
// decoding the answer whole held the answer, its copy and every full pod
// at once.
func TestNodePodsListPeakHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: lists a thousand pods")
	}
	// The heap is the process's: an informer another test of the package
	// left running allocates into it too (seen once: 27.2 MiB against a
	// 27.0 MiB limit). So the measurement runs in a process of its own.
	if os.Getenv(peakHeapChild) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestNodePodsListPeakHeap$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), peakHeapChild+"=1")
		out, err := cmd.CombinedOutput()
		t.Logf("in a process of its own:\n%s", out)
		if err != nil {
			t.Fatalf("the measurement failed: %v", err)
		}
		return
	}
	var injected *corev1.Pod
	for _, p := range slimTestPods(t) {
		if strings.HasPrefix(p.Name, "httpbin") {
			injected = p
		}
	}
	if injected == nil {
		t.Fatal("no injected httpbin pod in testdata")
	}
	// As the API server stores it: the fields it defaults and a managed
	// field entry per writer.
	injected.ManagedFields = []metav1.ManagedFieldsEntry{
		{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: bytes.Repeat([]byte(`{"f:spec":{}}`), 150)}},
		{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: bytes.Repeat([]byte(`{"f:status":{}}`), 150)}, Subresource: "status"},
	}
	const pods = 1000
	all := nodePodList(t, []*corev1.Pod{injected}, pods)
	all.Continue = "" // the watch cache's answer is whole
	body := encodedPodList(t, all)
	all = nil
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/vnd.kubernetes.protobuf")
		// Written as the watch cache writes it: in pieces, as encoded.
		for b := body; len(b) > 0; {
			n := min(len(b), 32<<10)
			_, _ = w.Write(b[:n])
			b = b[n:]
		}
	}))
	defer srv.Close()
	client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{
		ContentType: "application/vnd.kubernetes.protobuf", AcceptContentTypes: "application/vnd.kubernetes.protobuf,application/json"}})
	if err != nil {
		t.Fatal(err)
	}
	lw, err := NodePods{Node: "node-1"}.listWatch(client.CoreV1())
	if err != nil {
		t.Fatal(err)
	}

	defer debug.SetGCPercent(debug.SetGCPercent(100))
	// The heap's objects, garbage not yet collected included (runtime/
	// metrics reads them without stopping the world, as ReadMemStats does).
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	heap := func() uint64 {
		metrics.Read(sample)
		return sample[0].Value.Uint64()
	}
	runtime.GC()
	base := heap()
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if h := heap(); h > peak.Load() {
				peak.Store(h)
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	obj, err := lw.ListWithContextFunc(context.Background(), metav1.ListOptions{ResourceVersion: "0"})
	close(stop)
	<-sampled
	if err != nil {
		t.Fatal(err)
	}
	l := obj.(*corev1.PodList)
	runtime.GC()
	kept := heap() - min(base, heap())
	grew := peak.Load() - min(base, peak.Load())
	runtime.KeepAlive(l)
	t.Logf("%d pods, answer %d KiB: the slimmed pods kept take %d KiB; the heap grew by %d KiB at most while listing",
		len(l.Items), len(body)>>10, kept>>10, grew>>10)
	if len(l.Items) != pods {
		t.Fatalf("listed %d pods, want %d", len(l.Items), pods)
	}
	// The collector lets the heap grow to twice what is live (GOGC=100),
	// and the list's pod slices are copied as they grow: 20-24 MiB here
	// for 7.5 MiB kept, against 38-43 MiB when the answer was decoded
	// whole.
	if limit := 3*kept + 6<<20; grew > limit {
		t.Errorf("the heap grew by %d KiB while listing %d pods whose slimmed copies take %d KiB: over %d KiB", grew>>10, pods, kept>>10, limit>>10)
	}
}

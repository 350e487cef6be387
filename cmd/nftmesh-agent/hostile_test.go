package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/nftmesh/nftmesh/installer"
	"github.com/nftmesh/nftmesh/installer/podcache"
	"github.com/nftmesh/nftmesh/installer/repair"
	"github.com/nftmesh/nftmesh/internal/kubeconf"
)

// hostileSize is each hostile answer: the review's 200 MB pod.
const hostileSize = 200 << 20

// hostileChild names the case a child process of TestAgentClientBoundsHostileAnswers runs.
const hostileChild = "NFTMESH_HOSTILE_ANSWER_CHILD"

// TestAgentClientBoundsHostileAnswers: the agent's API client (the one
// repairClient builds for the repair controller, the pod socket, events
// and the node taint) reads no answer past its bound: a 200 MB pod (GET),
// a 200 MB pod list (the informer's list, JSON or protobuf), a watch event
// of 200 MB (JSON or protobuf) each fail with an error, and the process's
// peak RSS grows by a bounded amount. Each case runs in a process of its
// own, whose peak RSS is read before and after. Before, the GET, the lists
// and the JSON watch event were read whole (the review: RSS 37.7 to 275.7
// MB for one pod); the protobuf watch event was already bounded by
// apimachinery's streaming decoder (16 MiB), which this pins.
func TestAgentClientBoundsHostileAnswers(t *testing.T) {
	if c := os.Getenv(hostileChild); c != "" {
		hostileCase(t, c)
		return
	}
	if testing.Short() {
		t.Skip("-short: each case streams 200 MB")
	}
	for _, tc := range []struct {
		name      string
		maxGrowth int64 // of the peak RSS, MiB
	}{
		{"pod GET", 48},
		{"pod list JSON", 64},
		{"pod list JSON, small pods", 64},
		{"pod list protobuf", 64},
		{"pod list protobuf, large pods", 96},
		{"watch event JSON", 64},
		{"watch event protobuf", 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestAgentClientBoundsHostileAnswers$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), hostileChild+"="+tc.name)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			var growth int64 = -1
			for _, l := range strings.Split(string(out), "\n") {
				if _, v, ok := strings.Cut(l, "peak RSS growth MiB: "); ok {
					growth, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				}
				if strings.Contains(l, "hostile_test.go") || strings.Contains(l, "peak RSS") {
					t.Log(strings.TrimSpace(l))
				}
			}
			if growth < 0 || growth > tc.maxGrowth {
				t.Errorf("peak RSS grew by %d MiB, want at most %d:\n%s", growth, tc.maxGrowth, out)
			}
		})
	}
}

// hostileCase runs one case against a hostile API server and prints the
// growth of this process's peak RSS.
func hostileCase(t *testing.T, name string) {
	var watches atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		watch := r.URL.Query().Get("watch") == "true"
		if watch {
			watches.Add(1)
		}
		switch {
		case name == "pod GET":
			hostileJSON(w, `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"web-1","namespace":"shop","annotations":{"a":"`, `"}}}`)
		case strings.HasPrefix(name, "pod list") && !watch:
			if strings.Contains(name, "protobuf") {
				hostilePodListProtobuf(w, strings.HasSuffix(name, "large pods"))
				return
			}
			if strings.HasSuffix(name, "small pods") {
				hostilePodListJSON(w)
				return
			}
			hostileJSON(w, `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[{"metadata":{"name":"a","namespace":"shop","annotations":{"a":"`, `"}}}]}`)
		case strings.HasPrefix(name, "watch") && watch && watches.Load() == 1:
			if strings.HasSuffix(name, "protobuf") {
				hostileWatchProtobuf(w)
				return
			}
			hostileJSON(w, `{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"web-1","namespace":"shop","resourceVersion":"2","annotations":{"a":"`, `"}}}}`+"\n")
		case watch && strings.HasPrefix(name, "pod list"):
			// No streaming list here: the informer falls back to a list.
			http.Error(w, "no watch", http.StatusInternalServerError)
		case watch:
			<-r.Context().Done() // a quiet watch, until the client leaves
		default:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}`)
		}
	}))
	defer srv.Close()
	client := hostileClient(t, srv)
	base := resetPeakRSS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var err error
	switch {
	case name == "pod GET":
		_, err = podcache.APIGetter(client)(ctx, "shop", "web-1")
	case strings.HasPrefix(name, "pod list"):
		err = informerError(ctx, client, func() bool { return false })
	default:
		// The stream is cut, and the informer watches again.
		err = informerError(ctx, client, func() bool { return watches.Load() >= 2 })
	}
	t.Logf("%s: %v", name, err)
	if strings.HasPrefix(name, "watch") {
		if watches.Load() < 2 {
			t.Fatalf("the informer never watched again after the hostile event (%v)", err)
		}
	} else if err == nil || ctx.Err() != nil {
		t.Fatalf("err = %v, want the answer refused", err)
	}
	fmt.Printf("peak RSS growth MiB: %d\n", (peakRSS(t)-base)>>20)
}

// hostileClient is repairClient's client for srv.
func hostileClient(t *testing.T, srv *httptest.Server) corev1client.CoreV1Interface {
	t.Helper()
	dir := t.TempDir()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), ca, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("hostile-test-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := repairClient(&installer.Config{KubeAPIServer: srv.URL, ServiceAccountDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// informerError runs the node's pod informer until a list or watch call
// fails for its answer's size, or done, and returns that call's error (nil
// when done first).
func informerError(ctx context.Context, client corev1client.CoreV1Interface, done func() bool) error {
	errs := make(chan error, 1)
	inf, err := repair.NodePods{Node: "node-1", Called: func(_ context.Context, err error) {
		if errors.Is(err, kubeconf.ErrAnswerTooLarge) || err != nil && strings.Contains(err.Error(), "pods one node's list may hold") {
			select {
			case errs <- err:
			default:
			}
		}
	}}.Informer(client)
	if err != nil {
		return err
	}
	ictx, stop := context.WithCancel(ctx)
	defer stop()
	go inf.RunWithContext(ictx)
	for {
		select {
		case err := <-errs:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
			if done() {
				return nil
			}
		}
	}
}

// hostileJSON writes head, then hostileSize bytes of a string's content,
// then tail, in pieces, as JSON.
func hostileJSON(w http.ResponseWriter, head, tail string) {
	w.Header().Set("Content-Type", "application/json")
	bw := bufio.NewWriterSize(w, 1<<20)
	_, _ = bw.WriteString(head)
	chunk := []byte(strings.Repeat("x", 1<<20))
	for n := 0; n < hostileSize; n += len(chunk) {
		if _, err := bw.Write(chunk); err != nil {
			return
		}
	}
	_, _ = bw.WriteString(tail)
	_ = bw.Flush()
}

// hostilePodListJSON writes a JSON pod list answer of small pods that goes
// on for hostileSize bytes.
func hostilePodListJSON(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	bw := bufio.NewWriterSize(w, 1<<20)
	_, _ = bw.WriteString(`{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[{}`)
	for n := 0; n < hostileSize; n += 3 {
		if _, err := bw.WriteString(",{}"); err != nil {
			return
		}
	}
	_, _ = bw.WriteString("]}")
	_ = bw.Flush()
}

// hostilePodListProtobuf writes a protobuf pod list answer of small pods
// (or, large, of pods with 16 KiB of annotations, which the informer keeps)
// that goes on for hostileSize bytes: what an API server sends, only far
// more of it than a node has.
func hostilePodListProtobuf(w http.ResponseWriter, large bool) {
	w.Header().Set("Content-Type", "application/vnd.kubernetes.protobuf")
	// runtime.Unknown: field 1 TypeMeta, field 2 raw (the PodList),
	// whose field 2 items are each a Pod.
	meta := append(protoBytes(1, []byte("web-1")), protoBytes(3, []byte("shop"))...) // ObjectMeta: name, namespace
	if large {
		// ObjectMeta field 12: annotations, a map entry (key 1, value 2).
		meta = append(meta, protoBytes(12, append(protoBytes(1, []byte("a")), protoBytes(2, make([]byte, 16<<10))...))...)
	}
	pod := protoBytes(1, meta)
	item := protoBytes(2, pod)
	typeMeta := protoBytes(1, append(protoBytes(1, []byte("v1")), protoBytes(2, []byte("PodList"))...))
	count := hostileSize / len(item)
	raw := protoTag(2, uint64(count*len(item)))
	bw := bufio.NewWriterSize(w, 1<<20)
	_, _ = bw.Write([]byte("k8s\x00"))
	_, _ = bw.Write(typeMeta)
	_, _ = bw.Write(raw)
	for range count {
		if _, err := bw.Write(item); err != nil {
			return
		}
	}
	_ = bw.Flush()
}

// hostileWatchProtobuf writes one watch frame announcing hostileSize bytes,
// then as many.
func hostileWatchProtobuf(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/vnd.kubernetes.protobuf;stream=watch")
	bw := bufio.NewWriterSize(w, 1<<20)
	_ = binary.Write(bw, binary.BigEndian, uint32(hostileSize))
	chunk := make([]byte, 1<<20)
	for n := 0; n < hostileSize; n += len(chunk) {
		if _, err := bw.Write(chunk); err != nil {
			return
		}
	}
	_ = bw.Flush()
}

func protoTag(field int, n uint64) []byte {
	b := binary.AppendUvarint(nil, uint64(field<<3|2))
	return binary.AppendUvarint(b, n)
}

func protoBytes(field int, v []byte) []byte {
	return append(protoTag(field, uint64(len(v))), v...)
}

// resetPeakRSS collects garbage, resets the process's peak RSS to its RSS
// (clear_refs 5) and returns it.
func resetPeakRSS(t *testing.T) int64 {
	runtime.GC()
	debug.FreeOSMemory()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Fatalf("resetting the peak RSS: %v", err)
	}
	return statusKB(t, "VmRSS:")
}

func peakRSS(t *testing.T) int64 { return statusKB(t, "VmHWM:") }

func statusKB(t *testing.T, field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/self/status", field)
	return 0
}

package cniplugin

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"

	"github.com/nftmesh/nftmesh/installer/metrics"
	"github.com/nftmesh/nftmesh/installer/pluginlog"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// samples is how many observations a histogram series holds.
func samples(t *testing.T, h *prometheus.HistogramVec, label string) uint64 {
	t.Helper()
	var m dto.Metric
	if err := h.WithLabelValues(label).(prometheus.Histogram).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// At plugin log level warn, the plugin's info-level decisions are hidden
// from its log but still reach the agent: the agent counts every ADD
// decision and times it (and the lookups), yet prints only what the
// plugin's level lets through. Before, the agent counted only printed
// lines, so at warn a skip was never counted.
func TestDecisionsCountedAtWarn(t *testing.T) {
	for _, c := range []struct {
		level   string
		printed []string // the decision lines the agent prints, in order
	}{
		{"warn", []string{"ADD failed"}},
		{"info", []string{"ADD skip", "ADD skip", "ADD failed"}},
	} {
		t.Run(c.level, func(t *testing.T) {
			// In the mesh, but its netns is missing: an error after the
			// lookup. Not in the mesh: a skip after the lookup.
			inMesh := injectedPod(t)
			notInMesh := loadPod(t, "injected.yaml")
			notInMesh.UID = "uid-2"
			delete(notInMesh.Annotations, "sidecar.istio.io/status")
			runDir, _ := fakeAPIRunDir(t, func(w http.ResponseWriter, r *http.Request) {
				pod := inMesh
				if strings.HasSuffix(r.URL.Path, "/"+notInMesh.Name) {
					pod = notInMesh
				}
				w.Header().Set("Content-Type", "application/json")
				_ = json.NewEncoder(w).Encode(pod)
			})
			var agentLog syncBuf
			m := metrics.New()
			f := pluginlog.New(runDir, &agentLog, zerolog.InfoLevel)
			f.OnDecision = m.Decided

			add := func(pod *corev1.Pod, id string) {
				t.Helper()
				conf := directConf(t, "1.0.0", runDir, prevResultV4("1.0.0", "198.51.100.20/24"),
					map[string]any{"log_level": c.level, "exclude_namespaces": []string{"kube-system"}})
				vars := cniVars("ADD", "/run/netns/nonexistent", id, cniArgsFor(pod, id))
				vars["CNI_NETNS_OVERRIDE"] = "1"
				runSkel(t, vars, conf)
			}
			excluded := notInMesh.DeepCopy()
			excluded.Namespace = "kube-system"
			add(excluded, "ctr-excluded") // skip before any lookup
			add(notInMesh, "ctr-skip")
			add(inMesh, "ctr-error")
			f.Drain()

			if got := testutil.ToFloat64(m.PluginEvents.WithLabelValues("ADD", "skip")); got != 2 {
				t.Errorf("ADD skips counted: %v, want 2", got)
			}
			if got := testutil.ToFloat64(m.PluginEvents.WithLabelValues("ADD", "error")); got != 1 {
				t.Errorf("ADD errors counted: %v, want 1", got)
			}
			if n := samples(t, m.AddDuration, "skip"); n != 2 {
				t.Errorf("ADD duration skip samples %d, want 2", n)
			}
			if n := samples(t, m.AddDuration, "error"); n != 1 {
				t.Errorf("ADD duration error samples %d, want 1", n)
			}
			if n := samples(t, m.LookupDuration, "ADD"); n != 2 {
				t.Errorf("lookup samples %d, want 2 (the excluded pod is never looked up)", n)
			}
			var printed []string
			for _, l := range strings.Split(strings.TrimSpace(agentLog.String()), "\n") {
				var v map[string]any
				if json.Unmarshal([]byte(l), &v) == nil && v["decision"] != nil {
					printed = append(printed, v["message"].(string))
					if _, ok := v["record_only"]; ok {
						t.Errorf("the agent printed a record-only line: %s", l)
					}
				}
			}
			if strings.Join(printed, "|") != strings.Join(c.printed, "|") {
				t.Errorf("agent printed %q, want %q\n%s", printed, c.printed, agentLog.String())
			}
		})
	}
}

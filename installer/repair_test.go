package installer

import (
	"io"

	"github.com/rs/zerolog"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestBrokenPodDetection(t *testing.T) {
	cfg, err := ParseConfig([]string{"--service-account-dir=", "--repair-enabled", "--repair-label-pods", "--node-name", "n"}, testEnv(nil))
	if err != nil {
		t.Fatal(err)
	}
	rc := cfg.Repair
	term := func(code int32, reason, msg string) *corev1.ContainerStateTerminated {
		return &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason, Message: msg}
	}
	pod := func(annotated bool, name string, cur, last *corev1.ContainerStateTerminated) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}}
		if annotated {
			p.Annotations = map[string]string{"sidecar.istio.io/status": "{}"}
		}
		st := corev1.ContainerStatus{Name: name}
		st.State.Terminated = cur
		st.LastTerminationState.Terminated = last
		p.Status.InitContainerStatuses = []corev1.ContainerStatus{st}
		return p
	}
	cases := []struct {
		name string
		pod  *corev1.Pod
		cfg  func(RepairConfig) RepairConfig
		want bool
	}{
		{"last exit 126", pod(true, "istio-validation", nil, term(126, "Error", "")), nil, true},
		{"no sidecar annotation", pod(false, "istio-validation", nil, term(126, "Error", "")), nil, false},
		{"other init container", pod(true, "init", nil, term(126, "Error", "")), nil, false},
		{"other exit code", pod(true, "istio-validation", nil, term(1, "Error", "")), nil, false},
		{"passed since", pod(true, "istio-validation", term(0, "Completed", ""), term(126, "Error", "")), nil, false},
		{"never terminated", pod(true, "istio-validation", nil, nil), nil, false},
		{"any exit code", pod(true, "istio-validation", nil, term(3, "Error", "")), func(c RepairConfig) RepairConfig { c.InitContainerExitCode = 0; return c }, true},
		{"message filter matches", pod(true, "istio-validation", nil, term(126, "Error", "iptables validation failed")), func(c RepairConfig) RepairConfig {
			c.InitContainerTerminationMessage = "validation failed"
			return c
		}, true},
		{"message filter misses", pod(true, "istio-validation", nil, term(126, "Error", "other")), func(c RepairConfig) RepairConfig {
			c.InitContainerTerminationMessage = "validation failed"
			return c
		}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := rc
			if c.cfg != nil {
				cfg = c.cfg(cfg)
			}
			if got := BrokenPod(c.pod, cfg); got != c.want {
				t.Errorf("BrokenPod = %v, want %v", got, c.want)
			}
		})
	}
}

func TestNewRepairControllerRefusesInPlaceWithoutRepairer(t *testing.T) {
	cfg, err := ParseConfig([]string{"--service-account-dir=", "--repair-enabled", "--repair-pods", "--node-name", "n"}, testEnv(nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewRepairController(nil, cfg.Repair, nil, testLogger(), nil); err != ErrNoInPlaceRepair {
		t.Errorf("err = %v, want ErrNoInPlaceRepair", err)
	}
}

func testLogger() zerolog.Logger { return zerolog.New(io.Discard) }

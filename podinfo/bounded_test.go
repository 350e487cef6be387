package podinfo

import (
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/podinfo/cniconf"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
)

// TestHugeValuesBounded: every parser of pod and plugin input quotes a
// huge bad value by its start and a note of how much was cut, so the CNI
// error and the log line stay a few KiB.
func TestHugeValuesBounded(t *testing.T) {
	const mib = 1 << 20
	huge := strings.Repeat("z", mib)
	const cut = "bytes cut)"
	for _, tc := range []struct {
		name string
		err  func() error
		want []string
	}{
		{"plugin config backend", func() error {
			_, err := cniconf.ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"n","type":"nftmesh-cni","backend":"` + huge + `"}`))
			return err
		}, []string{`"backend"`, `"zzz`, cut}},
		{"plugin config log level", func() error {
			_, err := cniconf.ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"n","type":"nftmesh-cni","log_level":"` + huge + `"}`))
			return err
		}, []string{`"log_level"`, cut}},
		{"CNI_ARGS pair", func() error {
			_, err := cniconf.ParseK8sArgs("K8S_POD_NAME=web;" + huge)
			return err
		}, []string{"CNI_ARGS", `"zzz`, cut}},
		{"pod annotation", func() error {
			p := meshPod()
			p.Annotations[redirect.AnnotationExcludeOutboundIPRanges] = huge
			_, _, _, err := FromPod(p)
			return err
		}, []string{meshPod().Name, redirect.AnnotationExcludeOutboundIPRanges, cut}},
		{"proxy env", func() error {
			p := meshPod()
			setEnv(p, meshpod.EnvDNSCapture, huge)
			_, _, _, err := FromPod(p)
			return err
		}, []string{meshpod.EnvDNSCapture, cut}},
		{"pod name in a manifest", func() error {
			p := meshPod()
			p.Name = huge
			p.Annotations[redirect.AnnotationInterceptionMode] = "BOGUS"
			_, _, _, err := FromPod(p)
			return err
		}, []string{"reading capture settings of pod", cut, `"BOGUS"`}},
		{"manifest kind", func() error {
			_, err := kubetest.ParsePod([]byte("kind: " + huge + "\n"))
			return err
		}, []string{"manifest kind", cut}},
		{"manifest kind, decision mirror", func() error {
			_, err := parseManifest([]byte("kind: " + huge + "\n"))
			return err
		}, []string{"manifest kind", cut}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.err()
			if err == nil {
				t.Fatal("a huge invalid value was accepted")
			}
			msg := err.Error()
			if len(msg) > 4<<10 {
				t.Errorf("error is %d bytes: %.300s...", len(msg), msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %.600q does not contain %q", msg, w)
				}
			}
		})
	}
}

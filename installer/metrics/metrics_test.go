package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Every install result lands under Istio's label value (upper case, as
// Istio's installer writes them), and a result Istio does not have stays
// out of its series.
func TestIstioInstallResultNames(t *testing.T) {
	m := New()
	for _, r := range []string{ResultSuccess, ResultCopyBinaries, ResultKubeconfig, ResultCNIConfig, ResultWaitingForPrimary} {
		m.Install(r)
	}
	for ours, istio := range map[string]string{
		ResultSuccess: "SUCCESS", ResultCopyBinaries: "COPY_BINARIES_FAILURE",
		ResultKubeconfig: "CREATE_KUBECONFIG_FAILURE", ResultCNIConfig: "CREATE_CNI_CONFIG_FAILURE",
	} {
		if got := testutil.ToFloat64(m.IstioInstalls.WithLabelValues(istio)); got != 1 {
			t.Errorf("istio_cni_installs_total{result=%q} = %v after one %s", istio, got, ours)
		}
	}
	if n := testutil.CollectAndCount(m.IstioInstalls); n != 4 {
		t.Errorf("istio_cni_installs_total has %d series, want 4 (no waiting_for_primary)", n)
	}
	m.SetReady(true)
	if testutil.ToFloat64(m.IstioReady) != 1 || testutil.ToFloat64(m.Ready) != 1 {
		t.Error("readiness gauges disagree")
	}
	m.Repaired("delete", "fail")
	if testutil.ToFloat64(m.IstioRepairs.WithLabelValues("delete", "fail")) != 1 {
		t.Error("istio_cni_repair_pods_repaired_total{type=delete,result=fail} not counted")
	}
}

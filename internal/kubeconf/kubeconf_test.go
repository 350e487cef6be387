package kubeconf

import (
	"encoding/json"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// TestJSONReadBack: the JSON file is valid JSON and client-go reads the
// same config back from it.
func TestJSONReadBack(t *testing.T) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: "https://10.96.0.1:443", CertificateAuthorityData: []byte("-----BEGIN CERTIFICATE-----\nx\n")}
	cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: "tok"}
	cfg.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "x"
	b, err := JSON(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(b) {
		t.Fatalf("not JSON:\n%s", b)
	}
	back, err := clientcmd.Load(b)
	if err != nil {
		t.Fatal(err)
	}
	if back.CurrentContext != "x" || back.Clusters["c"].Server != "https://10.96.0.1:443" || string(back.Clusters["c"].CertificateAuthorityData) != string(cfg.Clusters["c"].CertificateAuthorityData) || back.AuthInfos["u"].Token != "tok" {
		t.Fatalf("read back %+v", back)
	}
}

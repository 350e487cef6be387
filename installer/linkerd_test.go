package installer

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestLinkerdSettingsFromEnv(t *testing.T) {
	env := map[string]string{
		"NFTMESH_LINKERD":                         "true",
		"NFTMESH_LINKERD_PROXY_UID":               "2200",
		"NFTMESH_LINKERD_INBOUND_PORTS_TO_IGNORE": "4190,4191,8100-8102",
		"NFTMESH_LINKERD_SUBNETS_TO_IGNORE":       "10.0.0.0/8",
		"NFTMESH_LINKERD_IPV6":                    "true",
	}
	c, err := ParseConfig([]string{"--service-account-dir="}, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	var entry struct {
		Linkerd map[string]any `json:"linkerd"`
	}
	if err := json.Unmarshal(c.PluginConf().JSON(), &entry); err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(entry.Linkerd)
	want := `{"inbound-ports-to-ignore":["4190","4191","8100-8102"],"incoming-proxy-port":4143,"ipv6":true,"outgoing-proxy-port":4140,"proxy-gid":-1,"proxy-uid":2200,"subnets-to-ignore":["10.0.0.0/8"]}`
	if string(got) != want {
		t.Fatalf("linkerd entry %s, want %s", got, want)
	}
	if !c.Repair.Linkerd {
		t.Error("--linkerd did not turn on the repair of Linkerd pods")
	}
	// Without --linkerd, no entry: the plugin keeps linkerd2-cni's defaults.
	c, err = ParseConfig([]string{"--service-account-dir="}, func(string) (string, bool) { return "", false })
	if err != nil || strings.Contains(string(c.PluginConf().JSON()), "linkerd") || c.Repair.Linkerd {
		t.Fatalf("entry without --linkerd: %s, %v", c.PluginConf().JSON(), err)
	}
}

func TestLinkerdSettingsBad(t *testing.T) {
	for args, want := range map[string]string{
		"--linkerd-outgoing-proxy-port=70000":      `--linkerd-outgoing-proxy-port: "70000" is not a port`,
		"--linkerd-subnets-to-ignore=10.0.0.1":     `--linkerd-subnets-to-ignore: "10.0.0.1" is not a CIDR`,
		"--linkerd-outbound-ports-to-ignore=https": `--linkerd-outbound-ports-to-ignore: "https" is not a port`,
		"--linkerd-proxy-uid=0":                    `--linkerd-proxy-uid: "0" is not a proxy user id`,
	} {
		_, err := ParseConfig([]string{"--service-account-dir=", "--linkerd", args}, func(string) (string, bool) { return "", false })
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want it to say %s", args, err, want)
		}
	}
}

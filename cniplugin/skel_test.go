package cniplugin

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/nftmesh/nftmesh/nft"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// runSkel drives the plugin in-process as its own process runs it (the CNI
// library's skel, with the version checks for CHECK/STATUS/GC), with CNI_*
// env and stdin, and returns what it printed on stdout.
func runSkel(t *testing.T, vars map[string]string, stdin []byte) (string, *types.Error) {
	t.Helper()
	for _, k := range []string{"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH", "CNI_NETNS_OVERRIDE"} {
		t.Setenv(k, vars[k])
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = inW.Write(stdin); inW.Close() }()
	outc := make(chan []byte)
	go func() { b, _ := io.ReadAll(outR); outc <- b }()
	oldIn, oldOut := os.Stdin, os.Stdout
	os.Stdin, os.Stdout = inR, outW
	cerr := skelMain()
	if cerr != nil {
		// The real main prints the error JSON; do the same to check it.
		_ = cerr.Print()
	}
	os.Stdin, os.Stdout = oldIn, oldOut
	outW.Close()
	inR.Close()
	return string(<-outc), cerr
}

func cniVars(cmd, netnsPath, id, args string) map[string]string {
	return map[string]string{
		"CNI_COMMAND":     cmd,
		"CNI_CONTAINERID": id,
		"CNI_NETNS":       netnsPath,
		"CNI_IFNAME":      "eth0",
		"CNI_ARGS":        args,
		"CNI_PATH":        "/nonexistent",
	}
}

// TestSkel110Verbs runs every verb at cniVersion 1.1.0 (which the reference
// plugins cannot speak) in-process, with a prevResult as a primary plugin
// would pass it.
func TestSkel110Verbs(t *testing.T) {
	needEnv(t)
	runDir := agentRunDir(t, env.token)
	pod := createPod(t, env.api, loadPod(t, "injected.yaml"))
	_, nsPath := nstest.New(t, "cni-pod-")
	id := "ctr-" + nstest.RandHex(6)
	args := cniArgsFor(pod, id)
	prev := prevResultV4("1.1.0", "198.51.100.20/24")
	conf := directConf(t, "1.1.0", runDir, prev, nil)

	out, cerr := runSkel(t, cniVars("ADD", nsPath, id, args), conf)
	if cerr != nil {
		t.Fatalf("ADD: %v", cerr)
	}
	got, err := current.NewResult([]byte(out))
	if err != nil {
		t.Fatalf("ADD printed %q: %v", out, err)
	}
	prevJSON, _ := json.Marshal(prev)
	want, err := current.NewResult(prevJSON)
	if err != nil {
		t.Fatal(err)
	}
	if mustJSON(got) != mustJSON(want) {
		t.Fatalf("ADD did not pass prevResult through unchanged:\n got %s\nwant %s", mustJSON(got), mustJSON(want))
	}
	if err := nft.New().Check(context.Background(), nsPath, wantPlan(t, pod, false)); err != nil {
		t.Fatal(err)
	}

	if _, cerr := runSkel(t, cniVars("CHECK", nsPath, id, args), conf); cerr != nil {
		t.Fatalf("CHECK: %v", cerr)
	}
	gc := directConf(t, "1.1.0", runDir, nil, map[string]any{
		"cni.dev/valid-attachments": []any{map[string]any{"containerID": id, "ifname": "eth0"}},
	})
	if _, cerr := runSkel(t, cniVars("GC", "", "", ""), gc); cerr != nil {
		t.Fatalf("GC: %v", cerr)
	}
	if _, cerr := runSkel(t, cniVars("STATUS", "", "", ""), directConf(t, "1.1.0", runDir, nil, nil)); cerr != nil {
		t.Fatalf("STATUS with a kubeconfig: %v", cerr)
	}
	if _, cerr := runSkel(t, cniVars("DEL", nsPath, id, args), conf); cerr != nil {
		t.Fatalf("DEL: %v", cerr)
	}
	assertNoRules(t, nsPath)
	if _, cerr := runSkel(t, cniVars("DEL", nsPath, id, args), conf); cerr != nil {
		t.Fatalf("second DEL: %v", cerr)
	}
}

// The tests below need neither root nor the API server.

func TestSkelStatusNotReady(t *testing.T) {
	runDir := t.TempDir() // no kubeconfig: the agent has not run yet
	out, cerr := runSkel(t, cniVars("STATUS", "", "", ""), directConf(t, "1.1.0", runDir, nil, nil))
	if cerr == nil || cerr.Code != types.ErrPluginNotAvailable {
		t.Fatalf("STATUS without kubeconfig = %v, want code %d", cerr, types.ErrPluginNotAvailable)
	}
	if !strings.Contains(cerr.Msg, filepath.Join(runDir, "kubeconfig")) || !strings.Contains(out, `"code": 50`) {
		t.Fatalf("STATUS error %v / stdout %q does not name the kubeconfig", cerr, out)
	}
	if err := os.WriteFile(filepath.Join(runDir, "kubeconfig"), []byte("{not yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, cerr := runSkel(t, cniVars("STATUS", "", "", ""), directConf(t, "1.1.0", runDir, nil, nil)); cerr == nil {
		t.Fatal("STATUS with an invalid kubeconfig: want not available")
	}
	// STATUS does not exist before 1.1.0; skel refuses it.
	if _, cerr := runSkel(t, cniVars("STATUS", "", "", ""), directConf(t, "1.0.0", runDir, nil, nil)); cerr == nil || cerr.Code != types.ErrIncompatibleCNIVersion {
		t.Fatalf("STATUS at 1.0.0 = %v, want incompatible version", cerr)
	}
}

func TestSkelVersion(t *testing.T) {
	out, cerr := runSkel(t, map[string]string{"CNI_COMMAND": "VERSION"}, nil)
	if cerr != nil {
		t.Fatal(cerr)
	}
	var v struct {
		Supported []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatal(err)
	}
	if strings.Join(v.Supported, ",") != "0.3.1,0.4.0,1.0.0,1.1.0" {
		t.Fatalf("supported versions %v", v.Supported)
	}
}

// TestSkelPassthroughWithoutPrevResult: a skipped pod with no prevResult
// gets an empty result of the config's version; the namespace is
// excluded, so no API and no netns are needed.
func TestSkelPassthroughWithoutPrevResult(t *testing.T) {
	for _, v := range []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			vars := cniVars("ADD", "/run/netns/does-not-matter", "ctr-1", "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-1")
			vars["CNI_NETNS_OVERRIDE"] = "1"
			conf := directConf(t, v, t.TempDir(), nil, map[string]any{"exclude_namespaces": []string{"kube-system"}})
			out, cerr := runSkel(t, vars, conf)
			if cerr != nil {
				t.Fatal(cerr)
			}
			var r map[string]any
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatalf("stdout %q is not one JSON result: %v", out, err)
			}
			if r["cniVersion"] != v {
				t.Fatalf("result %s has the wrong version (want %s)", out, v)
			}
		})
	}
	// Not a Kubernetes pod at all (no K8S_* args): pass through too.
	vars := cniVars("ADD", "/run/netns/x", "ctr-2", "")
	vars["CNI_NETNS_OVERRIDE"] = "1"
	if _, cerr := runSkel(t, vars, directConf(t, "1.0.0", t.TempDir(), nil, nil)); cerr != nil {
		t.Fatal(cerr)
	}
}

func TestSkelBadInput(t *testing.T) {
	tests := []struct {
		name string
		conf []byte
		args string
		code uint
		want string
	}{
		{"wrong field type", []byte(`{"cniVersion":"1.0.0","name":"n","type":"nftmesh-cni","api_timeout":30}`), "K8S_POD_NAMESPACE=a;K8S_POD_NAME=b",
			types.ErrInvalidNetworkConfig, `"api_timeout"`},
		{"bad backend", []byte(`{"cniVersion":"1.0.0","name":"n","type":"nftmesh-cni","backend":"ebpf"}`), "K8S_POD_NAMESPACE=a;K8S_POD_NAME=b",
			types.ErrInvalidNetworkConfig, `"ebpf"`},
		{"bad CNI_ARGS", []byte(`{"cniVersion":"1.0.0","name":"n","type":"nftmesh-cni"}`), "K8S_POD_NAME",
			types.ErrInvalidEnvironmentVariables, "K8S_POD_NAME"},
		{"bad prevResult", []byte(`{"cniVersion":"1.0.0","name":"n","type":"nftmesh-cni","prevResult":{"ips":[{"address":"nonsense"}]}}`), "",
			types.ErrDecodingFailure, "prevResult"},
		{"missing kubeconfig fails closed", []byte(`{"cniVersion":"1.0.0","name":"n","type":"nftmesh-cni","agent_run_dir":"/nonexistent/nftmesh"}`),
			"K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-1", types.ErrTryAgainLater, "/nonexistent/nftmesh/kubeconfig"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vars := cniVars("ADD", "/run/netns/x", "ctr-1", tt.args)
			vars["CNI_NETNS_OVERRIDE"] = "1"
			out, cerr := runSkel(t, vars, tt.conf)
			if cerr == nil {
				t.Fatalf("ADD succeeded, printed %s", out)
			}
			if cerr.Code != tt.code || !strings.Contains(cerr.Error(), tt.want) {
				t.Fatalf("ADD error = %d %v, want code %d mentioning %s", cerr.Code, cerr, tt.code, tt.want)
			}
			var printed types.Error
			if err := json.Unmarshal([]byte(out), &printed); err != nil || printed.Code != tt.code {
				t.Fatalf("stdout %q is not the CNI error JSON", out)
			}
		})
	}
}

// TestGuardPanics: a panic becomes a CNI error rather than a crash.
func TestGuardPanics(t *testing.T) {
	err := (&run{env: osEnv()}).guard("ADD", func(*cmdArgs) error { panic("boom") })(&cmdArgs{})
	var te *types.Error
	if !errors.As(err, &te) || te.Code != types.ErrInternal || !strings.Contains(te.Error(), "boom") {
		t.Fatalf("guard = %v", err)
	}
}

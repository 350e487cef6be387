package charts

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"

	"github.com/nftmesh/nftmesh/testkit/kubetest"
)

// helmError is the message helm printed for a failed render: install's and
// template's "Error: ..." (without install's "INSTALLATION FAILED: "), or
// lint's "[ERROR] templates/: ...", up to the blank line that ends it.
func helmError(t *testing.T, out string, err error) string {
	t.Helper()
	if err == nil {
		t.Fatalf("helm accepted the values:\n%.300s", out)
	}
	text := out + "\n" + err.Error()
	for _, start := range []string{"[ERROR] templates/: ", "Error: INSTALLATION FAILED: ", "Error: "} {
		if i := strings.Index(text, start); i >= 0 {
			msg, _, _ := strings.Cut(text[i+len(start):], "\n\n")
			return strings.TrimSpace(msg)
		}
	}
	t.Fatalf("no error message in helm's output:\n%s", text)
	return ""
}

// plainRefusal matches the chart's refusal as helm prints a template's
// fail: its location, then the message, and no template internals.
var plainRefusal = regexp.MustCompile(`^execution error at \(nftmesh/templates/zz_values\.yaml:\d+:\d+\): nftmesh's chart refuses \d+ value\(s\):\n- `)

// Bad values: helm lint fails with exactly the message helm template (and
// install, below) prints, which is the chart's own, without "error calling
// include", the template's source or Go's quoting of the message's
// newlines. helm lint turns fail into a log line and renders on, so the
// chart must stop lint another way (nftmesh.fail).
func TestLintRefusesAsInstallDoes(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"ambient", []string{"--set", "ambient.enabled=true"}, []string{"- ambient.enabled=true: Istio's ambient mode; nftmesh captures traffic for sidecar pods only"}},
		{"ambient profile", []string{"--set", "profile=ambient"}, []string{"- profile=ambient: "}},
		{"umbrella ambient", []string{"--set", "cni.ambient.enabled=true"}, []string{"- ambient.enabled=true: "}},
		{"misspelled key", []string{"--set", "repiar.enabled=false"}, []string{"- repiar: unknown key; did you mean repair?"}},
		{"capability", []string{"--set", "addCapabilities[0]=CAP_NET_ADMIN"}, []string{"- addCapabilities[0]=CAP_NET_ADMIN: not a capability name; did you mean NET_ADMIN?"}},
		{"several", []string{"--set", "ambient.enabled=true", "--set", "platform=gcp", "--set", "image.tag=v1", "--set", "nftmesh.image.tagg=v1"},
			[]string{"refuses 4 value(s)", "\n- ambient.enabled=true: ", "\n- platform=gcp: unknown", "\n- image.repository/image.tag: ", "\n- nftmesh.image.tagg: unknown key; did you mean nftmesh.image.tag?"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := runHelm(t, append([]string{"template", "nftmesh", chartDir}, c.args...)...)
			install := helmError(t, out, err)
			out, err = runHelm(t, append([]string{"lint", "--strict", chartDir}, c.args...)...)
			lint := helmError(t, out, err)
			if lint != install {
				t.Errorf("helm lint says\n%s\nhelm template says\n%s", lint, install)
			}
			if !plainRefusal.MatchString(lint) {
				t.Errorf("not the chart's plain refusal:\n%s", lint)
			}
			for _, noise := range []string{"error calling", "executing", "HELM_ERR", `\n`, "range can't"} {
				if strings.Contains(lint, noise) {
					t.Errorf("lint's message has template noise %q:\n%s", noise, lint)
				}
			}
			for _, w := range c.want {
				if !strings.Contains(lint, w) {
					t.Errorf("message lacks %q:\n%s", w, lint)
				}
			}
		})
	}
}

// helm install against a real API server prints the same message as lint.
func TestInstallRefusalReadsAsLint(t *testing.T) {
	helm(t)
	s := kubetest.Start(t)
	kc := filepath.Join(t.TempDir(), "admin.kubeconfig")
	if err := s.WriteKubeconfig(kc, s.AdminToken()); err != nil {
		t.Fatal(err)
	}
	out, err := runHelm(t, "install", "nftmesh", chartDir, "--kubeconfig", kc, "-n", agentNS, "--create-namespace", "--set", "ambient.enabled=true")
	install := helmError(t, out, err)
	out, err = runHelm(t, "lint", chartDir, "--set", "ambient.enabled=true")
	if lint := helmError(t, out, err); lint != install {
		t.Errorf("helm lint says\n%s\nhelm install says\n%s", lint, install)
	}
}

// A key the chart does not know is refused with the closest known one at
// its level (case ignored, a third of its letters apart at most), with its
// full path; a key nothing is near is refused without a guess. Istio's
// names are known (read, ignored or refused for their own reason).
func TestMisspelledKeysNameTheClosest(t *testing.T) {
	cases := []struct{ set, want string }{
		{"addCapabilites[0]=NET_ADMIN", "addCapabilites: unknown key; did you mean addCapabilities?"},
		{"cnibindir=/opt/cni/bin", "cnibindir: unknown key; did you mean cniBinDir?"},
		{"excludeNamespace[0]=x", "excludeNamespace: unknown key; did you mean excludeNamespaces?"},
		{"repair.repairpods=true", "repair.repairpods: unknown key; did you mean repair.repairPods?"},
		{"repair.deletPods=true", "repair.deletPods: unknown key; did you mean repair.deletePods?"},
		{"nftmesh.imag.tag=v1", "nftmesh.imag: unknown key; did you mean nftmesh.image?"},
		{"nftmesh.image.repo=r", "nftmesh.image.repo: unknown key (`helm show readme` on the chart lists every key)"},
		{"resources.limit.memory=1Gi", "resources.limit: unknown key; did you mean resources.limits?"},
		{"global.defaultResources.request.cpu=1", "global.defaultResources.request: unknown key; did you mean global.defaultResources.requests?"},
		{"seccompProfile.typ=RuntimeDefault", "seccompProfile.typ: unknown key; did you mean seccompProfile.type?"},
		{"nodeTaint.enable=false", "nodeTaint.enable: unknown key; did you mean nodeTaint.enabled?"},
		{"cni.repiar.enabled=false", "repiar: unknown key; did you mean repair?"},
		{"_internal_defaults_do_not_set.chaind=false", "chaind: unknown key; did you mean chained?"},
		{"frobnicate=1", "frobnicate: unknown key (`helm show readme` on the chart lists every key)"},
	}
	for _, c := range cases {
		t.Run(c.set, func(t *testing.T) {
			out, err := runHelm(t, "template", "nftmesh", chartDir, "--set", c.set)
			if msg := helmError(t, out, err); !strings.Contains(msg, "\n- "+c.want) {
				t.Errorf("want %q in:\n%s", c.want, msg)
			}
		})
	}
	// The same keys in an Istio values file's defaults layer.
	f := filepath.Join(t.TempDir(), "v.yaml")
	if err := os.WriteFile(f, []byte("defaults:\n  cni:\n    cniConfDri: /etc/cni/net.d\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runHelm(t, "template", "nftmesh", chartDir, "-f", f)
	if msg := helmError(t, out, err); !strings.Contains(msg, "- cniConfDri: unknown key; did you mean cniConfDir?") {
		t.Errorf("defaults layer: %s", msg)
	}
	// Free-form maps and Istio's keys are not typos.
	render(t, "--set", "podLabels.team=a", "--set", "env.MY_VAR=1", "--set", "global.proxy.autoInject=disabled",
		"--set", "pilot.taint.enabled=true", "--set", "ambient.dnsCapture=false", "--set", "nodeSelector.pool=x")
}

// An addCapabilities entry that is not a capability name is refused naming
// the entry and, where one is near, the name meant.
func TestAddCapabilitiesNamesTheValue(t *testing.T) {
	cases := []struct{ set, want string }{
		{"addCapabilities[0]=CAP_NET_ADMIN", "addCapabilities[0]=CAP_NET_ADMIN: not a capability name; did you mean NET_ADMIN?"},
		{"addCapabilities[0]=dac_override", "addCapabilities[0]=dac_override: not a capability name; did you mean DAC_OVERRIDE?"},
		{"addCapabilities[0]=cap_sys_time", "addCapabilities[0]=cap_sys_time: not a capability name; did you mean SYS_TIME?"},
		{"addCapabilities[0]=DAC_OVERIDE", "addCapabilities[0]=DAC_OVERIDE: not a capability name; did you mean DAC_OVERRIDE?"},
		{"addCapabilities[0]=FLY", "addCapabilities[0]=FLY: not a capability name (Linux's capabilities, without CAP_, e.g. DAC_OVERRIDE)"},
		{"addCapabilities[1]=NET_RAWW", "addCapabilities[1]=NET_RAWW: not a capability name; did you mean NET_RAW?"},
	}
	for _, c := range cases {
		t.Run(c.set, func(t *testing.T) {
			args := []string{"template", "nftmesh", chartDir, "--set", c.set}
			if strings.HasPrefix(c.set, "addCapabilities[1]") {
				args = append(args, "--set", "addCapabilities[0]=BPF")
			}
			out, err := runHelm(t, args...)
			if msg := helmError(t, out, err); !strings.Contains(msg, "\n- "+c.want) {
				t.Errorf("want %q in:\n%s", c.want, msg)
			}
		})
	}
	caps := render(t, "--set", "addCapabilities[0]=CHECKPOINT_RESTORE", "--set", "addCapabilities[1]=ALL").ds(t).Spec.Template.Spec.Containers[0].SecurityContext.Capabilities.Add
	if !slices.Contains(caps, "CHECKPOINT_RESTORE") || !slices.Contains(caps, "ALL") {
		t.Errorf("valid capabilities not added: %v", caps)
	}
}

// knownValues is files/known-values.yaml.
type knownValues struct {
	Keys         map[string][]string `json:"keys"`
	Capabilities []string            `json:"capabilities"`
}

func readKnownValues(t *testing.T) knownValues {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, "files", "known-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k knownValues
	if err := yaml.UnmarshalStrict(b, &k); err != nil {
		t.Fatal(err)
	}
	return k
}

// schemaNode is the part of a JSON schema the key tables are checked against.
type schemaNode struct {
	Ref                  string                 `json:"$ref"`
	Properties           map[string]*schemaNode `json:"properties"`
	AdditionalProperties any                    `json:"additionalProperties"`
	Definitions          map[string]*schemaNode `json:"definitions"`
}

// The chart's key tables and the schema name the same keys for the same
// objects, and the schema leaves those objects' unknown keys to the chart
// (a schema that refuses them first would hide "did you mean"); the
// capability list has every capability of the kernel headers x/sys knows.
func TestKnownValuesMatchSchema(t *testing.T) {
	known := readKnownValues(t)
	b, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var root schemaNode
	if err := json.Unmarshal(b, &root); err != nil {
		t.Fatal(err)
	}
	resolve := func(n *schemaNode) *schemaNode {
		for n != nil && n.Ref != "" {
			n = root.Definitions[strings.TrimPrefix(n.Ref, "#/definitions/")]
		}
		return n
	}
	for path, keys := range known.Keys {
		n := resolve(&root)
		if path != "" {
			for _, p := range strings.Split(path, ".") {
				n = resolve(n.Properties[p])
				if n == nil {
					t.Fatalf("%s: not in the schema", path)
				}
			}
		}
		var props []string
		for k := range n.Properties {
			props = append(props, k)
		}
		slices.Sort(props)
		sorted := slices.Sorted(slices.Values(keys))
		if !slices.Equal(props, sorted) {
			t.Errorf("%q: schema has %v, known-values.yaml %v", path, props, sorted)
		}
		if n.AdditionalProperties == false {
			t.Errorf("%q: the schema refuses unknown keys before the chart can name the closest", path)
		}
	}
	if distinct := slices.Compact(slices.Sorted(slices.Values(known.Capabilities))); len(distinct) != unix.CAP_LAST_CAP+1 || len(known.Capabilities) != len(distinct) {
		t.Errorf("%d capabilities listed (%d distinct), the kernel has %d", len(known.Capabilities), len(distinct), unix.CAP_LAST_CAP+1)
	}
	if i := slices.Index(known.Capabilities, "CHECKPOINT_RESTORE"); i != unix.CAP_CHECKPOINT_RESTORE {
		t.Errorf("capabilities not in the kernel's order: CHECKPOINT_RESTORE at %d", i)
	}
}

package main

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/redirect"
)

var (
	jsonMatchKinds   = map[string]bool{"proto": true, "port": true, "addr": true, "set": true, "iface": true, "owner": true, "mark": true, "ctstate": true}
	jsonVerdictKinds = map[string]bool{"accept": true, "drop": true, "return": true, "jump": true, "redirect": true, "tproxy": true, "setMark": true, "saveMark": true, "restoreMark": true, "setCTZone": true}
)

// TestPlanJSONKinds: every match and verdict type has a kind of the JSON
// vocabulary, and the document carries no Go type names.
func TestPlanJSONKinds(t *testing.T) {
	matches := []redirect.Match{
		redirect.MatchProto{Proto: redirect.ProtoTCP},
		redirect.MatchPort{Ports: []uint16{80}, Negate: true},
		redirect.MatchAddr{Prefix: netip.MustParsePrefix("10.0.0.0/8")},
		redirect.MatchSet{Set: "s", Kind: redirect.SetPort},
		redirect.MatchIface{Name: "lo"},
		redirect.MatchOwner{ID: 1337},
		redirect.MatchMark{Value: 1},
		redirect.MatchCTState{States: redirect.CTStateInvalid},
	}
	verdicts := []redirect.Verdict{
		redirect.Accept{}, redirect.Drop{}, redirect.Return{}, redirect.Jump{Chain: "X"},
		redirect.Redirect{Port: 15001}, redirect.TProxy{Port: 15006, Mark: 1337}, redirect.SetMark{Mark: 1},
		redirect.SaveMark{}, redirect.RestoreMark{}, redirect.SetCTZone{Zone: 1},
	}
	seenM, seenV := map[string]bool{}, map[string]bool{}
	for _, m := range matches {
		k := jsonKinds[reflect.TypeOf(m)]
		if !jsonMatchKinds[k] || seenM[k] {
			t.Errorf("match %T: kind %q (unknown or not unique)", m, k)
		}
		seenM[k] = true
	}
	for _, v := range verdicts {
		k := jsonKinds[reflect.TypeOf(v)]
		if !jsonVerdictKinds[k] || seenV[k] {
			t.Errorf("verdict %T: kind %q (unknown or not unique)", v, k)
		}
		seenV[k] = true
	}
	if got := fields(redirect.MatchSet{Set: "s", Kind: redirect.SetPort}); got["kind"] != "set" || got["setKind"] == nil {
		t.Errorf("MatchSet fields = %v: the set's element kind must not replace the match kind", got)
	}

	// Every plan the builder makes: each rule's kinds come from the
	// vocabulary; no Go type name anywhere.
	spec := redirect.DefaultSpec()
	spec.InterceptionMode = redirect.ModeTProxy
	spec.IPv6, spec.CaptureDNS, spec.DropInvalid = true, true, true
	spec.ExcludeInterfaces = []string{"eth9"}
	spec.RerouteVirtualInterfaces = []string{"tap0"}
	spec.OutboundIPRangesExclude = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	for _, s := range []redirect.Spec{redirect.DefaultSpec(), spec} {
		p, err := redirect.Build(s)
		if err != nil {
			t.Fatal(err)
		}
		out, err := render(p, "json")
		if err != nil {
			t.Fatal(err)
		}
		for _, goName := range []string{"Match", "Verdict", "TProxy\"", "SetMark\"", "redirect."} {
			if strings.Contains(out, goName) {
				t.Errorf("JSON plan holds the Go name %q", goName)
			}
		}
		var doc struct {
			SchemaVersion int `json:"schemaVersion"`
			Tables        []struct {
				Chains []struct {
					Rules []struct {
						Matches []map[string]any `json:"matches"`
						Verdict map[string]any   `json:"verdict"`
					} `json:"rules"`
				} `json:"chains"`
			} `json:"tables"`
		}
		if err := json.Unmarshal([]byte(out), &doc); err != nil {
			t.Fatal(err)
		}
		if doc.SchemaVersion != schemaVersion || schemaVersion < 1 {
			t.Errorf("schemaVersion = %d", doc.SchemaVersion)
		}
		rules := 0
		for _, tb := range doc.Tables {
			for _, c := range tb.Chains {
				for _, r := range c.Rules {
					rules++
					if k, _ := r.Verdict["kind"].(string); !jsonVerdictKinds[k] {
						t.Errorf("verdict %v: kind not in the vocabulary", r.Verdict)
					}
					for _, m := range r.Matches {
						if k, _ := m["kind"].(string); !jsonMatchKinds[k] {
							t.Errorf("match %v: kind not in the vocabulary", m)
						}
					}
				}
			}
		}
		if rules == 0 {
			t.Error("no rules in the JSON plan")
		}
	}
}

// TestCLIValidateJSON: validate -o json prints one document for a valid pod,
// invalid settings (every problem, values bounded) and a pod outside the
// mesh, with the same exit codes as the text output; bad flags print no
// document.
func TestCLIValidateJSON(t *testing.T) {
	pods := filepath.Join("..", "..", "testdata", "pods")
	type doc struct {
		SchemaVersion int    `json:"schemaVersion"`
		Subject       string `json:"subject"`
		Valid         bool   `json:"valid"`
		InMesh        *bool  `json:"inMesh"`
		Reason        string `json:"reason"`
		Problems      []struct {
			Field, Value, Reason string
		} `json:"problems"`
		OmittedProblems int            `json:"omittedProblems"`
		Settings        map[string]any `json:"settings"`
		Plan            map[string]int `json:"plan"`
	}
	huge := strings.Repeat("7", 1<<20)
	for _, tc := range []struct {
		name  string
		args  []string
		code  int
		check func(t *testing.T, d doc)
	}{
		{"valid pod", []string{"validate", "-o", "json", "-f", filepath.Join(pods, "injected.yaml")}, exitOK, func(t *testing.T, d doc) {
			if !d.Valid || d.InMesh == nil || !*d.InMesh || d.Subject != "pod shop/web-1" || d.Settings["interceptionMode"] != "REDIRECT" || d.Plan["rules"] == 0 || len(d.Problems) != 0 {
				t.Errorf("%+v", d)
			}
		}},
		{"problems", []string{"validate", "-o", "json", "-a", redirect.AnnotationIncludeInboundPorts + "=80,0", "-a", redirect.AnnotationExcludeOutboundIPRanges + "=" + huge}, exitUsage, func(t *testing.T, d doc) {
			if d.Valid || d.InMesh != nil || d.Settings != nil || len(d.Problems) != 2 {
				t.Fatalf("%+v", d)
			}
			if d.Problems[0].Field != redirect.AnnotationIncludeInboundPorts || d.Problems[0].Value != "0" || d.Problems[0].Reason == "" {
				t.Errorf("first problem %+v", d.Problems[0])
			}
			if len(d.Problems[1].Value) > 512 || !strings.Contains(d.Problems[1].Value, "bytes cut") {
				t.Errorf("huge value not bounded: %d bytes", len(d.Problems[1].Value))
			}
		}},
		{"many problems", []string{"validate", "-o", "json", "-a", redirect.AnnotationIncludeInboundPorts + "=" + strings.Repeat("0,", 100)}, exitUsage, func(t *testing.T, d doc) {
			if len(d.Problems) != redirect.MaxProblems || d.OmittedProblems != 100-redirect.MaxProblems {
				t.Errorf("%d problems, %d omitted", len(d.Problems), d.OmittedProblems)
			}
		}},
		{"not in the mesh", []string{"validate", "-o", "json", "-f", filepath.Join(pods, "no-sidecar.yaml")}, exitNotInMesh, func(t *testing.T, d doc) {
			if !d.Valid || d.InMesh == nil || *d.InMesh || d.Reason == "" || d.Subject == "" {
				t.Errorf("%+v", d)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d (stderr %.300q)", code, tc.code, errOut)
			}
			var d doc
			if err := json.Unmarshal([]byte(out), &d); err != nil {
				t.Fatalf("stdout is not one JSON document: %v\n%.500s", err, out)
			}
			if d.SchemaVersion != schemaVersion || d.Problems == nil {
				t.Errorf("schemaVersion %d, problems %v", d.SchemaVersion, d.Problems)
			}
			tc.check(t, d)
		})
	}
	for _, args := range [][]string{
		{"validate", "-o", "yaml", "-f", filepath.Join(pods, "injected.yaml")},
		{"validate", "-o", "json", "-f", filepath.Join(pods, "missing.yaml")},
		{"validate", "-o", "json", "--proxy-uid", "x"},
	} {
		if code, out, errOut := runCLI(t, args...); code != exitUsage || out != "" || errOut == "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2, the error on stderr only", args, code, out, errOut)
		}
	}
}

// TestCLIValidateWarnsUnknownAnnotation: a manifest's misspelled capture
// annotation (ignored, as Istio ignores it) is warned about with the key it
// probably meant, in text (stderr, exit 0) and JSON; with -a it is an error
// saying the same.
func TestCLIValidateWarnsUnknownAnnotation(t *testing.T) {
	dir := t.TempDir()
	pod := filepath.Join(dir, "typo.yaml")
	manifest := strings.Replace(meshPodDoc("shop", "typo"), "traffic.sidecar.istio.io/excludeOutboundIPRanges:", "traffic.sidecar.istio.io/excludeOutboundIPRange:", 1)
	if err := os.WriteFile(pod, []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	meant := `did you mean "` + redirect.AnnotationExcludeOutboundIPRanges + `"?`
	code, out, errOut := runCLI(t, "validate", "-f", pod)
	if code != exitOK || !strings.HasPrefix(out, "ok: pod shop/typo") || !strings.Contains(errOut, "warning: pod shop/typo") || !strings.Contains(errOut, `"traffic.sidecar.istio.io/excludeOutboundIPRange"`) || !strings.Contains(errOut, meant) {
		t.Errorf("validate: exit %d, out %q, err %q", code, out, errOut)
	}
	code, out, errOut = runCLI(t, "validate", "-f", pod, "-o", "json")
	var d struct{ Warnings []string }
	if err := json.Unmarshal([]byte(out), &d); err != nil || code != exitOK || len(d.Warnings) != 1 || !strings.Contains(d.Warnings[0], meant) || errOut != "" {
		t.Errorf("validate -o json: exit %d, %v, %q, stderr %q", code, err, out, errOut)
	}
	code, _, errOut = runCLI(t, "validate", "-f", filepath.Join("..", "..", "testdata", "pods", "injected.yaml"))
	if code != exitOK || errOut != "" {
		t.Errorf("a pod without unknown annotations: exit %d, stderr %q", code, errOut)
	}
	code, _, errOut = runCLI(t, "validate", "-a", "traffic.sidecar.istio.io/excludeOutboundIPRange=10.0.0.0/8")
	if code != exitUsage || !strings.Contains(errOut, meant) {
		t.Errorf("validate -a with the typo: exit %d, %q", code, errOut)
	}
}

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

// outputFormats are the values -o takes for rules and plans.
var outputFormats = map[string]bool{"nft": true, "iptables": true, "json": true, "plan": true}

func render(p redirect.Plan, format string) (string, error) {
	switch format {
	case "nft":
		return capture.RenderNft(p)
	case "iptables":
		return capture.RenderIptables(p)
	case "json":
		var b strings.Builder
		if err := writeJSON(&b, planJSON(p)); err != nil {
			return "", err
		}
		return b.String(), nil
	case "plan":
		return strings.Join(redirect.Describe(p), "\n") + "\n", nil
	}
	return "", badOutput(format)
}

func badOutput(format string) error {
	return usageErr("--output %s: want nft, iptables, json or plan", quote.Value(format))
}

// schemaVersion is the version of every JSON document redirect prints
// (-o json). It changes when a field is renamed or removed or its meaning
// changes; new fields may appear within a version.
const schemaVersion = 1

// writeJSON prints one indented JSON document, with "->" and "<" as
// themselves: it is read by people and jq, never embedded in HTML.
func writeJSON(w io.Writer, doc any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return fmt.Errorf("encoding JSON: %w", err)
	}
	_, err := w.Write(b.Bytes())
	return err
}

// inspectDoc is inspect's drift check as JSON.
type inspectDoc struct {
	SchemaVersion int      `json:"schemaVersion"`
	Netns         string   `json:"netns"`
	Subject       string   `json:"subject"`
	Backend       string   `json:"backend"`
	InSync        bool     `json:"inSync"`
	Drift         []string `json:"drift"`
	// Foreign is another installer's capture found in the namespace
	// (Istio's ISTIO_* chains or istio-proxy-* tables); inSync is false
	// while there is any.
	Foreign []string `json:"foreign,omitempty"`
	// Effects are packets the live rules treat differently from the plan
	// (traced through both), when there is drift.
	Effects []effectDoc `json:"effects,omitempty"`
}

// effectDoc is one redirect.DriftEffect.
type effectDoc struct {
	Packet  string `json:"packet"`
	Planned string `json:"planned"`
	Live    string `json:"live"`
	Why     string `json:"why"`
}

// validateDoc is validate's report as JSON.
type validateDoc struct {
	SchemaVersion int    `json:"schemaVersion"`
	Subject       string `json:"subject,omitempty"`
	Valid         bool   `json:"valid"`
	// InMesh is absent when the settings are invalid: it is not known then.
	InMesh *bool `json:"inMesh,omitempty"`
	// Reason says why a pod is not in the mesh.
	Reason          string         `json:"reason,omitempty"`
	Problems        []problemDoc   `json:"problems"`
	Warnings        []string       `json:"warnings"`
	OmittedProblems int            `json:"omittedProblems,omitempty"`
	Settings        *settingsDoc   `json:"settings,omitempty"`
	Plan            map[string]int `json:"plan,omitempty"`
}

type problemDoc struct {
	Field  string `json:"field"`
	Value  string `json:"value"`
	Reason string `json:"reason"`
}

type settingsDoc struct {
	InterceptionMode        string   `json:"interceptionMode"`
	InboundPorts            string   `json:"inboundPorts"`
	InboundPortsExclude     []uint16 `json:"inboundPortsExclude"`
	OutboundIPRanges        string   `json:"outboundIPRanges"`
	OutboundIPRangesExclude []string `json:"outboundIPRangesExclude"`
	OutboundPorts           []uint16 `json:"outboundPorts"`
	OutboundPortsExclude    []uint16 `json:"outboundPortsExclude"`
	ProxyUIDs               []uint32 `json:"proxyUIDs"`
	ProxyGIDs               []uint32 `json:"proxyGIDs"`
	CaptureDNS              bool     `json:"captureDNS"`
	IPv6                    bool     `json:"ipv6"`
	DualStack               bool     `json:"dualStack"`
}

// validateJSON builds validate's JSON report from the outcome of planning;
// false when the error is not about the pod's settings (bad flags, an
// unreadable manifest), which only the error on stderr reports.
func validateJSON(p redirect.Plan, r resolved, err error) (validateDoc, bool) {
	doc := validateDoc{SchemaVersion: schemaVersion, Subject: r.subject, Problems: []problemDoc{}, Warnings: nonNil(r.warnings)}
	var ve *redirect.ValidationError
	var ee *exitError
	switch {
	case err == nil:
		doc.Valid, doc.InMesh = true, ptr(true)
		s := r.spec
		doc.Settings = &settingsDoc{
			InterceptionMode: string(s.InterceptionMode), InboundPorts: s.InboundPorts.String(),
			InboundPortsExclude: nonNil(s.InboundPortsExclude), OutboundIPRanges: s.OutboundIPRanges.String(),
			OutboundIPRangesExclude: []string{}, OutboundPorts: nonNil(s.OutboundPorts), OutboundPortsExclude: nonNil(s.OutboundPortsExclude),
			ProxyUIDs: nonNil(s.ProxyUIDs), ProxyGIDs: nonNil(s.ProxyGIDs), CaptureDNS: s.CaptureDNS, IPv6: s.IPv6, DualStack: s.DualStack,
		}
		for _, pr := range s.OutboundIPRangesExclude {
			doc.Settings.OutboundIPRangesExclude = append(doc.Settings.OutboundIPRangesExclude, pr.String())
		}
		doc.Plan = map[string]int{"tables": len(p.Tables), "rules": capture.RuleCount(p), "sets": len(p.Sets)}
	case errors.As(err, &ee) && ee.code == exitNotInMesh:
		doc.Valid, doc.InMesh, doc.Reason = true, ptr(false), r.reason
	case errors.As(err, &ve):
		for _, pr := range ve.Problems {
			doc.Problems = append(doc.Problems, problemDoc{Field: pr.Field, Value: quote.TextN(pr.Value, quote.MaxValue), Reason: pr.Reason})
		}
		doc.OmittedProblems = ve.Omitted
	default:
		return doc, false
	}
	return doc, true
}

func ptr[T any](v T) *T { return &v }

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// planJSON is the plan as JSON. Matches and verdicts carry a "kind" from a
// fixed vocabulary (jsonKinds), not Go type names, so the document does not
// change when the Go code is refactored. Chains, and jumps' targets, are
// named by redirect.ChainName, as in every other output.
func planJSON(p redirect.Plan) any {
	type rule struct {
		Family  string           `json:"family"`
		Matches []map[string]any `json:"matches"`
		Verdict map[string]any   `json:"verdict"`
	}
	type chain struct {
		Name     string `json:"name"`
		Hook     string `json:"hook,omitempty"`
		Type     string `json:"type,omitempty"`
		Priority int32  `json:"priority,omitempty"`
		Rules    []rule `json:"rules"`
	}
	type table struct {
		Name   string  `json:"name"`
		Chains []chain `json:"chains"`
	}
	type set struct {
		Name     string   `json:"name"`
		Kind     string   `json:"kind"`
		Elements []string `json:"elements"`
	}
	out := struct {
		SchemaVersion int      `json:"schemaVersion"`
		Tables        []table  `json:"tables"`
		Sets          []set    `json:"sets"`
		Routes        []string `json:"routes"`
		LoopbackAddrs []string `json:"loopbackAddresses"`
	}{SchemaVersion: schemaVersion, Tables: []table{}, Sets: []set{}, Routes: []string{}, LoopbackAddrs: []string{}}
	for _, s := range p.Sets {
		js := set{Name: s.Name, Kind: s.Kind.String(), Elements: []string{}}
		for _, pr := range s.Prefixes {
			js.Elements = append(js.Elements, pr.String())
		}
		for _, po := range s.Ports {
			js.Elements = append(js.Elements, fmt.Sprint(po))
		}
		out.Sets = append(out.Sets, js)
	}
	for _, t := range p.Tables {
		jt := table{Name: string(t.Name), Chains: []chain{}}
		for _, c := range t.Chains {
			jc := chain{Name: redirect.ChainName(t.Name, c.Name), Hook: string(c.Hook), Type: string(c.Type), Priority: c.Priority, Rules: []rule{}}
			for _, r := range c.Rules {
				jr := rule{Family: r.Family.String(), Matches: []map[string]any{}, Verdict: fields(r.Verdict)}
				if j, ok := r.Verdict.(redirect.Jump); ok {
					jr.Verdict["chain"] = redirect.ChainName(t.Name, j.Chain)
				}
				for _, m := range r.Matches {
					jr.Matches = append(jr.Matches, fields(m))
				}
				jc.Rules = append(jc.Rules, jr)
			}
			jt.Chains = append(jt.Chains, jc)
		}
		out.Tables = append(out.Tables, jt)
	}
	for _, r := range p.Routes {
		out.Routes = append(out.Routes, fmt.Sprintf("%s fwmark %d lookup %d", r.Family, r.Mark, r.Table))
	}
	for _, a := range p.LoopbackAddrs {
		out.LoopbackAddrs = append(out.LoopbackAddrs, a.String())
	}
	return out
}

// jsonKinds names each match and verdict type in the JSON plan (a type
// missing here gets "": TestPlanJSONKinds fails then).
var jsonKinds = map[reflect.Type]string{
	reflect.TypeFor[redirect.MatchProto]():   "proto",
	reflect.TypeFor[redirect.MatchPort]():    "port",
	reflect.TypeFor[redirect.MatchAddr]():    "addr",
	reflect.TypeFor[redirect.MatchSet]():     "set",
	reflect.TypeFor[redirect.MatchIface]():   "iface",
	reflect.TypeFor[redirect.MatchOwner]():   "owner",
	reflect.TypeFor[redirect.MatchMark]():    "mark",
	reflect.TypeFor[redirect.MatchCTState](): "ctstate",
	reflect.TypeFor[redirect.Accept]():       "accept",
	reflect.TypeFor[redirect.Drop]():         "drop",
	reflect.TypeFor[redirect.Return]():       "return",
	reflect.TypeFor[redirect.Jump]():         "jump",
	reflect.TypeFor[redirect.Redirect]():     "redirect",
	reflect.TypeFor[redirect.TProxy]():       "tproxy",
	reflect.TypeFor[redirect.SetMark]():      "setMark",
	reflect.TypeFor[redirect.SaveMark]():     "saveMark",
	reflect.TypeFor[redirect.RestoreMark]():  "restoreMark",
	reflect.TypeFor[redirect.SetCTZone]():    "setCTZone",
}

// fields is a match's or verdict's kind and its non-zero fields, named in
// lowerCamelCase, values that print themselves as their string.
func fields(v any) map[string]any {
	rv := reflect.ValueOf(v)
	m := map[string]any{"kind": jsonKinds[rv.Type()]}
	for i := 0; i < rv.NumField(); i++ {
		f := rv.Type().Field(i)
		if rv.Field(i).IsZero() {
			continue
		}
		val := rv.Field(i).Interface()
		if s, ok := val.(fmt.Stringer); ok {
			val = s.String()
		}
		key := strings.ToLower(f.Name[:1]) + f.Name[1:]
		if key == "kind" { // MatchSet's element kind, not the match's
			key = "setKind"
		}
		m[key] = val
	}
	return m
}

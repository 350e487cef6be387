package main

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/internal/quote"
	"github.com/nftmesh/nftmesh/redirect"
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
		b, err := json.MarshalIndent(planJSON(p), "", "  ")
		if err != nil {
			return "", err
		}
		return string(b) + "\n", nil
	case "plan":
		return strings.Join(redirect.Describe(p), "\n") + "\n", nil
	}
	return "", badOutput(format)
}

func badOutput(format string) error {
	return usageErr("--output %s: want nft, iptables, json or plan", quote.Value(format))
}

// planJSON gives matches and verdicts a "type" field so the JSON is
// self-describing (the vocabulary is a closed set of Go types).
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
		Tables        []table  `json:"tables"`
		Sets          []set    `json:"sets"`
		Routes        []string `json:"routes"`
		LoopbackAddrs []string `json:"loopback_addresses"`
	}{Tables: []table{}, Sets: []set{}, Routes: []string{}, LoopbackAddrs: []string{}}
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
		jt := table{Name: string(t.Name)}
		for _, c := range t.Chains {
			jc := chain{Name: c.Name, Hook: string(c.Hook), Type: string(c.Type), Priority: c.Priority, Rules: []rule{}}
			for _, r := range c.Rules {
				jr := rule{Family: r.Family.String(), Matches: []map[string]any{}, Verdict: typed(r.Verdict)}
				for _, m := range r.Matches {
					jr.Matches = append(jr.Matches, typed(m))
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

func typed(v any) map[string]any {
	m := map[string]any{"type": reflect.TypeOf(v).Name()}
	rv := reflect.ValueOf(v)
	for i := 0; i < rv.NumField(); i++ {
		f := rv.Type().Field(i)
		val := rv.Field(i).Interface()
		if rv.Field(i).IsZero() {
			continue
		}
		if s, ok := val.(fmt.Stringer); ok {
			val = s.String()
		}
		m[strings.ToLower(f.Name[:1])+f.Name[1:]] = val
	}
	return m
}

package main

import (
	"strings"
	"testing"
)

const devChart = `apiVersion: v2
name: nftmesh
# a comment that stays
version: 0.1.0-dev
appVersion: "v0.1.0-dev"
keywords: [cni]
`

func TestChartStamp(t *testing.T) {
	c, err := parseChart([]byte(devChart))
	if err != nil {
		t.Fatal(err)
	}
	if base, dev, err := c.state(); err != nil || base != "v0.1.0" || !dev {
		t.Fatalf("state() = %s, %v, %v; want v0.1.0 in development", base, dev, err)
	}
	got := string(c.stamped("0.1.0"))
	want := strings.Replace(strings.Replace(devChart, "version: 0.1.0-dev", "version: 0.1.0", 1), `"v0.1.0-dev"`, `"v0.1.0"`, 1)
	if got != want {
		t.Fatalf("stamped:\n%s\nwant:\n%s", got, want)
	}
	r, err := parseChart([]byte(got))
	if err != nil {
		t.Fatal(err)
	}
	if base, dev, err := r.state(); err != nil || base != "v0.1.0" || dev {
		t.Fatalf("stamped state() = %s, %v, %v; want release v0.1.0", base, dev, err)
	}
}

func TestChartRefuses(t *testing.T) {
	for _, tc := range []struct{ name, chart, want string }{
		{"no version", "name: x\nappVersion: v1.0.0\n", "no top-level version line"},
		{"no appVersion", "name: x\nversion: 1.0.0\n", "no top-level appVersion line"},
		{"two versions", "version: 1.0.0\nversion: 1.0.1\nappVersion: v1.0.0\n", "line 2: a second version line"},
		{"appVersion without v", "version: 1.0.0\nappVersion: \"1.0.0\"\n", `appVersion "1.0.0" is not version "1.0.0" with a leading v`},
		{"appVersion elsewhere", "version: 1.0.0-dev\nappVersion: v1.0.0\n", `appVersion "v1.0.0" is not version "1.0.0-dev"`},
		{"pre-release", "version: 1.0.0-rc.1\nappVersion: v1.0.0-rc.1\n", `version "1.0.0-rc.1" is neither X.Y.Z`},
		{"short", "version: 1.0\nappVersion: v1.0\n", `version "1.0" is neither`},
		{"commented", "version: 1.0.0 # x\nappVersion: v1.0.0\n", `version "1.0.0 # x" is neither`},
		{"garbage", "version: " + strings.Repeat("x", 300) + "\nappVersion: v\n", "(300 bytes)"},
	} {
		c, err := parseChart([]byte(tc.chart))
		if err == nil {
			_, _, err = c.state()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

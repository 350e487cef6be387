package main

import (
	"fmt"
	"regexp"
	"strings"

	"golang.org/x/mod/semver"
)

// chartPath is the chart whose version and appVersion a release stamps.
const chartPath = "charts/nftmesh/Chart.yaml"

// chartFile is Chart.yaml as lines, with its two version lines found. Only
// those two lines are ever rewritten: comments and order stay as written.
type chartFile struct {
	lines               []string
	version, appVersion string
	versionAt, appAt    int
}

var chartLine = regexp.MustCompile(`^(version|appVersion):[ \t]*(.*?)[ \t]*$`)

// parseChart finds Chart.yaml's top-level version and appVersion.
func parseChart(data []byte) (chartFile, error) {
	c := chartFile{lines: strings.Split(string(data), "\n"), versionAt: -1, appAt: -1}
	for i, l := range c.lines {
		m := chartLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		val := unquote(m[2])
		at, dst := &c.versionAt, &c.version
		if m[1] == "appVersion" {
			at, dst = &c.appAt, &c.appVersion
		}
		if *at >= 0 {
			return c, fmt.Errorf("%s: line %d: a second %s line", chartPath, i+1, m[1])
		}
		*at, *dst = i, val
	}
	for _, f := range []struct {
		name string
		at   int
	}{{"version", c.versionAt}, {"appVersion", c.appAt}} {
		if f.at < 0 {
			return c, fmt.Errorf("%s: no top-level %s line", chartPath, f.name)
		}
	}
	return c, nil
}

// unquote strips one pair of YAML quotes.
func unquote(s string) string {
	if len(s) >= 2 && (s[0] == '"' || s[0] == '\'') && s[len(s)-1] == s[0] {
		return s[1 : len(s)-1]
	}
	return s
}

// state says what the chart's version is: a release "X.Y.Z" (dev false) or
// the version under development "X.Y.Z-dev" (dev true), and that
// appVersion is the same with a "v", the image tag the chart defaults to.
func (c chartFile) state() (base string, dev bool, err error) {
	v := "v" + c.version
	base, dev = strings.CutSuffix(v, "-dev")
	if !semver.IsValid(base) || semver.Canonical(base) != base || semver.Prerelease(base) != "" || semver.Build(base) != "" {
		return "", false, fmt.Errorf("%s: version %s is neither X.Y.Z (a release) nor X.Y.Z-dev (between releases)", chartPath, shown(c.version))
	}
	if c.appVersion != v {
		return "", false, fmt.Errorf("%s: appVersion %s is not version %s with a leading v (%s): the chart's default image tag must be its version's", chartPath, shown(c.appVersion), shown(c.version), v)
	}
	return base, dev, nil
}

// stamped returns the file with version (without "v") and appVersion "v"+version.
func (c chartFile) stamped(version string) []byte {
	lines := append([]string(nil), c.lines...)
	lines[c.versionAt] = "version: " + version
	lines[c.appAt] = `appVersion: "v` + version + `"`
	return []byte(strings.Join(lines, "\n"))
}

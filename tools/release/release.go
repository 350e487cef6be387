package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/semver"
)

// tree is what a release reads and writes: Chart.yaml and CHANGELOG.md.
type tree struct {
	repo          string
	chartRaw      []byte
	changelogRaw  []byte
	chart         chartFile
	log           changelog
	base          string // the chart's version as vX.Y.Z
	dev           bool   // the chart says X.Y.Z-dev
	tags, history []string
}

// readTree reads and checks both files and the repository's release tags.
func readTree(repo string) (*tree, error) {
	t := &tree{repo: repo}
	var err error
	if t.chartRaw, err = os.ReadFile(filepath.Join(repo, chartPath)); err != nil {
		return nil, err
	}
	if t.changelogRaw, err = os.ReadFile(filepath.Join(repo, changelogPath)); err != nil {
		return nil, err
	}
	if t.chart, err = parseChart(t.chartRaw); err != nil {
		return nil, err
	}
	if t.base, t.dev, err = t.chart.state(); err != nil {
		return nil, err
	}
	if t.log, err = parseChangelog(t.changelogRaw); err != nil {
		return nil, err
	}
	if t.tags, err = releaseTags(repo); err != nil {
		return nil, err
	}
	t.history = t.log.releases()
	return t, nil
}

// last is the newest release the repository knows of, and where it is.
func (t *tree) last() (string, string) {
	tag, logged := newest(t.tags), newest(t.history)
	switch {
	case tag == "" && logged == "":
		return "", ""
	case tag != "" && (logged == "" || semver.Compare(tag, logged) >= 0):
		return tag, "tag " + tag
	}
	return logged, changelogPath + " [" + strings.TrimPrefix(logged, "v") + "]"
}

// agree checks that Chart.yaml and CHANGELOG.md tell one story: a release
// chart X.Y.Z is CHANGELOG.md's newest release (the CHANGELOG names the
// chart's version); a chart X.Y.Z-dev is newer than every release so far.
func (t *tree) agree() error {
	name := strings.TrimPrefix(t.base, "v")
	if !t.dev {
		if len(t.history) == 0 || t.history[0] != t.base {
			return fmt.Errorf("%s says release %s, but %s's newest release is %s: it must name the chart's version (## [%s] - YYYY-MM-DD)",
				chartPath, name, changelogPath, orNone(t.history), name)
		}
		return nil
	}
	if last, where := t.last(); last != "" && semver.Compare(last, t.base) >= 0 {
		return fmt.Errorf("%s says %s-dev, in development, but %s is released already: Chart.yaml is written by make release, not by hand", chartPath, name, where)
	}
	return nil
}

func orNone(vs []string) string {
	if len(vs) == 0 {
		return "none"
	}
	return "[" + strings.TrimPrefix(vs[0], "v") + "]"
}

// check prints what the tree says, or why its files disagree.
func check(repo string, out io.Writer) error {
	t, err := readTree(repo)
	if err != nil {
		return err
	}
	if err := t.agree(); err != nil {
		return err
	}
	name := strings.TrimPrefix(t.base, "v")
	if t.dev {
		last, where := t.last()
		if last == "" {
			where = "none"
		}
		_, err = fmt.Fprintf(out, "%s %s-dev, appVersion %s: %s in development; last release: %s\n", chartPath, name, t.chart.appVersion, t.base, where)
		return err
	}
	_, err = fmt.Fprintf(out, "%s %s, appVersion %s: release %s, %s [%s] - %s\n", chartPath, name, t.chart.appVersion, t.base, changelogPath, name, t.log.sections[1].date)
	return err
}

// notes prints release v's CHANGELOG.md section.
func notes(repo, v string, out io.Writer) error {
	v, err := parseRelease(v)
	if err != nil {
		return err
	}
	t, err := readTree(repo)
	if err != nil {
		return err
	}
	text, err := t.log.notes(v)
	if err != nil {
		return err
	}
	_, err = io.WriteString(out, text)
	return err
}

// refuseOld refuses v unless it is newer than every release so far.
func (t *tree) refuseOld(v string) error {
	if slices.Contains(t.tags, v) {
		return fmt.Errorf("VERSION %s is released already: tag %s exists", v, v)
	}
	if last, where := t.last(); last != "" && semver.Compare(v, last) <= 0 {
		return fmt.Errorf("VERSION %s is not newer than the last release %s (%s)", v, last, where)
	}
	return nil
}

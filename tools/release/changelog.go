package main

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"golang.org/x/mod/semver"
)

// changelogPath is the Keep a Changelog file whose Unreleased section a
// release turns into the release's.
const changelogPath = "CHANGELOG.md"

// changelog is CHANGELOG.md in Keep a Changelog's shape
// (https://keepachangelog.com/en/1.1.0/): a preamble, "## [Unreleased]",
// then "## [X.Y.Z] - YYYY-MM-DD" sections, newest first, then the link
// references ("[X.Y.Z]: URL") at the end.
type changelog struct {
	lines    []string
	sections []section // [Unreleased] first
	refsAt   int       // the first line of the trailing link references
}

// section is one "## [...]" heading and the lines under it.
type section struct {
	name, date  string // "Unreleased" or X.Y.Z; date empty for Unreleased
	head, start int    // the heading's line; its body runs from start
	end         int    // to the next heading or the link references
}

var (
	sectionHead = regexp.MustCompile(`^## \[([^\]]*)\](?: - (\d{4}-\d{2}-\d{2}))?(?: \[YANKED\])?[ \t]*$`)
	linkRef     = regexp.MustCompile(`^\[[^\]]+\]: \S+$`)
)

// parseChangelog reads the file's sections and checks their shape: the
// first is [Unreleased], every other is a dated X.Y.Z, newest first.
func parseChangelog(data []byte) (changelog, error) {
	c := changelog{lines: strings.Split(strings.TrimRight(string(data), "\n"), "\n")}
	c.refsAt = len(c.lines)
	for c.refsAt > 0 && (linkRef.MatchString(c.lines[c.refsAt-1]) || strings.TrimSpace(c.lines[c.refsAt-1]) == "") {
		c.refsAt--
	}
	for i, l := range c.lines[:c.refsAt] {
		if !strings.HasPrefix(l, "## ") {
			continue
		}
		s, err := parseHead(i, l)
		if err != nil {
			return c, err
		}
		if n := len(c.sections); n > 0 {
			c.sections[n-1].end = i
		}
		c.sections = append(c.sections, s)
	}
	if len(c.sections) == 0 || c.sections[0].name != "Unreleased" {
		return c, fmt.Errorf("%s: no \"## [Unreleased]\" section before the releases' (Keep a Changelog)", changelogPath)
	}
	c.sections[len(c.sections)-1].end = c.refsAt
	for _, s := range c.sections[1:] {
		if s.name == "Unreleased" {
			return c, fmt.Errorf("%s: line %d: a second [Unreleased] section", changelogPath, s.head+1)
		}
	}
	for i := 2; i < len(c.sections); i++ {
		prev, s := c.sections[i-1], c.sections[i]
		if semver.Compare("v"+s.name, "v"+prev.name) >= 0 {
			return c, fmt.Errorf("%s: line %d: [%s] comes after [%s]: releases go newest first, each once", changelogPath, s.head+1, s.name, prev.name)
		}
	}
	return c, nil
}

// parseHead reads the "## " heading on line i (0-based).
func parseHead(i int, l string) (section, error) {
	s := section{head: i, start: i + 1}
	m := sectionHead.FindStringSubmatch(l)
	if m == nil {
		return s, fmt.Errorf("%s: line %d: heading %s is neither \"## [Unreleased]\" nor \"## [X.Y.Z] - YYYY-MM-DD\"", changelogPath, i+1, shown(l))
	}
	s.name, s.date = m[1], m[2]
	if s.name == "Unreleased" {
		if s.date != "" {
			return s, fmt.Errorf("%s: line %d: [Unreleased] has a date", changelogPath, i+1)
		}
		return s, nil
	}
	v := "v" + s.name
	if !semver.IsValid(v) || semver.Canonical(v) != v || semver.Build(v) != "" {
		return s, fmt.Errorf("%s: line %d: section %s is not a version X.Y.Z", changelogPath, i+1, shown(s.name))
	}
	if _, err := time.Parse(time.DateOnly, s.date); err != nil {
		return s, fmt.Errorf("%s: line %d: release %s has no date YYYY-MM-DD (## [%s] - 2006-01-02)", changelogPath, i+1, s.name, s.name)
	}
	return s, nil
}

// releases returns the released versions, newest first, each with its "v".
func (c changelog) releases() []string {
	var out []string
	for _, s := range c.sections[1:] {
		out = append(out, "v"+s.name)
	}
	return out
}

// body returns a section's lines without the blank lines around them.
func (c changelog) body(s section) []string {
	b := c.lines[s.start:s.end]
	for len(b) > 0 && strings.TrimSpace(b[0]) == "" {
		b = b[1:]
	}
	for len(b) > 0 && strings.TrimSpace(b[len(b)-1]) == "" {
		b = b[:len(b)-1]
	}
	return b
}

// notes returns release v's section (vX.Y.Z), the text of its GitHub release.
func (c changelog) notes(v string) (string, error) {
	for _, s := range c.sections[1:] {
		if "v"+s.name == v {
			return strings.Join(c.body(s), "\n") + "\n", nil
		}
	}
	return "", fmt.Errorf("%s has no section [%s] for release %s", changelogPath, strings.TrimPrefix(v, "v"), shown(v))
}

// hasEntries says whether a section says anything: a line that is neither
// blank nor a heading (an empty "### Added" is not a change).
func hasEntries(lines []string) bool {
	for _, l := range lines {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
			return true
		}
	}
	return false
}

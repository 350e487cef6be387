package main

import (
	"fmt"
	"strings"
)

// released returns the changelog with its Unreleased entries moved under
// "## [X.Y.Z] - date" (v is vX.Y.Z) and an empty Unreleased above them,
// and the link references updated when the file has an [Unreleased] one.
func (c changelog) released(v, date string) ([]byte, error) {
	u := c.sections[0]
	entries := c.body(u)
	if !hasEntries(entries) {
		return nil, fmt.Errorf("%s: the [Unreleased] section is empty: say what %s changes there before releasing it", changelogPath, v)
	}
	name := strings.TrimPrefix(v, "v")
	var out []string
	out = append(out, c.lines[:u.start]...)
	out = append(out, "", "## ["+name+"] - "+date, "")
	out = append(out, entries...)
	out = append(out, "")
	out = append(out, c.lines[u.end:c.refsAt]...)
	refs := c.releasedRefs(v)
	for len(refs) > 0 && strings.TrimSpace(refs[0]) == "" {
		refs = refs[1:]
	}
	for len(out) > 0 && strings.TrimSpace(out[len(out)-1]) == "" {
		out = out[:len(out)-1]
	}
	if len(refs) > 0 {
		out = append(out, "")
		out = append(out, refs...)
	}
	return []byte(strings.Join(out, "\n") + "\n"), nil
}

// releasedRefs is the link references after release v: [Unreleased]
// compares v with HEAD, and v's own compares the previous release with v
// (or points at v's tag when it is the first). Without an [Unreleased]
// reference the file keeps its references as they are.
func (c changelog) releasedRefs(v string) []string {
	refs := c.lines[c.refsAt:]
	for i, l := range refs {
		url, ok := strings.CutPrefix(l, "[Unreleased]: ")
		if !ok {
			continue
		}
		base := repoURL(url)
		own := "[" + strings.TrimPrefix(v, "v") + "]: " + base + "/releases/tag/" + v
		if prev := c.releases(); len(prev) > 0 {
			own = "[" + strings.TrimPrefix(v, "v") + "]: " + base + "/compare/" + prev[0] + "..." + v
		}
		out := append([]string(nil), refs[:i]...)
		out = append(out, "[Unreleased]: "+base+"/compare/"+v+"...HEAD", own)
		return append(out, refs[i+1:]...)
	}
	return refs
}

// repoURL is a GitHub link without its /compare/..., /commits/...,
// /releases/... or /tree/... part.
func repoURL(url string) string {
	for _, part := range []string{"/compare/", "/commits/", "/releases/", "/tree/"} {
		if i := strings.Index(url, part); i >= 0 {
			return url[:i]
		}
	}
	return strings.TrimSuffix(url, "/")
}

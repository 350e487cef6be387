package main

import (
	"strings"
	"testing"
)

const firstLog = `# Changelog

Preamble.

## [Unreleased]

### Added

- One thing.
- Another.

[Unreleased]: https://github.com/nftmesh/nftmesh/commits/main
`

const firstReleased = `# Changelog

Preamble.

## [Unreleased]

## [0.1.0] - 2026-01-02

### Added

- One thing.
- Another.

[Unreleased]: https://github.com/nftmesh/nftmesh/compare/v0.1.0...HEAD
[0.1.0]: https://github.com/nftmesh/nftmesh/releases/tag/v0.1.0
`

func TestReleasedFirst(t *testing.T) {
	c, err := parseChangelog([]byte(firstLog))
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.released("v0.1.0", "2026-01-02")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != firstReleased {
		t.Fatalf("released:\n%s\nwant:\n%s", got, firstReleased)
	}
}

func TestReleasedSecond(t *testing.T) {
	c, err := parseChangelog([]byte(strings.Replace(firstReleased, "## [Unreleased]\n", "## [Unreleased]\n\n### Fixed\n\n- A bug.\n", 1)))
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.released("v0.2.0", "2026-02-03")
	if err != nil {
		t.Fatal(err)
	}
	want := `# Changelog

Preamble.

## [Unreleased]

## [0.2.0] - 2026-02-03

### Fixed

- A bug.

## [0.1.0] - 2026-01-02

### Added

- One thing.
- Another.

[Unreleased]: https://github.com/nftmesh/nftmesh/compare/v0.2.0...HEAD
[0.2.0]: https://github.com/nftmesh/nftmesh/compare/v0.1.0...v0.2.0
[0.1.0]: https://github.com/nftmesh/nftmesh/releases/tag/v0.1.0
`
	if string(got) != want {
		t.Fatalf("released:\n%s\nwant:\n%s", got, want)
	}
	r, err := parseChangelog(got)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.notes("v0.2.0"); err != nil || n != "### Fixed\n\n- A bug.\n" {
		t.Fatalf("notes(v0.2.0) = %q, %v", n, err)
	}
	if n, err := r.notes("v0.1.0"); err != nil || n != "### Added\n\n- One thing.\n- Another.\n" {
		t.Fatalf("notes(v0.1.0) = %q, %v", n, err)
	}
}

// Without an [Unreleased] link the file's links stay as they are; without
// any, none is added.
func TestReleasedWithoutLinks(t *testing.T) {
	for _, refs := range []string{"", "\n[keep]: https://keepachangelog.com/\n"} {
		c, err := parseChangelog([]byte("## [Unreleased]\n\n- x\n" + refs))
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.released("v1.0.0", "2026-03-04")
		if err != nil {
			t.Fatal(err)
		}
		if want := "## [Unreleased]\n\n## [1.0.0] - 2026-03-04\n\n- x\n" + refs; string(got) != want {
			t.Errorf("released:\n%q\nwant:\n%q", got, want)
		}
	}
}

func TestReleasedRefusesNothingToRelease(t *testing.T) {
	for _, u := range []string{"", "\n\n", "\n### Added\n\n### Fixed\n"} {
		c, err := parseChangelog([]byte("## [Unreleased]\n" + u + "\n## [0.1.0] - 2026-01-02\n\n- x\n"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.released("v0.2.0", "2026-02-03"); err == nil || !strings.Contains(err.Error(), "the [Unreleased] section is empty: say what v0.2.0 changes") {
			t.Errorf("Unreleased %q: %v, want it refused", u, err)
		}
	}
}

func TestParseChangelogRefuses(t *testing.T) {
	for _, tc := range []struct{ name, log, want string }{
		{"empty", "", `no "## [Unreleased]" section`},
		{"no unreleased", "# C\n\n## [0.1.0] - 2026-01-02\n", `no "## [Unreleased]" section`},
		{"unreleased second", "## [0.1.0] - 2026-01-02\n## [Unreleased]\n", `no "## [Unreleased]" section`},
		{"other heading", "## [Unreleased]\n## Notes\n", `line 2: heading "## Notes" is neither`},
		{"undated", "## [Unreleased]\n## [0.1.0]\n", "line 2: release 0.1.0 has no date"},
		{"bad date", "## [Unreleased]\n## [0.1.0] - 2026-13-01\n", "line 2: release 0.1.0 has no date"},
		{"not a version", "## [Unreleased]\n## [v0.1.0] - 2026-01-02\n", `line 2: section "v0.1.0" is not a version X.Y.Z`},
		{"short version", "## [Unreleased]\n## [0.1] - 2026-01-02\n", `section "0.1" is not a version`},
		{"out of order", "## [Unreleased]\n## [0.1.0] - 2026-01-02\n## [0.2.0] - 2026-02-03\n", "line 3: [0.2.0] comes after [0.1.0]"},
		{"twice", "## [Unreleased]\n## [0.1.0] - 2026-01-02\n## [0.1.0] - 2026-01-02\n", "line 3: [0.1.0] comes after [0.1.0]"},
		{"unreleased dated", "## [Unreleased] - 2026-01-02\n", "[Unreleased] has a date"},
		{"unreleased twice", "## [Unreleased]\n## [Unreleased]\n", "line 2: a second [Unreleased] section"},
		{"long heading", "## [Unreleased]\n## " + strings.Repeat("y", 1000) + "\n", "(1003 bytes)"},
	} {
		_, err := parseChangelog([]byte(tc.log))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

// FuzzReleased: any changelog that parses and has something unreleased
// gives, once released, a changelog that parses again, whose newest
// release is the new one with exactly the entries that were unreleased,
// and whose Unreleased section is empty.
func FuzzReleased(f *testing.F) {
	f.Add(firstLog)
	f.Add(firstReleased)
	f.Add("## [Unreleased]\n- x\n## [0.1.0] - 2026-01-02\n- y\n\n[a]: b\n")
	f.Add("## [Unreleased]\n\n[Unreleased]: https://x/y/compare/v1.0.0...HEAD\n")
	f.Fuzz(func(t *testing.T, log string) {
		c, err := parseChangelog([]byte(log))
		if err != nil {
			return
		}
		v := "v99.0.0"
		want := strings.Join(c.body(c.sections[0]), "\n") + "\n"
		out, err := c.released(v, "2026-01-02")
		if err != nil {
			if hasEntries(c.body(c.sections[0])) {
				t.Fatalf("released refused entries %q: %v", want, err)
			}
			return
		}
		r, err := parseChangelog(out)
		if err != nil {
			t.Fatalf("released output does not parse: %v\n%s", err, out)
		}
		if got := r.releases(); len(got) == 0 || got[0] != v {
			t.Fatalf("newest release %v, want %s first\n%s", got, v, out)
		}
		if hasEntries(r.body(r.sections[0])) {
			t.Fatalf("Unreleased not empty after the release:\n%s", out)
		}
		if got, err := r.notes(v); err != nil || strings.TrimSpace(got) != strings.TrimSpace(want) {
			t.Fatalf("notes = %q, %v; want the unreleased entries %q", got, err, want)
		}
	})
}

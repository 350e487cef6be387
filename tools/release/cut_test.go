package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// newRepo is a git repository holding a dev chart and firstLog, on branch
// main, with git's user configuration kept out.
func newRepo(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	t.Setenv("GIT_CONFIG_GLOBAL", os.DevNull)
	t.Setenv("GIT_CONFIG_NOSYSTEM", "1")
	for k, v := range map[string]string{"GIT_AUTHOR_NAME": "r", "GIT_AUTHOR_EMAIL": "r@example.com", "GIT_COMMITTER_NAME": "r", "GIT_COMMITTER_EMAIL": "r@example.com"} {
		t.Setenv(k, v)
	}
	repo := t.TempDir()
	write(t, repo, chartPath, devChart)
	write(t, repo, changelogPath, firstLog)
	mustGit(t, repo, "init", "-q", "-b", "main")
	mustGit(t, repo, "add", "-A")
	mustGit(t, repo, "commit", "-q", "-m", "start")
	return repo
}

func write(t *testing.T, repo, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(filepath.Join(repo, path)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, path), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, repo, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustGit(t *testing.T, repo string, args ...string) string {
	t.Helper()
	out, err := git(repo, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCut: a release is two commits, the tagged release and the next
// development version, touching only Chart.yaml and CHANGELOG.md.
func TestCut(t *testing.T) {
	repo := newRepo(t)
	var out bytes.Buffer
	if err := run([]string{"cut", "--repo", repo, "--version", "v0.1.0", "--date", "2026-01-02"}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"[Unreleased] is now [0.1.0] - 2026-01-02", "Release v0.1.0", "tagged v0.1.0", "version 0.2.0-dev, appVersion v0.2.0-dev", "next: git push origin main v0.1.0"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("cut printed:\n%s\nwant %q in it", out.String(), want)
		}
	}
	if got := mustGit(t, repo, "log", "--format=%s", "-3"); got != "Begin v0.2.0-dev: charts/nftmesh/Chart.yaml names the version under development\nRelease v0.1.0\nstart" {
		t.Errorf("commits:\n%s", got)
	}
	if got := mustGit(t, repo, "describe", "--exact-match", "HEAD~1"); got != "v0.1.0" {
		t.Errorf("the release commit is tagged %q, want v0.1.0", got)
	}
	if got := mustGit(t, repo, "diff", "--name-only", "HEAD~2", "HEAD"); got != changelogPath+"\n"+chartPath {
		t.Errorf("the release changed %q, want only CHANGELOG.md and Chart.yaml", got)
	}
	if got := mustGit(t, repo, "show", "v0.1.0:"+changelogPath); got+"\n" != firstReleased {
		t.Errorf("CHANGELOG.md at v0.1.0:\n%s\nwant:\n%s", got, firstReleased)
	}
	atTag := mustGit(t, repo, "show", "v0.1.0:"+chartPath)
	if !strings.Contains(atTag, "\nversion: 0.1.0\nappVersion: \"v0.1.0\"\n") || !strings.Contains(atTag, "# a comment that stays") {
		t.Errorf("Chart.yaml at v0.1.0:\n%s", atTag)
	}
	if got := read(t, repo, chartPath); !strings.Contains(got, "\nversion: 0.2.0-dev\nappVersion: \"v0.2.0-dev\"\n") {
		t.Errorf("Chart.yaml after the release:\n%s", got)
	}
	out.Reset()
	if err := run([]string{"check", "--repo", repo}, &out); err != nil || !strings.Contains(out.String(), "v0.2.0 in development; last release: tag v0.1.0") {
		t.Errorf("check after the release: %v %s", err, out.String())
	}
	mustGit(t, repo, "checkout", "-q", "v0.1.0")
	out.Reset()
	if err := run([]string{"check", "--repo", repo}, &out); err != nil || !strings.Contains(out.String(), "release v0.1.0, CHANGELOG.md [0.1.0] - 2026-01-02") {
		t.Errorf("check at the tag: %v %s", err, out.String())
	}
	out.Reset()
	if err := run([]string{"notes", "--repo", repo, "--version", "v0.1.0"}, &out); err != nil || out.String() != "### Added\n\n- One thing.\n- Another.\n" {
		t.Errorf("notes at the tag: %v %q", err, out.String())
	}
}

// state is what a refused cut must leave as it was.
func state(t *testing.T, repo string) string {
	return mustGit(t, repo, "rev-parse", "HEAD") + "|" + mustGit(t, repo, "tag", "--list") + "|" +
		mustGit(t, repo, "status", "--porcelain") + "|" + read(t, repo, chartPath) + "|" + read(t, repo, changelogPath)
}

// TestCutRefuses: a bad version, a version not newer than the last, a
// dirty tree, a detached HEAD, nothing unreleased: each refused with a
// message naming the value, and nothing written.
func TestCutRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, version string
		setup         func(t *testing.T, repo string)
		want          string
	}{
		{"no version", "", nil, "VERSION is not given"},
		{"no v", "0.1.0", nil, `VERSION "0.1.0" is not SemVer with a leading v`},
		{"pre-release", "v0.1.0-rc.1", nil, `VERSION "v0.1.0-rc.1" is a pre-release`},
		{"tagged already", "v0.1.0", func(t *testing.T, repo string) { mustGit(t, repo, "tag", "v0.1.0") }, "VERSION v0.1.0 is released already: tag v0.1.0 exists"},
		{"older than a tag", "v0.1.0", func(t *testing.T, repo string) { mustGit(t, repo, "tag", "v0.3.0") }, "VERSION v0.1.0 is not newer than the last release v0.3.0 (tag v0.3.0)"},
		{"older than the changelog", "v0.1.0", func(t *testing.T, repo string) {
			write(t, repo, changelogPath, strings.Replace(firstLog, "[Unreleased]\n", "[Unreleased]\n\n- x\n\n## [0.2.0] - 2026-01-01\n", 1))
			mustGit(t, repo, "commit", "-q", "-am", "older")
		}, "VERSION v0.1.0 is not newer than the last release v0.2.0 (CHANGELOG.md [0.2.0])"},
		{"changed file", "v0.1.0", func(t *testing.T, repo string) { write(t, repo, chartPath, devChart+"# edited\n") }, `the working tree has 1 changed or untracked path(s), first " M charts/nftmesh/Chart.yaml"`},
		{"untracked file", "v0.1.0", func(t *testing.T, repo string) { write(t, repo, "notes.txt", "x") }, `first "?? notes.txt": commit or remove them before releasing v0.1.0`},
		{"detached", "v0.1.0", func(t *testing.T, repo string) { mustGit(t, repo, "checkout", "-q", "--detach") }, "HEAD is not on a branch"},
		{"nothing unreleased", "v0.1.0", func(t *testing.T, repo string) {
			write(t, repo, changelogPath, "## [Unreleased]\n\n### Added\n")
			mustGit(t, repo, "commit", "-q", "-am", "empty")
		}, "the [Unreleased] section is empty: say what v0.1.0 changes"},
		{"chart by hand", "v0.1.0", func(t *testing.T, repo string) {
			write(t, repo, chartPath, strings.Replace(devChart, `"v0.1.0-dev"`, `"0.1.0"`, 1))
			mustGit(t, repo, "commit", "-q", "-am", "by hand")
		}, `appVersion "0.1.0" is not version "0.1.0-dev" with a leading v`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repo := newRepo(t)
			if tc.setup != nil {
				tc.setup(t, repo)
			}
			before := state(t, repo)
			var out bytes.Buffer
			err := run([]string{"cut", "--repo", repo, "--version", tc.version}, &out)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("cut %q: %v, want an error containing %q", tc.version, err, tc.want)
			}
			if after := state(t, repo); after != before || out.Len() > 0 {
				t.Errorf("a refused cut changed the repository or printed %q:\nbefore %s\nafter  %s", out.String(), before, after)
			}
		})
	}
}

// TestCutCommitFails: when git refuses the release commit (a hook here),
// both files are put back and there is no tag.
func TestCutCommitFails(t *testing.T) {
	repo := newRepo(t)
	write(t, repo, ".git/hooks/pre-commit", "#!/bin/sh\necho no commits today >&2\nexit 1\n")
	if err := os.Chmod(filepath.Join(repo, ".git/hooks/pre-commit"), 0o755); err != nil {
		t.Fatal(err)
	}
	before := state(t, repo)
	err := run([]string{"cut", "--repo", repo, "--version", "v0.1.0"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "committing release v0.1.0") || !strings.Contains(err.Error(), "no commits today") {
		t.Fatalf("cut with a failing commit: %v", err)
	}
	if after := state(t, repo); after != before {
		t.Errorf("the failed cut left changes:\nbefore %s\nafter  %s", before, after)
	}
}

// TestCheckRefuses: Chart.yaml and CHANGELOG.md that tell two stories.
func TestCheckRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, chart, log, tag, want string
	}{
		{"release not in the changelog", strings.NewReplacer("0.1.0-dev", "0.1.0").Replace(devChart), firstLog, "",
			"says release 0.1.0, but CHANGELOG.md's newest release is none: it must name the chart's version (## [0.1.0] - YYYY-MM-DD)"},
		{"release behind the changelog", strings.NewReplacer("0.1.0-dev", "0.1.0").Replace(devChart), "## [Unreleased]\n\n## [0.0.9] - 2025-01-01\n\n- x\n", "",
			"says release 0.1.0, but CHANGELOG.md's newest release is [0.0.9]"},
		{"dev but released", devChart, firstReleased, "", "says 0.1.0-dev, in development, but CHANGELOG.md [0.1.0] is released already"},
		{"dev but tagged", devChart, firstLog, "v0.1.0", "says 0.1.0-dev, in development, but tag v0.1.0 is released already"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repo := newRepo(t)
			write(t, repo, chartPath, tc.chart)
			write(t, repo, changelogPath, tc.log)
			if tc.tag != "" {
				mustGit(t, repo, "tag", tc.tag)
			}
			if err := run([]string{"check", "--repo", repo}, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("check: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

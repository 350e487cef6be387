package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// cut makes release v from the checked-out branch: the release commit and
// its tag, then the commit that opens the next development version.
func cut(repo, v, date string, out io.Writer) error {
	v, err := parseRelease(v)
	if err != nil {
		return err
	}
	t, err := readTree(repo)
	if err != nil {
		return err
	}
	if err := t.refuseOld(v); err != nil {
		return err
	}
	if err := clean(repo, v); err != nil {
		return err
	}
	newLog, err := t.log.released(v, date)
	if err != nil {
		return err
	}
	name := v[1:]
	if err := t.write(t.chart.stamped(name), newLog); err != nil {
		return err
	}
	hash, err := commit(repo, "Release "+v, changelogPath, chartPath)
	if err != nil {
		return t.undo(fmt.Errorf("committing release %s: %w", v, err))
	}
	fmt.Fprintf(out, "%s: [Unreleased] is now [%s] - %s\n%s: version %s, appVersion %s\ncommitted %s Release %s\n",
		changelogPath, name, date, chartPath, name, v, hash, v)
	if _, err := git(repo, "tag", "-a", v, "-m", "nftmesh "+v); err != nil {
		return fmt.Errorf("release commit %s is made but not tagged (tag it with git tag -a %s, or drop it with git reset --hard HEAD~1): %w", hash, v, err)
	}
	fmt.Fprintf(out, "tagged %s\n", v)
	dev := nextDev(v)
	if err := os.WriteFile(filepath.Join(repo, chartPath), t.chart.stamped(dev), 0o644); err != nil {
		return fmt.Errorf("release %s is tagged; opening %s-dev: %w", v, dev, err)
	}
	msg := "Begin v" + dev + ": " + chartPath + " names the version under development"
	if hash, err = commit(repo, msg, chartPath); err != nil {
		return fmt.Errorf("release %s is tagged; committing %s (git checkout -- %s drops it): %w", v, dev, chartPath, err)
	}
	fmt.Fprintf(out, "%s: version %s, appVersion v%s\ncommitted %s %s\n", chartPath, dev, dev, hash, msg)
	branch, _ := git(repo, "symbolic-ref", "--short", "HEAD")
	fmt.Fprintf(out, "next: git push origin %s %s (the tag starts .github/workflows/release.yml)\n", branch, v)
	return nil
}

// write writes both files.
func (t *tree) write(chart, log []byte) error {
	if err := os.WriteFile(filepath.Join(t.repo, changelogPath), log, 0o644); err != nil {
		return t.undo(err)
	}
	if err := os.WriteFile(filepath.Join(t.repo, chartPath), chart, 0o644); err != nil {
		return t.undo(err)
	}
	return nil
}

// undo puts both files back as they were read and returns err.
func (t *tree) undo(err error) error {
	for _, f := range []struct {
		path string
		data []byte
	}{{changelogPath, t.changelogRaw}, {chartPath, t.chartRaw}} {
		if werr := os.WriteFile(filepath.Join(t.repo, f.path), f.data, 0o644); werr != nil {
			return fmt.Errorf("%w; putting %s back failed too (git checkout -- %s): %w", err, f.path, f.path, werr)
		}
	}
	return err
}

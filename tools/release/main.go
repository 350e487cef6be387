// Command release cuts an nftmesh release and reads one back (docs/releasing.md):
//
//	release cut   [--repo DIR] [--version vX.Y.Z] [--date YYYY-MM-DD]
//	release check [--repo DIR]
//	release notes [--repo DIR] --version vX.Y.Z
//
// cut (`make release VERSION=vX.Y.Z`) stamps the release into
// charts/nftmesh/Chart.yaml (version X.Y.Z, appVersion vX.Y.Z) and
// CHANGELOG.md (the Unreleased section becomes "## [X.Y.Z] - date"),
// commits, tags vX.Y.Z, then sets Chart.yaml to the next version under
// development (X.Y+1.0-dev) and commits that. It refuses a version that is
// not vMAJOR.MINOR.PATCH or not newer than the last release (tags and
// CHANGELOG.md), a working tree with changes, and an empty Unreleased
// section. The version comes from --version or, as make passes it,
// $NFTMESH_RELEASE_VERSION. check says whether Chart.yaml and CHANGELOG.md
// agree; notes prints a release's CHANGELOG.md section (the GitHub
// release's text). The release workflow runs both.
//
// A module of its own: nothing here ships in a binary.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("want a command: cut, check or notes")
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	repo := fs.String("repo", "", "the repository's top directory (default: the git checkout holding the working directory)")
	version := fs.String("version", os.Getenv("NFTMESH_RELEASE_VERSION"), "the release, vX.Y.Z")
	date := fs.String("date", time.Now().UTC().Format(time.DateOnly), "the release's date in CHANGELOG.md")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %s", args[0], shown(fs.Arg(0)))
	}
	if *repo == "" {
		top, err := git(".", "rev-parse", "--show-toplevel")
		if err != nil {
			return fmt.Errorf("no --repo, and the working directory is not in a git checkout: %w", err)
		}
		*repo = top
	}
	switch args[0] {
	case "cut":
		if _, err := time.Parse(time.DateOnly, *date); err != nil {
			return fmt.Errorf("--date %s is not YYYY-MM-DD", shown(*date))
		}
		return cut(*repo, *version, *date, out)
	case "check":
		return check(*repo, out)
	case "notes":
		return notes(*repo, *version, out)
	}
	return fmt.Errorf("unknown command %s: want cut, check or notes", shown(args[0]))
}

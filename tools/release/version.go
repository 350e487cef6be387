package main

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/mod/semver"
)

// maxShown bounds how much of a bad value an error repeats.
const maxShown = 64

// shown quotes s for an error message, cut to maxShown bytes.
func shown(s string) string {
	if len(s) > maxShown {
		return fmt.Sprintf("%q (%d bytes)", s[:maxShown]+"...", len(s))
	}
	return fmt.Sprintf("%q", s)
}

// parseRelease checks that v names a release `make release` cuts:
// vMAJOR.MINOR.PATCH, SemVer with a leading v, nothing after the patch.
func parseRelease(v string) (string, error) {
	const want = "want vMAJOR.MINOR.PATCH (SemVer with a leading v), e.g. make release VERSION=v0.1.0"
	switch {
	case v == "":
		return "", errors.New("VERSION is not given: " + want)
	case !strings.HasPrefix(v, "v") || !semver.IsValid(v):
		return "", fmt.Errorf("VERSION %s is not SemVer with a leading v: %s", shown(v), want)
	case semver.Build(v) != "":
		return "", fmt.Errorf("VERSION %s has build metadata %s: an image tag cannot hold \"+\"; %s", shown(v), shown(semver.Build(v)), want)
	case semver.Prerelease(v) != "":
		return "", fmt.Errorf("VERSION %s is a pre-release (%s): make release cuts releases only; %s", shown(v), shown(semver.Prerelease(v)), want)
	case semver.Canonical(v) != v:
		return "", fmt.Errorf("VERSION %s leaves out part of MAJOR.MINOR.PATCH: %s", shown(v), want)
	}
	return v, nil
}

// nextDev is the version under development after release v (vX.Y.Z): the
// next minor release, X.Y+1.0-dev, without the "v". A patch release may
// still come first; the dev version only has to sort after v.
func nextDev(v string) string {
	var major, minor int
	// v passed parseRelease: the scan cannot fail.
	_, _ = fmt.Sscanf(semver.MajorMinor(v), "v%d.%d", &major, &minor)
	return fmt.Sprintf("%d.%d.0-dev", major, minor+1)
}

// newest returns the highest valid SemVer of vs ("" when none is).
func newest(vs []string) string {
	best := ""
	for _, v := range vs {
		if semver.IsValid(v) && (best == "" || semver.Compare(v, best) > 0) {
			best = v
		}
	}
	return best
}

#!/bin/sh
# version.sh APP_VERSION: the version this checkout builds, which the
# Makefile stamps into the binaries, tags the image with and packages the
# chart as (docs/releasing.md).
#
# APP_VERSION is charts/nftmesh/Chart.yaml's appVersion: vX.Y.Z at a
# release tag (`make release` writes it there), vX.Y.Z-dev between releases.
#
#   the release tag vX.Y.Z, nothing changed    vX.Y.Z
#   anything else                              vX.Y.Z-dev.N.gHASH[.dirty]
#
# N counts the commits since the last release tag (all commits before the
# first), HASH is the commit, .dirty marks changed or untracked files: a
# development build says it is one, and which commit it is. The dev form is
# SemVer (the chart's version is it without the "v") and a valid image tag
# (no "+", which OCI tags cannot hold). Outside a git checkout (a source
# tarball) it is APP_VERSION itself.
set -eu
app=${1:?usage: version.sh APP_VERSION (charts/nftmesh/Chart.yaml appVersion)}

# No index refresh (and so no lock) when several makes run at once.
export GIT_OPTIONAL_LOCKS=0
top=$(cd "$(dirname "$0")/../.." && pwd)
if [ ! -e "$top/.git" ]; then
	echo "$app"
	exit 0
fi
# A checkout git cannot read (another user's without safe.directory, a
# broken clone) must not pass for a source tarball.
if ! err=$(git -C "$top" rev-parse --verify HEAD 2>&1 >/dev/null); then
	echo "version.sh: $top is a git checkout, but git cannot read it: $err" >&2
	exit 1
fi
cd "$top"
changed=$(git status --porcelain | head -n 1)
case $app in
*-*) ;;
*)
	if [ -z "$changed" ] && git tag --points-at HEAD | grep -qxF -- "$app"; then
		echo "$app"
		exit 0
	fi
	;;
esac
if last=$(git describe --tags --abbrev=0 --match 'v[0-9]*.[0-9]*.[0-9]*' 2>/dev/null); then
	n=$(git rev-list --count "$last..HEAD")
else
	n=$(git rev-list --count HEAD)
fi
echo "${app%-dev}-dev.$n.g$(git rev-parse --short HEAD)${changed:+.dirty}"

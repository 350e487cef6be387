#!/bin/sh
# Builds Istio's own binaries from the pinned tools module next to this script
# (istio.io/istio through the Go module proxy) into a git-ignored cache
# directory, skipping any that already exist.
# Usage: build-istio.sh OUTDIR NAME...   (NAME: pilot-agent, istioctl, istio-cni)
# One `go build` for both shares the compile work (about 6 minutes cold on
# two cores).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
out=$1
shift

# The module proxy serves istio.io/istio only as a pseudo-version of master;
# the binaries report the release line it is on (VERSION file: 1.31) the way
# Istio's own Makefile stamps a master build ("-dev"), plus the commit.
mod=$(cd "$here/istio" && go list -m -f '{{.Version}}' istio.io/istio)
rev=${mod##*-}
version=1.31-dev

mkdir -p "$out"
out=$(cd "$out" && pwd)
pkgs=""
for name in "$@"; do
	case $name in
	pilot-agent) pkg=istio.io/istio/pilot/cmd/pilot-agent ;;
	istioctl) pkg=istio.io/istio/istioctl/cmd/istioctl ;;
	istio-cni) pkg=istio.io/istio/cni/cmd/istio-cni ;;
	*) echo "build-istio.sh: unknown binary $name (pilot-agent, istioctl, istio-cni)" >&2; exit 2 ;;
	esac
	if [ -x "$out/$name" ]; then
		echo "istio: $out/$name exists, not rebuilding (delete it to rebuild)"
	else
		pkgs="$pkgs $pkg"
	fi
done
[ -n "$pkgs" ] || exit 0

echo "istio: building istio.io/istio@$mod:$pkgs into $out (takes a few minutes)"
tmp=$(mktemp -d "$out/.build-istio.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$here/istio"
v=istio.io/istio/pkg/version
# Static, as Istio's own images ship them: pilot-agent runs inside a
# container image with no libc. The hub stays unstamped so istioctl takes
# images from its built-in profile instead of inventing a registry.
# shellcheck disable=SC2086
CGO_ENABLED=0 go build -trimpath -o "$tmp/" \
	-ldflags "-s -w -X $v.buildVersion=$version -X $v.buildGitRevision=$rev -X $v.buildStatus=Clean -X $v.buildTag=$version -X $v.buildOS=$(go env GOOS) -X $v.buildArch=$(go env GOARCH)" \
	$pkgs
for f in "$tmp"/*; do
	mv "$f" "$out/"
	echo "istio: built $out/$(basename "$f")"
done

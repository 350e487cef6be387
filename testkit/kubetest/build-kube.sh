#!/bin/sh
# Builds Kubernetes v1.35.4 binaries from the pinned tools module next to this
# script into a git-ignored cache directory, skipping any that already exist.
# Usage: build-kube.sh OUTDIR NAME...   (NAME: kube-apiserver, kubelet, ...)
# One `go build` for all names shares the compile work: the apiserver alone
# takes about 3.5 minutes cold and 2 GB of RAM, the whole cluster set about
# twice that.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
out=$1
shift
version=v1.35.4

mkdir -p "$out"
out=$(cd "$out" && pwd)
pkgs=""
for name in "$@"; do
	if [ -x "$out/$name" ]; then
		echo "kube: $out/$name exists, not rebuilding (delete it to rebuild)"
	else
		pkgs="$pkgs k8s.io/kubernetes/cmd/$name"
	fi
done
[ -n "$pkgs" ] || exit 0

echo "kube: building $version:$pkgs into $out (takes a few minutes)"
tmp=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$here/kube-apiserver"
# Without the version stamps the binaries report v0.0.0, which clients reject
# in version negotiation (and kubelet refuses to register).
# shellcheck disable=SC2086
go build -trimpath -o "$tmp/" \
	-ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=35" \
	$pkgs
for f in "$tmp"/*; do
	mv "$f" "$out/"
	echo "kube: built $out/$(basename "$f")"
done

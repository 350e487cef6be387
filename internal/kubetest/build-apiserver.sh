#!/bin/sh
# Builds the kube-apiserver binary the kubetest helper starts, from the pinned
# tools module next to this script, into a git-ignored cache directory.
# Usage: build-apiserver.sh [OUTPUT]   (default: <repo>/.cache/kube-apiserver)
# A cold build takes about 3.5 minutes and 2 GB of RAM; an existing binary is kept.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:-${KUBE_APISERVER:-$repo/.cache/kube-apiserver}}
version=v1.35.4

if [ -x "$out" ]; then
	echo "kube-apiserver: $out exists, not rebuilding (delete it to rebuild)"
	exit 0
fi

mkdir -p "$(dirname "$out")"
echo "kube-apiserver: building $version into $out (takes a few minutes)"
cd "$here/kube-apiserver"
# Without the version stamps the binary reports v0.0.0, which clients reject
# in version negotiation.
go build -trimpath -o "$out.tmp" \
	-ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=35" \
	k8s.io/kubernetes/cmd/kube-apiserver
mv "$out.tmp" "$out"
echo "kube-apiserver: built $out"

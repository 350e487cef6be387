#!/bin/sh
# Builds Kubernetes' own end-to-end suite, e2e.test, at v1.35.4 from the
# pinned tools module next to this script (`make conformance` runs its
# [sig-network] [Conformance] specs against the cluster e2e's rig).
# Usage: build-e2e.sh OUTPUT   (skipped when OUTPUT exists)
# The suite's test-only dependencies (k8s.io/sample-apiserver, ...) have no
# go.sum lines in the tools module, so it builds in a scratch copy of the
# module with GOFLAGS=-mod=mod: the module's own go.mod and go.sum are never
# rewritten. About 9 minutes and 3 GB of RAM on two cores, cold.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
out=$1
version=v1.35.4

if [ -x "$out" ]; then
	echo "e2e: $out exists, not rebuilding (delete it to rebuild)"
	exit 0
fi
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
tmp=$(mktemp -d "$(dirname "$out")/.build-e2e.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cp "$here/kube-apiserver/go.mod" "$here/kube-apiserver/go.sum" "$here/kube-apiserver/tools.go" "$tmp/"
echo "e2e: building k8s.io/kubernetes/test/e2e $version into $out (about 9 minutes)"
cd "$tmp"
GOFLAGS=-mod=mod go test -c -trimpath -o "$tmp/e2e.test" \
	-ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=35" \
	k8s.io/kubernetes/test/e2e
mv "$tmp/e2e.test" "$out"
echo "e2e: built $out"

#!/bin/sh
# Builds the programs of the conformance run's images (make conformance),
# each skipped when it exists:
#   OUTDIR/agnhost-2.59: Kubernetes' e2e test image's program, from
#     k8s.io/kubernetes/test/images/agnhost at v1.35.4 (whose VERSION file
#     says 2.59, the tag e2e.test v1.35.4 asks for), built in a scratch copy
#     of the tools module next to this script, as build-e2e.sh does;
#   OUTDIR/coredns-$COREDNS_VERSION: the cluster DNS.
# Usage: build-conformance-bins.sh OUTDIR
set -eu

here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$1"
out=$(cd "$1" && pwd)
coredns=${COREDNS_VERSION:-v1.14.7}

if [ -x "$out/agnhost-2.59" ]; then
	echo "conformance: $out/agnhost-2.59 exists, not rebuilding"
else
	tmp=$(mktemp -d "$out/.build-agnhost.XXXXXX")
	cp "$here/kube-apiserver/go.mod" "$here/kube-apiserver/go.sum" "$here/kube-apiserver/tools.go" "$tmp/"
	echo "conformance: building agnhost 2.59 (k8s.io/kubernetes v1.35.4)"
	(cd "$tmp" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$tmp/agnhost" k8s.io/kubernetes/test/images/agnhost)
	mv "$tmp/agnhost" "$out/agnhost-2.59"
	rm -rf "$tmp"
	echo "conformance: built $out/agnhost-2.59"
fi

# agnhost's porter serves TLS with the certificate its image carries in /
# (localhost.crt, localhost.key: the proxy specs' TLS ports).
if [ ! -f "$out/agnhost-2.59.localhost.key" ]; then
	tmp=$(mktemp -d "$out/.agnhost-porter.XXXXXX")
	cp "$here/kube-apiserver/go.mod" "$here/kube-apiserver/go.sum" "$here/kube-apiserver/tools.go" "$tmp/"
	src=$(cd "$tmp" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' k8s.io/kubernetes)/test/images/agnhost/porter
	cp "$src/localhost.crt" "$out/agnhost-2.59.localhost.crt"
	cp "$src/localhost.key" "$out/agnhost-2.59.localhost.key"
	chmod 644 "$out/agnhost-2.59.localhost.crt" "$out/agnhost-2.59.localhost.key"
	rm -rf "$tmp"
fi

if [ -x "$out/coredns-$coredns" ]; then
	echo "conformance: $out/coredns-$coredns exists, not rebuilding"
else
	tmp=$(mktemp -d "$out/.build-coredns.XXXXXX")
	echo "conformance: building coredns $coredns"
	CGO_ENABLED=0 GOBIN="$tmp" go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$coredns"
	mv "$tmp/coredns" "$out/coredns-$coredns"
	rm -rf "$tmp"
	echo "conformance: built $out/coredns-$coredns"
fi

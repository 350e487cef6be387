#!/bin/sh
# Builds flannel and its CNI plugin from the Go module proxy into OUTDIR,
# skipping what already exists. Usage: build.sh OUTDIR
#   flanneld-<FLANNEL_VERSION>          github.com/flannel-io/flannel's daemon
#   flannel-install-conf-<FLANNEL_VERSION>  its cmd/install_conf (what its
#                                       DaemonSet's init containers run)
#   flannel-cni-<PLUGINS_VERSION>       the `flannel` CNI meta plugin from
#                                       containernetworking/plugins (its
#                                       later home, flannel-io/cni-plugin,
#                                       is not on the proxy; v0.9.1 is the
#                                       newest served release that has it)
# All static (no cgo) and stamped with their versions. flanneld is built
# from the module's own source with two backends left out of main.go: the
# Tencent Cloud VPC one (its SDK module is not on the proxy) and the UDP one
# (cgo). The cluster e2e's multi-node test runs VXLAN (docs/e2e.md).
set -eu

out=$1
flannel_version=${FLANNEL_VERSION:-v0.28.10}
plugins_version=${CNI_PLUGINS_FLANNEL_VERSION:-v0.9.1}
flanneld=flanneld-$flannel_version
installconf=flannel-install-conf-$flannel_version
plugin=flannel-cni-$plugins_version

mkdir -p "$out"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d "$out/.build.XXXXXX")
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

if [ -x "$out/$flanneld" ] && [ -x "$out/$installconf" ]; then
	echo "flannel: $out/$flanneld and $installconf exist, not rebuilding (delete them to rebuild)"
else
	echo "flannel: building github.com/flannel-io/flannel@$flannel_version into $out"
	src=$(go mod download -json "github.com/flannel-io/flannel@$flannel_version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	[ -n "$src" ] || { echo "flannel: go mod download gave no directory" >&2; exit 1; }
	cp -R "$src" "$tmp/src"
	chmod -R u+w "$tmp/src"
	sed -i -e '\|"github.com/flannel-io/flannel/pkg/backend/tencentvpc"|d' \
		-e '\|"github.com/flannel-io/flannel/pkg/backend/udp"|d' "$tmp/src/main.go"
	if grep -q 'backend/tencentvpc"\|backend/udp"' "$tmp/src/main.go"; then
		echo "flannel: main.go still imports the tencentvpc or udp backend" >&2
		exit 1
	fi
	(cd "$tmp/src" && go build -trimpath -o "$tmp/flanneld" \
		-ldflags "-s -w -X github.com/flannel-io/flannel/pkg/version.Version=$flannel_version" . &&
		go build -trimpath -o "$tmp/install-conf" -ldflags "-s -w" ./cmd/install_conf)
	mv "$tmp/flanneld" "$out/$flanneld"
	mv "$tmp/install-conf" "$out/$installconf"
	echo "flannel: built $out/$flanneld $out/$installconf"
fi

if [ -x "$out/$plugin" ]; then
	echo "flannel: $out/$plugin exists, not rebuilding (delete it to rebuild)"
else
	echo "flannel: building the flannel CNI plugin of containernetworking/plugins@$plugins_version into $out"
	GOBIN="$tmp/bin" go install -trimpath \
		-ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$plugins_version" \
		"github.com/containernetworking/plugins/plugins/meta/flannel@$plugins_version"
	mv "$tmp/bin/flannel" "$out/$plugin"
	echo "flannel: built $out/$plugin"
fi

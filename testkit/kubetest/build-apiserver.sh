#!/bin/sh
# Builds the kube-apiserver binary the kubetest helper starts (see build-kube.sh).
# Usage: build-apiserver.sh [OUTPUT]   (default: <repo>/.cache/kube-apiserver)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:-${KUBE_APISERVER:-$repo/.cache/kube-apiserver}}
[ "$(basename "$out")" = kube-apiserver ] || { echo "build-apiserver.sh: OUTPUT must end in /kube-apiserver" >&2; exit 2; }
exec "$here/build-kube.sh" "$(dirname "$out")" kube-apiserver

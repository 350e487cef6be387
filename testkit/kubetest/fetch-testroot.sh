#!/usr/bin/env bash
# fetch-testroot.sh OUT.tar: the root file system of the conformance run's
# test images (make conformance): Debian bookworm's shell and the tools
# Kubernetes' e2e specs exec in their pods (sh, bash, coreutils, dig, getent,
# awk, curl, nc, ip, busybox), each package with its whole dependency
# closure, unpacked (no maintainer scripts run) and packed as one tarball
# layer. Skipped when OUT.tar exists. The machine's packages and apt state
# are never touched: apt works on private lists in a scratch directory.
set -euo pipefail
out=$1
[ -f "$out" ] && { echo "testroot: $out exists, not refetching"; exit 0; }
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
work=$(mktemp -d "$out.XXXXXX")
trap 'rm -rf "$work"' EXIT
apt="$work/apt" root="$work/root"
mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/debs" "$root"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main" >"$apt/sources.list"
: >"$apt/status"
opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
      -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache"
      -o "Dir::State::Status=$apt/status" -o APT::Architecture=amd64
      -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
apt-get "${opts[@]}" update -q >/dev/null
want="bash dash coreutils libc-bin mawk grep sed findutils procps hostname
      bind9-dnsutils curl netcat-openbsd iproute2 busybox ca-certificates"
# shellcheck disable=SC2086
pkgs=$(apt-cache "${opts[@]}" depends --recurse --no-recommends --no-suggests \
         --no-conflicts --no-breaks --no-replaces --no-enhances $want |
       grep -v '^ ' | grep -v '^<' | sort -u)
# shellcheck disable=SC2086
(cd "$apt/debs" && apt-get "${opts[@]}" download -q $pkgs >/dev/null)
for deb in "$apt/debs"/*.deb; do dpkg-deb -x "$deb" "$root"; done
# What maintainer scripts and base-files would have made.
[ -e "$root/bin/sh" ] || ln -s dash "$root/bin/sh"
[ -e "$root/usr/bin/awk" ] || ln -s mawk "$root/usr/bin/awk"
[ -e "$root/bin/nc" ] || ln -s nc.openbsd "$root/bin/nc"
mkdir -p "$root/etc" "$root/tmp" "$root/root" "$root/uploads" "$root/results"
chmod 1777 "$root/tmp"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\nuser-defined-in-image:x:1000:1000::/:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\ngroup-defined-in-image:x:50000:user-defined-in-image\nuser-defined-in-image:x:1000:\n' >"$root/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$root/etc/nsswitch.conf"
rm -rf "$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/info" "$root/usr/share/locale"
tar -C "$root" --sort=name --numeric-owner --owner=0 --group=0 --mtime=@0 -cf "$work/root.tar" .
mv "$work/root.tar" "$out"
echo "testroot: $out ($(du -h "$out" | cut -f1), $(echo "$pkgs" | wc -l) packages)"

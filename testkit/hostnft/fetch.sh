#!/usr/bin/env bash
# fetch.sh DEST SUITE...: unpacks Debian's nftables (the `nft` command) of
# each SUITE (bookworm, trixie, ...) with its whole library closure, its own
# libc included, into DEST/<suite>/root, and writes DEST/<suite>/nft, a
# launcher that runs that nft through its own dynamic loader. The machine's
# packages, its /usr/sbin/nft and its apt state are never touched: apt works
# on private lists under DEST. Test-only: the host nft version matrix
# (nft/hostnft_test.go) reads back what nftmesh wrote with each of them.
set -euo pipefail
dest=$1; shift
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
for suite in "$@"; do
  out="$dest/$suite"
  if [ -x "$out/nft" ] && "$out/nft" --version >/dev/null 2>&1; then
    continue
  fi
  rm -rf "$out"
  apt="$out/apt"
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/debs" "$out/root"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main" >"$apt/sources.list"
  : >"$apt/status"
  opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
        -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache"
        -o "Dir::State::Status=$apt/status" -o APT::Architecture=amd64
        -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
  apt-get "${opts[@]}" update -q >/dev/null
  pkgs=$(apt-cache "${opts[@]}" depends --recurse --no-recommends --no-suggests \
           --no-conflicts --no-breaks --no-replaces --no-enhances --no-pre-depends nftables |
         grep -v '^ ' | grep -v '^<' | sort -u)
  (cd "$apt/debs" && apt-get "${opts[@]}" download -q $pkgs >/dev/null)
  for deb in "$apt/debs"/*.deb; do dpkg-deb -x "$deb" "$out/root"; done
  ld=$(find "$out/root" -name 'ld-linux-x86-64.so.2' -type f | head -n 1)
  [ -n "$ld" ] || { echo "fetch.sh: no dynamic loader in $suite's libc6" >&2; exit 1; }
  cat >"$out/nft" <<LAUNCH
#!/bin/sh
# Debian $suite's nft, run with its own libraries (written by testkit/hostnft/fetch.sh).
r='$out/root'
exec "$ld" --library-path "\$r/lib/x86_64-linux-gnu:\$r/usr/lib/x86_64-linux-gnu" "\$r/usr/sbin/nft" "\$@"
LAUNCH
  chmod +x "$out/nft"
  rm -rf "$apt"
  "$out/nft" --version
done

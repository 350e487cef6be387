#!/usr/bin/env bash
# Runs every Fuzz target in the given directories for FUZZTIME each.
#
# A failure is real when the fuzzer wrote a reproducer (testdata/fuzz/<target>/)
# or the log shows a failing test; then the whole log is printed and we stop.
# Go's fuzzer also fails, now and then, with a bare "context deadline exceeded"
# when -fuzztime runs out while a worker is mid-call (golang/go#51484,
# golang/go#75804) — no input, nothing to reproduce. That case is retried once
# and counts as a failure only if it happens again.
set -uo pipefail
fuzztime=${FUZZTIME:-10s}
go=${GO:-go}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

corpus_count() { find "$1/testdata/fuzz/$2" -type f 2>/dev/null | wc -l; }

run_one() { # dir target -> 0 pass, 1 real failure, 2 deadline flake
	local dir=$1 t=$2 before after rc
	before=$(corpus_count "$dir" "$t")
	"$go" test "$dir" -run '^$' -fuzz "^$t\$" -fuzztime "$fuzztime" -fuzzminimizetime 2s >"$log" 2>&1
	rc=$?
	after=$(corpus_count "$dir" "$t")
	if [ "$rc" -eq 0 ]; then
		grep -E '^fuzz: elapsed' "$log" | tail -n 1
		return 0
	fi
	cat "$log"
	if [ "$after" -gt "$before" ] || grep -qE 'Failing input written|^\s+\S+_test\.go:[0-9]+:|panic:' "$log"; then
		echo "fuzz $dir $t: a real failure (reproducer under $dir/testdata/fuzz/$t)"
		return 1
	fi
	if grep -q 'context deadline exceeded' "$log"; then
		return 2
	fi
	return 1
}

status=0
for f in $(grep -rl --include='*_test.go' '^func Fuzz' "$@" | sort); do
	dir=./$(dirname "$f")
	for t in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$f" | cut -c6-); do
		echo "fuzz $dir $t ($fuzztime)"
		run_one "$dir" "$t"
		rc=$?
		if [ "$rc" -eq 2 ]; then
			echo "fuzz $dir $t: the fuzzer hit its own deadline without an input (golang/go#51484); once more"
			run_one "$dir" "$t"
			rc=$?
		fi
		if [ "$rc" -ne 0 ]; then
			status=1
			break 2
		fi
	done
done
exit "$status"

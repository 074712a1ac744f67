#!/bin/sh
# Prints the command that replays each test that failed in the last `cargo nextest run` of a
# profile (read from its JUnit report), one line per test, e.g.
#   cargo nextest run --profile default -p cluster-tests -E 'binary_id(cluster-tests::it) & test(=locks::x)'
# Usage: scripts/replay-failures.sh [PROFILE]   (default: default)
set -eu

profile=${1:-default}
root=$(cd "$(dirname "$0")/.." && pwd)
report="${CARGO_TARGET_DIR:-$root/target}/nextest/$profile/junit.xml"

if [ ! -f "$report" ]; then
	echo "replay-failures: no report at $report (did the run build its tests?)" >&2
	exit 0
fi

awk -v profile="$profile" '
function attr(line, key,    rest) {
	if (match(line, key "=\"[^\"]*\"") == 0) return ""
	rest = substr(line, RSTART + length(key) + 2, RLENGTH - length(key) - 3)
	return rest
}
/<testcase / { name = attr($0, "name"); binary = attr($0, "classname"); reported = 0 }
/<(failure|error)[ >\/]/ {
	if (name != "" && !reported) {
		pkg = binary; sub(/::.*/, "", pkg)
		if (count++ == 0) print "Failed; replay each with:"
		printf "  cargo nextest run --profile %s -p %s -E '\''binary_id(%s) & test(=%s)'\''\n", profile, pkg, binary, name
		reported = 1
	}
}
' "$report"

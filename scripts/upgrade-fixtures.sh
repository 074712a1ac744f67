#!/usr/bin/env bash
# Writes cluster-tests/fixtures/<version>/ from a 3-node cluster of that kept release (built
# from git by scripts/release-binaries.sh): its data directories, a backup, and what they hold.
# Run it once per release kept; the fixtures are committed and opened by every later build.
#
#   scripts/upgrade-fixtures.sh 0.1.0
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: scripts/upgrade-fixtures.sh VERSION}
bin=$(scripts/release-binaries.sh "$version")
cargo build -p cluster-tests --bin conch-upgrade-fixtures
out=cluster-tests/fixtures/$version
rm -rf "$out"
target/debug/conch-upgrade-fixtures --conchd "$bin/conchd" --release "$version" --out "$out"
du -sh "$out"

#!/usr/bin/env bash
# Builds the conchd and conch binaries of a kept release (RELEASES.toml) from git, once:
# target/releases/<version>/bin/{conchd,conch}. The upgrade tests and fixtures run them.
#
#   scripts/release-binaries.sh 0.1.0      # prints the directory holding the binaries
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: scripts/release-binaries.sh VERSION}
commit=$(awk -v v="$version" '
  /^\[\[release\]\]/ { current = "" }
  /^version *=/ { gsub(/"/, "", $3); current = $3 }
  /^commit *=/ { gsub(/"/, "", $3); if (current == v) print $3 }' RELEASES.toml)
if [[ -z "$commit" ]]; then
  echo "release-binaries: RELEASES.toml names no commit for release $version" >&2
  exit 64
fi
root="$PWD/target/releases/$version"
if [[ -x "$root/bin/conchd" && -x "$root/bin/conch" && "$(cat "$root/commit" 2>/dev/null)" == "$commit" ]]; then
  echo "$root/bin"
  exit 0
fi
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
  echo "release-binaries: commit $commit of release $version is not in this clone (fetch the full history)" >&2
  exit 69
fi
mkdir -p "$root"
rm -rf "$root/src"
git worktree prune
git worktree add --detach --force "$root/src" "$commit" >&2
trap 'git worktree remove --force "$root/src" >/dev/null 2>&1 || true' EXIT
echo "release-binaries: building conch $version ($commit); this takes a few minutes" >&2
(cd "$root/src" && CARGO_TARGET_DIR="$root/target" cargo build --locked -p conchd -p conch-client --bins --features conch-client/cli >&2)
mkdir -p "$root/bin"
cp "$root/target/debug/conchd" "$root/target/debug/conch" "$root/bin/"
echo "$commit" > "$root/commit"
echo "$root/bin"

#!/usr/bin/env bash
# `make dist` from a clean clone of the committed tree, in a target directory of its own: the
# release command must build on its own. (`make test` builds the whole workspace first, which
# unifies every crate's features; a program built alone, like xtask, gets only the features it
# asks for, and a missing one shows here and nowhere else.)
#
# Slow: it builds everything from nothing, in the dist profile (LTO) unless PROFILE says
# otherwise. Environment:
#   PROFILE   cargo profile of the binaries (default dist, what `make dist` ships)
#   KEEP=1    keep the clone (its path is printed) instead of removing it
#   NO_DEB=1  skip the Debian package (cargo-deb)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! git rev-parse --verify -q HEAD >/dev/null; then
	echo "dist-clean-test: not in a git checkout with a commit" >&2
	exit 1
fi
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
	echo "dist-clean-test: note: uncommitted changes are not part of the clone (it tests HEAD)" >&2
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/conch-dist-clean.XXXXXX")
cleanup() {
	if [ "${KEEP:-}" = 1 ]; then
		echo "dist-clean-test: clone kept in $WORK" >&2
	else
		rm -rf "$WORK"
	fi
}
trap cleanup EXIT

git clone --quiet --no-hardlinks "$(pwd)" "$WORK/conch"
git -C "$WORK/conch" checkout --quiet "$(git rev-parse HEAD)"
cd "$WORK/conch"
# A target directory of the clone's own: nothing built before helps or hides anything.
unset CARGO_TARGET_DIR
export PROFILE=${PROFILE:-dist}
export OUT="$WORK/artifacts"
make dist

VERSION=$(awk -F'"' '/^\[workspace\.package\]/ { in_ws = 1; next } /^\[/ { in_ws = 0 }
	in_ws && /^version *=/ { print $2; exit }' Cargo.toml)
NAME="conch-$VERSION-x86_64-linux"
for f in "$NAME.tar.gz" "$NAME-debug.tar.gz" SHA256SUMS; do
	if [ ! -s "$OUT/$f" ]; then
		echo "dist-clean-test: FAIL: make dist did not write $f" >&2
		exit 1
	fi
done
(cd "$OUT" && sha256sum --quiet -c SHA256SUMS)
# The listing is read whole first: `grep -q` stops at the first match, and under pipefail the
# tar it leaves writing into a closed pipe would fail the check.
listing=$(tar -tzf "$OUT/$NAME.tar.gz")
grep -qx "$NAME/bin/conch" <<<"$listing" || {
	echo "dist-clean-test: FAIL: the tarball has no bin/conch" >&2
	exit 1
}
grep -q "^$NAME/share/man/man1/conch.1$" <<<"$listing" || {
	echo "dist-clean-test: FAIL: the tarball has no conch.1 man page" >&2
	exit 1
}
# The release carries no test machinery (see packaging/dist.sh): its --version says so.
mkdir -p "$WORK/unpacked"
tar -xzf "$OUT/$NAME.tar.gz" -C "$WORK/unpacked"
test_build=$("$WORK/unpacked/$NAME/bin/conchd" --version | grep '^test build:' || true)
if [ -n "$test_build" ]; then
	echo "dist-clean-test: FAIL: the released conchd is a test build ($test_build)" >&2
	exit 1
fi
echo "dist-clean-test: make dist from a clean clone of $(git rev-parse --short HEAD): ok" >&2

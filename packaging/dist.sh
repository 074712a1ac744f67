#!/usr/bin/env bash
# Builds the release artifacts of conch into OUT (default target/artifacts):
#   conch-<version>-x86_64-linux.tar.gz        the binaries (stripped), man pages, completions,
#                                              the systemd unit and example config, README
#   conch-<version>-x86_64-linux-debug.tar.gz  the binaries' debug info (conchd.debug, conch.debug)
#   conch_<version>-1_amd64.deb                the Debian package (cargo-deb; see daemon/Cargo.toml)
#   SHA256SUMS                                 the checksums of the three
#
# The version is the workspace's (Cargo.toml, [workspace.package]); the commit is built in.
# Environment:
#   PROFILE   cargo profile of the binaries (default dist: LTO, one codegen unit). The tests use
#             dev, which `make test` has already built: the contents are the same, only slower code
#             (and the test machinery a workspace build carries; see below).
#
# The release build carries no test machinery: conchd and conch are built with no rustflags at
# all, replacing the `--cfg tokio_unstable` that .cargo/config.toml sets for workspace builds
# (the simulator's seeded runtime, and with it the simulator's hooks in conchd). `conchd
# --version` names what a build carries; dist-test.sh checks it.
#   OUT       output directory (emptied first).
#   NO_DEB=1  skip the Debian package.
#   GZIP_LEVEL  gzip level of the tarballs (default 9; the tests use 1).
set -euo pipefail
cd "$(dirname "$0")/.."

PROFILE=${PROFILE:-dist}
OUT=${OUT:-target/artifacts}
CARGO=${CARGO:-cargo}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
# cargo's directory of a profile: dev and test build into debug/, the others into their name.
case "$PROFILE" in
dev | test) PROFILE_DIR=debug ;;
bench) PROFILE_DIR=release ;;
*) PROFILE_DIR=$PROFILE ;;
esac
BIN_DIR="$TARGET_DIR/$PROFILE_DIR"

VERSION=$(awk -F'"' '/^\[workspace\.package\]/ { in_ws = 1; next } /^\[/ { in_ws = 0 }
	in_ws && /^version *=/ { print $2; exit }' Cargo.toml)
if [ -z "$VERSION" ]; then
	echo "dist: no version in Cargo.toml [workspace.package]" >&2
	exit 1
fi
NAME="conch-$VERSION-x86_64-linux"
# Reproducible archives: every file dated at the commit.
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
export SOURCE_DATE_EPOCH
DATE=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%d)

# The files shipped as they are from the source tree, and where they go in the tarball: the one
# list of them. A `?` suffix marks a file shipped only if present. The .deb installs the same
# files from the staged tree (daemon/Cargo.toml, [package.metadata.deb] assets).
SOURCE_FILES=(
	"README.md:README.md"
	"LICENSE?:LICENSE"
	"deploy/conchd.service:deploy/conchd.service"
	"deploy/conchd.toml:deploy/conchd.toml"
	"deploy/socket-activated/conchd.socket:deploy/socket-activated/conchd.socket"
	"deploy/socket-activated/conchd.service.d/socket-activated.conf:deploy/socket-activated/conchd.service.d/socket-activated.conf"
)

step() { echo "dist: $*" >&2; }

step "building conchd and conch ($PROFILE profile)"
if [ "$PROFILE_DIR" = debug ]; then
	# The test build: the same command as `make test`'s, so nothing is built twice.
	"$CARGO" build --workspace --bins
else
	CARGO_ENCODED_RUSTFLAGS= "$CARGO" build --profile "$PROFILE" -p conchd -p conch-client --bins
	# The generator of man pages and completions (a workspace program of its own), in the dev
	# profile: it runs once, its speed does not matter.
	"$CARGO" build -p xtask
fi

# The staged tree is the tarball's root, and the .deb's assets point into it.
STAGE="$BIN_DIR/stage"
DEBUG_STAGE="$BIN_DIR/stage-debug"
rm -rf "$STAGE" "$DEBUG_STAGE"
mkdir -p "$STAGE/bin" "$DEBUG_STAGE"

step "stripping the binaries; their debug info goes to the debug tarball"
for bin in conchd conch; do
	cp "$BIN_DIR/$bin" "$STAGE/bin/$bin"
	objcopy --only-keep-debug "$STAGE/bin/$bin" "$DEBUG_STAGE/$bin.debug"
	chmod 0644 "$DEBUG_STAGE/$bin.debug"
	objcopy --strip-all "$STAGE/bin/$bin"
	# The link names the debug file (and carries its checksum) for gdb and other debuggers.
	objcopy --add-gnu-debuglink="$DEBUG_STAGE/$bin.debug" "$STAGE/bin/$bin"
	chmod 0755 "$STAGE/bin/$bin"
done

step "man pages and shell completions"
"$TARGET_DIR/debug/xtask" man "$STAGE/share/man" --date "$DATE" >/dev/null
"$TARGET_DIR/debug/xtask" completions "$BIN_DIR/completions" >/dev/null
install -D -m 0644 "$BIN_DIR/completions/bash/conch" "$STAGE/share/bash-completion/completions/conch"
install -D -m 0644 "$BIN_DIR/completions/bash/conchd" "$STAGE/share/bash-completion/completions/conchd"
install -D -m 0644 "$BIN_DIR/completions/zsh/_conch" "$STAGE/share/zsh/site-functions/_conch"
install -D -m 0644 "$BIN_DIR/completions/zsh/_conchd" "$STAGE/share/zsh/site-functions/_conchd"
install -D -m 0644 "$BIN_DIR/completions/fish/conch.fish" "$STAGE/share/fish/vendor_completions.d/conch.fish"
install -D -m 0644 "$BIN_DIR/completions/fish/conchd.fish" "$STAGE/share/fish/vendor_completions.d/conchd.fish"

# The .deb's man pages are gzipped, as Debian wants them; the tarball's stay plain (man reads both).
rm -rf "$BIN_DIR/deb-man"
cp -r "$STAGE/share/man" "$BIN_DIR/deb-man"
find "$BIN_DIR/deb-man" -type f -exec gzip -9n {} +

for entry in "${SOURCE_FILES[@]}"; do
	src=${entry%%:*}
	dest=${entry#*:}
	case "$src" in
	*\?)
		src=${src%\?}
		[ -e "$src" ] || continue
		;;
	esac
	if [ ! -f "$src" ]; then
		echo "dist: $src is missing" >&2
		exit 1
	fi
	install -D -m 0644 "$src" "$STAGE/$dest"
done

# gzip -n: no name or time in the gzip header, so equal trees give equal archives.
pack() { # pack DIR NAME ARCHIVE
	tar --create --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" \
		--format=gnu -C "$1" --transform "s,^\.,$2," . | gzip "-${GZIP_LEVEL:-9}" -n >"$3"
}

rm -rf "$OUT"
mkdir -p "$OUT"
step "packing $OUT/$NAME.tar.gz"
pack "$STAGE" "$NAME" "$OUT/$NAME.tar.gz"
pack "$DEBUG_STAGE" "$NAME-debug" "$OUT/$NAME-debug.tar.gz"

if [ "${NO_DEB:-}" != 1 ]; then
	step "building the Debian package"
	packaging/install-cargo-deb.sh
	# The staged binaries are stripped already; cargo-deb maps target/release/ in the asset
	# paths to this profile's directory.
	"$CARGO" deb -p conchd --no-build --no-strip --profile "$PROFILE" --output "$OUT/" >/dev/null
fi

(cd "$OUT" && sha256sum -- *.tar.gz $(ls -- *.deb 2>/dev/null) >SHA256SUMS)
step "done:"
ls -l "$OUT" >&2

#!/bin/sh
# Installs cargo-deb, which builds conch's Debian package, when it is missing or another version.
# Pinned, and built from the lock file it was released with, so every machine packs the same way.
set -eu
VERSION=3.8.0
CARGO=${CARGO:-cargo}

if have=$("$CARGO" deb --version 2>/dev/null) && [ "${have##* }" = "$VERSION" ]; then
	exit 0
fi
echo "install-cargo-deb: installing cargo-deb $VERSION (a few minutes on a fresh machine)" >&2
"$CARGO" install cargo-deb --locked --version "$VERSION"

#!/bin/sh
# Installs what the process-level tests need beyond the Rust toolchain: Debian's libfaketime
# (package `faketime`), which the clock tests preload into conchd to step its wall clock.
# Idempotent: does nothing when the package is already installed. Needs root (or sudo) and apt.
set -eu

if dpkg -s faketime >/dev/null 2>&1; then
	exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
	echo "install-test-deps: apt-get not found; install libfaketime (Debian package 'faketime') by hand" >&2
	exit 1
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1; then
		SUDO="sudo"
	else
		echo "install-test-deps: the package 'faketime' is missing and installing it needs root (run as root or install sudo)" >&2
		exit 1
	fi
fi

echo "install-test-deps: installing faketime" >&2
if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq faketime; }; then
	echo "install-test-deps: could not install the package 'faketime' with apt-get" >&2
	exit 1
fi

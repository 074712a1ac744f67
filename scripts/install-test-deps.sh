#!/bin/sh
# Installs what the process-level tests need beyond the Rust toolchain:
# - Debian's libfaketime (package `faketime`), which the clock tests preload into conchd to
#   step its wall clock;
# - `promtool` (from Debian's `prometheus` package), which checks the shipped alerting rules.
#   Only the binary is unpacked, into target/test-tools/: no Prometheus service is installed
#   or started on the machine;
# - Debian's `chromium`, which the status page's browser test runs headless.
# Idempotent: does nothing when all are present. Needs root (or sudo) and apt for faketime.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/target/test-tools"

have_faketime() { dpkg -s faketime >/dev/null 2>&1; }
have_promtool() { [ -x "$tools/promtool" ]; }
have_chromium() { command -v chromium >/dev/null 2>&1; }

if have_faketime && have_promtool && have_chromium; then
	exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
	echo "install-test-deps: apt-get not found; install libfaketime (Debian package 'faketime') and promtool by hand" >&2
	exit 1
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1; then
		SUDO="sudo"
	else
		echo "install-test-deps: installing packages needs root (run as root or install sudo)" >&2
		exit 1
	fi
fi

echo "install-test-deps: updating the package lists" >&2
if ! $SUDO apt-get update -qq; then
	echo "install-test-deps: apt-get update failed" >&2
	exit 1
fi

if ! have_faketime; then
	echo "install-test-deps: installing faketime" >&2
	if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq faketime; then
		echo "install-test-deps: could not install the package 'faketime' with apt-get" >&2
		exit 1
	fi
fi

if ! have_chromium; then
	echo "install-test-deps: installing chromium" >&2
	if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium; then
		echo "install-test-deps: could not install the package 'chromium' with apt-get" >&2
		exit 1
	fi
fi

if ! have_promtool; then
	echo "install-test-deps: unpacking promtool from the 'prometheus' package into $tools" >&2
	scratch=$(mktemp -d)
	chmod 755 "$scratch" # apt downloads as its own user
	trap 'rm -rf "$scratch"' EXIT
	if ! (cd "$scratch" && apt-get download -qq prometheus >/dev/null); then
		echo "install-test-deps: could not download the package 'prometheus' with apt-get" >&2
		exit 1
	fi
	dpkg-deb -x "$scratch"/prometheus_*.deb "$scratch/root"
	mkdir -p "$tools"
	cp "$scratch/root/usr/bin/promtool" "$tools/promtool"
	"$tools/promtool" --version >/dev/null
fi

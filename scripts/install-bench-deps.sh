#!/bin/sh
# Unpacks what `conch-bench --baseline etcd` needs beyond the Rust toolchain: the `etcd` binary
# from Debian's `etcd-server` package, into target/bench-tools/. Only the binary is unpacked:
# no etcd service is installed or started on the machine. Idempotent. Needs apt (and root or
# sudo for `apt-get update` when the package lists are missing).
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/target/bench-tools"
[ -x "$tools/etcd" ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
	echo "install-bench-deps: apt-get not found; put an etcd 3.4+ binary at $tools/etcd or set ETCD_BIN" >&2
	exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then
	SUDO="sudo"
fi
scratch=$(mktemp -d)
chmod 755 "$scratch" # apt downloads as its own user
trap 'rm -rf "$scratch"' EXIT
if ! (cd "$scratch" && apt-get download -qq etcd-server >/dev/null 2>&1); then
	echo "install-bench-deps: updating the package lists" >&2
	$SUDO apt-get update -qq
	if ! (cd "$scratch" && apt-get download -qq etcd-server >/dev/null); then
		echo "install-bench-deps: could not download the package 'etcd-server' with apt-get" >&2
		exit 1
	fi
fi
dpkg-deb -x "$scratch"/etcd-server_*.deb "$scratch/root"
mkdir -p "$tools"
cp "$scratch/root/usr/bin/etcd" "$tools/etcd"
"$tools/etcd" --version | head -1 >&2

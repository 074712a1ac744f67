#!/usr/bin/env bash
# Builds the release artifacts (packaging/dist.sh) and checks what a user gets:
#   - the tarball's file list (a man page for every subcommand the packed conch has), the
#     checksums, the packed programs' --version (version and commit), stripped binaries whose
#     debug files match them, man pages that render without warnings, completions that are the
#     programs' own;
#   - the .deb's file list, control fields, conffiles and maintainer scripts, and an install,
#     reinstall and purge in a scratch root (dpkg --root, scripts run chrootless with DPKG_ROOT):
#     the conch system user, /var/lib/conch owned by it, the conffile kept across a reinstall.
# The host's /usr, /etc and users are never touched (checked at the end).
#
# PROFILE defaults to dev: `make test` has built those binaries already, and the artifacts'
# contents do not depend on the optimisation level. `make dist-test PROFILE=dist` checks the
# real release build.
set -euo pipefail
cd "$(dirname "$0")/.."

export PROFILE=${PROFILE:-dev}
export OUT=${OUT:-target/dist-test}
export GZIP_LEVEL=${GZIP_LEVEL:-1}
packaging/dist.sh

passed=0
failed=0
pass() { passed=$((passed + 1)); }
fail() {
	failed=$((failed + 1))
	echo "dist-test: FAIL: $*" >&2
}
check() { # check DESCRIPTION COMMAND...: passes when the command succeeds
	local what=$1
	shift
	if "$@"; then pass; else fail "$what"; fi
}
same() { # same DESCRIPTION EXPECTED ACTUAL
	if [ "$2" = "$3" ]; then
		pass
	else
		fail "$1"
		diff <(echo "$2") <(echo "$3") >&2 || true
	fi
}

VERSION=$(awk -F'"' '/^\[workspace\.package\]/ { w = 1; next } /^\[/ { w = 0 }
	w && /^version *=/ { print $2; exit }' Cargo.toml)
COMMIT=$(git rev-parse --short=12 HEAD)
NAME="conch-$VERSION-x86_64-linux"
MAN_DATE=$(date -u -d "@$(git log -1 --format=%ct)" +%Y-%m-%d)
DEB="conch_${VERSION}-1_amd64.deb"
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
# What an install on the host would have made, to check at the end that none of it appeared.
host_state() {
	getent passwd conch || true
	getent group conch || true
	ls -ld /var/lib/conch /etc/conch /usr/bin/conchd /lib/systemd/system/conchd.service 2>/dev/null || true
}
host_before=$(host_state)

# ---- artifacts and checksums ----
same "artifacts in $OUT" "$(printf '%s\n' "$DEB" "$NAME-debug.tar.gz" "$NAME.tar.gz" SHA256SUMS | sort)" \
	"$(ls "$OUT" | sort)"
check "SHA256SUMS verifies" sh -c "cd '$OUT' && sha256sum --quiet -c SHA256SUMS"
same "SHA256SUMS lists every artifact" "$(printf '%s\n' "$DEB" "$NAME-debug.tar.gz" "$NAME.tar.gz" | sort)" \
	"$(awk '{ print $2 }' "$OUT/SHA256SUMS" | sort)"

# ---- the tarball ----
tar -xzf "$OUT/$NAME.tar.gz" -C "$SCRATCH"
tar -xzf "$OUT/$NAME-debug.tar.gz" -C "$SCRATCH"
T="$SCRATCH/$NAME"
conch=$T/bin/conch
conchd=$T/bin/conchd

same "conchd --version" "conchd $VERSION (commit $COMMIT)" "$("$conchd" --version | head -1)"
# A release carries no test machinery (tokio_unstable and the simulator's hooks), and its
# --version says nothing of it; the dev build, which is the test build, says what it carries,
# which shows the check can see it.
test_build=$("$conchd" --version | grep '^test build:' || true)
if [ "$PROFILE" = dev ] || [ "$PROFILE" = test ]; then
	case "$test_build" in
	*tokio_unstable*) pass ;;
	*) fail "the dev build names its test machinery (tokio_unstable): got '$test_build'" ;;
	esac
else
	same "conchd ($PROFILE) carries no test machinery" "" "$test_build"
fi
same "conch --version" "conch $VERSION (commit $COMMIT)" "$("$conch" --version)"

# Every subcommand of a packed program, as prog-a-b names, from its own --help.
subcommands() { # subcommands PROGRAM PREFIX ARGS...
	local program=$1 prefix=$2 sub
	shift 2
	for sub in $("$program" "$@" --help | awk '/^Commands:/ { c = 1; next } c && /^$/ { c = 0 }
		c && $1 != "help" { print $1 }'); do
		echo "$prefix-$sub"
		subcommands "$program" "$prefix-$sub" "$@" "$sub"
	done
}
pages="conch $(subcommands "$conch" conch) conchd $(subcommands "$conchd" conchd)"
check "conch has subcommands" test -n "$(subcommands "$conch" conch)"
man1=$(for page in $pages; do echo "./share/man/man1/$page.1"; done)
expected_tar=$(
	{
		printf '%s\n' ./README.md ./bin/conch ./bin/conchd ./deploy/conchd.service ./deploy/conchd.toml \
			./deploy/socket-activated/conchd.socket \
			./deploy/socket-activated/conchd.service.d/socket-activated.conf \
			./share/bash-completion/completions/conch ./share/bash-completion/completions/conchd \
			./share/zsh/site-functions/_conch ./share/zsh/site-functions/_conchd \
			./share/fish/vendor_completions.d/conch.fish ./share/fish/vendor_completions.d/conchd.fish
		[ ! -e LICENSE ] || echo ./LICENSE
		echo "$man1"
	} | sed "s,^\.,$NAME," | sort
)
same "tarball file list" "$expected_tar" "$(tar -tzf "$OUT/$NAME.tar.gz" | grep -v '/$' | sort)"
same "debug tarball file list" "$(printf '%s\n' "$NAME-debug/conch.debug" "$NAME-debug/conchd.debug")" \
	"$(tar -tzf "$OUT/$NAME-debug.tar.gz" | grep -v '/$' | sort)"
same "tarball owners" "0/0" "$(tar -tvzf "$OUT/$NAME.tar.gz" --numeric-owner | awk '{ print $2 }' | sort -u)"

build_id() { readelf -n "$1" 2>/dev/null | awk '/Build ID/ { print $3 }'; }
for bin in conch conchd; do
	sections=$(readelf -SW "$T/bin/$bin")
	check "$bin is stripped" sh -c "! echo '$sections' | grep -Eq '\.symtab|\.debug_(info|line|str|abbrev)'"
	check "$bin links its debug file" sh -c "echo '$sections' | grep -q '\.gnu_debuglink'"
	same "$bin debug link" "$bin.debug" "$(readelf -p .gnu_debuglink "$T/bin/$bin" | grep -o "$bin\.debug")"
	check "$bin.debug has line tables" sh -c "readelf -SW '$SCRATCH/$NAME-debug/$bin.debug' 2>/dev/null | grep -q '\.debug_line'"
	same "$bin.debug belongs to $bin (build id)" "$(build_id "$T/bin/$bin")" "$(build_id "$SCRATCH/$NAME-debug/$bin.debug")"
	check "$bin has a build id" test -n "$(build_id "$T/bin/$bin")"
done

# Man pages: render without groff warnings and say what they document (where groff is
# installed; elsewhere only their title line is checked).
render() { groff -k -man -Tutf8 -P-c -rLL=100n "$1" 2>/dev/null | sed 's/.\x08//g'; }
for page in "$T"/share/man/man1/*.1; do
	name=$(basename "$page")
	name=${name%.*}
	check "man page $name: title line" grep -q "^\.TH $name 1 $MAN_DATE \"conch $VERSION (commit $COMMIT)\"" "$page"
	if command -v groff >/dev/null 2>&1; then
		warnings=$(groff -k -man -Tutf8 -ww -Wbreak -z "$page" 2>&1)
		same "man page $name renders without warnings" "" "$warnings"
		text=$(render "$page")
		check "man page $name: NAME section names it" sh -c "echo \"\$1\" | grep -A1 '^NAME' | grep -q \"^ *$name\"" _ "$text"
		check "man page $name: has a SYNOPSIS" sh -c "echo \"\$1\" | grep -q '^SYNOPSIS'" _ "$text"
	fi
done
if command -v groff >/dev/null 2>&1; then
	check "conchd.1 documents --initial-cluster" sh -c "echo \"\$1\" | grep -q -- --initial-cluster" _ "$(render "$T/share/man/man1/conchd.1")"
	check "conch-sema.1 documents --max" sh -c "echo \"\$1\" | grep -q -- --max" _ "$(render "$T/share/man/man1/conch-sema.1")"
else
	echo "dist-test: groff not installed: man pages checked by their title line only" >&2
fi

# Completions: conch's are what the packed conch prints; every bash script parses.
same "bash completion of conch" "$("$conch" completions bash)" "$(cat "$T/share/bash-completion/completions/conch")"
same "zsh completion of conch" "$("$conch" completions zsh)" "$(cat "$T/share/zsh/site-functions/_conch")"
same "fish completion of conch" "$("$conch" completions fish)" "$(cat "$T/share/fish/vendor_completions.d/conch.fish")"
for f in "$T"/share/bash-completion/completions/*; do
	check "bash parses $(basename "$f")" bash -n "$f"
done
check "conchd bash completion knows --initial-cluster" grep -q -- --initial-cluster "$T/share/bash-completion/completions/conchd"
for f in README.md deploy/conchd.service deploy/conchd.toml; do
	check "$f shipped unchanged" cmp -s "$f" "$T/$f"
done

# ---- the Debian package ----
D="$OUT/$DEB"
info=$(dpkg-deb -I "$D")
field() { dpkg-deb -f "$D" "$1"; }
same "deb Package" conch "$(field Package)"
same "deb Version" "$VERSION-1" "$(field Version)"
same "deb Architecture" amd64 "$(field Architecture)"
check "deb Depends names passwd (useradd)" sh -c "dpkg-deb -f '$D' Depends | grep -q passwd"
check "deb Depends names libc6" sh -c "dpkg-deb -f '$D' Depends | grep -q libc6"
check "deb has a Description" test -n "$(field Description)"
# The newest glibc and libgcc symbol versions the packed binaries use are within Depends.
newest() { objdump -T "$T/bin/conch" "$T/bin/conchd" | grep -o "$1_[0-9.]*" | sed "s/^$1_//" | sort -uV | tail -n 1; }
depends=$(field Depends)
libc_min=$(echo "$depends" | sed -n 's/.*libc6 (>= \([0-9.]*\)).*/\1/p')
libgcc_min=$(echo "$depends" | sed -n 's/.*libgcc-s1 (>= \([0-9.]*\)).*/\1/p')
check "Depends libc6 >= $libc_min covers GLIBC_$(newest GLIBC)" dpkg --compare-versions "$libc_min" ge "$(newest GLIBC)"
check "Depends libgcc-s1 >= $libgcc_min covers GCC_$(newest GCC)" dpkg --compare-versions "$libgcc_min" ge "$(newest GCC | cut -d. -f1,2)"
check "deb control lists the maintainer scripts" sh -c "echo \"\$1\" | grep -q postinst && echo \"\$1\" | grep -q postrm && echo \"\$1\" | grep -q prerm" _ "$info"

expected_deb=$(
	{
		printf '%s\n' ./usr/bin/conch ./usr/bin/conchd ./lib/systemd/system/conchd.service \
			./etc/conch/conchd.toml ./usr/share/doc/conch/README.md ./usr/share/doc/conch/copyright \
			./usr/share/doc/conch/socket-activated/conchd.socket \
			./usr/share/doc/conch/socket-activated/conchd.service.d/socket-activated.conf \
			./usr/share/bash-completion/completions/conch ./usr/share/bash-completion/completions/conchd \
			./usr/share/zsh/vendor-completions/_conch ./usr/share/zsh/vendor-completions/_conchd \
			./usr/share/fish/vendor_completions.d/conch.fish ./usr/share/fish/vendor_completions.d/conchd.fish
		echo "$man1" | sed 's,^\./share/man/man1/\(.*\)$,./usr/share/man/man1/\1.gz,'
	} | sort
)
deb_files=$(dpkg-deb -c "$D" | awk '$1 !~ /^d/ { print $6 }' | sort)
same "deb file list" "$expected_deb" "$deb_files"
same "deb: binaries are root-owned 0755" "-rwxr-xr-x 0/0" \
	"$(dpkg-deb -c "$D" | awk '$1 !~ /^d/ && $6 ~ /^\.\/usr\/bin\// { print $1, $2 }' | sort -u)"

dpkg-deb -e "$D" "$SCRATCH/control"
same "deb conffiles" /etc/conch/conchd.toml "$(cat "$SCRATCH/control/conffiles")"
for script in postinst prerm postrm; do
	s="$SCRATCH/control/$script"
	check "$script is executable" test -x "$s"
	check "$script parses" sh -n "$s"
	check "$script sets -e" grep -q '^set -e' "$s"
	check "$script is the packaged one" cmp -s "packaging/deb/$script" "$s"
done
check "postinst creates a system user" grep -q 'useradd.*--system' "$SCRATCH/control/postinst"

# Install into a scratch root: dpkg's database, the passwd files and login.defs of a fresh system.
R="$SCRATCH/root"
mkdir -p "$R/var/lib/dpkg/info" "$R/var/lib/dpkg/updates" "$R/var/lib/dpkg/triggers" "$R/etc" "$R/usr/sbin"
touch "$R/var/lib/dpkg/status" "$R/var/lib/dpkg/available"
printf 'root:x:0:0:root:/root:/bin/bash\n' >"$R/etc/passwd"
printf 'root:x:0:\n' >"$R/etc/group"
printf 'root:*:19000:0:99999:7:::\n' >"$R/etc/shadow"
printf 'root:*::\n' >"$R/etc/gshadow"
chmod 0640 "$R/etc/shadow" "$R/etc/gshadow"
cp /etc/login.defs "$R/etc/login.defs"
# dpkg's own output goes to a log, shown when a step fails. Dependencies are not installed in
# the scratch root (--force-depends): the host's libraries run the binaries.
dpkg_root() {
	if dpkg --root="$R" --force-script-chrootless --force-depends --log=/dev/null "$@" >"$SCRATCH/dpkg.log" 2>&1; then
		return 0
	fi
	cat "$SCRATCH/dpkg.log" >&2
	return 1
}

check "dpkg --root installs the package" dpkg_root -i "$D"
same "installed status" "install ok installed" "$(dpkg --root="$R" -s conch 2>/dev/null | awk -F': ' '/^Status:/ { print $2 }')"
same "installed conchd runs" "conchd $VERSION (commit $COMMIT)" "$("$R/usr/bin/conchd" --version | head -1)"
user=$(grep '^conch:' "$R/etc/passwd" || true)
check "postinst created the conch user" test -n "$user"
uid=$(echo "$user" | cut -d: -f3)
gid=$(echo "$user" | cut -d: -f4)
check "conch is a system user (uid $uid < 1000)" test "${uid:-1000}" -lt 1000
same "conch's shell and home" "/var/lib/conch:/usr/sbin/nologin" "$(echo "$user" | cut -d: -f6,7)"
check "postinst created the conch group" grep -q "^conch:x:$gid:" "$R/etc/group"
same "/var/lib/conch owner and mode" "$uid:$gid 750" "$(stat -c '%u:%g %a' "$R/var/lib/conch")"
check "the unit is installed" test -f "$R/lib/systemd/system/conchd.service"
check "dpkg knows the conffile" sh -c "dpkg --root='$R' -s conch | grep -A1 '^Conffiles:' | grep -q /etc/conch/conchd.toml"

# Idempotent: a reinstall (configure again, as an upgrade does) keeps the user, the directory and
# an edited configuration.
echo '# edited by the operator' >>"$R/etc/conch/conchd.toml"
chmod 0700 "$R/var/lib/conch"
check "dpkg --root reinstalls the package" dpkg_root --force-confold -i "$D"
same "still one conch user, same uid" "$user" "$(grep '^conch:' "$R/etc/passwd")"
same "/var/lib/conch mode kept" "$uid:$gid 700" "$(stat -c '%u:%g %a' "$R/var/lib/conch")"
check "edited conffile kept" grep -q 'edited by the operator' "$R/etc/conch/conchd.toml"

# Purge: the files, the conffile and the data go; the system user stays.
mkdir -p "$R/var/lib/conch/1" && touch "$R/var/lib/conch/1/data"
check "dpkg --root purges the package" dpkg_root --purge conch
check "purge removed conchd" test ! -e "$R/usr/bin/conchd"
check "purge removed the conffile" test ! -e "$R/etc/conch/conchd.toml"
check "purge removed /var/lib/conch" test ! -e "$R/var/lib/conch"
same "the system user stays" "$user" "$(grep '^conch:' "$R/etc/passwd")"

same "the host's users and files are untouched" "$host_before" "$(host_state)"

echo "dist-test: $passed passed, $failed failed"
[ "$failed" -eq 0 ]

#!/usr/bin/env bash
# Builds the Debian package with cargo-deb (installed with `cargo install --locked` if
# missing) and inspects it: the expected files, their modes, the control fields and the
# maintainer scripts. Exits non-zero on any difference. Prints the package's contents.
#
#   ./scripts/build-deb.sh            # builds target/debian/dory_<version>-1_<arch>.deb
#   DEB_SKIP_BUILD=1 ./scripts/build-deb.sh   # inspects the newest existing .deb only
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_DEB_VERSION=3.8.0

fail() {
    echo "build-deb: $*" >&2
    exit 1
}

if [ -z "${DEB_SKIP_BUILD:-}" ]; then
    if ! cargo deb --version 2>/dev/null | grep -q "$CARGO_DEB_VERSION"; then
        echo "build-deb: installing cargo-deb $CARGO_DEB_VERSION"
        cargo install cargo-deb --version "$CARGO_DEB_VERSION" --locked
    fi
    command -v dpkg-deb >/dev/null || fail "dpkg-deb is missing (apt-get install dpkg)"
    rm -f target/debian/dory_*.deb
    # --strip: the release profile keeps line tables (debug = 1) for profiling; the
    # package ships the binary without them (a 5 MB binary instead of 50 MB).
    cargo deb --locked --strip
fi

deb=$(ls -t target/debian/dory_*.deb 2>/dev/null | head -n 1)
[ -n "$deb" ] || fail "no package in target/debian"

contents=$(dpkg-deb -c "$deb")
info=$(dpkg-deb -I "$deb")
echo "== $deb ($(du -h "$deb" | cut -f1))"
echo "$contents"
echo "$info"

# Each expected path with its mode.
for expect in \
    "-rwxr-xr-x ./usr/bin/dory" \
    "-rw-r--r-- ./etc/dory/dory.toml" \
    "-rw-r--r-- ./usr/lib/systemd/system/dory.service" \
    "-rw-r--r-- ./usr/lib/sysusers.d/dory.conf" \
    "-rw-r--r-- ./usr/share/doc/dory/README.md" \
    "-rw-r--r-- ./usr/share/doc/dory/operations.md" \
    "-rw-r--r-- ./usr/share/doc/dory/config.md" \
    "-rw-r--r-- ./usr/share/doc/dory/copyright"; do
    mode=${expect%% *}
    path=${expect#* }
    line=$(echo "$contents" | awk -v p="$path" '$6 == p')
    [ -n "$line" ] || fail "missing $path"
    [ "$(echo "$line" | awk '{print $1}')" = "$mode" ] || fail "$path: want mode $mode: $line"
    echo "$line" | awk '{print $2}' | grep -Eqx "root/root|0/0" || fail "$path: not owned by root: $line"
done

field() {
    dpkg-deb -f "$deb" "$1"
}
[ "$(field Package)" = dory ] || fail "Package: $(field Package)"
field Depends | grep -q "systemd" || fail "Depends lacks systemd: $(field Depends)"
field Depends | grep -q "libc6" || fail "Depends lacks libc6: $(field Depends)"
field Section | grep -qx net || fail "Section: $(field Section)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dpkg-deb -e "$deb" "$tmp/control"
dpkg-deb -x "$deb" "$tmp/root"
grep -qx "/etc/dory/dory.toml" "$tmp/control/conffiles" || fail "/etc/dory/dory.toml is not a conffile"
grep -q "systemd-sysusers" "$tmp/control/postinst" || fail "postinst does not create the dory user"
grep -q "dory.service" "$tmp/control/postinst" || fail "postinst does not enable dory.service"
grep -q "rm -rf /var/lib/dory /var/log/dory" "$tmp/control/postrm" || fail "postrm does not purge"
# The user the unit runs as is the one sysusers creates.
grep -q "^u dory " "$tmp/root/usr/lib/sysusers.d/dory.conf" || fail "sysusers.d lacks user dory"
grep -qx "User=dory" "$tmp/root/usr/lib/systemd/system/dory.service" || fail "unit is not User=dory"
grep -qx "RuntimeDirectory=dory" "$tmp/root/usr/lib/systemd/system/dory.service" ||
    fail "unit lacks RuntimeDirectory=dory"
grep -qx 'dgram_socket = "/run/dory/dory.sock"' "$tmp/root/etc/dory/dory.toml" ||
    fail "the packaged config's socket is not in /run/dory"
"$tmp/root/usr/bin/dory" --help >/dev/null || fail "the packaged binary does not run"
if command -v systemd-analyze >/dev/null; then
    # A copy whose ExecStart is the packaged binary (not installed on this host).
    mkdir "$tmp/unit"
    sed "s#/usr/bin/dory#$tmp/root/usr/bin/dory#" \
        "$tmp/root/usr/lib/systemd/system/dory.service" >"$tmp/unit/dory.service"
    systemd-analyze verify --man=no "$tmp/unit/dory.service" 2>&1 | tee "$tmp/verify.log"
    if grep -q "dory.service" "$tmp/verify.log"; then
        fail "systemd-analyze verify complains about the packaged unit"
    fi
else
    echo "build-deb: systemd-analyze not installed; packaged unit not verified"
fi
echo "build-deb: $deb is complete"

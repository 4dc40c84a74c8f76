#!/usr/bin/env bash
# Installs, from Debian, what building and running the tests needs beyond the Rust
# toolchain, where it is missing: OpenSSL's headers and pkg-config (librdkafka is built
# with SSL and SASL for the second client in tests/security.rs), stunnel (the TLS
# terminator in front of the test brokers) and Chromium (tests/status_page.rs drives the
# status page headless; without it that test prints SKIPPED). Uses sudo unless run as
# root. Used by scripts/test.sh and .ci/run.
set -euo pipefail
need=()
command -v stunnel4 >/dev/null || command -v stunnel >/dev/null || need+=(stunnel4)
dpkg -s libssl-dev >/dev/null 2>&1 || need+=(libssl-dev)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v chromium >/dev/null || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
    sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    echo "installing from Debian: ${need[*]}" >&2
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

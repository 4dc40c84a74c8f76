#!/usr/bin/env bash
# Every test, on a fresh Debian machine with the Rust toolchain: installs what the tests
# need from Debian where it is missing (scripts/test-deps.sh), then runs `cargo test`
# (arguments are passed on, e.g. `./scripts/test.sh --test faults`). Once those packages
# are there, `cargo test` alone is the same. This is the README's test command, and
# .ci/run runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/test-deps.sh
exec cargo test "$@"

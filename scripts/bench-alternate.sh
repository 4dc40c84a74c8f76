#!/usr/bin/env bash
# Compares two dory builds or settings on a noisy host by alternating them: ROUNDS times,
# one bench invocation of A, then one of B, each with the ceiling beside it. A change is
# evidence only if it shows in most pairs (doc/performance.md, "How much to trust these
# numbers"). Prints each invocation's summary lines and per-thread figures; the full output
# goes to target/bench-alternate.log.
#
# usage: scripts/bench-alternate.sh ROUNDS "labelA|bench args" "labelB|bench args" [-- common args]
# e.g.   scripts/bench-alternate.sh 3 "old|--dory /tmp/dory-old" "new|--dory target/release/dory" -- --topics 1000
#        scripts/bench-alternate.sh 3 "inline|" "queued|--daemon-toml [input]"$'\n'"inline_routing = false"
# Each invocation runs `--targets ceiling,sink --runs 2` unless the common args say otherwise
# (later options win).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 3 ]; then
    sed -n '2,12p' "$0"
    exit 2
fi
rounds=$1
a=$2
b=$3
shift 3
[ "${1:-}" = "--" ] && shift
log=target/bench-alternate.log
mkdir -p target
: >"$log"
cargo bench --bench throughput --no-run 2>>"$log"
for i in $(seq 1 "$rounds"); do
    for v in "$a" "$b"; do
        label=${v%%|*}
        args=${v#*|}
        echo "## $label, round $i, $(date -u +%H:%M:%S) UTC" | tee -a "$log"
        # The label's arguments are split on spaces (paths and flags), except a
        # --daemon-toml or --variant-toml value, which is kept whole.
        extra=()
        if [[ $args =~ ^(.*)(--(daemon|variant)-toml)\ (.*)$ ]]; then
            read -r -a extra <<<"${BASH_REMATCH[1]}"
            extra+=("${BASH_REMATCH[2]}" "${BASH_REMATCH[4]}")
        else
            read -r -a extra <<<"$args"
        fi
        cargo bench --bench throughput -- --targets ceiling,sink --runs 2 \
            ${extra[@]+"${extra[@]}"} "$@" 2>&1 |
            tee -a "$log" |
            grep -E '^(ceiling \(|dory -> sink)|WARNING|by thread|^== ' || true
    done
done

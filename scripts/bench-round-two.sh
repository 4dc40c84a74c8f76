#!/usr/bin/env bash
# Every configuration of doc/performance.md's "Round two" in one go: 1 and 10 topics beside
# librdkafka, 1,000 and 10,000 topics, lz4 and zstd with text values, paced at 100,000
# msgs/s. Prints each invocation's table; the full output goes to the file given (default
# target/bench-round-two.log). Takes a few minutes on a 2-vCPU VM; run it on a quiet host.
# DORY_CPUS=1 runs dory on CPU 1 only (as systemd's CPUAffinity=1 would; see
# doc/performance.md, "Round three").
set -euo pipefail
cd "$(dirname "$0")/.."
log=${1:-target/bench-round-two.log}
mkdir -p "$(dirname "$log")"
run() {
    local name=$1
    shift
    echo "### $name $(date -u +%H:%M:%S)"
    cargo bench --bench throughput -- ${DORY_CPUS:+--dory-cpus "$DORY_CPUS"} "$@" 2>&1 |
        grep -v '^\s*\(Compiling\|Finished\|Running\)'
}
{
    run main --targets ceiling,blocking,sink,rdkafka --topics 1,10 --runs 3
    run topics-1000 --targets ceiling,sink --topics 1000 --runs 3
    run lz4 --targets ceiling,sink,rdkafka --topics 10 --runs 3 --text-values --label lz4 \
        --daemon-toml $'[compression]\ndefault = "lz4"'
    run zstd --targets ceiling,sink,rdkafka --topics 10 --runs 3 --text-values --label zstd \
        --daemon-toml $'[compression]\ndefault = "zstd"'
    run paced --targets blocking,sink,rdkafka --topics 1 --runs 3 --rate 100000 --daemon-arg=--batch-time-ms=10
    run topics-10000 --targets ceiling,sink --topics 10000 --runs 1
} 2>&1 | tee "$log" | grep -E '^(###|target |ceiling|recvmmsg|dory|librdkafka|  target|  sustained|WARNING)'

#!/usr/bin/env bash
# Instructions per message, by thread, under callgrind: the throughput bench sends
# MESSAGES messages (default 200,000) on TOPICS topics (default 1) to dory running under
# valgrind's callgrind, with busy polling off (valgrind runs one thread at a time, so a
# spinning input would count little but its spins). Prints the whole daemon's count and
# each thread's, divided by the message count. Unlike times, instruction counts barely move
# with the host's load: use them to compare two builds (doc/performance.md, "Round five").
# Under valgrind dory runs about 50 times slower, so batches are smaller and the status
# endpoint's scrapes weigh more than at full speed; compare builds, not absolute figures.
#
# usage: scripts/callgrind-per-message.sh [TOPICS] [MESSAGES] [DORY_BINARY]
#   DORY_BINARY defaults to target/release/dory (built first). Needs valgrind
#   (apt-get install valgrind). The profiles, one per thread, are kept in
#   target/callgrind/BINARY-TOPICS-topics/. CALLGRIND_ARGS adds valgrind options, e.g.
#   CALLGRIND_ARGS=--cache-sim=yes to count cache misses too (callgrind_annotate reads them).
set -euo pipefail
cd "$(dirname "$0")/.."
topics=${1:-1}
messages=${2:-200000}
dory=${3:-}
if [ -z "$dory" ]; then
    cargo build --release --quiet
    dory=target/release/dory
fi
dory=$(realpath "$dory")
out=$(realpath -m target/callgrind)
mkdir -p "$out"
rm -f "$out"/cg.out.*
wrapper=$(mktemp)
trap 'rm -f "$wrapper"' EXIT
cat >"$wrapper" <<EOF
#!/bin/sh
exec valgrind --tool=callgrind ${CALLGRIND_ARGS:-} --separate-threads=yes --callgrind-out-file=$out/cg.out.%p $dory "\$@"
EOF
chmod +x "$wrapper"
cargo bench --bench throughput -- --dory "$wrapper" --targets sink --topics "$topics" \
    --runs 1 --messages "$messages" --daemon-toml $'[input]\nbusy_poll_us = 0' \
    >"$out/bench.log" 2>&1 || {
    tail -20 "$out/bench.log"
    exit 1
}
# One profile per thread (cg.out.PID-NN); the daemon is the process with the most.
pid=$(ls "$out"/cg.out.* | sed 's/.*cg\.out\.\([0-9]*\)-.*/\1/' | sort | uniq -c | sort -rn | awk 'NR==1{print $2}')
dest="$out/$(basename "$dory")-${topics}-topics"
rm -rf "$dest"
mkdir -p "$dest"
mv "$out"/cg.out."$pid"-* "$dest"/
rm -f "$out"/cg.out.*
echo "instructions per message, ${topics} topic(s), ${messages} messages (profiles in $dest):"
python3 - "$dest" "$messages" <<'PY'
import os, re, sys
dest, n = sys.argv[1], int(sys.argv[2])
# A thread is named by the first of these its profile contains: a function that only that
# thread runs, or failing that (when the compiler inlined it) its source file.
roles = [
    ("dory::main", "main (start-up: the pool is zeroed)"),
    ("src/input/datagram.rs", "input (datagram)"),
    ("SharedRouter::run", "router"),
    ("acks::Receiver_::run", "dispatcher acknowledgements"),
    ("sender::Sender_::run", "dispatcher requests"),
    ("status::serve", "status (the bench's scrapes)"),
    ("fetcher::Fetcher", "metadata fetcher"),
    ("src/deliver/dispatcher/acks.rs", "dispatcher acknowledgements"),
    ("src/deliver/dispatcher/sender.rs", "dispatcher requests"),
    ("src/report/status/", "status (the bench's scrapes)"),
]
totals = {}
for f in sorted(os.listdir(dest)):
    path = os.path.join(dest, f)
    text = open(path, errors="replace").read()
    m = re.search(r"^totals:\s*(\d+)", text, re.M) or re.search(r"^summary:\s*(\d+)", text, re.M)
    total = int(m.group(1)) if m else 0
    role = next((r for pat, r in roles if pat in text), "other")
    totals[role] = totals.get(role, 0) + total
whole = sum(totals.values())
print(f"{whole / n:9.0f}  whole daemon")
for role, t in sorted(totals.items(), key=lambda kv: -kv[1]):
    if t / n >= 1:
        print(f"{t / n:9.0f}  {role}")
PY

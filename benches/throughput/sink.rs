//! The counting Produce sink: a minimal Kafka broker stand-in on 127.0.0.1 that speaks just
//! enough of the protocol for dory and otherwise only counts, so the daemon's own cost can
//! be measured without a real broker's.
//!
//! - ApiVersions v0–v3 (response header v0 always; v3 body flexible): lists Produce 3–8,
//!   Metadata 0–12, ApiVersions 0–3, InitProducerId 0–4, and also Fetch 4–11 and
//!   FindCoordinator 0–2, which it does not serve: librdkafka decides from those whether a
//!   broker takes record batches (magic 2), lz4 and zstd. A higher request version gets
//!   UNSUPPORTED_VERSION in the v0 layout (KIP-511).
//! - Metadata v0–v12, encoded at the requested version: one broker (this sink, node 1),
//!   every topic asked for (or, for "all topics", the configured ones) with `partitions`
//!   partitions led by node 1.
//! - InitProducerId v0–v4: hands out producer id 1000 + n, epoch 0 (so dory's idempotent
//!   producer runs as against Kafka; the sink does not check sequences).
//! - Produce v3–v8: walks every RecordBatch in every partition's records, checks magic 2,
//!   the batch length and (unless disabled) the CRC-32C, and adds the batch header's
//!   record count to the total. A partition whose records fail a check is answered
//!   CORRUPT_MESSAGE (2) and not counted (dory retries it); others get error 0 and a base
//!   offset that advances per partition.
//!
//! One thread per connection. Counters are atomics; the time of the last counted record
//! is kept so throughput can be measured at the sink.

use dory::fasthash::FastMap;
use std::io::{self, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const API_PRODUCE: i16 = 0;
const API_FETCH: i16 = 1;
const API_METADATA: i16 = 3;
const API_FIND_COORDINATOR: i16 = 10;
const API_VERSIONS: i16 = 18;
const API_INIT_PRODUCER_ID: i16 = 22;
const NODE_ID: i32 = 1;
const CORRUPT_MESSAGE: i16 = 2;
const UNSUPPORTED_VERSION: i16 = 35;
const MAX_FRAME: usize = 256 << 20;

#[derive(Default)]
pub struct Counters {
    pub records: AtomicU64,
    pub batches: AtomicU64,
    /// Record batches whose attributes name a compression codec.
    pub compressed_batches: AtomicU64,
    pub requests: AtomicU64,
    pub bytes: AtomicU64,
    /// Partitions answered CORRUPT_MESSAGE (bad magic, length or CRC).
    pub rejected: AtomicU64,
    /// Nanoseconds since `Sink::epoch` of the last counted record batch.
    pub last_ns: AtomicU64,
    pub connections: AtomicU64,
    /// Protocol problems that ended a connection.
    pub errors: Mutex<Vec<String>>,
}

pub struct Sink {
    pub port: u16,
    pub epoch: Instant,
    pub counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    accept: Option<std::thread::JoinHandle<()>>,
}

struct Shared {
    port: u16,
    topics: Vec<Vec<u8>>,
    partitions: i32,
    verify_crc: bool,
    epoch: Instant,
    counters: Arc<Counters>,
    /// Next offset per topic and partition, so base offsets advance like a broker's. Keyed
    /// by the name alone with a fast hash, and looked up without copying it: at 10,000
    /// topics a SipHash map keyed by a copied (name, partition) took about 40% of the
    /// sink's thread, CPU the sink takes from dory on the same cores.
    offsets: Mutex<Offsets>,
    /// Producer ids handed out so far.
    producer_ids: AtomicU64,
}

impl Sink {
    pub fn start(topics: &[Vec<u8>], partitions: i32, verify_crc: bool) -> io::Result<Sink> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let epoch = Instant::now();
        let counters = Arc::new(Counters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            port,
            topics: topics.to_vec(),
            partitions,
            verify_crc,
            epoch,
            counters: counters.clone(),
            offsets: Mutex::new(FastMap::default()),
            producer_ids: AtomicU64::new(0),
        });
        let accept = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("sink-accept".into())
                .spawn(move || {
                    for conn in listener.incoming() {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        let Ok(conn) = conn else { continue };
                        shared.counters.connections.fetch_add(1, Ordering::Relaxed);
                        let shared = shared.clone();
                        let _ =
                            std::thread::Builder::new()
                                .name("sink-conn".into())
                                .spawn(move || {
                                    if let Err(e) = serve(conn, &shared) {
                                        let mut errs = shared.counters.errors.lock().unwrap();
                                        if errs.len() < 20 {
                                            errs.push(e.to_string());
                                        }
                                    }
                                });
                    }
                })?
        };
        Ok(Sink {
            port,
            epoch,
            counters,
            stop,
            accept: Some(accept),
        })
    }

    pub fn records(&self) -> u64 {
        self.counters.records.load(Ordering::Acquire)
    }

    /// When the last record batch was counted.
    pub fn last_record_at(&self) -> Instant {
        self.epoch + Duration::from_nanos(self.counters.last_ns.load(Ordering::Acquire))
    }

    pub fn errors(&self) -> Vec<String> {
        self.counters.errors.lock().unwrap().clone()
    }
}

impl Drop for Sink {
    /// Stops accepting. Connection threads end when their peer (the daemon) closes.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn proto(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Serves one connection until the peer closes it.
fn serve(conn: TcpStream, sh: &Shared) -> io::Result<()> {
    conn.set_nodelay(true)?;
    let mut out_stream = conn.try_clone()?;
    let mut input = BufReader::with_capacity(256 << 10, conn);
    let mut frame = Vec::new();
    let mut out = Vec::with_capacity(4096);
    loop {
        let mut size = [0u8; 4];
        match input.read_exact(&mut size) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(()),
            Err(e) => return Err(e),
        }
        let size = i32::from_be_bytes(size);
        if size < 8 || size as usize > MAX_FRAME {
            return Err(proto(format!("request frame size {size}")));
        }
        frame.resize(size as usize, 0);
        input.read_exact(&mut frame)?;
        out.clear();
        if handle(&frame, sh, &mut out)? {
            out_stream.write_all(&out)?;
        }
    }
}

/// Handles one request frame (size prefix stripped); returns whether `out` holds a response.
fn handle(frame: &[u8], sh: &Shared, out: &mut Vec<u8>) -> io::Result<bool> {
    let mut r = Rd::new(frame);
    let api_key = r.i16()?;
    let version = r.i16()?;
    let correlation_id = r.i32()?;
    let _client_id = r.nullable_string()?;
    let flexible_header = match api_key {
        API_VERSIONS => version >= 3,
        API_METADATA => version >= 9,
        API_INIT_PRODUCER_ID => version >= 2,
        _ => false,
    };
    if flexible_header {
        r.skip_tagged_fields()?;
    }
    let mut w = Wr::begin(out, correlation_id);
    match api_key {
        API_VERSIONS => api_versions(&mut w, version),
        API_METADATA => {
            if !(0..=12).contains(&version) {
                return Err(proto(format!("Metadata v{version} not advertised")));
            }
            w.flexible = version >= 9;
            if w.flexible {
                w.u8(0); // response header v1: tagged fields
            }
            let asked = metadata_topics(&mut r, version)?;
            let topics = asked.unwrap_or_else(|| sh.topics.clone());
            metadata(&mut w, version, sh, &topics);
        }
        API_INIT_PRODUCER_ID => {
            if !(0..=4).contains(&version) {
                return Err(proto(format!("InitProducerId v{version} not advertised")));
            }
            w.flexible = version >= 2;
            if w.flexible {
                w.u8(0); // response header v1: tagged fields
            }
            w.i32(0); // throttle_time_ms
            w.i16(0); // error_code
            w.i64(1000 + sh.producer_ids.fetch_add(1, Ordering::Relaxed) as i64);
            w.i16(0); // producer_epoch
            w.tagged_fields();
        }
        API_PRODUCE => {
            if !(3..=8).contains(&version) {
                return Err(proto(format!("Produce v{version} not advertised")));
            }
            if !produce(&mut r, &mut w, version, sh)? {
                return Ok(false); // acks = 0: no response
            }
        }
        k => return Err(proto(format!("unexpected API key {k} v{version}"))),
    }
    w.finish();
    Ok(true)
}

fn api_versions(w: &mut Wr<'_>, version: i16) {
    const APIS: [(i16, i16, i16); 6] = [
        (API_PRODUCE, 3, 8),
        // Never served (a request for it ends the connection with an error): listed only
        // because librdkafka infers broker features from it, record batches (magic 2)
        // from Fetch >= 4 and zstd from Fetch >= 10 (with Produce >= 7).
        (API_FETCH, 4, 11),
        (API_METADATA, 0, 12),
        // Never served either: librdkafka's sign of a broker that takes lz4.
        (API_FIND_COORDINATOR, 0, 2),
        (API_VERSIONS, 0, 3),
        (API_INIT_PRODUCER_ID, 0, 4),
    ];
    if !(0..=3).contains(&version) {
        // KIP-511: v0 layout, listing the ApiVersions versions we do support.
        w.i16(UNSUPPORTED_VERSION);
        w.i32(1);
        w.i16(API_VERSIONS);
        w.i16(0);
        w.i16(3);
        return;
    }
    w.flexible = version >= 3; // body only: the response header stays v0
    w.i16(0);
    w.array_len(APIS.len());
    for (key, min, max) in APIS {
        w.i16(key);
        w.i16(min);
        w.i16(max);
        w.tagged_fields();
    }
    if version >= 1 {
        w.i32(0); // throttle_time_ms
    }
    w.tagged_fields();
}

/// The topic names a Metadata request asks for; `None` means all topics.
fn metadata_topics(r: &mut Rd<'_>, version: i16) -> io::Result<Option<Vec<Vec<u8>>>> {
    let flexible = version >= 9;
    let n = if flexible {
        match r.uvarint()? {
            0 => return Ok(None),
            n => (n - 1) as usize,
        }
    } else {
        match r.i32()? {
            -1 if version >= 1 => return Ok(None),
            n if n < 0 => return Err(proto("negative topic count")),
            0 if version == 0 => return Ok(None),
            n => n as usize,
        }
    };
    let mut names = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        if version >= 10 {
            r.take(16)?; // topic id
        }
        let name = if flexible {
            r.compact_nullable_string()?
        } else {
            Some(r.string()?)
        };
        if flexible {
            r.skip_tagged_fields()?;
        }
        names.push(
            name.ok_or_else(|| proto("metadata lookup by topic id"))?
                .to_vec(),
        );
    }
    Ok(Some(names))
}

fn metadata(w: &mut Wr<'_>, version: i16, sh: &Shared, topics: &[Vec<u8>]) {
    if version >= 3 {
        w.i32(0); // throttle_time_ms
    }
    w.array_len(1);
    w.i32(NODE_ID);
    w.string(b"127.0.0.1");
    w.i32(i32::from(sh.port));
    if version >= 1 {
        w.nullable_string(None); // rack
    }
    w.tagged_fields();
    if version >= 2 {
        w.nullable_string(Some(b"dory-bench-sink")); // cluster id
    }
    if version >= 1 {
        w.i32(NODE_ID); // controller
    }
    w.array_len(topics.len());
    for name in topics {
        w.i16(0);
        w.string(name); // v12 allows null here; a non-null name encodes the same
        if version >= 10 {
            w.raw(&[0; 16]); // topic id
        }
        if version >= 1 {
            w.u8(0); // is_internal
        }
        w.array_len(sh.partitions as usize);
        for p in 0..sh.partitions {
            w.i16(0);
            w.i32(p);
            w.i32(NODE_ID);
            if version >= 7 {
                w.i32(0); // leader epoch
            }
            w.array_len(1);
            w.i32(NODE_ID); // replicas
            w.array_len(1);
            w.i32(NODE_ID); // isr
            if version >= 5 {
                w.array_len(0); // offline replicas
            }
            w.tagged_fields();
        }
        if version >= 8 {
            w.i32(i32::MIN); // topic authorized operations: not requested
        }
        w.tagged_fields();
    }
    if (8..=10).contains(&version) {
        w.i32(i32::MIN); // cluster authorized operations: not requested
    }
    w.tagged_fields();
}

/// (partition, error code, base offset)
type PartitionResult = (i32, i16, i64);

/// Parses a Produce request, counts its records and writes the response. Returns false
/// for acks = 0 (no response is sent).
fn produce(r: &mut Rd<'_>, w: &mut Wr<'_>, version: i16, sh: &Shared) -> io::Result<bool> {
    let c = &sh.counters;
    let _transactional_id = r.nullable_string()?;
    let acks = r.i16()?;
    let _timeout_ms = r.i32()?;
    let topic_count = r.array_len()?;
    let mut results: Vec<(&[u8], Vec<PartitionResult>)> = Vec::with_capacity(topic_count);
    let mut records_total = 0u64;
    let mut batches_total = 0u64;
    let mut compressed_total = 0u64;
    let mut bytes_total = 0u64;
    let mut rejected = 0u64;
    {
        let mut offsets = sh.offsets.lock().unwrap();
        for _ in 0..topic_count {
            let topic = r.string()?;
            let partition_count = r.array_len()?;
            let mut parts = Vec::with_capacity(partition_count);
            for _ in 0..partition_count {
                let partition = r.i32()?;
                let records = r.nullable_bytes()?.unwrap_or(&[]);
                bytes_total += records.len() as u64;
                match count_records(records, sh.verify_crc) {
                    Ok((n, b, compressed)) => {
                        compressed_total += compressed;
                        let next = next_offset(&mut offsets, topic, partition);
                        let base = *next;
                        *next += n as i64;
                        records_total += n;
                        batches_total += b;
                        parts.push((partition, 0, base));
                    }
                    Err(e) => {
                        let mut errs = c.errors.lock().unwrap();
                        if errs.len() < 5 {
                            errs.push(format!(
                                "Produce v{version} {}[{partition}]: rejected: {e}",
                                String::from_utf8_lossy(topic)
                            ));
                        }
                        drop(errs);
                        rejected += 1;
                        parts.push((partition, CORRUPT_MESSAGE, -1));
                    }
                }
            }
            results.push((topic, parts));
        }
    }
    c.requests.fetch_add(1, Ordering::Relaxed);
    c.bytes.fetch_add(bytes_total, Ordering::Relaxed);
    c.batches.fetch_add(batches_total, Ordering::Relaxed);
    c.compressed_batches
        .fetch_add(compressed_total, Ordering::Relaxed);
    c.rejected.fetch_add(rejected, Ordering::Relaxed);
    if records_total > 0 {
        let ns = sh.epoch.elapsed().as_nanos() as u64;
        c.last_ns.store(ns, Ordering::Release);
        c.records.fetch_add(records_total, Ordering::AcqRel);
    }
    if acks == 0 {
        return Ok(false);
    }
    w.array_len(results.len());
    for (topic, parts) in &results {
        w.string(topic);
        w.array_len(parts.len());
        for &(partition, error, base) in parts {
            w.i32(partition);
            w.i16(error);
            w.i64(base);
            w.i64(-1); // log append time: CreateTime topics
            if version >= 5 {
                w.i64(0); // log start offset
            }
            if version >= 8 {
                w.array_len(0); // record errors
                w.nullable_string(None); // error message
            }
        }
    }
    w.i32(0); // throttle_time_ms
    Ok(true)
}

/// Each topic's partitions with their next offset.
type Offsets = FastMap<Vec<u8>, Vec<(i32, i64)>>;

/// The next offset of `topic`'s `partition`, 0 for a new one.
fn next_offset<'a>(offsets: &'a mut Offsets, topic: &[u8], partition: i32) -> &'a mut i64 {
    if !offsets.contains_key(topic) {
        offsets.insert(topic.to_vec(), Vec::new());
    }
    let parts = offsets.get_mut(topic).expect("inserted above");
    let i = match parts.iter().position(|p| p.0 == partition) {
        Some(i) => i,
        None => {
            parts.push((partition, 0));
            parts.len() - 1
        }
    };
    &mut parts[i].1
}

/// RecordBatch v2 offsets (from the batch start).
const BATCH_LENGTH: usize = 8;
const MAGIC: usize = 16;
const CRC: usize = 17;
const CRC_START: usize = 21;
const ATTRIBUTES: usize = 21;
const RECORD_COUNT: usize = 57;
const HEADER_LEN: usize = 61;

/// Counts the records of every batch in `records`: (records, batches, compressed batches).
fn count_records(records: &[u8], verify_crc: bool) -> Result<(u64, u64, u64), String> {
    let mut pos = 0;
    let mut n = 0u64;
    let mut batches = 0u64;
    let mut compressed = 0u64;
    while pos < records.len() {
        let b = &records[pos..];
        if b.len() < HEADER_LEN {
            return Err(format!("truncated batch header ({} bytes)", b.len()));
        }
        let len = i32::from_be_bytes(b[BATCH_LENGTH..BATCH_LENGTH + 4].try_into().unwrap());
        let total = 12usize
            .checked_add(usize::try_from(len).map_err(|_| "negative batch length")?)
            .ok_or("batch length overflow")?;
        if total < HEADER_LEN || total > b.len() {
            return Err(format!("batch length {len} with {} bytes left", b.len()));
        }
        if b[MAGIC] != 2 {
            return Err(format!("magic {}", b[MAGIC]));
        }
        if verify_crc {
            let want = u32::from_be_bytes(b[CRC..CRC + 4].try_into().unwrap());
            if crc32c::crc32c(&b[CRC_START..total]) != want {
                return Err("CRC-32C mismatch".into());
            }
        }
        let count = i32::from_be_bytes(b[RECORD_COUNT..RECORD_COUNT + 4].try_into().unwrap());
        n += u64::try_from(count).map_err(|_| "negative record count")?;
        batches += 1;
        // The low 3 bits of the attributes: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.
        compressed += u64::from(b[ATTRIBUTES + 1] & 0x07 != 0);
        pos += total;
    }
    Ok((n, batches, compressed))
}

// ----- tiny codec -----

struct Rd<'a> {
    b: &'a [u8],
}

impl<'a> Rd<'a> {
    fn new(b: &'a [u8]) -> Self {
        Rd { b }
    }
    fn take(&mut self, n: usize) -> io::Result<&'a [u8]> {
        if self.b.len() < n {
            return Err(proto("request truncated"));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn i16(&mut self) -> io::Result<i16> {
        Ok(i16::from_be_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn i32(&mut self) -> io::Result<i32> {
        Ok(i32::from_be_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn uvarint(&mut self) -> io::Result<u32> {
        let mut v = 0u32;
        for shift in (0..35).step_by(7) {
            let byte = self.take(1)?[0];
            v |= u32::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(proto("varint too long"))
    }
    fn array_len(&mut self) -> io::Result<usize> {
        let n = self.i32()?;
        usize::try_from(n).map_err(|_| proto("negative array length"))
    }
    fn string(&mut self) -> io::Result<&'a [u8]> {
        let n = self.i16()?;
        let n = usize::try_from(n).map_err(|_| proto("null string"))?;
        self.take(n)
    }
    fn nullable_string(&mut self) -> io::Result<Option<&'a [u8]>> {
        let n = self.i16()?;
        if n < 0 {
            return Ok(None);
        }
        self.take(n as usize).map(Some)
    }
    fn compact_nullable_string(&mut self) -> io::Result<Option<&'a [u8]>> {
        match self.uvarint()? {
            0 => Ok(None),
            n => self.take(n as usize - 1).map(Some),
        }
    }
    fn nullable_bytes(&mut self) -> io::Result<Option<&'a [u8]>> {
        let n = self.i32()?;
        if n < 0 {
            return Ok(None);
        }
        self.take(n as usize).map(Some)
    }
    fn skip_tagged_fields(&mut self) -> io::Result<()> {
        let n = self.uvarint()?;
        for _ in 0..n {
            let _tag = self.uvarint()?;
            let len = self.uvarint()?;
            self.take(len as usize)?;
        }
        Ok(())
    }
}

/// Writes a response frame: size prefix (patched in `finish`), correlation id, body. With
/// `flexible` set, arrays and strings are compact and tagged-field sections are written.
struct Wr<'a> {
    out: &'a mut Vec<u8>,
    start: usize,
    flexible: bool,
}

impl<'a> Wr<'a> {
    fn begin(out: &'a mut Vec<u8>, correlation_id: i32) -> Self {
        let start = out.len();
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&correlation_id.to_be_bytes());
        Wr {
            out,
            start,
            flexible: false,
        }
    }
    fn finish(self) {
        let size = (self.out.len() - self.start - 4) as i32;
        self.out[self.start..self.start + 4].copy_from_slice(&size.to_be_bytes());
    }
    fn raw(&mut self, b: &[u8]) {
        self.out.extend_from_slice(b);
    }
    fn u8(&mut self, v: u8) {
        self.out.push(v);
    }
    fn i16(&mut self, v: i16) {
        self.raw(&v.to_be_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.raw(&v.to_be_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.raw(&v.to_be_bytes());
    }
    fn uvarint(&mut self, mut v: u32) {
        while v >= 0x80 {
            self.out.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.out.push(v as u8);
    }
    fn array_len(&mut self, n: usize) {
        if self.flexible {
            self.uvarint(n as u32 + 1);
        } else {
            self.i32(n as i32);
        }
    }
    fn string(&mut self, s: &[u8]) {
        if self.flexible {
            self.uvarint(s.len() as u32 + 1);
        } else {
            self.i16(s.len() as i16);
        }
        self.raw(s);
    }
    fn nullable_string(&mut self, s: Option<&[u8]>) {
        match s {
            Some(s) => self.string(s),
            None if self.flexible => self.uvarint(0),
            None => self.i16(-1),
        }
    }
    fn tagged_fields(&mut self) {
        if self.flexible {
            self.uvarint(0);
        }
    }
}

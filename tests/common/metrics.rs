//! An HTTP/1.0 client and a parser of the Prometheus text dory serves.

use super::*;

/// A minimal HTTP/1.0 GET: returns (status code, body). Bounded by `timeout` overall.
pub fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> io::Result<(u16, String)> {
    let r = http_get_raw(addr, path, &[], timeout)?;
    Ok((r.code, String::from_utf8_lossy(&r.body).into_owned()))
}

/// An HTTP reply as [`http_get_raw`] read it.
pub struct RawReply {
    pub code: u16,
    /// The header lines after the status line, as sent.
    pub head: String,
    /// The body's bytes, as sent (not decompressed).
    pub body: Vec<u8>,
}

impl RawReply {
    /// The value of header `name` (any case), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        header_value(&self.head, name)
    }
}

/// The value of the first header `name` (any case) among the header lines `head`.
fn header_value<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// An HTTP/1.0 GET sending the extra `headers`, read to `Content-Length` or to the end.
/// Bounded by `timeout` overall.
pub fn http_get_raw(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> io::Result<RawReply> {
    let deadline = Instant::now() + timeout;
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let mut request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    s.write_all(request.as_bytes())?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let mut header_end = None;
    let mut content_length = None;
    loop {
        if let Some(h) = header_end {
            if let Some(len) = content_length {
                if buf.len() >= h + len {
                    buf.truncate(h + len);
                    break;
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "HTTP response incomplete",
            ));
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if header_end.is_none() {
            if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                header_end = Some(pos + 4);
                let head = String::from_utf8_lossy(&buf[..pos]);
                let fields = head.split_once("\r\n").map_or("", |(_, rest)| rest);
                content_length =
                    header_value(fields, "content-length").and_then(|v| v.parse::<usize>().ok());
            }
        }
    }
    let invalid = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
    let h = header_end.ok_or_else(|| invalid("no end of HTTP headers"))?;
    if let Some(len) = content_length {
        if buf.len() < h + len {
            return Err(invalid("HTTP body shorter than Content-Length"));
        }
    }
    let head = String::from_utf8_lossy(&buf[..h - 4]).into_owned();
    let (status_line, rest) = head.split_once("\r\n").unwrap_or((head.as_str(), ""));
    let mut words = status_line.split_whitespace();
    let code = match (words.next(), words.next()) {
        (Some(v), Some(c)) if v.starts_with("HTTP/") => c.parse::<u16>().ok(),
        _ => None,
    }
    .ok_or_else(|| invalid(&format!("bad status line {status_line:?}")))?;
    Ok(RawReply {
        code,
        head: rest.to_string(),
        body: buf.split_off(h),
    })
}

/// Metric names dory exposes on `/metrics` (Prometheus text format), one sample per topic
/// (label `topic`; discards also `reason`). Malformed input, which has no topic, is counted
/// under `topic=""`.
pub const METRIC_RECEIVED: &str = "dory_messages_received_total";
pub const METRIC_DELIVERED: &str = "dory_messages_delivered_total";
pub const METRIC_DISCARDED: &str = "dory_messages_discarded_total";
pub const METRIC_IN_FLIGHT: &str = "dory_messages_in_flight";

/// Discard reasons for client input that fails parsing (§1.5).
pub const REASON_MALFORMED: &str = "malformed";
pub const REASON_UNSUPPORTED_API_KEY: &str = "unsupported_api_key";
pub const REASON_UNSUPPORTED_VERSION: &str = "unsupported_version";

/// One Prometheus sample.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parsed `/metrics`: the accounting maps, plus every sample and the raw text.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    pub received: BTreeMap<String, u64>,
    pub delivered: BTreeMap<String, u64>,
    pub discarded: BTreeMap<(String, String), u64>,
    pub in_flight: BTreeMap<String, u64>,
    pub samples: Vec<Sample>,
    pub text: String,
}

impl Metrics {
    pub fn parse(text: &str) -> Result<Metrics, String> {
        let mut m = Metrics {
            text: text.to_string(),
            ..Metrics::default()
        };
        let mut seen = BTreeSet::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let sample = parse_sample(line)
                .map_err(|e| format!("/metrics line {}: {e}: {line:?}", i + 1))?;
            if !seen.insert((sample.name.clone(), sample.labels.clone())) {
                return Err(format!(
                    "/metrics line {}: duplicate sample {line:?}",
                    i + 1
                ));
            }
            let count = || -> Result<u64, String> {
                let v = sample.value;
                if v >= 0.0 && v.fract() == 0.0 && v < 2f64.powi(53) {
                    // Exact: integral and within f64's exact integer range.
                    Ok(v as u64)
                } else {
                    Err(format!("{} is not a count: {v}", sample.name))
                }
            };
            let label =
                |k: &str| -> Result<String, String> {
                    sample.labels.get(k).cloned().ok_or_else(|| {
                        format!("{} sample without label {k:?}: {line:?}", sample.name)
                    })
                };
            match sample.name.as_str() {
                METRIC_RECEIVED => {
                    m.received.insert(label("topic")?, count()?);
                }
                METRIC_DELIVERED => {
                    m.delivered.insert(label("topic")?, count()?);
                }
                METRIC_IN_FLIGHT => {
                    m.in_flight.insert(label("topic")?, count()?);
                }
                METRIC_DISCARDED => {
                    m.discarded
                        .insert((label("topic")?, label("reason")?), count()?);
                }
                _ => {}
            }
            m.samples.push(sample);
        }
        Ok(m)
    }

    pub fn received(&self, topic: &str) -> u64 {
        self.received.get(topic).copied().unwrap_or(0)
    }
    pub fn delivered(&self, topic: &str) -> u64 {
        self.delivered.get(topic).copied().unwrap_or(0)
    }
    pub fn in_flight(&self, topic: &str) -> u64 {
        self.in_flight.get(topic).copied().unwrap_or(0)
    }
    pub fn discarded(&self, topic: &str, reason: &str) -> u64 {
        self.discarded
            .get(&(topic.to_string(), reason.to_string()))
            .copied()
            .unwrap_or(0)
    }
    /// Σ over reasons of discards for `topic`.
    pub fn discarded_total(&self, topic: &str) -> u64 {
        self.discarded
            .iter()
            .filter(|((t, _), _)| t == topic)
            .map(|(_, n)| n)
            .sum()
    }
    /// Non-zero discard counts of `topic`, by reason.
    pub fn discards_of(&self, topic: &str) -> BTreeMap<String, u64> {
        self.discarded
            .iter()
            .filter(|((t, _), &n)| t == topic && n != 0)
            .map(|((_, r), &n)| (r.clone(), n))
            .collect()
    }
    /// Non-zero discard counts over all topics, by reason.
    pub fn discards_by_reason(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for ((_, reason), &n) in &self.discarded {
            if n > 0 {
                *out.entry(reason.clone()).or_default() += n;
            }
        }
        out
    }
    /// Every topic named by any of the four accounting metrics.
    pub fn topics(&self) -> BTreeSet<String> {
        let mut t: BTreeSet<String> = self.received.keys().cloned().collect();
        t.extend(self.delivered.keys().cloned());
        t.extend(self.in_flight.keys().cloned());
        t.extend(self.discarded.keys().map(|(t, _)| t.clone()));
        t
    }
    /// Topics where `received != delivered + Σdiscarded + in_flight` (absent = 0).
    pub fn invariant_violations(&self) -> Vec<String> {
        self.topics()
            .into_iter()
            .filter_map(|t| {
                let (r, d, x, f) = (
                    self.received(&t),
                    self.delivered(&t),
                    self.discarded_total(&t),
                    self.in_flight(&t),
                );
                (r != d + x + f).then(|| {
                    format!(
                        "topic {t:?}: received {r} != delivered {d} + discarded {x} + in_flight {f}"
                    )
                })
            })
            .collect()
    }
}

/// Parses `name{l="v",...} value [timestamp]` (Prometheus text exposition format 0.0.4).
fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(line.len());
    if name_end == 0 {
        return Err("no metric name".into());
    }
    let name = line[..name_end].to_string();
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(r) = rest.strip_prefix('{') {
        let mut chars = r.char_indices().peekable();
        let mut consumed = None;
        loop {
            while chars.peek().is_some_and(|&(_, c)| c == ' ' || c == ',') {
                chars.next();
            }
            match chars.peek() {
                Some(&(i, '}')) => {
                    consumed = Some(i + 1);
                    break;
                }
                None => break,
                _ => {}
            }
            let mut key = String::new();
            for (_, c) in chars.by_ref() {
                if c == '=' {
                    break;
                }
                key.push(c);
            }
            let key = key.trim().to_string();
            if key.is_empty() || chars.next().map(|(_, c)| c) != Some('"') {
                return Err("bad label syntax".into());
            }
            let mut value = String::new();
            let mut closed = false;
            while let Some((_, c)) = chars.next() {
                match c {
                    '"' => {
                        closed = true;
                        break;
                    }
                    '\\' => match chars.next().map(|(_, c)| c) {
                        Some('n') => value.push('\n'),
                        Some('\\') => value.push('\\'),
                        Some('"') => value.push('"'),
                        Some(other) => return Err(format!("bad escape \\{other}")),
                        None => return Err("unterminated escape".into()),
                    },
                    c => value.push(c),
                }
            }
            if !closed {
                return Err("unterminated label value".into());
            }
            if labels.insert(key.clone(), value).is_some() {
                return Err(format!("duplicate label {key:?}"));
            }
        }
        let used = consumed.ok_or("unterminated label set")?;
        rest = &r[used..];
    }
    let mut words = rest.split_whitespace();
    let value_text = words.next().ok_or("no value")?;
    let value = match value_text {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v
            .parse::<f64>()
            .map_err(|e| format!("bad value {v:?}: {e}"))?,
    };
    if let Some(ts) = words.next() {
        ts.parse::<i64>()
            .map_err(|e| format!("bad timestamp {ts:?}: {e}"))?;
    }
    if words.next().is_some() {
        return Err("trailing text".into());
    }
    Ok(Sample {
        name,
        labels,
        value,
    })
}

/// Messages resent after a lost connection, per topic.
pub const METRIC_POSSIBLE_DUPLICATES: &str = "dory_possible_duplicates_total";
/// Pool gauge (`state` = `used` | `capacity`), bytes.
pub const METRIC_POOL_BYTES: &str = "dory_pool_bytes";

impl Metrics {
    /// The value of the sample `name` whose labels are exactly `labels` (absent = None).
    pub fn sample(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|s| {
                s.name == name
                    && s.labels.len() == labels.len()
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v))
            })
            .map(|s| s.value)
    }
    /// `dory_possible_duplicates_total{topic}` (absent = 0).
    pub fn possible_duplicates(&self, topic: &str) -> u64 {
        self.sample(METRIC_POSSIBLE_DUPLICATES, &[("topic", topic)])
            .map_or(0, |v| v as u64)
    }
    /// `dory_pool_bytes{state="used"}`, if exposed.
    pub fn pool_used(&self) -> Option<u64> {
        self.sample(METRIC_POOL_BYTES, &[("state", "used")])
            .map(|v| v as u64)
    }
}

//! `dory convert-config`: Dory's XML config (reference §2.3) in, the equivalent TOML out,
//! with a note for everything that has no equivalent or now behaves differently. Pure: text
//! in, text out; the command in `main.rs` does the reading and printing.
//!
//! Dory's parsing rules are kept, so a file Dory refused is refused here too: unknown or
//! repeated elements, text inside elements, missing required elements and bad values are
//! errors naming the element and its line; numbers are decimal (a leading 0 is an error)
//! with `k`/`m` suffixes only where Dory took them. Every setting that maps is written out,
//! with Dory's default where the file relied on one (Dory's 128 MiB message pool, say), so
//! the converted file keeps behaving as the XML did even where dory's own defaults differ.
//! The text is loaded with [`Config::from_parts`] before it is returned: the command never
//! prints a file the daemon would refuse.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use roxmltree::{Document, Node};

use super::{parse_toml, Config, ConfigError, Overrides};

/// The converted file and what did not carry over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversion {
    /// The TOML text (header comment first, the notes again as comments at the end).
    pub toml: String,
    /// In document order.
    pub notes: Vec<Note>,
}

/// Something in Dory's file that has no equivalent, or whose behaviour changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub line: u32,
    /// The element as a path from the root's child, e.g. `<msgDelivery><minPauseDelay>`.
    pub element: String,
    pub message: String,
}

impl std::fmt::Display for Note {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}: {}", self.line, self.element, self.message)
    }
}

/// Why a file cannot be converted.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("not well-formed XML: {0}")]
    Xml(#[from] roxmltree::Error),
    #[error("line {line}: {element}: {message}")]
    Element {
        line: u32,
        element: String,
        message: String,
    },
    /// A value Dory accepted that dory refuses (a socket path over 107 bytes, say).
    #[error("the converted settings would not load: {0}")]
    Load(ConfigError),
}

/// Converts the text of a Dory XML config. `source` names the file in the header comment.
pub fn convert(xml: &str, source: &str) -> Result<Conversion, ConvertError> {
    let doc = Document::parse(xml)?;
    let root = El {
        node: doc.root_element(),
        path: String::new(),
    };
    if root.node.tag_name().name() != "doryConfig" {
        return Err(root.err(format!(
            "the root element is <{}>, expected <doryConfig>",
            root.node.tag_name().name()
        )));
    }
    let mut cx = Cx::new(xml);
    let top = cx.open(
        &root,
        &[],
        &[
            ("batching", One),
            ("compression", One),
            ("topicRateLimiting", One),
            ("inputSources", One),
            ("inputConfig", One),
            ("msgDelivery", One),
            ("httpInterface", One),
            ("discardLogging", One),
            ("kafkaConfig", One),
            ("msgDebug", One),
            ("logging", One),
            ("initialBrokers", One),
        ],
    )?;
    let mut out = Toml::default();
    let input = out.table("input");
    input_sources(&mut cx, input, top.required(&root, "inputSources")?)?;
    input_config(&mut cx, input, top.get("inputConfig"))?;
    let kafka = out.table("kafka");
    brokers(&mut cx, kafka, top.required(&root, "initialBrokers")?)?;
    kafka_config(&mut cx, kafka, top.get("kafkaConfig"))?;
    match top.get("batching") {
        Some(b) => batching(&mut cx, out.table("batching"), b)?,
        None => cx.note(
            &root,
            "no <batching>: Dory set messageMaxBytes to 0 and discarded every message as too \
             long (a quirk); dory uses its batching defaults (doc/config.md)",
        ),
    }
    if let Some(c) = top.get("compression") {
        compression(&mut cx, out.table("compression"), c)?;
    }
    if let Some(r) = top.get("topicRateLimiting") {
        rate_limiting(&mut cx, out.table("rate_limit"), r)?;
    }
    msg_delivery(&mut cx, &mut out, top.get("msgDelivery"))?;
    http_interface(
        &mut cx,
        &root,
        out.table("status"),
        top.get("httpInterface"),
    )?;
    if let Some(d) = top.get("discardLogging") {
        discard_logging(&mut cx, out.table("discard_log"), d)?;
    }
    if let Some(d) = top.get("msgDebug") {
        msg_debug(&mut cx, out.table("msg_debug"), d)?;
    }
    if let Some(l) = top.get("logging") {
        logging(&mut cx, l)?;
    }

    let mut notes = cx.notes;
    notes.sort_by_key(|n| n.line);
    let toml = out.render(source, &notes);
    let raw = parse_toml(Path::new("converted.toml"), &toml).map_err(ConvertError::Load)?;
    Config::from_parts(raw, true, &Overrides::default()).map_err(ConvertError::Load)?;
    Ok(Conversion { toml, notes })
}

// ----- walking the XML -----

/// An element and its path, for messages.
#[derive(Clone)]
struct El<'a, 'i> {
    node: Node<'a, 'i>,
    path: String,
}

impl<'a, 'i> El<'a, 'i> {
    fn line(&self) -> u32 {
        self.node
            .document()
            .text_pos_at(self.node.range().start)
            .row
    }

    fn name(&self) -> &str {
        if self.path.is_empty() {
            "<doryConfig>"
        } else {
            &self.path
        }
    }

    fn err(&self, message: impl Into<String>) -> ConvertError {
        ConvertError::Element {
            line: self.line(),
            element: self.name().to_string(),
            message: message.into(),
        }
    }

    fn attr(&self, name: &str) -> Option<&'a str> {
        self.node.attribute(name)
    }

    fn req_attr(&self, name: &str) -> Result<&'a str, ConvertError> {
        self.attr(name)
            .ok_or_else(|| self.err(format!("attribute `{name}` is required")))
    }

    /// A required attribute parsed by `parse`; a bad value names the attribute.
    fn parsed<T>(
        &self,
        name: &str,
        parse: impl FnOnce(&'a str) -> Result<T, String>,
    ) -> Result<T, ConvertError> {
        parse(self.req_attr(name)?).map_err(|m| self.err(format!("attribute `{name}`: {m}")))
    }

    /// An optional attribute parsed by `parse`.
    fn parsed_opt<T>(
        &self,
        name: &str,
        parse: impl FnOnce(&'a str) -> Result<T, String>,
    ) -> Result<Option<T>, ConvertError> {
        match self.attr(name) {
            None => Ok(None),
            Some(_) => self.parsed(name, parse).map(Some),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Count {
    One,
    Many,
}
use Count::{Many, One};

/// The children of an element, checked against what Dory allows there.
struct Kids<'a, 'i> {
    one: HashMap<&'static str, El<'a, 'i>>,
    many: Vec<El<'a, 'i>>,
}

impl<'a, 'i> Kids<'a, 'i> {
    fn get(&self, name: &str) -> Option<&El<'a, 'i>> {
        self.one.get(name)
    }

    fn required(&self, parent: &El, name: &str) -> Result<&El<'a, 'i>, ConvertError> {
        self.get(name)
            .ok_or_else(|| parent.err(format!("element <{name}> is required here")))
    }
}

struct Cx {
    notes: Vec<Note>,
    /// Where each line after the first starts: a note's line by binary search, as a file
    /// can hold a note per attribute and `Document::text_pos_at` counts from the start.
    line_starts: Vec<usize>,
}

impl Cx {
    fn new(xml: &str) -> Cx {
        Cx {
            notes: Vec::new(),
            line_starts: xml.match_indices('\n').map(|(i, _)| i + 1).collect(),
        }
    }

    fn note(&mut self, el: &El, message: impl Into<String>) {
        let before = self
            .line_starts
            .partition_point(|&start| start <= el.node.range().start);
        self.notes.push(Note {
            line: u32::try_from(before + 1).unwrap_or(u32::MAX),
            element: el.name().to_string(),
            message: message.into(),
        });
    }

    /// Checks `el`'s attributes and children: unknown attributes are noted (Dory ignored
    /// them), unknown or repeated elements and text are errors, comments are fine.
    fn open<'a, 'i>(
        &mut self,
        el: &El<'a, 'i>,
        attrs: &[&str],
        children: &[(&'static str, Count)],
    ) -> Result<Kids<'a, 'i>, ConvertError> {
        for a in el.node.attributes() {
            if !attrs.contains(&a.name()) {
                self.note(
                    el,
                    format!("attribute `{}` is not one of Dory's; ignored", a.name()),
                );
            }
        }
        let mut kids = Kids {
            one: HashMap::new(),
            many: Vec::new(),
        };
        for child in el.node.children() {
            if child.is_text() {
                if child.text().is_some_and(|t| !t.trim().is_empty()) {
                    return Err(el.err("text is not allowed inside this element"));
                }
                continue;
            }
            if !child.is_element() {
                continue;
            }
            let name = child.tag_name().name();
            let c = El {
                node: child,
                path: format!("{}<{name}>", el.path),
            };
            match children.iter().find(|(n, _)| *n == name) {
                None if children.is_empty() => {
                    return Err(c.err(format!(
                        "unknown element: {} takes no child elements",
                        el.name()
                    )))
                }
                None => {
                    let expected: Vec<String> =
                        children.iter().map(|(n, _)| format!("<{n}>")).collect();
                    return Err(c.err(format!(
                        "unknown element (expected one of {})",
                        expected.join(", ")
                    )));
                }
                Some((_, Many)) => kids.many.push(c),
                Some((n, One)) => {
                    if kids.one.contains_key(n) {
                        return Err(c.err("element repeated; Dory allows it once"));
                    }
                    kids.one.insert(n, c);
                }
            }
        }
        Ok(kids)
    }

    /// A leaf's attribute (most often `value`), parsed.
    fn leaf<'a, T>(
        &mut self,
        el: &El<'a, '_>,
        attr: &str,
        parse: impl FnOnce(&'a str) -> Result<T, String>,
    ) -> Result<T, ConvertError> {
        self.open(el, &[attr], &[])?;
        el.parsed(attr, parse)
    }

    /// The `value` of the optional leaf `name` among `kids`.
    fn value<'a, T>(
        &mut self,
        kids: &Kids<'a, '_>,
        name: &str,
        parse: impl FnOnce(&'a str) -> Result<T, String>,
    ) -> Result<Option<T>, ConvertError> {
        match kids.get(name) {
            None => Ok(None),
            Some(el) => self.leaf(el, "value", parse).map(Some),
        }
    }
}

// ----- Dory's value syntax -----

#[derive(Clone, Copy)]
enum Suffix {
    None,
    K,
    KM,
}

/// Dory's unsigned integers: decimal, a leading 0 refused (it would be octal), `k` (×1024)
/// and `m` (×1048576) where allowed.
fn uint(s: &str, suffix: Suffix) -> Result<u64, String> {
    let t = s.trim();
    let (digits, mult) = match (t.as_bytes().last(), suffix) {
        (Some(b'k' | b'K'), Suffix::K | Suffix::KM) => (&t[..t.len() - 1], 1u64 << 10),
        (Some(b'm' | b'M'), Suffix::KM) => (&t[..t.len() - 1], 1u64 << 20),
        _ => (t, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "`{s}` is not {}",
            match suffix {
                Suffix::None => "a decimal number",
                Suffix::K => "a decimal number (optionally with a k suffix)",
                Suffix::KM => "a decimal number (optionally with a k or m suffix)",
            }
        ));
    }
    if digits.len() > 1 && digits.starts_with('0') {
        return Err(format!(
            "`{s}`: a leading 0 makes a number octal, which Dory refuses here"
        ));
    }
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("`{s}` is too large"))
}

fn plain(s: &str) -> Result<u64, String> {
    uint(s, Suffix::None)
}

fn with_k(s: &str) -> Result<u64, String> {
    uint(s, Suffix::K)
}

fn with_km(s: &str) -> Result<u64, String> {
    uint(s, Suffix::KM)
}

fn positive(s: &str) -> Result<u64, String> {
    match plain(s)? {
        0 => Err(format!("`{s}`: must be greater than 0")),
        n => Ok(n),
    }
}

/// `disable` (exactly) or a number.
fn or_disable(suffix: Suffix) -> impl Fn(&str) -> Result<Option<u64>, String> {
    move |s| match s {
        "disable" => Ok(None),
        _ => uint(s, suffix).map(Some),
    }
}

/// `unlimited` (exactly) or a number with an optional `k`.
fn or_unlimited(s: &str) -> Result<Option<u64>, String> {
    match s {
        "unlimited" => Ok(None),
        _ => with_k(s).map(Some),
    }
}

fn boolean(s: &str) -> Result<bool, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("true") {
        Ok(true)
    } else if t.eq_ignore_ascii_case("false") {
        Ok(false)
    } else {
        Err(format!("`{s}` is neither true nor false"))
    }
}

/// Dory's file modes: octal with a leading 0, binary with `0b`, or `unspecified` (umask).
fn file_mode(s: &str) -> Result<Option<u32>, String> {
    let t = s.trim();
    if t == "unspecified" {
        return Ok(None);
    }
    let (digits, radix) = if let Some(b) = t.strip_prefix("0b").or(t.strip_prefix("0B")) {
        (b, 2)
    } else if let Some(o) = t.strip_prefix('0') {
        (if o.is_empty() { "0" } else { o }, 8)
    } else {
        return Err(format!(
            "`{s}` is not a file mode: write it in octal with a leading 0 (\"0644\"), in \
             binary (\"0b110100100\"), or \"unspecified\""
        ));
    };
    let digits_ok = !digits.is_empty() && digits.bytes().all(|b| (b'0'..b'0' + radix).contains(&b));
    match u32::from_str_radix(digits, u32::from(radix)) {
        Ok(m) if digits_ok && m <= 0o777 => Ok(Some(m)),
        Ok(_) if digits_ok => Err(format!("`{s}` is above 0777")),
        _ => Err(format!("`{s}` is not a file mode")),
    }
}

fn absolute_or_empty(s: &str) -> Result<&str, String> {
    if s.is_empty() || s.starts_with('/') {
        Ok(s)
    } else {
        Err(format!("`{s}` must be an absolute path (or empty)"))
    }
}

fn non_empty(s: &str) -> Result<&str, String> {
    if s.is_empty() {
        Err("must not be empty".into())
    } else {
        Ok(s)
    }
}

fn fits<T: TryFrom<u64>>(n: u64, what: &str) -> Result<T, String> {
    T::try_from(n).map_err(|_| format!("{n} is too large for {what}"))
}

// ----- the sections -----

/// A UNIX socket input: `<path>` and optional `<mode>`.
fn unix_socket(
    cx: &mut Cx,
    t: &mut Table,
    el: &El,
    key: &str,
    mode_key: &str,
) -> Result<bool, ConvertError> {
    let kids = cx.open(el, &["enable"], &[("path", One), ("mode", One)])?;
    let enable = el.parsed("enable", boolean)?;
    let path = cx.leaf(kids.required(el, "path")?, "value", absolute_or_empty)?;
    let mode = cx.value(&kids, "mode", file_mode)?.flatten();
    let on = enable && !path.is_empty();
    if on {
        t.kv(key, string(path));
        if let Some(m) = mode {
            t.kv(mode_key, string(&format!("{m:04o}")));
        }
    } else if !path.is_empty() {
        t.comment(&format!("{key} = {}  (off in Dory's file)", string(path)));
    }
    Ok(on)
}

fn input_sources(cx: &mut Cx, t: &mut Table, el: &El) -> Result<(), ConvertError> {
    let kids = cx.open(
        el,
        &[],
        &[("unixDatagram", One), ("unixStream", One), ("tcp", One)],
    )?;
    let mut any = false;
    if let Some(d) = kids.get("unixDatagram") {
        any |= unix_socket(cx, t, d, "dgram_socket", "dgram_socket_mode")?;
    }
    if let Some(s) = kids.get("unixStream") {
        any |= unix_socket(cx, t, s, "stream_socket", "stream_socket_mode")?;
    }
    if let Some(tcp) = kids.get("tcp") {
        let k = cx.open(tcp, &["enable"], &[("port", One)])?;
        let enable = tcp.parsed("enable", boolean)?;
        let port_el = k.required(tcp, "port")?;
        cx.open(port_el, &["value"], &[])?;
        // A missing or empty value turns TCP input off, as in Dory.
        let port = match port_el.attr("value").map(str::trim) {
            None | Some("") => None,
            Some(_) => Some(port_el.parsed("value", |s| {
                let p: u16 = fits(positive(s)?, "a port")?;
                Ok(p)
            })?),
        };
        match port {
            Some(p) if enable => {
                t.kv("tcp_port", p.to_string());
                any = true;
            }
            Some(p) => t.comment(&format!("tcp_port = {p}  (off in Dory's file)")),
            None => {}
        }
    }
    if !any {
        return Err(el.err(
            "no input is enabled (Dory refuses this too): enable <unixDatagram>, <unixStream> \
             or <tcp>",
        ));
    }
    Ok(())
}

fn input_config(cx: &mut Cx, t: &mut Table, el: Option<&El>) -> Result<(), ConvertError> {
    let (max_buffer, max_dgram, max_stream) = match el {
        None => (None, None, None),
        Some(el) => {
            let kids = cx.open(
                el,
                &[],
                &[
                    ("maxBuffer", One),
                    ("maxDatagramMsgSize", One),
                    ("allowLargeUnixDatagrams", One),
                    ("maxStreamMsgSize", One),
                ],
            )?;
            if let Some(a) = kids.get("allowLargeUnixDatagrams") {
                cx.leaf(a, "value", boolean)?;
                cx.note(
                    a,
                    "no equivalent, none needed: a datagram size that needs a larger client \
                     SO_SNDBUF is a warning at start, not an error",
                );
            }
            (
                cx.value(&kids, "maxBuffer", with_km)?,
                cx.value(&kids, "maxDatagramMsgSize", with_km)?,
                cx.value(&kids, "maxStreamMsgSize", with_km)?,
            )
        }
    };
    t.kv_or_default("max_datagram_msg_size", max_dgram.map(size), size(64 << 10));
    t.kv_or_default("max_stream_msg_size", max_stream.map(size), size(2 << 20));
    // Dory's pool default is 128 MiB, dory's 64 MiB: written out either way.
    t.kv_or_default("msg_buffer_max", max_buffer.map(size), size(128 << 20));
    Ok(())
}

fn brokers(cx: &mut Cx, t: &mut Table, el: &El) -> Result<(), ConvertError> {
    let kids = cx.open(el, &[], &[("broker", Many)])?;
    let mut list = Vec::new();
    for b in &kids.many {
        cx.open(b, &["host", "port"], &[])?;
        let host = b.parsed("host", |s| non_empty(s.trim()))?;
        let port = match b.parsed_opt("port", |s| fits::<u16>(positive(s)?, "a port"))? {
            Some(p) => p,
            None => {
                cx.note(
                    b,
                    format!(
                        "no port: Dory used 9002 (most likely meant as 9092); written as \
                         {host}:9002, check it"
                    ),
                );
                9002
            }
        };
        let addr = super::BrokerAddr {
            host: host.to_string(),
            port,
        };
        list.push(string(&addr.to_string()));
    }
    if list.is_empty() {
        return Err(el.err("list at least one <broker host=\"...\" port=\"...\"/>"));
    }
    t.kv("brokers", format!("[{}]", list.join(", ")));
    Ok(())
}

fn kafka_config(cx: &mut Cx, t: &mut Table, el: Option<&El>) -> Result<(), ConvertError> {
    let (client_id, timeout) = match el {
        None => (None, None),
        Some(el) => {
            let kids = cx.open(el, &[], &[("clientId", One), ("replicationTimeout", One)])?;
            (
                cx.value(&kids, "clientId", |s| Ok(s.to_string()))?,
                cx.value(&kids, "replicationTimeout", |s| {
                    let n = plain(s)?;
                    if n > i32::MAX as u64 {
                        return Err(format!("`{s}` is above 2147483647"));
                    }
                    Ok(n)
                })?,
            )
        }
    };
    t.kv_or_default("client_id", client_id.map(|c| string(&c)), string("dory"));
    t.kv_or_default(
        "replication_timeout_ms",
        timeout.map(|n| n.to_string()),
        "10000".into(),
    );
    Ok(())
}

/// One of Dory's named batching configs: time (ms), messages, bytes; `None` = disabled.
#[derive(Clone, Copy)]
struct Limits {
    time: Option<u64>,
    messages: Option<u64>,
    bytes: Option<u64>,
}

/// A topic's batching: the TOML action and, for `perTopic`, the named config and its limits.
type TopicAction<'a> = (&'static str, Option<(&'a str, Limits)>);

/// `action` and `config` of `<defaultTopic>` or `<topic>`.
fn batch_action<'a>(
    el: &El<'a, '_>,
    named: &BTreeMap<String, Limits>,
) -> Result<TopicAction<'a>, ConvertError> {
    let config = el.attr("config").filter(|c| !c.is_empty());
    match el.req_attr("action")? {
        "perTopic" => {
            let c = config.ok_or_else(|| {
                el.err("action \"perTopic\" needs `config`, the name of a batching config")
            })?;
            let limits = named
                .get(c)
                .ok_or_else(|| el.err(format!("no batching config named `{c}`")))?;
            Ok(("per_topic", Some((c, *limits))))
        }
        "combinedTopics" => match config {
            Some(c) => Err(el.err(format!(
                "action \"combinedTopics\" takes the <combinedTopics> config; remove \
                 config=\"{c}\""
            ))),
            None => Ok(("combined_topics", None)),
        },
        "disable" => Ok(("disable", None)),
        other => Err(el.err(format!(
            "action `{other}`: expected \"perTopic\", \"combinedTopics\" or \"disable\""
        ))),
    }
}

fn batching(cx: &mut Cx, t: &mut Table, el: &El) -> Result<(), ConvertError> {
    let kids = cx.open(
        el,
        &[],
        &[
            ("namedConfigs", One),
            ("produceRequestDataLimit", One),
            ("messageMaxBytes", One),
            ("combinedTopics", One),
            ("defaultTopic", One),
            ("topicConfigs", One),
        ],
    )?;
    let mut named: BTreeMap<String, Limits> = BTreeMap::new();
    if let Some(n) = kids.get("namedConfigs") {
        for c in cx.open(n, &[], &[("config", Many)])?.many {
            let k = cx.open(
                &c,
                &["name"],
                &[("time", One), ("messages", One), ("bytes", One)],
            )?;
            let name = c.parsed("name", non_empty)?;
            let limits = Limits {
                time: cx.value(&k, "time", or_disable(Suffix::None))?.flatten(),
                messages: cx.value(&k, "messages", or_disable(Suffix::K))?.flatten(),
                bytes: cx.value(&k, "bytes", or_disable(Suffix::K))?.flatten(),
            };
            let on = |v: Option<u64>| v.is_some_and(|n| n > 0);
            if !on(limits.time) && !on(limits.messages) && !on(limits.bytes) {
                return Err(c.err(format!(
                    "config `{name}` enables none of <time>, <messages>, <bytes>"
                )));
            }
            if named.insert(name.to_string(), limits).is_some() {
                return Err(c.err(format!("a second batching config named `{name}`")));
            }
        }
    }
    let default = kids.required(el, "defaultTopic")?;
    cx.open(default, &["action", "config"], &[])?;
    let (action, config) = batch_action(default, &named)?;
    t.kv("default_action", string(action));
    if let Some((c, l)) = config {
        // The TOML's default limits are unnamed: those of the named config, written out.
        t.comment(&format!("The limits of config `{c}`; 0 = off."));
        t.kv("time_ms", l.time.unwrap_or(0).to_string());
        t.kv("messages", l.messages.unwrap_or(0).to_string());
        t.kv("bytes", size(l.bytes.unwrap_or(0)));
    }
    let prdl = cx.leaf(
        kids.required(el, "produceRequestDataLimit")?,
        "value",
        with_k,
    )?;
    t.kv("produce_request_data_limit", size(prdl));
    let mmb_el = kids.required(el, "messageMaxBytes")?;
    let mmb = cx.leaf(mmb_el, "value", with_k)?;
    if mmb == 0 {
        return Err(mmb_el.err(
            "0 discards every message as too long; set it to the brokers' message.max.bytes",
        ));
    }
    t.kv("message_max_bytes", size(mmb));

    let combined = kids.required(el, "combinedTopics")?;
    cx.open(combined, &["enable", "config"], &[])?;
    let sub = t.sub("batching.combined_topics");
    if combined.parsed("enable", boolean)? {
        let c = combined
            .attr("config")
            .filter(|c| !c.is_empty())
            .ok_or_else(|| combined.err("enable=\"true\" needs `config`"))?;
        if !named.contains_key(c) {
            return Err(combined.err(format!("no batching config named `{c}`")));
        }
        sub.kv("enable", "true".into());
        sub.kv("config", string(c));
    } else {
        sub.kv("enable", "false".into());
    }

    for (name, l) in &named {
        let sub = t.sub(&format!("batching.configs.{}", key(name)));
        if let Some(v) = l.time {
            sub.kv("time_ms", v.to_string());
        }
        if let Some(v) = l.messages {
            sub.kv("messages", v.to_string());
        }
        if let Some(v) = l.bytes {
            sub.kv("bytes", size(v));
        }
    }

    let mut topics: BTreeMap<&str, TopicAction> = BTreeMap::new();
    if let Some(tc) = kids.get("topicConfigs") {
        for topic in cx.open(tc, &[], &[("topic", Many)])?.many {
            cx.open(&topic, &["name", "action", "config"], &[])?;
            let name = topic.parsed("name", non_empty)?;
            let a = batch_action(&topic, &named)?;
            if topics.insert(name, a).is_some() {
                return Err(topic.err(format!("topic `{name}` is listed twice")));
            }
        }
    }
    for (name, (action, config)) in topics {
        let sub = t.sub(&format!("batching.topics.{}", key(name)));
        sub.kv("action", string(action));
        if let Some((c, _)) = config {
            sub.kv("config", string(c));
        }
    }

    let times = named.values().any(|l| l.time.is_some_and(|n| n > 0));
    if times {
        cx.note(
            el,
            "batch time limits now count from a message's arrival at dory, not from its \
             client timestamp (a quirk in Dory: a message with an old timestamp completed \
             its batch at once)",
        );
    }
    Ok(())
}

fn compression(cx: &mut Cx, t: &mut Table, el: &El) -> Result<(), ConvertError> {
    let kids = cx.open(
        el,
        &[],
        &[
            ("namedConfigs", One),
            ("sizeThresholdPercent", One),
            ("defaultTopic", One),
            ("topicConfigs", One),
        ],
    )?;
    let named_el = kids.required(el, "namedConfigs")?;
    let mut named: BTreeMap<&str, (&str, Option<u64>, Option<i32>)> = BTreeMap::new();
    for c in cx.open(named_el, &[], &[("config", Many)])?.many {
        cx.open(&c, &["name", "type", "minSize", "level"], &[])?;
        let name = c.parsed("name", non_empty)?;
        let codec = c.parsed("type", |s| match s.trim().to_ascii_lowercase().as_str() {
            "none" => Ok("none"),
            "gzip" => Ok("gzip"),
            "snappy" => Ok("snappy"),
            "lz4" => Ok("lz4"),
            _ => Err(format!("`{s}` is not one of none, gzip, snappy")),
        })?;
        if codec == "lz4" {
            cx.note(
                &c,
                "lz4: Dory refused it in production builds; dory sends it (frame format)",
            );
        }
        let min_size = match codec {
            "none" => None,
            _ => Some(c.parsed("minSize", with_k)?),
        };
        let level = c.parsed_opt("level", |s| {
            s.trim()
                .parse::<i32>()
                .map_err(|_| format!("`{s}` is not an integer"))
        })?;
        let level = match (codec, level) {
            (_, None) => None,
            ("gzip", Some(l)) if (-1..=9).contains(&l) => Some(l),
            ("lz4", Some(l)) if (0..=12).contains(&l) => Some(l),
            (_, Some(l)) => {
                cx.note(
                    &c,
                    format!(
                        "level {l} is not used for {codec} (Dory ignored it with a warning); \
                         dropped"
                    ),
                );
                None
            }
        };
        if named.insert(name, (codec, min_size, level)).is_some() {
            return Err(c.err(format!("a second compression config named `{name}`")));
        }
    }
    if named.is_empty() {
        return Err(named_el.err("define at least one <config>"));
    }
    let lookup = |el: &El<'_, '_>| -> Result<String, ConvertError> {
        let c = el.req_attr("config")?;
        if named.contains_key(c) {
            Ok(string(c))
        } else {
            Err(el.err(format!("no compression config named `{c}`")))
        }
    };
    let threshold = cx.value(&kids, "sizeThresholdPercent", |s| {
        let n = plain(s)?;
        if n > 100 {
            return Err(format!("`{s}` is above 100"));
        }
        Ok(n)
    })?;
    t.kv_or_default(
        "size_threshold_percent",
        threshold.map(|n| n.to_string()),
        "100".into(),
    );
    for (name, (codec, min_size, level)) in &named {
        let sub = t.sub(&format!("compression.configs.{}", key(name)));
        sub.kv("codec", string(codec));
        if let Some(m) = min_size {
            sub.kv("min_size", size(*m));
        }
        if let Some(l) = level {
            sub.kv("level", l.to_string());
        }
    }
    default_and_topics(cx, t, el, &kids, "compression.topics", lookup)
}

/// `<defaultTopic config/>` and `<topicConfigs><topic name config/>...` of compression and
/// rate limits: `default = "config"` and a sorted `"topic" = "config"` table.
fn default_and_topics(
    cx: &mut Cx,
    t: &mut Table,
    el: &El,
    kids: &Kids,
    header: &str,
    lookup: impl Fn(&El<'_, '_>) -> Result<String, ConvertError>,
) -> Result<(), ConvertError> {
    let default = kids.required(el, "defaultTopic")?;
    cx.open(default, &["config"], &[])?;
    t.kv("default", lookup(default)?);
    let Some(tc) = kids.get("topicConfigs") else {
        return Ok(());
    };
    let mut topics: BTreeMap<&str, String> = BTreeMap::new();
    for topic in cx.open(tc, &[], &[("topic", Many)])?.many {
        cx.open(&topic, &["name", "config"], &[])?;
        let name = topic.parsed("name", non_empty)?;
        if topics.insert(name, lookup(&topic)?).is_some() {
            return Err(topic.err(format!("topic `{name}` is listed twice")));
        }
    }
    if !topics.is_empty() {
        let sub = t.sub(header);
        for (name, config) in topics {
            sub.kv(&key(name), config);
        }
    }
    Ok(())
}

fn rate_limiting(cx: &mut Cx, t: &mut Table, el: &El) -> Result<(), ConvertError> {
    let kids = cx.open(
        el,
        &[],
        &[
            ("namedConfigs", One),
            ("defaultTopic", One),
            ("topicConfigs", One),
        ],
    )?;
    let named_el = kids.required(el, "namedConfigs")?;
    // Dory's name -> (the name in the TOML, interval and max count or None = unlimited).
    type Limit = Option<(u64, u64)>;
    let mut named: BTreeMap<&str, (String, Limit)> = BTreeMap::new();
    let mut renamed = Vec::new();
    for c in cx.open(named_el, &[], &[("config", Many)])?.many {
        cx.open(&c, &["name", "interval", "maxCount"], &[])?;
        let name = c.parsed("name", non_empty)?;
        let limit = match c.parsed("maxCount", |s| non_empty(s).and_then(or_unlimited))? {
            None => None,
            Some(n) => Some((c.parsed("interval", positive)?, n)),
        };
        if limit.is_some() && name == "unlimited" {
            renamed.push(c.clone());
        }
        if named.insert(name, (name.to_string(), limit)).is_some() {
            return Err(c.err(format!("a second rate limit config named `{name}`")));
        }
    }
    // In the TOML "unlimited" means no limit, so a limiting config of that name is renamed.
    for c in renamed {
        let mut new = "unlimited_config".to_string();
        while named.contains_key(new.as_str()) {
            new.push('_');
        }
        cx.note(
            &c,
            format!("config `unlimited` is renamed `{new}`: in dory \"unlimited\" means no limit"),
        );
        if let Some(entry) = named.get_mut("unlimited") {
            entry.0 = new;
        }
    }
    let lookup = |el: &El<'_, '_>| -> Result<String, ConvertError> {
        let c = el.req_attr("config")?;
        match named.get(c) {
            Some((toml_name, _)) => Ok(string(toml_name)),
            None => Err(el.err(format!("no rate limit config named `{c}`"))),
        }
    };
    let mut subs: Vec<_> = named.values().collect();
    subs.sort_by(|a, b| a.0.cmp(&b.0));
    for (toml_name, limit) in subs {
        let sub = t.sub(&format!("rate_limit.configs.{}", key(toml_name)));
        match limit {
            None => sub.kv("max_count", string("unlimited")),
            Some((interval, count)) => {
                sub.kv("interval_ms", interval.to_string());
                sub.kv("max_count", count.to_string());
            }
        }
    }
    default_and_topics(cx, t, el, &kids, "rate_limit.topics", lookup)
}

fn msg_delivery(cx: &mut Cx, out: &mut Toml, el: Option<&El>) -> Result<(), ConvertError> {
    let mut autocreate = None;
    let mut attempts = None;
    let mut shutdown = None;
    let mut refresh_s = None;
    let mut socket_timeout_ms = None;
    if let Some(el) = el {
        let kids = cx.open(
            el,
            &[],
            &[
                ("topicAutocreate", One),
                ("maxFailedDeliveryAttempts", One),
                ("shutdownMaxDelay", One),
                ("dispatcherRestartMaxDelay", One),
                ("metadataRefreshInterval", One),
                ("compareMetadataOnRefresh", One),
                ("kafkaSocketTimeout", One),
                ("pauseRateLimitInitial", One),
                ("pauseRateLimitMaxDouble", One),
                ("minPauseDelay", One),
            ],
        )?;
        if let Some(a) = kids.get("topicAutocreate") {
            autocreate = Some(cx.leaf(a, "enable", boolean)?);
        }
        attempts = cx.value(&kids, "maxFailedDeliveryAttempts", |s| {
            fits::<u32>(plain(s)?, "an attempt count")
        })?;
        shutdown = cx.value(&kids, "shutdownMaxDelay", plain)?;
        refresh_s = cx.value(&kids, "metadataRefreshInterval", |s| {
            positive(s)?
                .checked_mul(60)
                .ok_or_else(|| format!("`{s}` is too large"))
        })?;
        socket_timeout_ms = cx.value(&kids, "kafkaSocketTimeout", |s| {
            positive(s)?
                .checked_mul(1000)
                .ok_or_else(|| format!("`{s}` is too large"))
        })?;
        if let Some(c) = kids.get("compareMetadataOnRefresh") {
            let why = if cx.leaf(c, "value", boolean)? {
                "no equivalent: refreshed metadata is always compared, and an unchanged view \
                 changes nothing"
            } else {
                "false has no equivalent: dory always compares refreshed metadata (an \
                 unchanged view changes nothing)"
            };
            cx.note(c, why);
        }
        let unused = [
            (
                "dispatcherRestartMaxDelay",
                "no equivalent: dory never restarts its dispatchers as a whole; each broker \
                 connection recovers on its own",
            ),
            (
                "pauseRateLimitInitial",
                "no equivalent: dory does not pause all delivery after an error; resends, \
                 reconnects and metadata retries back off on their own \
                 (delivery.retry_backoff_ms, retry_backoff_max_ms; defaults kept)",
            ),
            (
                "pauseRateLimitMaxDouble",
                "no equivalent: see <pauseRateLimitInitial>",
            ),
            (
                "minPauseDelay",
                "no equivalent: see <pauseRateLimitInitial>",
            ),
        ];
        for (name, why) in unused {
            if let Some(u) = kids.get(name) {
                cx.leaf(u, "value", plain)?;
                cx.note(u, why);
            }
        }
    }
    out.table("kafka").kv_or_default(
        "socket_timeout_ms",
        socket_timeout_ms.map(|n| n.to_string()),
        "60000".into(),
    );
    let t = out.table("delivery");
    t.kv_or_default(
        "topic_autocreate",
        autocreate.map(|b| b.to_string()),
        "false".into(),
    );
    t.kv_or_default(
        "max_failed_delivery_attempts",
        attempts.map(|n| n.to_string()),
        "5".into(),
    );
    t.kv_or_default(
        "shutdown_max_delay_ms",
        shutdown.map(|n| n.to_string()),
        "30000".into(),
    );
    t.kv_or_default(
        "metadata_refresh_interval_s",
        refresh_s.map(|n| n.to_string()),
        "900".into(),
    );
    Ok(())
}

fn http_interface(
    cx: &mut Cx,
    root: &El,
    t: &mut Table,
    el: Option<&El>,
) -> Result<(), ConvertError> {
    let (mut port, mut loopback, mut interval, mut prefix) = (None, None, None, None);
    // Where the note about the bind address points.
    let mut at = root.clone();
    if let Some(el) = el {
        let kids = cx.open(
            el,
            &[],
            &[
                ("port", One),
                ("loopbackOnly", One),
                ("discardReportInterval", One),
                ("badMsgPrefixSize", One),
            ],
        )?;
        port = cx.value(&kids, "port", |s| fits::<u16>(positive(s)?, "a port"))?;
        loopback = cx.value(&kids, "loopbackOnly", boolean)?;
        interval = cx.value(&kids, "discardReportInterval", positive)?;
        prefix = cx.value(&kids, "badMsgPrefixSize", plain)?;
        at = kids.get("loopbackOnly").unwrap_or(el).clone();
    }
    let port = port.unwrap_or(9090);
    if loopback.unwrap_or(false) {
        t.kv("addr", string(&format!("127.0.0.1:{port}")));
    } else {
        // Dory served all IPv4 interfaces; so does the converted file, said out loud.
        t.comment("Dory served its status pages on all interfaces; kept. dory's default is");
        t.comment("127.0.0.1: use it if nothing scrapes this host from elsewhere.");
        t.kv("addr", string(&format!("0.0.0.0:{port}")));
        let message = format!(
            "Dory served HTTP on all interfaces (loopbackOnly false); kept as status.addr = \
             \"0.0.0.0:{port}\". dory's default is loopback: set \"127.0.0.1:{port}\" unless \
             other hosts read /metrics or the status pages"
        );
        cx.note(&at, message);
    }
    t.kv_or_default(
        "discard_report_interval_s",
        interval.map(|n| n.to_string()),
        "600".into(),
    );
    t.kv_or_default(
        "bad_msg_prefix_size",
        prefix.map(|n| n.to_string()),
        "256".into(),
    );
    Ok(())
}

/// `enable` and the required `<path>` of `<discardLogging>` and `<msgDebug>`.
fn enable_and_path(el: &El, kids: &Kids, cx: &mut Cx) -> Result<(bool, String), ConvertError> {
    let enable = el.parsed("enable", boolean)?;
    let path_el = kids.required(el, "path")?;
    let path = cx.leaf(path_el, "value", |s| Ok(s.to_string()))?;
    if enable && !path.starts_with('/') {
        return Err(path_el.err(format!("`{path}` must be an absolute path")));
    }
    Ok((enable, path))
}

fn discard_logging(cx: &mut Cx, t: &mut Table, el: &El) -> Result<(), ConvertError> {
    let kids = cx.open(
        el,
        &["enable"],
        &[
            ("path", One),
            ("maxFileSize", One),
            ("maxArchiveSize", One),
            ("maxMsgPrefixSize", One),
        ],
    )?;
    let (enable, path) = enable_and_path(el, &kids, cx)?;
    let file = cx.value(&kids, "maxFileSize", with_km)?;
    let archive = cx.value(&kids, "maxArchiveSize", with_km)?;
    let prefix = cx.value(&kids, "maxMsgPrefixSize", or_unlimited)?;
    t.kv("enable", enable.to_string());
    t.kv("path", string(&path));
    t.kv_or_default("max_file_size", file.map(size), size(1 << 20));
    t.kv_or_default("max_archive_size", archive.map(size), size(32 << 20));
    t.kv_or_default(
        "max_msg_prefix_size",
        prefix.map(|p| p.map_or_else(|| string("unlimited"), |n| n.to_string())),
        string("unlimited"),
    );
    Ok(())
}

fn msg_debug(cx: &mut Cx, t: &mut Table, el: &El) -> Result<(), ConvertError> {
    let kids = cx.open(
        el,
        &["enable"],
        &[("path", One), ("timeLimit", One), ("byteLimit", One)],
    )?;
    let (enable, path) = enable_and_path(el, &kids, cx)?;
    let time = cx.value(&kids, "timeLimit", positive)?;
    let bytes = cx.value(&kids, "byteLimit", |s| match with_km(s)? {
        0 => Err(format!("`{s}`: must be greater than 0")),
        n => Ok(n),
    })?;
    t.kv("enable", enable.to_string());
    t.kv("path", string(&path));
    t.kv_or_default("time_limit_s", time.map(|n| n.to_string()), "3600".into());
    t.kv_or_default("byte_limit", bytes.map(size), size(2 << 20));
    if enable {
        cx.note(
            el,
            "only the topics selected over HTTP (/msg_debug/add_topic/T) are logged now; Dory \
             logged every topic once any was selected (a quirk)",
        );
    }
    Ok(())
}

fn logging(cx: &mut Cx, el: &El) -> Result<(), ConvertError> {
    let kids = cx.open(
        el,
        &[],
        &[
            ("level", One),
            ("stdoutStderr", One),
            ("syslog", One),
            ("file", One),
            ("logDiscards", One),
        ],
    )?;
    if let Some(l) = kids.get("level") {
        let rust_log = cx.leaf(l, "value", |s| match s {
            "EMERG" | "ALERT" | "CRIT" | "ERR" => Ok("error"),
            "WARNING" => Ok("warn"),
            "NOTICE" | "INFO" => Ok("info"),
            "DEBUG" => Ok("debug"),
            _ => Err(format!(
                "`{s}` is not one of EMERG ALERT CRIT ERR WARNING NOTICE INFO DEBUG"
            )),
        })?;
        cx.note(
            l,
            format!(
                "no equivalent in the file: the log level is the RUST_LOG environment \
                 variable; the nearest is RUST_LOG={rust_log} (dory's default is info)"
            ),
        );
    }
    for name in ["stdoutStderr", "syslog"] {
        if let Some(d) = kids.get(name) {
            cx.leaf(d, "enable", boolean)?;
            cx.note(
                d,
                "no equivalent: dory logs to stderr, which systemd puts in the journal",
            );
        }
    }
    if let Some(f) = kids.get("file") {
        let k = cx.open(f, &["enable"], &[("path", One), ("mode", One)])?;
        f.parsed("enable", boolean)?;
        if let Some(p) = k.get("path") {
            cx.leaf(p, "value", absolute_or_empty)?;
        }
        cx.value(&k, "mode", file_mode)?;
        cx.note(
            f,
            "no equivalent: dory logs to stderr only; redirect it (or read the journal) for a \
             log file",
        );
    }
    if let Some(d) = kids.get("logDiscards") {
        cx.leaf(d, "enable", boolean)?;
        cx.note(
            d,
            "no equivalent: every discard is counted by topic and reason (/discards, \
             /metrics) and, with [discard_log], written to the discard log; other logging \
             follows RUST_LOG",
        );
    }
    Ok(())
}

// ----- writing TOML -----

/// A table and the subtables written right after it.
#[derive(Default)]
struct Table {
    header: String,
    lines: Vec<String>,
    subs: Vec<Table>,
}

impl Table {
    fn kv(&mut self, k: &str, value: String) {
        self.lines.push(format!("{k} = {value}"));
    }

    /// `k = value`, or Dory's default marked as such when the file had no value.
    fn kv_or_default(&mut self, k: &str, value: Option<String>, dory_default: String) {
        match value {
            Some(v) => self.kv(k, v),
            None => self
                .lines
                .push(format!("{k} = {dory_default}  # Dory's default")),
        }
    }

    fn comment(&mut self, text: &str) {
        self.lines.push(format!("# {}", one_line(text)));
    }

    fn sub(&mut self, header: &str) -> &mut Table {
        self.subs.push(Table {
            header: header.to_string(),
            ..Table::default()
        });
        let last = self.subs.len() - 1;
        &mut self.subs[last]
    }

    fn render(&self, out: &mut String) {
        if self.lines.is_empty() && self.subs.is_empty() {
            return;
        }
        out.push_str(&format!("\n[{}]\n", self.header));
        for l in &self.lines {
            out.push_str(l);
            out.push('\n');
        }
        for s in &self.subs {
            s.render(out);
        }
    }
}

/// The top-level tables, in the order of config/dory.toml.
struct Toml {
    tables: Vec<Table>,
}

impl Default for Toml {
    fn default() -> Toml {
        let names = [
            "input",
            "kafka",
            "batching",
            "compression",
            "rate_limit",
            "delivery",
            "status",
            "discard_log",
            "msg_debug",
        ];
        Toml {
            tables: names
                .iter()
                .map(|n| Table {
                    header: (*n).to_string(),
                    ..Table::default()
                })
                .collect(),
        }
    }
}

impl Toml {
    fn table(&mut self, name: &str) -> &mut Table {
        let i = self
            .tables
            .iter()
            .position(|t| t.header == name)
            .expect("the top-level tables are the fixed list of Toml::default");
        &mut self.tables[i]
    }

    fn render(&self, source: &str, notes: &[Note]) -> String {
        let mut out = format!(
            "# dory configuration converted by `dory convert-config` from {}.\n\
             # Every setting of Dory's file that has an equivalent is here, with Dory's default\n\
             # (marked) where the file had none, so it behaves as the XML did. Settings new in\n\
             # dory (kafka.acks, kafka.idempotence, partitioning, commit_points, ...) keep their\n\
             # defaults: see config/dory.toml and doc/config.md.\n",
            one_line(source)
        );
        for t in &self.tables {
            t.render(&mut out);
        }
        if !notes.is_empty() {
            out.push_str(
                "\n# Not carried over, or behaving differently (also printed on stderr):\n",
            );
            for n in notes {
                out.push_str(&format!("# {}\n", one_line(&n.to_string())));
            }
        }
        out
    }
}

/// Control characters (a newline from `&#10;`, say) would end a comment early.
fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// A TOML basic string.
fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A TOML key: bare where it may be, quoted otherwise.
fn key(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        s.to_string()
    } else {
        string(s)
    }
}

/// A byte count as Dory would write it: "64k", "16m", or plain bytes.
fn size(n: u64) -> String {
    if n == 0 {
        "0".into()
    } else if n % (1 << 30) == 0 {
        string(&format!("{}g", n >> 30))
    } else if n % (1 << 20) == 0 {
        string(&format!("{}m", n >> 20))
    } else if n % (1 << 10) == 0 {
        string(&format!("{}k", n >> 10))
    } else {
        n.to_string()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::policy::{BatchAction, CodecName, RateLimit};
    use crate::config::BatchLimits;

    const EXAMPLE: &str = include_str!("../../tests/data/dory-example.xml");

    /// A file with `body` besides a datagram input and one broker.
    fn xml(body: &str) -> String {
        format!(
            "<?xml version=\"1.0\" encoding=\"US-ASCII\"?>\n<doryConfig>\n{body}\n\
             <inputSources><unixDatagram enable=\"true\"><path value=\"/run/d.sock\"/>\
             </unixDatagram></inputSources>\n\
             <initialBrokers><broker host=\"k\" port=\"9092\"/></initialBrokers>\n</doryConfig>\n"
        )
    }

    /// Converts and loads the result as the daemon would.
    fn load(xml: &str) -> (Config, Vec<Note>) {
        let c = convert(xml, "t.xml").unwrap_or_else(|e| panic!("{e}\n{xml}"));
        let raw = parse_toml(Path::new("t.toml"), &c.toml).expect("parses");
        let cfg = Config::from_parts(raw, true, &Overrides::default()).expect("loads");
        (cfg, c.notes)
    }

    fn error(xml: &str) -> String {
        match convert(xml, "t.xml") {
            Ok(c) => panic!("converted:\n{}", c.toml),
            Err(e) => e.to_string(),
        }
    }

    fn has_note(notes: &[Note], element: &str, text: &str) -> bool {
        notes
            .iter()
            .any(|n| n.element == element && n.message.contains(text))
    }

    #[test]
    fn dory_values() {
        assert_eq!(uint("64k", Suffix::K), Ok(65536));
        assert_eq!(uint(" 16M ", Suffix::KM), Ok(16 << 20));
        assert_eq!(uint("0", Suffix::None), Ok(0));
        assert!(uint("16m", Suffix::K).is_err(), "m only where Dory took it");
        assert!(uint("1k", Suffix::None).is_err());
        assert!(uint("0100", Suffix::None).unwrap_err().contains("octal"));
        assert!(uint("+5", Suffix::None).is_err());
        assert!(uint("", Suffix::None).is_err());
        assert!(uint("18446744073709551615k", Suffix::K)
            .unwrap_err()
            .contains("too large"));
        assert_eq!(file_mode("0644"), Ok(Some(0o644)));
        assert_eq!(file_mode("0b110100100"), Ok(Some(0o644)));
        assert_eq!(file_mode("unspecified"), Ok(None));
        assert_eq!(file_mode("0"), Ok(Some(0)));
        for bad in ["644", "0999", "01777", "0b", "0b2", "0+7", "0x1ff"] {
            assert!(file_mode(bad).is_err(), "{bad}");
        }
        assert_eq!(boolean(" TRUE "), Ok(true));
        assert!(boolean("yes").is_err());
        assert_eq!(size(64 << 10), "\"64k\"");
        assert_eq!(size(1_000_000), "1000000");
        assert_eq!(key("a.b"), "\"a.b\"");
        assert_eq!(string("a\"\\\n"), "\"a\\\"\\\\\\u000A\"");
    }

    #[test]
    fn example_config_keeps_its_behaviour() {
        let (c, notes) = load(EXAMPLE);
        assert_eq!(
            c.msg_buffer_max,
            128 << 20,
            "Dory's pool size, not dory's 64m"
        );
        assert_eq!(c.input.dgram.as_ref().and_then(|d| d.mode), Some(0o222));
        assert!(c.input.stream.is_none() && c.input.tcp_port.is_none());
        assert_eq!(c.input.max_stream_msg_size, 16 << 20);
        assert_eq!(c.status.addr.to_string(), "0.0.0.0:9090");
        assert!(!c.delivery.topic_autocreate);
        assert_eq!(
            c.delivery.metadata_refresh_interval,
            Duration::from_secs(900)
        );
        let p = &c.policies;
        assert_eq!(p.default.batching.action, BatchAction::CombinedTopics);
        assert_eq!(
            p.combined,
            Some(BatchLimits {
                time: Some(Duration::from_secs(10)),
                messages: None,
                bytes: Some(256 << 10),
            })
        );
        assert_eq!(p.default.compression.codec, CodecName::Snappy);
        assert_eq!(p.default.compression.min_size, 128);
        assert_eq!(p.size_threshold_percent, 75);
        assert_eq!(p.default.rate_limit, None);
        assert!(p.overrides.is_empty());
        assert!(c.discard_log.is_none() && c.msg_debug.is_none());
        assert!(has_note(
            &notes,
            "<httpInterface><loopbackOnly>",
            "0.0.0.0:9090"
        ));
        assert!(has_note(&notes, "<logging><level>", "RUST_LOG=info"));
        let compare_line = EXAMPLE
            .lines()
            .position(|l| l.contains("<compareMetadataOnRefresh"))
            .map(|i| i as u32 + 1);
        let compare = notes
            .iter()
            .find(|n| n.element == "<msgDelivery><compareMetadataOnRefresh>");
        assert_eq!(compare.map(|n| n.line), compare_line);
        let lines: Vec<u32> = notes.iter().map(|n| n.line).collect();
        assert!(lines.windows(2).all(|w| w[0] <= w[1]), "document order");
    }

    #[test]
    fn the_toml_names_its_source_and_repeats_the_notes() {
        let c = convert(EXAMPLE, "/etc/dory/dory_conf.xml").expect("converts");
        assert!(c.toml.starts_with(
            "# dory configuration converted by `dory convert-config` from /etc/dory/dory_conf.xml."
        ));
        for n in &c.notes {
            assert!(c.toml.contains(&format!("# {n}\n")), "{n}");
        }
    }

    #[test]
    fn topics_are_sorted_and_any_name_survives() {
        let body = r#"<compression><namedConfigs><config name="g z" type="gzip" minSize="0"/>
            </namedConfigs><defaultTopic config="g z"/><topicConfigs>
            <topic name="zeta" config="g z"/><topic name='q"uo\te&#10;x' config="g z"/>
            <topic name="alpha" config="g z"/></topicConfigs></compression>"#;
        let c = convert(&xml(body), "t.xml").expect("converts");
        let alpha = c.toml.find("alpha =").expect("alpha");
        let zeta = c.toml.find("zeta =").expect("zeta");
        assert!(alpha < zeta, "{}", c.toml);
        let (cfg, _) = load(&xml(body));
        let odd = cfg.policies.for_topic(b"q\"uo\\te\nx");
        assert_eq!(odd.compression.codec, CodecName::Gzip);
        assert_eq!(cfg.policies.overrides.len(), 3);
    }

    #[test]
    fn rate_limits_and_a_limiting_config_named_unlimited() {
        let body = r#"<topicRateLimiting><namedConfigs>
            <config name="unlimited" interval="1000" maxCount="5"/>
            <config name="free" maxCount="unlimited"/></namedConfigs>
            <defaultTopic config="unlimited"/>
            <topicConfigs><topic name="t" config="free"/></topicConfigs></topicRateLimiting>"#;
        let (c, notes) = load(&xml(body));
        assert_eq!(
            c.policies.default.rate_limit,
            Some(RateLimit {
                interval: Duration::from_secs(1),
                max_count: 5
            })
        );
        assert_eq!(c.policies.for_topic(b"t").rate_limit, None);
        assert!(has_note(
            &notes,
            "<topicRateLimiting><namedConfigs><config>",
            "renamed `unlimited_config`"
        ));
    }

    #[test]
    fn quirks_and_ignored_values_are_noted() {
        let (c, notes) = load(&xml(r#"<compression><namedConfigs>
            <config name="s" type="snappy" minSize="1" level="5"/>
            <config name="g" type="gzip" minSize="1" level="12"/>
            <config name="l" type="lz4" minSize="1"/></namedConfigs>
            <defaultTopic config="g"/></compression>
            <httpInterface><port value="8080" /></httpInterface>
            <kafkaConfig extra="1"/>"#));
        assert_eq!(c.batching.message_max_bytes, 1_000_000);
        assert_eq!(
            c.policies.default.compression.level, None,
            "Dory's default level"
        );
        let el = "<compression><namedConfigs><config>";
        assert!(has_note(&notes, el, "level 5 is not used for snappy"));
        assert!(has_note(&notes, el, "level 12 is not used for gzip"));
        assert!(has_note(&notes, el, "lz4: Dory refused it"));
        assert!(has_note(&notes, "<doryConfig>", "no <batching>"));
        assert!(has_note(&notes, "<httpInterface>", "0.0.0.0:8080"));
        assert!(has_note(&notes, "<kafkaConfig>", "attribute `extra`"));
    }

    #[test]
    fn bad_files_name_element_and_line() {
        for (body, expected) in [
            ("<batching>\n<bogus/></batching>", "line 4: <batching><bogus>: unknown element"),
            (
                "<kafkaConfig><clientId value=\"a\"/><clientId value=\"b\"/></kafkaConfig>",
                "<kafkaConfig><clientId>: element repeated",
            ),
            ("<kafkaConfig>words</kafkaConfig>", "<kafkaConfig>: text is not allowed"),
            (
                "<kafkaConfig><clientId value=\"a\"><x/></clientId></kafkaConfig>",
                "<kafkaConfig><clientId><x>: unknown element: <kafkaConfig><clientId> takes no",
            ),
            (
                "<msgDelivery><maxFailedDeliveryAttempts value=\"5x\"/></msgDelivery>",
                "<msgDelivery><maxFailedDeliveryAttempts>: attribute `value`: `5x` is not a decimal number",
            ),
            (
                "<msgDebug><path value=\"/x\"/></msgDebug>",
                "<msgDebug>: attribute `enable` is required",
            ),
            (
                "<discardLogging enable=\"true\"><path value=\"rel.log\"/></discardLogging>",
                "<discardLogging><path>: `rel.log` must be an absolute path",
            ),
            (
                "<logging><level value=\"notice\"/></logging>",
                "`notice` is not one of EMERG",
            ),
            (
                "<topicRateLimiting><namedConfigs><config name=\"r\" maxCount=\"5\"/>\
                 </namedConfigs><defaultTopic config=\"r\"/></topicRateLimiting>",
                "attribute `interval` is required",
            ),
            (
                "<compression><namedConfigs><config name=\"c\" type=\"brotli\"/></namedConfigs>\
                 <defaultTopic config=\"c\"/></compression>",
                "`brotli` is not one of none, gzip, snappy",
            ),
            (
                "<compression><namedConfigs><config name=\"c\" type=\"none\"/></namedConfigs>\
                 <defaultTopic config=\"d\"/></compression>",
                "<compression><defaultTopic>: no compression config named `d`",
            ),
        ] {
            let e = error(&xml(body));
            assert!(e.contains(expected), "{body}\nwanted {expected}\ngot {e}");
        }
        assert!(error("<dory/>").contains("expected <doryConfig>"));
        assert!(error("<doryConfig>").starts_with("not well-formed XML"));
        assert!(error("").starts_with("not well-formed XML"));
    }

    const BATCHING_HEAD: &str = r#"<batching><namedConfigs><config name="a"><time value="5"/></config>
        </namedConfigs><produceRequestDataLimit value="0"/><messageMaxBytes value="1k"/>"#;

    #[test]
    fn batching_rules_of_dory() {
        let ok = format!(
            "{BATCHING_HEAD}<combinedTopics enable=\"false\"/><defaultTopic action=\"disable\" \
             config=\"ignored\"/></batching>"
        );
        let (c, _) = load(&xml(&ok));
        assert_eq!(c.policies.default.batching.action, BatchAction::Disable);
        assert_eq!(c.policies.combined, None);
        assert_eq!(c.batching.produce_request_data_limit, 0);
        assert_eq!(c.batching.message_max_bytes, 1024);
        for (tail, expected) in [
            (
                "<combinedTopics enable=\"true\"/><defaultTopic action=\"disable\"/>",
                "<batching><combinedTopics>: enable=\"true\" needs `config`",
            ),
            (
                "<combinedTopics enable=\"false\"/><defaultTopic action=\"perTopic\"/>",
                "<batching><defaultTopic>: action \"perTopic\" needs `config`",
            ),
            (
                "<combinedTopics enable=\"false\"/><defaultTopic action=\"combinedTopics\" config=\"a\"/>",
                "remove config=\"a\"",
            ),
            (
                "<combinedTopics enable=\"false\"/><defaultTopic action=\"pertopic\"/>",
                "action `pertopic`",
            ),
            (
                "<combinedTopics enable=\"false\"/><defaultTopic action=\"disable\"/>\
                 <topicConfigs><topic name=\"t\" action=\"disable\"/>\
                 <topic name=\"t\" action=\"disable\"/></topicConfigs>",
                "topic `t` is listed twice",
            ),
            (
                "<combinedTopics enable=\"false\"/><defaultTopic action=\"disable\"/>\
                 <topicConfigs><topic name=\"t\" action=\"perTopic\" config=\"b\"/></topicConfigs>",
                "no batching config named `b`",
            ),
            ("<defaultTopic action=\"disable\"/>", "element <combinedTopics> is required"),
        ] {
            let e = error(&xml(&format!("{BATCHING_HEAD}{tail}</batching>")));
            assert!(e.contains(expected), "{tail}\nwanted {expected}\ngot {e}");
        }
        let e = error(&xml(
            "<batching><namedConfigs><config name=\"n\"><time value=\"disable\"/></config>\
             </namedConfigs></batching>",
        ));
        assert!(e.contains("config `n` enables none"), "{e}");
        let e = error(&xml(&ok.replace("value=\"1k\"", "value=\"0\"")));
        assert!(
            e.contains("<batching><messageMaxBytes>: 0 discards every message"),
            "{e}"
        );
    }
}

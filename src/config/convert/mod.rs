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
//!
//! The parts: `xml.rs` reads Dory's XML (elements, notes, Dory's value syntax);
//! `sections.rs` maps the daemon-wide sections and `policies.rs` the per-topic ones
//! (batching, compression, rate limiting); `toml_out.rs` writes the TOML. Each part's
//! tests sit beside it; the whole-file tests (Dory's example config) are here.

use std::path::Path;

use roxmltree::Document;

use super::{parse_toml, Config, ConfigError, Overrides};

mod policies;
mod sections;
mod toml_out;
mod xml;

use policies::{batching, compression, rate_limiting};
use sections::{
    brokers, discard_logging, http_interface, input_config, input_sources, kafka_config, logging,
    msg_debug, msg_delivery,
};
use toml_out::Toml;
use xml::{Cx, El, One};

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

#[cfg(test)]
pub(crate) mod testing {
    //! Helpers of the tests beside each part.

    use super::*;

    pub(crate) const EXAMPLE: &str = include_str!("../../../tests/data/dory-example.xml");

    /// A file with `body` besides a datagram input and one broker.
    pub(crate) fn xml(body: &str) -> String {
        format!(
            "<?xml version=\"1.0\" encoding=\"US-ASCII\"?>\n<doryConfig>\n{body}\n\
             <inputSources><unixDatagram enable=\"true\"><path value=\"/run/d.sock\"/>\
             </unixDatagram></inputSources>\n\
             <initialBrokers><broker host=\"k\" port=\"9092\"/></initialBrokers>\n</doryConfig>\n"
        )
    }

    /// Converts and loads the result as the daemon would.
    pub(crate) fn load(xml: &str) -> (Config, Vec<Note>) {
        let c = convert(xml, "t.xml").unwrap_or_else(|e| panic!("{e}\n{xml}"));
        let raw = parse_toml(Path::new("t.toml"), &c.toml).expect("parses");
        let cfg = Config::from_parts(raw, true, &Overrides::default()).expect("loads");
        (cfg, c.notes)
    }

    pub(crate) fn error(xml: &str) -> String {
        match convert(xml, "t.xml") {
            Ok(c) => panic!("converted:\n{}", c.toml),
            Err(e) => e.to_string(),
        }
    }

    pub(crate) fn has_note(notes: &[Note], element: &str, text: &str) -> bool {
        notes
            .iter()
            .any(|n| n.element == element && n.message.contains(text))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::convert::testing::*;
    use crate::config::policy::{BatchAction, CodecName};
    use crate::config::BatchLimits;

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
}

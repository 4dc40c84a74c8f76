//! Reading Dory's XML: elements checked against what Dory allowed where (unknown or
//! repeated elements and text are errors naming the element and its line), the notes
//! collected on the way, and Dory's value syntax (decimal numbers with `k`/`m` suffixes
//! where Dory took them, booleans, file modes, paths).

use std::collections::HashMap;

use roxmltree::Node;

use super::{ConvertError, Note};

/// An element and its path, for messages.
#[derive(Clone)]
pub(super) struct El<'a, 'i> {
    pub(super) node: Node<'a, 'i>,
    pub(super) path: String,
}

impl<'a, 'i> El<'a, 'i> {
    pub(super) fn line(&self) -> u32 {
        self.node
            .document()
            .text_pos_at(self.node.range().start)
            .row
    }

    pub(super) fn name(&self) -> &str {
        if self.path.is_empty() {
            "<doryConfig>"
        } else {
            &self.path
        }
    }

    pub(super) fn err(&self, message: impl Into<String>) -> ConvertError {
        ConvertError::Element {
            line: self.line(),
            element: self.name().to_string(),
            message: message.into(),
        }
    }

    pub(super) fn attr(&self, name: &str) -> Option<&'a str> {
        self.node.attribute(name)
    }

    pub(super) fn req_attr(&self, name: &str) -> Result<&'a str, ConvertError> {
        self.attr(name)
            .ok_or_else(|| self.err(format!("attribute `{name}` is required")))
    }

    /// A required attribute parsed by `parse`; a bad value names the attribute.
    pub(super) fn parsed<T>(
        &self,
        name: &str,
        parse: impl FnOnce(&'a str) -> Result<T, String>,
    ) -> Result<T, ConvertError> {
        parse(self.req_attr(name)?).map_err(|m| self.err(format!("attribute `{name}`: {m}")))
    }

    /// An optional attribute parsed by `parse`.
    pub(super) fn parsed_opt<T>(
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
pub(super) enum Count {
    One,
    Many,
}
pub(super) use Count::{Many, One};

/// The children of an element, checked against what Dory allows there.
pub(super) struct Kids<'a, 'i> {
    pub(super) one: HashMap<&'static str, El<'a, 'i>>,
    pub(super) many: Vec<El<'a, 'i>>,
}

impl<'a, 'i> Kids<'a, 'i> {
    pub(super) fn get(&self, name: &str) -> Option<&El<'a, 'i>> {
        self.one.get(name)
    }

    pub(super) fn required(&self, parent: &El, name: &str) -> Result<&El<'a, 'i>, ConvertError> {
        self.get(name)
            .ok_or_else(|| parent.err(format!("element <{name}> is required here")))
    }
}

pub(super) struct Cx {
    pub(super) notes: Vec<Note>,
    /// Where each line after the first starts: a note's line by binary search, as a file
    /// can hold a note per attribute and `Document::text_pos_at` counts from the start.
    pub(super) line_starts: Vec<usize>,
}

impl Cx {
    pub(super) fn new(xml: &str) -> Cx {
        Cx {
            notes: Vec::new(),
            line_starts: xml.match_indices('\n').map(|(i, _)| i + 1).collect(),
        }
    }

    pub(super) fn note(&mut self, el: &El, message: impl Into<String>) {
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
    pub(super) fn open<'a, 'i>(
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
    pub(super) fn leaf<'a, T>(
        &mut self,
        el: &El<'a, '_>,
        attr: &str,
        parse: impl FnOnce(&'a str) -> Result<T, String>,
    ) -> Result<T, ConvertError> {
        self.open(el, &[attr], &[])?;
        el.parsed(attr, parse)
    }

    /// The `value` of the optional leaf `name` among `kids`.
    pub(super) fn value<'a, T>(
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

#[derive(Clone, Copy)]
pub(super) enum Suffix {
    None,
    K,
    KM,
}

/// Dory's unsigned integers: decimal, a leading 0 refused (it would be octal), `k` (×1024)
/// and `m` (×1048576) where allowed.
pub(super) fn uint(s: &str, suffix: Suffix) -> Result<u64, String> {
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

pub(super) fn plain(s: &str) -> Result<u64, String> {
    uint(s, Suffix::None)
}

pub(super) fn with_k(s: &str) -> Result<u64, String> {
    uint(s, Suffix::K)
}

pub(super) fn with_km(s: &str) -> Result<u64, String> {
    uint(s, Suffix::KM)
}

pub(super) fn positive(s: &str) -> Result<u64, String> {
    match plain(s)? {
        0 => Err(format!("`{s}`: must be greater than 0")),
        n => Ok(n),
    }
}

/// `disable` (exactly) or a number.
pub(super) fn or_disable(suffix: Suffix) -> impl Fn(&str) -> Result<Option<u64>, String> {
    move |s| match s {
        "disable" => Ok(None),
        _ => uint(s, suffix).map(Some),
    }
}

/// `unlimited` (exactly) or a number with an optional `k`.
pub(super) fn or_unlimited(s: &str) -> Result<Option<u64>, String> {
    match s {
        "unlimited" => Ok(None),
        _ => with_k(s).map(Some),
    }
}

pub(super) fn boolean(s: &str) -> Result<bool, String> {
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
pub(super) fn file_mode(s: &str) -> Result<Option<u32>, String> {
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

pub(super) fn absolute_or_empty(s: &str) -> Result<&str, String> {
    if s.is_empty() || s.starts_with('/') {
        Ok(s)
    } else {
        Err(format!("`{s}` must be an absolute path (or empty)"))
    }
}

pub(super) fn non_empty(s: &str) -> Result<&str, String> {
    if s.is_empty() {
        Err("must not be empty".into())
    } else {
        Ok(s)
    }
}

pub(super) fn fits<T: TryFrom<u64>>(n: u64, what: &str) -> Result<T, String> {
    T::try_from(n).map_err(|_| format!("{n} is too large for {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::convert::testing::*;

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
}

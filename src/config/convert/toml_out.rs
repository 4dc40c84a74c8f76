//! Writing the converted TOML: tables in a fixed order, values quoted and escaped, sizes
//! with suffixes, Dory's defaults marked, and the notes repeated as comments.

use super::Note;

/// A table and the subtables written right after it.
#[derive(Default)]
pub(super) struct Table {
    pub(super) header: String,
    pub(super) lines: Vec<String>,
    pub(super) subs: Vec<Table>,
}

impl Table {
    pub(super) fn kv(&mut self, k: &str, value: String) {
        self.lines.push(format!("{k} = {value}"));
    }

    /// `k = value`, or Dory's default marked as such when the file had no value.
    pub(super) fn kv_or_default(&mut self, k: &str, value: Option<String>, dory_default: String) {
        match value {
            Some(v) => self.kv(k, v),
            None => self
                .lines
                .push(format!("{k} = {dory_default}  # Dory's default")),
        }
    }

    pub(super) fn comment(&mut self, text: &str) {
        self.lines.push(format!("# {}", one_line(text)));
    }

    pub(super) fn sub(&mut self, header: &str) -> &mut Table {
        self.subs.push(Table {
            header: header.to_string(),
            ..Table::default()
        });
        let last = self.subs.len() - 1;
        &mut self.subs[last]
    }

    pub(super) fn render(&self, out: &mut String) {
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
pub(super) struct Toml {
    pub(super) tables: Vec<Table>,
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
    pub(super) fn table(&mut self, name: &str) -> &mut Table {
        let i = self
            .tables
            .iter()
            .position(|t| t.header == name)
            .expect("the top-level tables are the fixed list of Toml::default");
        &mut self.tables[i]
    }

    pub(super) fn render(&self, source: &str, notes: &[Note]) -> String {
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
pub(super) fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// A TOML basic string.
pub(super) fn string(s: &str) -> String {
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
pub(super) fn key(s: &str) -> String {
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
pub(super) fn size(n: u64) -> String {
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
    use super::*;
    use crate::config::convert::convert;
    use crate::config::convert::testing::*;

    #[test]
    fn toml_values() {
        assert_eq!(size(64 << 10), "\"64k\"");
        assert_eq!(size(1_000_000), "1000000");
        assert_eq!(key("a.b"), "\"a.b\"");
        assert_eq!(string("a\"\\\n"), "\"a\\\"\\\\\\u000A\"");
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
}

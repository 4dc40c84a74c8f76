//! Mapping Dory's per-topic sections (batching, compression, rate limiting: named
//! configs, a default and per-topic choices) onto dory's `[batching]`, `[compression]`
//! and `[rate_limit]` tables.

use std::collections::BTreeMap;

use super::toml_out::{key, size, string, Table};
use super::xml::{
    boolean, non_empty, or_disable, or_unlimited, plain, positive, with_k, Cx, El, Kids, Many, One,
    Suffix,
};
use super::ConvertError;

/// One of Dory's named batching configs: time (ms), messages, bytes; `None` = disabled.
#[derive(Clone, Copy)]
pub(super) struct Limits {
    pub(super) time: Option<u64>,
    pub(super) messages: Option<u64>,
    pub(super) bytes: Option<u64>,
}

/// A topic's batching: the TOML action and, for `perTopic`, the named config and its limits.
pub(super) type TopicAction<'a> = (&'static str, Option<(&'a str, Limits)>);

/// `action` and `config` of `<defaultTopic>` or `<topic>`.
pub(super) fn batch_action<'a>(
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

pub(super) fn batching(cx: &mut Cx, t: &mut Table, el: &El) -> Result<(), ConvertError> {
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

pub(super) fn compression(cx: &mut Cx, t: &mut Table, el: &El) -> Result<(), ConvertError> {
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
pub(super) fn default_and_topics(
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

pub(super) fn rate_limiting(cx: &mut Cx, t: &mut Table, el: &El) -> Result<(), ConvertError> {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::convert::convert;
    use crate::config::convert::testing::*;
    use crate::config::policy::{BatchAction, CodecName, RateLimit};

    const BATCHING_HEAD: &str = r#"<batching><namedConfigs><config name="a"><time value="5"/></config>
        </namedConfigs><produceRequestDataLimit value="0"/><messageMaxBytes value="1k"/>"#;

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

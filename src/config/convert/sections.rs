//! Mapping Dory's daemon-wide sections (inputs, brokers, Kafka settings, delivery, the
//! HTTP interface, discard and debug logging, logging) onto dory's TOML tables.

use super::toml_out::{size, string, Table, Toml};
use super::xml::{
    absolute_or_empty, boolean, file_mode, fits, non_empty, or_unlimited, plain, positive, with_km,
    Cx, El, Kids, Many, One,
};
use super::ConvertError;

/// A UNIX socket input: `<path>` and optional `<mode>`.
pub(super) fn unix_socket(
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

pub(super) fn input_sources(cx: &mut Cx, t: &mut Table, el: &El) -> Result<(), ConvertError> {
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

pub(super) fn input_config(
    cx: &mut Cx,
    t: &mut Table,
    el: Option<&El>,
) -> Result<(), ConvertError> {
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

pub(super) fn brokers(cx: &mut Cx, t: &mut Table, el: &El) -> Result<(), ConvertError> {
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
        let addr = crate::config::BrokerAddr {
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

pub(super) fn kafka_config(
    cx: &mut Cx,
    t: &mut Table,
    el: Option<&El>,
) -> Result<(), ConvertError> {
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

pub(super) fn msg_delivery(
    cx: &mut Cx,
    out: &mut Toml,
    el: Option<&El>,
) -> Result<(), ConvertError> {
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

pub(super) fn http_interface(
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
pub(super) fn enable_and_path(
    el: &El,
    kids: &Kids,
    cx: &mut Cx,
) -> Result<(bool, String), ConvertError> {
    let enable = el.parsed("enable", boolean)?;
    let path_el = kids.required(el, "path")?;
    let path = cx.leaf(path_el, "value", |s| Ok(s.to_string()))?;
    if enable && !path.starts_with('/') {
        return Err(path_el.err(format!("`{path}` must be an absolute path")));
    }
    Ok((enable, path))
}

pub(super) fn discard_logging(cx: &mut Cx, t: &mut Table, el: &El) -> Result<(), ConvertError> {
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

pub(super) fn msg_debug(cx: &mut Cx, t: &mut Table, el: &El) -> Result<(), ConvertError> {
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

pub(super) fn logging(cx: &mut Cx, el: &El) -> Result<(), ConvertError> {
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

#[cfg(test)]
mod tests {
    use crate::config::convert::testing::*;

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
}

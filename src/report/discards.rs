//! One place where messages end as discards: counted per topic and reason in the
//! metrics, written to the discard log when it is on, resolved for commit points, then
//! dropped (freeing their pool space). Also the possible-duplicate records.

use std::time::SystemTime;

use crate::pipeline::Msg;
use crate::report::discard_log::{DiscardInfo, DiscardKind};
use crate::report::metrics::{Counter, DiscardReason, Metrics};

/// The discard log's `info:` for a reason.
pub fn info(reason: DiscardReason) -> DiscardInfo {
    match reason {
        DiscardReason::Malformed => DiscardInfo::Malformed,
        DiscardReason::UnsupportedApiKey => DiscardInfo::ApiKey(0),
        DiscardReason::UnsupportedVersion => DiscardInfo::Version(0),
        DiscardReason::UncleanDisconnect => DiscardInfo::UncleanUnix,
        DiscardReason::NoMemory => DiscardInfo::NoMem,
        DiscardReason::BadTopic => DiscardInfo::BadTopic,
        DiscardReason::TooLong => DiscardInfo::LongMsg,
        DiscardReason::NoAvailablePartitions => DiscardInfo::NoAvailablePartitions,
        DiscardReason::RateLimit => DiscardInfo::RateLimit,
        DiscardReason::AutocreateFailed => DiscardInfo::TopicAutocreateFail,
        DiscardReason::KafkaError => DiscardInfo::KafkaErrorAck,
        DiscardReason::AttemptLimit => DiscardInfo::DeliveryAttemptLimit,
        DiscardReason::Shutdown => DiscardInfo::ServerShutdown,
        DiscardReason::SpoolFull => DiscardInfo::SpoolFull,
    }
}

/// Logs each message's key and value to the discard log (if on) as `kind`.
fn log_msgs(metrics: &Metrics, msgs: &[Msg], kind: DiscardKind) {
    let Some(log) = metrics.discard_log() else {
        return;
    };
    let now = SystemTime::now();
    let (mut key, mut value) = (Vec::new(), Vec::new());
    for m in msgs {
        let name = metrics.topic_name(m.topic);
        key.clear();
        value.clear();
        let cap = log.max_msg_prefix().unwrap_or(usize::MAX);
        m.payload.copy_to(0, m.key_len().min(cap), &mut key);
        m.payload
            .copy_to(m.key_len(), m.value_len().min(cap), &mut value);
        log.log(now, m.timestamp, kind, &name, &key, &value);
    }
}

/// Discards `msgs` (any topics) for `reason`: counted, logged, dropped. These messages
/// were created (counted in `MsgCreate` when an input handed them on), so they also count
/// in `MsgDestroy`; discards at input, before a message exists, do not.
pub fn discard(metrics: &Metrics, msgs: Vec<Msg>, reason: DiscardReason) {
    if msgs.is_empty() {
        return;
    }
    metrics.add(Counter::MsgDestroy, msgs.len() as u64);
    log_msgs(metrics, &msgs, DiscardKind::Discard(info(reason)));
    let mut i = 0;
    while i < msgs.len() {
        let (t, start) = (msgs[i].topic, i);
        let (mut n, mut lo, mut hi) = (0u64, i64::MAX, i64::MIN);
        // Messages usually come grouped by topic; count each run at once.
        while i < msgs.len() && msgs[i].topic == t {
            n += 1;
            lo = lo.min(msgs[i].timestamp);
            hi = hi.max(msgs[i].timestamp);
            i += 1;
        }
        metrics.discarded(t, reason, n, lo, hi);
        // Resolved once counted: a commit point never passes a message not yet counted.
        metrics.track_discarded(t, &msgs[start..i]);
    }
    drop(msgs);
}

/// Records messages about to be resent after their first send's fate became unknown.
pub fn possible_duplicates(metrics: &Metrics, msgs: &[Msg]) {
    if msgs.is_empty() {
        return;
    }
    log_msgs(metrics, msgs, DiscardKind::PossibleDuplicate);
    let t = msgs[0].topic;
    let (lo, hi) = msgs.iter().fold((i64::MAX, i64::MIN), |(lo, hi), m| {
        (lo.min(m.timestamp), hi.max(m.timestamp))
    });
    metrics.possible_duplicates(t, msgs.len() as u64, lo, hi);
}

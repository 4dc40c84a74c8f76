//! The ack reader (`dispatcher-<id>-acks`, one per connection): reads the Produce
//! responses in order and settles each partition: delivered, discarded, or handed back to
//! the router to retry, back off or reroute.

use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::{debug_log, fail_in_flight, give_back, DispatcherConfig, InFlight};
use crate::kafka::connection::{ConnError, Connection};
use crate::kafka::errors::{
    classify, error_name, may_be_written, sequence_action, ErrorAction, SequenceAction,
};
use crate::kafka::produce;
use crate::pipeline::{count_failed_attempt, Batch, Outcome, ReturnReason};
use crate::report::discards;
use crate::report::liveness::{Heartbeat, TICK as HEARTBEAT_TICK};
use crate::report::metrics::{Counter, DiscardReason, Metrics, QueueState};
use crate::report::msg_debug::DebugFile;

/// Largest Produce response we accept (a response lists only partitions we sent).
const MAX_RESPONSE_SIZE: usize = 16 << 20;

/// The receiver thread: reads responses for one connection, in order.
pub(super) struct Receiver_ {
    pub(super) id: i32,
    pub(super) conn: Connection,
    pub(super) cfg: Arc<DispatcherConfig>,
    pub(super) metrics: &'static Metrics,
    pub(super) to_router: Sender<Outcome>,
    pub(super) heartbeat: Heartbeat,
}

#[derive(Debug, thiserror::Error)]
enum ResponseError {
    #[error(transparent)]
    Conn(#[from] ConnError),
    #[error("cannot decode produce response: {0}")]
    Decode(#[from] crate::kafka::DecodeError),
    #[error("correlation id {got} does not match the request's {expected}")]
    Correlation { expected: i32, got: i32 },
    #[error("response does not answer topic [{topic}] partition {partition}")]
    Missing { topic: String, partition: i32 },
}

impl Receiver_ {
    pub(super) fn run(mut self, from_sender: Receiver<InFlight>, dead: Sender<()>) {
        let mut frame = Vec::new();
        loop {
            self.heartbeat.beat();
            let entry = match from_sender.recv_timeout(HEARTBEAT_TICK) {
                Ok(e) => e,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            let e = match self.read_response(&entry, &mut frame) {
                Ok(resp) => match part_codes(&entry, &resp) {
                    Ok(codes) => {
                        self.settle(entry, &codes);
                        continue;
                    }
                    Err(e) => e,
                },
                Err(e) => e,
            };
            self.connection_lost(&e, entry, &from_sender, &dead);
            return;
        }
    }

    /// A response that could not be read or does not answer the request: the connection
    /// is closed and everything in flight on it goes back to the router.
    fn connection_lost(
        &mut self,
        e: &ResponseError,
        entry: InFlight,
        from_sender: &Receiver<InFlight>,
        dead: &Sender<()>,
    ) {
        log::warn!("broker {}: connection lost: {e}", self.id);
        self.metrics.inc(match e {
            ResponseError::Conn(ConnError::Io(io))
                if matches!(
                    io.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Counter::ConnectorSocketTimeout
            }
            ResponseError::Conn(ConnError::Io(_)) => Counter::ConnectorSocketError,
            ResponseError::Correlation { .. } => Counter::CorrelationIdMismatch,
            _ => Counter::BadProduceResponse,
        });
        let _ = self.conn.shutdown();
        let _ = dead.try_send(());
        fail_in_flight(&self.to_router, self.metrics, self.id, entry);
        // The sender stops writing once it sees `dead`; what it already wrote is in doubt
        // too.
        while let Ok(entry) = from_sender.recv() {
            fail_in_flight(&self.to_router, self.metrics, self.id, entry);
        }
    }

    fn read_response<'f>(
        &mut self,
        entry: &InFlight,
        frame: &'f mut Vec<u8>,
    ) -> Result<produce::ProduceResponse<'f>, ResponseError> {
        self.conn.recv_frame(frame, MAX_RESPONSE_SIZE)?;
        let resp = produce::decode_response(frame, entry.version)?;
        if resp.correlation_id != entry.correlation_id {
            return Err(ResponseError::Correlation {
                expected: entry.correlation_id,
                got: resp.correlation_id,
            });
        }
        Ok(resp)
    }

    /// Applies each partition's error code to its messages.
    /// `codes[i]` answers `entry.parts[i]` (see [`part_codes`]).
    fn settle(&mut self, entry: InFlight, codes: &[i16]) {
        let acked_at = Instant::now();
        let mut retry = Vec::new();
        let mut backoff = Vec::new();
        let mut reroute = Vec::new();
        let mut acks = Vec::new();
        debug_assert_eq!(entry.parts.len(), codes.len());
        let mut parts = entry.parts.into_iter().zip(codes).peekable();
        while let Some((mut p, &code)) = parts.next() {
            // With thousands of topics each partition's counters are cold: the next one's
            // load overlaps this one's work.
            if let Some((next, _)) = parts.peek() {
                self.metrics.prefetch_topic_ack(next.topic);
            }
            let n = p.msgs.len() as u64;
            self.metrics
                .queue_add(p.topic, QueueState::AckWait, -(n as i64));
            self.metrics.inc(Counter::for_ack_error(code));
            // A sealed batch the broker already has (a resend it recognised) is delivered.
            let written = code == 0
                || (p.seq.is_some()
                    && sequence_action(code) == Some(SequenceAction::AlreadyWritten));
            if written {
                if code != 0 {
                    self.metrics.inc(Counter::AckDuplicateSequence);
                }
                if let Some(s) = p.seq {
                    acks.push(((p.topic, p.partition), s, p.msgs.len()));
                }
                debug_log(self.metrics, DebugFile::GotAck, &p.name, &p.msgs);
                self.metrics.delivered(p.topic, n);
                self.metrics.track_delivered(p.topic, &p.msgs, acked_at);
                self.metrics.add(Counter::MsgDestroy, n);
                crate::pipeline::free_msgs(p.msgs);
                continue;
            }
            if may_be_written(code) {
                // Appended before the error: a resend is in doubt (see may_be_written).
                for m in &mut p.msgs {
                    m.maybe_sent = true;
                }
            }
            if p.seq.is_some() {
                // The partition's sequence decides what happens next: the router's call.
                self.metrics
                    .queue_add(p.topic, QueueState::SendWait, n as i64);
                log::warn!(
                    "broker {}: topic [{}] partition {}: {} ({code}) for producer batch {:?}",
                    self.id,
                    String::from_utf8_lossy(&p.name),
                    p.partition,
                    error_name(code),
                    p.seq
                );
                give_back(
                    &self.to_router,
                    self.id,
                    ReturnReason::Rejected { code },
                    vec![p.into_batch()],
                );
                continue;
            }
            let action = classify(code);
            if action == ErrorAction::Discard {
                log::error!(
                    "broker {}: discarding {n} message(s) of topic [{}] partition {}: {} ({code})",
                    self.id,
                    String::from_utf8_lossy(&p.name),
                    p.partition,
                    error_name(code)
                );
                discards::discard(self.metrics, p.msgs, DiscardReason::KafkaError);
                continue;
            }
            // A failed attempt: count it; past the limit the message is discarded.
            let (keep, over) = count_failed_attempt(p.msgs, self.cfg.max_failed_attempts);
            if !over.is_empty() {
                if may_be_written(code) {
                    // Discarded, yet perhaps stored: counted as possibly delivered too.
                    discards::possible_duplicates(self.metrics, &over);
                }
                log::error!(
                    "broker {}: discarding {} message(s) of topic [{}] after {} failed attempts (last error {})",
                    self.id,
                    over.len(),
                    String::from_utf8_lossy(&p.name),
                    self.cfg.max_failed_attempts + 1,
                    error_name(code)
                );
                discards::discard(self.metrics, over, DiscardReason::AttemptLimit);
            }
            if keep.is_empty() {
                continue;
            }
            self.metrics
                .queue_add(p.topic, QueueState::SendWait, keep.len() as i64);
            let batch = Batch::new(p.topic, p.partition, keep);
            match action {
                ErrorAction::Retry => retry.push(batch),
                ErrorAction::Backoff => backoff.push(batch),
                _ => reroute.push(batch),
            }
            log::warn!(
                "broker {}: topic [{}] partition {}: {} ({code}); sending again",
                self.id,
                String::from_utf8_lossy(&p.name),
                p.partition,
                error_name(code)
            );
        }
        if !acks.is_empty() {
            let _ = self.to_router.send(Outcome::Acked { acks });
        }
        give_back(&self.to_router, self.id, ReturnReason::Retry, retry);
        give_back(&self.to_router, self.id, ReturnReason::Backoff, backoff);
        give_back(&self.to_router, self.id, ReturnReason::Reroute, reroute);
    }
}

/// Each part's error code, in the request's order, or the first part the response leaves
/// unanswered. Brokers answer in the request's order, so that is tried first: a walk of
/// both lists that compares names, with no hashing. Any other order (or a partition
/// answered twice, or an extra one) goes through [`answer_codes`].
fn part_codes(
    entry: &InFlight,
    resp: &produce::ProduceResponse<'_>,
) -> Result<Vec<i16>, ResponseError> {
    let in_order = resp.partitions.len() == entry.parts.len()
        && entry
            .parts
            .iter()
            .zip(&resp.partitions)
            .all(|(p, q)| q.partition == p.partition && q.topic == &p.name[..]);
    if in_order {
        return Ok(resp.partitions.iter().map(|q| q.error_code).collect());
    }
    let codes = answer_codes(resp);
    if let Some(e) = unanswered(entry, &codes) {
        return Err(e);
    }
    Ok(entry
        .parts
        .iter()
        .map(|p| codes[&(&p.name[..], p.partition)])
        .collect())
}

/// Each partition's error code in a response, by topic name and partition. Hashed with
/// std's randomly keyed SipHash, not the hot path's [`crate::fasthash`]: the names come
/// from the broker, and a fixed hash would let a hostile or broken one send names that all
/// collide, making each insert a scan of the map (per message this map costs nothing:
/// one entry per partition per response).
type AnswerCodes<'a> = std::collections::HashMap<(&'a [u8], i32), i16>;

/// Indexes a response once, so that settling a request of many topics costs a lookup per
/// partition rather than a scan of the whole response (at 1,000 topics the scans were a
/// fifth of dory's instructions). When a broker answers a partition twice, the first
/// answer counts. The map's size is bounded by the response's, which is bounded by
/// `MAX_RESPONSE_SIZE`.
fn answer_codes<'a>(resp: &produce::ProduceResponse<'a>) -> AnswerCodes<'a> {
    let mut codes = AnswerCodes::default();
    codes.reserve(resp.partitions.len());
    for q in &resp.partitions {
        codes.entry((q.topic, q.partition)).or_insert(q.error_code);
    }
    codes
}

/// The first partition of the request that the response does not answer, as the error
/// that closes the connection (its messages' fate is unknown).
fn unanswered(entry: &InFlight, codes: &AnswerCodes<'_>) -> Option<ResponseError> {
    entry
        .parts
        .iter()
        .find(|p| !codes.contains_key(&(&p.name[..], p.partition)))
        .map(|p| ResponseError::Missing {
            topic: String::from_utf8_lossy(&p.name).into_owned(),
            partition: p.partition,
        })
}

#[cfg(test)]
mod tests {
    use super::super::Part;
    use super::*;
    use crate::kafka::produce::{ProducePartitionResponse, ProduceResponse};

    fn part(topic: u32, name: &str, partition: i32) -> Part {
        Part {
            topic,
            name: Arc::from(name.as_bytes()),
            partition,
            msgs: Vec::new(),
            kafka_bytes: 0,
            seq: None,
        }
    }

    fn response(topics: &[(&'static str, &[(i32, i16)])]) -> ProduceResponse<'static> {
        ProduceResponse {
            correlation_id: 7,
            partitions: topics
                .iter()
                .flat_map(|(name, parts)| {
                    parts
                        .iter()
                        .map(|&(partition, error_code)| ProducePartitionResponse {
                            topic: name.as_bytes(),
                            partition,
                            error_code,
                            base_offset: 0,
                        })
                })
                .collect(),
            throttle_time_ms: 0,
        }
    }

    fn in_flight(parts: Vec<Part>) -> InFlight {
        InFlight {
            correlation_id: 7,
            version: 9,
            parts,
        }
    }

    #[test]
    fn codes_are_found_whatever_order_the_broker_answers_in() {
        let entry = in_flight(vec![part(0, "a", 0), part(0, "a", 1), part(1, "b", 0)]);
        // Topics and partitions in another order than the request's, and a topic split
        // over two entries.
        let resp = response(&[("b", &[(0, 6)]), ("a", &[(1, 0)]), ("a", &[(0, 3)])]);
        let codes = answer_codes(&resp);
        assert!(unanswered(&entry, &codes).is_none());
        let got: Vec<i16> = entry
            .parts
            .iter()
            .map(|p| codes[&(&p.name[..], p.partition)])
            .collect();
        assert_eq!(got, [3, 0, 6]);
    }

    #[test]
    fn codes_in_the_request_order_need_no_index_and_agree_with_it() {
        let entry = in_flight(vec![part(0, "a", 0), part(0, "a", 1), part(1, "b", 0)]);
        let resp = response(&[("a", &[(0, 3), (1, 0)]), ("b", &[(0, 6)])]);
        assert_eq!(part_codes(&entry, &resp).unwrap(), [3, 0, 6]);
        // The same answers in another order, through the index.
        let resp = response(&[("b", &[(0, 6)]), ("a", &[(1, 0), (0, 3)])]);
        assert_eq!(part_codes(&entry, &resp).unwrap(), [3, 0, 6]);
        // One too many, answering a partition twice: the first answer counts.
        let resp = response(&[("a", &[(0, 3), (0, 0), (1, 0)]), ("b", &[(0, 6)])]);
        assert_eq!(part_codes(&entry, &resp).unwrap(), [3, 0, 6]);
        // As many as asked, but one of them for a partition not asked.
        let resp = response(&[("a", &[(0, 3), (1, 0)]), ("b", &[(1, 6)])]);
        let e = part_codes(&entry, &resp).expect_err("b 0 is missing");
        assert!(
            matches!(&e, ResponseError::Missing { topic, partition: 0 } if topic == "b"),
            "{e}"
        );
    }

    #[test]
    fn a_partition_answered_twice_takes_the_first_answer() {
        let resp = response(&[("a", &[(0, 6), (0, 0)])]);
        assert_eq!(answer_codes(&resp)[&(&b"a"[..], 0)], 6);
    }

    #[test]
    fn a_partition_left_unanswered_is_named() {
        let entry = in_flight(vec![part(0, "a", 0), part(1, "b", 2)]);
        // Partition 2 of "a" and partition 0 of "b" do not answer "b" 2.
        let resp = response(&[("a", &[(0, 0), (2, 0)]), ("b", &[(0, 0)])]);
        let e = unanswered(&entry, &answer_codes(&resp)).expect("b 2 is missing");
        assert!(
            matches!(&e, ResponseError::Missing { topic, partition: 2 } if topic == "b"),
            "{e}"
        );
    }
}

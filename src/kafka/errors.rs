//! Kafka error codes: every code Kafka 4.x defines (UNKNOWN_SERVER_ERROR -1 through
//! SHARE_SESSION_LIMIT_REACHED 133) with its name and Kafka's own retriable flag, plus the
//! producer's decision for each: retry, refresh metadata and reroute, back off, or discard.
//! Kept as plain data and functions so the policy is tested without a broker.

/// Error code for "no error".
pub const NONE: i16 = 0;
/// Error code a broker answers when it does not support a request version.
pub const UNSUPPORTED_VERSION: i16 = 35;

/// The lowest code in [`TABLE`]; the table is indexed by `code - FIRST_CODE`.
const FIRST_CODE: i16 = -1;

/// `(code, name, retriable)` for every code from -1 upwards, without gaps. The retriable
/// flag is Kafka's: whether the Java client's exception for the code is a
/// `RetriableException` (as of Kafka 4.x).
const TABLE: &[(i16, &str, bool)] = &[
    (-1, "UNKNOWN_SERVER_ERROR", false),
    (0, "NONE", false),
    (1, "OFFSET_OUT_OF_RANGE", false),
    (2, "CORRUPT_MESSAGE", true),
    (3, "UNKNOWN_TOPIC_OR_PARTITION", true),
    (4, "INVALID_FETCH_SIZE", false),
    (5, "LEADER_NOT_AVAILABLE", true),
    (6, "NOT_LEADER_OR_FOLLOWER", true),
    (7, "REQUEST_TIMED_OUT", true),
    (8, "BROKER_NOT_AVAILABLE", false),
    (9, "REPLICA_NOT_AVAILABLE", true),
    (10, "MESSAGE_TOO_LARGE", false),
    (11, "STALE_CONTROLLER_EPOCH", false),
    (12, "OFFSET_METADATA_TOO_LARGE", false),
    (13, "NETWORK_EXCEPTION", true),
    (14, "COORDINATOR_LOAD_IN_PROGRESS", true),
    (15, "COORDINATOR_NOT_AVAILABLE", true),
    (16, "NOT_COORDINATOR", true),
    (17, "INVALID_TOPIC_EXCEPTION", false),
    (18, "RECORD_LIST_TOO_LARGE", false),
    (19, "NOT_ENOUGH_REPLICAS", true),
    (20, "NOT_ENOUGH_REPLICAS_AFTER_APPEND", true),
    (21, "INVALID_REQUIRED_ACKS", false),
    (22, "ILLEGAL_GENERATION", false),
    (23, "INCONSISTENT_GROUP_PROTOCOL", false),
    (24, "INVALID_GROUP_ID", false),
    (25, "UNKNOWN_MEMBER_ID", false),
    (26, "INVALID_SESSION_TIMEOUT", false),
    (27, "REBALANCE_IN_PROGRESS", false),
    (28, "INVALID_COMMIT_OFFSET_SIZE", false),
    (29, "TOPIC_AUTHORIZATION_FAILED", false),
    (30, "GROUP_AUTHORIZATION_FAILED", false),
    (31, "CLUSTER_AUTHORIZATION_FAILED", false),
    (32, "INVALID_TIMESTAMP", false),
    (33, "UNSUPPORTED_SASL_MECHANISM", false),
    (34, "ILLEGAL_SASL_STATE", false),
    (35, "UNSUPPORTED_VERSION", false),
    (36, "TOPIC_ALREADY_EXISTS", false),
    (37, "INVALID_PARTITIONS", false),
    (38, "INVALID_REPLICATION_FACTOR", false),
    (39, "INVALID_REPLICA_ASSIGNMENT", false),
    (40, "INVALID_CONFIG", false),
    (41, "NOT_CONTROLLER", true),
    (42, "INVALID_REQUEST", false),
    (43, "UNSUPPORTED_FOR_MESSAGE_FORMAT", false),
    (44, "POLICY_VIOLATION", false),
    (45, "OUT_OF_ORDER_SEQUENCE_NUMBER", false),
    (46, "DUPLICATE_SEQUENCE_NUMBER", false),
    (47, "INVALID_PRODUCER_EPOCH", false),
    (48, "INVALID_TXN_STATE", false),
    (49, "INVALID_PRODUCER_ID_MAPPING", false),
    (50, "INVALID_TRANSACTION_TIMEOUT", false),
    // Retriable since Kafka 4.0 (KIP-1050 made ConcurrentTransactionsException retriable);
    // older protocol tables list it as not retriable.
    (51, "CONCURRENT_TRANSACTIONS", true),
    (52, "TRANSACTION_COORDINATOR_FENCED", false),
    (53, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", false),
    (54, "SECURITY_DISABLED", false),
    (55, "OPERATION_NOT_ATTEMPTED", false),
    (56, "KAFKA_STORAGE_ERROR", true),
    (57, "LOG_DIR_NOT_FOUND", false),
    (58, "SASL_AUTHENTICATION_FAILED", false),
    (59, "UNKNOWN_PRODUCER_ID", false),
    (60, "REASSIGNMENT_IN_PROGRESS", false),
    (61, "DELEGATION_TOKEN_AUTH_DISABLED", false),
    (62, "DELEGATION_TOKEN_NOT_FOUND", false),
    (63, "DELEGATION_TOKEN_OWNER_MISMATCH", false),
    (64, "DELEGATION_TOKEN_REQUEST_NOT_ALLOWED", false),
    (65, "DELEGATION_TOKEN_AUTHORIZATION_FAILED", false),
    (66, "DELEGATION_TOKEN_EXPIRED", false),
    (67, "INVALID_PRINCIPAL_TYPE", false),
    (68, "NON_EMPTY_GROUP", false),
    (69, "GROUP_ID_NOT_FOUND", false),
    (70, "FETCH_SESSION_ID_NOT_FOUND", true),
    (71, "INVALID_FETCH_SESSION_EPOCH", true),
    (72, "LISTENER_NOT_FOUND", true),
    (73, "TOPIC_DELETION_DISABLED", false),
    (74, "FENCED_LEADER_EPOCH", true),
    (75, "UNKNOWN_LEADER_EPOCH", true),
    (76, "UNSUPPORTED_COMPRESSION_TYPE", false),
    (77, "STALE_BROKER_EPOCH", false),
    (78, "OFFSET_NOT_AVAILABLE", true),
    (79, "MEMBER_ID_REQUIRED", false),
    (80, "PREFERRED_LEADER_NOT_AVAILABLE", true),
    (81, "GROUP_MAX_SIZE_REACHED", false),
    (82, "FENCED_INSTANCE_ID", false),
    (83, "ELIGIBLE_LEADERS_NOT_AVAILABLE", true),
    (84, "ELECTION_NOT_NEEDED", true),
    (85, "NO_REASSIGNMENT_IN_PROGRESS", false),
    (86, "GROUP_SUBSCRIBED_TO_TOPIC", false),
    (87, "INVALID_RECORD", false),
    (88, "UNSTABLE_OFFSET_COMMIT", true),
    (89, "THROTTLING_QUOTA_EXCEEDED", true),
    (90, "PRODUCER_FENCED", false),
    (91, "RESOURCE_NOT_FOUND", false),
    (92, "DUPLICATE_RESOURCE", false),
    (93, "UNACCEPTABLE_CREDENTIAL", false),
    (94, "INCONSISTENT_VOTER_SET", false),
    (95, "INVALID_UPDATE_VERSION", false),
    (96, "FEATURE_UPDATE_FAILED", false),
    (97, "PRINCIPAL_DESERIALIZATION_FAILURE", false),
    (98, "SNAPSHOT_NOT_FOUND", false),
    (99, "POSITION_OUT_OF_RANGE", false),
    (100, "UNKNOWN_TOPIC_ID", true),
    (101, "DUPLICATE_BROKER_REGISTRATION", false),
    (102, "BROKER_ID_NOT_REGISTERED", false),
    (103, "INCONSISTENT_TOPIC_ID", true),
    (104, "INCONSISTENT_CLUSTER_ID", false),
    (105, "TRANSACTIONAL_ID_NOT_FOUND", false),
    (106, "FETCH_SESSION_TOPIC_ID_ERROR", true),
    (107, "INELIGIBLE_REPLICA", false),
    (108, "NEW_LEADER_ELECTED", false),
    (109, "OFFSET_MOVED_TO_TIERED_STORAGE", false),
    (110, "FENCED_MEMBER_EPOCH", false),
    (111, "UNRELEASED_INSTANCE_ID", false),
    (112, "UNSUPPORTED_ASSIGNOR", false),
    (113, "STALE_MEMBER_EPOCH", false),
    (114, "MISMATCHED_ENDPOINT_TYPE", false),
    (115, "UNSUPPORTED_ENDPOINT_TYPE", false),
    (116, "UNKNOWN_CONTROLLER_ID", false),
    (117, "UNKNOWN_SUBSCRIPTION_ID", false),
    (118, "TELEMETRY_TOO_LARGE", false),
    (119, "INVALID_REGISTRATION", false),
    (120, "TRANSACTION_ABORTABLE", false),
    (121, "INVALID_RECORD_STATE", false),
    (122, "SHARE_SESSION_NOT_FOUND", true),
    (123, "INVALID_SHARE_SESSION_EPOCH", true),
    (124, "FENCED_STATE_EPOCH", false),
    (125, "INVALID_VOTER_KEY", false),
    (126, "DUPLICATE_VOTER", false),
    (127, "VOTER_NOT_FOUND", false),
    (128, "INVALID_REGULAR_EXPRESSION", false),
    (129, "REBOOTSTRAP_REQUIRED", false),
    (130, "STREAMS_INVALID_TOPOLOGY", false),
    (131, "STREAMS_INVALID_TOPOLOGY_EPOCH", false),
    (132, "STREAMS_TOPOLOGY_FENCED", false),
    (133, "SHARE_SESSION_LIMIT_REACHED", true),
];

fn entry(code: i16) -> Option<&'static (i16, &'static str, bool)> {
    let index = usize::try_from(i32::from(code) - i32::from(FIRST_CODE)).ok()?;
    TABLE.get(index)
}

/// Kafka's UPPER_SNAKE name for `code`, or `"UNKNOWN_CODE"` for codes this build does not
/// know (a newer broker may send them).
pub fn error_name(code: i16) -> &'static str {
    entry(code).map_or("UNKNOWN_CODE", |e| e.1)
}

/// Kafka's own retriable flag. Unknown codes are not retriable, as in the Java client.
pub fn is_retriable(code: i16) -> bool {
    entry(code).is_some_and(|e| e.2)
}

/// What the producer does with a batch whose partition came back with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorAction {
    /// Send the same batch to the same broker again (e.g. it was corrupted in transit).
    Retry,
    /// Our view of the cluster is stale: refresh metadata, then send to the (new) leader.
    RefreshAndReroute,
    /// The broker is temporarily unable to take the batch: wait, then retry.
    Backoff,
    /// Retrying cannot help: count the batch as discarded.
    Discard,
}

/// The producer's decision for a non-zero error code. Code 0 (`NONE`) is not an error and
/// callers check it first; it and every unknown code classify as [`ErrorAction::Discard`].
pub fn classify(code: i16) -> ErrorAction {
    match code {
        // CORRUPT_MESSAGE: the bytes were damaged on the way; the same broker will take a
        // clean copy.
        2 => ErrorAction::Retry,
        // The leader moved, the partition is unknown to this broker, or our metadata is older
        // (or newer) than the broker's: ask the cluster again before resending.
        3   // UNKNOWN_TOPIC_OR_PARTITION
        | 5   // LEADER_NOT_AVAILABLE
        | 6   // NOT_LEADER_OR_FOLLOWER
        | 9   // REPLICA_NOT_AVAILABLE
        | 15  // COORDINATOR_NOT_AVAILABLE
        | 16  // NOT_COORDINATOR
        | 41  // NOT_CONTROLLER
        | 72  // LISTENER_NOT_FOUND
        | 74  // FENCED_LEADER_EPOCH
        | 75  // UNKNOWN_LEADER_EPOCH
        | 80  // PREFERRED_LEADER_NOT_AVAILABLE
        | 83  // ELIGIBLE_LEADERS_NOT_AVAILABLE
        | 84  // ELECTION_NOT_NEEDED
        | 100 // UNKNOWN_TOPIC_ID
        | 103 // INCONSISTENT_TOPIC_ID
        | 129 // REBOOTSTRAP_REQUIRED (not retriable in Kafka, but it means "metadata stale")
        => ErrorAction::RefreshAndReroute,
        // Every other code Kafka marks retriable: timeouts, too few in-sync replicas, disk
        // errors, quotas, concurrent transactions, loading coordinators and the like.
        code if is_retriable(code) => ErrorAction::Backoff,
        _ => ErrorAction::Discard,
    }
}

/// Whether a Produce answer with `code` leaves the batch possibly written. With `acks = all`
/// the leader appends first and then waits for its in-sync replicas: REQUEST_TIMED_OUT means
/// they did not confirm in time, NOT_ENOUGH_REPLICAS_AFTER_APPEND that too few were left.
/// Either way the records are in the leader's log and may survive, so a resend is in doubt
/// just as after a lost connection. Every other error is decided before the append.
pub fn may_be_written(code: i16) -> bool {
    matches!(code, 7 | 20)
}

/// How an idempotent producer treats the codes that concern its sequence numbers (KIP-98,
/// KIP-360), before [`classify`] is asked. These apply only to batches sent with a producer
/// id; any other code is handled as for every batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SequenceAction {
    /// The broker already wrote this batch (a resend it recognised): success.
    AlreadyWritten,
    /// A batch before this one is missing at the broker: resend in order once the earlier
    /// batches are back. If this *is* the first unacknowledged batch, the broker lost our
    /// sequence: bump the epoch.
    OutOfOrder,
    /// The broker no longer knows our producer id (its records aged out): bump the epoch
    /// and start every partition at sequence 0.
    BumpEpoch,
    /// Our epoch was fenced: get a new producer id and start every partition at 0.
    NewProducerId,
}

pub const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
pub const DUPLICATE_SEQUENCE_NUMBER: i16 = 46;

/// The idempotent producer's decision for `code`, if the code is about sequences.
pub fn sequence_action(code: i16) -> Option<SequenceAction> {
    match code {
        DUPLICATE_SEQUENCE_NUMBER => Some(SequenceAction::AlreadyWritten),
        OUT_OF_ORDER_SEQUENCE_NUMBER => Some(SequenceAction::OutOfOrder),
        59 => Some(SequenceAction::BumpEpoch), // UNKNOWN_PRODUCER_ID
        47 | 90 => Some(SequenceAction::NewProducerId), // INVALID_PRODUCER_EPOCH, PRODUCER_FENCED
        _ => None,
    }
}

/// The idempotent producer's table as Markdown (doc/errors.md holds it; a test keeps the
/// two equal).
pub fn sequence_table_markdown() -> String {
    let mut out =
        String::from("| Code | Name | dory's action with idempotence on |\n|---:|---|---|\n");
    for code in [45, 46, 47, 59, 90] {
        let Some(action) = sequence_action(code) else {
            continue;
        };
        let action = match action {
            SequenceAction::AlreadyWritten => {
                "delivered: the broker already has this batch (a resend it recognised)"
            }
            SequenceAction::OutOfOrder => {
                "an earlier batch failed first: resend in sequence order once the partition's other batches are back; on the first unacknowledged batch, the broker lost our sequence: bump the epoch"
            }
            SequenceAction::BumpEpoch => {
                "the broker forgot our producer id: once nothing is in flight, bump the epoch (InitProducerId v3+, else a new id) and restart every partition at sequence 0"
            }
            SequenceAction::NewProducerId => {
                "fenced: once nothing is in flight, get a new producer id and restart every partition at sequence 0"
            }
        };
        out.push_str(&format!("| {code} | {} | {action} |\n", error_name(code)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_answers_after_the_append_leave_a_batch_in_doubt() {
        let doubt: Vec<i16> = TABLE
            .iter()
            .map(|e| e.0)
            .filter(|&c| may_be_written(c))
            .collect();
        assert_eq!(doubt, [7, 20]);
        // Both are retried (after a backoff), never discarded outright.
        assert!(doubt.iter().all(|&c| classify(c) == ErrorAction::Backoff));
    }

    #[test]
    fn table_is_dense_and_ordered() {
        for (i, (code, name, _)) in TABLE.iter().enumerate() {
            assert_eq!(i32::from(*code), i as i32 + i32::from(FIRST_CODE), "{name}");
            assert!(
                name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_'),
                "{name}"
            );
        }
        assert_eq!(TABLE.last().map(|e| e.0), Some(133));
    }

    #[test]
    fn names() {
        assert_eq!(error_name(-1), "UNKNOWN_SERVER_ERROR");
        assert_eq!(error_name(0), "NONE");
        assert_eq!(error_name(6), "NOT_LEADER_OR_FOLLOWER");
        assert_eq!(error_name(35), "UNSUPPORTED_VERSION");
        assert_eq!(error_name(87), "INVALID_RECORD");
        assert_eq!(error_name(133), "SHARE_SESSION_LIMIT_REACHED");
        assert_eq!(error_name(134), "UNKNOWN_CODE");
        assert_eq!(error_name(-2), "UNKNOWN_CODE");
        assert_eq!(error_name(i16::MIN), "UNKNOWN_CODE");
        assert_eq!(error_name(i16::MAX), "UNKNOWN_CODE");
    }

    #[test]
    fn retriable_flags() {
        let retriable = [
            2, 3, 5, 6, 7, 9, 13, 14, 15, 16, 19, 20, 41, 51, 56, 70, 71, 72, 74, 75, 78, 80, 83,
            84, 88, 89, 100, 103, 106, 122, 123, 133,
        ];
        for code in -1..=140 {
            assert_eq!(
                is_retriable(code),
                retriable.contains(&code),
                "{code} {}",
                error_name(code)
            );
        }
    }

    #[test]
    fn classification() {
        use ErrorAction::*;
        let cases = [
            (2, Retry),
            (3, RefreshAndReroute),
            (5, RefreshAndReroute),
            (6, RefreshAndReroute),
            (74, RefreshAndReroute),
            (75, RefreshAndReroute),
            (100, RefreshAndReroute),
            (7, Backoff),
            (13, Backoff),
            (19, Backoff),
            (20, Backoff),
            (51, Backoff),
            (56, Backoff),
            (89, Backoff),
            (-1, Discard),
            (1, Discard),
            (10, Discard),
            (17, Discard),
            (18, Discard),
            (29, Discard),
            (32, Discard),
            (35, Discard),
            (45, Discard),
            (87, Discard),
            (134, Discard),
            (-2, Discard),
            (i16::MAX, Discard),
        ];
        for (code, action) in cases {
            assert_eq!(classify(code), action, "{code} {}", error_name(code));
        }
    }

    #[test]
    fn every_retriable_code_is_retried_somehow_and_nothing_else_is() {
        for code in i16::MIN..=i16::MAX {
            let action = classify(code);
            if code == 129 {
                assert_eq!(action, ErrorAction::RefreshAndReroute);
            } else {
                assert_eq!(action != ErrorAction::Discard, is_retriable(code), "{code}");
            }
        }
    }
}

/// The whole classification as a Markdown table (doc/errors.md is generated from it, and a
/// test keeps the two equal).
pub fn table_markdown() -> String {
    let mut out =
        String::from("| Code | Name | Kafka: retriable | dory's action |\n|---:|---|---|---|\n");
    for &(code, name, retriable) in TABLE.iter().filter(|(c, _, _)| *c != NONE) {
        let action = match classify(code) {
            ErrorAction::Retry => "retry on the same broker",
            ErrorAction::RefreshAndReroute => "refresh metadata, reroute",
            ErrorAction::Backoff => "retry after backoff",
            ErrorAction::Discard => "discard (`kafka_error`)",
        };
        let doubt = if may_be_written(code) {
            " (may be written: in doubt, as after a lost connection)"
        } else {
            ""
        };
        let r = if retriable { "yes" } else { "no" };
        out.push_str(&format!("| {code} | {name} | {r} | {action}{doubt} |\n"));
    }
    out.push_str("| any other | (unknown) | no | discard (`kafka_error`) |\n");
    out
}

#[cfg(test)]
mod doc_tests {
    #[test]
    fn doc_errors_md_matches_the_code() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("doc/errors.md");
        let doc = std::fs::read_to_string(&path).expect("doc/errors.md exists");
        for table in [super::table_markdown(), super::sequence_table_markdown()] {
            assert!(
                doc.contains(&table),
                "doc/errors.md is out of date; regenerate its table with:\n{table}"
            );
        }
    }
}

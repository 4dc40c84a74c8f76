//! Injected Produce errors: each error code the broker can answer, retried, backed off,
//! rerouted or discarded as the error table says.

use super::*;

/// How the daemon must treat an injected error code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// Resent (same broker, after a backoff, or after a metadata refresh): nothing lost.
    Retriable,
    /// Discarded as `kafka_error`.
    Discard,
}

/// Attempt limit for the retriable scenarios: above the errors injected, so no message
/// can reach it.
const RETRIABLE_LIMIT: u32 = 20;
/// Errors injected per burst, and bursts per scenario (mid-stream, 0.8 s apart).
const RETRIABLE_BURST: usize = 5;
const DISCARD_BURST: usize = 2;
const BURSTS: usize = 3;

/// Injects Produce errors `codes` (cycled) mid-stream into the next requests, cluster-wide,
/// in [`BURSTS`] bursts, while 3000 messages flow over 3 s. `counters` are Dory's per-code
/// ack-error counters whose sum must reach the number injected (each injected error fails
/// every partition of one request).
fn produce_error_scenario(
    name: &'static str,
    codes: &[RDKafkaRespErr],
    counters: &[&str],
    class: Class,
    seed: u64,
) {
    let settings = Settings {
        max_failed_attempts: (class == Class::Retriable).then_some(RETRIABLE_LIMIT),
        ..Settings::default()
    };
    let burst = match class {
        Class::Retriable => RETRIABLE_BURST,
        Class::Discard => DISCARD_BURST,
    };
    let injected = burst * BURSTS;
    if class == Class::Retriable {
        assert!(
            injected < RETRIABLE_LIMIT as usize,
            "test bug: too many errors"
        );
    }
    let mut sc = Scenario::start(name, settings);
    let msgs = traffic(seed, 3000, 0);
    let mut k = 0usize;
    sc.drive(&msgs, Duration::from_millis(3000), |mock, f| {
        for b in 0..BURSTS {
            let errs: Vec<RDKafkaRespErr> = (0..burst)
                .map(|_| {
                    k += 1;
                    codes[(k - 1) % codes.len()]
                })
                .collect();
            f.at(600 + 800 * b as u64, "request_errors", || {
                mock.cluster().request_errors(RDKafkaApiKey::Produce, &errs)
            });
        }
    });
    let fin = sc.drain(&msgs);
    let mut problems = Vec::new();
    let mut seen = 0u64;
    for c in counters {
        match sc.counter(c) {
            Ok(n) => seen += n,
            Err(e) => problems.push(e),
        }
    }
    if seen < injected as u64 {
        problems.push(format!(
            "dory's counters {counters:?} total {seen}, fewer than the {injected} errors \
             injected: the fault did not reach it as expected"
        ));
    }
    let expect = match class {
        Class::Retriable => Expect {
            no_duplicates: true,
            no_possible_duplicates: true,
            ..Expect::default()
        },
        Class::Discard => Expect {
            allowed: vec![KAFKA_ERROR],
            required: vec![KAFKA_ERROR],
            no_duplicates: true,
            no_possible_duplicates: true,
            ..Expect::default()
        },
    };
    let notes = format!("injected={injected} error_acks={seen}");
    sc.verify(&msgs, &fin, &expect, problems, &notes);
}

#[test]
fn produce_error_2_corrupt_message_is_resent() {
    produce_error_scenario(
        "produce_error_2_corrupt_message",
        &[E::RD_KAFKA_RESP_ERR_INVALID_MSG],
        &["AckErrorCorruptMessage"],
        Class::Retriable,
        0xFA_0002,
    );
}

#[test]
fn produce_error_6_not_leader_refreshes_and_reroutes() {
    produce_error_scenario(
        "produce_error_6_not_leader_or_follower",
        &[E::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION],
        &["AckErrorNotLeaderForPartition"],
        Class::Retriable,
        0xFA_0006,
    );
}

#[test]
fn produce_error_7_request_timed_out_backs_off() {
    produce_error_scenario(
        "produce_error_7_request_timed_out",
        &[E::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT],
        &["AckErrorRequestTimedOut"],
        Class::Retriable,
        0xFA_0007,
    );
}

#[test]
fn produce_error_13_network_exception_backs_off() {
    produce_error_scenario(
        "produce_error_13_network_exception",
        &[E::RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION],
        &["AckErrorNetworkException"],
        Class::Retriable,
        0xFA_0013,
    );
}

#[test]
fn produce_error_19_not_enough_replicas_backs_off() {
    produce_error_scenario(
        "produce_error_19_not_enough_replicas",
        &[E::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS],
        &["AckErrorNotEnoughReplicas"],
        Class::Retriable,
        0xFA_0019,
    );
}

#[test]
fn produce_error_20_not_enough_replicas_after_append_backs_off() {
    produce_error_scenario(
        "produce_error_20_not_enough_replicas_after_append",
        &[E::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND],
        &["AckErrorNotEnoughReplicasAfterAppend"],
        Class::Retriable,
        0xFA_0020,
    );
}

/// The other leadership codes (3, 5, 74, 75) and KAFKA_STORAGE_ERROR (56), interleaved.
#[test]
fn produce_errors_3_5_74_75_56_are_retried() {
    produce_error_scenario(
        "produce_errors_3_5_74_75_56_mixed",
        &[
            E::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART,
            E::RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
            E::RD_KAFKA_RESP_ERR_FENCED_LEADER_EPOCH,
            E::RD_KAFKA_RESP_ERR_UNKNOWN_LEADER_EPOCH,
            E::RD_KAFKA_RESP_ERR_KAFKA_STORAGE_ERROR,
        ],
        // Codes above 43 have no counter of their own in Dory's catalogue.
        &[
            "AckErrorUnknownTopicOrPartition",
            "AckErrorLeaderNotAvailable",
            "AckErrorUndocumented",
        ],
        Class::Retriable,
        0xFA_0335,
    );
}

#[test]
fn produce_error_10_message_too_large_is_discarded() {
    produce_error_scenario(
        "produce_error_10_message_too_large",
        &[E::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE],
        &["AckErrorMessageTooLarge"],
        Class::Discard,
        0xFA_0010,
    );
}

#[test]
fn produce_error_29_topic_authorization_failed_is_discarded() {
    produce_error_scenario(
        "produce_error_29_topic_authorization_failed",
        &[E::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED],
        &["AckErrorTopicAuthorizationFailed"],
        Class::Discard,
        0xFA_0029,
    );
}

#[test]
fn produce_error_87_invalid_record_is_discarded() {
    produce_error_scenario(
        "produce_error_87_invalid_record",
        &[E::RD_KAFKA_RESP_ERR_INVALID_RECORD],
        &["AckErrorUndocumented"],
        Class::Discard,
        0xFA_0087,
    );
}

/// More consecutive retriable errors than the attempt limit (2): 200 REQUEST_TIMED_OUT
/// answers in a row, cluster-wide, mid-stream. Messages caught in them must be discarded as
/// `attempt_limit` — and nothing else lost. A Kafka leader answers REQUEST_TIMED_OUT after
/// it appended (its replicas were slow), so each of those messages is in doubt: every one
/// discarded must also count as a possible duplicate (it may be stored all the same), and
/// the producer reset its discard forces counts those held in doubt with it. (The mock
/// wrote none of them: nothing is consumed twice.)
#[test]
fn attempt_limit_discards_after_consecutive_errors() {
    let settings = Settings {
        max_failed_attempts: Some(2),
        retry_backoff_ms: 20,
        retry_backoff_max_ms: 200,
        ..Settings::default()
    };
    let injected = 200usize;
    let mut sc = Scenario::start("attempt_limit_consecutive_errors", settings);
    let msgs = traffic(0xFA_A771, 3000, 0);
    sc.drive(&msgs, Duration::from_millis(3000), |mock, f| {
        f.at(800, "request_errors", || {
            mock.cluster().request_errors(
                RDKafkaApiKey::Produce,
                &vec![E::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT; injected],
            )
        });
    });
    let fin = sc.drain(&msgs);
    let mut problems = Vec::new();
    let seen = sc.counter("AckErrorRequestTimedOut").unwrap_or_else(|e| {
        problems.push(e);
        0
    });
    if seen < injected as u64 {
        problems.push(format!(
            "AckErrorRequestTimedOut = {seen}, fewer than the {injected} errors injected"
        ));
    }
    for t in TOPICS {
        let (discarded, possible) = (fin.discarded(t, ATTEMPT_LIMIT), fin.possible_duplicates(t));
        if possible < discarded {
            problems.push(format!(
                "{t}: {discarded} discarded after REQUEST_TIMED_OUT (in doubt), only {possible} \
                 counted as possible duplicates"
            ));
        }
    }
    let expect = Expect {
        allowed: vec![ATTEMPT_LIMIT],
        required: vec![ATTEMPT_LIMIT],
        no_duplicates: true,
        possible_duplicates_required: true,
        ..Expect::default()
    };
    let notes = format!("injected={injected} error_acks={seen} limit=2");
    sc.verify(&msgs, &fin, &expect, problems, &notes);
}

/// The limit's boundary, one message at a time (each Produce request then carries exactly
/// that message): with `max_failed_delivery_attempts = 2`, a message answered with 2 errors
/// is delivered on its 3rd attempt; one answered with 3 errors is discarded as
/// `attempt_limit` (Dory's rule: discarded when its failed attempts exceed the limit).
#[test]
fn attempt_limit_boundary_is_exact() {
    const LIMIT: u32 = 2;
    let settings = Settings {
        max_failed_attempts: Some(LIMIT),
        retry_backoff_ms: 20,
        retry_backoff_max_ms: 200,
        ..Settings::default()
    };
    let mut sc = Scenario::start("attempt_limit_boundary", settings);
    let mut msgs = traffic(0xFA_B0DE, 2, 0);
    for m in &mut msgs {
        m.input = Input::Dgram;
        m.topic = TOPICS[0].to_string();
    }
    let sender = DgramSender::new(&sc.ep.dgram);
    let code = E::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS;
    for (i, m) in msgs.iter().enumerate() {
        let errors = LIMIT as usize + i; // 2 then 3
        sc.cluster()
            .request_errors(RDKafkaApiKey::Produce, &vec![code; errors]);
        sender.send(&m.encode());
        sc.drain(&msgs[..=i]);
    }
    let fin = sc.dory.assert_invariant();
    let mut problems = Vec::new();
    match sc.counter("AckErrorNotEnoughReplicas") {
        Ok(n) if n == 2 * LIMIT as u64 + 1 => {}
        Ok(n) => problems.push(format!(
            "AckErrorNotEnoughReplicas = {n}, expected {} (one per injected error)",
            2 * LIMIT + 1
        )),
        Err(e) => problems.push(e),
    }
    if fin.delivered(TOPICS[0]) != 1 {
        problems.push(format!(
            "delivered = {}, expected 1 (the message that failed {LIMIT} times)",
            fin.delivered(TOPICS[0])
        ));
    }
    let expect = Expect {
        allowed: vec![ATTEMPT_LIMIT],
        exact: vec![(ATTEMPT_LIMIT, 1)],
        no_duplicates: true,
        no_possible_duplicates: true,
        ..Expect::default()
    };
    sc.verify(&msgs, &fin, &expect, problems, "limit=2 errors=2,3");
}

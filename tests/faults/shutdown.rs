//! SIGTERM while a broker is down.

use super::*;

/// SIGTERM once every message is received, with `down` (a broker id, or -1 for all) down
/// since `down_at_ms` and still down. dory must deliver what it can until
/// `shutdown_max_delay_ms` (2 s), count the rest as `shutdown` and exit 0. The final counts
/// are read from the last /metrics scrape that shows nothing in flight (the status server
/// lives until the very end of shutdown). `shutdown_required`: messages must be left at
/// the deadline (so the deadline itself is exercised).
fn sigterm_scenario(
    name: &'static str,
    down: i32,
    down_at_ms: u64,
    shutdown_required: bool,
    vanishing_brokers: Vec<i32>,
    seed: u64,
) {
    let settings = Settings::default();
    let delay = Duration::from_millis(settings.shutdown_max_delay_ms);
    let mut sc = Scenario::start(name, settings);
    let msgs = traffic(seed, 3000, 0);
    let what = format!("broker_down({down})");
    sc.drive(&msgs, Duration::from_millis(2500), |mock, f| {
        f.at(down_at_ms, &what, || mock.cluster().broker_down(down))
            .expect("broker_down");
    });
    wait_received(&mut sc.dory, &per_topic(&msgs));
    let before = sc.dory.assert_invariant();
    let held: u64 = TOPICS.iter().map(|t| before.in_flight(t)).sum();

    let t0 = Instant::now();
    sc.dory.sigterm();
    let mut final_m: Option<Metrics> = None;
    let mut last_m: Option<Metrics> = None;
    let mut problems = Vec::new();
    let status: Option<ExitStatus> = loop {
        if let Some(s) = sc.dory.try_exit() {
            break Some(s);
        }
        if t0.elapsed() > delay + EXIT_TIMEOUT {
            break None;
        }
        if let Ok((200, body)) = http_get(sc.ep.status, "/metrics", Duration::from_millis(500)) {
            if let Ok(m) = Metrics::parse(&body) {
                for v in m.invariant_violations() {
                    problems.push(format!("during shutdown: {v}"));
                }
                if TOPICS.iter().all(|t| m.in_flight(t) == 0) {
                    final_m = Some(m.clone());
                }
                last_m = Some(m);
            }
        }
        thread::sleep(Duration::from_millis(5));
    };
    let took = t0.elapsed();
    match status {
        None => {
            problems.push(format!(
                "dory did not exit within {:?} of SIGTERM (shutdown_max_delay_ms = {})",
                delay + EXIT_TIMEOUT,
                delay.as_millis()
            ));
            let _ = sc.dory.wait_exit(Duration::ZERO);
        }
        Some(s) if s.code() != Some(0) => problems.push(format!("exit status after SIGTERM: {s}")),
        Some(_) => {}
    }
    if took > delay + Duration::from_secs(3) {
        problems.push(format!(
            "exit {took:?} after SIGTERM, shutdown_max_delay_ms is {}",
            delay.as_millis()
        ));
    }
    let logs = sc.dory.logs();
    // The daemon's last line: "stopped: received R, delivered D, discarded [...], in flight N".
    let stopped = logs.lines().find(|l| l.contains("stopped: received "));
    if !stopped.is_some_and(|l| l.trim_end().ends_with(", in flight 0")) {
        problems.push(format!(
            "daemon log lacks a final \"stopped: ..., in flight 0\" line (got {stopped:?})"
        ));
    }
    let fin = match final_m {
        Some(m) => m,
        None => {
            problems.push(
                "no /metrics scrape after SIGTERM showed in_flight 0: final counts unknown \
                 (using the last scrape)"
                    .into(),
            );
            last_m.unwrap_or(before.clone())
        }
    };
    let shutdown: u64 = TOPICS.iter().map(|t| fin.discarded(t, SHUTDOWN)).sum();
    if shutdown > 0 && took + Duration::from_millis(100) < delay {
        problems.push(format!(
            "{shutdown} message(s) discarded as shutdown only {took:?} after SIGTERM, before \
             shutdown_max_delay_ms ({})",
            delay.as_millis()
        ));
    }
    // The downed brokers' logs are intact; bring them back to read every partition.
    sc.cluster().broker_up(down).expect("broker_up");
    let expect = Expect {
        allowed: vec![SHUTDOWN],
        required: if shutdown_required {
            vec![SHUTDOWN]
        } else {
            Vec::new()
        },
        vanishing_brokers,
        ..Expect::default()
    };
    let notes = format!(
        "held_at_sigterm={held} exit_after={:.2}s",
        took.as_secs_f64()
    );
    sc.verify(&msgs, &fin, &expect, problems, &notes);
}

/// The scenario: broker 2 (leader of partitions 1 and 4) down, then SIGTERM. The
/// mock drops a down broker from Metadata, so dory reroutes (PartitionKey messages over the
/// partitions with a known leader) and little or nothing may be left at the deadline;
/// whatever is left must be counted `shutdown`, and the exit must come within the delay.
#[test]
fn sigterm_while_a_broker_is_down() {
    sigterm_scenario(
        "sigterm_while_broker_down",
        2,
        2300,
        false,
        vec![2],
        0xFA_5167,
    );
}

/// Every broker down (metadata unreachable too) from 1.5 s, then SIGTERM: what arrived
/// since is held, delivered to nobody, and must be counted `shutdown` at the 2 s deadline.
#[test]
fn sigterm_while_all_brokers_are_down() {
    sigterm_scenario(
        "sigterm_while_all_brokers_down",
        -1,
        1500,
        true,
        Vec::new(),
        0xFA_5168,
    );
}

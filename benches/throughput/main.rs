//! dory's throughput benchmark (doc/performance.md): its entry point and docs. One command:
//!
//! ```sh
//! cargo bench --bench throughput                 # 1M msgs, 1 and 10 topics, 3 runs, all targets
//! cargo bench --bench throughput -- --topics 1 --targets ceiling,sink --messages 200000
//! cargo bench --bench throughput -- --help
//! ```
//!
//! Each run sends `--messages` AnyPartition datagrams (100-byte values: 139-byte datagrams)
//! with `sendmmsg`, 32 per call, to a UNIX datagram socket, and measures, in turn:
//!
//! - `ceiling`: a trivial `recvmmsg` receiver that only counts, polling briefly before it
//!   sleeps — what the machine can move through the socket at all (`blocking`, the same
//!   without polling, and `recv`, one blocking call per datagram, on request);
//! - `sink`: the real dory daemon delivering to a minimal counting Kafka broker kept in
//!   this benchmark (`sink.rs`), which isolates the daemon's own cost;
//! - `sink-scraped`: the same while `/metrics` is fetched (gzip) once a second
//!   (`scraper.rs`): the scrape's time and what it costs the input;
//! - `stream-one` and `stream-many`: the same messages through dory's stream inputs, from
//!   one UNIX stream client or from `--clients` UNIX stream and `--clients` TCP clients at
//!   once (`stream_sender.rs`), with each client's rate;
//! - `tansu`: dory delivering to Tansu, a real Kafka-compatible broker (in-memory storage);
//! - `rdkafka`: no dory: the application links librdkafka and produces the same messages
//!   straight to the counting sink, in a process of its own (`rdk.rs`), with dory's
//!   acks, idempotence, linger, batch size and codec.
//!
//! Besides dory's CPU, the table shows the producing application's (the sender thread, or
//! the librdkafka process) and, from dory's `/metrics` histogram, receipt →
//! acknowledgement latency p50/p99 (librdkafka: send → delivery report).
//!
//! Throughput is messages / (first send → last record counted by the sink, or dory's
//! `/metrics` showing all settled, polled every 20 ms, for Tansu). Daemon CPU is utime + stime from
//! `/proc/<pid>/stat` between "ready" and "all settled"; peak RSS is VmHWM. After each run
//! the accounting invariant is checked on `/metrics` (also every 250 ms during the run) and
//! discards are reported by reason. The table shows medians over `--runs`.
//!
//! Under dory's row, "sustained" is messages / the sender's duration, the clock the ceiling
//! is timed by (the ceiling's receiver gets the last datagram when the sender sends it).
//! End to end also counts the delivery tail: the final partial batches wait out the batch
//! time, a fixed latency (100 ms by default, 5-7 % of a 1M-message run) that a longer run
//! would dilute. The sender blocks whenever dory does not take its datagrams, so its
//! duration is dory's intake; a run counts as sustained only if dory also kept up with
//! delivery: its tail no longer than the batch time plus 25 ms. Both are checked against
//! the targets; the end-to-end figure stays the table's.
//!
//! Paced (`--rate`), dory's CPU is judged against the `blocking` receiver's, paced alike
//! in the same run, when that target is given: the busy-polling ceiling spins between
//! bursts, and even a receiver that does nothing pays more per message paced than at full
//! speed (a sleep and a wake-up per burst).
//!
//! This file holds the entry point. The options are in `opts.rs`, what is derived from
//! them before the first run in `settings.rs`, the run loop in `driver.rs`, one run of each
//! kind of target in `case_ceiling.rs`, `case_dory.rs` and `case_rdkafka.rs` (sharing
//! `case_common.rs`), and the printing in `report.rs`.

mod case_ceiling;
mod case_common;
mod case_dory;
mod case_rdkafka;
mod ceiling;
/// The integration tests' harness, for what the bench shares with them (locating and
/// installing Tansu, the HTTP client).
#[path = "../../tests/common/mod.rs"]
mod common;
mod driver;
mod environment;
mod latency;
mod opts;
mod procs;
mod rdk;
mod report;
mod run_result;
mod scraper;
mod sender;
mod settings;
mod sink;
mod stream_sender;
mod tansu;
mod thread_usage;

use clap::Parser;

use opts::Opts;
use settings::Ctx;

fn main() {
    // The librdkafka target's producer process is this executable, started again.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(rdk::CHILD_FLAG) {
        let spec = args.get(2).map_or("", String::as_str);
        std::process::exit(rdk::child_main(spec));
    }
    let o = Opts::parse();
    if let Err(e) = real_main(o) {
        eprintln!("throughput: {e}");
        std::process::exit(1);
    }
}

fn real_main(o: Opts) -> Result<(), String> {
    let ctx = Ctx::new(&o)?;
    let env = environment::environment(ctx.dory.as_deref());
    report::header(&ctx, &env);
    driver::run_all(&ctx);
    Ok(())
}

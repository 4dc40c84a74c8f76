//! The run loop: every topic count in turn ([`run_all`]) and, within one, every run of
//! every target, each handed to its case and reported as it ends ([`run_config`]).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::opts::Target;
use crate::report;
use crate::run_result::RunResult;
use crate::sender::Load;
use crate::settings::Ctx;
use crate::{case_ceiling, case_dory, case_rdkafka};

/// Measures every topic count of `--topics`, then checks the topic-count target.
pub fn run_all(ctx: &Ctx) {
    let mut sink_rates = Vec::new();
    for &n in &ctx.o.topics {
        if let Some(rate) = run_config(ctx, n) {
            sink_rates.push((n, rate));
        }
    }
    report::topic_count_targets(ctx, &sink_rates);
}

/// Runs every target `runs` times with `topic_count` topics and prints the table.
/// Returns the sink's median throughput, if measured.
fn run_config(ctx: &Ctx, topic_count: usize) -> Option<f64> {
    let o = ctx.o;
    let width = (topic_count - 1).to_string().len();
    let load = Load {
        count: o.messages,
        value_size: o.value_size,
        topics: (0..topic_count)
            .map(|i| format!("dory-bench{i:0width$}").into_bytes())
            .collect(),
        per_call: o.per_call,
        rate: o.rate,
        text_values: o.text_values,
    };
    ctx.say(&format!(
        "\n== {topic_count} topic(s), {}-byte datagrams ==",
        load.datagram_size()
    ));
    let mut results: BTreeMap<Target, Vec<RunResult>> = BTreeMap::new();
    let stall = Duration::from_secs(o.stall_s);
    for run in 1..=o.runs {
        for &t in &ctx.targets {
            let r = match t {
                Target::Ceiling | Target::Blocking | Target::Recv => {
                    case_ceiling::run_ceiling(&load, t, stall)
                }
                Target::Rdkafka => case_rdkafka::run_rdkafka(o, &load, &ctx.rdkafka_conf, stall),
                _ => case_dory::run_daemon(
                    o,
                    &load,
                    t,
                    ctx.dory.as_deref().expect("dory located"),
                    ctx.tansu_bin.as_deref(),
                    stall,
                    if t == Target::SinkVariant {
                        ctx.variant_batch_time_ms
                    } else {
                        ctx.batch_time_ms
                    },
                ),
            };
            let r = r.unwrap_or_else(|e| RunResult {
                problems: vec![format!("run failed: {e}")],
                ..RunResult::default()
            });
            report::run_line(ctx, run, topic_count, load.datagram_size(), t, &r);
            results.entry(t).or_default().push(r);
        }
    }
    report::summarize(ctx, topic_count, &results)
}

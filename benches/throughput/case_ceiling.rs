//! The ceiling targets (`ceiling`, `blocking`, `recv`): one run of the counting receiver
//! ([`ceiling`]) fed by the sender, as a [`RunResult`].

use std::time::Duration;

use serde_json::json;

use crate::ceiling;
use crate::opts::Target;
use crate::procs::{CpuSnapshot, ScratchDir};
use crate::run_result::RunResult;
use crate::sender::Load;

/// One run of the receiver `t` names, timed from the first send to the last datagram
/// received.
pub fn run_ceiling(load: &Load, t: Target, stall: Duration) -> Result<RunResult, String> {
    let dir = ScratchDir::new("ceiling").map_err(|e| e.to_string())?;
    let mode = match t {
        Target::Recv => ceiling::Mode::Recv,
        Target::Blocking => ceiling::Mode::RecvmmsgBlocking,
        _ => ceiling::Mode::Recvmmsg,
    };
    let before = CpuSnapshot::take(&[]);
    let c =
        ceiling::run(&dir.path().join("c.sock"), load, mode, stall).map_err(|e| e.to_string())?;
    let (other_cores, steal_cores) = before.others_since(&CpuSnapshot::take(&[]));
    let mut extra = serde_json::Map::new();
    extra.insert("receiver_cpu_s".into(), json!(c.receiver_cpu_s));
    extra.insert("sender_secs".into(), json!(c.sender_secs));
    extra.insert("sendmmsg_calls".into(), json!(c.sender_calls));
    extra.insert("sender_cpu_s".into(), json!(c.sender_cpu_s));
    let per_m = |x: u64| x * 1_000_000 / c.received.max(1);
    let mut switches = serde_json::Map::new();
    switches.insert(
        "receiver".into(),
        json!([per_m(c.receiver_switches.0), per_m(c.receiver_switches.1)]),
    );
    switches.insert(
        "sender (app)".into(),
        json!([per_m(c.sender_switches.0), per_m(c.sender_switches.1)]),
    );
    extra.insert(
        "switches_per_million_by_thread".into(),
        serde_json::Value::Object(switches),
    );
    Ok(RunResult {
        msgs_per_s: c.received as f64 / c.secs,
        secs: c.secs,
        cpu_s_per_m: c.receiver_cpu_s / c.received as f64 * 1e6,
        app_cpu_s_per_m: Some(c.sender_cpu_s / c.received as f64 * 1e6),
        other_cores,
        steal_cores,
        extra,
        ..RunResult::default()
    })
}

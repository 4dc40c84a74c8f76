//! A process's threads as `/proc/PID/task/TID/stat` shows them: name, scheduling policy
//! and CPU time, for tests that check what each of dory's threads does.

/// One thread of a process.
#[derive(Clone, Debug)]
pub struct ThreadStat {
    /// The thread's name as the kernel keeps it: at most 15 bytes.
    pub name: String,
    /// Scheduling policy (field 41): 0 SCHED_OTHER, 3 SCHED_BATCH, ...
    pub policy: u32,
    /// utime + stime (fields 14 and 15), in clock ticks.
    pub cpu_ticks: u64,
}

/// Every thread of `pid` whose name starts with `prefix` (empty if the process is gone).
pub fn threads(pid: u32, prefix: &str) -> Vec<ThreadStat> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        // "tid (comm) state ...": the name may hold spaces; fields count from 3 after ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = &stat[open + 1..close];
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
        if let (true, Some(policy), Some(utime), Some(stime)) =
            (name.starts_with(prefix), field(41), field(14), field(15))
        {
            out.push(ThreadStat {
                name: name.to_string(),
                policy: u32::try_from(policy).unwrap_or(u32::MAX),
                cpu_ticks: utime + stime,
            });
        }
    }
    out
}

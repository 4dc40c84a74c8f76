//! The calling thread's own CPU time and context switches (`clock_gettime`,
//! `getrusage`), read around their work by the ceiling's receiver and by the sender: both
//! measure themselves with it, so it sits below both.

/// Thread CPU time (user + system) of the calling thread, in seconds.
pub fn thread_cpu_s() -> f64 {
    // SAFETY: clock_gettime writes a timespec we own.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Context switches of the calling thread so far: (voluntary, involuntary).
pub fn thread_switches() -> (u64, u64) {
    // SAFETY: getrusage writes an rusage we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    (ru.ru_nvcsw as u64, ru.ru_nivcsw as u64)
}

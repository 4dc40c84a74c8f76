//! Cache hints for the hot path: ask the CPU to start loading a line that is about to be
//! written, so the wait for memory overlaps other work instead of stalling the write.
//!
//! dory keeps every message for up to a batch's time limit (100 ms by default) before it
//! is sent, so the memory a new message goes into (a free pool block, the next slot of its
//! topic's open batch) was last touched long ago and is often no longer in cache: with
//! many topics, or batches that take long to fill, the input thread waited for those
//! writes (doc/performance.md, "Round seven"). A prefetch is a hint: it never faults,
//! changes nothing a program can observe, and is free to be ignored.

/// Hints that the 64-byte cache line holding `p` will be used soon. Any address is
/// allowed, even a dangling or out-of-bounds one: a prefetch never faults.
#[inline(always)]
pub fn line<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 reads nothing into the program and never faults, whatever the
    // address; SSE is part of the x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Hints that the `len` bytes from `p` will be used soon: every cache line they touch.
#[inline(always)]
pub fn bytes<T>(p: *const T, len: usize) {
    let p = p.cast::<u8>();
    each_line(p as usize, len, |offset| line(p.wrapping_add(offset)));
}

/// Calls `f` with one offset from `start` into each 64-byte line of `start..start + len`
/// (the first offset wraps below zero, to the start of the first line; `wrapping_add`
/// takes it back).
#[inline(always)]
fn each_line(start: usize, len: usize, mut f: impl FnMut(usize)) {
    if len == 0 {
        return;
    }
    let end = start.saturating_add(len);
    let mut at = start & !63;
    while at < end {
        f(at.wrapping_sub(start));
        // At the very top of the address space there is no next line.
        let Some(next) = at.checked_add(64) else {
            break;
        };
        at = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_of_a_range_is_hinted_once() {
        let lines = |start: usize, len: usize| -> Vec<usize> {
            let mut v = Vec::new();
            each_line(start, len, |o| v.push(start.wrapping_add(o)));
            v
        };
        assert_eq!(lines(128, 128), vec![128, 192]);
        // 88 bytes (a `Msg`) from 40 bytes into a line touch two lines, 89 three.
        assert_eq!(lines(1000, 88), vec![960, 1024]);
        assert_eq!(lines(1000, 89), vec![960, 1024, 1088]);
        assert_eq!(lines(1000, 24), vec![960]);
        assert_eq!(lines(1000, 25), vec![960, 1024]);
        assert!(lines(1000, 0).is_empty());
        // The last line of the address space, without overflowing past it.
        assert_eq!(lines(usize::MAX - 10, 100), vec![usize::MAX & !63]);
        // Any address may be hinted, even one that is not mapped.
        bytes(std::ptr::null::<u64>(), 4096);
        line(std::ptr::dangling::<u8>());
    }
}

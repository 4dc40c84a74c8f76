//! The preallocated message pool (behaviour spec §9): the key and value bytes of every
//! buffered message live in one arena of 128-byte blocks allocated at start, so memory use is
//! fixed up front and input threads never touch the heap per message.
//!
//! Design: the arena holds `blocks × 128` payload bytes; a message longer than one block is
//! a chain of blocks whose links live in a separate `next` array, so a block carries a full
//! 128 bytes of payload. The free blocks are a queue of block numbers behind a `Mutex`:
//! allocating takes from the front, freeing appends, so the block handed out is the one
//! freed longest ago. Under the lock there is only that: one queue entry per block taken,
//! or one copy of the block numbers a batch of leases gathered outside it.
//!
//! Why a queue, oldest first (doc/performance.md, "Round eight"): a block freed just now
//! was read a moment ago by a dispatcher on another core, to encode its batch, so its
//! lines sit in that core's cache, and writing the next message into it must first take
//! them back, a round trip between cores that a prefetch did not hide (under `perf` the
//! input thread stalled on that write more than on anything else of its own). A block
//! freed longest ago is in no core's cache: it comes from memory, and a prefetch issued
//! when the block is handed out hides that. The queue also replaced an intrusive linked
//! list threaded through `next`, whose allocation had to read each link in turn (a cache
//! miss per block that nothing could start early).
//!
//! Ownership: every block is at any moment either on the free list (touched only under the
//! lock) or in exactly one [`Lease`] (touched only through that lease: `&mut` to write, `&`
//! to read). That invariant is what makes the unsafe arena accesses below sound.

use std::collections::VecDeque;
use std::fmt;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Not a block: block numbers stay below it.
const NIL: u32 = u32::MAX;

/// Byte written over the whole arena at start. Not zero on purpose: a zero fill may be turned
/// into lazily mapped zero pages (`calloc`), which would not commit the memory now.
const FILL: u8 = 0xA5;

/// Errors creating the pool; both are fatal at start.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("message pool of {bytes} bytes is too large (at most {max} bytes)")]
    TooLarge { bytes: usize, max: usize },
    #[error("cannot allocate message pool of {bytes} bytes")]
    Alloc { bytes: usize },
}

/// The process-wide message pool. Created once by [`Pool::new_static`] and never freed.
pub struct Pool {
    /// `blocks * BLOCK_SIZE` initialised bytes, leaked: valid for the life of the process.
    arena: NonNull<u8>,
    /// `next[b]` is the block after `b` in its lease's chain, set for all but a chain's
    /// last block. Chains are walked by their length, never to a terminator, so the link
    /// of a free block or of a chain's last block is never read (and is zero until first
    /// set).
    /// Atomic only so that sharing the array needs no unsafe code; every access is `Relaxed`
    /// because ordering comes from the free-list mutex and from handing leases over channels.
    next: Box<[AtomicU32]>,
    blocks: usize,
    free: Mutex<FreeList>,
    /// Copy of the free queue's length, so metrics can read it without the lock.
    free_blocks: AtomicUsize,
}

struct FreeList {
    /// Free block numbers, in the order they were freed: the front is handed out first.
    queue: VecDeque<u32>,
}

// SAFETY: `Pool` is `!Send`/`!Sync` only because of the raw `arena` pointer. The arena is
// never freed, and its bytes are reached only through `Lease`, each block by at most one
// lease at a time (see the module doc): writes need `&mut Lease`, reads `&Lease`, so Rust's
// aliasing rules hold per block. All other state is atomics or behind the mutex.
unsafe impl Send for Pool {}
// SAFETY: as for `Send` above.
unsafe impl Sync for Pool {}

/// `n` links, all zero, allocated zeroed so that the allocator may hand out fresh pages it
/// knows are zero (a large `calloc` is a new mapping, committed only where written).
/// `None` if the memory cannot be had.
fn zeroed_links(n: usize) -> Option<Box<[AtomicU32]>> {
    if n == 0 {
        return Some(Box::new([]));
    }
    let layout = std::alloc::Layout::array::<AtomicU32>(n).ok()?;
    // SAFETY: `layout` has a non-zero size (`n > 0`, and `AtomicU32` is 4 bytes).
    let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<AtomicU32>();
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` was allocated by the global allocator with the layout of `[AtomicU32; n]`,
    // which is the layout `Box<[AtomicU32]>` of length `n` frees with; every byte is zero,
    // and an all-zero `AtomicU32` (same layout as `u32`) is a valid value, 0.
    Some(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, n)) })
}

impl Pool {
    /// Size of one block; every message occupies at least one.
    pub const BLOCK_SIZE: usize = 128;

    /// Allocates a pool of `max(1, capacity_bytes / 128)` blocks, commits every page of it
    /// (so a lack of memory shows now, not later), and leaks it: the pool lives for the
    /// rest of the process.
    pub fn new_static(capacity_bytes: usize) -> Result<&'static Pool, PoolError> {
        let blocks = (capacity_bytes / Self::BLOCK_SIZE).max(1);
        // Block indices must stay below `NIL`.
        let max_blocks = NIL as usize;
        if blocks > max_blocks {
            return Err(PoolError::TooLarge {
                bytes: capacity_bytes,
                max: max_blocks * Self::BLOCK_SIZE,
            });
        }
        let bytes = blocks * Self::BLOCK_SIZE;
        let alloc_err = |_| PoolError::Alloc { bytes };

        let mut arena: Vec<u8> = Vec::new();
        arena.try_reserve_exact(bytes).map_err(alloc_err)?;
        // Writing every byte commits every page now (see `FILL`).
        arena.resize(bytes, FILL);
        // Not written now: a link is set only when a message takes more than one block,
        // and the pages of links never set stay unmapped zero pages (4 MiB per 128 MiB of
        // pool that messages of up to 128 bytes never commit).
        let next = zeroed_links(blocks).ok_or(PoolError::Alloc { bytes })?;
        // Every block free, handed out in order: 0, 1, 2, ...
        let mut queue = VecDeque::new();
        queue.try_reserve_exact(blocks).map_err(alloc_err)?;
        queue.extend((0..blocks).map(index));

        let arena = NonNull::new(Box::into_raw(arena.into_boxed_slice()).cast::<u8>())
            .expect("Box::into_raw never returns null");
        Ok(Box::leak(Box::new(Pool {
            arena,
            next,
            blocks,
            free: Mutex::new(FreeList { queue }),
            free_blocks: AtomicUsize::new(blocks),
        })))
    }

    /// Takes the blocks for a message of `len` bytes (at least one block, even for zero).
    /// `None` if not enough blocks are free: the caller discards the new message; nothing
    /// already buffered is ever evicted.
    pub fn alloc(&'static self, len: usize) -> Option<Lease> {
        let mut free = self.lock_free_list();
        let lease = self.take(&mut free.queue, len);
        self.unlock_after_take(free);
        lease
    }

    /// Allocates for each length in turn, as [`Pool::alloc`] would one call at a time, but
    /// taking the lock once: each `out` entry is the lease for that length, or `None` if
    /// the pool had too few free blocks left for it (later, smaller ones may still fit, as
    /// they would one by one). An input allocates a whole `recvmmsg` batch this way, sparing
    /// two atomic operations per message, each of which waited for the CPU's store buffer
    /// to drain the previous message's copy into cold pool blocks.
    pub fn alloc_each(
        &'static self,
        lens: impl IntoIterator<Item = usize>,
        out: &mut Vec<Option<Lease>>,
    ) {
        let mut free = self.lock_free_list();
        for len in lens {
            out.push(self.take(&mut free.queue, len));
        }
        self.unlock_after_take(free);
    }

    /// Takes the blocks for `len` bytes off the front of the free queue (the caller holds
    /// the lock), chained in `next`; `None`, taking nothing, if too few are free.
    fn take(&'static self, queue: &mut VecDeque<u32>, len: usize) -> Option<Lease> {
        let needed = blocks_for(len);
        if needed > queue.len() {
            return None;
        }
        let mut blocks = queue.drain(..needed);
        let head = blocks.next()?;
        let mut prev = head;
        for b in blocks {
            self.set_link(prev, b);
            prev = b;
        }
        Some(Lease {
            pool: self,
            head,
            len,
        })
    }

    /// Returns many leases to the pool taking the lock once: their block numbers are
    /// gathered outside the lock, then appended to the free queue. Dropping a `Lease` frees
    /// it too (one lock each); use this where leases are released in batches.
    pub fn free_many(&'static self, leases: impl IntoIterator<Item = Lease>) {
        let leases = leases.into_iter();
        // Released on drop, so the blocks gathered so far return even if `leases` panics.
        let mut batch = Batch {
            pool: self,
            blocks: Vec::with_capacity(leases.size_hint().0),
        };
        for lease in leases {
            if !std::ptr::eq(lease.pool, self) {
                // Belongs to another pool: let it free itself there.
                drop(lease);
                continue;
            }
            let lease = ManuallyDrop::new(lease);
            lease.blocks_into(&mut batch.blocks);
        }
    }

    /// Total size of the pool: blocks × 128.
    pub fn capacity_bytes(&self) -> usize {
        self.blocks * Self::BLOCK_SIZE
    }

    /// Bytes in free blocks (lock-free read, for metrics).
    pub fn free_bytes(&self) -> usize {
        self.free_blocks.load(Ordering::Relaxed) * Self::BLOCK_SIZE
    }

    /// Bytes in leased blocks, at block granularity.
    pub fn used_bytes(&self) -> usize {
        self.capacity_bytes() - self.free_bytes()
    }

    /// Publishes the free queue's length after blocks were taken, releases the lock, and
    /// asks for the next block to be handed out to be brought into cache.
    fn unlock_after_take(&self, free: MutexGuard<'_, FreeList>) {
        self.free_blocks.store(free.queue.len(), Ordering::Relaxed);
        let next = free.queue.front().copied();
        drop(free);
        if let Some(next) = next {
            self.prefetch(next);
        }
    }

    /// Appends blocks to the free queue (`append` pushes them) under the lock.
    fn release(&self, append: impl FnOnce(&mut VecDeque<u32>)) {
        let mut free = self.lock_free_list();
        append(&mut free.queue);
        self.free_blocks.store(free.queue.len(), Ordering::Relaxed);
    }

    fn lock_free_list(&self) -> MutexGuard<'_, FreeList> {
        // Nothing under this lock can panic, so a poisoned lock still guards a consistent
        // free list.
        self.free.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn link(&self, block: u32) -> u32 {
        self.next[block as usize].load(Ordering::Relaxed)
    }

    fn set_link(&self, block: u32, next: u32) {
        self.next[block as usize].store(next, Ordering::Relaxed);
    }

    /// Asks the CPU to bring the next free block (the next allocation's first block, whose
    /// bytes are about to be written) into cache. The block was last written and read long
    /// ago (a message batched, sent and acknowledged), so without this the next message's
    /// copy into it waits for memory; with it, the wait overlaps the work between two
    /// messages.
    #[inline]
    fn prefetch(&self, block: u32) {
        if (block as usize) < self.blocks {
            crate::prefetch::bytes(self.block_ptr(block), Self::BLOCK_SIZE);
        }
    }

    /// Start of `block` in the arena.
    fn block_ptr(&self, block: u32) -> *mut u8 {
        let block = block as usize;
        assert!(block < self.blocks, "block index lies within the arena");
        // SAFETY: `block < blocks`, so the offset stays inside the arena allocation.
        unsafe { self.arena.as_ptr().add(block * Self::BLOCK_SIZE) }
    }
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("capacity_bytes", &self.capacity_bytes())
            .field("free_bytes", &self.free_bytes())
            .finish_non_exhaustive()
    }
}

/// Blocks taken by a message of `len` bytes.
fn blocks_for(len: usize) -> usize {
    len.div_ceil(Pool::BLOCK_SIZE).max(1)
}

fn index(block: usize) -> u32 {
    u32::try_from(block).expect("block count was checked against NIL at start")
}

/// Blocks on their way back to the free queue.
struct Batch {
    pool: &'static Pool,
    blocks: Vec<u32>,
}

impl Drop for Batch {
    fn drop(&mut self) {
        if !self.blocks.is_empty() {
            self.pool.release(|q| q.extend(self.blocks.iter().copied()));
        }
    }
}

/// The pool blocks holding one message's key+value bytes. Owns its blocks: not `Clone`,
/// and dropping it returns them to the pool.
pub struct Lease {
    pool: &'static Pool,
    head: u32,
    len: usize,
}

impl Lease {
    /// Length in bytes asked for at allocation.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `data` into the lease at `offset`. Walks the chain from the start, so write
    /// each field once (key, then value) rather than byte by byte.
    ///
    /// Panics if `offset + data.len() > self.len()`: the caller sized the lease.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) {
        self.check_range(offset, data.len());
        if data.is_empty() {
            return;
        }
        let mut block = self.nth_block(offset / Pool::BLOCK_SIZE);
        let mut at = offset % Pool::BLOCK_SIZE;
        let mut rest = data;
        loop {
            let n = rest.len().min(Pool::BLOCK_SIZE - at);
            let (now, later) = rest.split_at(n);
            self.block_mut(block)[at..at + n].copy_from_slice(now);
            rest = later;
            if rest.is_empty() {
                return;
            }
            block = self.pool.link(block);
            at = 0;
        }
    }

    /// The bytes `[start, start + len)` as consecutive slices, one per block touched.
    ///
    /// Panics if the range is not within `0..self.len()`.
    pub fn chunks(&self, start: usize, len: usize) -> Chunks<'_> {
        self.check_range(start, len);
        let block = if len == 0 {
            // Nothing will be read; `start` may even be one past the last block.
            NIL
        } else {
            self.nth_block(start / Pool::BLOCK_SIZE)
        };
        Chunks {
            lease: self,
            block,
            at: start % Pool::BLOCK_SIZE,
            remaining: len,
        }
    }

    /// Appends the bytes `[start, start + len)` to `out`.
    ///
    /// Panics if the range is not within `0..self.len()`.
    pub fn copy_to(&self, start: usize, len: usize, out: &mut Vec<u8>) {
        out.reserve(len);
        for chunk in self.chunks(start, len) {
            out.extend_from_slice(chunk);
        }
    }

    /// Asks the CPU to start loading the first block, which is about to be read: a batch
    /// waits in memory long enough for its bytes to leave the caches, and the encoder's
    /// copies would otherwise stall on every message in turn.
    #[inline]
    pub fn prefetch(&self) {
        if self.len == 0 {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let p = self.pool.block_ptr(self.head).cast::<i8>().cast_const();
            // SAFETY: SSE is part of the x86_64 baseline, and a prefetch is only a hint
            // that never faults (these addresses are inside the arena anyway). A block is
            // two cache lines.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(p);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64));
            }
        }
    }

    /// The pool this lease belongs to (for freeing many leases at once).
    pub fn pool(&self) -> &'static Pool {
        self.pool
    }

    /// All bytes of the lease in a new `Vec` (tests, discard samples).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len);
        self.copy_to(0, self.len, &mut out);
        out
    }

    fn check_range(&self, start: usize, len: usize) {
        let end = start.checked_add(len);
        assert!(
            end.is_some_and(|end| end <= self.len),
            "byte range {start}+{len} lies within the lease of {} bytes",
            self.len
        );
    }

    /// Appends the lease's block numbers to `out`, in chain order.
    fn blocks_into(&self, out: &mut impl Extend<u32>) {
        let mut block = self.head;
        out.extend([block]);
        for _ in 1..blocks_for(self.len) {
            block = self.pool.link(block);
            out.extend([block]);
        }
    }

    /// The `n`-th block of this lease's chain; `n` must be below its block count.
    fn nth_block(&self, n: usize) -> u32 {
        debug_assert!(n < blocks_for(self.len));
        let mut block = self.head;
        for _ in 0..n {
            block = self.pool.link(block);
        }
        block
    }

    /// `block` must belong to this lease's chain.
    fn block_ref(&self, block: u32) -> &[u8; Pool::BLOCK_SIZE] {
        debug_assert_ne!(block, NIL);
        // SAFETY: the pointer is in bounds (`block_ptr` checks) and the arena is never
        // freed. `block` is in this lease's chain (all callers reach it by walking from
        // `head`), so no other lease and no free-list code touches these bytes, and the
        // only writer, `block_mut`, needs `&mut self`, which cannot coexist with this `&`.
        unsafe { &*self.pool.block_ptr(block).cast::<[u8; Pool::BLOCK_SIZE]>() }
    }

    /// `block` must belong to this lease's chain.
    fn block_mut(&mut self, block: u32) -> &mut [u8; Pool::BLOCK_SIZE] {
        debug_assert_ne!(block, NIL);
        // SAFETY: as in `block_ref`; `&mut self` makes this the only live reference to
        // the block's bytes.
        unsafe { &mut *self.pool.block_ptr(block).cast::<[u8; Pool::BLOCK_SIZE]>() }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.pool.release(|q| self.blocks_into(q));
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("len", &self.len)
            .field("head", &self.head)
            .finish_non_exhaustive()
    }
}

/// Iterator over a byte range of a [`Lease`], one slice per block; see [`Lease::chunks`].
#[derive(Debug)]
pub struct Chunks<'a> {
    lease: &'a Lease,
    block: u32,
    /// Offset of the next byte within `block`.
    at: usize,
    remaining: usize,
}

impl<'a> Iterator for Chunks<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.remaining == 0 {
            return None;
        }
        let n = self.remaining.min(Pool::BLOCK_SIZE - self.at);
        let chunk = &self.lease.block_ref(self.block)[self.at..self.at + n];
        self.remaining -= n;
        if self.remaining > 0 {
            self.block = self.lease.pool.link(self.block);
            self.at = 0;
        }
        Some(chunk)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = (self.at + self.remaining).div_ceil(Pool::BLOCK_SIZE);
        let n = if self.remaining == 0 { 0 } else { n };
        (n, Some(n))
    }
}

impl ExactSizeIterator for Chunks<'_> {}

impl std::iter::FusedIterator for Chunks<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    const B: usize = Pool::BLOCK_SIZE;

    fn pattern(seed: u64, len: usize) -> Vec<u8> {
        // Cheap xorshift so every message's bytes differ.
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn filled(pool: &'static Pool, data: &[u8]) -> Lease {
        let mut lease = pool.alloc(data.len()).expect("pool has room");
        lease.write_at(0, data);
        lease
    }

    #[test]
    fn send_and_sync() {
        fn send<T: Send>() {}
        fn sync<T: Sync>() {}
        send::<Lease>();
        sync::<Pool>();
        send::<&'static Pool>();
    }

    #[test]
    fn capacity_rounds_down_to_blocks_with_at_least_one() {
        assert_eq!(Pool::new_static(0).unwrap().capacity_bytes(), B);
        assert_eq!(Pool::new_static(127).unwrap().capacity_bytes(), B);
        assert_eq!(Pool::new_static(300).unwrap().capacity_bytes(), 2 * B);
        let pool = Pool::new_static(1 << 20).unwrap();
        assert_eq!(pool.capacity_bytes(), 1 << 20);
        assert_eq!(pool.free_bytes(), 1 << 20);
        assert_eq!(pool.used_bytes(), 0);
    }

    #[test]
    fn zero_length_message_takes_one_block() {
        let pool = Pool::new_static(4 * B).unwrap();
        let lease = pool.alloc(0).unwrap();
        assert!(lease.is_empty());
        assert_eq!(lease.len(), 0);
        assert_eq!(pool.used_bytes(), B);
        assert!(lease.to_vec().is_empty());
        assert_eq!(lease.chunks(0, 0).count(), 0);
        drop(lease);
        assert_eq!(pool.used_bytes(), 0);
    }

    #[test]
    fn block_accounting_by_length() {
        let pool = Pool::new_static(64 * B).unwrap();
        for (len, blocks) in [(1, 1), (127, 1), (128, 1), (129, 2), (256, 2), (257, 3)] {
            let lease = pool.alloc(len).unwrap();
            assert_eq!(pool.used_bytes(), blocks * B, "len {len}");
            drop(lease);
        }
    }

    #[test]
    fn alloc_until_exhausted_then_free_restores_capacity() {
        let pool = Pool::new_static(10 * B).unwrap();
        let mut leases: Vec<Lease> = (0..5).map(|_| pool.alloc(200).unwrap()).collect();
        assert_eq!(pool.free_bytes(), 0);
        assert!(pool.alloc(0).is_none());
        assert!(pool.alloc(1).is_none());
        // Freeing one 2-block lease allows exactly one 2-block message again.
        leases.pop();
        assert!(pool.alloc(257).is_none());
        let again = pool.alloc(256).unwrap();
        assert!(pool.alloc(0).is_none());
        drop(again);
        drop(leases);
        assert_eq!(pool.free_bytes(), pool.capacity_bytes());
        // The whole pool as one message.
        let all = pool.alloc(10 * B).unwrap();
        assert!(pool.alloc(0).is_none());
        drop(all);
        assert!(pool.alloc(10 * B + 1).is_none());
        assert_eq!(pool.free_bytes(), pool.capacity_bytes());
    }

    #[test]
    fn the_block_freed_longest_ago_is_handed_out_first() {
        let pool = Pool::new_static(4 * B).unwrap();
        let leases: Vec<Lease> = (0..4).map(|_| pool.alloc(1).unwrap()).collect();
        let heads: Vec<u32> = leases.iter().map(|l| l.head).collect();
        assert_eq!(heads, [0, 1, 2, 3], "a new pool hands out blocks in order");
        let mut leases: Vec<Option<Lease>> = leases.into_iter().map(Some).collect();
        // Freed 2, then 0 (one at a time), then 3 and 1 (as a batch).
        drop(leases[2].take());
        drop(leases[0].take());
        pool.free_many([leases[3].take().unwrap(), leases[1].take().unwrap()]);
        let again: Vec<u32> = (0..4).map(|_| pool.alloc(1).unwrap().head).collect();
        assert_eq!(again, [2, 0, 3, 1]);
    }

    #[test]
    fn alloc_each_takes_what_one_by_one_would() {
        // 10 blocks: 3 + 1 + 5, then 2 and 2 do not fit, 1 does, and then nothing: as
        // `alloc` decides one length at a time.
        let lens = [300, 0, 600, 129, 256, 100, 1, 5];
        let one_by_one: Vec<Option<usize>> = {
            let pool = Pool::new_static(10 * B).unwrap();
            let leases: Vec<Option<Lease>> = lens.iter().map(|&l| pool.alloc(l)).collect();
            leases.iter().map(|l| l.as_ref().map(Lease::len)).collect()
        };
        let pool = Pool::new_static(10 * B).unwrap();
        let mut out = vec![None];
        pool.alloc_each(lens, &mut out);
        let got: Vec<Option<usize>> = out[1..]
            .iter()
            .map(|l| l.as_ref().map(Lease::len))
            .collect();
        assert_eq!(got, one_by_one);
        assert_eq!(
            got,
            [
                Some(300),
                Some(0),
                Some(600),
                None,
                None,
                Some(100),
                None,
                None
            ]
        );
        assert_eq!(pool.free_bytes(), 0);
        // Each lease is a chain of its own: written whole, read back, freed whole.
        let data: Vec<Vec<u8>> = lens.iter().map(|&l| pattern(l as u64, l)).collect();
        for (lease, want) in out[1..].iter_mut().zip(&data) {
            if let Some(lease) = lease {
                lease.write_at(0, want);
            }
        }
        for (lease, want) in out[1..].iter().zip(&data) {
            if let Some(lease) = lease {
                assert_eq!(&lease.to_vec(), want);
            }
        }
        drop(out);
        assert_eq!(pool.free_bytes(), pool.capacity_bytes());
        let all = pool
            .alloc(10 * B)
            .expect("every block back on the free list");
        drop(all);
    }

    #[test]
    fn free_many_returns_everything_and_blocks_are_reusable() {
        let pool = Pool::new_static(16 * B).unwrap();
        let leases: Vec<Lease> = [0, 1, 300, 128, 1000]
            .iter()
            .map(|&n| pool.alloc(n).unwrap())
            .collect();
        assert_eq!(pool.used_bytes(), (1 + 1 + 3 + 1 + 8) * B);
        pool.free_many(leases);
        assert_eq!(pool.free_bytes(), pool.capacity_bytes());
        pool.free_many(Vec::new());
        assert_eq!(pool.free_bytes(), pool.capacity_bytes());
        // The rebuilt free list must be a proper chain of all 16 blocks.
        let data = pattern(7, 16 * B);
        let lease = filled(pool, &data);
        assert_eq!(lease.to_vec(), data);
    }

    #[test]
    fn free_many_hands_foreign_leases_back_to_their_own_pool() {
        let a = Pool::new_static(4 * B).unwrap();
        let b = Pool::new_static(4 * B).unwrap();
        let leases = vec![a.alloc(10).unwrap(), b.alloc(300).unwrap()];
        a.free_many(leases);
        assert_eq!(a.free_bytes(), a.capacity_bytes());
        assert_eq!(b.free_bytes(), b.capacity_bytes());
    }

    #[test]
    fn chunks_follow_block_boundaries() {
        let pool = Pool::new_static(8 * B).unwrap();
        let data = pattern(1, 3 * B);
        let lease = filled(pool, &data);
        let lens: Vec<usize> = lease.chunks(0, 3 * B).map(<[u8]>::len).collect();
        assert_eq!(lens, [B, B, B]);
        let lens: Vec<usize> = lease.chunks(100, 200).map(<[u8]>::len).collect();
        assert_eq!(lens, [28, 128, 44]);
        assert_eq!(lease.chunks(100, 200).len(), 3);
        // An empty range at the very end is fine, even on a block boundary.
        assert_eq!(lease.chunks(3 * B, 0).count(), 0);
        let mut out = vec![9];
        lease.copy_to(B - 1, 2, &mut out);
        assert_eq!(out, [9, data[B - 1], data[B]]);
    }

    #[test]
    #[should_panic(expected = "lies within the lease")]
    fn write_past_the_end_panics() {
        let pool = Pool::new_static(4 * B).unwrap();
        let mut lease = pool.alloc(10).unwrap();
        lease.write_at(5, &[0; 6]);
    }

    #[test]
    #[should_panic(expected = "lies within the lease")]
    fn read_past_the_end_panics() {
        let pool = Pool::new_static(4 * B).unwrap();
        let lease = pool.alloc(10).unwrap();
        let _ = lease.chunks(usize::MAX, 2);
    }

    #[test]
    fn oversized_pool_is_refused() {
        assert!(matches!(
            Pool::new_static(usize::MAX),
            Err(PoolError::TooLarge { .. })
        ));
    }

    proptest! {
        #[test]
        fn contents_roundtrip_across_blocks(
            len in 0usize..2000,
            seed in any::<u64>(),
            cut in any::<prop::sample::Index>(),
            range in any::<(prop::sample::Index, prop::sample::Index)>(),
        ) {
            let pool = Pool::new_static(32 * B).unwrap();
            let data = pattern(seed, len);
            let mut lease = pool.alloc(len).unwrap();
            // Two writes split at an arbitrary point, the second first.
            let cut = if len == 0 { 0 } else { cut.index(len + 1) };
            lease.write_at(cut, &data[cut..]);
            lease.write_at(0, &data[..cut]);
            prop_assert_eq!(lease.to_vec(), data.clone());

            let (a, b) = if len == 0 { (0, 0) } else { (range.0.index(len + 1), range.1.index(len + 1)) };
            let (start, end) = (a.min(b), a.max(b));
            let mut out = Vec::new();
            lease.copy_to(start, end - start, &mut out);
            prop_assert_eq!(&out[..], &data[start..end]);
            let joined: Vec<u8> = lease.chunks(start, end - start).flatten().copied().collect();
            prop_assert_eq!(&joined[..], &data[start..end]);
            prop_assert!(lease.chunks(start, end - start).all(|c| !c.is_empty() && c.len() <= B));

            drop(lease);
            prop_assert_eq!(pool.free_bytes(), pool.capacity_bytes());
        }
    }

    /// Several threads allocate, fill, verify and free concurrently from a pool small enough
    /// to run dry; some leases are freed by a different thread than the one that made them.
    #[test]
    fn concurrent_stress_keeps_contents_and_accounting() {
        const THREADS: u64 = 4;
        const ITERATIONS: u64 = 3000;
        let pool = Pool::new_static(256 * B).unwrap();
        let (to_freer, from_workers) = crossbeam_channel::bounded::<(Lease, Vec<u8>)>(64);

        let freer = std::thread::spawn(move || {
            let mut batch = Vec::new();
            for (lease, expected) in from_workers {
                assert_eq!(lease.to_vec(), expected, "corrupted while in flight");
                batch.push(lease);
                if batch.len() == 8 {
                    pool.free_many(batch.drain(..));
                }
            }
            pool.free_many(batch);
        });

        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let to_freer = to_freer.clone();
                std::thread::spawn(move || {
                    let mut held: VecDeque<(Lease, Vec<u8>)> = VecDeque::new();
                    let mut failures = 0u64;
                    for i in 0..ITERATIONS {
                        let seed = t * 1_000_000 + i;
                        let len = (pattern(seed, 2)[0] as usize * 7 + i as usize) % 1500;
                        let data = pattern(seed, len);
                        match pool.alloc(len) {
                            Some(mut lease) => {
                                lease.write_at(0, &data);
                                if i % 3 == 0 {
                                    to_freer.send((lease, data)).unwrap();
                                } else {
                                    held.push_back((lease, data));
                                }
                            }
                            None => failures += 1,
                        }
                        while held.len() > 6 || (failures > 0 && !held.is_empty()) {
                            let (lease, expected) = held.pop_front().unwrap();
                            assert_eq!(lease.to_vec(), expected, "corrupted while held");
                            failures = failures.saturating_sub(1);
                        }
                    }
                    for (lease, expected) in held {
                        assert_eq!(lease.to_vec(), expected, "corrupted at the end");
                    }
                })
            })
            .collect();
        drop(to_freer);
        for w in workers {
            w.join().unwrap();
        }
        freer.join().unwrap();
        assert_eq!(pool.free_bytes(), pool.capacity_bytes());
        // And the free list is still one intact chain of every block.
        let data = pattern(99, pool.capacity_bytes());
        assert_eq!(filled(pool, &data).to_vec(), data);
    }
}

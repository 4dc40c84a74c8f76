//! Fuzzes the stream framer with arbitrary bytes split at arbitrary points: it must never
//! panic, never hold more than a bounded buffer, and yield frames that start with their
//! own size; an idle connection's buffer given back (`release_idle`, at points the input
//! picks) keeps exactly the partial message. Reads go through a shared read buffer
//! (`read_shared`, then `settle`) or the framer's own, as the input picks; settling keeps
//! exactly the partial message, and a short one in a small buffer.
#![no_main]

use std::io::Read;

use dory::input::wire::{FrameError, StreamFramer, KEEP_PARTIAL_MAX};
use libfuzzer_sys::fuzz_target;

/// Hands out the input in small pieces whose sizes come from the input itself.
struct Pieces<'a> {
    data: &'a [u8],
    step: usize,
}

impl Read for Pieces<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.data.len().min(buf.len()).min(self.step);
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        self.step = self.step % 97 + 1;
        Ok(n)
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let max = 64 + usize::from(first) * 64;
    let mut framer = StreamFramer::new(max);
    let mut src = Pieces {
        data: rest,
        step: usize::from(first % 13) + 1,
    };
    let mut shared = Vec::new();
    loop {
        let got = if src.step % 3 == 0 {
            framer.read_from(&mut src)
        } else {
            framer.read_shared(&mut src, &mut shared)
        };
        match got {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        loop {
            match framer.next_frame() {
                Ok(Some(f)) => {
                    assert!(f.len() >= 4 && f.len() <= max + 4);
                    let size = i32::from_be_bytes([f[0], f[1], f[2], f[3]]);
                    assert_eq!(usize::try_from(size).ok(), Some(f.len()));
                    let _ = dory::input::wire::parse(f);
                }
                Ok(None) => break,
                Err(FrameError::InvalidSize(_)) | Err(FrameError::TooLarge { .. }) => return,
            }
        }
        assert!(framer.buffered().len() <= max + 4 + 64 * 1024);
        let partial = framer.buffered().to_vec();
        framer.settle(&mut shared);
        assert_eq!(framer.buffered(), &partial[..]);
        if partial.len() <= KEEP_PARTIAL_MAX {
            assert!(framer.capacity() <= 2 * KEEP_PARTIAL_MAX);
        }
        assert!(shared.len() <= 4 * 64 * 1024);
        if src.step % 5 == 0 {
            let partial = framer.buffered().to_vec();
            framer.release_idle();
            assert_eq!(framer.buffered(), &partial[..]);
            assert_eq!(framer.capacity(), partial.len());
        }
    }
});

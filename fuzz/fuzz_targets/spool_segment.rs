//! Fuzzes the spool's segment reader as recovery uses it: a segment header, then a scan of
//! the record area (with resynchronisation after corrupt records) for the header's segment
//! id and for a fixed one. Every record found must lie within the input and re-encode to
//! the same bytes (with the segment id it was read for); skipped ranges must lie within
//! the input too. Reading may reject anything but must never panic.
#![no_main]

use dory::spool::format::{encode_record, scan, seal_record, Scan, SegmentHeader, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fn check(area: &[u8], id: u64) {
    let mut buf = Vec::new();
    scan(area, id, |s| match s {
        Scan::Record { offset, rec } => {
            buf.clear();
            assert!(encode_record(&rec, &mut buf), "a record read back re-encodes");
            seal_record(&mut buf, id);
            assert_eq!(&area[offset..offset + buf.len()], &buf[..], "same bytes");
        }
        Scan::Skipped { offset, len, .. } => {
            assert!(len > 0 && offset + len <= area.len(), "skipped range inside");
        }
    });
}

fuzz_target!(|data: &[u8]| {
    let id = match SegmentHeader::decode(data) {
        Ok(h) => h.id,
        Err(_) => 1,
    };
    let area = data.get(HEADER_LEN..).unwrap_or(data);
    check(area, id);
    check(data, 1);
});

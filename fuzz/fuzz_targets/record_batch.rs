//! Fuzzes the RecordBatch v2 decoder with arbitrary bytes, and checks that whatever it
//! accepts re-encodes (through the writer) to batches it decodes to the same records.
#![no_main]

use dory::kafka::record_batch::{decode_batches, RecordBatchWriter};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(batches) = decode_batches(data) else {
        return;
    };
    for batch in batches {
        if batch.records.is_empty() || batch.records.iter().any(|r| !r.headers.is_empty()) {
            continue; // the writer emits neither empty batches nor headers
        }
        let mut buf = Vec::new();
        let mut writer = RecordBatchWriter::begin(&mut buf, batch.base_timestamp, 0);
        for r in &batch.records {
            writer.append(&mut buf, r.timestamp, r.key.as_deref(), r.value.as_deref());
        }
        writer.finish(&mut buf);
        let again = decode_batches(&buf).expect("writer output decodes");
        assert_eq!(again.len(), 1);
        let original: Vec<_> = batch
            .records
            .iter()
            .map(|r| (r.timestamp, &r.key, &r.value))
            .collect();
        let reencoded: Vec<_> = again[0]
            .records
            .iter()
            .map(|r| (r.timestamp, &r.key, &r.value))
            .collect();
        assert_eq!(original, reencoded);
    }
});

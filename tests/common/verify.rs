//! Verification of what was consumed against what was sent.

use super::*;

fn describe(key: &[u8], value: &[u8]) -> String {
    let id = value_id(value).map_or_else(|| "?".to_string(), |i| i.to_string());
    let k = if key.len() > 12 {
        format!("{}..", hex(&key[..12]))
    } else {
        hex(key)
    };
    format!(
        "id {id} (key [{k}] {} B, value {} B)",
        key.len(),
        value.len()
    )
}

/// Checks what was consumed against what was sent:
/// * the exact multiset of (key, value) — nothing lost, duplicated or altered; an empty key
///   must arrive as a null key (a null value and an empty value both count as empty);
/// * for each (key, value), the multiset of record timestamps equals the client timestamps,
///   and they are CreateTime;
/// * every PartitionKey message is on partition `(key as u32) % partitions`.
///
/// Returns a readable list of problems.
pub fn verify_delivery(sent: &[TestMsg], got: &[Consumed], partitions: i32) -> Result<(), String> {
    type Ident = (Vec<u8>, Vec<u8>);
    let mut problems = Vec::new();
    let mut expected: BTreeMap<Ident, Vec<&TestMsg>> = BTreeMap::new();
    for m in sent {
        expected
            .entry((m.key.clone(), m.value.clone()))
            .or_default()
            .push(m);
    }
    let mut actual: BTreeMap<Ident, Vec<&Consumed>> = BTreeMap::new();
    for c in got {
        if c.key.as_deref() == Some(&[][..]) {
            problems.push(format!(
                "partition {} offset {}: empty key delivered as a non-null empty key",
                c.partition, c.offset
            ));
        }
        if !(0..partitions).contains(&c.partition) {
            problems.push(format!("record on unexpected partition {}", c.partition));
        }
        let ident = (
            c.key.clone().unwrap_or_default(),
            c.value.clone().unwrap_or_default(),
        );
        actual.entry(ident).or_default().push(c);
    }
    let mut idents: BTreeSet<&Ident> = expected.keys().collect();
    idents.extend(actual.keys());
    let (mut lost, mut extra) = (0usize, 0usize);
    for ident in idents {
        let e = expected.get(ident).map_or(&[][..], Vec::as_slice);
        let a = actual.get(ident).map_or(&[][..], Vec::as_slice);
        let what = describe(&ident.0, &ident.1);
        if e.len() != a.len() {
            if e.len() > a.len() {
                lost += e.len() - a.len();
            } else {
                extra += a.len() - e.len();
            }
            let where_ = a
                .iter()
                .map(|c| format!("p{}@{}", c.partition, c.offset))
                .collect::<Vec<_>>()
                .join(",");
            problems.push(format!(
                "{what}: sent {} time(s), consumed {} time(s) [{where_}]",
                e.len(),
                a.len()
            ));
            continue;
        }
        let mut sent_ts: Vec<i64> = e.iter().map(|m| m.ts).collect();
        let mut got_ts: Vec<i64> = a.iter().map(|c| c.timestamp).collect();
        sent_ts.sort_unstable();
        got_ts.sort_unstable();
        if sent_ts != got_ts {
            problems.push(format!(
                "{what}: timestamps sent {sent_ts:?}, consumed {got_ts:?}"
            ));
        }
        if let Some(c) = a.iter().find(|c| c.timestamp_type != TsType::CreateTime) {
            problems.push(format!("{what}: timestamp type {:?}", c.timestamp_type));
        }
        for m in e {
            if let Some(p) = m.expected_partition(partitions) {
                // PartitionKey messages are unique (full id in the value): e.len() == 1.
                if e.len() != 1 {
                    problems.push(format!(
                        "{what}: PartitionKey message not unique (test bug)"
                    ));
                } else if a[0].partition != p {
                    problems.push(format!(
                        "{what}: partition key {:?} must land on partition {p} of {partitions}, \
                         found on {}",
                        m.route, a[0].partition
                    ));
                }
            }
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    let shown = 40;
    let mut report = format!(
        "delivery check failed: sent {}, consumed {}, {lost} lost, {extra} extra; {} problem(s):\n",
        sent.len(),
        got.len(),
        problems.len()
    );
    for p in problems.iter().take(shown) {
        let _ = writeln!(report, "  {p}");
    }
    if problems.len() > shown {
        let _ = writeln!(report, "  ... and {} more", problems.len() - shown);
    }
    Err(report)
}

//! Discard log rotation and pruning.

use super::*;

#[test]
fn discard_log_rotates_by_size_and_prunes_oldest_archives() {
    const COUNT: u32 = 120;
    const MAX_FILE: usize = 2000;
    const MAX_ARCHIVE: usize = 5000;
    const ROT_PREFIX: usize = 32;
    let mock = Mock::start(1);
    mock.create_topic("rot", 1);
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("dl");
    let log_path = dir.join("discard.log");
    let toml = format!(
        "[rate_limit.configs.nothing]\ninterval_ms = 1000\nmax_count = 0\n\
         [rate_limit.topics]\nrot = \"nothing\"\n\
         [discard_log]\nenable = true\npath = {}\nmax_file_size = {MAX_FILE}\n\
         max_archive_size = {MAX_ARCHIVE}\nmax_msg_prefix_size = {ROT_PREFIX}\n",
        toml_path(&log_path)
    );
    let started_ms = now_ms();
    let mut dory = start_dory(&mock.broker_addrs(), &toml);

    // Fixed-size keys and values, so every line has the same length.
    let msgs: Vec<TestMsg> = (0..COUNT)
        .map(|id| {
            let key = format!("key-{id:04}");
            test_msg(
                id,
                "rot",
                Route::AnyPartition,
                key.as_bytes(),
                text_value(id, 60),
            )
        })
        .collect();
    let by_rest: HashMap<String, u32> = msgs
        .iter()
        .map(|m| (disc_rest(m, "RATE_LIMIT", ROT_PREFIX), m.id))
        .collect();
    dory.send_stream(&msgs);
    let m = settle(&mut dory, &[("rot", u64::from(COUNT))]);
    assert_discards(&m, "rot", &[("rate_limit", u64::from(COUNT))]);

    // Files: the log and archives `discard.log.<ms>`, read oldest first.
    let read_all = || -> Vec<(Option<u128>, String, Vec<String>)> {
        let mut files = Vec::new();
        for e in fs::read_dir(&dir).expect("read log dir") {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            let suffix = if name == "discard.log" {
                None
            } else {
                let s = name
                    .strip_prefix("discard.log.")
                    .unwrap_or_else(|| panic!("unexpected file {name} in {}", dir.display()));
                Some(
                    s.parse::<u128>()
                        .unwrap_or_else(|_| panic!("archive suffix not epoch ms: {name}")),
                )
            };
            let lines = read_lines(&dir.join(&name));
            files.push((suffix, name, lines));
        }
        // Archives by their suffix, then the current file.
        files.sort_by_key(|(s, ..)| s.map_or((1, 0), |v| (0, v)));
        files
    };
    let last_rest = by_rest
        .iter()
        .find(|(_, &id)| id == COUNT - 1)
        .map(|(r, _)| r.clone())
        .unwrap();
    let files = poll_until("the last discard logged", WAIT, || {
        let f = read_all();
        let done = f
            .last()
            .and_then(|(_, _, l)| l.last())
            .is_some_and(|l| l.ends_with(&last_rest));
        if done {
            Ok(f)
        } else {
            Err(format!(
                "files: {:?}",
                f.iter()
                    .map(|(_, n, l)| (n.clone(), l.len()))
                    .collect::<Vec<_>>()
            ))
        }
    });
    let ended_ms = now_ms();
    let layout: Vec<(String, usize, usize)> = files
        .iter()
        .map(|(_, n, l)| (n.clone(), l.len(), l.iter().map(|x| x.len() + 1).sum()))
        .collect();
    let ctx = format!("files (name, lines, bytes), oldest first: {layout:?}");

    // Every line is one of ours, all of equal length.
    let mut ids = Vec::new();
    let mut line_len = None;
    let mut last_now = 0;
    for (_, name, lines) in &files {
        for l in lines {
            let (now, rest) = split_now(l).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(
                now >= last_now && (started_ms..=ended_ms).contains(&now),
                "{name}: now {now} out of order or range: {l}\n{ctx}"
            );
            last_now = now;
            let id = *by_rest
                .get(rest)
                .unwrap_or_else(|| panic!("{name}: unexpected line {l}\n{ctx}"));
            ids.push(id);
            let len = l.len() + 1;
            assert_eq!(
                *line_len.get_or_insert(len),
                len,
                "line lengths differ: {l}"
            );
        }
    }
    let line_len = line_len.expect("some lines");
    // The retained lines are the newest ones, in order.
    let first = COUNT - ids.len() as u32;
    assert_eq!(
        ids,
        (first..COUNT).collect::<Vec<_>>(),
        "retained lines must be the newest, contiguous, in order\n{ctx}"
    );

    // Rotation: a file is renamed when the next line would pass max_file_size, so every
    // file holds exactly `per_file` lines; archives are pruned oldest first while their
    // total exceeds max_archive_size.
    let per_file = MAX_FILE / line_len;
    let total = COUNT as usize;
    let rotations = total.div_ceil(per_file) - 1;
    let kept = rotations.min(MAX_ARCHIVE / (per_file * line_len));
    let current = total - rotations * per_file;
    let archives = &files[..files.len() - 1];
    assert_eq!(
        archives.len(),
        kept,
        "archives kept (line {line_len} B, {per_file} lines per file, {rotations} rotations)\n{ctx}"
    );
    assert!(
        kept > 0 && kept < rotations,
        "the test must see pruning: {ctx}"
    );
    for (suffix, name, lines) in archives {
        assert_eq!(lines.len(), per_file, "{name}\n{ctx}");
        let ms = suffix.unwrap();
        assert!(
            (started_ms as u128..=ended_ms as u128 + 1000).contains(&ms),
            "{name}: suffix is not the rotation time in epoch ms ({started_ms}..{ended_ms})"
        );
    }
    assert_eq!(files.last().unwrap().1, "discard.log");
    assert_eq!(
        files.last().unwrap().2.len(),
        current,
        "current file\n{ctx}"
    );
    let archived: usize = archives.iter().map(|(_, _, l)| l.len() * line_len).sum();
    assert!(archived <= MAX_ARCHIVE, "archives hold {archived} B\n{ctx}");
    eprintln!("discard log rotation: {ctx}");
}

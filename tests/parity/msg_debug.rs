//! Message debug logging.

use super::*;

#[test]
fn msg_debug_logs_only_the_selected_topic() {
    let mock = Mock::start(1);
    for t in ["dbg_a", "dbg_b"] {
        mock.create_topic(t, 2);
    }
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("debug");
    let toml = format!(
        "[batching]\ntime_ms = 20\n[msg_debug]\nenable = true\npath = {}\n",
        toml_path(&dir)
    );
    let mut dory = start_dory(&mock.broker_addrs(), &toml);
    let get = |d: &Dory, path: &str| -> String {
        let (code, body) = d.http_get(path);
        assert_eq!(code, 200, "GET {path}: {body}");
        body
    };
    assert_eq!(
        get(&dory, "/msg_debug/get_topics"),
        "No message debug topics are currently enabled\n"
    );

    let batch = |topic: &str, base: u32, n: u32| -> Vec<TestMsg> {
        (base..base + n)
            .map(|id| {
                let key = if id % 3 == 0 {
                    Vec::new()
                } else {
                    format!("key-{id}").into_bytes()
                };
                let route = if id % 2 == 0 {
                    Route::AnyPartition
                } else {
                    Route::PartitionKey(id as i32)
                };
                test_msg(
                    id,
                    topic,
                    route,
                    &key,
                    text_value(id, 20 + (id as usize * 7) % 150),
                )
            })
            .collect()
    };
    // Before any topic is selected: nothing is logged.
    dory.send_stream(&batch("dbg_a", 0, 5));
    settle(&mut dory, &[("dbg_a", 5)]);

    assert_eq!(
        get(&dory, "/msg_debug/add_topic/dbg_a"),
        "Enabled debug topic [dbg_a]\n"
    );
    assert_eq!(get(&dory, "/msg_debug/get_topics"), "topic: [dbg_a]\n");
    let logged = batch("dbg_a", 100, 30);
    dory.send_stream(&logged);
    dory.send_stream(&batch("dbg_b", 200, 30));
    settle(&mut dory, &[("dbg_a", 35), ("dbg_b", 30)]);

    let mut want: Vec<String> = logged
        .iter()
        .map(|m| {
            format!(
                "ts: {} topic: 5[dbg_a] key: {} value: {}",
                m.ts,
                b64_field(&m.key),
                b64_field(&m.value)
            )
        })
        .collect();
    want.sort();
    let files = ["msg_receive", "msg_send", "msg_got_ack"];
    let read = |f: &str| read_lines(&dir.join(f));
    poll_until("30 lines in every debug file", WAIT, || {
        let counts: Vec<usize> = files.iter().map(|f| read(f).len()).collect();
        if counts.iter().all(|&n| n >= 30) {
            Ok(())
        } else {
            Err(format!("{files:?}: {counts:?} lines"))
        }
    });
    for f in files {
        let mut got = read(f);
        got.sort();
        assert_eq!(
            got, want,
            "{f}: one line per dbg_a message, nothing of dbg_b"
        );
    }

    // Deselected: no more lines.
    assert_eq!(
        get(&dory, "/msg_debug/del_topic/dbg_a"),
        "Disabled debug topic [dbg_a]\n"
    );
    assert_eq!(
        get(&dory, "/msg_debug/get_topics"),
        "No message debug topics are currently enabled\n"
    );
    dory.send_stream(&batch("dbg_a", 300, 10));
    settle(&mut dory, &[("dbg_a", 45)]);
    for f in files {
        assert_eq!(read(f).len(), 30, "{f} grew after del_topic");
    }
}

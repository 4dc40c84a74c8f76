//! Topic auto-creation with a config file.

use super::*;

fn autocreate_scenario(brokers: &[String], bootstrap: &str, tag: &str) {
    const COUNT: u32 = 25;
    let off_topic = format!("parity_ac_off_{tag}");
    let on_topic = format!("parity_ac_on_{tag}");
    for t in [&off_topic, &on_topic] {
        assert!(!topic_exists(bootstrap, t), "{t} exists before the test");
    }
    let msgs = |topic: &str| -> Vec<TestMsg> {
        (0..COUNT)
            .map(|id| {
                let route = if id % 2 == 0 {
                    Route::AnyPartition
                } else {
                    Route::PartitionKey(id as i32 * 7)
                };
                let key = format!("k{id}");
                test_msg(id, topic, route, key.as_bytes(), text_value(id, 64))
            })
            .collect()
    };

    // A config file without topic_autocreate: off, so every message is bad_topic.
    let mut off = start_dory(brokers, "[delivery]\nunknown_topic_wait_ms = 3000\n");
    off.send_stream(&msgs(&off_topic));
    let m = settle(&mut off, &[(off_topic.as_str(), u64::from(COUNT))]);
    assert_eq!(m.delivered(&off_topic), 0, "{}", m.text);
    assert_discards(&m, &off_topic, &[("bad_topic", u64::from(COUNT))]);
    assert!(
        !topic_exists(bootstrap, &off_topic),
        "{off_topic} was created with auto-creation off"
    );
    let status = off.terminate(Duration::from_secs(15));
    assert_eq!(status.code(), Some(0), "exit status {status}");

    // topic_autocreate = true: created and delivered.
    let mut on = start_dory(brokers, "[delivery]\ntopic_autocreate = true\n");
    let sent = msgs(&on_topic);
    on.send_stream(&sent);
    let m = settle(&mut on, &[(on_topic.as_str(), u64::from(COUNT))]);
    assert_eq!(m.delivered(&on_topic), u64::from(COUNT), "{}", m.text);
    assert_discards(&m, &on_topic, &[]);
    assert!(topic_exists(bootstrap, &on_topic), "{on_topic} not created");
    let partitions = topic_partition_count(bootstrap, &on_topic);
    let got = consume_all(bootstrap, &on_topic, sent.len(), CONSUME_TIMEOUT);
    if let Err(r) = verify_delivery(&sent, &got, partitions) {
        panic!("{r}");
    }
}

#[test]
fn autocreate_on_and_off_with_a_config_file_on_the_mock_cluster() {
    let mock = Mock::start(3);
    autocreate_scenario(&mock.broker_addrs(), &mock.bootstrap(), "mock");
}

#[test]
fn autocreate_on_and_off_with_a_config_file_on_tansu() {
    let tansu = Tansu::start();
    autocreate_scenario(&[tansu.bootstrap()], &tansu.bootstrap(), "tansu");
}

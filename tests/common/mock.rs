//! The librdkafka mock cluster: several brokers on real TCP, with fault injection.

use super::*;

/// librdkafka's mock cluster: `brokers` brokers (ids 1..=n) on real loopback TCP ports,
/// alive as long as this value.
pub struct Mock {
    cluster: MockCluster<'static, DefaultProducerContext>,
    brokers: i32,
}

impl Mock {
    pub fn start(brokers: i32) -> Mock {
        let cluster = MockCluster::new(brokers).expect("start librdkafka mock cluster");
        let mock = Mock { cluster, brokers };
        for addr in mock.broker_addrs() {
            assert!(
                addr.starts_with("127.0.0.1:") || addr.starts_with("localhost:"),
                "mock broker not on loopback: {addr}"
            );
        }
        mock
    }

    /// The comma-separated bootstrap list of all brokers.
    pub fn bootstrap(&self) -> String {
        self.cluster.bootstrap_servers()
    }

    /// Every broker's `host:port`, in broker-id order.
    pub fn broker_addrs(&self) -> Vec<String> {
        self.bootstrap().split(',').map(str::to_string).collect()
    }

    pub fn brokers(&self) -> i32 {
        self.brokers
    }

    /// The underlying cluster, for fault injection (`broker_down`, `request_errors`, ...).
    pub fn cluster(&self) -> &MockCluster<'static, DefaultProducerContext> {
        &self.cluster
    }

    /// Creates `name` with `partitions` partitions; partition p is led by broker
    /// `p % brokers + 1`, so leadership is spread evenly. Waits until metadata shows it.
    pub fn create_topic(&self, name: &str, partitions: i32) {
        self.cluster
            .create_topic(name, partitions, self.brokers.min(3))
            .expect("mock create_topic");
        for p in 0..partitions {
            self.cluster
                .partition_leader(name, p, Some(p % self.brokers + 1))
                .expect("mock partition_leader");
        }
        let client = metadata_client(&self.bootstrap());
        poll_until(
            &format!("mock topic {name:?} with spread leaders"),
            Duration::from_secs(20),
            || {
                let parts = topic_leaders(&client, name)?;
                let want: Vec<(i32, i32)> =
                    (0..partitions).map(|p| (p, p % self.brokers + 1)).collect();
                if parts == want {
                    Ok(())
                } else {
                    Err(format!("partitions (id, leader): {parts:?}, want {want:?}"))
                }
            },
        );
    }

    /// The leader of each partition of `topic`, in partition-id order.
    pub fn leaders(&self, topic: &str) -> Vec<(i32, i32)> {
        let client = metadata_client(&self.bootstrap());
        poll_until("mock topic metadata", Duration::from_secs(20), || {
            topic_leaders(&client, topic)
        })
    }
}

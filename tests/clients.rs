//! Many stream clients at once, and clients that stall (issue 29), against the librdkafka
//! mock cluster, everything consumed back with a CRC-checking consumer:
//!
//! - 500 UNIX stream and 500 TCP clients, all connected at the same time, each sending its
//!   own messages interleaved with the others': every message of every client arrives
//!   exactly once;
//! - clients that connect and send nothing, or send half a message and stall, hold no
//!   other client up: the others' messages all arrive while they stay connected, and
//!   while only they are connected the inputs' threads use no CPU; when they leave, the half messages
//!   are counted as `unclean_disconnect` and the idle ones as clean disconnects.

mod common;

use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::*;

const WAIT: Duration = Duration::from_secs(60);

/// One connection, of either kind.
enum Client {
    Unix(StreamSender),
    Tcp(TcpSender),
}

impl Client {
    fn send(&mut self, bytes: &[u8]) {
        match self {
            Client::Unix(s) => s.send(bytes),
            Client::Tcp(s) => s.send(bytes),
        }
    }
    fn finish(self) {
        match self {
            Client::Unix(s) => s.finish(),
            Client::Tcp(s) => s.finish(),
        }
    }
}

/// Waits until dory has accepted `unix` UNIX stream and `tcp` TCP connections in all.
fn wait_accepted(dory: &Dory, unix: u64, tcp: u64) {
    poll_until("the connections to be accepted", WAIT, || {
        let c = dory.counters()?;
        let (u, t) = (c["NewUnixClient"], c["NewTcpClient"]);
        if u >= unix && t >= tcp {
            Ok(())
        } else {
            Err(format!("accepted {u} of {unix} UNIX and {t} of {tcp} TCP"))
        }
    });
}

#[test]
fn a_thousand_stream_clients_at_once_each_get_every_message_through() {
    const UNIX: u32 = 500;
    const TCP: u32 = 500;
    const PER_CLIENT: u32 = 20;
    const WRITERS: usize = 8;
    const TOPIC: &str = "clients_many";
    let mock = Mock::start(3);
    mock.create_topic(TOPIC, 4);
    let mut dory = Dory::start(DoryArgs::new(mock.broker_addrs()));
    dory.wait_ready();

    // Every client connects first, so that all 1,000 are open at once.
    let mut clients: Vec<(Client, Vec<TestMsg>)> = (0..UNIX + TCP)
        .map(|c| {
            let (client, input) = if c < UNIX {
                (
                    Client::Unix(StreamSender::connect(dory.stream_path())),
                    Input::Stream,
                )
            } else {
                (Client::Tcp(TcpSender::connect(dory.tcp_port())), Input::Tcp)
            };
            (
                client,
                msgs_through(input, TOPIC, c * PER_CLIENT, PER_CLIENT),
            )
        })
        .collect();
    wait_accepted(&dory, UNIX.into(), TCP.into());
    let sent: Vec<TestMsg> = clients.iter().flat_map(|(_, m)| m.clone()).collect();

    // A few writer threads, each sending one message per client in turn, so every client
    // has messages in flight while the others do.
    let started = Instant::now();
    let mut shares: Vec<Vec<(Client, Vec<TestMsg>)>> = (0..WRITERS).map(|_| Vec::new()).collect();
    for (i, c) in clients.drain(..).enumerate() {
        shares[i % WRITERS].push(c);
    }
    std::thread::scope(|s| {
        for share in shares {
            s.spawn(move || {
                let mut share = share;
                for j in 0..PER_CLIENT as usize {
                    for (client, m) in share.iter_mut() {
                        client.send(&m[j].encode());
                    }
                }
                for (client, _) in share {
                    client.finish();
                }
            });
        }
    });
    let total = u64::from((UNIX + TCP) * PER_CLIENT);
    dory.wait_received(&[(TOPIC, total)], WAIT);
    dory.wait_drained(WAIT);
    eprintln!(
        "{} clients x {PER_CLIENT} messages received and delivered in {:?}",
        UNIX + TCP,
        started.elapsed()
    );

    let got = consume_all(&mock.bootstrap(), TOPIC, sent.len(), WAIT);
    if let Err(report) = verify_delivery(&sent, &got, 4) {
        panic!("{report}");
    }
    let m = dory.assert_invariant();
    assert_eq!(m.delivered(TOPIC), total);
    assert!(
        m.discards_of(TOPIC).is_empty(),
        "{:?}",
        m.discards_of(TOPIC)
    );
    let c = dory.counters().expect("counters");
    assert_eq!(c["NewUnixClient"], u64::from(UNIX));
    assert_eq!(c["NewTcpClient"], u64::from(TCP));
    poll_until(
        "every client's clean disconnect to be counted",
        WAIT,
        || {
            let c = dory.counters()?;
            let (u, t) = (
                c["UnixStreamInputCleanDisconnect"],
                c["TcpInputCleanDisconnect"],
            );
            if u == u64::from(UNIX) && t == u64::from(TCP) {
                Ok(())
            } else {
                Err(format!("clean disconnects: {u} UNIX, {t} TCP"))
            }
        },
    );
    assert_eq!(dory.terminate(WAIT).code(), Some(0));
}

#[test]
fn clients_that_send_nothing_or_half_a_message_cost_the_others_nothing() {
    const TOPIC: &str = "clients_stalled";
    const EACH: u32 = 1000;
    let mock = Mock::start(1);
    mock.create_topic(TOPIC, 2);
    let mut dory = Dory::start(DoryArgs::new(mock.broker_addrs()));
    dory.wait_ready();
    let tcp: SocketAddr = ([127, 0, 0, 1], dory.tcp_port()).into();

    // Two that send nothing, two that send the first 10 bytes of a message and stall.
    let half = msgs_through(Input::Stream, "never_whole", 0, 1)[0].encode();
    let idle_unix = UnixStream::connect(dory.stream_path()).expect("connect");
    let idle_tcp = TcpStream::connect(tcp).expect("connect");
    let mut half_unix = UnixStream::connect(dory.stream_path()).expect("connect");
    let mut half_tcp = TcpStream::connect(tcp).expect("connect");
    half_unix
        .write_all(&half[..10])
        .expect("write half a message");
    half_tcp
        .write_all(&half[..10])
        .expect("write half a message");
    wait_accepted(&dory, 2, 2);
    // Both inputs' threads (one per socket serves all its connections).
    let input_ticks = |dory: &Dory| -> u64 {
        let t = threads::threads(dory.pid(), "input-stream")
            .into_iter()
            .chain(threads::threads(dory.pid(), "input-tcp"));
        t.map(|t| t.cpu_ticks).sum()
    };

    // The others send while the four stay connected.
    let unix_msgs = msgs_through(Input::Stream, TOPIC, 0, EACH);
    let tcp_msgs = msgs_through(Input::Tcp, TOPIC, EACH, EACH);
    std::thread::scope(|s| {
        s.spawn(|| dory.send_stream(&unix_msgs));
        s.spawn(|| {
            let mut c = TcpSender::connect(dory.tcp_port());
            c.send(
                &tcp_msgs
                    .iter()
                    .flat_map(TestMsg::encode)
                    .collect::<Vec<u8>>(),
            );
            c.finish();
        });
    });
    dory.wait_received(&[(TOPIC, u64::from(2 * EACH))], WAIT);
    dory.wait_drained(WAIT);
    let sent: Vec<TestMsg> = unix_msgs.into_iter().chain(tcp_msgs).collect();
    let got = consume_all(&mock.bootstrap(), TOPIC, sent.len(), WAIT);
    if let Err(report) = verify_delivery(&sent, &got, 2) {
        panic!("{report}");
    }
    // The stalled clients are still connected and nothing of theirs is counted yet.
    // Over the next 2 s (past the 1 s after which idle buffers are given back) they are
    // the only clients: the inputs' threads must stay asleep, under 2 % of a CPU each.
    let m = dory.assert_invariant();
    assert_eq!(
        m.received(""),
        0,
        "nothing of the stalled clients counted yet"
    );
    const WINDOW: Duration = Duration::from_secs(2);
    let (ticks0, t0) = (input_ticks(&dory), Instant::now());
    while t0.elapsed() < WINDOW {
        let m = dory.metrics();
        assert_eq!(m.received(""), 0, "a stalled client's bytes were counted");
        std::thread::sleep(Duration::from_millis(100));
    }
    let spent = input_ticks(&dory) - ticks0;
    let hz = 100.0; // USER_HZ: clock ticks per second in /proc on Linux.
    let elapsed = t0.elapsed().as_secs_f64();
    eprintln!(
        "with only the stalled clients connected the inputs used {spent} ticks in {elapsed:.2} s"
    );
    assert!(
        spent as f64 / hz < 0.02 * 2.0 * elapsed,
        "the input threads used {spent} ticks in {elapsed:.2} s with only stalled clients"
    );

    // When they leave: the half messages are unclean disconnects, the idle ones clean.
    for s in [&idle_unix, &half_unix] {
        s.shutdown(Shutdown::Both).expect("shutdown");
    }
    for s in [&idle_tcp, &half_tcp] {
        s.shutdown(Shutdown::Both).expect("shutdown");
    }
    let m = dory.wait_metrics("the half messages counted", WAIT, |m| {
        match m.discarded("", "unclean_disconnect") {
            2 => Ok(()),
            n => Err(format!("unclean_disconnect = {n} of 2")),
        }
    });
    assert_eq!(m.received(""), 2);
    assert_eq!(m.delivered(TOPIC), u64::from(2 * EACH));
    let c = dory.counters().expect("counters");
    assert_eq!(c["UnixStreamInputUncleanDisconnect"], 1);
    assert_eq!(c["TcpInputUncleanDisconnect"], 1);
    poll_until("the idle clients' clean disconnects", WAIT, || {
        let c = dory.counters()?;
        // The sending clients closed cleanly too: one of each kind.
        let (u, t) = (
            c["UnixStreamInputCleanDisconnect"],
            c["TcpInputCleanDisconnect"],
        );
        if u == 2 && t == 2 {
            Ok(())
        } else {
            Err(format!("clean disconnects: {u} UNIX, {t} TCP"))
        }
    });
    dory.assert_invariant();
    assert_eq!(dory.terminate(WAIT).code(), Some(0));
}

//! `--streams auto` over long links (issue 19, streams sized from what
//! the link holds): a send that starts with one stream adds streams while
//! their send buffers, not the link, bound them, and adds none where one
//! stream fills the link. What the test establishes itself: the link (the
//! lab's delay line at 30 ms, its rate), the sending host's buffer limit
//! (tcp_wmem in the namespace it made), the TCP connections that reached
//! the server and the bytes each carried (a proxy beside the server
//! counts them), the files' BLAKE3. Root only (namespaces, TUN).

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use intact_faults::{FlipProxy, Netbed, ProxyFault, Wan};
use intact_proto::Key;
use intact_transfer::{send, CopyReport, SendOptions, ServerConfig};

mod common;
use common::ServerIn;

const MIB: usize = 1 << 20;
const RTT: Duration = Duration::from_millis(30);

/// What one send across a bed did, as the proxy counted it.
struct Seen {
    report: CopyReport,
    /// Client-to-server bytes per TCP connection, in accept order.
    per_connection: Vec<u64>,
}

impl Seen {
    /// The report's account of the streams' growth (printed, with the
    /// proxy's count, for a failing run's log).
    fn tuning(&self) -> &intact_transfer::StreamsReport {
        let t = self
            .report
            .streams
            .as_ref()
            .expect("a tuned send reports it");
        println!("{t:?}; per connection {:?}", self.per_connection);
        t
    }
}

/// Sends `files` files of `size` bytes from the bed's source, starting
/// with `start` streams and allowed up to `max`, to a server in the
/// destination behind a counting proxy there; checks every file arrived
/// whole.
fn send_across(bed: &Netbed, start: usize, max: usize, files: usize, size: usize) -> Seen {
    let src = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut paths: Vec<PathBuf> = Vec::new();
    let mut digests = Vec::new();
    for i in 0..files {
        let data = intact_sample::bytes(size, 40 + i as u64);
        let p = src.path().join(format!("f{i}.dat"));
        fs::write(&p, &data).unwrap();
        digests.push(blake3::hash(&data));
        paths.push(p);
    }
    let key = Key::generate().unwrap();
    let server = ServerIn::start(
        &bed.destination,
        ServerConfig {
            key: Some(key.clone()),
            encrypt: true,
            // No device-level verification: what is measured here is the
            // streams, on whatever file system the temporary root is.
            ..ServerConfig::local(root.path())
        },
    );
    let (target, listen) = (server.addr.clone(), format!("{}:0", bed.destination.ip));
    let proxy = bed
        .destination
        .spawn(move || FlipProxy::start_on(&listen, target, ProxyFault::FlipAt(Vec::new())))
        .unwrap()
        .join()
        .unwrap()
        .unwrap();
    let addr = proxy.addr();
    let report = bed
        .source
        .spawn(move || {
            let o = SendOptions {
                key: Some(key),
                verify: intact_transfer::VerifyMode::Block,
                streams: start,
                max_streams: max,
                block_size: MIB,
                ..SendOptions::default()
            };
            send(&paths, &addr, &o, &|_| {}).unwrap()
        })
        .unwrap()
        .join()
        .unwrap();
    let per_connection = proxy.forwarded_per_connection();
    drop(server);
    common::assert_line_lived(bed);
    assert_eq!(report.failed, 0, "{report:?}");
    for (i, d) in digests.iter().enumerate() {
        let got = fs::read(root.path().join(format!("f{i}.dat"))).unwrap();
        assert_eq!(blake3::hash(&got), *d, "f{i}.dat differs");
    }
    Seen {
        report,
        per_connection,
    }
}

fn bed(rate: u64) -> Netbed {
    Netbed::with_wan(Wan {
        rtt: RTT,
        rate,
        loss: 0.0,
        mtu: 9000,
    })
    .unwrap()
}

#[test]
fn streams_are_added_where_their_send_buffers_bound_them_and_the_link_had_room() {
    if !common::bed_usable(
        "streams_are_added_where_their_send_buffers_bound_them_and_the_link_had_room",
    ) {
        return;
    }
    // 1 Gbit/s at 30 ms with the sender's buffers capped at 512 KiB: one
    // stream carries ~100 Mbit/s, a tenth of the link.
    let bed = bed(1_000_000_000);
    bed.source.cap_send_buffer(512 << 10).unwrap();
    let seen = send_across(&bed, 1, 8, 12, 4 * MIB);
    let t = seen.tuning();
    let carried: Vec<&u64> = seen
        .per_connection
        .iter()
        .filter(|&&b| b >= MIB as u64)
        .collect();
    assert!(
        carried.len() >= 2,
        "the streams never grew past one: the proxy saw {:?} bytes per connection; the report: {t:?}",
        seen.per_connection
    );
    assert_eq!(
        t.ended,
        seen.per_connection.len(),
        "the report's streams against the connections the proxy counted: {t:?}"
    );
    assert_eq!(t.started, 1, "{t:?}");
    assert!(!t.steps.is_empty(), "{t:?}");
}

#[test]
fn no_stream_is_added_where_one_fills_the_link() {
    if !common::bed_usable("no_stream_is_added_where_one_fills_the_link") {
        return;
    }
    // 100 Mbit/s at 30 ms: the bandwidth-delay product (375 KB) is far
    // below one stream's default 4 MiB buffer, so one stream fills the
    // link and queues at its bottleneck.
    let bed = bed(100_000_000);
    let seen = send_across(&bed, 1, 8, 12, 2 * MIB);
    let t = seen.tuning();
    assert_eq!(
        seen.per_connection.len(),
        1,
        "streams were added on a link one fills: {t:?}"
    );
    assert_eq!((t.started, t.ended), (1, 1), "{t:?}");
}

#[test]
fn twenty_streams_connect_across_a_long_link_although_a_server_takes_sixteen_handshakes_at_once() {
    if !common::bed_usable("twenty_streams_connect_across_a_long_link") {
        return;
    }
    // Every handshake takes a round trip or more, so connects started all
    // at once would have twenty in progress at the server, which refuses
    // a seventeenth from one address: a send's streams connect in waves.
    let bed = bed(1_000_000_000);
    let seen = send_across(&bed, 20, 20, 24, 256 << 10);
    assert_eq!(seen.per_connection.len(), 20, "{:?}", seen.per_connection);
}

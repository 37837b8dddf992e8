//! `--spread auto` over a long link (issue 19): across the lab's 30 ms,
//! 1 Gbit/s delay line, a send with default options finds the round trip
//! and spreads one large file over its streams; the file arrives whole at
//! level device, encrypted on the wire. What the test establishes itself:
//! the line's delay (so the measured round trip has a floor), the file's
//! BLAKE3, its bytes read back from the device of the ext4 it made. Root
//! only (namespaces, TUN, loop devices).

use std::fs;
use std::path::Path;
use std::time::Duration;

use intact_faults::{Netbed, Wan};
use intact_proto::Key;
use intact_transfer::{send, SendOptions, ServerConfig, VerifyLevel};

mod common;
use common::ServerIn;

const MIB: usize = 1 << 20;
const RTT: Duration = Duration::from_millis(30);

#[test]
fn auto_spreads_a_large_file_over_the_streams_across_a_30_ms_link() {
    let name = "auto_spreads_a_large_file_over_the_streams_across_a_30_ms_link";
    if !common::bed_usable(name) {
        return;
    }
    let bed = Netbed::with_wan(Wan {
        rtt: RTT,
        rate: 1_000_000_000,
        loss: 0.0,
        mtu: 9000,
    })
    .unwrap();
    let lfs = intact_faults::LoopFs::new(Path::new(env!("CARGO_TARGET_TMPDIR")), 160).unwrap();
    let src = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = intact_sample::bytes(48 * MIB + 555, 31);
    let file = src.path().join("big.dat");
    fs::write(&file, &data).unwrap();
    let root = lfs.mnt().join("recv");
    fs::create_dir_all(&root).unwrap();
    let key = Key::generate().unwrap();

    let server = ServerIn::start(
        &bed.destination,
        ServerConfig {
            key: Some(key.clone()),
            encrypt: true,
            ..ServerConfig::local(&root)
        },
    );
    let addr = server.addr.clone();
    let report = bed
        .source
        .spawn(move || {
            let o = SendOptions {
                key: Some(key),
                ..SendOptions::default()
            };
            send(&[file], &addr, &o, &|_| {}).unwrap()
        })
        .unwrap()
        .join()
        .unwrap();
    drop(server);
    common::assert_line_lived(&bed);

    assert_eq!(report.failed, 0, "{report:?}");
    let spread = report.spread.as_ref().expect("send reports its spread");
    assert!(
        spread.rtt_seconds >= RTT.as_secs_f64() * 0.95,
        "a connect across a {RTT:?} line took {} s",
        spread.rtt_seconds
    );
    assert_eq!(spread.files, 1, "{spread:?}");
    assert!(spread.ranges >= 3, "{spread:?}");
    assert!(
        report
            .frames
            .as_deref()
            .unwrap_or("")
            .starts_with("encrypted"),
        "{:?}",
        report.frames
    );
    let files: Vec<_> = report.files.iter().filter(|f| f.kind == "file").collect();
    assert_eq!(files.len(), 1, "one row for the file: {files:?}");
    let f = files[0];
    assert_eq!(f.level, Some(VerifyLevel::Device), "{f:?}");
    assert!(f.range.is_none());
    assert_eq!(
        f.digest.as_deref(),
        Some(blake3::hash(&data).to_hex().as_str())
    );

    // The bytes as the device holds them.
    let got = root.join("big.dat");
    let fd = fs::File::open(&got).unwrap();
    let ev = intact_cache::evict(&fd, 0, data.len() as u64).unwrap();
    assert_eq!(ev.resident, 0, "could not drop the file from the cache");
    assert!(
        fs::read(&got).unwrap() == data,
        "the bytes on the device differ"
    );
}

//! One large file spread over a send's streams (issue 19, line rate on
//! long fat links): the file goes out as block ranges, one stream each,
//! and the server commits it once, whole. What the tests establish
//! themselves: the bytes each TCP connection carried (a proxy counts
//! them), the file's BLAKE3 and its bytes read from the device of an
//! ext4 the test made, the faults the proxy injected, the kill it made.

mod common;

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;

use common::{on_device, partials, Server};
use intact_faults::{FlipProxy, ProxyFault, Victim};
use serde_json::Value;

const MIB: usize = 1 << 20;

/// `intact send --json --block-size 1MiB ARGS… SRC ADDR` (4 streams by
/// default); the
/// exit status and the report. `victim`, if given, is named as the
/// sender's process.
fn send(src: &Path, addr: &str, args: &[&str], victim: Option<&Victim>) -> (Option<i32>, Value) {
    let mut all = vec!["--block-size", "1MiB"];
    all.extend_from_slice(args);
    let (status, report) = common::send_json(&all, src, addr, victim);
    if status.signal().is_some() {
        return (None, Value::Null);
    }
    (status.code(), report.unwrap_or(Value::Null))
}

fn row<'a>(report: &'a Value, path: &str) -> &'a Value {
    let rows: Vec<&Value> = report["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["path"] == path)
        .collect();
    assert_eq!(rows.len(), 1, "one row for {path}: {report:#}");
    rows[0]
}

/// A proxy that changes nothing and counts each connection's bytes.
fn counting_proxy(server: &Server) -> FlipProxy {
    FlipProxy::start(server.addr(), ProxyFault::FlipAt(Vec::new())).unwrap()
}

#[test]
fn one_large_file_is_spread_over_the_streams_and_committed_whole_at_device_level() {
    let test = "one_large_file_is_spread_over_the_streams_and_committed_whole_at_device_level";
    let Some(fs_) = common::loop_ext4(test, 256) else {
        return;
    };
    let dir = fs_.mnt().to_path_buf();
    let src = dir.join("src");
    fs::create_dir_all(&src).unwrap();
    let big = intact_sample::bytes(72 * MIB + 12345, 19);
    fs::write(src.join("big.dat"), &big).unwrap();
    fs::write(src.join("small.dat"), intact_sample::bytes(3 * MIB, 20)).unwrap();
    let root = dir.join("dst");
    let server = Server::start(&root);
    let proxy = counting_proxy(&server);

    let (code, report) = send(&src, &proxy.addr(), &["--spread", "always"], None);
    assert_eq!(code, Some(0), "{report:#}");
    // One row per entry: the ranges are joined back into their file.
    assert_eq!(report["files"].as_array().unwrap().len(), 3, "{report:#}");
    let b = row(&report, "src/big.dat");
    assert!(b.get("range").is_none(), "{b:#}");
    assert_eq!(b["level"], "device", "{b:#}");
    assert_eq!(b["size"], big.len() as u64);
    assert_eq!(b["bytes_sent"], big.len() as u64);
    assert_eq!(b["blocks"], 73);
    assert_eq!(b["digest"], blake3::hash(&big).to_hex().as_str(), "{b:#}");
    assert_eq!(report["spread"]["files"], 1, "{report:#}");
    assert!(report["spread"]["ranges"].as_u64().unwrap() >= 4);

    // Without spreading, one connection would carry the 72 MiB file and
    // the others the 3 MiB one at most.
    let per = proxy.forwarded_per_connection();
    assert_eq!(per.len(), 4, "{per:?}");
    let busy = per.iter().filter(|&&n| n >= 12 * MIB as u64).count();
    assert!(busy >= 2, "the file's bytes rode one stream: {per:?}");

    assert_eq!(on_device(&root.join("src/big.dat")), big);
    assert!(partials(&root).is_empty(), "{:?}", partials(&root));

    // Sent again: every range is found committed and unchanged.
    let (code, again) = send(&src, &server.addr(), &["--spread", "always"], None);
    assert_eq!(code, Some(0), "{again:#}");
    let b = row(&again, "src/big.dat");
    assert_eq!(b["bytes_sent"], 0, "{b:#}");
    assert_eq!(b["unchanged"], true, "{b:#}");
}

#[test]
fn a_range_that_fails_keeps_the_final_name_away_and_the_next_send_completes_the_file() {
    let test = "a_range_that_fails_keeps_the_final_name_away_and_the_next_send_completes_the_file";
    let Some(fs_) = common::loop_ext4(test, 256) else {
        return;
    };
    let dir = fs_.mnt().to_path_buf();
    let src = dir.join("src");
    fs::create_dir_all(&src).unwrap();
    let big = intact_sample::bytes(80 * MIB + 4321, 21);
    fs::write(src.join("big.dat"), &big).unwrap();
    let root = dir.join("dst");
    let server = Server::start(&root);
    // One bit flipped 6 MiB into every connection: inside the first range
    // each stream sends. No resends are allowed, so those ranges fail.
    let proxy = FlipProxy::start(server.addr(), ProxyFault::FlipAt(vec![6 * MIB as u64])).unwrap();
    let (code, report) = send(
        &src,
        &proxy.addr(),
        &["--spread", "always", "--retries", "0"],
        None,
    );
    assert!(proxy.flipped() >= 1, "the proxy flipped nothing");
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(report["spread"]["files"], 1, "{report:#}");
    let b = row(&report, "src/big.dat");
    assert!(b["error"].is_string(), "{b:#}");
    assert!(
        b.get("level").is_none(),
        "a failed file claims no level: {b:#}"
    );
    assert!(
        !root.join("src/big.dat").exists(),
        "a file with a failed range got its final name"
    );

    let (code, again) = send(&src, &server.addr(), &["--spread", "always"], None);
    assert_eq!(code, Some(0), "{again:#}");
    let b = row(&again, "src/big.dat");
    assert_eq!(b["level"], "device", "{b:#}");
    assert_eq!(b["digest"], blake3::hash(&big).to_hex().as_str());
    assert_eq!(on_device(&root.join("src/big.dat")), big);
}

#[test]
fn a_sender_killed_mid_spread_resumes_from_the_ranges_the_server_confirmed() {
    let test = "a_sender_killed_mid_spread_resumes_from_the_ranges_the_server_confirmed";
    let Some(fs_) = common::loop_ext4(test, 320) else {
        return;
    };
    let dir = fs_.mnt().to_path_buf();
    let src = dir.join("src");
    fs::create_dir_all(&src).unwrap();
    let size = 96 * MIB + 777;
    let big = intact_sample::bytes(size, 22);
    fs::write(src.join("big.dat"), &big).unwrap();
    let root = dir.join("dst");
    let server = Server::start(&root);
    // 16 MiB ranges, 4 streams: after 88 MiB the first four ranges have
    // been sent whole for at least 0.5 s (at 40 MiB/s), time for the
    // server to verify and confirm them however loaded the machine.
    let victim = Victim::new();
    let proxy = FlipProxy::start(
        server.addr(),
        ProxyFault::KillAfter(88 * MIB as u64, victim.clone()),
    )
    .unwrap();
    let (code, _) = send(
        &src,
        &proxy.addr(),
        &["--spread", "always", "--bwlimit", "40MiB"],
        Some(&victim),
    );
    assert!(victim.killed(), "the proxy killed the sender");
    assert_eq!(code, None, "the sender died mid-transfer");
    assert!(
        !root.join("src/big.dat").exists(),
        "the file got its final name with ranges missing"
    );
    // The server ends the dead sender's session (its log says so).
    loop {
        let line = server
            .log
            .recv()
            .expect("the server logs the session's end");
        if line.contains(" received in ") {
            break;
        }
    }
    drop(proxy);

    let (code, again) = send(&src, &server.addr(), &["--spread", "always"], None);
    assert_eq!(code, Some(0), "{again:#}");
    assert_eq!(again["spread"]["files"], 1, "{again:#}");
    let b = row(&again, "src/big.dat");
    let sent = b["bytes_sent"].as_u64().unwrap();
    assert!(
        sent <= (size - 16 * MIB) as u64,
        "the resumed send sent {sent} of {size} bytes: no confirmed range was kept"
    );
    assert_eq!(b["level"], "device", "{b:#}");
    assert_eq!(b["digest"], blake3::hash(&big).to_hex().as_str());
    assert_eq!(on_device(&root.join("src/big.dat")), big);
}

#[test]
fn a_spread_file_held_unchanged_rot_named_and_repaired_by_the_advice_given() {
    let test = "a_spread_file_held_unchanged_rot_named_and_repaired_by_the_advice_given";
    let Some(fs_) = common::loop_ext4(test, 192) else {
        return;
    };
    let dir = fs_.mnt().to_path_buf();
    let src = dir.join("src");
    fs::create_dir_all(&src).unwrap();
    let big = intact_sample::bytes(40 * MIB + 99, 24);
    fs::write(src.join("big.dat"), &big).unwrap();
    let root = dir.join("dst");
    let server = Server::start(&root);
    let (code, report) = send(&src, &server.addr(), &["--spread", "never"], None);
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(report["spread"]["files"], 0);

    // Spread now: a file committed whole is received again as ranges
    // (only the split that committed a file answers for it held).
    let (code, again) = send(&src, &server.addr(), &["--spread", "always"], None);
    assert_eq!(code, Some(0), "{again:#}");
    assert_eq!(again["spread"]["files"], 1, "{again:#}");
    let b = row(&again, "src/big.dat");
    assert_eq!(b["bytes_sent"], big.len() as u64, "{b:#}");
    assert_eq!(b["level"], "device", "{b:#}");

    // The same spread send again: every range found held, nothing sent.
    let (code, held) = send(&src, &server.addr(), &["--spread", "always"], None);
    assert_eq!(code, Some(0), "{held:#}");
    let b = row(&held, "src/big.dat");
    assert_eq!(b["bytes_sent"], 0, "{b:#}");
    assert_eq!(b["unchanged"], true, "{b:#}");

    // A block that rotted under the final file (its mtime kept): the
    // ranges' reads of the final file find it, and the run fails naming
    // it rather than calling the file unchanged; the file is left alone.
    let dst = root.join("src/big.dat");
    let meta = fs::metadata(&dst).unwrap();
    let mut bytes = fs::read(&dst).unwrap();
    bytes[17 * MIB + 5] ^= 0x10;
    fs::write(&dst, &bytes).unwrap();
    set_mtime(&dst, filetime_of(&meta));
    let (code, rot) = send(&src, &server.addr(), &["--spread", "always"], None);
    assert_eq!(code, Some(1), "{rot:#}");
    let b = row(&rot, "src/big.dat");
    let why = b["error"].as_str().unwrap_or_default();
    assert!(why.contains("differs from the source"), "{b:#}");
    assert!(why.contains("--spread never --reverify"), "{b:#}");
    assert!(
        fs::read(&dst).unwrap() == bytes,
        "the held file was rewritten"
    );

    // The advice works: the whole file re-verified, its bad block resent.
    let (code, fixed) = send(
        &src,
        &server.addr(),
        &["--spread", "never", "--reverify"],
        None,
    );
    assert_eq!(code, Some(0), "{fixed:#}");
    assert_eq!(row(&fixed, "src/big.dat")["level"], "device");
    assert_eq!(on_device(&dst), big);
}

fn filetime_of(meta: &fs::Metadata) -> libc::timespec {
    use std::os::unix::fs::MetadataExt;
    libc::timespec {
        tv_sec: meta.mtime(),
        tv_nsec: meta.mtime_nsec(),
    }
}

/// Sets `path`'s mtime back (utimensat), as silent rot would leave it.
fn set_mtime(path: &Path, mtime: libc::timespec) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let times = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        mtime,
    ];
    // SAFETY: a valid C string and two timespecs, as utimensat takes.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) };
    assert_eq!(r, 0, "utimensat: {}", std::io::Error::last_os_error());
}

#[test]
fn files_ride_one_stream_where_spreading_is_off_or_cannot_verify_a_range() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let big = intact_sample::bytes(40 * MIB, 23);
    fs::write(src.join("big.dat"), &big).unwrap();
    for (i, (args, why)) in [
        (&["--spread", "never"][..], "--spread never"),
        (
            &["--spread", "always", "--verify", "sequential"][..],
            "verifies a file as a whole",
        ),
        (&["--spread", "always", "--streams", "1"][..], "one stream"),
        (&[][..], "round trip"),
    ]
    .into_iter()
    .enumerate()
    {
        let root = dir.path().join(format!("dst{i}"));
        let server = Server::start(&root);
        let proxy = counting_proxy(&server);
        let (code, report) = send(&src, &proxy.addr(), args, None);
        assert_eq!(code, Some(0), "{args:?}: {report:#}");
        let spread = &report["spread"];
        let rtt = spread["rtt_seconds"].as_f64().unwrap();
        if args.is_empty() && rtt >= 0.001 {
            // auto on loopback: only a connect slowed past 1 ms by load
            // spreads; say so rather than fail.
            eprintln!("loopback connect took {rtt} s: auto spread, as it should");
            continue;
        }
        assert_eq!(spread["files"], 0, "{args:?}: {report:#}");
        assert!(
            spread["why"].as_str().unwrap().contains(why),
            "{args:?}: {spread:#}"
        );
        let per = proxy.forwarded_per_connection();
        assert!(
            per.iter().any(|&n| n >= 40 * MIB as u64),
            "{args:?}: no connection carried the whole file: {per:?}"
        );
        assert_eq!(fs::read(root.join("src/big.dat")).unwrap(), big);
    }
}

/// A spread file below the aim says why, whichever end lowered it: the
/// reason one range gave reaches the joined row (a tmpfs the test mounted
/// has no device below it, at the source or at the destination).
#[test]
fn a_spread_file_below_the_aim_says_which_end_lowered_it_and_why() {
    let test = "a_spread_file_below_the_aim_says_which_end_lowered_it_and_why";
    let Some(ext4) = common::loop_ext4(test, 128) else {
        return;
    };
    let Some(shm) = intact_testkit::tmpfs(test) else {
        return;
    };
    let big = intact_sample::bytes(40 * MIB + 777, 23);
    for (src_on, dst_on, end) in [
        (shm.path(), ext4.mnt(), "source"),
        (ext4.mnt(), shm.path(), "destination"),
    ] {
        let src = src_on.join(format!("src-{end}"));
        fs::create_dir_all(&src).unwrap();
        fs::write(src.join("big.dat"), &big).unwrap();
        let root = dst_on.join(format!("dst-{end}"));
        let server = Server::start(&root);
        let (code, report) = send(&src, &server.addr(), &["--spread", "always"], None);
        assert_eq!(code, Some(0), "{report:#}");
        assert_eq!(report["spread"]["files"], 1, "{report:#}");
        let b = row(&report, &format!("src-{end}/big.dat"));
        assert_eq!(b["level"], "cache", "{b:#}");
        let note = b["note"]
            .as_str()
            .unwrap_or_else(|| panic!("no note: {b:#}"));
        assert!(
            note.contains(&format!("the {end} is on tmpfs")) && note.contains("blocks "),
            "{note}"
        );
        assert_eq!(b["digest"], blake3::hash(&big).to_hex().as_str(), "{b:#}");
        let got = fs::read(root.join(format!("src-{end}/big.dat"))).unwrap();
        assert!(got == big, "the bytes the server holds");
        drop(server);
        fs::remove_dir_all(&src).unwrap();
        fs::remove_dir_all(&root).unwrap();
    }
}

//! `scrub` with a replica: rot made under a cataloged file (on a
//! loop-mounted ext4's device, root only; or written in place with the
//! mtime put back) is fetched page by page from a replica directory or an
//! intact server, checked against the catalog, written, re-read, and the
//! bytes the test reads back afterwards are the source's. A replica whose
//! bytes differ from the catalog too is never written; a server not
//! started with --allow-fetch refuses.

use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use intact_faults::LoopFs;
use intact_transfer::{
    copy, open_catalog, scrub, LocalServer, ReceiveOptions, Replica, ScrubOptions, ScrubReport,
    ServerConfig, VerifyLevel, VerifyMode,
};

mod common;
const BS: usize = 256 * 1024;

fn copy_into(src: &Path, names: &[&str], dst: &Path, verify: VerifyMode) {
    let o = common::copy_opts(verify, BS);
    let sources: Vec<_> = names.iter().map(|n| src.join(n)).collect();
    let r = copy(&sources, dst, &o, &|_| {}).unwrap();
    assert_eq!(r.failed, 0, "{r:?}");
}

fn run(root: &Path, replica: Option<&mut Replica>) -> ScrubReport {
    scrub(root, &ScrubOptions::default(), replica, true, &mut |_| {}).expect("scrub runs")
}

fn file<'a>(r: &'a ScrubReport, path: &str) -> &'a intact_transfer::FileScrub {
    r.reports
        .iter()
        .find(|f| f.path == path)
        .unwrap_or_else(|| panic!("{path} not in {r:?}"))
}

/// Changes the byte at `at` in place as rot would: size and mtime kept.
fn rot_in_place(path: &Path, at: u64) {
    let mtime = fs::metadata(path).unwrap().modified().unwrap();
    let f = File::options().read(true).write(true).open(path).unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x10], at).unwrap();
    f.set_modified(mtime).unwrap();
    f.sync_all().unwrap();
}

#[test]
fn repair_from_a_local_replica_rewrites_the_rotten_pages_on_the_device() {
    let name = "repair_from_a_local_replica_rewrites_the_rotten_pages_on_the_device";
    if let Err(why) = intact_faults::usable() {
        intact_testkit::skip(name, &why);
        return;
    }
    let lfs = Arc::new(LoopFs::new(Path::new(env!("CARGO_TARGET_TMPDIR")), 64).unwrap());
    let src = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let big = intact_sample::bytes(3 * BS + 5000, 31);
    fs::write(src.path().join("big"), &big).unwrap();
    let dst = lfs.mnt().join("dst");
    copy_into(src.path(), &["big"], &dst, VerifyMode::Riva);

    // Two flips on the device: a page of block 1 and the short last page
    // of the last block (bytes 3*BS+4096 .. 3*BS+5000).
    let hits = [BS as u64 + 5 * 4096 + 10, 3 * BS as u64 + 4096 + 300];
    let f = File::open(dst.join("big")).unwrap();
    for &at in &hits {
        lfs.flip_bit_under(&f, at).unwrap();
        assert_ne!(lfs.device_byte_under(&f, at).unwrap(), big[at as usize]);
    }
    drop(f);

    let mut replica = Replica::local(src.path()).unwrap();
    let rep = run(&dst, Some(&mut replica));
    let b = file(&rep, "big");
    assert_eq!(b.state, "repaired", "{rep:?}");
    assert_eq!((rep.repaired, rep.rotten), (1, 0), "{rep:?}");
    assert!(!rep.damaged());
    let r = b.repair.as_ref().unwrap();
    assert_eq!(r.error, None);
    assert_eq!(r.bytes, 4096 + 904, "only the two rotten pages: {r:?}");
    assert_eq!(rep.fetched_bytes, 4096 + 904);
    assert_eq!(r.level, VerifyLevel::Device, "{r:?}");

    // What the device holds now is the source's, and the mtime is the
    // cataloged one.
    let f = File::open(dst.join("big")).unwrap();
    for &at in &hits {
        assert_eq!(lfs.device_byte_under(&f, at).unwrap(), big[at as usize]);
    }
    assert_eq!(
        f.metadata().unwrap().modified().unwrap(),
        fs::metadata(src.path().join("big"))
            .unwrap()
            .modified()
            .unwrap()
    );
    drop(f);
    lfs.remount().unwrap();
    assert!(fs::read(dst.join("big")).unwrap() == big, "after a remount");

    let again = run(&dst, None);
    assert_eq!((again.clean, again.rotten), (1, 0), "{again:?}");
    assert_eq!(file(&again, "big").level, VerifyLevel::Device);
    let (journal, _) = open_catalog(&dst).unwrap();
    let s = journal.catalog_summary().unwrap();
    assert_eq!((s.repairs, s.repaired_bytes), (1, 4096 + 904), "{s:?}");
}

fn server(root: &Path, allow_fetch: bool) -> LocalServer {
    LocalServer::start(ServerConfig {
        receive: ReceiveOptions {
            allow_fetch,
            ..ReceiveOptions::default()
        },
        ..ServerConfig::local(root)
    })
    .unwrap()
}

#[test]
fn repair_over_the_network_from_a_server_that_allows_fetch_and_not_from_one_that_does_not() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let replica_root = tempfile::tempdir().unwrap();
    let data = intact_sample::bytes(2 * BS + 100, 32);
    fs::create_dir(src.path().join("d")).unwrap();
    fs::write(src.path().join("d/f"), &data).unwrap();
    copy_into(src.path(), &["d"], dst.path(), VerifyMode::Block);
    fs::create_dir(replica_root.path().join("d")).unwrap();
    fs::write(replica_root.path().join("d/f"), &data).unwrap();
    let at = BS as u64 + 3 * 4096 + 1;
    rot_in_place(&dst.path().join("d/f"), at);

    // Refused without --allow-fetch: nothing written, still rot.
    let closed = server(replica_root.path(), false);
    let mut replica = Replica::remote(&closed.addr(), None, None);
    let rep = run(dst.path(), Some(&mut replica));
    let f = file(&rep, "d/f");
    assert_eq!(f.state, "rot", "{rep:?}");
    let why = f.repair.as_ref().unwrap().error.as_deref().unwrap();
    assert!(why.contains("--allow-fetch"), "{why}");
    assert_eq!(f.repair.as_ref().unwrap().bytes, 0);
    assert!(rep.damaged());
    replica.close();
    closed.stop().unwrap();
    assert_ne!(fs::read(dst.path().join("d/f")).unwrap(), data);

    let open = server(replica_root.path(), true);
    let mut replica = Replica::remote(&open.addr(), None, None);
    let rep = run(dst.path(), Some(&mut replica));
    replica.close();
    open.stop().unwrap();
    let f = file(&rep, "d/f");
    assert_eq!(f.state, "repaired", "{rep:?}");
    assert_eq!(f.repair.as_ref().unwrap().bytes, 4096);
    assert_eq!(rep.fetched_bytes, 4096);
    assert!(fs::read(dst.path().join("d/f")).unwrap() == data);
    assert_eq!(run(dst.path(), None).clean, 1);
}

#[test]
fn a_replica_whose_bytes_differ_from_the_catalog_too_is_never_written() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let bad_replica = tempfile::tempdir().unwrap();
    let data = intact_sample::bytes(BS + 9000, 33);
    fs::write(src.path().join("f"), &data).unwrap();
    copy_into(src.path(), &["f"], dst.path(), VerifyMode::Block);
    let at = 4096 * 7 + 5;
    rot_in_place(&dst.path().join("f"), at);
    let rotten = fs::read(dst.path().join("f")).unwrap();
    // The replica's copy is wrong in the same page (another byte of it).
    let mut other = data.clone();
    other[at as usize + 1] ^= 1;
    fs::write(bad_replica.path().join("f"), &other).unwrap();

    let mut replica = Replica::local(bad_replica.path()).unwrap();
    let rep = run(dst.path(), Some(&mut replica));
    let f = file(&rep, "f");
    assert_eq!(f.state, "rot", "{rep:?}");
    let r = f.repair.as_ref().unwrap();
    assert_eq!(r.bytes, 0);
    assert!(
        r.error
            .as_deref()
            .unwrap()
            .contains("do not match the catalog either"),
        "{r:?}"
    );
    assert_eq!(fs::read(dst.path().join("f")).unwrap(), rotten);
}

#[test]
fn a_file_the_catalog_knows_only_whole_is_repaired_whole() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let data = intact_sample::bytes(300_000, 34);
    fs::write(src.path().join("n"), &data).unwrap();
    copy_into(src.path(), &["n"], dst.path(), VerifyMode::None);
    rot_in_place(&dst.path().join("n"), 250_000);
    let mut replica = Replica::local(src.path()).unwrap();
    let rep = run(dst.path(), Some(&mut replica));
    let n = file(&rep, "n");
    assert_eq!(n.state, "repaired", "{rep:?}");
    assert_eq!(n.rot[0].failed, vec!["blake3"]);
    assert_eq!(n.repair.as_ref().unwrap().bytes, 300_000);
    assert!(fs::read(dst.path().join("n")).unwrap() == data);
    assert_eq!(run(dst.path(), None).clean, 1);
}

#[test]
fn a_root_with_16_kib_pages_names_and_repairs_rot_by_16_kib_page() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let data = intact_sample::bytes(2 * BS + 3000, 41);
    fs::write(src.path().join("f"), &data).unwrap();
    // The root's catalog is made first, with its page size.
    let (journal, dir) = intact_transfer::open_or_create_catalog(dst.path()).unwrap();
    assert_eq!(dir, dst.path().join(".intact"));
    journal.set_page_size(3000).unwrap_err();
    journal.set_page_size(16384).unwrap();
    drop(journal);
    copy_into(src.path(), &["f"], dst.path(), VerifyMode::Block);
    // The copy wrote into that catalog (not a state of its own).
    let (journal, dir) = open_catalog(dst.path()).unwrap();
    assert_eq!(dir, dst.path().join(".intact"));
    assert_eq!(journal.page_size(), 16384);
    let err = journal.set_page_size(4096).unwrap_err().to_string();
    assert!(err.contains("before the first file"), "{err}");
    drop(journal);

    let at = BS as u64 + 2 * 16384 + 100;
    rot_in_place(&dst.path().join("f"), at);
    let found = run(dst.path(), None);
    let f = file(&found, "f");
    assert_eq!(f.state, "rot", "{found:?}");
    assert_eq!(
        (f.rot[0].offset, f.rot[0].len),
        (at / 16384 * 16384, 16384),
        "one 16 KiB page: {f:?}"
    );

    let mut replica = Replica::local(src.path()).unwrap();
    let rep = run(dst.path(), Some(&mut replica));
    assert_eq!(file(&rep, "f").state, "repaired", "{rep:?}");
    assert_eq!(rep.fetched_bytes, 16384, "{rep:?}");
    assert!(fs::read(dst.path().join("f")).unwrap() == data);
}

#[test]
fn a_file_without_a_whole_file_digest_is_repaired_by_its_recorded_blocks() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let data = intact_sample::bytes(3 * BS + 777, 35);
    fs::write(src.path().join("f"), &data).unwrap();
    copy_into(src.path(), &["f"], dst.path(), VerifyMode::Riva);
    // An older build's row: block records with page CRCs, no BLAKE3.
    let (journal, dir) = open_catalog(dst.path()).unwrap();
    drop(journal);
    let db = rusqlite::Connection::open(dir.join("journal.sqlite")).unwrap();
    let n = db
        .execute(
            "UPDATE files SET digest = NULL WHERE path = CAST('f' AS BLOB)",
            [],
        )
        .unwrap();
    assert_eq!(n, 1, "the test's own row edit took");
    drop(db);
    rot_in_place(&dst.path().join("f"), BS as u64 + 5000);
    let mut replica = Replica::local(src.path()).unwrap();
    let rep = run(dst.path(), Some(&mut replica));
    let f = file(&rep, "f");
    assert_eq!(f.state, "repaired", "{rep:?}");
    assert_eq!((f.rot[0].offset, f.rot[0].len), (BS as u64 + 4096, 4096));
    assert_eq!(f.repair.as_ref().unwrap().bytes, 4096, "{f:?}");
    assert!(fs::read(dst.path().join("f")).unwrap() == data);
    assert_eq!(run(dst.path(), None).clean, 1);
}

#[test]
fn a_repair_keeps_to_the_scrubs_rate() {
    // Under --rate, what a repair reads counts as the scrub's own reads
    // do: at 1 MiB/s, the scrub's read of 1 MiB, the repair's read of
    // the four rotten blocks (1 MiB), its fetch of a page in each and
    // its re-read of those blocks (1 MiB) take at least three seconds
    // (the scrub's read alone, one).
    let src = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dst = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = intact_sample::bytes(4 * BS, 41);
    fs::write(src.path().join("f"), &data).unwrap();
    copy_into(src.path(), &["f"], dst.path(), VerifyMode::Riva);
    for block in 0..4 {
        rot_in_place(&dst.path().join("f"), (block * BS + 100) as u64);
    }
    let opts = ScrubOptions {
        rate: Some(1 << 20),
        ..ScrubOptions::default()
    };
    let mut replica = Replica::local(src.path()).unwrap();
    let t0 = std::time::Instant::now();
    let rep = scrub(dst.path(), &opts, Some(&mut replica), true, &mut |_| {}).unwrap();
    let took = t0.elapsed();
    assert_eq!(file(&rep, "f").state, "repaired", "{rep:?}");
    assert_eq!(rep.fetched_bytes, 4 * 4096, "{rep:?}");
    assert!(
        took >= std::time::Duration::from_millis(2950),
        "3 MiB and 16 KiB at 1 MiB/s took {took:?}"
    );
    assert_eq!(fs::read(dst.path().join("f")).unwrap(), data);
}

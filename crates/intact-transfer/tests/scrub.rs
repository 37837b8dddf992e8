//! The at-rest catalog and `scrub`: rot made on the device under a
//! cataloged file (a loop-mounted ext4, root only) is found and named by
//! page; a file another program changed is reported changed, not rotten;
//! a tmpfs root is scrubbed at level `cache`; an interrupted scrub goes on
//! where it stopped.

use std::fs::{self, File};
use std::path::Path;
use std::sync::Arc;

use intact_faults::LoopFs;
use intact_transfer::{
    copy, open_catalog, scrub, CopyOptions, ScrubOptions, ScrubReport, VerifyLevel, VerifyMode,
};

mod common;
const BS: usize = 256 * 1024;

fn opts(verify: VerifyMode) -> CopyOptions {
    common::copy_opts(verify, BS)
}

fn run_scrub(root: &Path, o: &ScrubOptions) -> ScrubReport {
    scrub(root, o, None, true, &mut |_| {}).expect("scrub runs")
}

fn file<'a>(r: &'a ScrubReport, path: &str) -> &'a intact_transfer::FileScrub {
    r.reports
        .iter()
        .find(|f| f.path == path)
        .unwrap_or_else(|| panic!("{path} not in {r:?}"))
}

#[test]
fn scrub_names_the_page_a_device_flip_hit_and_only_that_page() {
    if let Err(why) = intact_faults::usable() {
        intact_testkit::skip(
            "scrub_names_the_page_a_device_flip_hit_and_only_that_page",
            &why,
        );
        return;
    }
    let lfs = Arc::new(LoopFs::new(Path::new(env!("CARGO_TARGET_TMPDIR")), 64).unwrap());
    let src = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let big = intact_sample::bytes(3 * BS + 5000, 11);
    let small = intact_sample::bytes(10_000, 12);
    fs::write(src.path().join("big"), &big).unwrap();
    fs::write(src.path().join("small"), &small).unwrap();
    let dst = lfs.mnt().join("dst");
    let r = copy(
        &[src.path().join("big"), src.path().join("small")],
        &dst,
        &opts(VerifyMode::Riva),
        &|_| {},
    )
    .unwrap();
    assert_eq!(r.failed, 0, "{r:?}");

    // Clean at first, read from the device.
    let first = run_scrub(&dst, &ScrubOptions::default());
    assert_eq!(
        (first.files, first.clean, first.rotten),
        (2, 2, 0),
        "{first:?}"
    );
    assert_eq!(file(&first, "big").level, VerifyLevel::Device);

    // One bit flipped on the device in block 1, page 3 of that block.
    let at = BS as u64 + 3 * 4096 + 777;
    let f = File::open(dst.join("big")).unwrap();
    lfs.flip_bit_under(&f, at).unwrap();
    let on_device = lfs.device_byte_under(&f, at).unwrap();
    assert_ne!(
        on_device, big[at as usize],
        "the flip did not reach the device"
    );

    let second = run_scrub(&dst, &ScrubOptions::default());
    assert_eq!((second.rotten, second.clean), (1, 1), "{second:?}");
    assert!(second.damaged());
    let b = file(&second, "big");
    assert_eq!(b.state, "rot");
    assert_eq!(
        b.level,
        VerifyLevel::Device,
        "rot is named only from a device read"
    );
    assert_eq!(b.rot.len(), 1, "{b:?}");
    let page = at / 4096 * 4096;
    assert_eq!((b.rot[0].offset, b.rot[0].len), (page, 4096), "{b:?}");
    assert_eq!(b.rot[0].failed, vec!["crc32c", "xxh3-128"]);
    assert_eq!(file(&second, "small").state, "clean");

    // The status counts it.
    let (journal, _) = open_catalog(&dst).unwrap();
    let s = journal.catalog_summary().unwrap();
    drop(journal);
    assert_eq!(s.files, 2);
    assert_eq!(s.rot_bytes, 4096);
    assert!(s.scrub_states.contains(&("rot".to_string(), 1)), "{s:?}");

    // Put right on the device: the next scrub is clean again (the page
    // cache still holds the rotten byte the last scrub read).
    lfs.flip_bit_under(&f, at).unwrap();
    assert_eq!(lfs.device_byte_under(&f, at).unwrap(), big[at as usize]);
    let third = run_scrub(&dst, &ScrubOptions::default());
    assert_eq!((third.clean, third.rotten), (2, 0), "{third:?}");

    // A cold file (no page cached: the scrub only asks the device for it,
    // without evicting) is read from the device too.
    lfs.flip_bit_under(&f, at).unwrap();
    intact_cache::evict(&f, 0, big.len() as u64).unwrap();
    assert_eq!(intact_cache::resident(&f, 0, big.len() as u64).unwrap(), 0);
    let cold = run_scrub(&dst, &ScrubOptions::default());
    assert_eq!((cold.rotten, cold.clean), (1, 1), "{cold:?}");
    assert_eq!(file(&cold, "big").level, VerifyLevel::Device);
    assert_eq!(file(&cold, "big").rot[0].offset, page, "{cold:?}");

    // --direct: the page cache now holds the rotten byte the last scrub
    // read, and the device is put right under it. A direct read sees the
    // device (clean); a read through the cache would see rot.
    lfs.flip_bit_under(&f, at).unwrap();
    assert_eq!(lfs.device_byte_under(&f, at).unwrap(), big[at as usize]);
    let direct = run_scrub(
        &dst,
        &ScrubOptions {
            direct: true,
            ..ScrubOptions::default()
        },
    );
    assert_eq!((direct.clean, direct.rotten), (2, 0), "{direct:?}");
    assert_eq!(file(&direct, "big").level, VerifyLevel::Device);
    assert_eq!(file(&direct, "small").level, VerifyLevel::Device);
    // What only O_DIRECT leaves: no page of the file in the cache (an
    // evict-then-read scrub leaves what it read there).
    assert_eq!(intact_cache::resident(&f, 0, big.len() as u64).unwrap(), 0);
}

#[test]
fn a_file_another_program_changed_is_reported_changed_and_one_removed_missing() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    for (name, seed) in [("a", 1), ("b", 2), ("c", 3)] {
        fs::write(src.path().join(name), intact_sample::bytes(50_000, seed)).unwrap();
    }
    let sources: Vec<_> = ["a", "b", "c"].iter().map(|n| src.path().join(n)).collect();
    let r = copy(&sources, dst.path(), &opts(VerifyMode::Block), &|_| {}).unwrap();
    assert_eq!(r.failed, 0, "{r:?}");
    // Same size, new bytes, new mtime: another program's write.
    fs::write(dst.path().join("a"), intact_sample::bytes(50_000, 9)).unwrap();
    let t = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    File::options()
        .write(true)
        .open(dst.path().join("a"))
        .unwrap()
        .set_modified(t)
        .unwrap();
    fs::remove_file(dst.path().join("b")).unwrap();
    let rep = run_scrub(dst.path(), &ScrubOptions::default());
    assert_eq!(
        (rep.changed, rep.missing, rep.clean, rep.rotten),
        (1, 1, 1, 0),
        "{rep:?}"
    );
    let a = file(&rep, "a");
    assert_eq!(a.state, "changed");
    assert!(a.note.as_deref().unwrap().contains("not rot"), "{a:?}");
    assert!(a.rot.is_empty());
    assert_eq!(file(&rep, "b").state, "missing");
    assert!(rep.damaged(), "a missing file is damage");
}

#[test]
fn a_tmpfs_root_is_scrubbed_at_level_cache_never_device() {
    let Some(tmpfs) = intact_testkit::tmpfs("a_tmpfs_root_is_scrubbed_at_level_cache_never_device")
    else {
        return;
    };
    let src = tempfile::tempdir().unwrap();
    let dst = tmpfs.path().join("dst");
    fs::write(src.path().join("f"), intact_sample::bytes(300_000, 5)).unwrap();
    copy(
        &[src.path().join("f")],
        &dst,
        &opts(VerifyMode::Riva),
        &|_| {},
    )
    .unwrap();
    let rep = run_scrub(&dst, &ScrubOptions::default());
    assert_eq!((rep.files, rep.clean), (1, 1), "{rep:?}");
    assert_eq!(file(&rep, "f").level, VerifyLevel::Cache);
    assert_eq!((rep.at_device, rep.below_device), (0, 1));
}

#[test]
fn an_interrupted_scrub_goes_on_after_the_last_file_it_finished() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..6).map(|i| format!("f{i}")).collect();
    for (i, n) in names.iter().enumerate() {
        fs::write(src.path().join(n), intact_sample::bytes(20_000, i as u64)).unwrap();
    }
    let sources: Vec<_> = names.iter().map(|n| src.path().join(n)).collect();
    copy(&sources, dst.path(), &opts(VerifyMode::Block), &|_| {}).unwrap();
    // Stopped (by a panic in the progress callback) after two files.
    let stopped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        scrub(
            dst.path(),
            &ScrubOptions::default(),
            None,
            false,
            &mut |p| {
                if p.files == 2 {
                    panic!("interrupted");
                }
            },
        )
    }));
    assert!(stopped.is_err(), "the scrub was to be interrupted");
    let rest = run_scrub(dst.path(), &ScrubOptions::default());
    assert!(rest.resumed, "{rest:?}");
    assert_eq!(rest.files, 4, "only the files after the second: {rest:?}");
    // A new pass reads them all; --older-than then finds none due.
    let all = run_scrub(dst.path(), &ScrubOptions::default());
    assert!(!all.resumed);
    assert_eq!(all.files, 6);
    let due = run_scrub(
        dst.path(),
        &ScrubOptions {
            older_than: Some(std::time::Duration::from_secs(3600)),
            ..ScrubOptions::default()
        },
    );
    assert_eq!(due.files, 0, "{due:?}");
}

#[test]
fn a_file_without_block_records_is_held_against_its_whole_file_digest() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let data = intact_sample::bytes(40_000, 21);
    fs::write(src.path().join("n"), &data).unwrap();
    // `none` records no block digests: only the whole-file BLAKE3.
    let r = copy(
        &[src.path().join("n")],
        dst.path(),
        &opts(VerifyMode::None),
        &|_| {},
    )
    .unwrap();
    assert_eq!(r.failed, 0, "{r:?}");
    assert_eq!(run_scrub(dst.path(), &ScrubOptions::default()).clean, 1);
    // One byte changed in place, size and mtime kept: only the bytes tell.
    let path = dst.path().join("n");
    let mtime = fs::metadata(&path).unwrap().modified().unwrap();
    let mut changed = data.clone();
    changed[12_345] ^= 0x40;
    fs::write(&path, &changed).unwrap();
    File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let rep = run_scrub(dst.path(), &ScrubOptions::default());
    let n = file(&rep, "n");
    assert_eq!(n.state, "rot", "{rep:?}");
    assert_eq!((n.rot[0].offset, n.rot[0].len), (0, 40_000));
    assert_eq!(n.rot[0].failed, vec!["blake3"]);
}

#[test]
fn the_catalog_keeps_where_each_file_came_from_by_copy_and_by_send() {
    let host = fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let src = tempfile::tempdir().unwrap();
    fs::create_dir(src.path().join("d")).unwrap();
    fs::write(src.path().join("d/f"), intact_sample::bytes(9_000, 5)).unwrap();
    let want = format!("{}:{}/d/f", host.trim(), src.path().display());

    let by_copy = tempfile::tempdir().unwrap();
    let r = copy(
        &[src.path().join("d")],
        by_copy.path(),
        &opts(VerifyMode::Block),
        &|_| {},
    )
    .unwrap();
    assert_eq!(r.failed, 0, "{r:?}");
    let rep = run_scrub(by_copy.path(), &ScrubOptions::default());
    assert_eq!(file(&rep, "d/f").source.as_deref(), Some(want.as_str()));

    let by_send = tempfile::tempdir().unwrap();
    let server =
        intact_transfer::LocalServer::start(intact_transfer::ServerConfig::local(by_send.path()))
            .unwrap();
    let r = intact_transfer::send(
        &[src.path().join("d")],
        &server.addr(),
        &intact_transfer::SendOptions::default(),
        &|_| {},
    )
    .unwrap();
    server.stop().unwrap();
    assert_eq!(r.failed, 0, "{r:?}");
    let rep = run_scrub(by_send.path(), &ScrubOptions::default());
    assert_eq!(file(&rep, "d/f").source.as_deref(), Some(want.as_str()));
}

/// A scrub whose hook runs `act` once, after the first block of `path`
/// was read.
fn scrub_with_hook(
    root: &Path,
    replica: Option<&mut intact_transfer::Replica>,
    path: &'static str,
    act: impl Fn() + Send + Sync + 'static,
) -> ScrubReport {
    let once = std::sync::atomic::AtomicBool::new(false);
    let o = ScrubOptions {
        after_read: Some(intact_transfer::ScrubReadHook(Arc::new(move |p, index| {
            if p == path && index == 0 && !once.swap(true, std::sync::atomic::Ordering::SeqCst) {
                act();
            }
        }))),
        ..ScrubOptions::default()
    };
    scrub(root, &o, replica, true, &mut |_| {}).expect("scrub runs")
}

#[test]
fn a_file_written_while_it_is_scrubbed_is_changed_and_nothing_is_repaired_into_it() {
    let src = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dst = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = intact_sample::bytes(3 * BS + 100, 41);
    fs::write(src.path().join("f"), &data).unwrap();
    let r = copy(
        &[src.path().join("f")],
        dst.path(),
        &opts(VerifyMode::Riva),
        &|_| {},
    )
    .unwrap();
    assert_eq!(r.failed, 0, "{r:?}");
    // Another program rewrites block 2 after the scrub read block 0: the
    // bytes it reads there then differ from the catalog, which rot would
    // explain, but the file's mtime moved meanwhile.
    let target = dst.path().join("f");
    let theirs = vec![0x5au8; 1000];
    let (t, w) = (target.clone(), theirs.clone());
    let mut replica = intact_transfer::Replica::local(src.path()).unwrap();
    let rep = scrub_with_hook(dst.path(), Some(&mut replica), "f", move || {
        use std::os::unix::fs::FileExt;
        let f = File::options().write(true).open(&t).unwrap();
        f.write_all_at(&w, 2 * BS as u64 + 10).unwrap();
        f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(7))
            .unwrap();
    });
    let f = file(&rep, "f");
    assert_eq!(f.state, "changed", "{rep:?}");
    assert!(f.rot.is_empty(), "{f:?}");
    assert!(f.repair.is_none(), "{f:?}");
    assert_eq!((rep.rotten, rep.repaired, rep.changed), (0, 0, 1));
    // The other program's bytes are still there: nothing was repaired into it.
    let now = fs::read(&target).unwrap();
    assert_eq!(&now[2 * BS + 10..2 * BS + 1010], &theirs[..]);
    assert_eq!(&now[..2 * BS], &data[..2 * BS]);
}

#[test]
fn a_status_change_while_a_file_is_scrubbed_caps_its_level_at_cache() {
    const NAME: &str = "a_status_change_while_a_file_is_scrubbed_caps_its_level_at_cache";
    let src = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dst = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    fs::write(src.path().join("f"), intact_sample::bytes(3 * BS, 42)).unwrap();
    copy(
        &[src.path().join("f")],
        dst.path(),
        &opts(VerifyMode::Riva),
        &|_| {},
    )
    .unwrap();
    let on_device = intact_cache::backing(&File::open(dst.path().join("f")).unwrap())
        .unwrap()
        .has_device();
    if !on_device {
        intact_testkit::skip(NAME, "the target directory is not on a block device");
        return;
    }
    let plain = run_scrub(dst.path(), &ScrubOptions::default());
    assert_eq!(file(&plain, "f").level, VerifyLevel::Device, "{plain:?}");
    // A chmod between the reads moves the ctime only: the bytes are the
    // same, but a page read after it is not proven to be the device's.
    let t = dst.path().join("f");
    let rep = scrub_with_hook(dst.path(), None, "f", move || {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&t, fs::Permissions::from_mode(0o600)).unwrap();
    });
    let f = file(&rep, "f");
    assert_eq!(f.state, "clean", "{rep:?}");
    assert_eq!(f.level, VerifyLevel::Cache, "{f:?}");
    assert!(
        f.note
            .as_deref()
            .unwrap_or("")
            .contains("changed while it was read"),
        "{f:?}"
    );
    assert_eq!((rep.at_device, rep.below_device), (0, 1));
}

#[test]
fn an_empty_file_scrubs_clean_with_and_without_a_replica() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    fs::write(src.path().join("empty"), b"").unwrap();
    fs::write(src.path().join("one"), intact_sample::bytes(5000, 3)).unwrap();
    let sources = [src.path().join("empty"), src.path().join("one")];
    let r = copy(&sources, dst.path(), &opts(VerifyMode::Riva), &|_| {}).unwrap();
    assert_eq!(r.failed, 0, "{r:?}");
    let rep = run_scrub(dst.path(), &ScrubOptions::default());
    assert_eq!((rep.files, rep.clean), (2, 2), "{rep:?}");
    // No byte was read: nothing was proven from the device.
    assert_eq!(file(&rep, "empty").level, VerifyLevel::Cache);
    let mut replica = intact_transfer::Replica::local(src.path()).unwrap();
    let o = ScrubOptions {
        restart: true,
        ..ScrubOptions::default()
    };
    let rep = scrub(dst.path(), &o, Some(&mut replica), true, &mut |_| {}).unwrap();
    assert_eq!((rep.files, rep.clean), (2, 2), "{rep:?}");
}

#[test]
fn one_block_files_read_in_groups_are_judged_by_the_device_each_on_its_own() {
    if !common::usable("one_block_files_read_in_groups_are_judged_by_the_device_each_on_its_own") {
        return;
    }
    let lfs = LoopFs::new(Path::new(env!("CARGO_TARGET_TMPDIR")), 64).unwrap();
    let src = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let names: Vec<String> = (0..6).map(|i| format!("s{i}")).collect();
    let datas: Vec<Vec<u8>> = (0..6)
        .map(|i| intact_sample::bytes(9000 + i * 100, 50 + i as u64))
        .collect();
    for (n, d) in names.iter().zip(&datas) {
        fs::write(src.path().join(n), d).unwrap();
    }
    let dst = lfs.mnt().join("dst");
    let sources: Vec<_> = names.iter().map(|n| src.path().join(n)).collect();
    let r = copy(&sources, &dst, &opts(VerifyMode::Riva), &|_| {}).unwrap();
    assert_eq!(r.failed, 0, "{r:?}");
    // A bit flipped on the device under s3 and s5. s0 to s3 are cold (no
    // page cached: their device reads are asked for ahead); s4 and s5
    // stay cached with the good bytes (they are evicted and re-read).
    let at = 4096 + 17;
    for (i, n) in names.iter().enumerate() {
        let f = File::open(dst.join(n)).unwrap();
        if i == 3 || i == 5 {
            lfs.flip_bit_under(&f, at).unwrap();
            assert_ne!(
                lfs.device_byte_under(&f, at).unwrap(),
                datas[i][at as usize]
            );
        }
        if i <= 3 {
            intact_cache::evict(&f, 0, datas[i].len() as u64).unwrap();
            assert_eq!(intact_cache::resident(&f, 0, 1 << 20).unwrap(), 0);
        } else {
            let mut good = vec![0u8; datas[i].len()];
            std::os::unix::fs::FileExt::read_exact_at(&f, &mut good, 0).unwrap();
            assert!(good == datas[i], "the cache keeps {n}'s good bytes");
        }
    }
    // s0's check changes s2's status (same group, already opened and
    // asked for): s2's read is then not proven to be the device's.
    let s2 = dst.join("s2");
    let rep = scrub_with_hook(&dst, None, "s0", move || {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&s2, fs::Permissions::from_mode(0o600)).unwrap();
    });
    assert_eq!((rep.files, rep.rotten), (6, 2), "{rep:?}");
    for n in ["s3", "s5"] {
        let bad = file(&rep, n);
        assert_eq!(bad.state, "rot", "{rep:?}");
        assert_eq!(bad.level, VerifyLevel::Device);
        assert_eq!((bad.rot[0].offset, bad.rot[0].len), (4096, 4096));
    }
    assert_eq!(file(&rep, "s2").level, VerifyLevel::Cache, "{rep:?}");
    for n in ["s0", "s1", "s4"] {
        let f = file(&rep, n);
        assert_eq!((f.state, f.level), ("clean", VerifyLevel::Device), "{f:?}");
    }
}

//! Review of the level rules (root only: a loop-mounted ext4). Each test
//! is a sequence that made a report say more than was established (before
//! the fixes it drove): a level no check (or record) supports, a byte
//! counted twice, stale bytes reported verified. They are judged, as in
//! `honest_levels.rs`, by facts the test establishes itself: the bytes
//! read back after a remount, and the report's accounting.

mod common;

use std::fs;
use std::path::Path;

use common::*;
use intact_faults::LoopFs;
use intact_transfer::{ReadPath, SendOptions, VerifyLevel, VerifyMode, STATE_DIR};

/// Finding 1 (most serious). A resume: the receiver holds block 0 of a
/// partial file (journaled by an interrupted run). The source's block 0
/// has changed since, in place, with the same size and mtime. The sender
/// sees its digest differ from the one the receiver holds and sends the
/// block; the receiver, whose slot for block 0 is already filled from the
/// journal, answers ok without writing it (`accept_block`: `slot.is_some()
/// => Done(true)`), journals the new digest over the old bytes, commits
/// the stale block and reports the file verified (level device), with
/// block 0 counted both as sent and as re-verified.
#[test]
fn a_resumed_block_whose_source_changed_is_written() {
    if !usable("a_resumed_block_whose_source_changed_is_written") {
        return;
    }
    let mut c = Case::new();
    c.interrupted_fiver();

    // The source's block 0 changes; its size and mtime do not.
    let new: Vec<u8> = c.data[..4096].iter().map(|b| !b).collect();
    rewrite_keeping_mtime(&c.src, 0, &new);
    c.data[..4096].copy_from_slice(&new);

    let r = send_once(&c.src, &c.root, &opts(VerifyMode::Riva), None).unwrap();
    let f = the_file(&r).clone();
    let stored = c.stored();
    let stale = stored[..4096] != c.data[..4096];
    assert!(
        !(f.error.is_none() && stale),
        "the destination holds the OLD block 0, yet the file is reported verified at {:?}: {f:#?}",
        f.level
    );
    assert!(stored == c.data, "the destination differs from the source");
    accounted(&f, BS as u64);
}

/// Finding 2. The receiver journals a file's (and each block's) level
/// from its own end only; the source end's level is known to the sender
/// alone. A `riva` send from a tmpfs source reaches `cache` (the sender
/// says so), but the journal records `device`; the next send, in `fiver`
/// and from the very same tmpfs file, trusts that record and reports the
/// file at `device`, trusted at `device`: a level no check established.
#[test]
fn a_record_carries_the_level_of_both_ends() {
    if !usable("a_record_carries_the_level_of_both_ends") {
        return;
    }
    let Some(shm) = intact_testkit::tmpfs("a_record_carries_the_level_of_both_ends") else {
        return;
    };
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let lfs = LoopFs::new(tmp, 64).unwrap();
    let root = lfs.mnt().join("root");
    let src = shm.path().join("data.bin");
    fs::write(&src, intact_sample::bytes(SIZE, 11)).unwrap();

    let r = send_once(&src, &root, &opts(VerifyMode::Riva), None).unwrap();
    let f = the_file(&r);
    assert_eq!(r.failed, 0, "{:?}", f.error);
    assert_eq!(
        f.level,
        Some(VerifyLevel::Cache),
        "a tmpfs source cannot give device: {f:#?}"
    );

    let r = send_once(&src, &root, &opts(VerifyMode::Fiver), None).unwrap();
    let f = the_file(&r);
    assert_eq!(r.failed, 0, "{:?}", f.error);
    assert!(f.unchanged, "{f:#?}");
    assert!(
        f.trusted_level <= Some(VerifyLevel::Cache) && f.level <= Some(VerifyLevel::Cache),
        "the same tmpfs file, checked at cache at its source end, is now reported \
         level {:?}, trusted at {:?}: {f:#?}",
        f.level,
        f.trusted_level
    );
}

/// Finding 3. A journal written by a build before the level columns: its
/// `files` table already had a `level` column (the old build's level,
/// computed by the rules this change replaces), and only `mode`/`at` are
/// added. The module doc says old rows read as level `none` and are
/// always re-verified; in fact an old done row is trusted at its old
/// level (`device`), with `trusted_since` 0 (1970), and damage on the
/// device under it goes unseen.
#[test]
fn an_old_journal_file_record_is_re_verified() {
    if !usable("an_old_journal_file_record_is_re_verified") {
        return;
    }
    let c = Case::sent_whole(VerifyMode::Riva, VerifyLevel::Device);

    // Make the journal what the build before the change left: the same
    // tables without the new columns (files.level was there already).
    let db = rusqlite::Connection::open(c.root.join(STATE_DIR).join("journal.sqlite")).unwrap();
    db.execute_batch(
        "ALTER TABLE files DROP COLUMN mode;
         ALTER TABLE files DROP COLUMN at;
         ALTER TABLE blocks DROP COLUMN mode;
         ALTER TABLE blocks DROP COLUMN level;
         ALTER TABLE blocks DROP COLUMN at;",
    )
    .unwrap();
    let level: i64 = db
        .query_row("SELECT level FROM files WHERE done = 1", [], |r| r.get(0))
        .unwrap();
    assert_eq!(level, i64::from(VerifyLevel::Device.wire_id()));
    drop(db);

    c.flip_under(&c.root.join("data.bin"), 2 * BS as u64 + 9);

    let r = send_once(&c.src, &c.root, &opts(VerifyMode::Riva), None).unwrap();
    let f = the_file(&r).clone();
    let stored = c.stored();
    assert!(
        f.bytes_trusted == 0,
        "an old build's record was trusted (level {:?}, since {:?}): {f:#?}",
        f.trusted_level,
        f.trusted_since
    );
    assert!(stored == c.data, "the device differs from the source");
    assert_eq!(f.level, Some(VerifyLevel::Device));
}

/// Finding 4. A resume of a file with more held blocks than one Status
/// can list (`MAX_STATUS_BLOCKS`): the receiver marks every held block
/// verified and counts it as trusted, but the Status it sends is cut to
/// `MAX_STATUS_BLOCKS` entries, so the sender sends the rest again; the
/// receiver drops them as already verified (`slot.is_some()`), and those
/// bytes are reported both sent and trusted.
#[test]
fn a_resume_beyond_one_status_counts_each_byte_once() {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = tempfile::tempdir_in(tmp).unwrap();
    let root = dir.path().join("root");
    let src = dir.path().join("data.bin");
    const SMALL: usize = 16;
    const BLOCKS: usize = 400_000;
    fs::write(&src, intact_sample::bytes(SMALL * BLOCKS, 3)).unwrap();
    let o = SendOptions {
        block_size: SMALL,
        ..opts(VerifyMode::Fiver)
    };
    // 62 bytes on the wire per block (its frame, a 16-byte xxh3 digest,
    // 16 bytes of data): 400,000 blocks are 23.6 MiB; the cut lets about
    // 380,000 through, of which the receiver journals what it got to.
    let first = send_once(&src, &root, &o, Some(45 << 19));
    assert!(first.is_err() || first.as_ref().unwrap().failed > 0);
    // The case needs more blocks journaled than one Status can list.
    let journal = intact_transfer::Journal::open(&root).unwrap();
    let row = journal.lookup(b"data.bin").unwrap().expect("journaled");
    let journaled = journal.blocks(row.id).unwrap().len();
    drop(journal);
    assert!(
        journaled > intact_proto::MAX_STATUS_BLOCKS,
        "only {journaled} blocks journaled before the cut: the case is not made"
    );

    let r = send_once(&src, &root, &o, None).unwrap();
    let f = the_file(&r);
    assert_eq!(r.failed, 0, "{:?}", f.error);
    // The first run journaled more blocks than one Status lists: exactly
    // that many are held, the rest are sent (and counted once).
    assert_eq!(
        f.bytes_trusted + f.bytes_reverified,
        (intact_proto::MAX_STATUS_BLOCKS * SMALL) as u64,
        "{f:#?}"
    );
    accounted(f, SMALL as u64);
    assert_eq!(
        fs::read(root.join("data.bin")).unwrap(),
        fs::read(&src).unwrap()
    );
}

/// Finding 5 (design, the quick check). A file held whole and trusted
/// from the journal is not read at either end: a source rewritten in
/// place with the same size and mtime is reported `unchanged`, verified
/// at `device`, while the destination holds other bytes. The rules allow
/// trusting the receiver's record for the receiver's bytes, but nothing
/// in this run or in any record checked them against the source as it is.
/// Fixed by issue 11's item 4: the server answers with the digest its
/// commit compared, and the sender compares it with its source's own.
#[test]
fn an_unchanged_report_is_not_given_for_a_source_rewritten_in_place() {
    if !usable("an_unchanged_report_is_not_given_for_a_source_rewritten_in_place") {
        return;
    }
    let mut c = Case::new();
    let r = send_once(&c.src, &c.root, &opts(VerifyMode::Riva), None).unwrap();
    assert_eq!(r.failed, 0);
    let new: Vec<u8> = c.data[BS..BS + 4096].iter().map(|b| !b).collect();
    rewrite_keeping_mtime(&c.src, BS as u64, &new);
    c.data[BS..BS + 4096].copy_from_slice(&new);

    let r = send_once(&c.src, &c.root, &opts(VerifyMode::Riva), None).unwrap();
    let f = the_file(&r).clone();
    let stored = c.stored();
    assert!(
        stored == c.data || f.level.is_none(),
        "the destination differs from the source, yet the file is reported \
         unchanged={} at level {:?}",
        f.unchanged,
        f.level
    );
}

/// Check (expected to hold). ext4 with `data=journal` serves O_DIRECT
/// reads through the page cache: a `riva` send with `--read-path direct`
/// to it must not claim `device`.
#[test]
fn direct_reads_on_data_journal_ext4_are_not_device() {
    if !usable("direct_reads_on_data_journal_ext4_are_not_device") {
        return;
    }
    let c = Case::with_options("data=journal");
    let o = SendOptions {
        read_path: ReadPath::Direct,
        ..opts(VerifyMode::Riva)
    };
    let r = send_once(&c.src, &c.root, &o, None).unwrap();
    let f = the_file(&r);
    assert_eq!(r.failed, 0, "{:?}", f.error);
    assert_eq!(f.level, Some(VerifyLevel::Cache), "{f:#?}");
}

/// A cold small source is prefetched, and its reads then count as device
/// reads without asking the cache again. A writer that changes the source
/// while it is sent, and sets its mtime back, puts its own pages in the
/// cache: those reads no longer come from the device. The test writes the
/// source itself (after the first block is written at the destination),
/// and the file must not be reported at device.
#[test]
fn a_source_rewritten_during_its_send_keeping_its_mtime_is_not_reported_at_device() {
    const T: &str =
        "a_source_rewritten_during_its_send_keeping_its_mtime_is_not_reported_at_device";
    if !usable(T) {
        return;
    }
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let lfs = LoopFs::new(tmp, 64).unwrap();
    let src_dir = lfs.mnt().join("src");
    fs::create_dir_all(&src_dir).unwrap();
    let src = src_dir.join("data.bin");
    let data = intact_sample::bytes(SIZE, 23);
    fs::write(&src, &data).unwrap();
    // Cold: synced and dropped from the cache (the fact, counted).
    let f = fs::File::open(&src).unwrap();
    f.sync_all().unwrap();
    assert_eq!(
        intact_cache::evict(&f, 0, SIZE as u64).unwrap().resident,
        0,
        "the source is cold"
    );
    drop(f);
    let written = Arc::new(AtomicBool::new(false));
    let hook_src = src.clone();
    let hook_written = Arc::clone(&written);
    let o = intact_transfer::CopyOptions {
        verify: VerifyMode::Riva,
        block_size: BS,
        streams: 1,
        retries: 2,
        after_write: Some(Arc::new(
            move |_f: &fs::File, _p: &str, index, _off, _len| {
                if index == 0 && !hook_written.swap(true, Ordering::SeqCst) {
                    // The last block's bytes, rewritten as they are (the
                    // content stays; only a writer's pages are now cached).
                    let last = (SIZE - 100) as u64;
                    let same = fs::read(&hook_src).unwrap()[last as usize..].to_vec();
                    rewrite_keeping_mtime(&hook_src, last, &same);
                }
            },
        )),
        ..intact_transfer::CopyOptions::default()
    };
    let dst = lfs.mnt().join("dst");
    let r = intact_transfer::copy(&[src], &dst, &o, &|_| {}).unwrap();
    assert!(
        written.load(Ordering::SeqCst),
        "the hook never wrote the source"
    );
    let f = the_file(&r);
    assert_ne!(
        f.level,
        Some(VerifyLevel::Device),
        "a source written during its send was reported at device: {f:#?}"
    );
    assert_eq!(fs::read(dst.join("data.bin")).unwrap(), data);
}

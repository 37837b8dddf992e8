//! Checksum chaining, end to end: the catalog's page CRCs are computed
//! from the received buffer before its digest is checked, never from what
//! reached the disk. So a write-path fault that a mode without re-reads
//! (`fiver`, which hashes the transfer's buffers) cannot see leaves a
//! catalog that describes the sender's bytes, and the next scrub names
//! the damaged page; and a memory flip between the check and the write
//! leaves block records whose page CRCs are the sender's, not the flipped
//! buffer's (the file itself fails its whole-file digest).

use std::fs;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use intact_digest::page_crc_blob;
use intact_transfer::{copy, open_catalog, scrub, CopyOptions, ScrubOptions, VerifyMode};

mod common;
const BS: usize = 256 * 1024;

fn opts(verify: VerifyMode) -> CopyOptions {
    common::copy_opts(verify, BS)
}

#[test]
fn a_write_fault_fiver_cannot_see_is_found_by_the_next_scrub() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let data = intact_sample::bytes(3 * BS, 41);
    fs::write(src.path().join("f"), &data).unwrap();
    // After block 1 is written, one byte of its page 5 is changed on its
    // way to the disk (as a write path or a bad sector would).
    let at = BS as u64 + 5 * 4096 + 99;
    let o = CopyOptions {
        after_write: Some(Arc::new(move |file: &fs::File, _: &str, index, _, _| {
            if index == 1 {
                let mut b = [0u8];
                file.read_exact_at(&mut b, at).unwrap();
                file.write_all_at(&[b[0] ^ 0x20], at).unwrap();
            }
        })),
        ..opts(VerifyMode::Fiver)
    };
    let r = copy(&[src.path().join("f")], dst.path(), &o, &|_| {}).unwrap();
    assert_eq!(r.failed, 0, "fiver does not re-read: {r:?}");
    let on_disk = fs::read(dst.path().join("f")).unwrap();
    assert_ne!(
        on_disk[at as usize], data[at as usize],
        "the fault was made"
    );

    let rep = scrub(
        dst.path(),
        &ScrubOptions::default(),
        None,
        true,
        &mut |_| {},
    )
    .unwrap();
    let f = &rep.reports[0];
    assert_eq!(f.state, "rot", "{rep:?}");
    let page = at / 4096 * 4096;
    assert_eq!((f.rot[0].offset, f.rot[0].len), (page, 4096), "{f:?}");
    assert_eq!(f.rot[0].failed, vec!["crc32c", "xxh3-128"]);
}

#[test]
fn a_flip_between_the_check_and_the_write_leaves_the_senders_page_crcs() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let data = intact_sample::bytes(2 * BS, 42);
    fs::write(src.path().join("f"), &data).unwrap();
    let once = Arc::new(AtomicBool::new(false));
    let o = CopyOptions {
        after_check: Some(Arc::new(move |_: &str, index, buf: &mut [u8]| {
            if index == 1 && !once.swap(true, Ordering::SeqCst) {
                buf[3 * 4096 + 7] ^= 1;
            }
        })),
        retries: 0,
        ..opts(VerifyMode::Fiver)
    };
    let r = copy(&[src.path().join("f")], dst.path(), &o, &|_| {}).unwrap();
    // The whole-file digest of what was written differs from the sender's:
    // the file is not committed.
    assert_eq!(r.failed, 1, "{r:?}");
    assert!(!dst.path().join("f").exists());
    // The block records kept for the resume hold the sender's page CRCs,
    // computed before the check, not the flipped buffer's.
    let (journal, _) = open_catalog(dst.path()).unwrap();
    let row = journal
        .lookup(b"f")
        .unwrap()
        .expect("a row for the partial file");
    let blocks = journal.blocks(row.id).unwrap();
    let b1 = blocks
        .iter()
        .find(|b| b.index == 1)
        .expect("block 1 was recorded");
    let senders = page_crc_blob(&data[BS..2 * BS], intact_digest::PAGE_SIZE);
    assert_eq!(b1.pages.as_deref(), Some(senders.as_slice()));
    let mut flipped = data[BS..2 * BS].to_vec();
    flipped[3 * 4096 + 7] ^= 1;
    assert_ne!(
        b1.pages.as_deref(),
        Some(page_crc_blob(&flipped, intact_digest::PAGE_SIZE).as_slice())
    );
    drop(journal);
}

/// The catalog-cost benchmark's control really leaves the page CRCs out
/// (else its A/B would compare riva with itself), and only it does.
#[test]
fn the_benchmarks_control_records_blocks_without_page_crcs() {
    let src = tempfile::tempdir().unwrap();
    fs::write(src.path().join("f"), intact_sample::bytes(2 * BS + 9, 8)).unwrap();
    let pages_of = |without: bool| {
        let dst = tempfile::tempdir().unwrap();
        let o = CopyOptions {
            without_page_crcs: without,
            ..opts(VerifyMode::Riva)
        };
        let r = copy(&[src.path().join("f")], dst.path(), &o, &|_| {}).unwrap();
        assert_eq!(r.failed, 0, "{r:?}");
        let (journal, _) = open_catalog(dst.path()).unwrap();
        let row = journal.lookup(b"f").unwrap().expect("a row");
        let blocks = journal.blocks(row.id).unwrap();
        assert_eq!(blocks.len(), 3);
        blocks.iter().filter(|b| b.pages.is_some()).count()
    };
    assert_eq!(pages_of(false), 3);
    assert_eq!(pages_of(true), 0);
}

/// A file of one block is received unnamed (`O_TMPFILE`): nothing of it
/// may be journaled before its commit, and everything after. A block of
/// 16 MiB passes the receiver's journaling threshold (8 MiB) on its own,
/// which must not lose its record; a file that fails leaves no record and
/// no partial file at all.
#[test]
fn a_file_of_one_block_is_recorded_at_its_commit_and_not_before() {
    let bs = 16 << 20;
    let src = tempfile::tempdir().unwrap();
    let data = intact_sample::bytes(9 << 20, 43);
    fs::write(src.path().join("f"), &data).unwrap();

    let dst = tempfile::tempdir().unwrap();
    // What the destination directory held while the block was received:
    // its names other than intact's own directory.
    let seen = Arc::new(std::sync::Mutex::new(None::<Vec<String>>));
    let names_in = |dir: &std::path::Path| -> Vec<String> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != ".intact")
            .collect()
    };
    let (at, dir) = (Arc::clone(&seen), dst.path().to_path_buf());
    let o = CopyOptions {
        after_check: Some(Arc::new(move |_: &str, _, _: &mut [u8]| {
            *at.lock().unwrap() = Some(names_in(&dir));
        })),
        ..common::copy_opts(VerifyMode::Riva, bs)
    };
    let r = copy(&[src.path().join("f")], dst.path(), &o, &|_| {}).unwrap();
    assert_eq!(r.failed, 0, "{r:?}");
    assert_eq!(fs::read(dst.path().join("f")).unwrap(), data);
    let seen = seen.lock().unwrap().take().expect("the block was checked");
    if seen.iter().any(|n| n.starts_with(".intact-partial")) {
        intact_testkit::skip(
            "a_file_of_one_block_is_recorded_at_its_commit_and_not_before",
            "the temporary directory's file system has no O_TMPFILE: the file had a partial name",
        );
        return;
    }
    assert!(seen.is_empty(), "named while received: {seen:?}");
    let (journal, _) = open_catalog(dst.path()).unwrap();
    let row = journal.lookup(b"f").unwrap().expect("a row");
    assert!(row.done);
    let blocks = journal.blocks(row.id).unwrap();
    assert_eq!(blocks.len(), 1, "the one block is recorded");
    assert_eq!(
        blocks[0].pages.as_deref(),
        Some(page_crc_blob(&data, intact_digest::PAGE_SIZE).as_slice())
    );
    drop(journal);

    // A flip after the check: the whole-file digest fails, and with it the
    // file; an unnamed file leaves nothing behind, and no block record.
    let dst = tempfile::tempdir().unwrap();
    let o = CopyOptions {
        after_check: Some(Arc::new(|_: &str, _, buf: &mut [u8]| buf[5] ^= 1)),
        retries: 0,
        ..common::copy_opts(VerifyMode::Fiver, bs)
    };
    let r = copy(&[src.path().join("f")], dst.path(), &o, &|_| {}).unwrap();
    assert_eq!(r.failed, 1, "{r:?}");
    let names = names_in(dst.path());
    assert!(names.is_empty(), "left behind: {names:?}");
    let (journal, _) = open_catalog(dst.path()).unwrap();
    if let Some(row) = journal.lookup(b"f").unwrap() {
        assert!(!row.done);
        assert!(
            journal.blocks(row.id).unwrap().is_empty(),
            "blocks of a file nothing holds"
        );
    }
}

//! Review of the level rules (root only: a loop-mounted ext4). Each test
//! is a sequence that made a report say more than was established (before
//! the fixes it drove): a level no check (or record) supports, a byte
//! counted twice, stale bytes reported verified. They are judged, as in
//! `honest_levels.rs`, by facts the test establishes itself: the bytes
//! read back after a remount, and the report's accounting.

use std::fs::{self, File};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use intact_digest::AlignedBuf;
use intact_faults::{FlipProxy, LoopFs, ProxyFault};
use intact_transfer::{
    partial_name, send, CopyReport, FileReport, LocalServer, ReadPath, SendOptions, ServerConfig,
    TransferError, VerifyLevel, VerifyMode, STATE_DIR,
};

const BS: usize = 1 << 20;
/// Eight blocks and a tail.
const SIZE: usize = 8 * BS + 4321;

fn usable(test: &str) -> bool {
    match intact_faults::usable() {
        Ok(()) => true,
        Err(why) => {
            intact_testkit::skip(test, &why);
            false
        }
    }
}

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Unmounts and mounts the file system again: nothing of it stays cached.
fn remount(fs: &LoopFs) {
    let mnt = fs.mnt().to_str().unwrap();
    run("umount", &[mnt]);
    run("mount", &[fs.device(), mnt]);
}

fn opts(verify: VerifyMode) -> SendOptions {
    SendOptions {
        verify,
        block_size: BS,
        streams: 1,
        retries: 2,
        ..SendOptions::default()
    }
}

/// One send to a fresh in-process server rooted at `root`, optionally
/// through a proxy that cuts the connection after `cut` bytes.
fn send_once(
    src: &Path,
    root: &Path,
    o: &SendOptions,
    cut: Option<u64>,
) -> Result<CopyReport, TransferError> {
    let server = LocalServer::start(ServerConfig::local(root)).unwrap();
    let r = match cut {
        Some(n) => {
            let proxy = FlipProxy::start(server.addr(), ProxyFault::CutAfter(n)).unwrap();
            send(&[src.to_path_buf()], &proxy.addr(), o, &|_| {})
        }
        None => send(&[src.to_path_buf()], &server.addr(), o, &|_| {}),
    };
    server.stop().unwrap();
    r
}

fn the_file(r: &CopyReport) -> &FileReport {
    r.files.iter().find(|f| f.kind == "file").expect("one file")
}

/// Every byte of the file is accounted for exactly once: sent, held and
/// re-verified in place, or held and trusted from the journal (resends
/// are of whole blocks of `bs`).
fn accounted(f: &FileReport, bs: u64) {
    assert!(f.error.is_none(), "{:?}", f.error);
    assert_eq!(
        f.bytes_sent - f.blocks_resent * bs + f.bytes_reverified + f.bytes_trusted,
        f.size,
        "sent {} (resent blocks {}) + re-verified {} + trusted {} != size {}",
        f.bytes_sent,
        f.blocks_resent,
        f.bytes_reverified,
        f.bytes_trusted,
        f.size
    );
}

/// Rewrites `len` bytes of `path` at `offset` in place and puts its
/// modification time back, to the nanosecond: same size, same mtime,
/// other bytes (what a quick check cannot see).
fn rewrite_keeping_mtime(path: &Path, offset: u64, bytes: &[u8]) {
    let mtime = fs::metadata(path).unwrap().modified().unwrap();
    let f = fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);
    assert_eq!(fs::metadata(path).unwrap().modified().unwrap(), mtime);
}

struct Case {
    fs: LoopFs,
    _src_dir: tempfile::TempDir,
    src: PathBuf,
    data: Vec<u8>,
    root: PathBuf,
}

impl Case {
    fn new() -> Case {
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let fs = LoopFs::new(tmp, 64).unwrap();
        let src_dir = tempfile::tempdir_in(tmp).unwrap();
        let data = intact_sample::bytes(SIZE, 7);
        let src = src_dir.path().join("data.bin");
        fs::write(&src, &data).unwrap();
        let root = fs.mnt().join("root");
        Case {
            fs,
            _src_dir: src_dir,
            src,
            data,
            root,
        }
    }

    /// The stored file's bytes after a remount (no cache survives it).
    fn stored(&self) -> Vec<u8> {
        remount(&self.fs);
        fs::read(self.root.join("data.bin")).unwrap()
    }

    /// Flips a bit on the device under `path` at `offset` and proves it:
    /// the device holds the flipped byte, the page cache the good one.
    fn flip_under(&self, path: &Path, offset: u64) {
        let f = File::open(path).unwrap();
        self.fs.flip_bit_under(&f, offset).unwrap();
        let good = self.data[offset as usize];
        assert_eq!(self.device_byte(&f, offset), good ^ 1, "the flip missed");
        let mut cached = [0u8];
        f.read_exact_at(&mut cached, offset).unwrap();
        assert_eq!(cached[0], good, "the page cache should keep the good byte");
    }

    fn device_byte(&self, file: &File, offset: u64) -> u8 {
        let phys = intact_cache::physical_offset(file, offset)
            .unwrap()
            .expect("in a plain extent");
        let dev = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(self.fs.device())
            .unwrap();
        let page = phys / 4096 * 4096;
        let mut buf = AlignedBuf::new(4096);
        dev.read_exact_at(&mut buf, page).unwrap();
        buf[(phys - page) as usize]
    }
}

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
    let first = send_once(
        &c.src,
        &c.root,
        &opts(VerifyMode::Fiver),
        Some(5 * BS as u64),
    );
    assert!(first.is_err() || first.as_ref().unwrap().failed > 0);
    assert!(c.root.join(partial_name("data.bin".as_ref())).exists());

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
    let c = Case::new();
    let r = send_once(&c.src, &c.root, &opts(VerifyMode::Riva), None).unwrap();
    assert_eq!(r.failed, 0);
    assert_eq!(the_file(&r).level, Some(VerifyLevel::Device));

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
    // About 60 bytes of Block message per block (a 16-byte xxh3 digest):
    // ~310,000 blocks pass before the cut.
    let first = send_once(&src, &root, &o, Some(18 << 20));
    assert!(first.is_err() || first.as_ref().unwrap().failed > 0);

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
/// The quick check trusting size and mtime is issue 11's item 4 (the
/// unchanged check must compare the source's own digest); until then this
/// known hole is kept here, ignored, so that it is counted and not lost.
#[test]
#[ignore = "known hole, issue 11 item 4: the quick check trusts size and mtime of the source"]
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
    let c = Case::new();
    let mnt = c.fs.mnt().to_str().unwrap();
    run("umount", &[mnt]);
    run("mount", &["-o", "data=journal", c.fs.device(), mnt]);
    let o = SendOptions {
        read_path: ReadPath::Direct,
        ..opts(VerifyMode::Riva)
    };
    let r = send_once(&c.src, &c.root, &o, None).unwrap();
    let f = the_file(&r);
    assert_eq!(r.failed, 0, "{:?}", f.error);
    assert_eq!(f.level, Some(VerifyLevel::Cache), "{f:#?}");
}

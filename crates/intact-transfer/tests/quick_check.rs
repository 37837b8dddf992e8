//! Issue 11, items 3 and 4: "unchanged" is said only when the digest the
//! server's own commit compared equals the digest of the sender's source,
//! and a FileEnd digest that does not match the bytes written is never
//! committed. Each test performs the attack (or the honest mistake) and
//! judges by the bytes it reads back from the destination and by facts
//! it establishes itself (the file the attacker left, the cache file's
//! mode, the ctime it changed).

mod common;

use std::fs;
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use intact_digest::{defaults, hash};
use intact_proto::{
    client_handshake_in, Block, Connection, Entry, EntryKind, FileStatus, Message, SessionSecret,
    WirePath,
};
use intact_transfer::{
    LocalServer, SendOptions, ServerConfig, SourceCacheSetting, SourceDigest, VerifyMode, STATE_DIR,
};

/// A scratch directory with a source directory and a server root.
struct Dirs {
    _dir: tempfile::TempDir,
    base: PathBuf,
    root: PathBuf,
}

impl Dirs {
    fn new() -> Dirs {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let base = dir.path().to_path_buf();
        let root = base.join("root");
        Dirs {
            _dir: dir,
            base,
            root,
        }
    }

    /// `name/data.bin` holding `data`.
    fn source(&self, name: &str, data: &[u8]) -> PathBuf {
        let d = self.base.join(name);
        fs::create_dir_all(&d).unwrap();
        let p = d.join("data.bin");
        fs::write(&p, data).unwrap();
        p
    }

    fn stored(&self) -> Vec<u8> {
        fs::read(self.root.join("data.bin")).unwrap()
    }
}

/// Gives `to` the modification time of `from` (to the nanosecond), as
/// `touch -r` does; returns it.
fn same_mtime(from: &std::path::Path, to: &std::path::Path) -> std::time::SystemTime {
    let mtime = fs::metadata(from).unwrap().modified().unwrap();
    fs::File::options()
        .write(true)
        .open(to)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    mtime
}

const SMALL: usize = 3 * BS + 777;

fn with(mode: VerifyMode, reverify: bool) -> SendOptions {
    SendOptions {
        reverify,
        ..opts(mode)
    }
}

/// Item 4, the attack: a second client sends a different file of the same
/// size, with the victim's mtime (`touch -r`), to the victim's path. The
/// victim's next send must move the data again, and the destination must
/// end equal to the victim's source (read back), in `none`, `fiver` and
/// `riva`, with and without `--reverify`.
#[test]
fn a_different_file_with_the_same_size_and_mtime_is_not_unchanged() {
    for mode in [VerifyMode::None, VerifyMode::Fiver, VerifyMode::Riva] {
        for reverify in [false, true] {
            let d = Dirs::new();
            let victim_data = intact_sample::bytes(SMALL, 1);
            let victim = d.source("victim", &victim_data);
            let r = send_once(&victim, &d.root, &with(mode, false), None).unwrap();
            assert_eq!(r.failed, 0, "{:?}", the_file(&r).error);
            assert_eq!(d.stored(), victim_data);

            // The attacker's file: other bytes, the same size, the
            // victim's mtime to the nanosecond.
            let evil_data = intact_sample::bytes(SMALL, 2);
            assert_ne!(evil_data, victim_data);
            let evil = d.source("attacker", &evil_data);
            let mtime = same_mtime(&victim, &evil);
            assert_eq!(fs::metadata(&evil).unwrap().modified().unwrap(), mtime);
            let r = send_once(&evil, &d.root, &with(mode, false), None).unwrap();
            assert_eq!(r.failed, 0, "{:?}", the_file(&r).error);
            // The attack took place: the destination holds the attacker's
            // bytes, with the victim's size and mtime.
            assert_eq!(d.stored(), evil_data, "the attacker's send did not land");
            let m = fs::metadata(d.root.join("data.bin")).unwrap();
            assert_eq!(m.modified().unwrap(), mtime);
            assert_eq!(m.len(), SMALL as u64);

            let r = send_once(&victim, &d.root, &with(mode, reverify), None).unwrap();
            let f = the_file(&r).clone();
            assert_eq!(r.failed, 0, "{mode} reverify={reverify}: {:?}", f.error);
            assert!(
                !f.unchanged,
                "{mode} reverify={reverify}: the attacker's file was reported unchanged at {:?}",
                f.level
            );
            assert_eq!(
                f.bytes_sent, SMALL as u64,
                "{mode} reverify={reverify}: {f:#?}"
            );
            assert!(
                d.stored() == victim_data,
                "{mode} reverify={reverify}: the destination is not the victim's source"
            );
        }
    }
}

/// Item 4, no attacker: the source is edited in place and its mtime put
/// back. With the source cache on, the first send recorded its digest;
/// the edit moved the ctime, so that entry is not used: the source is
/// read, its digest differs, and the data moves.
#[test]
fn an_in_place_edit_keeping_size_and_mtime_is_not_unchanged() {
    for mode in [VerifyMode::None, VerifyMode::Riva] {
        let d = Dirs::new();
        let mut data = intact_sample::bytes(SMALL, 3);
        let src = d.source("src", &data);
        settle();
        let o = SendOptions {
            source_cache: SourceCacheSetting::At(d.base.join("cache/digests.sqlite")),
            ..opts(mode)
        };
        let r = send_once(&src, &d.root, &o, None).unwrap();
        assert_eq!(r.failed, 0);
        // The cache now answers for the file as it was.
        let r = send_once(&src, &d.root, &o, None).unwrap();
        assert!(the_file(&r).unchanged);
        assert!(matches!(
            the_file(&r).source_digest,
            Some(SourceDigest::Cache { .. })
        ));

        let new: Vec<u8> = data[BS..BS + 4096].iter().map(|b| !b).collect();
        rewrite_keeping_mtime(&src, BS as u64, &new);
        data[BS..BS + 4096].copy_from_slice(&new);

        let r = send_once(&src, &d.root, &o, None).unwrap();
        let f = the_file(&r).clone();
        assert_eq!(r.failed, 0, "{:?}", f.error);
        assert!(
            !f.unchanged,
            "{mode}: an edited source was reported unchanged: {f:#?}"
        );
        assert!(
            d.stored() == data,
            "{mode}: the destination is not the edited source"
        );
    }
}

/// Waits until a file written now has a ctime old enough for the source
/// cache to record it (see `RACY_SECS`).
fn settle() {
    std::thread::sleep(Duration::from_millis(1100 + 200));
}

/// The source cache: a hit is reported as such (with when it was
/// recorded), the cache file is private (0600), a chmod (which changes
/// the ctime and nothing else) makes the entry unusable and the source is
/// read again, and `--reverify` never uses it.
#[test]
fn the_source_cache_is_reported_and_a_changed_ctime_is_not_used() {
    let d = Dirs::new();
    let data = intact_sample::bytes(SMALL, 4);
    let src = d.source("src", &data);
    settle();
    let cache = d.base.join("cache/digests.sqlite");
    let o = SendOptions {
        source_cache: SourceCacheSetting::At(cache.clone()),
        ..opts(VerifyMode::Fiver)
    };
    let before = intact_transfer_now();
    let r = send_once(&src, &d.root, &o, None).unwrap();
    assert_eq!(the_file(&r).source_digest, Some(SourceDigest::Transfer));
    let mode = fs::metadata(&cache).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the cache file is mode {mode:o}");

    let r = send_once(&src, &d.root, &o, None).unwrap();
    let f = the_file(&r).clone();
    assert!(f.unchanged, "{f:#?}");
    assert_eq!(f.bytes_sent, 0);
    match f.source_digest {
        Some(SourceDigest::Cache { recorded_at }) => {
            assert!(recorded_at >= before && recorded_at <= intact_transfer_now())
        }
        other => panic!("expected a cache hit, got {other:?}"),
    }
    assert_eq!(f.digest.as_deref(), Some(&*blake3::hash(&data).to_hex()));

    // chmod moves the ctime, not the mtime nor the bytes.
    let ctime = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        let m = fs::metadata(p).unwrap();
        (m.ctime(), m.ctime_nsec())
    };
    let c0 = ctime(&src);
    let m0 = fs::metadata(&src).unwrap().modified().unwrap();
    fs::set_permissions(&src, fs::Permissions::from_mode(0o640)).unwrap();
    assert_ne!(ctime(&src), c0, "chmod did not change the ctime");
    assert_eq!(fs::metadata(&src).unwrap().modified().unwrap(), m0);

    let r = send_once(&src, &d.root, &o, None).unwrap();
    let f = the_file(&r).clone();
    assert!(f.unchanged, "same bytes: {f:#?}");
    assert_eq!(f.source_digest, Some(SourceDigest::Read), "{f:#?}");

    settle();
    // The read above recorded nothing (its ctime was fresh); this one does.
    let r = send_once(&src, &d.root, &o, None).unwrap();
    assert_eq!(the_file(&r).source_digest, Some(SourceDigest::Read));
    let r = send_once(&src, &d.root, &o, None).unwrap();
    assert!(matches!(
        the_file(&r).source_digest,
        Some(SourceDigest::Cache { .. })
    ));
    // --reverify reads the source whatever the cache holds.
    let r = send_once(&src, &d.root, &with_cache(&o, true), None).unwrap();
    let f = the_file(&r).clone();
    assert!(f.unchanged, "{f:#?}");
    assert_eq!(f.source_digest, Some(SourceDigest::Read));
}

/// A source sent again to a new destination, its cache entry unchanged,
/// leaves that entry as it was recorded (the send does not write the same
/// row again), and the entry still answers the first destination's quick
/// check.
#[test]
fn a_source_sent_again_leaves_its_cache_entry_as_recorded() {
    let d = Dirs::new();
    let data = intact_sample::bytes(SMALL, 9);
    let src = d.source("src", &data);
    settle();
    let cache = d.base.join("cache/digests.sqlite");
    let o = SendOptions {
        source_cache: SourceCacheSetting::At(cache.clone()),
        ..opts(VerifyMode::Riva)
    };
    let recorded = || -> Vec<i64> {
        let db = rusqlite::Connection::open(&cache).unwrap();
        let mut st = db.prepare("SELECT recorded_at FROM digests").unwrap();
        let rows = st.query_map([], |r| r.get(0)).unwrap();
        rows.map(Result::unwrap).collect()
    };
    send_once(&src, &d.root, &o, None).unwrap();
    let first = recorded();
    assert_eq!(first.len(), 1, "one entry after the first send: {first:?}");

    // Past a second, a rewrite would show as a later time.
    settle();
    let other = d.base.join("other-root");
    let r = send_once(&src, &other, &o, None).unwrap();
    let f = the_file(&r).clone();
    assert_eq!(f.source_digest, Some(SourceDigest::Transfer), "{f:#?}");
    assert_eq!(fs::read(other.join("data.bin")).unwrap(), data);
    assert_eq!(recorded(), first, "the entry was written again");

    let r = send_once(&src, &d.root, &o, None).unwrap();
    let f = the_file(&r).clone();
    assert!(f.unchanged, "{f:#?}");
    assert_eq!(
        f.source_digest,
        Some(SourceDigest::Cache {
            recorded_at: first[0]
        })
    );
}

/// A re-send to a destination that holds every file whole, each file's
/// digest in the source cache, reads no source: no page of any source
/// file is in the cache after it (the test evicts them first), so none
/// was prefetched for a read that never came.
#[test]
fn a_re_send_of_held_files_the_cache_knows_reads_no_source() {
    let d = Dirs::new();
    let src = d.base.join("tree");
    fs::create_dir_all(&src).unwrap();
    let files: Vec<PathBuf> = (0..6)
        .map(|i| {
            let p = src.join(format!("f{i}"));
            // Small files: the ones a stream prefetches.
            fs::write(&p, intact_sample::bytes(16 << 10, 20 + i)).unwrap();
            p
        })
        .collect();
    settle();
    let o = SendOptions {
        source_cache: SourceCacheSetting::At(d.base.join("cache/digests.sqlite")),
        ..opts(VerifyMode::Riva)
    };
    send_once(&src, &d.root, &o, None).unwrap();
    let resident = |p: &Path| {
        let f = fs::File::open(p).unwrap();
        intact_cache::resident(&f, 0, f.metadata().unwrap().len()).unwrap()
    };
    for p in &files {
        let f = fs::File::open(p).unwrap();
        intact_cache::evict(&f, 0, f.metadata().unwrap().len()).unwrap();
        assert_eq!(
            resident(p),
            0,
            "{}: this test could not evict it",
            p.display()
        );
    }
    let r = send_once(&src, &d.root, &o, None).unwrap();
    let sent: Vec<_> = r.files.iter().filter(|f| f.path.contains("/f")).collect();
    assert_eq!(sent.len(), files.len(), "{:#?}", r.files);
    for f in sent {
        assert!(f.unchanged, "{f:#?}");
        assert!(
            matches!(f.source_digest, Some(SourceDigest::Cache { .. })),
            "{f:#?}"
        );
    }
    for p in &files {
        assert_eq!(resident(p), 0, "{} was read", p.display());
    }
}

fn with_cache(o: &SendOptions, reverify: bool) -> SendOptions {
    SendOptions {
        reverify,
        ..o.clone()
    }
}

fn intact_transfer_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A journal row written before the whole-file digest was recorded is
/// never answered as unchanged: the file is received again.
#[test]
fn a_record_without_a_digest_is_never_unchanged() {
    let d = Dirs::new();
    let data = intact_sample::bytes(SMALL, 5);
    let src = d.source("src", &data);
    let r = send_once(&src, &d.root, &opts(VerifyMode::Fiver), None).unwrap();
    assert_eq!(r.failed, 0);
    let db = rusqlite::Connection::open(d.root.join(STATE_DIR).join("journal.sqlite")).unwrap();
    let n = db
        .execute("UPDATE files SET digest = NULL WHERE done = 1", [])
        .unwrap();
    assert_eq!(n, 1);
    drop(db);
    let r = send_once(&src, &d.root, &opts(VerifyMode::Fiver), None).unwrap();
    let f = the_file(&r);
    assert!(!f.unchanged, "{f:#?}");
    assert_eq!(f.bytes_sent, SMALL as u64);
    assert_eq!(d.stored(), data);
}

/// A hand-written keyless client, handshaken, in a session of its own.
fn keyless_client(addr: &str) -> Connection<TcpStream> {
    client_of(addr, &SessionSecret::random().unwrap())
}

/// A keyless stream of the session `secret`.
fn client_of(addr: &str, secret: &SessionSecret) -> Connection<TcpStream> {
    let stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut conn = Connection::new(stream);
    client_handshake_in(&mut conn, None, secret).unwrap();
    conn
}

/// Issue 11 item 3, "the journal says whose it is": a session that takes
/// a partial file is recorded as its owner, and the next session that
/// takes it over (a resume) replaces it. The sessions are this test's own
/// (their secrets known here, so their ids are); the journal is read
/// after each server stopped.
#[test]
fn the_journal_records_which_session_holds_a_partial_file() {
    let d = Dirs::new();
    let data = intact_sample::bytes(5 * 4096, 3);
    let mut owners = Vec::new();
    for _ in 0..2 {
        let server = LocalServer::start(ServerConfig::local(&d.root)).unwrap();
        let secret = SessionSecret::random().unwrap();
        let mut conn = client_of(&server.addr(), &secret);
        conn.send(&data_entry(
            VerifyMode::Block,
            data.len(),
            4096,
            (1_700_000_000, 0),
            0,
        ))
        .unwrap();
        match conn.expect_message().unwrap() {
            Message::Status { .. } => {}
            other => panic!("expected a Status, got {other:?}"),
        }
        // Gone without finishing: the file stays partial.
        drop(conn);
        server.stop().unwrap();
        let journal = intact_transfer::Journal::open(&d.root).unwrap();
        let owner = journal.owner(b"data.bin").unwrap().expect("an owner");
        assert_eq!(owner.session, secret.id().0, "the session that took it");
        owners.push(owner.session);
    }
    assert_ne!(
        owners[0], owners[1],
        "the resume's session replaced the first"
    );
    assert!(!d.root.join("data.bin").exists(), "never committed");
}

/// The Entry (id 0) of `data.bin`: `size` bytes in blocks of `bs`, with
/// mtime `(sec, nsec)` and `flags`.
fn data_entry(mode: VerifyMode, size: usize, bs: u32, mtime: (i64, u32), flags: u8) -> Message {
    Message::Entry(Entry {
        file: 0,
        path: WirePath::parse(b"data.bin").unwrap(),
        kind: EntryKind::File,
        mode: 0o644,
        mtime_sec: mtime.0,
        mtime_nsec: mtime.1,
        size: size as u64,
        block_size: bs,
        algorithm: defaults::BLOCK_ALGORITHM.wire_id(),
        verify: mode.wire_id(),
        flags,
        origin: Vec::new(),
        range: None,
    })
}

/// A hand-written client: one file of `data` in blocks of `bs`, every
/// block with its correct digest, then a FileEnd carrying `digest`.
/// Returns the server's verdict.
fn hand_send(addr: &str, mode: VerifyMode, bs: u32, data: &[u8], digest: Vec<u8>) -> FileStatus {
    let mut conn = keyless_client(addr);
    conn.send(&data_entry(mode, data.len(), bs, (1_700_000_000, 0), 0))
        .unwrap();
    match conn.expect_message().unwrap() {
        Message::Status { .. } => {}
        other => panic!("expected a Status, got {other:?}"),
    }
    let chunks: Vec<&[u8]> = data.chunks(bs as usize).collect();
    for (i, c) in chunks.iter().enumerate() {
        conn.write_message(&Message::Block(Block {
            file: 0,
            index: i as u64,
            source_level: 3,
            digest: hash(defaults::BLOCK_ALGORITHM, c).as_bytes().to_vec(),
            crcs: Vec::new(),
            patch: Vec::new(),
            strong: Vec::new(),
            data: c.to_vec(),
        }))
        .unwrap();
    }
    conn.write_message(&Message::FileEnd {
        file: 0,
        blocks: chunks.len() as u64,
        source_level: 3,
        digest,
    })
    .unwrap();
    conn.write_message(&Message::Waiting).unwrap();
    conn.flush().unwrap();
    let status = loop {
        match conn.expect_message().unwrap() {
            Message::BlockResult { ok, index, .. } => {
                assert!(ok, "block {index} was refused: the client is wrong")
            }
            Message::FileResult(r) => break r.status,
            other => panic!("unexpected {other:?}"),
        }
    };
    conn.send(&Message::Bye).unwrap();
    let _ = conn.expect_message();
    status
}

/// Item 3: a client sends valid blocks (each with its right digest) and a
/// FileEnd whose whole-file digest is not that of those bytes: nothing is
/// committed. The same client with the right digest is committed, and the
/// bytes read back are the blocks it sent (so the refusal was the digest's).
/// Power-of-two blocks (digest from the written blocks' parts) and other
/// sizes (the partial file hashed at FileEnd); `none` (no block digests
/// checked) and `fiver`.
#[test]
fn a_file_end_digest_that_does_not_match_the_bytes_written_is_not_committed() {
    for mode in [VerifyMode::None, VerifyMode::Fiver] {
        for bs in [4096u32, 6000] {
            let d = Dirs::new();
            let server = LocalServer::start(ServerConfig::local(&d.root)).unwrap();
            let addr = server.addr();
            let data = intact_sample::bytes(40_000, 6);
            let final_path = d.root.join("data.bin");

            let mut wrong = *blake3::hash(&data).as_bytes();
            wrong[0] ^= 1;
            let s = hand_send(&addr, mode, bs, &data, wrong.to_vec());
            assert_eq!(
                s,
                FileStatus::Failed,
                "{mode} bs {bs}: a wrong digest was committed"
            );
            assert!(
                !final_path.exists(),
                "{mode} bs {bs}: the file got its final name"
            );
            // No digest at all is not a match either.
            let s = hand_send(&addr, mode, bs, &data, Vec::new());
            assert_eq!(
                s,
                FileStatus::Failed,
                "{mode} bs {bs}: no digest was committed"
            );
            assert!(!final_path.exists());

            let s = hand_send(
                &addr,
                mode,
                bs,
                &data,
                blake3::hash(&data).as_bytes().to_vec(),
            );
            assert_eq!(
                s,
                FileStatus::Verified,
                "{mode} bs {bs}: the right digest failed"
            );
            assert_eq!(fs::read(&final_path).unwrap(), data);
            server.stop().unwrap();
        }
    }
}

/// The review's attack on the quick check: session V announces a file the
/// server holds whole and is answered with its recorded digest; before V's
/// FileEnd, another session commits different bytes (same size and mtime)
/// under that name. V's FileEnd carries the digest it was shown: it must
/// not be answered unchanged (nor, with `--reverify`, recorded over the
/// other session's bytes), and a later stock send must move the data
/// again and leave the victim's bytes.
#[test]
fn a_commit_between_the_quick_check_and_its_answer_is_not_reported_unchanged() {
    for (mode, reverify) in [
        (VerifyMode::None, false),
        (VerifyMode::Fiver, false),
        (VerifyMode::Block, true),
    ] {
        let d = Dirs::new();
        let server = LocalServer::start(ServerConfig::local(&d.root)).unwrap();
        let addr = server.addr();
        let mine = intact_sample::bytes(3 * 4096 + 5, 21);
        let src = d.source("victim", &mine);
        let theirs: Vec<u8> = mine.iter().map(|b| !b).collect();
        let evil = d.source("evil", &theirs);
        same_mtime(&src, &evil);
        let mut o = opts(mode);
        o.block_size = 4096;
        let r = intact_transfer::send(std::slice::from_ref(&src), &addr, &o, &|_| {}).unwrap();
        assert_eq!(r.failed, 0);
        assert_eq!(d.stored(), mine);
        let stat = fs::metadata(&src).unwrap();
        let mtime_sec = {
            use std::os::unix::fs::MetadataExt;
            (stat.mtime(), stat.mtime_nsec() as u32)
        };

        // V: the Entry of the file the server holds; it answers Whole.
        let mut conn = keyless_client(&addr);
        let flags = if reverify { Entry::REVERIFY } else { 0 };
        conn.send(&data_entry(mode, mine.len(), 4096, mtime_sec, flags))
            .unwrap();
        let shown = match conn.expect_message().unwrap() {
            Message::Status {
                holding: intact_proto::Holding::Whole { digest },
                ..
            } => digest,
            other => panic!("expected Status Whole, got {other:?}"),
        };
        assert_eq!(shown, blake3::hash(&mine).as_bytes().to_vec());

        // Meanwhile another session commits other bytes under the name.
        let r = intact_transfer::send(std::slice::from_ref(&evil), &addr, &o, &|_| {}).unwrap();
        assert_eq!(r.failed, 0, "{:?}", r.files);
        assert_eq!(d.stored(), theirs, "the other session's commit landed");

        // V ends the file with the digest it was shown, sending nothing.
        conn.write_message(&Message::FileEnd {
            file: 0,
            blocks: mine.len().div_ceil(4096) as u64,
            source_level: 3,
            digest: shown,
        })
        .unwrap();
        conn.write_message(&Message::Waiting).unwrap();
        conn.flush().unwrap();
        let result = loop {
            match conn.expect_message().unwrap() {
                Message::FileResult(r) => break r,
                Message::BlockResult { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        };
        assert_eq!(result.status, FileStatus::Failed, "{result:?} ({mode})");
        assert!(!result.unchanged, "{result:?}");
        conn.send(&Message::Bye).unwrap();
        let _ = conn.expect_message();

        // A stock send of the victim's file moves it again.
        let r = intact_transfer::send(std::slice::from_ref(&src), &addr, &o, &|_| {}).unwrap();
        let f = the_file(&r);
        assert!(f.error.is_none(), "{:?}", f.error);
        assert!(
            !f.unchanged,
            "{mode}: the other session's bytes were trusted"
        );
        assert_eq!(d.stored(), mine, "{mode}");
        server.stop().unwrap();
    }
}

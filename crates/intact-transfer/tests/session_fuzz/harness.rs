//! Runs message sequences from a hand-written client against an
//! in-process server (`LocalServer`, keyless, 127.0.0.1) and judges each
//! by facts this harness reads itself:
//!
//! - no thread of the process panicked (a panic hook records every panic,
//!   since the server's `catch_unwind` per stream would hide them);
//! - the server closed the connection, and every `intact-session` thread
//!   ended, within a deadline (no hang), with descriptors back near where
//!   they were and the peak RSS under a bound;
//! - nothing appeared, changed or went away outside the root (a canary
//!   directory beside it, the parent directory's listing);
//! - every regular file under its final name in the root is made, block
//!   by block, of bytes this client sent for that path and index with a
//!   matching digest (or in mode `none`), at a size it announced;
//! - a normal `send` still succeeds and its bytes read back equal
//!   ([`Harness::sanity`], run every so many sequences).
//!
//! Strict checks (`INTACT_FUZZ_STRICT=1`), for what issue 11 fixes:
//! a file that changed under its final name carries the whole-file digest
//! of a FileEnd sent for it (unless that path was sent in mode `none` in
//! this sequence), and nothing under the root has setuid, setgid or
//! sticky bits.

// Shared with fuzz/fuzz_targets/session.rs, which uses other parts.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Mutex, Once};
use std::time::{Duration, Instant};

use intact_proto::{client_handshake, Connection, EntryKind, FileStatus, Message};
use intact_transfer::{send, LocalServer, SendOptions, ServerConfig, VerifyMode};

use super::gen::{block_digest, bytes_from};

/// How long the server may take to close a connection after the client
/// stopped sending (generous: 2 loaded cores).
const CLOSE_DEADLINE: Duration = Duration::from_secs(45);
/// How long a session's threads may take to end after the close.
const END_DEADLINE: Duration = Duration::from_secs(30);
/// Descriptors a finished session may leave open beyond the baseline
/// (SQLite opens its WAL files lazily).
const FD_SLACK: usize = 16;
/// Peak RSS of the whole test process, in KiB.
pub const MAX_HWM_KIB: u64 = 1 << 20;

static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static HOOK: Once = Once::new();

/// Records every panic of every thread of this process (and still prints
/// it as before).
pub fn install_panic_recorder() {
    HOOK.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let msg = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let line = format!(
                "thread '{}' panicked at {}: {msg}",
                std::thread::current().name().unwrap_or("<unnamed>"),
                info.location().map(|l| l.to_string()).unwrap_or_default(),
            );
            PANICS.lock().unwrap_or_else(|e| e.into_inner()).push(line);
            prev(info);
        }));
    });
}

/// The panics recorded since the last call.
pub fn take_panics() -> Vec<String> {
    std::mem::take(&mut *PANICS.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Open descriptors of this process.
pub fn open_fds() -> usize {
    fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Threads of this process named `intact-session` (the server's stream
/// threads; the receiver's helper threads inherit the name).
pub fn session_threads() -> usize {
    let Ok(tasks) = fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|t| fs::read(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.trim_ascii() == b"intact-session")
        .count()
}

/// A field of /proc/self/status, in KiB.
pub fn status_kib(field: &str) -> u64 {
    let s = fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// What the client sent, as far as the judgement of final files goes.
#[derive(Default)]
pub struct Model {
    /// (path, block size, index, BLAKE3 of the data) of every block sent
    /// for a file with a digest matching its data, or in mode `none`.
    valid: HashSet<(Vec<u8>, u32, u64, [u8; 32])>,
    /// (size, block size) of every file Entry per path.
    announced: HashMap<Vec<u8>, HashSet<(u64, u32)>>,
    /// (path, size, whole-file digest) of every FileEnd.
    claimed: HashSet<(Vec<u8>, u64, Vec<u8>)>,
    /// What the last judgement saw of each final file (ino, size, mtime,
    /// ctime), to judge only what changed.
    seen: HashMap<PathBuf, (u64, u64, i64, i64, i64, i64)>,
}

#[derive(Clone)]
struct Instance {
    path: Vec<u8>,
    size: u64,
    bs: u32,
    none: bool,
}

/// What one sequence says, for the model.
#[derive(Default)]
pub struct Said {
    /// Paths announced in mode `none` in this sequence.
    none_paths: HashSet<Vec<u8>>,
}

impl Model {
    /// Takes in a sequence the client sent (every message, even those the
    /// server may not have read: that only widens what is allowed).
    fn learn(&mut self, msgs: &[Message]) -> Said {
        let mut said = Said::default();
        // Blocks name files by the session's ids: attribute each to every
        // entry that id has named so far in this sequence.
        let mut ids: HashMap<u64, Vec<Instance>> = HashMap::new();
        for m in msgs {
            match m {
                Message::Entry(e) if e.kind == EntryKind::File => {
                    let p = e.path.as_bytes().to_vec();
                    let none = e.verify == 0;
                    if none {
                        said.none_paths.insert(p.clone());
                    }
                    self.announced
                        .entry(p.clone())
                        .or_default()
                        .insert((e.size, e.block_size));
                    ids.entry(e.file).or_default().push(Instance {
                        path: p,
                        size: e.size,
                        bs: e.block_size,
                        none,
                    });
                }
                Message::Block(b) => {
                    let good = b.digest == block_digest(&b.data);
                    let h = *blake3::hash(&b.data).as_bytes();
                    for i in ids.get(&b.file).into_iter().flatten() {
                        if good || i.none {
                            self.valid.insert((i.path.clone(), i.bs, b.index, h));
                        }
                    }
                }
                Message::FileEnd { file, digest, .. } => {
                    for i in ids.get(file).into_iter().flatten() {
                        self.claimed
                            .insert((i.path.clone(), i.size, digest.clone()));
                    }
                }
                _ => {}
            }
        }
        said
    }

    /// Whether `data`, found under the final name `rel`, is made of blocks
    /// sent for that path (see [`Model::valid`]); else why not.
    fn explains(&self, rel: &[u8], data: &[u8]) -> Result<(), String> {
        let Some(sizes) = self.announced.get(rel) else {
            return Err("no file Entry ever named this path".into());
        };
        let len = data.len() as u64;
        let mut why = format!("no file Entry for this path announced size {len}");
        for &(size, bs) in sizes.iter().filter(|(s, _)| *s == len) {
            let step = u64::from(bs).max(1);
            let bad = (0..len.div_ceil(step)).find(|&i| {
                let start = (i * step) as usize;
                let end = (start as u64 + step).min(len) as usize;
                let h = *blake3::hash(&data[start..end]).as_bytes();
                !self.valid.contains(&(rel.to_vec(), bs, i, h))
            });
            match bad {
                None => return Ok(()),
                Some(i) => {
                    why = format!(
                        "with size {size} and block size {bs}, block {i} holds bytes never sent for it with a matching digest"
                    )
                }
            }
        }
        Err(why)
    }
}

/// Counts over a run, to show how deep it went.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub sequences: u64,
    pub messages_sent: u64,
    pub replies: u64,
    pub verified_files: u64,
    pub failed_files: u64,
    pub blocks_ok: u64,
    pub blocks_rejected: u64,
    pub statuses: u64,
    pub delete_reports: u64,
    pub refused: u64,
    pub byes: u64,
    pub final_files_checked: u64,
    pub sanity_sends: u64,
    /// Time spent: handshake, until the server closed, until its threads
    /// ended, judging, normal sends.
    pub t_handshake: Duration,
    pub t_close: Duration,
    pub t_settle: Duration,
    pub t_judge: Duration,
    pub t_sanity: Duration,
}

/// An in-process server, its root, a canary outside it, and the model.
pub struct Harness {
    _tmp: tempfile::TempDir,
    top: PathBuf,
    pub root: PathBuf,
    pub outside: PathBuf,
    canary: (Vec<u8>, u32, i64),
    src: tempfile::TempDir,
    server: LocalServer,
    addr: String,
    model: Model,
    base_fds: usize,
    /// Strict checks on: setuid/setgid/sticky bits, whole-file digests.
    pub strict_modes: bool,
    pub strict_digest: bool,
    pub stats: Stats,
}

/// Where the harness puts its directories: `INTACT_FUZZ_DIR`, else
/// /dev/shm when it is there (a commit's syncfs on a disk shared with
/// compilers costs tens of milliseconds a sequence), else the temp
/// directory.
fn scratch() -> PathBuf {
    if let Some(d) = std::env::var_os("INTACT_FUZZ_DIR") {
        return PathBuf::from(d);
    }
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        return shm.to_path_buf();
    }
    std::env::temp_dir()
}

impl Harness {
    /// A fresh root and server. Panics if they cannot be made.
    pub fn new() -> Harness {
        install_panic_recorder();
        // Earlier panics (a test that failed before this one) are not
        // this server's.
        take_panics();
        let tmp = tempfile::Builder::new()
            .prefix("intact-session-fuzz")
            .tempdir_in(scratch())
            .expect("scratch directory");
        let top = tmp.path().to_path_buf();
        let root = top.join("root");
        let outside = top.join("outside");
        fs::create_dir(&root).unwrap();
        fs::create_dir(&outside).unwrap();
        let canary = outside.join("canary");
        fs::write(&canary, b"outside the root: must never change").unwrap();
        let m = fs::symlink_metadata(&canary).unwrap();
        let server = LocalServer::start(fuzz_config(&root)).expect("server");
        let addr = server.addr();
        let mut h = Harness {
            _tmp: tmp,
            top,
            root,
            outside,
            canary: (fs::read(&canary).unwrap(), m.mode(), m.mtime_nsec()),
            src: tempfile::Builder::new()
                .prefix("intact-session-fuzz-src")
                .tempdir_in(scratch())
                .expect("source directory"),
            server,
            addr,
            model: Model::default(),
            base_fds: 0,
            strict_modes: super::gen::strict("modes"),
            strict_digest: super::gen::strict("digest"),
            stats: Stats::default(),
        };
        // One honest send first, so the baseline counts what the server
        // keeps open for good (its journal).
        h.sanity().expect("a normal send to a fresh server");
        h.base_fds = open_fds();
        h
    }

    /// Sends `msgs` after a handshake on a new connection, then judges.
    pub fn run(&mut self, msgs: &[Message]) -> Result<(), String> {
        let mut wire = Vec::new();
        for m in msgs {
            m.encode(&mut wire);
        }
        self.stats.messages_sent += msgs.len() as u64;
        self.run_bytes(&wire, msgs)
    }

    /// Sends raw bytes after the handshake (`msgs`: what of them decodes,
    /// for the model), then judges.
    pub fn run_bytes(&mut self, wire: &[u8], msgs: &[Message]) -> Result<(), String> {
        self.stats.sequences += 1;
        let t0 = Instant::now();
        let stream = TcpStream::connect(&self.addr).map_err(|e| format!("connect: {e}"))?;
        stream
            .set_read_timeout(Some(CLOSE_DEADLINE))
            .map_err(|e| e.to_string())?;
        stream
            .set_write_timeout(Some(CLOSE_DEADLINE))
            .map_err(|e| e.to_string())?;
        let mut conn = Connection::new(stream.try_clone().map_err(|e| e.to_string())?);
        client_handshake(&mut conn, None)
            .map_err(|e| format!("the handshake failed (slots leaked?): {e}"))?;
        let t1 = Instant::now();
        self.stats.t_handshake += t1 - t0;
        // Replies are read as they come, so the server never blocks on a
        // client that does not read.
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut replies = Vec::new();
            let end = loop {
                match conn.read_message() {
                    Ok(Some(m)) => replies.push(m),
                    Ok(None) => break Ok(()),
                    Err(e) => break Err(e.to_string()),
                }
            };
            let _ = tx.send(());
            (replies, end)
        });
        let mut w = &stream;
        let mut written = 0;
        for chunk in wire.chunks(64 << 10) {
            // The server may close early (a protocol error): fine.
            if w.write_all(chunk).is_err() {
                break;
            }
            written += chunk.len();
        }
        let _ = w.flush();
        let _ = stream.shutdown(Shutdown::Write);
        let closed = rx.recv_timeout(CLOSE_DEADLINE);
        if closed.is_err() {
            let _ = stream.shutdown(Shutdown::Both);
            let _ = reader.join();
            return Err(format!(
                "hang: the server did not close the connection within {CLOSE_DEADLINE:?} of the client's last byte ({written} of {} bytes written)",
                wire.len()
            ));
        }
        let (replies, end) = reader
            .join()
            .map_err(|_| "reader thread died".to_string())?;
        if std::env::var_os("INTACT_FUZZ_VERBOSE").is_some() {
            for r in &replies {
                match r {
                    Message::FileResult(f) => {
                        eprintln!("  <- FileResult {} {:?} {}", f.file, f.status, f.message)
                    }
                    Message::Refused { reason } => eprintln!("  <- Refused {reason}"),
                    other => eprintln!("  <- {}", other.name()),
                }
            }
            eprintln!("  <- end {end:?}");
        }
        self.count(&replies);
        let t2 = Instant::now();
        self.stats.t_close += t2 - t1;
        self.settle()?;
        let t3 = Instant::now();
        self.stats.t_settle += t3 - t2;
        let said = self.model.learn(msgs);
        let r = self.judge(&said);
        self.stats.t_judge += t3.elapsed();
        r
    }

    fn count(&mut self, replies: &[Message]) {
        let s = &mut self.stats;
        s.replies += replies.len() as u64;
        for r in replies {
            match r {
                Message::FileResult(f) if f.status == FileStatus::Verified => s.verified_files += 1,
                Message::FileResult(_) => s.failed_files += 1,
                Message::BlockResult { ok: true, .. } => s.blocks_ok += 1,
                Message::BlockResult { ok: false, .. } => s.blocks_rejected += 1,
                Message::Status { .. } => s.statuses += 1,
                Message::DeleteReport { .. } => s.delete_reports += 1,
                Message::Refused { .. } => s.refused += 1,
                Message::Bye => s.byes += 1,
                _ => {}
            }
        }
    }

    /// Waits until no session thread is left (every session of this
    /// server has ended), within a deadline.
    fn settle(&self) -> Result<(), String> {
        let deadline = Instant::now() + END_DEADLINE;
        while session_threads() > 0 {
            if Instant::now() > deadline {
                return Err(format!(
                    "hang: {} intact-session thread(s) still running {END_DEADLINE:?} after the connection closed",
                    session_threads()
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }

    /// Every check on the state after a sequence.
    fn judge(&mut self, said: &Said) -> Result<(), String> {
        let panics = take_panics();
        if !panics.is_empty() {
            return Err(format!("panic(s) in the server:\n{}", panics.join("\n")));
        }
        self.outside_untouched()?;
        let fds = open_fds();
        if fds > self.base_fds + FD_SLACK {
            return Err(format!(
                "descriptors: {fds} open after the session ended, {} before any fuzzing",
                self.base_fds
            ));
        }
        let tw = Instant::now();
        let hwm = status_kib("VmHWM");
        if std::env::var_os("INTACT_FUZZ_VERBOSE").is_some() {
            eprintln!("outside, fds, status: {:?}", tw.elapsed());
        }
        if hwm > MAX_HWM_KIB {
            return Err(format!("peak RSS {hwm} KiB, over {MAX_HWM_KIB} KiB"));
        }
        self.final_files(said)
    }

    /// The parent of the root holds only the root and the canary
    /// directory; the canary is as it was.
    pub fn outside_untouched(&self) -> Result<(), String> {
        let mut names: Vec<_> = fs::read_dir(&self.top)
            .map_err(|e| e.to_string())?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        names.sort();
        if names != ["outside", "root"] {
            return Err(format!(
                "outside the root: {} holds {names:?}",
                self.top.display()
            ));
        }
        let m = fs::symlink_metadata(&self.root).map_err(|e| e.to_string())?;
        if !m.is_dir() {
            return Err("the root is no longer a directory".into());
        }
        let inside: Vec<_> = fs::read_dir(&self.outside)
            .map_err(|e| e.to_string())?
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        if inside != ["canary"] {
            return Err(format!("outside the root: outside/ holds {inside:?}"));
        }
        let c = self.outside.join("canary");
        let m = fs::symlink_metadata(&c).map_err(|e| e.to_string())?;
        let now = (
            fs::read(&c).map_err(|e| e.to_string())?,
            m.mode(),
            m.mtime_nsec(),
        );
        if now != self.canary {
            return Err(format!(
                "outside the root: the canary changed (mode {:o})",
                now.1
            ));
        }
        Ok(())
    }

    /// Judges every final file that changed since the last judgement.
    fn final_files(&mut self, said: &Said) -> Result<(), String> {
        let mut found = Vec::new();
        let tw = Instant::now();
        walk(&self.root, &self.root, &mut found)?;
        if std::env::var_os("INTACT_FUZZ_VERBOSE").is_some() {
            eprintln!("walk: {} entries in {:?}", found.len(), tw.elapsed());
        }
        let mut seen = HashMap::new();
        for (rel, m) in found {
            if self.strict_modes && m.mode() & 0o7000 != 0 {
                return Err(format!(
                    "strict: {} has mode {:o} (setuid, setgid or sticky)",
                    rel.display(),
                    m.mode() & 0o7777
                ));
            }
            if !m.is_file() {
                continue;
            }
            let key = (
                m.ino(),
                m.len(),
                m.mtime(),
                m.mtime_nsec(),
                m.ctime(),
                m.ctime_nsec(),
            );
            let changed = self.model.seen.get(&rel) != Some(&key);
            seen.insert(rel.clone(), key);
            if !changed {
                continue;
            }
            self.stats.final_files_checked += 1;
            let data = fs::read(self.root.join(&rel)).map_err(|e| e.to_string())?;
            let rb = rel.as_os_str().as_bytes();
            if let Err(why) = self.model.explains(rb, &data) {
                return Err(format!(
                    "unverified bytes under a final name: {} ({} bytes): {why}",
                    rel.display(),
                    data.len()
                ));
            }
            if self.strict_digest && !said.none_paths.contains(rb) {
                let d = blake3::hash(&data).as_bytes().to_vec();
                let claimed = self
                    .model
                    .claimed
                    .contains(&(rb.to_vec(), data.len() as u64, d));
                if !claimed {
                    return Err(format!(
                        "strict: {} ({} bytes) does not match the whole-file digest of any FileEnd sent for it",
                        rel.display(),
                        data.len()
                    ));
                }
            }
        }
        self.model.seen = seen;
        Ok(())
    }

    /// A normal send of a small tree into `sanity-N/`; its files must read
    /// back equal.
    pub fn sanity(&mut self) -> Result<(), String> {
        let t0 = Instant::now();
        let r = self.sanity_send();
        self.stats.t_sanity += t0.elapsed();
        r
    }

    fn sanity_send(&mut self) -> Result<(), String> {
        let n = self.stats.sanity_sends;
        self.stats.sanity_sends += 1;
        let dir = self.src.path().join(format!("sanity-{n}"));
        fs::create_dir(&dir).map_err(|e| e.to_string())?;
        let sizes = [0usize, 1, 70_000, 200_000];
        for (i, size) in sizes.iter().enumerate() {
            fs::write(
                dir.join(format!("f{i}")),
                bytes_from(n * 8 + i as u64, *size),
            )
            .map_err(|e| e.to_string())?;
        }
        let mode = [VerifyMode::Fiver, VerifyMode::Block, VerifyMode::Riva][n as usize % 3];
        let opts = SendOptions {
            verify: mode,
            block_size: 64 << 10,
            streams: 2,
            retries: 1,
            ..SendOptions::default()
        };
        let r = send(std::slice::from_ref(&dir), &self.addr, &opts, &|_| {})
            .map_err(|e| format!("a normal send failed: {e}"))?;
        if r.failed != 0 {
            return Err(format!("a normal send failed {} file(s): {r:?}", r.failed));
        }
        for (i, _) in sizes.iter().enumerate() {
            let rel = format!("sanity-{n}/f{i}");
            let got = fs::read(self.root.join(&rel)).map_err(|e| format!("{rel}: {e}"))?;
            let want = fs::read(dir.join(format!("f{i}"))).map_err(|e| e.to_string())?;
            if got != want {
                return Err(format!("a normal send stored other bytes in {rel}"));
            }
        }
        let _ = fs::remove_dir_all(&dir);
        self.settle()?;
        let panics = take_panics();
        if !panics.is_empty() {
            return Err(format!("panic(s) in the server:\n{}", panics.join("\n")));
        }
        Ok(())
    }

    /// The directories this harness made (removed when it is dropped; a
    /// process that exits without dropping it removes them itself).
    pub fn dirs(&self) -> [PathBuf; 2] {
        [self.top.clone(), self.src.path().to_path_buf()]
    }

    /// Stops the server (it must stop cleanly).
    pub fn stop(self) -> Result<Stats, String> {
        self.server
            .stop()
            .map_err(|e| format!("the server ended with {e}"))?;
        Ok(self.stats)
    }
}

impl Default for Harness {
    fn default() -> Self {
        Harness::new()
    }
}

/// Every entry under `dir` (not following symlinks), relative to `root`,
/// but the server's state directory and the sanity sends' trees; partial
/// files are not final and are left out too.
fn walk(root: &Path, dir: &Path, out: &mut Vec<(PathBuf, fs::Metadata)>) -> Result<(), String> {
    let rd = fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for e in rd {
        let e = e.map_err(|e| e.to_string())?;
        let path = e.path();
        let name = e.file_name();
        let top = dir == root;
        let nb = name.as_bytes();
        if (top && (nb == b".intact" || nb.starts_with(b"sanity-")))
            || nb.starts_with(b".intact-partial-")
        {
            continue;
        }
        let m = fs::symlink_metadata(&path).map_err(|e| e.to_string())?;
        let rel = path.strip_prefix(root).expect("under root").to_path_buf();
        if m.is_dir() {
            walk(root, &path, out)?;
        }
        out.push((rel, m));
    }
    Ok(())
}

/// Reads one frame's worth of bytes into messages, as the server would,
/// up to the first that does not decode.
pub fn decode_all(mut wire: &[u8]) -> Vec<Message> {
    let mut out = Vec::new();
    while let Ok(Some(n)) = intact_proto::frame_len(wire) {
        match Message::decode(&wire[intact_proto::HEADER_LEN..n]) {
            Ok(m) => out.push(m),
            Err(_) => break,
        }
        wire = &wire[n..];
    }
    out
}

/// The fuzzed server: the defaults, but blocks of any size (the minimum
/// block size is a policy tested by the hostile tests; here small blocks
/// let short sequences reach every state of a file).
pub fn fuzz_config(root: &Path) -> ServerConfig {
    let mut cfg = ServerConfig::local(root);
    cfg.receive.limits.min_block_size = 1;
    cfg
}

//! The receiving side of one connection.
//!
//! Every Entry gets exactly one FileResult. A file's blocks are checked
//! against the digests that travel with them, written, and (block mode)
//! re-read; each Block gets a BlockResult, and a failed one is resent by
//! the sender. At FileEnd the file is re-read if the mode says so, bad
//! blocks are asked for again, and only a fully verified file is fsynced
//! and renamed to its final name.
//!
//! Held blocks (a resume) and files held whole (a repeated send) are
//! trusted only up to the level their journal records say they were
//! verified at. Below the mode's aim they are re-verified in place by the
//! mode's own means (`riva`: evicted and re-read from the device), and
//! those reads count in the file's level like any other; the FileResult
//! says how many bytes were re-verified and how many were trusted, and at
//! which recorded level.
//!
//! Before a file is committed, the BLAKE3 of the bytes held for it must
//! equal the sender's FileEnd digest, and the journal records it (see
//! [`crate::net::whole_digest`]). A file held whole is answered with that
//! recorded digest (or, re-verified in place, the digest of what the
//! re-read found), and is unchanged only if the sender's FileEnd confirms
//! its source has the same: size and mtime only pick the candidate.
//!
//! What proves a written block is the file's verify stage (see
//! [`crate::stage::verify`]); a stage that re-reads every block (`riva`,
//! `block`) does so on the session's verifier thread while the session
//! thread receives and writes the next ones (the RIVA paper's Figure 4).
//! A link (a reader thread on TCP, the in-process queue in `copy`) turns
//! the other half's messages into events, so that the session thread
//! waits on one channel for either the next message or a verifier's
//! verdict; it takes at most a few messages ahead, so memory stays
//! bounded and TCP still pushes back on the sender.
//!
//! Where each step lives: [`session`] (the event loop and the messages),
//! [`admit`] (an Entry's place), [`begin`] (an Entry's answer), [`resume`]
//! (blocks held from an earlier run), [`accept`] (check and write of a
//! block, the file's end), [`verifier`] (the re-read thread), [`commit`]
//! (group commit and results), [`incoming`] (one file's state).

use std::collections::HashMap;
use std::net::TcpStream;
use std::sync::mpsc;

use intact_digest::AlignedBuf;
use intact_proto::Connection;

use crate::credits::{CreditGiver, CreditTaker};
use crate::dest::Destination;
use crate::journal::Journal;
use crate::link::{Arrival, LocalOut, Outbound};
use crate::net::bounds::{InUse, ReceiveLimits, Shares};
use crate::net::session_dirs::SessionDirs;
use crate::net::watchdog::Working;
use crate::profile::Stage;
use crate::verify::VerifyLevel;
use crate::TransferError;

mod accept;
mod admit;
mod begin;
mod commit;
mod data_clock;
mod digests;
mod fetch;
mod hooks;
mod incoming;
mod repair;
mod resume;
mod session;
mod split;
mod verifier;

pub use split::{Splits, MAX_RANGES, MIN_SPLIT_BLOCK};

use incoming::Incoming;
use session::Session;
use verifier::{verifier, Check, Checked, Flash, Job};

/// Deliveries the link may hold ahead of the session thread: messages
/// read off a socket, or batches moved in process (at most
/// [`crate::link::BATCH_MESSAGES`] messages each).
const READ_AHEAD: usize = 4;

/// A link that waited for room is woken when this many deliveries are
/// left (see [`crate::credits`]): it may then hand over `READ_AHEAD -
/// READ_LOW` before it can wait again, not one.
const READ_LOW: usize = 1;

/// Jobs queued for the verifier at most: blocks (riva, block) written and
/// not yet verified, or groups of small files ([`Job::Synced`], up to
/// `SYNC_GROUP` files each); they hold no memory here, only page cache.
const VERIFY_QUEUE: usize = 64;

/// How many times one file may come back for re-verification rounds.
const MAX_ROUNDS: u32 = 16;

/// The largest file a session holds back for a group `syncfs` before its
/// re-read ([`Check::sync_first`]): a group (8 MiB at most) then holds 128
/// of them or more. Larger files gain little from merged writeback and
/// would wait for the group, so they are re-read as they come.
const SYNC_MAX_FILE: u64 = 64 << 10;

/// Verified files committed together at most (one syncfs, one fsync per
/// directory, one journal transaction).
const GROUP_COMMIT_FILES: usize = 1024;

/// Path bytes of directories one stream keeps to finish at its end; past
/// this, a directory it created is finished at once.
const MAX_PENDING_DIR_BYTES: usize = 64 << 20;

/// Verified-but-unjournaled data after which the partial file is
/// fdatasynced and its blocks recorded, in bytes: what a server crash can
/// cost a file in resent data, against one fdatasync per batch.
const JOURNAL_BATCH: u64 = 8 << 20;

/// What one session did, for the server's log.
#[derive(Debug, Default, Clone)]
pub struct SessionSummary {
    /// Files verified and committed.
    pub verified: u64,
    /// Entries that failed.
    pub failed: u64,
    /// Blocks that failed verification and were asked for again.
    pub blocks_rejected: u64,
    /// Bytes of block payload received.
    pub bytes: u64,
    /// The first [`MAX_FAILURES_KEPT`] failed entries: (path, why), for
    /// the server's log (the rest are only counted in `failed`).
    pub failures: Vec<(String, String)>,
    /// Entries a `send --delete` removed.
    pub deleted: u64,
    /// Blocks that failed a check and were repaired from a recovery cache.
    pub cache_repairs: u64,
    /// Blocks no recovery cache could repair (asked of the sender).
    pub cache_misses: u64,
    /// Microseconds spent asking recovery caches (found or not).
    pub cache_ask_micros: u64,
    /// Microseconds from a block's failure to its verified repair, for
    /// the blocks repaired from a cache.
    pub cache_micros: u64,
    /// Blocks that failed a check and were repaired by the sender.
    pub source_repairs: u64,
    /// Microseconds from their failure to their verified repair.
    pub source_micros: u64,
}

/// Failed entries a session keeps by name for the log at most.
pub const MAX_FAILURES_KEPT: usize = 100;

impl SessionSummary {
    /// Counts a failed entry, keeping its path and reason while there is room.
    fn fail(&mut self, path: &str, why: &str) {
        self.failed += 1;
        if self.failures.len() < MAX_FAILURES_KEPT {
            self.failures.push((path.to_string(), why.to_string()));
        }
    }
}

/// The level an Entry's flags require the receiver to reach, if any.
fn required_level(flags: u8) -> Option<VerifyLevel> {
    if flags & intact_proto::Entry::REQUIRE_MEDIA != 0 {
        Some(VerifyLevel::Media)
    } else if flags & intact_proto::Entry::REQUIRE_DEVICE != 0 {
        Some(VerifyLevel::Device)
    } else {
        None
    }
}

/// A level from the wire; an id this build does not know is the weakest.
fn wire_level(id: u8) -> VerifyLevel {
    VerifyLevel::from_wire_id(id).unwrap_or(VerifyLevel::None)
}

/// What the session thread waits for.
enum Event {
    /// The next message(s) from the link (none: closed cleanly), and the
    /// share of the server's frame memory a socket's frame holds.
    Msg(Arrival, Option<intact_proto::Held>),
    /// A verifier's verdict.
    Checked(Checked),
}

/// How a receiver works, beyond what each Entry asks for.
#[derive(Clone, Default)]
pub struct ReceiveOptions {
    /// Called after each block is written, before it is verified (tests
    /// and the fault lab only: built with the `fault-hooks` feature, never
    /// in the `intact` binary).
    #[cfg(feature = "fault-hooks")]
    pub after_write: Option<crate::hooks::WriteHook>,
    /// Called on each received block's bytes after their digest was
    /// checked and before they are written: a memory fault in the window
    /// the Z²FS paper calls t0–t1 (tests and the fault lab only).
    #[cfg(feature = "fault-hooks")]
    pub after_check: Option<crate::hooks::LinkFault>,
    /// Called after a group's files took their final names, before their
    /// journal rows are written (tests only).
    #[cfg(feature = "fault-hooks")]
    pub before_journal: Option<crate::hooks::CommitHook>,
    /// Negative control for the fault lab: `riva` re-reads through the
    /// page cache instead of after eviction (as a broken riva would), so
    /// the lab can prove its device-write cells are able to fail.
    #[cfg(feature = "fault-hooks")]
    pub reread_through_cache: bool,
    /// Control for the benchmark of the catalog's cost: blocks are
    /// recorded without page CRCs (riva without the catalog's share, to
    /// set against riva with it; never in the `intact` binary).
    #[cfg(feature = "fault-hooks")]
    pub without_page_crcs: bool,
    /// Most paths one `send --delete` may keep (None: [`MAX_KEEP_PATHS`]).
    ///
    /// [`MAX_KEEP_PATHS`]: crate::net::MAX_KEEP_PATHS
    pub max_delete_paths: Option<usize>,
    /// Recovery caches to ask for a failed block before the sender
    /// (`intact serve --recovery-cache`); with them, each file's Status
    /// asks the sender for every block's BLAKE3.
    pub recovery: Option<intact_netcache::RecoveryCaches>,
    /// What the server allows one file, one stream and all its sessions
    /// (see [`ReceiveLimits`]); clones share its counts of what is open.
    pub limits: ReceiveLimits,
    /// Keep the setuid, setgid and sticky bits of received files and
    /// directories (`intact serve --keep-special-bits`).
    ///
    /// By default a server applies only the permission bits a sender
    /// asks for, `mode & 0o777`, as rsync's daemon applies its `incoming
    /// chmod` to whatever its clients send: a client (any local user of a
    /// keyless loopback server) must not be able to create a setuid file
    /// owned by the server's user. Directories the session did not create
    /// keep their mode and time in any case.
    pub keep_special_bits: bool,
    /// The session (one `intact send` run, all its streams) this stream
    /// belongs to, set by the server per stream: the directories its
    /// streams create are its own, and only those get its modes and
    /// times. Without it a stream finishes only the directories it
    /// created itself.
    pub session: Option<intact_proto::SessionId>,
    /// The directories each running session created (shared by clones).
    pub session_dirs: SessionDirs,
    /// Marks the server's own work for the session (commits, whole-file
    /// reads), during which its watchdog's idle clock stops.
    pub working: Working,
    /// The session's places in its server's shared budgets, set by the
    /// server per stream; without them a stream has the block budget of
    /// `limits` to itself and its frames are not budgeted.
    pub shares: Option<Shares>,
    /// A stream that holds open files must send data (a Block or a
    /// FileEnd) at least this often, or it ends and gives back what it
    /// holds: answered Dir entries alone keep a connection alive for the
    /// watchdog, not its files. None: no such deadline.
    pub data_timeout: Option<std::time::Duration>,
    /// Where the receiver's stage times are summed (shared by clones: a
    /// copy's sender half sums into the same one).
    pub profile: std::sync::Arc<crate::profile::Profile>,
    /// Answer [`intact_proto::Message::Fetch`] (version 8's pull of byte
    /// ranges, for `intact scrub --repair-from`) with the bytes of files
    /// under the session's root (`intact serve --allow-fetch`). Off: a
    /// Fetch is refused and its session ends.
    pub allow_fetch: bool,
    /// `--verify flash`: the device's write-cache window and the filler
    /// budget (`--device-cache`, `--max-filler`); clones share the count
    /// of filler written.
    pub flash: crate::flash::FlashSettings,
    /// The verifier threads the sessions' block re-reads share
    /// (`--verifiers N`, default one per core); clones share the pool.
    pub verifiers: crate::Verifiers,
    /// The split files being received (see `receiver/split.rs`); clones
    /// share them, so the ranges of one file sent by several sessions of
    /// a server meet.
    pub splits: Splits,
}

/// How long a frame may wait for its session's share of the server's
/// memory for what clients send before its stream ends ("server busy").
const FRAME_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs the receiving side of a session that passed its handshake.
/// Returns when the sender says Bye or goes away; a protocol violation
/// ends the session with an error (partial files stay for resume).
pub fn receive(
    conn: Connection<TcpStream>,
    dest: &Destination,
    root: &std::path::Path,
    journal: &Journal,
    opts: &ReceiveOptions,
) -> Result<SessionSummary, TransferError> {
    let clone = |s: &TcpStream| s.try_clone().map_err(|e| TransferError::Path(e.into()));
    let stream = clone(conn.get_ref())?;
    let shares = opts
        .shares
        .clone()
        .unwrap_or_else(|| Shares::alone(&opts.limits));
    let mut conn = conn;
    // The reader's own handle on the session's memory: stopped when this
    // stream ends, so a reader waiting for its share ends with it.
    let reader_memory = shares.memory.as_ref().map(|m| m.handle());
    if let Some(memory) = &reader_memory {
        conn.set_budget(memory.clone(), FRAME_WAIT);
    }
    // Each half carries its own direction's sealing state.
    let (conn, mut out) = conn.split(clone(&stream)?);
    let inbox = Inbox::new();
    let (reader_tx, taker) = (inbox.tx.clone(), inbox.taker.clone());
    let reader = std::thread::spawn(move || {
        let mut conn = conn;
        loop {
            let (delivery, stop) = read_delivery(&mut conn);
            for event in delivery {
                if taker.take().is_err() || reader_tx.send(event).is_err() {
                    return;
                }
            }
            if stop {
                return;
            }
        }
    });
    let result = inbox.run(&mut out, shares, dest, root, journal, opts, || {
        // The reader is unblocked by the shutdown (or by the credits
        // going away).
        let _ = stream.shutdown(std::net::Shutdown::Both);
        if let Some(memory) = &reader_memory {
            memory.stop();
        }
    });
    let _ = reader.join();
    result
}

/// Most messages the socket reader hands over at once.
const READ_BATCH: usize = 64;

/// The socket reader's next delivery: one message read (waiting for it),
/// then, as one batch with it, the messages whose frames are already in
/// the connection's small buffer (at most [`READ_BATCH`]; reading them
/// cannot block), so the session thread is woken once for them, not once
/// per message. A message that holds a share of the server's memory of
/// its own, or an end or error, goes as a delivery of its own after the
/// batch. True when the reader must stop after it.
fn read_delivery(conn: &mut Connection<TcpStream>) -> (Vec<Event>, bool) {
    let first = conn.read_message();
    // The frame's share of the server's memory, held until the session
    // thread is done with the message.
    let held = conn.take_held();
    let m = match first {
        Ok(Some(m)) => m,
        other => return (vec![Event::Msg(Arrival::Read(other), held)], true),
    };
    // A message with a grant of its own goes alone: the reader must not
    // wait for the budget while it holds an undelivered grant.
    if held.is_some() || !conn.has_buffered_message() {
        return (vec![Event::Msg(Arrival::Read(Ok(Some(m))), held)], false);
    }
    let mut batch = vec![m];
    let mut after = None;
    let mut stop = false;
    while batch.len() < READ_BATCH && conn.has_buffered_message() {
        let next = conn.read_message();
        let next_held = conn.take_held();
        match next {
            Ok(Some(m)) if next_held.is_none() => batch.push(m),
            other => {
                stop = !matches!(other, Ok(Some(_)));
                after = Some(Event::Msg(Arrival::Read(other), next_held));
                break;
            }
        }
    }
    let mut delivery = vec![Event::Msg(Arrival::Moved(batch), None)];
    delivery.extend(after);
    (delivery, stop)
}

/// A receiver half's event queue: what its link delivers (at most
/// [`READ_AHEAD`] deliveries ahead of the session thread) and its
/// verifier's verdicts.
pub(crate) struct Inbox {
    tx: mpsc::Sender<Event>,
    events: mpsc::Receiver<Event>,
    taker: CreditTaker,
    giver: CreditGiver,
}

impl Inbox {
    pub(crate) fn new() -> Inbox {
        let (tx, events) = mpsc::channel::<Event>();
        // The link takes a credit before it hands over a delivery (a
        // socket's message, or an in-process batch) and the session thread
        // gives one back as it takes it: at most READ_AHEAD wait in memory.
        let (taker, giver) = crate::credits::window(READ_AHEAD, READ_LOW);
        Inbox {
            tx,
            events,
            taker,
            giver,
        }
    }

    /// The in-process link into this half: a sender half's messages, moved.
    pub(crate) fn local_link(&self) -> Box<dyn Outbound + Send> {
        Box::new(LocalOut::new(
            self.tx.clone(),
            Some(self.taker.clone()),
            |m| Event::Msg(m, None),
        ))
    }

    /// Runs the session on this queue, answering through `out`, until the
    /// sender says Bye or its link closes; then `stop_link` (which must end
    /// whatever feeds the queue) and the verifier are stopped, and what
    /// verified is journaled for the next attempt.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run(
        self,
        out: &mut dyn Outbound,
        shares: Shares,
        dest: &Destination,
        root: &std::path::Path,
        journal: &Journal,
        opts: &ReceiveOptions,
        stop_link: impl FnOnce(),
    ) -> Result<SessionSummary, TransferError> {
        let Inbox {
            tx,
            events,
            taker,
            giver,
        } = self;
        drop(taker);
        let (jobs, jobs_rx) = mpsc::sync_channel::<Job>(VERIFY_QUEUE);
        let state = root.join(crate::journal::STATE_DIR);
        let flash = Flash {
            settings: opts.flash.clone(),
            verifiers: opts.verifiers.clone(),
            scratch: if state.is_dir() {
                state
            } else {
                root.to_path_buf()
            },
            working: opts.working.clone(),
            profile: std::sync::Arc::clone(&opts.profile),
        };
        let checker = std::thread::spawn(move || verifier(jobs_rx, tx, flash));
        let mut files: HashMap<u64, Incoming> = HashMap::new();
        let mut ready: Vec<(u64, Incoming)> = Vec::new();
        let mut sess = Session {
            out,
            dest,
            root,
            pending_delete: None,
            journal,
            opts,
            jobs,
            files: &mut files,
            ready: &mut ready,
            dirs: Vec::new(),
            dir_bytes: 0,
            dir_held: None,
            created: opts.session_dirs.join(opts.session),
            in_use: InUse::default(),
            shares,
            at_verifier: HashMap::new(),
            deferred_out: 0,
            sender_waiting: false,
            summary: SessionSummary::default(),
            buf: AlignedBuf::new(0),
            deferred: Default::default(),
            at_sync: Vec::new(),
            at_sync_since: None,
        };
        let result = sess.run(&events, &giver);
        drop(sess);
        stop_link();
        // The verifier stops as its queue closes.
        drop(giver);
        drop(events);
        let _ = checker.join();
        // However the session ended, keep what verified for the next
        // attempt (files still waiting for the group commit included: they
        // stay partial, every block journaled, and the next send only ends
        // them; an unnamed file of one block ends here, and is sent again).
        files.extend(ready);
        let profile = &opts.profile;
        for f in files.values_mut() {
            let _ = f.journal(journal, profile);
        }
        let _ = profile.time(Stage::Journal, || journal.flush());
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use intact_proto::Message;
    use std::net::TcpListener;

    fn file_end(file: u64) -> Message {
        Message::FileEnd {
            file,
            blocks: 0,
            source_level: 0,
            digest: Vec::new(),
        }
    }

    #[test]
    fn frames_already_buffered_go_as_one_batch_and_the_end_after_it() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut w = Connection::new(TcpStream::connect(l.local_addr().unwrap()).unwrap());
        let mut r = Connection::new(l.accept().unwrap().0);
        // One write of five small frames, in the receiving socket's queue
        // (loopback) before the first read, which takes them all in.
        for i in 0..5 {
            w.write_message(&file_end(i)).unwrap();
        }
        w.flush().unwrap();
        drop(w);
        let (d, stop) = read_delivery(&mut r);
        assert!(
            !stop,
            "the stream has not ended yet as far as the batch knows"
        );
        assert_eq!(d.len(), 1, "one delivery");
        match &d[0] {
            Event::Msg(Arrival::Moved(v), None) => {
                assert_eq!(*v, (0..5).map(file_end).collect::<Vec<_>>(), "in order")
            }
            _ => panic!("not a batch"),
        }
        let (d, stop) = read_delivery(&mut r);
        assert!(stop);
        assert!(matches!(
            &d[..],
            [Event::Msg(Arrival::Read(Ok(None)), None)]
        ));
    }

    #[test]
    fn a_lone_frame_goes_alone() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut w = Connection::new(TcpStream::connect(l.local_addr().unwrap()).unwrap());
        let mut r = Connection::new(l.accept().unwrap().0);
        w.send(&file_end(7)).unwrap();
        let (d, stop) = read_delivery(&mut r);
        assert!(!stop);
        assert!(
            matches!(&d[..], [Event::Msg(Arrival::Read(Ok(Some(m))), None)] if *m == file_end(7))
        );
    }
}

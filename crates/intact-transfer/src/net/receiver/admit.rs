//! What a session admits of an Entry before anything is allocated or
//! created for it: a file id that is free, a file within the server's
//! bounds (see [`crate::net::bounds`]), and a directory the session may
//! finish.

use intact_proto::Entry;
use intact_proto::{EntryKind, Message};

use std::time::{Duration, Instant};

use intact_proto::FileStatus;

use super::begin::{begin, Begun};
use super::commit::{failed, verified_because};
use super::{Session, MAX_PENDING_DIR_BYTES};
use crate::dest::Mtime;
use crate::net::bounds::{self, Slot};
use crate::TransferError;

/// Entries one stream keeps waiting at most.
const MAX_DEFERRED: usize = 4096;

/// How often waiting entries look for a freed place.
const DEFERRED_POLL: Duration = Duration::from_millis(20);

/// An Entry waiting for a place.
pub(super) struct Deferred {
    pub(super) entry: Entry,
    since: Instant,
    /// When a place was last asked for it.
    tried: Instant,
    /// Its share of the client's memory.
    _held: Option<intact_proto::Held>,
}

/// What an Entry gets now.
enum Admission {
    /// A place (None: not a file, it needs none).
    Now(Option<Slot>),
    /// Never (over a per-file bound): the reason.
    Refused(String),
    /// Not now (every place of the session taken): the reason.
    Busy(String),
}

impl Session<'_> {
    /// Whether file id `id` still belongs to a file not yet answered (or
    /// to blocks still at the verifier): an Entry may not reuse it.
    pub(super) fn in_use(&self, id: u64) -> bool {
        self.files.contains_key(&id)
            || self.at_verifier.contains_key(&id)
            || self.ready.iter().any(|(r, _)| *r == id)
            || self.deferred.iter().any(|d| d.entry.file == id)
    }

    /// Answers an Entry: admitted now, refused, or, when the session's
    /// places are all taken, deferred until its own files give some back.
    pub(super) fn entry(&mut self, e: Entry) -> Result<(), TransferError> {
        if !self.deferred.is_empty() {
            // In order: behind the entries already waiting.
            return self.defer(e, "entries before it are waiting".into());
        }
        match self.admit(&e)? {
            Admission::Now(slot) => self.answer(e, slot),
            Admission::Refused(why) => self.refuse(&e, &why),
            Admission::Busy(why) if self.opts.limits.admit_wait.is_zero() => self.refuse(&e, &why),
            Admission::Busy(why) => self.defer(e, why),
        }
    }

    /// Admits the waiting entries that have a place now, in order; one
    /// that waited `limits.admit_wait` is refused ("server busy").
    pub(super) fn admit_deferred(&mut self) -> Result<(), TransferError> {
        while let Some(mut d) = self.deferred.pop_front() {
            // Not at every message: a try commits this stream's ready
            // files (a syncfs) to free their places.
            if d.tried.elapsed() < DEFERRED_POLL {
                self.deferred.push_front(d);
                return Ok(());
            }
            match self.admit(&d.entry)? {
                Admission::Now(slot) => self.answer(d.entry, slot)?,
                Admission::Refused(why) => self.refuse(&d.entry, &why)?,
                Admission::Busy(_) if d.since.elapsed() < self.opts.limits.admit_wait => {
                    d.tried = Instant::now();
                    self.deferred.push_front(d);
                    return Ok(());
                }
                Admission::Busy(why) => self.refuse(&d.entry, &why)?,
            }
        }
        Ok(())
    }

    /// How long the session thread may wait for its next event: briefly
    /// while entries wait for places (others' commits free them, and no
    /// event says so).
    pub(super) fn tick(&self, tick: Duration) -> Duration {
        if self.deferred.is_empty() {
            tick
        } else {
            tick.min(DEFERRED_POLL)
        }
    }

    fn refuse(&mut self, e: &Entry, why: &str) -> Result<(), TransferError> {
        self.summary.fail(&e.path.to_string(), why);
        Ok(self
            .out
            .put(failed(e.file, &format!("{}: {why}", e.path)))?)
    }

    /// Keeps `e` until a place frees, its bytes charged to the client's
    /// memory share (refused at once past it, or past [`MAX_DEFERRED`]).
    fn defer(&mut self, e: Entry, why: String) -> Result<(), TransferError> {
        let cost = e.path.as_bytes().len() as u64 + 2 * intact_proto::LIST_ITEM_COST;
        let held = match &self.shares.memory {
            Some(m) => match m.try_take(cost) {
                Ok(h) => Some(h),
                Err(_) => return self.refuse(&e, &why),
            },
            None => None,
        };
        if self.deferred.len() >= MAX_DEFERRED {
            return self.refuse(&e, &why);
        }
        let now = Instant::now();
        self.deferred.push_back(Deferred {
            entry: e,
            since: now,
            tried: now,
            _held: held,
        });
        Ok(())
    }

    /// Begins the admitted entry `e` and sends its answer.
    fn answer(&mut self, e: Entry, slot: Option<Slot>) -> Result<(), TransferError> {
        let id = e.file;
        let path = e.path.to_string();
        let begun = {
            // A held file may be read back whole here.
            let _working = self.opts.working.now();
            begin(
                self.dest,
                self.journal,
                self.opts,
                e,
                self.files,
                &mut self.buf,
            )
        };
        if let Some(f) = self.files.get_mut(&id) {
            f.slot = slot;
        }
        let mut reply = match begun {
            Begun::Reply(m) => m,
            Begun::Dir(e) => self.dir(e),
        };
        if let Message::Status { strong, .. } = &mut reply {
            // Each block's BLAKE3, by which a recovery cache's copy is
            // taken back, comes only over this channel.
            *strong = self.opts.recovery.is_some();
        }
        if let Message::FileResult(r) = &reply {
            match r.status {
                FileStatus::Failed => self.summary.fail(&path, &r.message),
                // Directories and links are answered here too; of files,
                // only those held whole and trusted.
                FileStatus::Verified => self.summary.verified += u64::from(r.unchanged),
            }
        }
        Ok(self.out.put(reply)?)
    }

    /// A slot for the file `e` announces (None for a directory or a
    /// symlink), refused for good (over a per-file bound), or busy: at the
    /// stream's or the session's limit even after the files this stream
    /// has ready were committed (which frees their slots).
    fn admit(&mut self, e: &Entry) -> Result<Admission, TransferError> {
        if e.kind != EntryKind::File {
            return Ok(Admission::Now(None));
        }
        let limits = &self.opts.limits;
        let blocks = match bounds::blocks_of(e, limits) {
            Ok(n) => n,
            Err(why) => return Ok(Admission::Refused(why)),
        };
        // One range of a split file holds only its own blocks and bytes
        // (its state starts at its first block); one outside the file is
        // refused when it begins.
        let (blocks, bytes) = bounds::range_share(e, blocks);
        if let Ok(slot) = bounds::take_slot(limits, &self.in_use, &self.shares, blocks, bytes) {
            return Ok(Admission::Now(Some(slot)));
        }
        if self.ready.is_empty() {
            return Ok(self.busy(blocks, bytes));
        }
        self.commit()?;
        Ok(self.busy(blocks, bytes))
    }

    fn busy(&self, blocks: u64, bytes: u64) -> Admission {
        match bounds::take_slot(&self.opts.limits, &self.in_use, &self.shares, blocks, bytes) {
            Ok(slot) => Admission::Now(Some(slot)),
            Err(r) => Admission::Busy(r.reason().to_string()),
        }
    }

    /// Charges a directory kept for the session's end (`len` bytes of
    /// path) to the client's memory share; false when the share is spent
    /// (the directory is then finished at once).
    fn hold_dir(&mut self, len: usize) -> bool {
        let Some(memory) = &self.shares.memory else {
            return true;
        };
        memory
            .try_add(
                &mut self.dir_held,
                len as u64 + intact_proto::LIST_ITEM_COST,
            )
            .is_ok()
    }

    /// A directory entry: made if missing. Its mode and time are set at
    /// the session's end, and only if this session created it (an
    /// existing directory keeps its own); past [`MAX_PENDING_DIR_BYTES`]
    /// of paths kept, a created directory is finished at once.
    pub(super) fn dir(&mut self, e: Entry) -> Message {
        let id = e.file;
        if let Err(err) = self.dest.make_dir(&e.path) {
            return failed(id, &err.to_string());
        }
        if !self.dest.is_created_dir(&e.path, &self.created) {
            return verified_because(
                id,
                "the directory was already there: its mode and time are left as they are",
            );
        }
        let mtime = Mtime {
            sec: e.mtime_sec,
            nsec: e.mtime_nsec,
        };
        let len = e.path.as_bytes().len();
        if self.dir_bytes + len > MAX_PENDING_DIR_BYTES || !self.hold_dir(len) {
            return match self
                .dest
                .finish_created_dir(&e.path, e.mode, mtime, &self.created)
            {
                Ok(_) => verified_because(id, ""),
                Err(err) => failed(id, &err.to_string()),
            };
        }
        self.dir_bytes += len;
        self.dirs.push((e.path, e.mode, mtime));
        verified_because(id, "")
    }
}

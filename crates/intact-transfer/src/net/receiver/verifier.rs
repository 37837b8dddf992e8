//! A session's verifier thread: the per-block re-read of the `riva`,
//! `block` and `flash` verify stages, off the session thread.
//!
//! `riva` and `block` blocks are re-read as they come, in batches; small
//! `riva` files of one block come in groups the session held back,
//! flushed with one `syncfs` per file system first ([`Job::Synced`]). A
//! `flash` block is flushed and evicted as it comes, then waits in the
//! deferred queue (see [`crate::flash`]) until W bytes were written to its
//! device after it; the queue is drained with filler when the sender waits
//! for results ([`Job::Drain`]) or nothing new came for
//! [`IDLE_DRAIN`](crate::flash::IDLE_DRAIN), once other writers no longer
//! turn the window over by themselves ([`DrainWait`]).

use std::fs::File;
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use intact_cache::DeviceReader;
use intact_digest::{AlignedBuf, Digest};

use super::Event;
use crate::flash::{DeferredQueue, DrainWait, FlashSettings, IDLE_DRAIN, MAX_DEFERRED};
use crate::net::watchdog::Working;
use crate::profile::{Profile, Stage};
use crate::recheck::{recheck_batch, Recheck, Verifiers, BATCH_BYTES};
use crate::stage::verify::WindowVerdict;
use crate::verify::VerifyLevel;

/// How often a verifier with deferred blocks looks at the device's counter.
const POLL: Duration = Duration::from_millis(20);

/// Work for the verifier thread.
pub(super) enum Job {
    /// Re-read a written block.
    Check(Check),
    /// Flush the file systems of these blocks (one `syncfs` each), then
    /// re-read them: blocks of small files the session held back
    /// until it had a group of them (see [`Check::sync_first`]).
    Synced(Vec<Check>),
    /// The sender waits for results: push every deferred block past its
    /// window with filler (within the budget) and re-read them all now.
    Drain,
}

/// A written block to re-read (from the device in `riva` and `flash`,
/// through the cache in `block`).
pub(super) struct Check {
    pub(super) id: u64,
    pub(super) index: u64,
    /// The level of the sender's read behind the digest.
    pub(super) source_level: VerifyLevel,
    pub(super) offset: u64,
    pub(super) len: usize,
    pub(super) digest: Digest,
    pub(super) file: Arc<File>,
    pub(super) reader: Arc<Mutex<DeviceReader>>,
    /// The CRC-32C of each page of the bytes received (for the catalog).
    pub(super) pages: Option<Vec<u8>>,
    /// Whether `pages` are at [`intact_proto::WIRE_PAGE`]: then they also
    /// name the bad pages of a failed re-read.
    pub(super) pages_are_wire: bool,
    /// Otherwise the sender's page CRCs, checked against the bytes
    /// received, if it sent them.
    pub(super) crcs: Option<Vec<u8>>,
    /// `flash`: wait for the device's write cache to turn over first.
    pub(super) deferred: bool,
    /// The block is a whole small file (one block, at most
    /// [`SYNC_MAX_FILE`](super::SYNC_MAX_FILE)) in `riva` on the evict
    /// path: the session holds it back and hands it over in a group
    /// ([`Job::Synced`]).
    pub(super) sync_first: bool,
    /// The device number of the file system the file is on.
    pub(super) dev: u64,
}

/// The verifier's verdict on one block.
pub(super) struct Checked {
    pub(super) id: u64,
    pub(super) index: u64,
    pub(super) source_level: VerifyLevel,
    pub(super) digest: Digest,
    pub(super) ok: Result<bool, std::io::Error>,
    pub(super) outcome: intact_cache::ReadOutcome,
    pub(super) took: Duration,
    /// As the [`Check`] had them.
    pub(super) pages: Option<Vec<u8>>,
    /// A deferred re-read: whether its window had passed.
    pub(super) window: Option<WindowVerdict>,
    /// A failed re-read: the pages whose CRC-32C differed from the
    /// block's (empty: not known, resend it whole).
    pub(super) bad_pages: Vec<u32>,
    /// As the [`Check`] had it (`flash`).
    pub(super) deferred: bool,
}

/// What a verifier thread re-reads with: its own buffer, and the threads
/// its batches are shared among.
struct Rereads {
    buf: AlignedBuf,
    verifiers: Verifiers,
}

/// A deferred block and its window's statement.
type Waiting = (Check, Arc<str>);

/// Where a verifier's `flash` blocks wait, and where its filler goes.
pub(super) struct Flash {
    pub(super) settings: FlashSettings,
    /// A directory on the destination's file system, for filler.
    pub(super) scratch: PathBuf,
    /// The threads that share the re-reads.
    pub(super) verifiers: Verifiers,
    /// Marks the server at work while a group's `syncfs` runs.
    pub(super) working: Working,
    /// Where a group's `syncfs` is timed (as eviction: it is the flush
    /// before it).
    pub(super) profile: Arc<Profile>,
}

/// The verifier thread of a session: it takes the blocks queued so far as
/// one batch (see [`crate::recheck`]) and sends a verdict for each.
pub(super) fn verifier(jobs: mpsc::Receiver<Job>, events: mpsc::Sender<Event>, flash: Flash) {
    // Grown by the first re-read to its length: an idle session holds none.
    let mut rr = Rereads {
        buf: AlignedBuf::new(0),
        verifiers: flash.verifiers.clone(),
    };
    let mut queue: DeferredQueue<Check> = DeferredQueue::new(flash.settings.clone());
    let mut last_job = Instant::now();
    // A drain asked for, waiting for other writers first.
    let mut waiting: Option<DrainWait> = None;
    let mut active = flash.settings.active();
    loop {
        active.set(!queue.is_empty() && waiting.is_none());
        let first = if queue.is_empty() {
            match jobs.recv() {
                Ok(j) => Some(j),
                Err(_) => return,
            }
        } else {
            match jobs.recv_timeout(POLL) {
                Ok(j) => Some(j),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        };
        let mut now = Vec::new();
        let mut later = Vec::new();
        let mut drain = false;
        if let Some(first) = first {
            last_job = Instant::now();
            let mut bytes = 0;
            let mut next = Some(first);
            while let Some(job) = next.take() {
                match job {
                    Job::Drain => drain = true,
                    Job::Synced(checks) => {
                        bytes += checks.iter().map(|c| c.len).sum::<usize>();
                        let _working = flash.working.now();
                        let (synced, failed) =
                            flash.profile.time(Stage::Evict, || sync_devices(checks));
                        if !send_all(&events, failed) {
                            return;
                        }
                        now.extend(synced);
                    }
                    Job::Check(c) => {
                        bytes += c.len;
                        if c.deferred {
                            later.push(c);
                        } else {
                            now.push(c);
                        }
                    }
                }
                if bytes < BATCH_BYTES {
                    next = jobs.try_recv().ok();
                }
            }
        }
        if !send_all(&events, reread(now, &mut rr)) {
            return;
        }
        // Blocks to defer and no drain with them: the sender is sending
        // again, so a drain it asked for before is over.
        if !later.is_empty() && !drain {
            waiting = None;
        }
        if !send_all(&events, admit(&mut queue, later, &mut rr)) {
            return;
        }
        drain |= !queue.is_empty() && last_job.elapsed() >= IDLE_DRAIN;
        if drain && waiting.is_none() && !queue.is_empty() {
            waiting = Some(DrainWait::new(Instant::now()));
        }
        // The drain happens once other writers no longer push the window
        // (or the patience ran out): then filler, and what is left is
        // re-read now.
        drain = false;
        let mut early_why = None;
        // (A wait is never pending over an empty queue: it starts only
        // over waiting blocks and ends when the queue empties, below.)
        if let Some(w) = &mut waiting {
            if w.fill_now(queue.written(), active.others(), Instant::now()) {
                waiting = None;
                drain = true;
                let (_, why) = queue.fill(&flash.scratch);
                early_why = why;
            }
        }
        let due = match queue.take_due() {
            Ok(due) => due,
            Err(e) => {
                early_why = Some(format!("the device's counter could not be read: {e}"));
                Vec::new()
            }
        };
        if !send_all(&events, reread_waiting(due, true, None, &mut rr)) {
            return;
        }
        // Drained, or over the bound: what is left is re-read now, before
        // its window passed.
        let mut early = Vec::new();
        if drain || early_why.is_some() {
            early.extend(std::iter::from_fn(|| queue.take_oldest()));
            if !early.is_empty() {
                // Filler went only to the destination root's file system.
                early_why.get_or_insert_with(|| {
                    "the sender waited for results, and no filler could be written on this block's device".into()
                });
            }
        }
        while queue.len() > MAX_DEFERRED {
            early.extend(queue.take_oldest());
            early_why.get_or_insert_with(|| {
                format!("more than {MAX_DEFERRED} blocks waited for their window at once")
            });
        }
        let why = early_why.map(|w| Arc::from(w.as_str()));
        if !send_all(&events, reread_waiting(early, false, why, &mut rr)) {
            return;
        }
        // Every block re-read (its window passed while waiting): the
        // drain is over.
        if queue.is_empty() {
            waiting = None;
        }
    }
}

/// One `syncfs` per file system among `checks`' files, so that the
/// group's pages go to the device in merged writes: the checks to re-read,
/// and the verdicts of those on a file system whose `syncfs` failed. They
/// fail, as a commit's files fail when its `syncfs` does: the error may be
/// one only `syncfs` reports (a metadata write, the device's flush), and
/// reporting it here consumes it, so the commit's own `syncfs` may not see
/// it again.
fn sync_devices(checks: Vec<Check>) -> (Vec<Check>, Vec<Checked>) {
    let mut done: Vec<(u64, Result<(), rustix::io::Errno>)> = Vec::new();
    let (mut synced, mut failed) = (Vec::with_capacity(checks.len()), Vec::new());
    for c in checks {
        let r = match done.iter().find(|(dev, _)| *dev == c.dev) {
            Some((_, r)) => *r,
            None => {
                let r = rustix::fs::syncfs(&*c.file);
                done.push((c.dev, r));
                r
            }
        };
        match r {
            Ok(()) => synced.push(c),
            Err(e) => {
                let e = std::io::Error::new(
                    std::io::Error::from(e).kind(),
                    format!("syncfs before the re-read: {e}"),
                );
                failed.push(c.failed(e, Duration::ZERO));
            }
        }
    }
    (synced, failed)
}

/// Sends each verdict; false once the session is gone.
fn send_all(events: &mpsc::Sender<Event>, done: Vec<Checked>) -> bool {
    done.into_iter()
        .all(|c| events.send(Event::Checked(c)).is_ok())
}

/// Flushes and evicts `flash` blocks as they come, then queues them: each
/// is due once W bytes were written to its device after its flush. A block
/// that cannot be flushed fails at once.
fn admit(queue: &mut DeferredQueue<Check>, later: Vec<Check>, rr: &mut Rereads) -> Vec<Checked> {
    for c in &later {
        intact_cache::start_writeback(&c.file, c.offset, c.len as u64);
    }
    let mut failed = Vec::new();
    // Blocks whose later writes cannot be counted, by why (one cause,
    // nearly always): re-read now, in batches, at level device.
    let mut uncounted: Vec<(Arc<str>, Vec<Waiting>)> = Vec::new();
    for c in later {
        let t = Instant::now();
        if let Err(e) = intact_cache::evict(&c.file, c.offset, c.len as u64) {
            failed.push(c.failed(e.into(), t.elapsed()));
            continue;
        }
        let file = Arc::clone(&c.file);
        if let Err((c, why, statement)) = queue.push(&file, c.len as u64, c) {
            match uncounted.iter_mut().find(|(w, _)| **w == *why) {
                Some((_, batch)) => batch.push((c, statement)),
                None => uncounted.push((why.into(), vec![(c, statement)])),
            }
        }
    }
    for (why, batch) in uncounted {
        failed.extend(reread_waiting(batch, false, Some(why), rr));
    }
    failed
}

/// Re-reads `now` (not deferred) as one batch.
fn reread(now: Vec<Check>, rr: &mut Rereads) -> Vec<Checked> {
    reread_with(now.into_iter().map(|c| (c, None)).collect(), rr)
}

/// Re-reads deferred blocks, whose window had `passed` or not (`why`).
fn reread_waiting(
    waiting: Vec<Waiting>,
    passed: bool,
    why: Option<Arc<str>>,
    rr: &mut Rereads,
) -> Vec<Checked> {
    let batch = waiting
        .into_iter()
        .map(|(c, statement)| {
            let w = WindowVerdict {
                passed,
                why: why.clone(),
                statement,
            };
            (c, Some(w))
        })
        .collect();
    reread_with(batch, rr)
}

/// Re-reads a batch (see [`crate::recheck`]) and gives each its verdict.
fn reread_with(batch: Vec<(Check, Option<WindowVerdict>)>, rr: &mut Rereads) -> Vec<Checked> {
    if batch.is_empty() {
        return Vec::new();
    }
    let items: Vec<Recheck<'_>> = batch
        .iter()
        .map(|(c, _)| Recheck {
            file: &c.file,
            reader: Some(&*c.reader),
            offset: c.offset,
            len: c.len,
            digest: &c.digest,
            crcs: c.wire_crcs(),
        })
        .collect();
    // In pieces of at most BATCH_BYTES (a drain may hand over thousands of
    // blocks): the verifier threads are shared by every session, which
    // then take turns rather than wait behind one session's whole queue.
    let mut results = Vec::with_capacity(items.len());
    let mut start = 0;
    while start < items.len() {
        let mut end = start + 1;
        let mut bytes = items[start].len;
        while end < items.len() && bytes + items[end].len <= BATCH_BYTES {
            bytes += items[end].len;
            end += 1;
        }
        results.extend(recheck_batch(
            &items[start..end],
            &mut rr.buf,
            &rr.verifiers,
        ));
        start = end;
    }
    drop(items);
    batch
        .into_iter()
        .zip(results)
        .map(|((c, window), r)| Checked {
            id: c.id,
            index: c.index,
            source_level: c.source_level,
            digest: c.digest,
            ok: r.ok,
            outcome: r.outcome,
            took: r.took,
            pages: c.pages,
            window,
            bad_pages: r.bad_pages,
            deferred: c.deferred,
        })
        .collect()
}

impl Check {
    /// The CRC-32C of each 4 KiB page the block should hold, if known.
    fn wire_crcs(&self) -> Option<&[u8]> {
        match (&self.crcs, self.pages_are_wire) {
            (Some(c), _) => Some(c),
            (None, true) => self.pages.as_deref(),
            (None, false) => None,
        }
    }

    /// The verdict on a block that could not be re-read.
    fn failed(self, e: std::io::Error, took: Duration) -> Checked {
        Checked {
            id: self.id,
            index: self.index,
            source_level: self.source_level,
            digest: self.digest,
            ok: Err(e),
            outcome: intact_cache::ReadOutcome::default(),
            took,
            pages: self.pages,
            window: None,
            bad_pages: Vec::new(),
            deferred: self.deferred,
        }
    }
}

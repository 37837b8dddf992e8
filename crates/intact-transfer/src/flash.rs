//! `--verify flash` (Kim et al., Sections IV–V): a written block is
//! re-read from the device only after the device's write cache has turned
//! over, so that the read reaches the flash media and not the SSD's DRAM
//! buffer, which still holds the good copy right after the write.
//!
//! - [`Window`]: W, the device's write-cache window in bytes
//!   (`--device-cache`, by default 0.1% of the device's capacity as Kim et
//!   al. assume, capped at [`MAX_DEFAULT_WINDOW`]), and how bytes written
//!   after a block are counted: each disk's own counter of sectors written
//!   (every writer's traffic, which is what turns the buffer over). Where
//!   the file system has no block device in sysfs nothing can be counted,
//!   and no block reaches `media`.
//! - [`DeferredQueue`]: the blocks written and flushed but not yet due,
//!   per device in write order, each with the positions at which it
//!   becomes due. It
//!   holds digests and positions, never data, and is bounded
//!   ([`MAX_DEFERRED`]): past the bound the oldest is re-read at once and
//!   counts at level `device`.
//! - [`write_filler`]: when the transfer waits for results (the sender's
//!   Waiting, or no new block for [`IDLE_DRAIN`]), the blocks not yet due
//!   are pushed past the window by writing a scratch file on the same file
//!   system (fsynced, then removed): at most `--max-filler` bytes (default
//!   W) per drain, and, where the sender is another process (`intact
//!   serve`), per receiving stream in all at most [`FILLER_PER_BYTE`]
//!   times the bytes it received, so that a sender (hostile, or one of
//!   many tiny files) cannot make the device write much more than it
//!   sent. A drain first waits, up to
//!   [`DRAIN_PATIENCE`], while others still write the device fast
//!   ([`DrainWait`]): the streams of one copy then write filler once,
//!   after the last of them, not each its own. Blocks
//!   the filler allowed could not push past the window are re-read at once
//!   and reported at level `device` with the reason. `media` is never
//!   claimed for a block whose window has not passed.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use intact_cache::DeviceCounter;

use crate::report::human_bytes;

/// Kim et al.'s estimate of an SSD's write buffer: 0.1% of its capacity.
pub const DEFAULT_SHARE: f64 = 0.001;

/// The default window at most (a 1 TB SSD's 0.1%): beyond it, filler at
/// the end of a transfer would cost more than it is worth; `--device-cache`
/// sets any size.
pub const MAX_DEFAULT_WINDOW: u64 = 1 << 30;

/// Blocks waiting for their window per receiving stream at most; past it
/// the oldest is re-read at once (level `device`).
pub const MAX_DEFERRED: usize = 1 << 16;

/// A stream with blocks waiting and nothing new written for this long
/// drains its queue with filler: the sender is waiting for results.
pub const IDLE_DRAIN: Duration = Duration::from_secs(2);

/// A drain waits at most this long for other writers (the other streams
/// of a copy or a server, anyone writing to the device) to push its blocks
/// past the window before it writes filler itself.
pub const DRAIN_PATIENCE: Duration = Duration::from_secs(1);

/// Others write to the device at least this fast, or a drain stops
/// waiting for them: 32 MiB/s.
const OTHERS_RATE: f64 = 32.0 * 1048576.0;

/// Filler is written in chunks of this size.
const FILLER_CHUNK: usize = 1 << 20;

/// How a receiver runs `--verify flash`: the window and the filler budget
/// (`intact copy`/`intact serve --device-cache --max-filler`). Clones share
/// the count of filler written.
#[derive(Debug, Clone, Default)]
pub struct FlashSettings {
    /// W in bytes; None: 0.1% of the device's capacity, capped.
    pub device_cache: Option<u64>,
    /// Filler one receiving stream may write per drain to push its last
    /// blocks past the window (and in all at most [`FILLER_PER_BYTE`]
    /// times the bytes it received, plus two drains' worth in a copy);
    /// None: W.
    pub max_filler: Option<u64>,
    filler_written: Arc<AtomicU64>,
    /// Receiving streams sharing these settings whose blocks wait and
    /// whose sender still sends ([`Active`]).
    active: Arc<AtomicUsize>,
    /// The sender is this process (`intact copy`): no cap of
    /// [`FILLER_PER_BYTE`] against hostile senders, only `--max-filler`.
    local: bool,
}

impl FlashSettings {
    /// Settings with window `device_cache` and filler budget `max_filler`
    /// (None: their defaults).
    pub fn new(device_cache: Option<u64>, max_filler: Option<u64>) -> FlashSettings {
        FlashSettings {
            device_cache,
            max_filler,
            filler_written: Arc::default(),
            active: Arc::default(),
            local: false,
        }
    }

    /// The same settings (sharing their counts) for a receiver whose
    /// sender is this very process (`intact copy`): the user's own copy
    /// may write two drains of `--max-filler` beyond a server's cap
    /// however little it sent, so that small files and a resent block
    /// reach `media` too.
    pub(crate) fn for_local_sender(&self) -> FlashSettings {
        FlashSettings {
            local: true,
            ..self.clone()
        }
    }

    /// Filler bytes written so far by every receiver sharing these settings.
    pub fn filler_written(&self) -> u64 {
        self.filler_written.load(Ordering::Relaxed)
    }

    /// One receiving stream's place in the count of active streams.
    pub(crate) fn active(&self) -> Active {
        Active {
            count: Arc::clone(&self.active),
            on: false,
        }
    }
}

/// Whether one receiving stream is active: blocks of its wait for their
/// window and its sender is still sending (no drain asked for). Other
/// streams' drains wait while any is, since its writes turn the window
/// over for them. Leaves the count when dropped.
pub(crate) struct Active {
    count: Arc<AtomicUsize>,
    on: bool,
}

impl Active {
    pub fn set(&mut self, on: bool) {
        if on != self.on {
            if on {
                self.count.fetch_add(1, Ordering::SeqCst);
            } else {
                self.count.fetch_sub(1, Ordering::SeqCst);
            }
            self.on = on;
        }
    }

    /// Whether a stream other than this one is active.
    pub fn others(&self) -> bool {
        self.count.load(Ordering::SeqCst) > usize::from(self.on)
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.set(false);
    }
}

/// The write-cache window of one device, and its counters of bytes
/// written (one per disk under it).
#[derive(Debug)]
pub(crate) struct Window {
    /// W, in bytes.
    pub bytes: u64,
    /// Where W came from.
    what: String,
    /// None: this file system has no block device in sysfs, so writes
    /// after a block cannot be counted and no block reaches `media`.
    counter: Option<DeviceCounter>,
    /// Unit tests: counters they set themselves.
    #[cfg(test)]
    fake: Option<Arc<Mutex<Vec<u64>>>>,
}

impl Window {
    /// The window of the device holding `file`.
    pub fn for_file(file: &File, s: &FlashSettings) -> std::io::Result<Window> {
        let counter = DeviceCounter::for_file(file)?;
        let (bytes, what) = match (s.device_cache, &counter) {
            (Some(w), _) => (w, "--device-cache".to_string()),
            (None, Some(c)) => {
                let share = (c.capacity() as f64 * DEFAULT_SHARE) as u64;
                let of = format!("0.1% of {}'s {}", c.name(), human_bytes(c.capacity()));
                if share > MAX_DEFAULT_WINDOW {
                    (
                        MAX_DEFAULT_WINDOW,
                        format!("{of}, capped at {}", human_bytes(MAX_DEFAULT_WINDOW)),
                    )
                } else {
                    (share, of)
                }
            }
            (None, None) => (0, "no device".to_string()),
        };
        Ok(Window {
            bytes,
            what,
            counter,
            #[cfg(test)]
            fake: None,
        })
    }

    /// Whether writes to this device can be counted.
    fn counts(&self) -> bool {
        #[cfg(test)]
        if self.fake.is_some() {
            return true;
        }
        self.counter.is_some()
    }

    /// Bytes written so far to each disk under the device.
    fn positions(&self) -> std::io::Result<Vec<u64>> {
        #[cfg(test)]
        if let Some(f) = &self.fake {
            return Ok(f.lock().unwrap().clone());
        }
        match &self.counter {
            Some(c) => c.bytes_written(),
            None => Err(std::io::Error::other(NO_COUNTER)),
        }
    }

    /// W, where it came from, and how bytes after a block are counted, for
    /// reports.
    pub fn statement(&self) -> String {
        match &self.counter {
            None => format!("no write-cache window: {NO_COUNTER}"),
            Some(c) => {
                let disks = c.disks();
                let counted = if disks == [c.name()] {
                    format!(
                        "counted by {}'s own sectors-written counter (/sys/block/{}/stat, every writer's traffic)",
                        c.name(),
                        c.name()
                    )
                } else {
                    format!(
                        "counted on each disk under {} ({}) by its own sectors-written counter",
                        c.name(),
                        disks.join(", ")
                    )
                };
                format!(
                    "write-cache window W = {} ({}), {counted}",
                    human_bytes(self.bytes),
                    self.what
                )
            }
        }
    }
}

/// Why a file system without a block device in sysfs cannot reach `media`.
const NO_COUNTER: &str = "this file system has no block device in sysfs (btrfs, tmpfs, a network or FUSE file system), so the bytes written to the device after a block cannot be counted";

/// The blocks of one device waiting for its window, in write order (so
/// their due positions only grow).
struct DeviceQueue<T> {
    dev: u64,
    window: Window,
    statement: Arc<str>,
    /// (order queued, due position per disk, block).
    waiting: VecDeque<(u64, Vec<u64>, T)>,
}

impl<T> DeviceQueue<T> {
    /// Bytes still to be written to the least-advanced disk for the
    /// block at `at` (front: 0, back: len - 1) to be due.
    fn shortfall(&self, at: usize, now: &[u64]) -> u64 {
        self.waiting.get(at).map_or(0, |(_, due, _)| {
            due.iter()
                .zip(now)
                .map(|(d, n)| d.saturating_sub(*n))
                .max()
                .unwrap_or(0)
        })
    }
}

/// The blocks written but not yet due, per device, with their windows.
pub(crate) struct DeferredQueue<T> {
    devices: Vec<DeviceQueue<T>>,
    settings: FlashSettings,
    /// Filler this queue has written.
    filler_spent: u64,
    /// Bytes of blocks queued so far.
    queued: u64,
    /// Blocks queued so far (their order).
    seq: u64,
}

/// A stream may write this many times the bytes it queued in filler, in
/// all: a sender cannot make the device write much more than it sent.
pub const FILLER_PER_BYTE: u64 = 4;

/// A copy's stream (its sender is the user's own process) may write this
/// many drains of `--max-filler` beyond [`FILLER_PER_BYTE`]: the last
/// blocks' and a resent block's.
const LOCAL_DRAINS: u64 = 2;

impl<T> DeferredQueue<T> {
    pub fn new(settings: FlashSettings) -> DeferredQueue<T> {
        DeferredQueue {
            devices: Vec::new(),
            settings,
            filler_spent: 0,
            queued: 0,
            seq: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.devices.iter().all(|d| d.waiting.is_empty())
    }

    pub fn len(&self) -> usize {
        self.devices.iter().map(|d| d.waiting.len()).sum()
    }

    /// The queue of `file`'s device, made on first use.
    fn device(&mut self, file: &File) -> std::io::Result<&mut DeviceQueue<T>> {
        let dev = file.metadata()?.dev();
        if let Some(i) = self.devices.iter().position(|d| d.dev == dev) {
            return Ok(&mut self.devices[i]);
        }
        let window = Window::for_file(file, &self.settings)?;
        let statement = window.statement().into();
        self.devices.push(DeviceQueue {
            dev,
            window,
            statement,
            waiting: VecDeque::new(),
        });
        Ok(self.devices.last_mut().expect("just pushed"))
    }

    /// Queues `item`, written and flushed to the device of `file` (of
    /// `len` bytes): it is due once W more bytes were written to every
    /// disk under the device. Gives the item back, with why and the
    /// window's statement, where that cannot be counted (no device
    /// counter, or it cannot be read).
    pub fn push(&mut self, file: &File, len: u64, item: T) -> Result<(), (T, String, Arc<str>)> {
        let seq = self.seq;
        let placed = self.device(file).and_then(|d| {
            let due = d
                .window
                .positions()?
                .into_iter()
                .map(|p| p.saturating_add(d.window.bytes))
                .collect();
            Ok((d, due))
        });
        match placed {
            Ok((d, due)) => {
                d.waiting.push_back((seq, due, item));
                self.seq += 1;
                self.queued += len;
                Ok(())
            }
            Err(e) => {
                let statement = match self.device(file) {
                    Ok(d) => Arc::clone(&d.statement),
                    Err(_) => Arc::from(""),
                };
                Err((item, e.to_string(), statement))
            }
        }
    }

    /// Bytes written so far to the least-advanced disk of each device
    /// this queue has seen, summed (how fast windows turn over, for
    /// [`DrainWait`]: the set of devices only grows, so two readings
    /// compare); None when there is none or a counter is unreadable.
    pub fn written(&self) -> Option<u64> {
        let mut sum = 0u64;
        // A device without a counter holds no waiting block.
        for d in self.devices.iter().filter(|d| d.window.counts()) {
            sum = sum.saturating_add(d.window.positions().ok()?.into_iter().min()?);
        }
        self.devices
            .iter()
            .any(|d| d.window.counts())
            .then_some(sum)
    }

    /// Every block due now, oldest first per device, each with its
    /// window's statement.
    pub fn take_due(&mut self) -> std::io::Result<Vec<(T, Arc<str>)>> {
        let mut due = Vec::new();
        for d in &mut self.devices {
            if d.waiting.is_empty() {
                continue;
            }
            let now = d.window.positions()?;
            while d.shortfall(0, &now) == 0 {
                let Some((_, _, item)) = d.waiting.pop_front() else {
                    break;
                };
                due.push((item, Arc::clone(&d.statement)));
            }
        }
        Ok(due)
    }

    /// The oldest block, taken before its window passed (the queue is
    /// over its bound, or is being drained), with its window's statement.
    pub fn take_oldest(&mut self) -> Option<(T, Arc<str>)> {
        let d = self
            .devices
            .iter_mut()
            .filter(|d| !d.waiting.is_empty())
            .min_by_key(|d| d.waiting.front().map(|w| w.0))?;
        let (_, _, item) = d.waiting.pop_front()?;
        Some((item, Arc::clone(&d.statement)))
    }

    /// `--max-filler`, or W.
    fn max_filler(&self) -> u64 {
        self.settings.max_filler.unwrap_or_else(|| {
            self.devices
                .iter()
                .map(|d| d.window.bytes)
                .max()
                .unwrap_or(0)
        })
    }

    /// The filler the next drain may write: `--max-filler`, within what
    /// is left of this stream's whole allowance: [`FILLER_PER_BYTE`]
    /// times the bytes it queued, and in a copy two drains more (the last
    /// blocks and a resent one reach `media` however small the copy, while
    /// many tiny files still cannot make it write much more than its data).
    pub fn filler_left(&self) -> u64 {
        self.allowance()
            .saturating_sub(self.filler_spent)
            .min(self.max_filler())
    }

    /// This stream's whole filler allowance (see [`Self::filler_left`]).
    fn allowance(&self) -> u64 {
        let extra = if self.settings.local {
            self.max_filler().saturating_mul(LOCAL_DRAINS)
        } else {
            0
        };
        self.queued
            .saturating_mul(FILLER_PER_BYTE)
            .saturating_add(extra)
    }

    /// The shortfall of the front and of the back of the queue of the
    /// device `dir` is on (filler written there moves only its counters).
    fn needs(&self, dir: &Path) -> std::io::Result<Option<(u64, u64)>> {
        let dev = dir.metadata()?.dev();
        let Some(d) = self
            .devices
            .iter()
            .find(|d| d.dev == dev && !d.waiting.is_empty())
        else {
            return Ok(None);
        };
        let now = d.window.positions()?;
        Ok(Some((
            d.shortfall(0, &now),
            d.shortfall(d.waiting.len() - 1, &now),
        )))
    }

    /// Pushes the waiting blocks of the device `dir` is on past their
    /// window with filler written in `dir`, within the allowance. Returns
    /// the filler written and, where it fell short, why.
    pub fn fill(&mut self, dir: &Path) -> (u64, Option<String>) {
        // One stream fills at a time, in the whole process: another
        // stream's filler moves the same counters. Whether filler is
        // needed at all is asked before waiting for the others.
        static FILLING: Mutex<()> = Mutex::new(());
        let needs = |q: &Self| match q.needs(dir) {
            Ok(n) => Ok(n.filter(|(_, last)| *last > 0)),
            Err(e) => Err(format!("the device's counter could not be read: {e}")),
        };
        match needs(self) {
            Ok(None) => return (0, None),
            Err(why) => return (0, Some(why)),
            Ok(Some(_)) => {}
        }
        let _one = FILLING.lock().unwrap_or_else(|e| e.into_inner());
        let (first, need) = match needs(self) {
            Ok(None) => return (0, None),
            Err(why) => return (0, Some(why)),
            Ok(Some(n)) => n,
        };
        let left = self.filler_left();
        let short = || {
            format!(
                "{} of filler were needed; {} were allowed (--max-filler {} per drain, and per stream in all {FILLER_PER_BYTE}× the {} it received{}, of which {} were written before)",
                human_bytes(need),
                human_bytes(left),
                human_bytes(self.max_filler()),
                human_bytes(self.queued),
                if self.settings.local {
                    format!(" plus {LOCAL_DRAINS} × --max-filler (a copy)")
                } else {
                    String::new()
                },
                human_bytes(self.filler_spent),
            )
        };
        if left < first {
            // Not even the oldest block would become due: write nothing.
            return (0, Some(short()));
        }
        let want = need.min(left);
        let why = (want < need).then(short);
        let (wrote, err) = match write_filler(dir, want) {
            Ok(n) => (n, None),
            Err((n, e)) => (n, Some(e)),
        };
        self.filler_spent += wrote;
        self.settings
            .filler_written
            .fetch_add(wrote, Ordering::Relaxed);
        match err {
            Some(e) => (
                wrote,
                Some(format!(
                    "writing filler failed after {}: {e}",
                    human_bytes(wrote)
                )),
            ),
            None => (wrote, why),
        }
    }
}

/// A drain asked for (the sender waits for results, or nothing new came)
/// that first waits for other writers: while another stream of this
/// process still sends, or the device is being written at least
/// [`OTHERS_RATE`] by anyone, its window turns over without filler (and
/// filler would only slow those writers down). It gives up waiting after
/// [`DRAIN_PATIENCE`]. Several streams of one copy that end at different
/// times then write filler once, after the last, instead of each its own.
#[derive(Debug)]
pub(crate) struct DrainWait {
    since: std::time::Instant,
    /// The last reading of [`DeferredQueue::written`], and when.
    last: Option<(u64, std::time::Instant)>,
}

impl DrainWait {
    pub fn new(now: std::time::Instant) -> DrainWait {
        DrainWait {
            since: now,
            last: None,
        }
    }

    /// Whether to write filler now, given the device counters' reading
    /// `written` at `now` and whether another stream of this process is
    /// still sending: no while others write and the patience lasts.
    pub fn fill_now(
        &mut self,
        written: Option<u64>,
        others_sending: bool,
        now: std::time::Instant,
    ) -> bool {
        if now.duration_since(self.since) >= DRAIN_PATIENCE {
            return true;
        }
        if others_sending {
            self.last = None;
            return false;
        }
        let Some(w) = written else {
            return true;
        };
        let last = self.last.replace((w, now));
        match last {
            // The first reading: wait one poll to see a rate.
            None => false,
            Some((before, at)) => {
                let secs = now.duration_since(at).as_secs_f64();
                if secs <= 0.0 {
                    self.last = Some((before, at));
                    return false;
                }
                (w.saturating_sub(before) as f64) / secs < OTHERS_RATE
            }
        }
    }
}

/// Writes `bytes` of filler to a new scratch file in `dir` (distinct
/// bytes in each chunk, so that no device can deduplicate or compress it
/// away), fsyncs it and removes it. Returns the bytes written, or those
/// and why it stopped short.
pub(crate) fn write_filler(dir: &Path, bytes: u64) -> Result<u64, (u64, String)> {
    let path = dir.join(format!(
        ".intact-partial-flash-filler-{}-{:x}",
        std::process::id(),
        rand_u64()
    ));
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| (0, format!("{}: {e}", path.display())))?;
    let mut chunk = vec![0u8; FILLER_CHUNK];
    let mut seed = rand_u64() | 1;
    let mut written = 0u64;
    let result = (|| {
        while written < bytes {
            let n = (bytes - written).min(FILLER_CHUNK as u64) as usize;
            for w in chunk[..n].chunks_mut(8) {
                // xorshift64: cheap, and never the same chunk twice.
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                w.copy_from_slice(&seed.to_le_bytes()[..w.len()]);
            }
            f.write_all(&chunk[..n])?;
            written += n as u64;
        }
        f.sync_all()
    })();
    drop(f);
    let removed = std::fs::remove_file(&path);
    match (result, removed) {
        (Ok(()), Ok(())) => Ok(written),
        (Err(e), _) => Err((written, e.to_string())),
        (Ok(()), Err(e)) => Err((written, format!("removing {}: {e}", path.display()))),
    }
}

/// A number that differs between calls (names and seeds, not secrets).
fn rand_u64() -> u64 {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    xxhash_rust::xxh3::xxh3_64(&[t.to_le_bytes(), n.to_le_bytes()].concat())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items<T>(v: Vec<(T, Arc<str>)>) -> Vec<T> {
        v.into_iter().map(|(t, _)| t).collect()
    }

    /// A queue whose device (the test directory's) has the counters `disks`.
    fn queue<T>(
        settings: FlashSettings,
        f: &File,
        disks: &Arc<Mutex<Vec<u64>>>,
    ) -> DeferredQueue<T> {
        let mut q = DeferredQueue::new(settings);
        q.device(f).unwrap().window.fake = Some(Arc::clone(disks));
        q
    }

    fn push<T>(q: &mut DeferredQueue<T>, f: &File, len: u64, item: T) {
        assert!(q.push(f, len, item).is_ok());
    }

    #[test]
    fn a_block_is_due_only_after_w_more_bytes_on_every_disk() {
        let t = tempfile::tempdir().unwrap();
        let f = File::create(t.path().join("f")).unwrap();
        let disks = Arc::new(Mutex::new(vec![0, 0]));
        let w = 10 << 20;
        let mut q = queue(FlashSettings::new(Some(w), Some(0)), &f, &disks);
        push(&mut q, &f, 4096, 1u32);
        *disks.lock().unwrap() = vec![4096, 4096];
        push(&mut q, &f, 4096, 2u32);
        assert!(q.take_due().unwrap().is_empty());
        *disks.lock().unwrap() = vec![w, w - 1];
        assert!(q.take_due().unwrap().is_empty(), "one disk one byte short");
        *disks.lock().unwrap() = vec![w + 4095, w];
        assert_eq!(items(q.take_due().unwrap()), vec![1]);
        *disks.lock().unwrap() = vec![w + 4096, w + 4096];
        let due = q.take_due().unwrap();
        assert!(
            due[0].1.contains("W = 10.0 MiB (--device-cache)"),
            "{}",
            due[0].1
        );
        assert_eq!(items(due), vec![2]);
        assert!(q.is_empty());
    }

    #[test]
    fn filler_is_written_only_within_its_allowance_and_where_it_helps() {
        let t = tempfile::tempdir().unwrap();
        let f = File::create(t.path().join("f")).unwrap();
        let disks = Arc::new(Mutex::new(vec![0]));
        let mib = 1 << 20;
        // W = 3 MiB, 2 MiB per drain: not even the oldest block would
        // become due, so nothing is written, and it says why.
        let settings = FlashSettings::new(Some(3 * mib), Some(2 * mib));
        let mut q = queue(settings.clone(), &f, &disks);
        push(&mut q, &f, mib, 'a');
        let (wrote, why) = q.fill(t.path());
        assert_eq!(wrote, 0);
        assert!(why.unwrap().contains("were allowed"));
        assert_eq!(settings.filler_written(), 0);
        assert_eq!(q.take_oldest().map(|(c, _)| c), Some('a'));

        // 3 MiB per drain: the whole shortfall is written (the test's
        // counters stand for the device's: moved by hand), then removed.
        let settings = FlashSettings::new(Some(3 * mib), None);
        let mut q = queue(settings.clone(), &f, &disks);
        push(&mut q, &f, mib, 'b');
        assert_eq!(q.fill(t.path()), (3 * mib, None));
        assert_eq!(settings.filler_written(), 3 * mib);
        let left: Vec<_> = std::fs::read_dir(t.path()).unwrap().collect();
        assert_eq!(
            left.len(),
            1,
            "only the test's own file: the filler is gone"
        );
        *disks.lock().unwrap() = vec![3 * mib];
        assert_eq!(items(q.take_due().unwrap()), vec!['b']);
        assert_eq!(q.fill(t.path()), (0, None), "nothing waiting, no filler");
        // In all a stream may write 4× what it queued: 4 MiB, 3 spent.
        assert_eq!(q.filler_left(), mib);
        push(&mut q, &f, 4096, 'c');
        let (wrote, why) = q.fill(t.path());
        assert_eq!(wrote, 0, "1 MiB + 16 KiB allowed, 3 MiB needed");
        assert!(why.is_some());

        // The user's own copy: --max-filler per drain, however little it
        // received (4 KiB here).
        let local = FlashSettings::new(Some(3 * mib), None).for_local_sender();
        let mut q = queue(local.clone(), &f, &disks);
        push(&mut q, &f, 4096, 'd');
        assert_eq!(q.fill(t.path()), (3 * mib, None));
        assert_eq!(local.filler_written(), 3 * mib);
        assert_eq!(q.filler_left(), 3 * mib, "again at the next drain");
        // Two drains, then only the server's 4× its data: 16 KiB.
        q.filler_spent += 3 * mib;
        assert_eq!(q.filler_left(), 16 << 10);
    }

    #[test]
    fn a_drain_waits_for_other_writers_within_its_patience() {
        let t0 = std::time::Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mib = 1u64 << 20;
        // Others write 1 MiB every 20 ms (50 MiB/s): wait.
        let mut d = DrainWait::new(t0);
        assert!(!d.fill_now(Some(0), false, ms(0)), "no rate seen yet");
        assert!(!d.fill_now(Some(mib), false, ms(20)));
        assert!(!d.fill_now(Some(2 * mib), false, ms(40)));
        // They slow to 10 MiB/s: fill now.
        assert!(d.fill_now(Some(2 * mib + mib / 5), false, ms(60)));
        // Another stream still sends: wait, even with the device idle.
        let mut d = DrainWait::new(t0);
        assert!(!d.fill_now(Some(0), true, ms(0)));
        assert!(!d.fill_now(Some(0), true, ms(500)));
        // It stopped: a rate is seen afresh before filling.
        assert!(!d.fill_now(Some(0), false, ms(520)));
        assert!(d.fill_now(Some(0), false, ms(540)));
        // However fast they write, not past the patience.
        let mut d = DrainWait::new(t0);
        let mut at = 0;
        while at < DRAIN_PATIENCE.as_millis() as u64 {
            assert!(!d.fill_now(Some(at * mib), at % 40 == 0, ms(at)), "{at} ms");
            at += 20;
        }
        assert!(d.fill_now(Some(at * mib), true, ms(at)));
        // A counter that cannot be read: fill at once, unless another
        // stream still sends.
        assert!(DrainWait::new(t0).fill_now(None, false, t0));
        assert!(!DrainWait::new(t0).fill_now(None, true, t0));
    }

    #[test]
    fn a_stream_counts_as_active_once_and_leaves_when_dropped() {
        let s = FlashSettings::default();
        let mut a = s.active();
        let mut b = s.active();
        a.set(true);
        a.set(true);
        assert!(!a.others() && b.others());
        b.set(true);
        assert!(a.others() && b.others());
        drop(b);
        assert!(!a.others());
        a.set(false);
        assert!(!s.active().others());
    }

    #[test]
    fn the_default_window_is_a_thousandth_of_the_device_capped() {
        let t = tempfile::tempdir().unwrap();
        let f = File::create(t.path().join("f")).unwrap();
        let w = Window::for_file(&f, &FlashSettings::default()).unwrap();
        match &w.counter {
            Some(c) => {
                let share = (c.capacity() as f64 * DEFAULT_SHARE) as u64;
                assert_eq!(w.bytes, share.min(MAX_DEFAULT_WINDOW));
                assert!(w.statement().contains("0.1% of"), "{}", w.statement());
            }
            None => {
                // Without a device counter no block is ever queued.
                assert!(w.statement().contains("no write-cache window"));
                let mut q = DeferredQueue::new(FlashSettings::default());
                let (item, why, _) = q.push(&f, 4096, 7).unwrap_err();
                assert_eq!((item, why.contains("sysfs")), (7, true));
            }
        }
        let given = FlashSettings::new(Some(5 << 20), None);
        let w = Window::for_file(&f, &given).unwrap();
        assert!(w.counter.is_none() || w.bytes == 5 << 20);
    }
}

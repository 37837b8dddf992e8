//! `--verify flash` (Kim et al., Sections IV–V): a written block is
//! re-read from the device only after the device's write cache has turned
//! over, so that the read reaches the flash media and not the SSD's DRAM
//! buffer, which still holds the good copy right after the write.
//!
//! - [`Window`]: W, the device's write-cache window in bytes
//!   (`--device-cache`, by default 0.1% of the device's capacity as Kim et
//!   al. assume, capped at [`MAX_DEFAULT_WINDOW`]), and how bytes written
//!   after a block are counted: the device's own counter of sectors
//!   written (every writer's traffic, which is what turns the buffer over)
//!   or, where the file system has no block device in sysfs, intact's own
//!   flushed writes.
//! - [`DeferredQueue`]: the blocks written and flushed but not yet due,
//!   in write order, each with the position at which it becomes due. It
//!   holds digests and positions, never data, and is bounded
//!   ([`MAX_DEFERRED`]): past the bound the oldest is re-read at once and
//!   counts at level `device`.
//! - [`write_filler`]: when the transfer waits for results (the sender's
//!   Waiting, or no new block for [`IDLE_DRAIN`]), the blocks not yet due
//!   are pushed past the window by writing a scratch file on the same file
//!   system (fsynced, then removed): at most `--max-filler` bytes (default
//!   W) per drain, and per receiving stream in all at most that plus twice
//!   the bytes it wrote, so that a sender (hostile, or one of many tiny
//!   files) cannot make the device write much more than it sent. Blocks
//!   the filler allowed could not push past the window are re-read at once
//!   and reported at level `device` with the reason. `media` is never
//!   claimed for a block whose window has not passed.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
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

/// The window where the device's capacity is unknown (no block device in
/// sysfs; such a file system has no device to re-read anyway).
pub const UNKNOWN_DEVICE_WINDOW: u64 = 64 << 20;

/// Blocks waiting for their window per receiving stream at most; past it
/// the oldest is re-read at once (level `device`).
pub const MAX_DEFERRED: usize = 1 << 16;

/// A stream with blocks waiting and nothing new written for this long
/// drains its queue with filler: the sender is waiting for results.
pub const IDLE_DRAIN: Duration = Duration::from_secs(2);

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
    /// blocks past the window (and in all, this plus twice the bytes it
    /// wrote); None: W.
    pub max_filler: Option<u64>,
    filler_written: Arc<AtomicU64>,
}

impl FlashSettings {
    /// Settings with window `device_cache` and filler budget `max_filler`
    /// (None: their defaults).
    pub fn new(device_cache: Option<u64>, max_filler: Option<u64>) -> FlashSettings {
        FlashSettings {
            device_cache,
            max_filler,
            filler_written: Arc::default(),
        }
    }

    /// Filler bytes written so far by every receiver sharing these settings.
    pub fn filler_written(&self) -> u64 {
        self.filler_written.load(Ordering::Relaxed)
    }
}

/// The write-cache window of one device, and its count of bytes written.
#[derive(Debug)]
pub(crate) struct Window {
    /// W, in bytes.
    pub bytes: u64,
    /// Where W came from.
    what: String,
    counter: Option<DeviceCounter>,
    /// intact's own flushed writes (where there is no device counter).
    own: u64,
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
            (None, None) => (
                UNKNOWN_DEVICE_WINDOW,
                "the device's capacity is unknown here".to_string(),
            ),
        };
        Ok(Window {
            bytes,
            what,
            counter,
            own: 0,
        })
    }

    /// Bytes written so far by the count this window uses.
    pub fn position(&self) -> std::io::Result<u64> {
        match &self.counter {
            Some(c) => Ok(c.bytes_written()?),
            None => Ok(self.own),
        }
    }

    /// intact wrote and flushed `n` bytes on this device.
    pub fn wrote(&mut self, n: u64) {
        self.own += n;
    }

    /// W, where it came from, and how bytes after a block are counted, for
    /// reports.
    pub fn statement(&self) -> String {
        let counted = match &self.counter {
            Some(c) => format!(
                "counted by {}'s own sectors-written counter (/sys/block/{}/stat, every writer's traffic)",
                c.name(),
                c.name()
            ),
            None => "counted by intact's own flushed writes (no block device counter here)".into(),
        };
        format!(
            "write-cache window W = {} ({}), {counted}",
            human_bytes(self.bytes),
            self.what
        )
    }
}

/// A block waiting for its window.
struct Waiting<T> {
    dev: u64,
    due: u64,
    item: T,
}

/// The blocks written but not yet due, in write order, with the windows of
/// their devices.
pub(crate) struct DeferredQueue<T> {
    waiting: VecDeque<Waiting<T>>,
    /// Per device: its number, its window, and the window's statement.
    windows: Vec<(u64, Window, Arc<str>)>,
    settings: FlashSettings,
    /// Filler this queue has written.
    filler_spent: u64,
    /// Bytes of blocks queued so far.
    queued: u64,
}

impl<T> DeferredQueue<T> {
    pub fn new(settings: FlashSettings) -> DeferredQueue<T> {
        DeferredQueue {
            waiting: VecDeque::new(),
            windows: Vec::new(),
            settings,
            filler_spent: 0,
            queued: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// The window of `file`'s device, made on first use.
    pub fn window(&mut self, file: &File) -> std::io::Result<&mut Window> {
        let dev = file.metadata()?.dev();
        if let Some(i) = self.windows.iter().position(|(d, _, _)| *d == dev) {
            return Ok(&mut self.windows[i].1);
        }
        let w = Window::for_file(file, &self.settings)?;
        let statement = w.statement().into();
        self.windows.push((dev, w, statement));
        Ok(&mut self.windows.last_mut().expect("just pushed").1)
    }

    /// Queues `item`, written and flushed to the device of `file` (of
    /// `len` bytes): it is due once W more bytes are written after now.
    /// Gives the item back where the device's counter cannot be read.
    pub fn push(&mut self, file: &File, len: u64, item: T) -> Result<(), (T, std::io::Error)> {
        let placed = file.metadata().and_then(|m| {
            let w = self.window(file)?;
            w.wrote(len);
            Ok((m.dev(), w.position()?.saturating_add(w.bytes)))
        });
        match placed {
            Ok((dev, due)) => {
                self.queued += len;
                self.waiting.push_back(Waiting { dev, due, item });
                Ok(())
            }
            Err(e) => Err((item, e)),
        }
    }

    /// The statement of the window `w` waits for.
    fn statement_of(&self, w: &Waiting<T>) -> Arc<str> {
        self.windows
            .iter()
            .find(|(d, _, _)| *d == w.dev)
            .map_or_else(|| Arc::from(""), |(_, _, s)| Arc::clone(s))
    }

    /// The blocks due now, oldest first, at most `limit` of them, each
    /// with its window's statement.
    pub fn take_due(&mut self, limit: usize) -> std::io::Result<Vec<(T, Arc<str>)>> {
        let mut positions = Vec::with_capacity(self.windows.len());
        for (dev, w, _) in &self.windows {
            positions.push((*dev, w.position()?));
        }
        let now = |dev: u64| {
            positions
                .iter()
                .find(|(d, _)| *d == dev)
                .map_or(0, |(_, p)| *p)
        };
        let mut due = Vec::new();
        let mut keep = VecDeque::with_capacity(self.waiting.len());
        let waiting = std::mem::take(&mut self.waiting);
        for w in waiting {
            if due.len() < limit && now(w.dev) >= w.due {
                let s = self.statement_of(&w);
                due.push((w.item, s));
            } else {
                keep.push_back(w);
            }
        }
        self.waiting = keep;
        Ok(due)
    }

    /// The oldest block, taken before its window passed (the queue is
    /// over its bound, or is being drained), with its window's statement.
    pub fn take_oldest(&mut self) -> Option<(T, Arc<str>)> {
        let w = self.waiting.pop_front()?;
        let s = self.statement_of(&w);
        Some((w.item, s))
    }

    /// Bytes still to be written on each device for every waiting block to
    /// be due, the largest over the devices with waiting blocks, and the
    /// device's window.
    fn shortfall(&self) -> std::io::Result<u64> {
        let mut most = 0;
        for (dev, w, _) in &self.windows {
            let Some(last) = self
                .waiting
                .iter()
                .filter(|x| x.dev == *dev)
                .map(|x| x.due)
                .max()
            else {
                continue;
            };
            most = most.max(last.saturating_sub(w.position()?));
        }
        Ok(most)
    }

    /// `--max-filler`, or W.
    fn max_filler(&self) -> u64 {
        self.settings.max_filler.unwrap_or_else(|| {
            self.windows
                .iter()
                .map(|(_, w, _)| w.bytes)
                .max()
                .unwrap_or(0)
        })
    }

    /// The filler the next drain may write: `--max-filler`, within what
    /// is left of this stream's whole allowance (`--max-filler` plus twice
    /// the bytes queued).
    pub fn filler_left(&self) -> u64 {
        let max = self.max_filler();
        let all = max.saturating_add(self.queued.saturating_mul(2));
        all.saturating_sub(self.filler_spent).min(max)
    }

    /// Pushes the waiting blocks past their window with filler written in
    /// `dir` (on their file system), within the budget left. Returns the
    /// filler written and, where the budget or the file system fell short,
    /// why.
    pub fn fill(&mut self, dir: &Path) -> (u64, Option<String>) {
        // One stream fills at a time, in the whole process: another
        // stream's filler moves the same device counter.
        static FILLING: Mutex<()> = Mutex::new(());
        let _one = FILLING.lock().unwrap_or_else(|e| e.into_inner());
        let need = match self.shortfall() {
            Ok(n) => n,
            Err(e) => {
                return (
                    0,
                    Some(format!("the device's counter could not be read: {e}")),
                )
            }
        };
        if need == 0 {
            return (0, None);
        }
        let left = self.filler_left();
        let want = need.min(left);
        let (wrote, err) = if want > 0 {
            match write_filler(dir, want) {
                Ok(n) => (n, None),
                Err((n, e)) => (n, Some(e)),
            }
        } else {
            (0, None)
        };
        self.filler_spent += wrote;
        self.settings
            .filler_written
            .fetch_add(wrote, Ordering::Relaxed);
        for (_, w, _) in &mut self.windows {
            w.wrote(wrote);
        }
        let why = match err {
            Some(e) => Some(format!("writing filler failed after {}: {e}", human_bytes(wrote))),
            None if want < need => Some(format!(
                "{} of filler were needed; {} were allowed (--max-filler {} per drain, and per stream in all that plus twice the {} it wrote; {} written before)",
                human_bytes(need),
                human_bytes(left),
                human_bytes(self.max_filler()),
                human_bytes(self.queued),
                human_bytes(self.filler_spent - wrote),
            )),
            None => None,
        };
        (wrote, why)
    }
}

/// Writes `bytes` of filler to a new scratch file in `dir` (distinct
/// bytes in each chunk, so that no device can deduplicate or compress it
/// away), fsyncs it and removes it. Returns the bytes written, or those
/// and why it stopped short.
pub(crate) fn write_filler(dir: &Path, bytes: u64) -> Result<u64, (u64, String)> {
    let path = dir.join(format!(
        ".intact-flash-filler-{}-{:x}",
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

    fn on_tmp() -> (tempfile::TempDir, File) {
        let t = tempfile::tempdir().unwrap();
        let f = File::create(t.path().join("f")).unwrap();
        (t, f)
    }

    #[test]
    fn a_block_is_due_only_after_w_more_bytes_are_counted() {
        let (t, f) = on_tmp();
        let settings = FlashSettings {
            device_cache: Some(10 << 20),
            max_filler: Some(0),
            ..FlashSettings::default()
        };
        let mut q = DeferredQueue::new(settings);
        // Count by intact's own writes, whatever device the test dir is on,
        // so the test decides what is written.
        q.window(&f).unwrap().counter = None;
        q.push(&f, 4096, 1u32).map_err(|(_, e)| e).unwrap();
        q.push(&f, 4096, 2u32).map_err(|(_, e)| e).unwrap();
        assert!(q.take_due(10).unwrap().is_empty());
        q.window(&f).unwrap().wrote((10 << 20) - 4096 - 1);
        assert!(q.take_due(10).unwrap().is_empty(), "one byte short");
        q.window(&f).unwrap().wrote(1);
        assert_eq!(items(q.take_due(10).unwrap()), vec![1]);
        q.window(&f).unwrap().wrote(4096);
        assert_eq!(items(q.take_due(10).unwrap()), vec![2]);
        assert!(q.is_empty());
        drop(t);
    }

    #[test]
    fn filler_pushes_waiting_blocks_past_the_window_within_its_budget() {
        let (t, f) = on_tmp();
        let settings = FlashSettings {
            device_cache: Some(3 << 20),
            max_filler: Some(2 << 20),
            ..FlashSettings::default()
        };
        let mut q = DeferredQueue::new(settings.clone());
        q.window(&f).unwrap().counter = None;
        q.push(&f, 1 << 20, 'a').map_err(|(_, e)| e).unwrap();
        // 3 MiB are needed, 2 MiB allowed: short, and says why.
        let (wrote, why) = q.fill(t.path());
        assert_eq!(wrote, 2 << 20);
        assert!(why.unwrap().contains("--max-filler"));
        assert!(q.take_due(10).unwrap().is_empty());
        assert_eq!(settings.filler_written(), 2 << 20);
        // The scratch file is gone.
        let left: Vec<_> = std::fs::read_dir(t.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "only the test's own file");
        // In all, a stream may write --max-filler plus twice what it
        // queued: 2 + 2 × 1 MiB, so 2 MiB are left, 1 MiB needed.
        assert_eq!(q.filler_left(), 2 << 20);
        assert_eq!(q.fill(t.path()), (1 << 20, None));
        assert_eq!(items(q.take_due(10).unwrap()), vec!['a']);
        assert_eq!(q.filler_left(), 1 << 20, "4 MiB allowed, 3 MiB spent");
        q.push(&f, 1 << 20, 'c').map_err(|(_, e)| e).unwrap();
        // 3 MiB needed, 2 MiB allowed now (6 in all, 3 spent, 2 per drain).
        let (wrote, why) = q.fill(t.path());
        assert_eq!(wrote, 2 << 20);
        assert!(why.unwrap().contains("were allowed"));
        assert_eq!(q.take_oldest().map(|(c, _)| c), Some('c'));

        // A budget that covers it makes the block due.
        let settings = FlashSettings {
            device_cache: Some(3 << 20),
            ..FlashSettings::default()
        };
        let mut q = DeferredQueue::new(settings);
        q.window(&f).unwrap().counter = None;
        q.push(&f, 1 << 20, 'b').map_err(|(_, e)| e).unwrap();
        assert_eq!(q.fill(t.path()), (3 << 20, None));
        let due = q.take_due(10).unwrap();
        assert!(
            due[0].1.contains("W = 3.0 MiB (--device-cache)"),
            "{}",
            due[0].1
        );
        assert_eq!(items(due), vec!['b']);
        // Nothing waiting: no filler.
        assert_eq!(q.fill(t.path()), (0, None));
    }

    #[test]
    fn the_default_window_is_a_thousandth_of_the_device_capped() {
        let (_t, f) = on_tmp();
        let w = Window::for_file(&f, &FlashSettings::default()).unwrap();
        match &w.counter {
            Some(c) => {
                let share = (c.capacity() as f64 * DEFAULT_SHARE) as u64;
                assert_eq!(w.bytes, share.min(MAX_DEFAULT_WINDOW));
                assert!(w.statement().contains("0.1% of"), "{}", w.statement());
            }
            None => assert_eq!(w.bytes, UNKNOWN_DEVICE_WINDOW),
        }
        let given = FlashSettings {
            device_cache: Some(5 << 20),
            ..FlashSettings::default()
        };
        let w = Window::for_file(&f, &given).unwrap();
        assert_eq!(w.bytes, 5 << 20);
        assert!(w.statement().contains("--device-cache"));
    }
}

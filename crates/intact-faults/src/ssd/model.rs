//! The emulated SSD's behaviour, without FUSE: a write buffer of 4 KiB
//! pages in front of a NAND store (a sparse file), and the two faults of
//! Kim et al.'s Table 2 that lie below the host.
//!
//! - A write goes to the buffer (read-modify-write for a partial page);
//!   the buffer holds at most `capacity` pages, and when a write needs
//!   room the page written longest ago leaves it, programmed to NAND
//!   first if it is dirty.
//! - A flush programs every dirty page and keeps it buffered, clean.
//! - A read is served from the buffer when it holds the page, else from
//!   NAND: so a re-read right after a write or a flush sees the buffer,
//!   and only a read after the buffer has turned over sees NAND.
//!
//! Faults are armed by a page's content (its XXH3-64), so a test names
//! the page of a file it is about to write without knowing where the file
//! system will put it:
//! - [`SsdLayer::Buffer`]: the buffered copy is corrupted as the page is
//!   written (every later read sees it, and NAND gets it too);
//! - [`SsdLayer::Media`]: the copy programmed to NAND is corrupted, while
//!   the buffer keeps the good copy until the page leaves it.
//!
//! Every injection and every program of a corrupted page is logged with
//! the device page and the time: a test's ground truth comes from this
//! log and the NAND file, never from the tool under test.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

/// The emulator's page (and the flash page of its model), in bytes.
pub const SSD_PAGE: usize = 4096;

/// Which copy a fault corrupts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SsdLayer {
    /// The copy in the device's write buffer (DRAM).
    Buffer,
    /// The copy programmed to the flash media.
    Media,
}

/// One thing the emulator did to a page a fault named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SsdEvent {
    /// Since the emulator started.
    pub at: Duration,
    /// The page's index on the device (byte offset / [`SSD_PAGE`]).
    pub page: u64,
    /// The layer of the fault.
    pub layer: SsdLayer,
    /// What happened: "buffered copy corrupted", "programmed corrupted to
    /// NAND", "left the buffer", and each host read of the page: "read
    /// from the buffer" or, once it left, "read from NAND".
    pub what: &'static str,
}

/// Counters of everything the emulator did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SsdStats {
    /// Pages written by the host (a partial page counts once).
    pub pages_written: u64,
    /// Pages programmed to NAND (at a flush or when leaving the buffer).
    pub pages_programmed: u64,
    /// Pages that left the buffer to make room.
    pub pages_evicted: u64,
    /// Page reads served by the buffer.
    pub read_hits: u64,
    /// Page reads served by NAND.
    pub read_misses: u64,
    /// Flushes asked for.
    pub flushes: u64,
}

struct Armed {
    layer: SsdLayer,
    content: u64,
}

struct Buffered {
    data: Box<[u8]>,
    dirty: bool,
    seq: u64,
}

/// The emulated SSD's state.
pub struct SsdModel {
    nand: File,
    size: u64,
    capacity: usize,
    pages: HashMap<u64, Buffered>,
    /// Write order of the buffered pages: sequence number → page.
    order: BTreeMap<u64, u64>,
    seq: u64,
    armed: Vec<Armed>,
    /// Pages whose next program to NAND is corrupted (a media fault), with
    /// the content the fault named.
    program_corrupt: HashMap<u64, u64>,
    /// Pages a fault named, to log when they leave the buffer.
    named: HashMap<u64, SsdLayer>,
    /// Pages a fault named that left the buffer (read from NAND since).
    gone: HashMap<u64, SsdLayer>,
    log: Vec<SsdEvent>,
    stats: SsdStats,
    start: Instant,
}

/// The byte a fault changes in a page, and how (one bit).
const FLIP_AT: usize = 100;

impl SsdModel {
    /// A device of `size` bytes (a multiple of [`SSD_PAGE`]) whose NAND is
    /// `nand` (made `size` bytes long, sparse) and whose write buffer holds
    /// `buffer` bytes (at least one page).
    pub fn new(nand: File, size: u64, buffer: u64) -> io::Result<SsdModel> {
        if size == 0 || !size.is_multiple_of(SSD_PAGE as u64) {
            return Err(io::Error::other("the device's size must be whole pages"));
        }
        nand.set_len(size)?;
        Ok(SsdModel {
            nand,
            size,
            capacity: (buffer / SSD_PAGE as u64).max(1) as usize,
            pages: HashMap::new(),
            order: BTreeMap::new(),
            seq: 0,
            armed: Vec::new(),
            program_corrupt: HashMap::new(),
            named: HashMap::new(),
            gone: HashMap::new(),
            log: Vec::new(),
            stats: SsdStats::default(),
            start: Instant::now(),
        })
    }

    /// The device's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The write buffer's size in bytes.
    pub fn buffer_bytes(&self) -> u64 {
        (self.capacity * SSD_PAGE) as u64
    }

    /// Corrupts `layer` for the next page written whose whole content
    /// equals `page` (one page; each arm fires once).
    pub fn arm(&mut self, layer: SsdLayer, page: &[u8]) {
        self.armed.push(Armed {
            layer,
            content: xxhash_rust::xxh3::xxh3_64(page),
        });
    }

    /// Faults armed that have not fired.
    pub fn armed(&self) -> usize {
        self.armed.len()
    }

    /// Everything done to the pages faults named, in order.
    pub fn log(&self) -> &[SsdEvent] {
        &self.log
    }

    /// The counters.
    pub fn stats(&self) -> SsdStats {
        self.stats
    }

    /// Whether the buffer holds device page `page`.
    pub fn buffered(&self, page: u64) -> bool {
        self.pages.contains_key(&page)
    }

    /// What NAND holds of `len` bytes at `offset` (ground truth below the
    /// buffer).
    pub fn nand_bytes(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut out = vec![0; len];
        self.nand.read_exact_at(&mut out, offset)?;
        Ok(out)
    }

    fn check(&self, offset: u64, len: usize) -> io::Result<()> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(io::Error::from_raw_os_error(libc::ENOSPC)),
        }
    }

    /// Reads `len` bytes at `offset` as the host sees them.
    pub fn read(&mut self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        self.read_logged(offset, len, true)
    }

    /// [`SsdModel::read`]; `log`: record reads of the pages faults named
    /// (not for the device's own read-modify-write).
    fn read_logged(&mut self, offset: u64, len: usize, log: bool) -> io::Result<Vec<u8>> {
        let len = len.min(self.size.saturating_sub(offset) as usize);
        let mut out = vec![0; len];
        let mut done = 0;
        while done < len {
            let at = offset + done as u64;
            let page = at / SSD_PAGE as u64;
            let within = (at % SSD_PAGE as u64) as usize;
            let n = (SSD_PAGE - within).min(len - done);
            match self.pages.get(&page) {
                Some(b) => {
                    self.stats.read_hits += 1;
                    out[done..done + n].copy_from_slice(&b.data[within..within + n]);
                    if let Some(&layer) = self.named.get(&page).filter(|_| log) {
                        self.event(page, layer, "read from the buffer");
                    }
                }
                None => {
                    self.stats.read_misses += 1;
                    self.nand.read_exact_at(&mut out[done..done + n], at)?;
                    if let Some(&layer) = self.gone.get(&page).filter(|_| log) {
                        self.event(page, layer, "read from NAND");
                    }
                }
            }
            done += n;
        }
        Ok(out)
    }

    /// Writes `data` at `offset` into the buffer.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.check(offset, data.len())?;
        let mut done = 0;
        while done < data.len() {
            let at = offset + done as u64;
            let page = at / SSD_PAGE as u64;
            let within = (at % SSD_PAGE as u64) as usize;
            let n = (SSD_PAGE - within).min(data.len() - done);
            let mut content = if n == SSD_PAGE {
                vec![0; SSD_PAGE].into_boxed_slice()
            } else {
                self.read_logged(page * SSD_PAGE as u64, SSD_PAGE, false)?
                    .into_boxed_slice()
            };
            content[within..within + n].copy_from_slice(&data[done..done + n]);
            self.put(page, content)?;
            done += n;
        }
        Ok(())
    }

    fn put(&mut self, page: u64, mut content: Box<[u8]>) -> io::Result<()> {
        self.stats.pages_written += 1;
        self.gone.remove(&page);
        let hash = xxhash_rust::xxh3::xxh3_64(&content);
        // A page overwritten before its media fault was programmed: the
        // content the fault named never reaches NAND here, so the fault
        // waits for that content again.
        if let Some(named) = self.program_corrupt.remove(&page) {
            self.named.remove(&page);
            self.armed.push(Armed {
                layer: SsdLayer::Media,
                content: named,
            });
        }
        // New content: whatever a fault did to the old copy no longer
        // concerns what is read from this page (a fault may name it again).
        self.named.remove(&page);
        if let Some(i) = self.armed.iter().position(|a| a.content == hash) {
            let layer = self.armed.remove(i).layer;
            self.named.insert(page, layer);
            match layer {
                SsdLayer::Buffer => {
                    content[FLIP_AT] ^= 1;
                    self.event(page, layer, "buffered copy corrupted");
                }
                SsdLayer::Media => {
                    self.program_corrupt.insert(page, hash);
                }
            }
        }
        self.seq += 1;
        let seq = self.seq;
        if let Some(old) = self.pages.insert(
            page,
            Buffered {
                data: content,
                dirty: true,
                seq,
            },
        ) {
            self.order.remove(&old.seq);
        }
        self.order.insert(seq, page);
        while self.pages.len() > self.capacity {
            let (&seq, &oldest) = self.order.first_key_value().expect("as many as pages");
            // Programmed before it leaves: a failed program keeps it
            // buffered (and dirty), nothing lost.
            let b = &self.pages[&oldest];
            if b.dirty {
                let data = b.data.clone();
                self.program(oldest, &data)?;
            }
            self.order.remove(&seq);
            self.pages.remove(&oldest);
            self.stats.pages_evicted += 1;
            if let Some(layer) = self.named.remove(&oldest) {
                self.event(oldest, layer, "left the buffer");
                self.gone.insert(oldest, layer);
            }
        }
        Ok(())
    }

    fn program(&mut self, page: u64, data: &[u8]) -> io::Result<()> {
        self.stats.pages_programmed += 1;
        let at = page * SSD_PAGE as u64;
        if self.program_corrupt.contains_key(&page) {
            let mut bad = data.to_vec();
            bad[FLIP_AT] ^= 1;
            self.nand.write_all_at(&bad, at)?;
            self.program_corrupt.remove(&page);
            self.event(page, SsdLayer::Media, "programmed corrupted to NAND");
            return Ok(());
        }
        self.nand.write_all_at(data, at)
    }

    /// Programs every dirty page to NAND; they stay buffered, clean.
    pub fn flush(&mut self) -> io::Result<()> {
        self.stats.flushes += 1;
        let dirty: Vec<u64> = self
            .order
            .values()
            .copied()
            .filter(|p| self.pages[p].dirty)
            .collect();
        for page in dirty {
            let data = std::mem::take(&mut self.pages.get_mut(&page).expect("listed").data);
            let r = self.program(page, &data);
            let b = self.pages.get_mut(&page).expect("listed");
            b.data = data;
            r?;
            b.dirty = false;
        }
        Ok(())
    }

    fn event(&mut self, page: u64, layer: SsdLayer, what: &'static str) {
        self.log.push(SsdEvent {
            at: self.start.elapsed(),
            page,
            layer,
            what,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(pages: u64, buffer_pages: u64) -> (tempfile::TempDir, SsdModel) {
        let dir = tempfile::tempdir().unwrap();
        let nand = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("nand"))
            .unwrap();
        let m = SsdModel::new(
            nand,
            pages * SSD_PAGE as u64,
            buffer_pages * SSD_PAGE as u64,
        );
        (dir, m.unwrap())
    }

    fn page_of(v: u8) -> Vec<u8> {
        (0..SSD_PAGE).map(|i| v ^ (i as u8)).collect()
    }

    #[test]
    fn reads_come_from_the_buffer_until_new_writes_push_a_page_out() {
        let (_d, mut m) = model(16, 2);
        m.write(0, &page_of(1)).unwrap();
        m.flush().unwrap();
        assert!(m.buffered(0), "a flush keeps the page buffered");
        assert_eq!(m.nand_bytes(0, SSD_PAGE).unwrap(), page_of(1));
        m.write(4096, &page_of(2)).unwrap();
        assert!(m.buffered(0));
        m.write(8192, &page_of(3)).unwrap();
        assert!(!m.buffered(0), "the oldest page left for the third");
        assert_eq!(m.read(0, SSD_PAGE).unwrap(), page_of(1));
        assert_eq!(m.stats().read_misses, 1);
        // Page 1 was dirty when it left: programmed then.
        m.write(12288, &page_of(4)).unwrap();
        assert_eq!(m.nand_bytes(4096, SSD_PAGE).unwrap(), page_of(2));
    }

    #[test]
    fn a_media_fault_shows_only_after_the_buffer_turned_over() {
        let (_d, mut m) = model(16, 2);
        m.arm(SsdLayer::Media, &page_of(7));
        m.write(4096, &page_of(7)).unwrap();
        m.flush().unwrap();
        assert_eq!(
            m.read(4096, SSD_PAGE).unwrap(),
            page_of(7),
            "the buffer's good copy"
        );
        let nand = m.nand_bytes(4096, SSD_PAGE).unwrap();
        assert_ne!(nand, page_of(7), "NAND holds the corrupted program");
        assert_eq!(nand[FLIP_AT] ^ 1, page_of(7)[FLIP_AT]);
        m.write(0, &page_of(1)).unwrap();
        m.write(8192, &page_of(2)).unwrap();
        assert_eq!(m.read(4096, SSD_PAGE).unwrap(), nand, "after the turnover");
        let what: Vec<_> = m.log().iter().map(|e| (e.page, e.what)).collect();
        assert_eq!(
            what,
            [
                (1, "programmed corrupted to NAND"),
                (1, "read from the buffer"),
                (1, "left the buffer"),
                (1, "read from NAND")
            ]
        );
        assert_eq!(m.armed(), 0);
    }

    #[test]
    fn a_media_fault_overwritten_before_its_program_waits_for_its_content() {
        let (_d, mut m) = model(16, 4);
        m.arm(SsdLayer::Media, &page_of(7));
        m.write(0, &page_of(7)).unwrap();
        m.write(0, &page_of(8)).unwrap();
        assert_eq!(m.armed(), 1, "waiting again");
        m.flush().unwrap();
        assert_eq!(
            m.nand_bytes(0, SSD_PAGE).unwrap(),
            page_of(8),
            "not corrupted"
        );
        m.write(4096, &page_of(7)).unwrap();
        m.flush().unwrap();
        assert_ne!(m.nand_bytes(4096, SSD_PAGE).unwrap(), page_of(7));
        assert_eq!(m.armed(), 0);
    }

    #[test]
    fn a_buffer_fault_shows_at_once_and_reaches_nand() {
        let (_d, mut m) = model(16, 4);
        m.arm(SsdLayer::Buffer, &page_of(9));
        m.write(0, &page_of(8)).unwrap();
        assert_eq!(m.armed(), 1, "another page's content does not fire it");
        m.write(8192, &page_of(9)).unwrap();
        let seen = m.read(8192, SSD_PAGE).unwrap();
        assert_ne!(seen, page_of(9));
        m.flush().unwrap();
        assert_eq!(m.nand_bytes(8192, SSD_PAGE).unwrap(), seen);
        assert_eq!(m.log()[0].what, "buffered copy corrupted");
    }

    #[test]
    fn partial_writes_merge_and_bounds_are_kept() {
        let (_d, mut m) = model(4, 1);
        m.write(0, &page_of(1)).unwrap();
        m.write(4096, &page_of(2)).unwrap(); // page 0 programmed, left
        m.write(10, b"hello").unwrap(); // read-modify-write from NAND
        let mut want = page_of(1);
        want[10..15].copy_from_slice(b"hello");
        assert_eq!(m.read(0, SSD_PAGE).unwrap(), want);
        let across = m.read(4090, 12).unwrap();
        assert_eq!(&across[..6], &want[4090..]);
        assert_eq!(&across[6..], &page_of(2)[..6]);
        assert!(m.write(4 * 4096 - 2, b"abc").is_err(), "past the end");
        assert_eq!(
            m.read(4 * 4096 - 2, 10).unwrap().len(),
            2,
            "short at the end"
        );
    }
}

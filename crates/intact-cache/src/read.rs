//! Verification reads that reach the device, and say whether they did.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::str::FromStr;
use std::time::{Duration, Instant};

use crate::{backing, evict, Backing, CacheError, PAGE};

/// How a verification read reaches the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReadPath {
    /// Flush and evict the range (confirmed by [`crate::resident`]), then a buffered
    /// read, which must fetch every page from the device. Works on every
    /// local file system and proves itself page by page.
    #[default]
    Evict,
    /// `O_DIRECT`: the read bypasses the page cache. Falls back to
    /// [`ReadPath::Evict`] where the file system refuses it.
    Direct,
    /// A plain read, served by the cache when it can be: only for the
    /// modes that do not claim the device.
    Cached,
}

impl ReadPath {
    /// Name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            ReadPath::Evict => "evict",
            ReadPath::Direct => "direct",
            ReadPath::Cached => "cached",
        }
    }
}

impl fmt::Display for ReadPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReadPath {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [ReadPath::Evict, ReadPath::Direct, ReadPath::Cached]
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown read path '{s}' (evict, direct, cached)"))
    }
}

/// What one read did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadOutcome {
    /// Whether every byte came from the device: a device-backed file system
    /// and either `O_DIRECT` or an eviction that left no page resident.
    pub device: bool,
    /// Pages still resident after eviction (before an `O_DIRECT` read:
    /// the pages resident after it, too).
    pub resident: u64,
    /// An `O_DIRECT` read left pages of its range in the page cache: the
    /// file system served it buffered (ext4 with `data=journal` does), so
    /// it proves nothing about the device.
    pub buffered: bool,
    /// Time spent flushing and evicting.
    pub evict_time: Duration,
}

/// Step 2's result, for step 3 of a batched read.
#[derive(Debug, Clone, Copy, Default)]
pub struct Prepared {
    /// Evict path: pages still resident after eviction, and its time.
    evicted: Option<(u64, Duration)>,
    /// Whether the file system has a device under it.
    device: bool,
}

impl Prepared {
    /// Step 3 without the reader, where it needs none: on the evict path
    /// the read is a plain read of pages that, after the eviction, can
    /// only come from the device, so reads of one file may run on several
    /// threads at once. `Err(self)` where the reader itself must read
    /// ([`DeviceReader::finish`]).
    pub fn read(
        self,
        file: &File,
        offset: u64,
        len: usize,
        buf: &mut [u8],
    ) -> Result<std::io::Result<ReadOutcome>, Prepared> {
        let Some((resident, evict_time)) = self.evicted else {
            return Err(self);
        };
        Ok(file
            .read_exact_at(&mut buf[..len], offset)
            .map(|()| ReadOutcome {
                device: self.device && resident == 0,
                resident,
                buffered: false,
                evict_time,
            }))
    }
}

/// Reads ranges of one file by a [`ReadPath`].
#[derive(Debug)]
pub struct DeviceReader {
    path: ReadPath,
    direct: Option<File>,
    backing: Backing,
    fallback: Option<String>,
    /// What [`DeviceReader::prefetch_if_cold`] found of its range: true,
    /// no page cached (and the device asked for it); false, some page
    /// cached.
    cold: Option<(u64, u64, bool)>,
}

impl DeviceReader {
    /// A reader of `file` (open for reading) by `path`. `O_DIRECT` is tried
    /// here; if the file system refuses it the reader uses evict-then-read
    /// and [`DeviceReader::fallback`] says why. On the evict path the
    /// reader turns readahead off on `file`'s open file description.
    ///
    /// Where the file system keeps its data in memory (tmpfs, ramfs:
    /// [`Backing::in_memory`]) there is no device to reach and pages cannot
    /// leave the cache, so eviction would only spend its retries and
    /// back-off: the reader reads plainly there ([`ReadPath::Cached`], which
    /// [`DeviceReader::path`] reports), and no read counts as a device read.
    pub fn new(file: &File, path: ReadPath) -> Result<DeviceReader, CacheError> {
        Self::make(file, path, backing(file)?, true)
    }

    /// As [`DeviceReader::new`], for `file` on the file system whose device
    /// number is `dev` (its `st_dev`): what lies under the file system
    /// comes from [`crate::backing_on`] (asked once per thread and file
    /// system while the answer is kept, not per file). A caller that reads
    /// `file` in `one_range` only (a file of one block) leaves readahead
    /// on, as there is no next range it could pull in before that range is
    /// evicted. Two system calls fewer per small file than `new`.
    pub fn on(
        file: &File,
        dev: u64,
        path: ReadPath,
        one_range: bool,
    ) -> Result<DeviceReader, CacheError> {
        let backing = crate::backing_on(file, dev)?;
        Self::make(file, path, backing, !one_range)
    }

    fn make(
        file: &File,
        path: ReadPath,
        backing: Backing,
        readahead_off: bool,
    ) -> Result<DeviceReader, CacheError> {
        let mut r = DeviceReader {
            path,
            direct: None,
            backing,
            fallback: None,
            cold: None,
        };
        if r.backing.in_memory() {
            r.path = ReadPath::Cached;
            return Ok(r);
        }
        // Second descriptors of the same file (the caller's keeps its own
        // semantics for its writes and transfer reads).
        let proc_path = format!("/proc/self/fd/{}", file.as_raw_fd());
        if path == ReadPath::Direct {
            match OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(&proc_path)
            {
                Ok(f) => r.direct = Some(f),
                Err(e) => r.fall_back(format!("O_DIRECT open refused: {e}")),
            }
        }
        if r.path == ReadPath::Evict && readahead_off {
            // Readahead off: a re-read must not pull in (and pin, while the
            // I/O is in flight) pages of the next range before that range
            // is evicted. This holds for every reader of this open file.
            // SAFETY: plain syscall on a valid fd.
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
        }
        Ok(r)
    }

    fn fall_back(&mut self, why: String) {
        self.path = ReadPath::Evict;
        self.direct = None;
        self.fallback = Some(why);
    }

    /// The path reads really take.
    pub fn path(&self) -> ReadPath {
        self.path
    }

    /// What lies under the file.
    pub fn backing(&self) -> Backing {
        self.backing
    }

    /// Why `O_DIRECT` was asked for but is not used.
    pub fn fallback(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    /// Reads `len` bytes at `offset` of `file` into `buf[..len]`. `buf`
    /// should start on a page and hold `len` rounded up to a page for the
    /// direct path; a read that cannot meet `O_DIRECT`'s alignment (an
    /// unaligned offset, a short buffer) is done by evict-then-read.
    pub fn read(
        &mut self,
        file: &File,
        offset: u64,
        len: usize,
        buf: &mut [u8],
    ) -> std::io::Result<ReadOutcome> {
        let device = self.backing.has_device();
        match self.path {
            ReadPath::Cached => {
                file.read_exact_at(&mut buf[..len], offset)?;
                Ok(ReadOutcome::default())
            }
            ReadPath::Direct if direct_fits(offset, len, buf) => {
                // O_DIRECT proves itself: the range is evicted first (a
                // file system may serve O_DIRECT from cached pages), and no
                // page of it may be in the cache after the read, or the
                // read was buffered (ext4 data=journal does that silently).
                let t = Instant::now();
                let before = match crate::resident(file, offset, len as u64)? {
                    0 => 0,
                    _ => evict(file, offset, len as u64)?.resident,
                };
                let evict_time = t.elapsed();
                match self.read_direct(offset, len, buf) {
                    Ok(()) => {
                        let after = crate::resident(file, offset, len as u64)?;
                        Ok(ReadOutcome {
                            device: device && before == 0 && after == 0,
                            resident: before + after,
                            buffered: after > 0,
                            evict_time,
                        })
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                        self.fall_back(format!("O_DIRECT read refused: {e}"));
                        self.read_evicted(file, offset, len, buf, device)
                    }
                    Err(e) => Err(e),
                }
            }
            ReadPath::Direct | ReadPath::Evict => self.read_evicted(file, offset, len, buf, device),
        }
    }

    /// Batched reads, step 1 of 3: starts writing the range back without
    /// waiting, so that the writes of a batch of small blocks go to the
    /// device together instead of one round trip each.
    pub fn begin(&self, file: &File, offset: u64, len: usize) {
        if self.path == ReadPath::Evict && len > 0 {
            crate::evict::start_writeback(file, offset, len as u64);
        }
    }

    /// Batched reads, step 2 of 3: evicts the range (waiting for its
    /// writeback) and, once [`crate::resident`] confirms it gone, asks the kernel to
    /// read it back from the device in the background.
    pub fn evict_then_prefetch(
        &mut self,
        file: &File,
        offset: u64,
        len: usize,
    ) -> std::io::Result<Prepared> {
        if self.path != ReadPath::Evict {
            return Ok(Prepared::default());
        }
        let t = Instant::now();
        let ev = evict(file, offset, len as u64)?;
        let evict_time = t.elapsed();
        if ev.resident == 0 {
            // Every page that enters the cache from now on comes from the
            // device: only this process writes the file.
            prefetch(file, offset, len as u64);
        }
        Ok(Prepared {
            evicted: Some((ev.resident, evict_time)),
            device: self.backing.has_device(),
        })
    }

    /// As [`DeviceReader::evict_then_prefetch`], but a range of which no
    /// page is cached now is not evicted: it is only asked for from the
    /// device (every page that enters the cache from now on comes from the
    /// device, as after an eviction). Two system calls instead of four for
    /// a cold range, as most are when a scrub comes round to a file.
    pub fn prefetch_cold_or_evict(
        &mut self,
        file: &File,
        offset: u64,
        len: usize,
    ) -> std::io::Result<Prepared> {
        if self.path != ReadPath::Evict {
            return Ok(Prepared::default());
        }
        let t = Instant::now();
        if crate::resident(file, offset, len as u64)? == 0 {
            prefetch(file, offset, len as u64);
            return Ok(Prepared {
                evicted: Some((0, t.elapsed())),
                device: self.backing.has_device(),
            });
        }
        self.evict_then_prefetch(file, offset, len)
    }

    /// Batched reads, step 3 of 3: the read itself, after
    /// [`DeviceReader::evict_then_prefetch`] on the evict path.
    pub fn finish(
        &mut self,
        file: &File,
        offset: u64,
        len: usize,
        buf: &mut [u8],
        prepared: Prepared,
    ) -> std::io::Result<ReadOutcome> {
        match prepared.read(file, offset, len, buf) {
            Ok(read) => read,
            Err(_) => self.read(file, offset, len, buf),
        }
    }

    /// For a file not read yet: if no page of `offset..offset + len` is in
    /// the page cache now, asks the kernel to read the range from the
    /// device in the background (`POSIX_FADV_WILLNEED`) and returns true.
    /// [`DeviceReader::read_if_cold`] then counts a read inside that range
    /// as a device read without asking again: every page that entered the
    /// cache since came from the device, as after an eviction (a writer of
    /// the file meanwhile changes its bytes, and its ctime, which the
    /// caller compares after its reads). Returns false, and
    /// asks for nothing, when a page is cached (reads inside the range then
    /// take the eviction path without asking again) or there is no device.
    pub fn prefetch_if_cold(
        &mut self,
        file: &File,
        offset: u64,
        len: u64,
    ) -> std::io::Result<bool> {
        if self.path == ReadPath::Cached || !self.backing.has_device() || len == 0 {
            return Ok(false);
        }
        let cold = crate::resident(file, offset, len)? == 0;
        if cold {
            prefetch(file, offset, len);
        }
        self.cold = Some((offset, len, cold));
        Ok(cold)
    }

    /// Reads `len` bytes at `offset` into `buf[..len]` only if none of
    /// their pages is in the page cache now (`cachestat`), or they lie in
    /// the range [`DeviceReader::prefetch_if_cold`] found cold: then every byte
    /// comes from the device, as after an eviction, and the read counts as
    /// a device read (on the evict path readahead is off, so it does not
    /// pull in the next range either). Returns None, having read
    /// nothing, when some page is cached (the caller then reads as usual
    /// and verifies with [`DeviceReader::read`]).
    pub fn read_if_cold(
        &mut self,
        file: &File,
        offset: u64,
        len: usize,
        buf: &mut [u8],
    ) -> std::io::Result<Option<ReadOutcome>> {
        // Inside the prefetch's range its answer stands: cold, a device
        // read; warm, not asked again (a page cached then may still be).
        let known = self
            .cold
            .filter(|(at, n, _)| offset >= *at && offset + len as u64 <= at + n)
            .map(|(_, _, cold)| cold);
        let cold = match known {
            _ if self.path == ReadPath::Cached => false,
            Some(cold) => cold,
            None => crate::resident(file, offset, len as u64)? == 0,
        };
        if !cold {
            return Ok(None);
        }
        file.read_exact_at(&mut buf[..len], offset)?;
        Ok(Some(ReadOutcome {
            device: self.backing.has_device(),
            ..ReadOutcome::default()
        }))
    }

    fn read_evicted(
        &self,
        file: &File,
        offset: u64,
        len: usize,
        buf: &mut [u8],
        device: bool,
    ) -> std::io::Result<ReadOutcome> {
        let t = Instant::now();
        let ev = evict(file, offset, len as u64)?;
        let evict_time = t.elapsed();
        file.read_exact_at(&mut buf[..len], offset)?;
        Ok(ReadOutcome {
            device: device && ev.resident == 0,
            resident: ev.resident,
            buffered: false,
            evict_time,
        })
    }

    fn read_direct(&self, offset: u64, len: usize, buf: &mut [u8]) -> std::io::Result<()> {
        let f = self
            .direct
            .as_ref()
            .expect("direct path has its descriptor");
        let alen = (len as u64).div_ceil(PAGE) as usize * PAGE as usize;
        let mut done = 0;
        while done < len {
            match f.read_at(&mut buf[done..alen], offset + done as u64) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                // The tail: O_DIRECT reads whole pages and stops at the end
                // of the file, so a short count past `len` is the file's end.
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            if done < len && !(done as u64).is_multiple_of(PAGE) {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        Ok(())
    }
}

/// Asks the kernel to read `offset..offset + len` of `file` into the page
/// cache in the background (best effort: a failure only means the later
/// read waits).
pub fn prefetch(file: &File, offset: u64, len: u64) {
    // SAFETY: plain syscall on a valid fd.
    unsafe {
        libc::posix_fadvise(
            file.as_raw_fd(),
            offset as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_WILLNEED,
        )
    };
}

/// Whether a read can go through O_DIRECT: page-aligned offset and buffer,
/// and room for the length rounded up to a page.
fn direct_fits(offset: u64, len: usize, buf: &[u8]) -> bool {
    let alen = (len as u64).div_ceil(PAGE) as usize * PAGE as usize;
    offset.is_multiple_of(PAGE)
        && (buf.as_ptr() as usize).is_multiple_of(PAGE as usize)
        && buf.len() >= alen
}

//! Reading files for hashing: aligned buffers, an explicit read strategy.

use std::alloc::{self, Layout};
use std::fs::File;
use std::io::{self, Read};
use std::ops::{Deref, DerefMut};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::ptr::NonNull;

use crate::{Algorithm, DigestError, Granular, GranularDigests};

/// Alignment of read buffers, in bytes. The kernel copies from the page
/// cache several times faster into page-aligned memory than into the
/// 16-byte-aligned memory a large `Vec` gets (measured: ~12 vs ~2 GiB/s).
pub const BUFFER_ALIGN: usize = 4096;

/// Read size when hashing on one thread (fits in L2, so the hasher reads
/// what the copy just wrote from cache).
const SERIAL_READ_LEN: usize = 256 * 1024;

/// Read size when an algorithm splits one input across threads: each read
/// must give every thread enough to do.
const PARALLEL_READ_LEN: usize = 16 * 1024 * 1024;

/// How far ahead of the hasher a mapped file is pre-faulted, in bytes.
const MMAP_WINDOW: usize = 16 * 1024 * 1024;

/// Files smaller than this are read, not mapped: mapping and unmapping a
/// small file costs more than copying it.
const MIN_MMAP_LEN: u64 = 64 * 1024;

/// A zero-initialised heap buffer aligned to [`BUFFER_ALIGN`].
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only allow reads, like &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` bytes (rounded up to whole 4 KiB pages, at least one).
    pub fn new(len: usize) -> AlignedBuf {
        let len = len.max(1).next_multiple_of(BUFFER_ALIGN);
        let layout = Layout::from_size_align(len, BUFFER_ALIGN).expect("valid layout");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes for our lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and we hold the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len, BUFFER_ALIGN).expect("valid layout");
        // SAFETY: allocated in `new` with this very layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}

/// How file bytes reach the hasher. The default maps large regular files
/// and reads everything else; `Read` forces plain reads, so that the
/// fallback stays tested and a file that shrinks while mapped cannot
/// crash the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadStrategy {
    /// Map regular files of at least 64 KiB; fall back to reading if mapping fails.
    #[default]
    Auto,
    /// Always `read(2)` into aligned buffers.
    Read,
    /// Map every non-empty regular file (for benchmarks; falls back to
    /// reading when mapping fails).
    Mmap,
}

/// The path a file's bytes really took, for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReadPath {
    /// Memory-mapped.
    Mmap,
    /// Read into 4 KiB-aligned buffers.
    Read,
}

/// What to compute for a file and how to read it.
#[derive(Debug, Clone, Copy)]
pub struct DigestPlan {
    /// Algorithm of the whole-file and per-block digests.
    pub algorithm: Algorithm,
    /// Per-block digests with this block size, in bytes.
    pub block_size: Option<usize>,
    /// Per-4 KiB-page CRC-32C values.
    pub pages: bool,
    /// Whether one file may use all threads of the current rayon pool.
    pub parallel: bool,
    /// How to reach the bytes.
    pub strategy: ReadStrategy,
}

impl DigestPlan {
    /// Whole-file digest only, one thread, default read strategy.
    pub fn whole(algorithm: Algorithm) -> DigestPlan {
        DigestPlan {
            algorithm,
            block_size: None,
            pages: false,
            parallel: false,
            strategy: ReadStrategy::Auto,
        }
    }

    /// The digests to compute, for an input of `len` bytes if known.
    fn granular(&self, len: Option<u64>) -> Result<Granular, DigestError> {
        let mut g = Granular::new(self.algorithm, self.parallel);
        if let Some(len) = len {
            g = g.expecting(len);
        }
        if let Some(bs) = self.block_size {
            g = g.with_blocks(bs)?;
        }
        if self.pages {
            g = g.with_pages();
        }
        Ok(g)
    }

    /// Whether one file's bytes will be hashed by several threads at once.
    fn splits_across_threads(&self) -> bool {
        let splits = self.algorithm.splits_within_file() || self.block_size.is_some() || self.pages;
        self.parallel && splits && rayon::current_num_threads() > 1
    }

    fn read_len(&self) -> usize {
        if self.splits_across_threads() {
            PARALLEL_READ_LEN
        } else {
            SERIAL_READ_LEN
        }
    }
}

/// The digests of one file and how its bytes were read.
#[derive(Debug, Clone)]
pub struct FileDigests {
    /// What was computed.
    pub digests: GranularDigests,
    /// How the bytes were reached.
    pub read_path: ReadPath,
}

/// Computes what `plan` asks for over the file at `path`.
pub fn digest_file(path: &Path, plan: &DigestPlan) -> Result<FileDigests, DigestError> {
    let file = File::open(path).map_err(|e| DigestError::io(path, e))?;
    let meta = file.metadata().map_err(|e| DigestError::io(path, e))?;
    if meta.is_dir() {
        return Err(DigestError::IsDirectory(path.to_path_buf()));
    }
    let map = match plan.strategy {
        ReadStrategy::Auto => meta.len() >= MIN_MMAP_LEN,
        ReadStrategy::Read => false,
        ReadStrategy::Mmap => meta.len() > 0,
    };
    if map && meta.is_file() {
        if let Some(digests) = digest_mapped(path, &file, meta.len(), plan)? {
            return Ok(FileDigests {
                digests,
                read_path: ReadPath::Mmap,
            });
        }
    }
    // SAFETY: plain advisory call on a file descriptor we own.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_SEQUENTIAL) };
    let digests = read_all(file, Some(meta.len()), plan).map_err(|e| DigestError::io(path, e))?;
    Ok(FileDigests {
        digests,
        read_path: ReadPath::Read,
    })
}

/// Hashes a regular file of `len` bytes through read-only mappings.
/// `Ok(None)` if the file cannot be mapped (the caller then reads it).
///
/// Faulting pages in one 4 KiB page at a time is what makes a mapped read
/// slow; how that cost is hidden depends on the threads:
/// - one hashing thread: a helper thread maps the next [`MMAP_WINDOW`] of
///   the file and pre-faults it (MADV_POPULATE_READ, one call per window)
///   while the current one is hashed, so faulting and hashing overlap;
///   each window is unmapped once hashed, so the process never holds more
///   than three windows (48 MiB) of the file, whatever its size; a file
///   of one window is pre-faulted and hashed on the calling thread;
/// - several: one mapping of the whole file, every worker faults its own
///   pieces, so faulting runs in parallel too (b3sum's way, and its
///   resident size).
fn digest_mapped(
    path: &Path,
    file: &File,
    len: u64,
    plan: &DigestPlan,
) -> Result<Option<GranularDigests>, DigestError> {
    let mut g = plan.granular(Some(len))?;
    if plan.splits_across_threads() {
        // SAFETY: the map is only read. If another process truncates the
        // file meanwhile, reads past the new end fault (SIGBUS); that is
        // the documented price of this path and why ReadStrategy::Read exists.
        let Ok(map) = (unsafe { memmap2::Mmap::map(file) }) else {
            return Ok(None);
        };
        debug_assert_eq!(map.len() as u64, len);
        let _ = map.advise(memmap2::Advice::Sequential);
        g.update(&map);
        return Ok(Some(g.finish()));
    }
    let Ok(first) = map_window(file, 0, len) else {
        return Ok(None);
    };
    if len <= MMAP_WINDOW as u64 {
        // One window: fault it in and hash it here, without a thread to
        // fault the next one (for small files the thread cost more than
        // it overlapped).
        prefault(&first);
        g.update(&first);
        return Ok(Some(g.finish()));
    }
    let (ready, windows_ready) = std::sync::mpsc::sync_channel(1);
    let mut done = 0u64;
    let complete = std::thread::scope(|s| {
        s.spawn(move || {
            let mut window = Ok(first);
            let mut offset = 0u64;
            loop {
                let mapped = window.is_ok();
                if let Ok(w) = &window {
                    prefault(w);
                }
                let n = window.as_ref().map_or(0, |w| w.len() as u64);
                if ready.send(window).is_err() || !mapped {
                    return;
                }
                offset += n;
                if offset >= len {
                    return;
                }
                window = map_window(file, offset, len);
            }
        });
        for window in windows_ready {
            match window {
                Ok(w) => {
                    g.update(&w);
                    done += w.len() as u64;
                }
                Err(_) => return false,
            }
        }
        true
    });
    if !complete {
        // A later window could not be mapped (address space or memory
        // exhausted): read the rest instead.
        read_rest(path, file, done, len, &mut g)?;
    }
    Ok(Some(g.finish()))
}

/// Maps the window of the file that starts at `offset` (a multiple of
/// [`MMAP_WINDOW`]): [`MMAP_WINDOW`] bytes, or up to `len`.
fn map_window(file: &File, offset: u64, len: u64) -> io::Result<memmap2::Mmap> {
    let n = (len - offset).min(MMAP_WINDOW as u64) as usize;
    // SAFETY: as for the whole-file map in `digest_mapped`: only read; a
    // concurrent truncation makes reads past the new end fault (SIGBUS).
    unsafe { memmap2::MmapOptions::new().offset(offset).len(n).map(file) }
}

/// Feeds bytes `from..len` of `file` to `g` by positioned reads.
fn read_rest(
    path: &Path,
    file: &File,
    from: u64,
    len: u64,
    g: &mut Granular,
) -> Result<(), DigestError> {
    use std::os::unix::fs::FileExt;
    let mut buf = AlignedBuf::new(SERIAL_READ_LEN);
    let mut at = from;
    while at < len {
        let n = (len - at).min(SERIAL_READ_LEN as u64) as usize;
        file.read_exact_at(&mut buf[..n], at)
            .map_err(|e| DigestError::io(path, e))?;
        g.update(&buf[..n]);
        at += n as u64;
    }
    Ok(())
}

/// Makes every page of `window` (part of a read-only file mapping) present.
fn prefault(window: &[u8]) {
    // SAFETY: the range lies inside a live mapping; MADV_POPULATE_READ
    // only faults pages in (Linux 5.14+).
    let rc = unsafe {
        libc::madvise(
            window.as_ptr() as *mut libc::c_void,
            window.len(),
            libc::MADV_POPULATE_READ,
        )
    };
    if rc != 0 {
        // Older kernels: touch one byte per page instead.
        for page in window.chunks(BUFFER_ALIGN) {
            // SAFETY: reading a byte of a live mapping.
            unsafe { std::ptr::read_volatile(page.as_ptr()) };
        }
    }
}

/// Computes what `plan` asks for over everything `reader` yields
/// (always the read path; `name` labels errors).
pub fn digest_reader(
    reader: impl Read,
    name: &Path,
    plan: &DigestPlan,
) -> Result<FileDigests, DigestError> {
    let digests = read_all(reader, None, plan).map_err(|e| DigestError::io(name, e))?;
    Ok(FileDigests {
        digests,
        read_path: ReadPath::Read,
    })
}

std::thread_local! {
    /// Each thread keeps its largest read buffer: hashing thousands of
    /// small files must not allocate (and zero) a buffer per file.
    static READ_BUF: std::cell::RefCell<Option<AlignedBuf>> = const { std::cell::RefCell::new(None) };
}

/// Feeds everything `reader` yields to the plan's digests. `size_hint`
/// (the file's size, if known) keeps the buffer no larger than needed.
fn read_all(
    mut reader: impl Read,
    size_hint: Option<u64>,
    plan: &DigestPlan,
) -> io::Result<GranularDigests> {
    let mut g = plan
        .granular(size_hint)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut len = plan.read_len();
    if let Some(hint) = size_hint {
        // One page more than the file, so that EOF shows in the first read.
        len = len.min(hint as usize + BUFFER_ALIGN);
    }
    let mut buf = READ_BUF
        .with(|b| b.borrow_mut().take())
        .filter(|b| b.len() >= len)
        .unwrap_or_else(|| AlignedBuf::new(len));
    let result = (|| {
        loop {
            let n = fill(&mut reader, &mut buf[..len])?;
            if n == 0 {
                break;
            }
            g.update(&buf[..n]);
            if n < len {
                break;
            }
        }
        Ok(())
    })();
    READ_BUF.with(|b| *b.borrow_mut() = Some(buf));
    result.map(|()| g.finish())
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn fill(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

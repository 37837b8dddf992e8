//! Evicting a byte range from the page cache, and proving it.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::CacheError;

/// The page size eviction and residency work in, in bytes.
pub const PAGE: u64 = 4096;

/// Rounds of flush + drop + check before giving up on stubborn pages,
/// and the pause before each (in ms). Pages pinned for a moment (a
/// writeback or a read another thread started, an LRU batch) usually go on
/// the next round; a few need the pin to end first, which on a loaded
/// machine can take longer than 20 ms (seen: 1 block of 256 left resident
/// after six rounds in 18 ms, while a 1 Gbit/s delay line's real-time
/// threads kept both cores busy). At most ~190 ms is spent on a stubborn
/// range; after one range of a file used all of it, later ranges of that
/// file on the same thread get the first [`SHORT_ROUNDS`] only (~18 ms),
/// so that pages pinned for good (another process maps the file) cost
/// ~18 ms per block, not 190. Ranges of other files that stay too get
/// less the longer the run of them on a thread ([`STREAK_SHORT`],
/// [`FEW_ROUNDS`]): pinned pages across a tree of small files (seen: a
/// benchmark's `intact copy` whose sources kept some pages through the
/// cache drop before it) otherwise cost 190 ms a file, a 20,000-file copy
/// an hour. A range that goes ends the run.
const BACKOFF_MS: [u64; 9] = [0, 0, 1, 2, 5, 10, 20, 50, 100];
const MAX_ROUNDS: u32 = BACKOFF_MS.len() as u32;
/// Rounds for a file that already spent the whole budget on this thread,
/// or for any range after [`STREAK_SHORT`] stubborn ranges in a row.
const SHORT_ROUNDS: u32 = 6;
/// Rounds for any range after [`STREAK_FEW`] stubborn ranges in a row on
/// this thread (~1 ms).
const FEW_ROUNDS: u32 = 3;
/// Stubborn ranges in a row (each within [`STREAK_GAP`] of the one
/// before) after which a range gets [`SHORT_ROUNDS`].
const STREAK_SHORT: u32 = 1;
/// Stubborn ranges in a row after which a range gets [`FEW_ROUNDS`].
const STREAK_FEW: u32 = 2;

thread_local! {
    /// The file (device, inode) of the last range on this thread that
    /// stayed resident after every round.
    static STUBBORN: std::cell::Cell<Option<(u64, u64)>> = const { std::cell::Cell::new(None) };
    /// Ranges in a row on this thread, of any files, that stayed resident
    /// after every round they were given, and when the last one ended.
    static STREAK: std::cell::Cell<(u32, Option<std::time::Instant>)> =
        const { std::cell::Cell::new((0, None)) };
}

/// A stubborn range counts towards the run before it only if it comes
/// within this long of the run's last: pins met now and then (a loaded
/// machine, another session's reads) each get the whole budget again.
const STREAK_GAP: std::time::Duration = std::time::Duration::from_secs(1);

/// The run of stubborn ranges this thread is in now.
fn streak_now() -> u32 {
    match STREAK.get() {
        (n, Some(at)) if at.elapsed() < STREAK_GAP => n,
        _ => 0,
    }
}

/// Records that a range ended stubborn (after a run of `streak`), or not.
fn end_streak(streak: u32, stubborn: bool) {
    STREAK.set(match stubborn {
        true => (streak.saturating_add(1), Some(std::time::Instant::now())),
        false => (0, None),
    });
}

/// `file`'s device and inode, if fstat answers.
fn identity(file: &File) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    file.metadata().ok().map(|m| (m.dev(), m.ino()))
}

/// The largest page-cache folio (PMD size on x86-64 and arm64 with 4 KiB
/// pages), in bytes.
const MAX_FOLIO: u64 = 2 << 20;

/// What one eviction did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Eviction {
    /// Pages in the range.
    pub pages: u64,
    /// Pages [`resident`] still found after the last round: 0 means
    /// the next read of the range comes from below the page cache.
    pub resident: u64,
    /// Rounds used.
    pub rounds: u32,
}

/// The page-aligned range covering `offset..offset + len`.
fn aligned(offset: u64, len: u64) -> (u64, u64) {
    let start = offset / PAGE * PAGE;
    let end = (offset + len).div_ceil(PAGE) * PAGE;
    (start, end - start)
}

/// Flushes, drops and confirms the pages of `offset..offset + len` of
/// `file` (which must be open for reading).
///
/// Dirty pages cannot be dropped, so the range is written back and waited
/// for first (`sync_file_range`, or `fdatasync` where that is refused);
/// then `POSIX_FADV_DONTNEED`; then [`resident`] counts what is still there.
/// Pages that stay (another process reading the file, a racing write) get
/// more rounds, up to a bound; the result says how many remained.
pub fn evict(file: &File, offset: u64, len: u64) -> Result<Eviction, CacheError> {
    if len == 0 {
        return Ok(Eviction::default());
    }
    let (start, alen) = aligned(offset, len);
    let mut out = Eviction {
        pages: alen / PAGE,
        ..Eviction::default()
    };
    let streak = streak_now();
    while out.rounds < MAX_ROUNDS {
        if out.rounds == FEW_ROUNDS && streak >= STREAK_FEW {
            end_streak(streak, true);
            return Ok(out);
        }
        if out.rounds == SHORT_ROUNDS {
            let same_file = || identity(file).is_some_and(|me| STUBBORN.get() == Some(me));
            if streak >= STREAK_SHORT || same_file() {
                end_streak(streak, true);
                return Ok(out);
            }
        }
        let pause = BACKOFF_MS[out.rounds as usize];
        if pause > 0 {
            std::thread::sleep(std::time::Duration::from_millis(pause));
        }
        out.rounds += 1;
        // A large folio that straddles the range's ends is not dropped by
        // DONTNEED on the range (the kernel only drops folios wholly inside
        // it), so later rounds widen the range to the largest folio size.
        let (start, alen) = if out.rounds == 1 {
            (start, alen)
        } else {
            let s = start / MAX_FOLIO * MAX_FOLIO;
            (s, (start + alen).div_ceil(MAX_FOLIO) * MAX_FOLIO - s)
        };
        flush(file, start, alen)?;
        // SAFETY: plain syscall on a valid fd; no memory is passed.
        let r = unsafe {
            libc::posix_fadvise(
                file.as_raw_fd(),
                start as libc::off_t,
                alen as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            )
        };
        if r != 0 {
            return Err(CacheError::Io {
                op: "posix_fadvise(DONTNEED)",
                source: std::io::Error::from_raw_os_error(r),
            });
        }
        out.resident = resident(file, offset, len)?;
        if out.resident == 0 {
            break;
        }
    }
    if out.resident > 0 {
        STUBBORN.set(identity(file));
    }
    end_streak(streak, out.resident > 0);
    Ok(out)
}

/// Starts writing back the dirty pages of a range, without waiting (a
/// later [`evict`] waits). Best effort: errors show up in that wait.
pub fn start_writeback(file: &File, offset: u64, len: u64) {
    let (start, alen) = aligned(offset, len);
    // SAFETY: plain syscall on a valid fd.
    unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            start as libc::off64_t,
            alen as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        )
    };
}

/// Writes back the dirty pages of a range and waits for them.
fn flush(file: &File, start: u64, len: u64) -> Result<(), CacheError> {
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: plain syscall on a valid fd.
    let r = unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            start as libc::off64_t,
            len as libc::off64_t,
            flags,
        )
    };
    if r == 0 {
        return Ok(());
    }
    match std::io::Error::last_os_error().raw_os_error() {
        // Not a file system that has it: the whole-file flush does the job.
        Some(libc::ENOSYS | libc::EINVAL | libc::ESPIPE | libc::EOPNOTSUPP) => {
            file.sync_data().map_err(|source| CacheError::Io {
                op: "fdatasync",
                source,
            })
        }
        _ => Err(CacheError::last("sync_file_range")),
    }
}

/// Pages of `offset..offset + len` of `file` now in the page cache: by
/// `cachestat(2)` (Linux 6.5, one call), or where that is missing by
/// `mincore` on a read-only shared mapping of the range. Pages past the
/// end of the file count as not resident.
pub fn resident(file: &File, offset: u64, len: u64) -> Result<u64, CacheError> {
    if len == 0 {
        return Ok(0);
    }
    let (start, alen) = aligned(offset, len);
    match cachestat(file, start, alen)? {
        Some(n) => Ok(n),
        None => resident_by_mincore(file, start, alen),
    }
}

/// [`resident`] by `mincore`, for the page-aligned range.
fn resident_by_mincore(file: &File, start: u64, alen: u64) -> Result<u64, CacheError> {
    let mut count = 0u64;
    // Map at most 1 GiB at a time: address space is plenty, but the
    // residency vector is one byte per page.
    const CHUNK: u64 = 1 << 30;
    let mut at = start;
    while at < start + alen {
        let n = (start + alen - at).min(CHUNK);
        count += resident_chunk(file, at, n)?;
        at += n;
    }
    Ok(count)
}

/// `cachestat`'s number in the kernel's common table (x86-64, arm64 and
/// most others; where it differs the call fails with ENOSYS and `mincore`
/// counts).
const SYS_CACHESTAT: libc::c_long = 451;

/// Set once `cachestat` is found missing (a kernel before 6.5): from then
/// on `mincore` counts.
static NO_CACHESTAT: AtomicBool = AtomicBool::new(false);

/// The kernel's `struct cachestat_range`.
#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

/// The kernel's `struct cachestat`.
#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// Cached pages of the page-aligned range, by `cachestat(2)`; None where
/// the kernel does not have it (the caller asks `mincore`).
fn cachestat(file: &File, start: u64, len: u64) -> Result<Option<u64>, CacheError> {
    if NO_CACHESTAT.load(Ordering::Relaxed) {
        return Ok(None);
    }
    let range = CachestatRange { off: start, len };
    let mut st = Cachestat::default();
    // SAFETY: valid fd; both pointers are to structs we own, of the
    // kernel's layout; flags must be 0.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const CachestatRange,
            &mut st as *mut Cachestat,
            0u32,
        )
    };
    if r == 0 {
        return Ok(Some(st.nr_cache));
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ENOSYS) => {
            NO_CACHESTAT.store(true, Ordering::Relaxed);
            Ok(None)
        }
        // Refused for this file (since Linux 6.14, a file the caller may
        // not write and does not own; or a seccomp filter), or a file it
        // does not cover (hugetlbfs): mincore answers for this one (for a
        // file it may not write, every page as resident: the safe side).
        Some(libc::EPERM | libc::EOPNOTSUPP) => Ok(None),
        _ => Err(CacheError::last("cachestat")),
    }
}

fn resident_chunk(file: &File, start: u64, len: u64) -> Result<u64, CacheError> {
    // SAFETY: a fresh read-only shared mapping that nothing dereferences;
    // it is only passed to mincore and unmapped below.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            start as libc::off_t,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(CacheError::last("mmap (for mincore)"));
    }
    let mut vec = vec![0u8; (len / PAGE) as usize];
    // SAFETY: addr..addr+len is our mapping; vec has one byte per page.
    let r = unsafe { libc::mincore(addr, len as usize, vec.as_mut_ptr()) };
    let err = (r != 0).then(|| CacheError::last("mincore"));
    // SAFETY: unmapping exactly what mmap returned.
    unsafe { libc::munmap(addr, len as usize) };
    if let Some(e) = err {
        return Err(e);
    }
    Ok(vec.iter().filter(|b| *b & 1 != 0).count() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// cachestat and mincore count the same pages of a file whose pages
    /// this test wrote and then dropped in part (on a file system that
    /// cannot drop them, both must still agree).
    #[test]
    fn cachestat_and_mincore_agree() {
        use std::io::Write;
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![7u8; 16 * PAGE as usize]).unwrap();
        f.sync_all().unwrap();
        let before = resident_by_mincore(&f, 0, 16 * PAGE).unwrap();
        assert_eq!(before, 16, "a file just written is in the cache");
        // SAFETY: plain syscall on a valid fd.
        unsafe {
            libc::posix_fadvise(
                f.as_raw_fd(),
                (4 * PAGE) as libc::off_t,
                (5 * PAGE) as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            )
        };
        if resident_by_mincore(&f, 0, 16 * PAGE).unwrap() == 16 {
            eprintln!(
                "cachestat_and_mincore_agree: this file system kept the dropped pages; only all-resident ranges are compared"
            );
        }
        for (start, len) in [(0, 16), (0, 4), (3, 3), (4, 5), (8, 8), (12, 10), (20, 4)] {
            let (start, len) = (start * PAGE, len * PAGE);
            let by_mincore = resident_by_mincore(&f, start, len).unwrap();
            match cachestat(&f, start, len).unwrap() {
                Some(n) => assert_eq!(n, by_mincore, "pages {start}+{len}"),
                None => eprintln!("cachestat is missing here: only mincore was checked"),
            }
        }
    }

    /// A file of `n` bytes this test wrote, with every page mapped (shared,
    /// read) and touched, so that no eviction can drop it while the
    /// returned mapping lasts.
    fn pinned(n: usize) -> (File, *mut libc::c_void) {
        use std::io::Write;
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![7u8; n]).unwrap();
        f.sync_all().unwrap();
        // SAFETY: a shared read-only mapping of a file this test owns,
        // unmapped by the caller; only read through the volatile reads.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                n,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        for page in 0..n / PAGE as usize {
            // SAFETY: inside the mapping.
            unsafe { std::ptr::read_volatile((map as *const u8).add(page * PAGE as usize)) };
        }
        (f, map)
    }

    /// Pinned pages across many files (each mapped by this test): the
    /// first file's range spends the whole budget, the next file's the
    /// short one, every later one's a few rounds; a stubborn range long
    /// after the last, or a range that goes, ends the run, and the next
    /// pinned file gets the whole budget again.
    #[test]
    fn pinned_pages_across_files_cost_less_the_longer_the_run() {
        let n = 4 * PAGE as usize;
        let files: Vec<_> = (0..6).map(|_| pinned(n)).collect();
        STUBBORN.set(None);
        STREAK.set((0, None));
        let rounds: Vec<u32> = files[..4]
            .iter()
            .map(|(f, _)| {
                let e = evict(f, 0, n as u64).unwrap();
                assert!(e.resident > 0, "a mapped page was dropped: {e:?}");
                e.rounds
            })
            .collect();
        // A pinned range long after the run's last: a run of its own.
        std::thread::sleep(STREAK_GAP + std::time::Duration::from_millis(100));
        let late = evict(&files[5].0, 0, n as u64).unwrap();
        // A file nobody maps: its pages go, and the run ends.
        let free = {
            use std::io::Write;
            let mut f = tempfile::tempfile().unwrap();
            f.write_all(&vec![1u8; n]).unwrap();
            f
        };
        let freed = evict(&free, 0, n as u64).unwrap();
        let after = evict(&files[4].0, 0, n as u64).unwrap();
        for (_, map) in &files {
            // SAFETY: the mappings made by `pinned`.
            unsafe { libc::munmap(*map, n) };
        }
        assert_eq!(
            rounds,
            [MAX_ROUNDS, SHORT_ROUNDS, FEW_ROUNDS, FEW_ROUNDS],
            "rounds per pinned file"
        );
        assert_eq!(late.rounds, MAX_ROUNDS, "past the gap: {late:?}");
        if freed.resident > 0 {
            intact_testkit::skip(
                "evict: a run ends when a range goes",
                "this file system kept an unmapped file's pages: the reset is not checked",
            );
            return;
        }
        assert_eq!(
            after.rounds, MAX_ROUNDS,
            "after a range that went: {after:?}"
        );
    }

    /// Pages this test maps cannot be dropped: the first range spends the
    /// whole budget, a second of the same file on this thread only the
    /// short one, and the pages are reported resident both times.
    #[test]
    fn pages_pinned_for_good_cost_the_long_budget_once_per_file() {
        let n = 8 * PAGE as usize;
        let (f, map) = pinned(n);
        STUBBORN.set(None);
        STREAK.set((0, None));
        let t = std::time::Instant::now();
        let first = evict(&f, 0, n as u64).unwrap();
        let long = t.elapsed();
        let t = std::time::Instant::now();
        let second = evict(&f, 0, n as u64).unwrap();
        let short = t.elapsed();
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(map, n) };
        assert!(
            first.resident > 0 && second.resident > 0,
            "{first:?} {second:?}"
        );
        assert_eq!((first.rounds, second.rounds), (MAX_ROUNDS, SHORT_ROUNDS));
        let budget: u64 = BACKOFF_MS.iter().sum();
        assert!(long >= std::time::Duration::from_millis(budget), "{long:?}");
        assert!(
            short < std::time::Duration::from_millis(budget),
            "{short:?}"
        );
    }

    #[test]
    fn alignment_covers_partial_pages() {
        assert_eq!(aligned(0, 1), (0, PAGE));
        assert_eq!(aligned(4095, 2), (0, 2 * PAGE));
        assert_eq!(aligned(PAGE, PAGE), (PAGE, PAGE));
        assert_eq!(aligned(3 * PAGE + 1, PAGE), (3 * PAGE, 2 * PAGE));
    }
}

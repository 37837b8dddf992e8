//! The probe behind `--block-size auto`: a few blocks of two sizes read,
//! written, evicted and re-read on the transfer's own devices, timed, and
//! each stage's fixed and per-byte cost fitted through the two sizes
//! ([`super::Cost::fit`]).
//!
//! Each size is timed [`REPS`] times and the fastest kept: a probe this
//! short is more often slowed by something else than sped up. The source
//! is read at its first bytes with direct I/O, which reaches its device
//! and leaves its page cache alone. The destination's blocks go to an unnamed
//! file (`O_TMPFILE`) on its file system, which vanishes when closed, also
//! when the process is killed.

use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::Instant;

use intact_digest::{defaults, hash, AlignedBuf};

use super::Cost;

/// The small probe block.
pub const SMALL: u64 = 256 << 10;
/// The large probe block.
pub const LARGE: u64 = 4 << 20;
/// Times each size is measured; the fastest counts.
pub const REPS: usize = 2;

/// What the destination's probe measured, per stage.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Destination {
    /// Writing a block into the page cache.
    pub write: Cost,
    /// Writing it back and dropping it from the cache.
    pub evict: Cost,
    /// Reading it back from the device and digesting it.
    pub reread: Cost,
}

/// Reading the first bytes of `path` from its device and digesting them
/// as the sender does (block digest and the whole file's BLAKE3). The
/// reads are direct (`O_DIRECT`): they reach the device and leave the
/// page cache as it was (evicting the source's pages instead was seen to
/// slow the transfer's own reads of them afterwards). Where the file
/// system refuses direct reads, an error: no device to probe. None when
/// the probe's times were not usable (see [`Cost::fit`]).
pub fn source(path: &Path) -> io::Result<Option<Cost>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)?;
    let size = file.metadata()?.len();
    let large = LARGE.min(size / 4096 * 4096);
    if large <= SMALL {
        return Err(io::Error::other(format!(
            "{} is too small to probe ({size} bytes)",
            path.display()
        )));
    }
    let mut buf = AlignedBuf::new(large as usize);
    let mut time = |len: u64| -> io::Result<f64> {
        let mut best = f64::INFINITY;
        for _ in 0..REPS {
            let t = Instant::now();
            file.read_exact_at(&mut buf[..len as usize], 0)?;
            std::hint::black_box(hash(defaults::BLOCK_ALGORITHM, &buf[..len as usize]));
            std::hint::black_box(blake3::hash(&buf[..len as usize]));
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(best)
    };
    let small = time(SMALL)?;
    let large_t = time(large)?;
    Ok(Cost::fit((SMALL, small), (large, large_t)))
}

/// Why a destination cannot be probed, or the probe did not tell.
fn not_probed(why: impl Into<String>) -> io::Error {
    io::Error::other(why.into())
}

/// Writing, writing back and evicting, and re-reading blocks in an unnamed
/// file in `dir`. An error where there is no device to reach (a file
/// system in memory: a transfer reads back through the cache there, and
/// eviction only waits), where pages stay resident after eviction, or
/// where a stage's larger block took no longer than its smaller one.
pub fn destination(dir: &Path) -> io::Result<Destination> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)?;
    let backing = intact_cache::backing(&file).map_err(io::Error::other)?;
    if backing.in_memory() {
        return Err(not_probed(format!(
            "its file system ({}) keeps files in memory: no device to probe",
            backing.fs()
        )));
    }
    let mut data = AlignedBuf::new(LARGE as usize);
    fill(&mut data);
    let mut back = AlignedBuf::new(LARGE as usize);
    let mut at = 0u64;
    let mut time = |len: u64| -> io::Result<[f64; 3]> {
        let mut best = [f64::INFINITY; 3];
        for _ in 0..REPS {
            let bytes = &data[..len as usize];
            let t = Instant::now();
            file.write_all_at(bytes, at)?;
            let written = t.elapsed().as_secs_f64();
            let t = Instant::now();
            let ev = intact_cache::evict(&file, at, len).map_err(io::Error::other)?;
            let evicted = t.elapsed().as_secs_f64();
            if ev.resident > 0 {
                return Err(not_probed(
                    "pages stayed in the cache after eviction: its re-reads would not reach the device",
                ));
            }
            let t = Instant::now();
            file.read_exact_at(&mut back[..len as usize], at)?;
            std::hint::black_box(hash(defaults::BLOCK_ALGORITHM, &back[..len as usize]));
            let reread = t.elapsed().as_secs_f64();
            if back[..len as usize] != *bytes {
                return Err(io::Error::other(
                    "the probe's block read back differs from what was written",
                ));
            }
            for (b, t) in best.iter_mut().zip([written, evicted, reread]) {
                *b = b.min(t);
            }
            at += len;
        }
        Ok(best)
    };
    let small = time(SMALL)?;
    let large = time(LARGE)?;
    let fit = |i: usize| {
        Cost::fit((SMALL, small[i]), (LARGE, large[i]))
            .ok_or_else(|| not_probed("a stage's times were not usable (negative or not finite)"))
    };
    Ok(Destination {
        write: fit(0)?,
        evict: fit(1)?,
        reread: fit(2)?,
    })
}

/// Bytes no file system compresses or skips (xorshift).
fn fill(buf: &mut [u8]) {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probes_measure_positive_costs_and_leave_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        let mut data = vec![0u8; 8 << 20];
        fill(&mut data);
        std::fs::write(&src, &data).unwrap();
        // Where direct reads are refused (tmpfs before Linux 6.6) or the
        // probe's times are not usable, it says so; both are counted skips, not
        // passes.
        match source(&src) {
            Ok(Some(read)) => assert!(read.of(LARGE) > 0.0, "{read:?}"),
            Ok(None) => intact_testkit::skip("probe source", "times not usable here"),
            Err(e) => intact_testkit::skip("probe source", &e.to_string()),
        }
        match destination(dir.path()) {
            Ok(d) => {
                for c in [d.write, d.evict, d.reread] {
                    assert!(c.of(LARGE) > 0.0, "{d:?}");
                }
            }
            Err(e) => intact_testkit::skip("probe destination", &e.to_string()),
        }
        // The unnamed file left no name.
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn a_file_system_in_memory_is_not_probed() {
        // /dev/shm is a tmpfs here (checked with statfs, not assumed).
        let shm = Path::new("/dev/shm");
        let f = std::fs::File::open(shm).unwrap();
        if !intact_cache::backing(&f).unwrap().in_memory() {
            intact_testkit::skip("probe in memory", "/dev/shm is not a tmpfs here");
            return;
        }
        let e = destination(shm).unwrap_err().to_string();
        assert!(e.contains("keeps files in memory"), "{e}");
    }

    #[test]
    fn a_file_too_small_to_probe_is_an_error_not_a_guess() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("tiny");
        std::fs::write(&src, [1u8; 100 << 10]).unwrap();
        assert!(source(&src).is_err());
    }
}

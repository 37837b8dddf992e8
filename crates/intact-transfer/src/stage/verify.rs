//! The verify stage: what proves a received block was stored, chosen once
//! per file from its verification mode.
//!
//! Every mode but `none` first compares a block's digest with the bytes
//! that arrived (the receiver's "check" step, before the write). What
//! follows the write is the file's [`VerifyStage`]:
//!
//! | mode                 | stage            | after each write          | at FileEnd              | aims at  |
//! |----------------------|------------------|---------------------------|-------------------------|----------|
//! | `none`               | [`Unchecked`]    | nothing                   | nothing                 | none     |
//! | `fiver`              | [`ArrivalOnly`]  | nothing                   | nothing                 | network  |
//! | `block`              | [`CacheReread`]  | re-read through the cache | nothing                 | cache    |
//! | `riva`               | [`DeviceReread`] | evicted, re-read from the device | nothing          | device   |
//! | `sequential`, `file` | [`WholeReread`]  | nothing                   | whole file re-read      | cache    |
//! | `flash`              | [`MediaReread`]  | flushed; evicted and re-read from the device once the device's write cache turned over | nothing | media |
//!
//! In `riva`, a small file of one block waits, written, until its session
//! has a group of such files (see docs/device-verification.md for when a
//! group is handed over); a group of 16 or more is flushed with one
//! `syncfs` before the re-reads, so that their writeback is merged
//! ([`VerifyStage::syncs_first`]). The re-read is the same evict-and-read
//! from the device either way.
//!
//! A per-block re-read runs on the session's verifier thread
//! ([`crate::recheck`], where every read from the device is; the
//! whole-file re-read goes through the cache with [`reread_matches`]),
//! while the session thread receives and writes the next blocks. In
//! `flash` the verifier holds each block in its deferred queue (see
//! [`crate::flash`]) until W bytes were written to the device after it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use intact_cache::{DeviceReader, ReadOutcome, ReadPath};
use intact_digest::{defaults, hash, AlignedBuf, Digest};

use crate::verify::{DeviceStats, Reached, VerifyLevel, VerifyMode};

/// What happens to a file's blocks after they are written.
pub(crate) trait VerifyStage: Send {
    /// Whether a block's digest is compared with the bytes that arrived,
    /// before the write (every mode but `none`).
    fn checks_arrival(&self) -> bool {
        true
    }

    /// The re-reader the verifier thread uses on each written block, if
    /// this stage re-reads every block.
    fn block_reread(&self) -> Option<&BlockReread> {
        None
    }

    /// [`VerifyStage::block_reread`], to count what its reads did.
    fn block_reread_mut(&mut self) -> Option<&mut BlockReread> {
        None
    }

    /// Whether the per-block re-read waits for the device's write cache
    /// to turn over (`flash`).
    fn defers(&self) -> bool {
        false
    }

    /// Whether a file of one block may wait, written, until its session
    /// flushes a group of such files with one `syncfs` before their
    /// re-reads (`riva` on the evict path): the group's writeback then
    /// goes to the device in merged writes instead of one per file. The
    /// re-read that follows is the same evict-and-read from the device.
    fn syncs_first(&self) -> bool {
        false
    }

    /// A deferred re-read of one block came back: whether the device's
    /// window had passed, why not, and the window's statement.
    fn windowed(&mut self, _w: &WindowVerdict) {}

    /// What a report should say about this file's verification even at its
    /// aim (`flash`: which window was used, and where it came from).
    fn statement(&self) -> Option<String> {
        None
    }

    /// Whether [`VerifyStage::at_end`] reads the file back.
    fn rereads_at_end(&self) -> bool {
        false
    }

    /// At FileEnd, every block verified so far: the blocks a whole-file
    /// re-read of `file` found different from their digests (`digests`,
    /// one per block of `block_size` bytes from block 0, the file `size`
    /// long), to be sent again.
    fn at_end(
        &mut self,
        _file: &File,
        _size: u64,
        _block_size: u64,
        _digests: &[Option<Digest>],
        _buf: &mut AlignedBuf,
    ) -> std::io::Result<Vec<u64>> {
        Ok(Vec::new())
    }

    /// Lowers `reached` where this stage's reads fell short of its aim.
    fn lower(&self, _reached: &mut Reached) {}

    /// Why this stage can never reach the device, if it aims there and
    /// cannot (`--require-level device` fails the file at once).
    fn no_device_reason(&self) -> Option<String> {
        None
    }
}

/// `none`: nothing is checked. Bytes are written as they came; the file
/// is at level none whatever happened to them.
pub(crate) struct Unchecked;

impl VerifyStage for Unchecked {
    fn checks_arrival(&self) -> bool {
        false
    }
}

/// `fiver`: the digest of the very buffer received is compared with the
/// sender's on arrival, and that is all; nothing written is read back, so
/// the level is network.
pub(crate) struct ArrivalOnly;

impl VerifyStage for ArrivalOnly {}

/// `block`: each written block is read back through the page cache and
/// compared with its digest. Proves the write reached the cache (level
/// cache), not the device: a write lost below the cache passes.
pub(crate) struct CacheReread(pub(crate) BlockReread);

impl VerifyStage for CacheReread {
    fn block_reread(&self) -> Option<&BlockReread> {
        Some(&self.0)
    }

    fn block_reread_mut(&mut self) -> Option<&mut BlockReread> {
        Some(&mut self.0)
    }
}

/// `riva`: each written block is flushed, evicted from the page cache and
/// read back from the device (or with O_DIRECT), then compared with its
/// digest. Level device only where every read reached the device; a read
/// the cache served, or a file system without a device below it, lowers
/// the file to cache, with the reason.
pub(crate) struct DeviceReread(pub(crate) BlockReread);

impl VerifyStage for DeviceReread {
    fn block_reread(&self) -> Option<&BlockReread> {
        Some(&self.0)
    }

    fn syncs_first(&self) -> bool {
        self.0.lock().path() == ReadPath::Evict
    }

    fn block_reread_mut(&mut self) -> Option<&mut BlockReread> {
        Some(&mut self.0)
    }

    fn lower(&self, reached: &mut Reached) {
        let backing = self.0.lock().backing();
        self.0.stats.lower(reached, "destination", backing);
    }

    fn no_device_reason(&self) -> Option<String> {
        self.0.lock().backing().no_device_reason()
    }
}

/// `flash`: each written block is flushed to the device, and evicted and
/// re-read from it only once W more bytes were written to the device (its
/// write cache has turned over). Level media only where every re-read
/// reached the device after its window passed; a re-read made before (the
/// filler budget spent, the queue full) lowers the file to device, with
/// the reason.
pub(crate) struct MediaReread {
    pub(crate) reread: BlockReread,
    /// Re-reads made after their window passed.
    after_window: u64,
    /// Why the first re-read made early was.
    early: Option<String>,
    /// The window's statement.
    window: Option<std::sync::Arc<str>>,
}

/// What the verifier says about a deferred re-read's window.
#[derive(Debug, Clone)]
pub(crate) struct WindowVerdict {
    /// W bytes were written to the device after the block before it was
    /// re-read.
    pub passed: bool,
    /// Why not, where not.
    pub why: Option<std::sync::Arc<str>>,
    /// The window's statement (W, where it came from, how it is counted).
    pub statement: std::sync::Arc<str>,
}

impl VerifyStage for MediaReread {
    fn block_reread(&self) -> Option<&BlockReread> {
        Some(&self.reread)
    }

    fn block_reread_mut(&mut self) -> Option<&mut BlockReread> {
        Some(&mut self.reread)
    }

    fn defers(&self) -> bool {
        true
    }

    fn windowed(&mut self, w: &WindowVerdict) {
        if w.passed {
            self.after_window += 1;
        } else if self.early.is_none() {
            self.early = Some(w.why.as_deref().unwrap_or("").to_string());
        }
        if self.window.is_none() {
            self.window = Some(w.statement.clone());
        }
    }

    fn statement(&self) -> Option<String> {
        self.window.as_deref().map(str::to_string)
    }

    fn lower(&self, reached: &mut Reached) {
        let backing = self.reread.lock().backing();
        let stats = &self.reread.stats;
        stats.lower(reached, "destination", backing);
        // Every re-read counted (held blocks re-verified in place too) must
        // have come after its window for the level to be media.
        if stats.reads > self.after_window {
            let why = match &self.early {
                Some(why) if !why.is_empty() => format!(": {why}"),
                Some(_) => String::new(),
                // No deferred re-read came back early: the early ones are
                // held blocks, re-verified in place on arrival.
                None => ": blocks held from an earlier run were re-verified in place, without waiting for the window".into(),
            };
            let window = self
                .window
                .as_deref()
                .map(|w| format!(" ({w})"))
                .unwrap_or_default();
            reached.lower(
                VerifyLevel::Device,
                format!(
                    "{} of {} re-reads at the destination came before the device's write cache had turned over{window}{why}",
                    stats.reads - self.after_window,
                    stats.reads
                ),
            );
        }
    }

    fn no_device_reason(&self) -> Option<String> {
        self.reread.lock().backing().no_device_reason()
    }
}

/// `sequential` and `file`: once every block has arrived, the whole file
/// is read back through the page cache and each block compared with its
/// digest (level cache); a block that differs is asked for again.
pub(crate) struct WholeReread;

impl VerifyStage for WholeReread {
    fn rereads_at_end(&self) -> bool {
        true
    }

    fn at_end(
        &mut self,
        file: &File,
        size: u64,
        block_size: u64,
        digests: &[Option<Digest>],
        buf: &mut AlignedBuf,
    ) -> std::io::Result<Vec<u64>> {
        let mut bad = Vec::new();
        for (i, d) in digests.iter().enumerate() {
            let offset = i as u64 * block_size;
            let len = (size - offset).min(block_size) as usize;
            let same = match d {
                Some(d) => reread_matches(file, offset, len, d, buf)?,
                None => false,
            };
            if !same {
                bad.push(i as u64);
            }
        }
        Ok(bad)
    }
}

/// A file a verify stage re-reads, with what its reader needs to know.
pub(crate) struct RereadFile {
    /// The file, shared with its writer.
    pub(crate) file: Arc<File>,
    /// Its file system's device number (`st_dev`).
    pub(crate) dev: u64,
    /// Whether it is read in one range (a file of one block).
    pub(crate) one_range: bool,
}

impl RereadFile {
    /// A second descriptor of `file`, its device number asked for
    /// (`fstat`), read in blocks.
    pub(crate) fn of(file: &File) -> std::io::Result<RereadFile> {
        use std::os::unix::fs::MetadataExt;
        Ok(RereadFile {
            file: Arc::new(file.try_clone()?),
            dev: file.metadata()?.dev(),
            one_range: false,
        })
    }
}

/// The verify stage of a file received in `mode`. `file` is the file its
/// blocks are written to (None while a file held whole has none yet: only
/// modes without a per-block re-read then); `direct` asks for O_DIRECT
/// re-reads; `through_cache` is the fault lab's broken riva.
pub(crate) fn stage_for(
    mode: VerifyMode,
    file: Option<RereadFile>,
    direct: bool,
    through_cache: bool,
) -> std::io::Result<Box<dyn VerifyStage>> {
    Ok(match (mode, file) {
        (VerifyMode::Block, Some(f)) => {
            Box::new(CacheReread(BlockReread::open(f, ReadPath::Cached)?))
        }
        (VerifyMode::Riva | VerifyMode::Flash, Some(f)) => {
            let path = if through_cache {
                ReadPath::Cached
            } else if direct {
                ReadPath::Direct
            } else {
                ReadPath::Evict
            };
            let reread = BlockReread::open(f, path)?;
            if mode == VerifyMode::Flash {
                Box::new(MediaReread {
                    reread,
                    after_window: 0,
                    early: None,
                    window: None,
                })
            } else {
                Box::new(DeviceReread(reread))
            }
        }
        (mode, _) => stage_without_file(mode),
    })
}

/// The verify stage of a file in `mode` while it has no file to re-read
/// (held whole under its final name, no block received): `block` and
/// `riva` check arrivals only until [`stage_for`] gives them their file.
pub(crate) fn stage_without_file(mode: VerifyMode) -> Box<dyn VerifyStage> {
    match mode {
        VerifyMode::None => Box::new(Unchecked),
        VerifyMode::Sequential | VerifyMode::File => Box::new(WholeReread),
        VerifyMode::Fiver | VerifyMode::Block | VerifyMode::Riva | VerifyMode::Flash => {
            Box::new(ArrivalOnly)
        }
    }
}

/// A file's block re-reader, shared with the session's verifier thread:
/// the file, its device reader, and what its reads did.
pub(crate) struct BlockReread {
    pub(crate) file: Arc<File>,
    pub(crate) reader: Arc<Mutex<DeviceReader>>,
    pub(crate) stats: DeviceStats,
    /// Time spent re-reading and hashing.
    pub(crate) check: Duration,
}

impl BlockReread {
    fn open(target: RereadFile, path: ReadPath) -> std::io::Result<BlockReread> {
        let file = target.file;
        let reader = DeviceReader::on(&file, target.dev, path, target.one_range)?;
        Ok(BlockReread {
            file,
            reader: Arc::new(Mutex::new(reader)),
            stats: DeviceStats::default(),
            check: Duration::ZERO,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DeviceReader> {
        self.reader.lock().expect("no panics hold it")
    }

    /// Counts one re-read.
    pub(crate) fn count(&mut self, outcome: &ReadOutcome, took: Duration) {
        self.stats.add(outcome);
        self.check += took;
    }
}

/// The level a re-read reached.
pub(crate) fn reread_level(out: &ReadOutcome) -> VerifyLevel {
    if out.device {
        VerifyLevel::Device
    } else {
        VerifyLevel::Cache
    }
}

/// Whether `len` bytes of `file` at `offset`, read through the cache,
/// hash to `want`.
pub(crate) fn reread_matches(
    file: &File,
    offset: u64,
    len: usize,
    want: &Digest,
    buf: &mut AlignedBuf,
) -> std::io::Result<bool> {
    if buf.len() < len {
        *buf = AlignedBuf::new(len);
    }
    file.read_exact_at(&mut buf[..len], offset)?;
    Ok(hash(defaults::BLOCK_ALGORITHM, &buf[..len]).ct_eq(want))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const BS: u64 = 4096;

    /// A file of three blocks and each block's digest as written.
    fn written() -> (tempfile::NamedTempFile, Vec<Option<Digest>>) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        let data: Vec<u8> = (0..3 * BS as usize + 100)
            .map(|i| (i % 251) as u8)
            .collect();
        f.write_all(&data).unwrap();
        f.flush().unwrap();
        let digests = data
            .chunks(BS as usize)
            .map(|c| Some(hash(defaults::BLOCK_ALGORITHM, c)))
            .collect();
        (f, digests)
    }

    #[test]
    fn a_whole_file_reread_finds_the_block_changed_after_its_write() {
        let (f, digests) = written();
        let size = f.as_file().metadata().unwrap().len();
        let mut buf = AlignedBuf::new(0);
        let mut stage = stage_for(
            VerifyMode::Sequential,
            Some(RereadFile::of(f.as_file()).unwrap()),
            false,
            false,
        )
        .unwrap();
        let clean = stage
            .at_end(f.as_file(), size, BS, &digests, &mut buf)
            .unwrap();
        assert!(clean.is_empty(), "{clean:?}");
        // One byte of block 2 changed on the file itself.
        f.as_file().write_all_at(&[0xff], 2 * BS + 7).unwrap();
        let bad = stage
            .at_end(f.as_file(), size, BS, &digests, &mut buf)
            .unwrap();
        assert_eq!(bad, vec![2]);
        // The same change passes a stage that does not re-read at the end.
        for mode in [VerifyMode::Block, VerifyMode::Fiver, VerifyMode::None] {
            let mut s = stage_for(
                mode,
                Some(RereadFile::of(f.as_file()).unwrap()),
                false,
                false,
            )
            .unwrap();
            let at_end = s.at_end(f.as_file(), size, BS, &digests, &mut buf).unwrap();
            assert!(at_end.is_empty(), "{mode}");
        }
    }

    #[test]
    fn each_mode_gets_the_stage_its_contract_names() {
        let (f, _) = written();
        let with_file =
            |m| stage_for(m, Some(RereadFile::of(f.as_file()).unwrap()), false, false).unwrap();
        // Only `none` skips the check on arrival.
        for m in VerifyMode::ALL {
            assert_eq!(with_file(m).checks_arrival(), m != VerifyMode::None, "{m}");
        }
        // Only `block` and `riva` re-read every block, and only once they
        // have a file to re-read.
        for m in VerifyMode::ALL {
            let per_block = matches!(m, VerifyMode::Block | VerifyMode::Riva | VerifyMode::Flash);
            assert_eq!(with_file(m).block_reread().is_some(), per_block, "{m}");
            assert!(stage_without_file(m).block_reread().is_none(), "{m}");
        }
        // The fault lab's broken riva re-reads through the cache.
        let broken = stage_for(
            VerifyMode::Riva,
            Some(RereadFile::of(f.as_file()).unwrap()),
            false,
            true,
        )
        .unwrap();
        let path = broken.block_reread().unwrap().reader.lock().unwrap().path();
        assert_eq!(path, ReadPath::Cached);
        let riva = with_file(VerifyMode::Riva);
        let path = riva.block_reread().unwrap().reader.lock().unwrap().path();
        assert_eq!(path, ReadPath::Evict);
    }
}

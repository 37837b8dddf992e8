//! The source read: how the sender reads a block and the digest that
//! travels with it, the read path chosen once per file from the mode.
//!
//! - Every mode reads the block through the page cache for sending.
//! - `none` sends no digest.
//! - `riva` reads the digest's bytes from the device: the transfer read
//!   itself when none of the block's pages was cached (it reached the
//!   device), else a second, device-level read. A transfer read the page
//!   cache served wrongly then shows up as a mismatch at the receiver,
//!   and the resend reads from the device. Each read that did not reach
//!   the device lowers the file's level, with the reason.
//! - Every other mode hashes the very bytes it sends (FIVER's rule).

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::time::{Duration, Instant};

use intact_cache::{DeviceReader, ReadPath};
use intact_digest::{defaults, hash, AlignedBuf};
use intact_proto::WIRE_PAGE;
use rustix::buffer::spare_capacity;
use rustix::io::Errno;

use crate::source::{check_unchanged, source_read_error};
use crate::source_cache::SourceKey;
use crate::verify::{DeviceStats, Reached, VerifyLevel, VerifyMode};
use crate::{SourceEntry, TransferError};

/// A stream's read buffers, reused from file to file.
pub(crate) struct Buffers {
    /// The bytes sent.
    pub(crate) transfer: AlignedBuf,
    /// `riva`: the device-level read behind a digest.
    device: AlignedBuf,
}

impl Buffers {
    /// Buffers for blocks of `block_size` bytes in `mode`.
    pub(crate) fn new(block_size: usize, mode: VerifyMode) -> Buffers {
        Buffers {
            transfer: AlignedBuf::new(block_size),
            device: AlignedBuf::new(if mode.reads_device() { block_size } else { 0 }),
        }
    }
}

/// The largest file [`SourceFile::prefetch`] reads ahead: small files
/// are where waiting for each read dominates; larger ones are read in
/// large blocks anyway.
pub(crate) const PREFETCH_MAX: u64 = 1 << 20;

/// A block read for sending: its bytes (moved into the message as they
/// are), the digest that travels with it, and the level that digest's
/// read reached.
pub(crate) struct ReadBlock {
    pub(crate) data: Vec<u8>,
    pub(crate) digest: Vec<u8>,
    /// The CRC-32C of each 4 KiB page of the bytes behind `digest` (see
    /// [`intact_proto::Block::crcs`]); empty in `none`.
    pub(crate) crcs: Vec<u8>,
    pub(crate) level: VerifyLevel,
    /// Time spent hashing.
    pub(crate) hashing: Duration,
}

/// One source file as the sender reads it.
pub(crate) struct SourceFile {
    file: File,
    size: u64,
    block_size: u64,
    mode: VerifyMode,
    /// `riva`: the device reader and what its reads did.
    device: Option<(DeviceReader, DeviceStats)>,
    /// The version opened (its ctime included).
    key: SourceKey,
    /// Its ctime was found changed after its reads.
    status_changed: bool,
}

impl SourceFile {
    /// Opens `e` (unchanged since the scan) for sending in `mode`; with
    /// `require_device`, a source with no device fails here, before
    /// anything is sent.
    pub(crate) fn open(
        e: &SourceEntry,
        mode: VerifyMode,
        block_size: usize,
        read_path: ReadPath,
        require_device: bool,
    ) -> Result<SourceFile, TransferError> {
        let src_err = |err: std::io::Error| TransferError::Source {
            path: e.abs.clone(),
            source: err,
        };
        let file = File::open(&e.abs).map_err(src_err)?;
        let m = check_unchanged(&file, e)?;
        let device = if mode.reads_device() {
            // A file of one block is read in one range.
            let one_range = e.size <= block_size as u64;
            let reader = DeviceReader::on(&file, m.dev(), read_path, one_range)
                .map_err(|err| src_err(err.into()))?;
            if let (true, Some(why)) = (require_device, reader.backing().no_device_reason()) {
                return Err(TransferError::Verification {
                    path: e.rel.to_string(),
                    what: format!("--require-level device: the source is on {why}"),
                });
            }
            Some((reader, DeviceStats::default()))
        } else {
            None
        };
        Ok(SourceFile {
            file,
            size: e.size,
            block_size: block_size as u64,
            mode,
            device,
            key: SourceKey::of_metadata(&m),
            status_changed: false,
        })
    }

    /// Fails if the file's size or mtime changed since the scan; notes a
    /// changed ctime (a write that set its mtime back, a chmod): then a
    /// page read may have been put in the cache by that writer, not read
    /// from the device, and [`SourceFile::lower`] says so.
    pub(crate) fn check_unchanged(&mut self, e: &SourceEntry) -> Result<(), TransferError> {
        let m = check_unchanged(&self.file, e)?;
        // Size and mtime are as scanned: a different key is a new ctime.
        self.status_changed |= SourceKey::of_metadata(&m) != self.key;
        Ok(())
    }

    /// The version of the file opened, for the source-digest cache.
    pub(crate) fn key(&self) -> SourceKey {
        self.key
    }

    /// Starts reading a small file (up to [`PREFETCH_MAX`] bytes) from
    /// storage in the background, before its blocks are asked for, so
    /// that the reads of many small files overlap instead of waiting one
    /// by one. In `riva` only a file with no page cached is prefetched,
    /// and its reads then count as device reads (see
    /// [`DeviceReader::prefetch_if_cold`]); a cached one is read as before.
    pub(crate) fn prefetch(&mut self) {
        if self.size == 0 || self.size > PREFETCH_MAX {
            return;
        }
        match &mut self.device {
            // Best effort: a failed residency check only means no prefetch.
            Some((reader, _)) => {
                let _ = reader.prefetch_if_cold(&self.file, 0, self.size);
            }
            None => intact_cache::prefetch(&self.file, 0, self.size),
        }
    }

    /// The open file.
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// The device read path, in `riva`.
    pub(crate) fn read_path(&self) -> Option<ReadPath> {
        self.device.as_ref().map(|(r, _)| r.path())
    }

    /// What the device-level reads did, in `riva`.
    pub(crate) fn device_stats(&self) -> Option<&DeviceStats> {
        self.device.as_ref().map(|(_, s)| s)
    }

    /// Block `index`: (offset, length).
    fn range(&self, index: u64) -> (u64, usize) {
        let offset = index * self.block_size;
        (offset, (self.size - offset).min(self.block_size) as usize)
    }

    /// Reads block `index` through the cache into `buf`.
    fn read_cached(
        &self,
        e: &SourceEntry,
        index: u64,
        buf: &mut AlignedBuf,
    ) -> Result<(), TransferError> {
        let (offset, len) = self.range(index);
        self.file
            .read_exact_at(&mut buf[..len], offset)
            .map_err(|err| source_read_error(e, err))
    }

    /// `riva`: reads block `index` from the device into `buf`; whether the
    /// read reached the device.
    fn read_device(
        &mut self,
        e: &SourceEntry,
        index: u64,
        buf: &mut AlignedBuf,
    ) -> Result<bool, TransferError> {
        let (offset, len) = self.range(index);
        let (reader, stats) = self.device.as_mut().expect("riva files have a reader");
        let out = reader
            .read(&self.file, offset, len, buf)
            .map_err(|err| source_read_error(e, err))?;
        stats.add(&out);
        Ok(out.device)
    }

    /// `riva`: reads block `index` into `buf` if none of its pages is
    /// cached (so the read reaches the device): whether it reached the
    /// device, or None (nothing read) if some page is cached.
    fn read_if_cold(
        &mut self,
        e: &SourceEntry,
        index: u64,
        buf: &mut AlignedBuf,
    ) -> Result<Option<bool>, TransferError> {
        let (offset, len) = self.range(index);
        let (reader, stats) = self.device.as_mut().expect("riva files have a reader");
        let out = reader
            .read_if_cold(&self.file, offset, len, buf)
            .map_err(|err| source_read_error(e, err))?;
        Ok(out.map(|out| {
            stats.add(&out);
            out.device
        }))
    }

    /// Reads block `index` through the cache into a buffer of its own
    /// (no copy follows: the buffer becomes the message's).
    fn read_owned(&self, e: &SourceEntry, index: u64) -> Result<Vec<u8>, TransferError> {
        let (offset, len) = self.range(index);
        let mut data = Vec::with_capacity(len);
        while data.len() < len {
            let at = offset + data.len() as u64;
            match rustix::io::pread(&self.file, spare_capacity(&mut data), at) {
                Ok(0) => {
                    let eof = std::io::ErrorKind::UnexpectedEof.into();
                    return Err(source_read_error(e, eof));
                }
                Ok(_) | Err(Errno::INTR) => {}
                Err(err) => return Err(source_read_error(e, err.into())),
            }
        }
        data.truncate(len);
        Ok(data)
    }

    /// Reads block `index` for sending, with its digest; a `resend` in
    /// `riva` reads from the device (the page cache may be what held
    /// wrong bytes).
    pub(crate) fn read_for_send(
        &mut self,
        e: &SourceEntry,
        index: u64,
        resend: bool,
        bufs: &mut Buffers,
    ) -> Result<ReadBlock, TransferError> {
        let (_, len) = self.range(index);
        if self.device.is_none() {
            let data = self.read_owned(e, index)?;
            let t = Instant::now();
            let (digest, crcs) = match self.mode {
                VerifyMode::None => (Vec::new(), Vec::new()),
                _ => digest_and_crcs(&data),
            };
            return Ok(ReadBlock {
                data,
                digest,
                crcs,
                level: self.mode.level(),
                hashing: t.elapsed(),
            });
        }
        let reached = if resend {
            self.read_device(e, index, &mut bufs.transfer)?
        } else if let Some(reached) = self.read_if_cold(e, index, &mut bufs.transfer)? {
            reached
        } else {
            self.read_cached(e, index, &mut bufs.transfer)?;
            let reached = self.read_device(e, index, &mut bufs.device)?;
            let t = Instant::now();
            let (digest, crcs) = digest_and_crcs(&bufs.device[..len]);
            return Ok(ReadBlock {
                data: bufs.transfer[..len].to_vec(),
                digest,
                crcs,
                level: device_level(reached),
                hashing: t.elapsed(),
            });
        };
        let t = Instant::now();
        let (digest, crcs) = digest_and_crcs(&bufs.transfer[..len]);
        Ok(ReadBlock {
            data: bufs.transfer[..len].to_vec(),
            digest,
            crcs,
            level: device_level(reached),
            hashing: t.elapsed(),
        })
    }

    /// Whether block `index` of the source hashes to `theirs` (a block the
    /// receiver holds); in `riva` the bytes hashed come from the device.
    /// Some(the bytes read) if it does.
    pub(crate) fn matches<'b>(
        &mut self,
        e: &SourceEntry,
        index: u64,
        theirs: &[u8],
        bufs: &'b mut Buffers,
    ) -> Result<Option<&'b [u8]>, TransferError> {
        let (_, len) = self.range(index);
        let bytes: &[u8] = if self.device.is_none() {
            self.read_cached(e, index, &mut bufs.transfer)?;
            &bufs.transfer[..len]
        } else if self.read_if_cold(e, index, &mut bufs.transfer)?.is_some() {
            &bufs.transfer[..len]
        } else {
            self.read_device(e, index, &mut bufs.device)?;
            &bufs.device[..len]
        };
        Ok((block_digest(bytes) == theirs).then_some(bytes))
    }

    /// The whole-file BLAKE3 of what the source holds now; with `device`,
    /// read the way a resend reads (`riva`: from the device), so that after
    /// a resend it is the digest of the bytes finally accepted, not of a
    /// first read found wrong.
    pub(crate) fn whole_digest(
        &mut self,
        e: &SourceEntry,
        device: bool,
        bufs: &mut Buffers,
    ) -> Result<[u8; 32], TransferError> {
        let mut whole = blake3::Hasher::new();
        for index in 0..self.size.div_ceil(self.block_size) {
            let (_, len) = self.range(index);
            if device && self.device.is_some() {
                self.read_device(e, index, &mut bufs.transfer)?;
            } else {
                self.read_cached(e, index, &mut bufs.transfer)?;
            }
            whole.update(&bufs.transfer[..len]);
        }
        Ok(*whole.finalize().as_bytes())
    }

    /// Lowers `reached` where this end's reads of the source fell short of
    /// the device (`riva`).
    pub(crate) fn lower(&self, reached: &mut Reached) {
        if let Some((reader, stats)) = &self.device {
            stats.lower(reached, "source", reader.backing());
            if self.status_changed {
                reached.lower(
                    VerifyLevel::Cache,
                    "the source's status (ctime) changed while it was read: its reads are not shown to come from the device",
                );
            }
        }
    }
}

/// A block's digest as it travels.
fn block_digest(bytes: &[u8]) -> Vec<u8> {
    hash(defaults::BLOCK_ALGORITHM, bytes).as_bytes().to_vec()
}

/// A block's digest and its pages' CRC-32C as they travel, in one pass.
fn digest_and_crcs(bytes: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let (digest, crcs) =
        intact_digest::hash_with_page_crcs(defaults::BLOCK_ALGORITHM, bytes, WIRE_PAGE);
    (digest.as_bytes().to_vec(), crcs)
}

/// The level of a digest's read in `riva`.
fn device_level(reached: bool) -> VerifyLevel {
    if reached {
        VerifyLevel::Device
    } else {
        VerifyLevel::Cache
    }
}

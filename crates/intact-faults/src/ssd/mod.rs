//! An emulated SSD for the fault lab: a write buffer (DRAM) of 4 KiB
//! pages in front of a NAND store, served through FUSE as one file, with
//! a loop device over that file in direct-I/O mode and an ext4 on the
//! loop device (Kim et al.'s setting, Table 2: a re-read right after a
//! write is answered by the buffer, so a fault in programming the flash
//! shows only once the buffer has turned over).
//!
//! ```text
//!   ext4 (mnt/) ── /dev/loopN (direct I/O) ── fuse/disk ── SsdModel
//!                                                          ├ buffer: LRU by write, `buffer` bytes
//!                                                          └ NAND: a sparse file
//! ```
//!
//! Faults below the host are armed by a page's content
//! ([`EmulatedSsd::arm`]); what the emulator did is in its log, and what
//! the flash holds under a file is read from the NAND file at the file's
//! FIEMAP extents ([`EmulatedSsd::nand_bytes_under`]): ground truth that
//! owes nothing to the tool under test. Root only (loop devices, mounts,
//! `/dev/fuse`). Drop unmounts the ext4, detaches the loop device and
//! unmounts the FUSE file system, on every path.

mod fuse;
mod model;

use std::fs::File;
use std::io;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

pub use model::{SsdEvent, SsdLayer, SsdModel, SsdStats, SSD_PAGE};

use crate::LoopFs;

/// A mounted ext4 on an emulated SSD.
pub struct EmulatedSsd {
    // Dropped in this order: the ext4 and its loop device first, then the
    // FUSE file system under them, then the directory holding both.
    fs: Option<LoopFs>,
    session: Option<fuser::BackgroundSession>,
    model: Arc<Mutex<SsdModel>>,
    dir: tempfile::TempDir,
}

/// Whether an emulated SSD can be made here; the reason if not.
pub fn ssd_usable() -> Result<(), String> {
    crate::usable()?;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map(drop)
        .map_err(|e| format!("/dev/fuse: {e}"))
}

impl EmulatedSsd {
    /// An SSD of `mib` MiB with a write buffer of `buffer` bytes, made in
    /// a temporary directory under `parent` (on a real disk: the NAND
    /// file lives there), formatted ext4 and mounted.
    pub fn new(parent: &Path, mib: u64, buffer: u64) -> io::Result<EmulatedSsd> {
        let dir = tempfile::tempdir_in(parent)?;
        let size = mib << 20;
        let nand = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(dir.path().join("nand"))?;
        let model = Arc::new(Mutex::new(SsdModel::new(nand, size, buffer)?));
        let fuse_dir = dir.path().join("fuse");
        std::fs::create_dir(&fuse_dir)?;
        let fs = fuse::SsdFs {
            model: Arc::clone(&model),
            size,
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName("intact-ssd".into()),
            fuser::MountOption::RW,
        ];
        let session = fuser::spawn_mount(fs, &fuse_dir, &config)?;
        let mut ssd = EmulatedSsd {
            fs: None,
            session: Some(session),
            model,
            dir,
        };
        // The ext4's own directory (its mount point) beside the FUSE one.
        let ext4_dir = tempfile::tempdir_in(ssd.dir.path())?;
        // Inode tables and the journal written now, not by a kernel
        // thread later: every write the device sees comes from the test.
        let fs = LoopFs::over(
            ext4_dir,
            fuse_dir.join(fuse::DISK),
            "",
            &["-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard"],
        )?;
        fs.direct_io()?;
        ssd.fs = Some(fs);
        Ok(ssd)
    }

    /// The ext4 and its loop device (for the faults above the device:
    /// [`LoopFs::wrong_cache_at`]).
    pub fn fs(&self) -> &LoopFs {
        self.fs
            .as_ref()
            .expect("mounted for the life of the EmulatedSsd")
    }

    /// The emulator's state (for its log, counters and ground truth).
    pub fn model(&self) -> MutexGuard<'_, SsdModel> {
        self.model.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where the ext4 is mounted.
    pub fn mnt(&self) -> &Path {
        self.fs().mnt()
    }

    /// The loop device the ext4 is on (its `/sys/block` counters count
    /// every write the emulator receives).
    pub fn device(&self) -> &str {
        self.fs().device()
    }

    /// The directory holding everything (for leak checks).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Corrupts `layer` for the next page written whose content equals
    /// `page` (4 KiB).
    pub fn arm(&self, layer: SsdLayer, page: &[u8]) {
        self.model().arm(layer, page);
    }

    /// Unmounts and mounts the ext4 again: its page cache is emptied, so
    /// what a read returns next comes from the device (the emulator's
    /// buffer, or NAND).
    pub fn remount(&self) -> io::Result<()> {
        self.fs().remount()
    }

    /// Writes `bytes` of filler to a new file on the ext4, syncs it and
    /// removes it: new writes that push older pages out of the buffer.
    pub fn write_filler(&self, bytes: u64) -> io::Result<()> {
        let path = self.mnt().join(".ssd-filler");
        let mut f = File::create(&path)?;
        let chunk: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7 + 13) as u8).collect();
        let mut left = bytes;
        let mut n = 0u8;
        while left > 0 {
            let take = left.min(chunk.len() as u64) as usize;
            // The first page of each MiB differs; none is a page a test
            // arms (their contents come from intact-sample).
            let mut c = chunk[..take].to_vec();
            c[0] = n;
            f.write_all(&c)?;
            n = n.wrapping_add(1);
            left -= take as u64;
        }
        f.sync_all()?;
        drop(f);
        std::fs::remove_file(path)
    }

    /// What NAND holds under `len` bytes of `file` at `logical` (the
    /// file's data synced first, so it has a place on the device).
    pub fn nand_bytes_under(&self, file: &File, logical: u64, len: usize) -> io::Result<Vec<u8>> {
        let phys = self.device_offset(file, logical)?;
        self.model().nand_bytes(phys, len)
    }

    /// What NAND holds under the whole of `file` (synced first), extent by
    /// extent; an error if part of it is not in a plain extent.
    pub fn nand_bytes_of(&self, file: &File) -> io::Result<Vec<u8>> {
        file.sync_all()?;
        let len = file.metadata()?.len();
        let mut out = vec![0u8; len as usize];
        let mut covered = 0;
        for e in intact_cache::extents(file).map_err(io::Error::other)? {
            let end = (e.logical + e.length).min(len);
            if e.logical >= end {
                continue;
            }
            if !e.is_plain() {
                return Err(io::Error::other(
                    "part of the file is not in a plain extent",
                ));
            }
            let n = (end - e.logical) as usize;
            let bytes = self.model().nand_bytes(e.physical, n)?;
            out[e.logical as usize..end as usize].copy_from_slice(&bytes);
            covered += n as u64;
        }
        if covered != len {
            return Err(io::Error::other(format!(
                "the file's extents cover {covered} of its {len} bytes"
            )));
        }
        Ok(out)
    }

    /// Whether the emulator's buffer holds the page under `logical` of
    /// `file`.
    pub fn buffered_under(&self, file: &File, logical: u64) -> io::Result<bool> {
        let phys = self.device_offset(file, logical)?;
        Ok(self.model().buffered(phys / SSD_PAGE as u64))
    }

    fn device_offset(&self, file: &File, logical: u64) -> io::Result<u64> {
        file.sync_all()?;
        intact_cache::physical_offset(file, logical)?
            .ok_or_else(|| io::Error::other("the byte is not in a plain extent"))
    }

    /// Unmounts everything, waiting until the kernel has let go; the
    /// error says what was left behind. Drop does the same, ignoring it.
    pub fn close(mut self) -> io::Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> io::Result<()> {
        let fs = self.fs.take().map_or(Ok(()), LoopFs::close);
        let Some(session) = self.session.take() else {
            return fs;
        };
        // The loop device can hold the FUSE file a little after it was
        // detached (the kernel lets go of it last), and fuser tries its
        // unmount once: if that fails, it is retried with the same
        // patience as the ext4's, lazily as a last resort (fuser's thread
        // then ends by itself when the kernel closes the session).
        match session.umount_and_join() {
            Ok(()) => fs,
            Err(first) => {
                let mnt = self.fuse_mount();
                let again = crate::loopfs::unmount_within(&mnt);
                if again.is_err() {
                    let _ = std::process::Command::new("umount")
                        .arg("-l")
                        .arg(&mnt)
                        .status();
                }
                fs.and(again.map_err(|e| io::Error::new(e.kind(), format!("{first}; then {e}"))))
            }
        }
    }

    /// Where the FUSE file system is mounted (for leak checks).
    pub fn fuse_mount(&self) -> PathBuf {
        self.dir.path().join("fuse")
    }
}

impl Drop for EmulatedSsd {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

//! One cell: a fresh loop file system, the fault, the run(s), the verdict.
//! One module per family of faults.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use intact_faults::LoopFs;
use intact_transfer::{send, CopyReport, ReceiveOptions, SendOptions, TransferError, VerifyMode};

use crate::judge::{judge_after, Said};
use crate::server::{with_server, IDLE};
use crate::{io, Cell, Fault, LabError, MatrixConfig, Outcome};

mod crash;
mod device;
mod disk_full;
mod levels;
mod network;
mod ssd;

pub use ssd::{ssd_block, ssd_window, PREMISE};

/// The block size the lab sends with (intact's default).
pub(crate) const BLOCK: u64 = 4 << 20;

/// Outcome, evidence, detail.
pub(crate) type Verdict = (Outcome, String, String);

/// Everything a cell works with.
pub(crate) struct Ctx<'a> {
    pub cfg: &'a MatrixConfig,
    pub fault: Fault,
    pub mode: VerifyMode,
    pub size: u64,
    /// The source, on the work directory's disk.
    pub src: &'a Path,
    /// The `intact` binary (crash cells only).
    pub intact: &'a Path,
    pub lfs: Arc<LoopFs>,
    /// The server's root on the loop file system.
    pub root: PathBuf,
    /// Where the file ends up.
    pub final_path: PathBuf,
}

impl Ctx<'_> {
    /// The receiver's options: none but the negative control's.
    pub fn receive(&self) -> ReceiveOptions {
        ReceiveOptions {
            reread_through_cache: self.cfg.negative_control,
            ..ReceiveOptions::default()
        }
    }

    /// The sender's options for `mode`.
    pub fn opts(&self, mode: VerifyMode) -> SendOptions {
        SendOptions {
            verify: mode,
            block_size: BLOCK as usize,
            streams: 1,
            ..SendOptions::default()
        }
    }

    /// Sends `src` with `opts` into an in-process server with `receive`.
    pub fn send(
        &self,
        src: &Path,
        receive: ReceiveOptions,
        opts: &SendOptions,
    ) -> Result<CopyReport, TransferError> {
        with_server(&self.root, receive, IDLE, |addr| {
            send(&[src.to_path_buf()], &addr, opts, &|_| {})
        })
    }

    /// Ground truth for the final file (remounts the loop file system).
    pub fn truth(&self) -> Result<bool, LabError> {
        crate::truth::device_equals(&self.lfs, &self.final_path, self.src)
    }

    /// Sends again after an interrupted run and judges it ([`judge_after`]).
    pub fn resume(&self, evidence: String) -> Result<Verdict, LabError> {
        let second = self.send(self.src, self.receive(), &self.opts(self.mode));
        let said = Said::from_report(&second, false);
        let (o, d) = judge_after(&said, self.truth()?);
        Ok((o, evidence, format!("resumed: {d}")))
    }
}

/// Room for a copy of the source and the destination, plus ext4's own
/// (journal, inode tables: about 1/16 of a small file system).
pub(crate) fn fs_mib(size: u64) -> u64 {
    (size >> 20) * 2 + 128 + (size >> 20) / 8
}

pub(crate) fn run_cell(
    cfg: &MatrixConfig,
    fault: Fault,
    mode: VerifyMode,
    size: u64,
    src: &Path,
    intact: &Path,
) -> Result<Cell, LabError> {
    let cell = |(outcome, evidence, detail): Verdict, expected| Cell {
        fault,
        mode,
        size,
        outcome,
        evidence,
        detail,
        expected,
        seconds: 0.0,
        reruns: 0,
    };
    if fault.on_ssd() {
        let (verdict, expected) = ssd::run(cfg, fault, mode, size, src)?;
        return Ok(cell(verdict, expected));
    }
    // data=journal is where O_DIRECT is quietly served by the page cache.
    let options = if fault == Fault::DirectDataJournal {
        "data=journal"
    } else {
        ""
    };
    let lfs = Arc::new(
        LoopFs::with_options(&cfg.dir, fs_mib(size), options)
            .map_err(io("making the loop file system"))?,
    );
    let root = lfs.mnt().join("root");
    let ctx = Ctx {
        cfg,
        fault,
        mode,
        size,
        src,
        intact,
        final_path: root.join("data.bin"),
        root,
        lfs,
    };
    let verdict = match fault {
        Fault::DeviceWrite | Fault::DeviceWriteExtreme => device::device_write(&ctx)?,
        Fault::Memory => device::memory(&ctx)?,
        Fault::SourceRead => device::source_read(&ctx)?,
        Fault::NetworkFlip => network::flip(&ctx)?,
        Fault::NetworkCut | Fault::NetworkStall => network::interrupt(&ctx)?,
        Fault::DiskFull => disk_full::disk_full(&ctx)?,
        Fault::CrashSender | Fault::CrashServer => crash::crash(&ctx)?,
        Fault::HeldBlockResume => levels::held_block_resume(&ctx)?,
        Fault::UnchangedDamaged => levels::unchanged_damaged(&ctx)?,
        Fault::DirectDataJournal => levels::direct_data_journal(&ctx)?,
        Fault::HostMemory | Fault::SsdBuffer | Fault::SsdMedia => {
            unreachable!("run on the emulated SSD above")
        }
    };
    // Tear down here, not in a Drop that hides the error: a loop device or
    // mount that will not go away is the lab's failure.
    let lfs = sole_owner(ctx.lfs)?;
    lfs.close()
        .map_err(io("tearing down the loop file system"))?;
    Ok(cell(verdict, None))
}

/// The file system once no fault hook holds it any more: a hook sits in
/// the receive options, which a server session thread may still be
/// dropping after the server stopped.
pub(crate) fn sole_owner<T>(mut lfs: Arc<T>) -> Result<T, LabError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match Arc::try_unwrap(lfs) {
            Ok(l) => return Ok(l),
            Err(again) if Instant::now() < deadline => {
                lfs = again;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => {
                return Err(io("tearing down the file system")(std::io::Error::other(
                    "a fault hook still holds it after 60 s",
                )))
            }
        }
    }
}

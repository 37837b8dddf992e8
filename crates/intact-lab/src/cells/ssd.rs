//! Kim et al.'s Table 2 on the emulated SSD (intact-faults' `EmulatedSsd`:
//! a write buffer of 4 KiB pages in front of NAND, under a loop device in
//! direct-I/O mode and an ext4): a fault in the destination's page cache
//! (host memory), in the device's write buffer, or in programming the
//! flash, each in one page of the middle block.
//!
//! Ground truth comes from the emulator, not from intact: its log says
//! the buffer or flash fault fired; the host-memory fault is read back
//! wrong from the cache over a right device before the run goes on. After
//! the run, what an application reads through the page cache is compared
//! with the source (host memory), then new writes turn the buffer over
//! and the flash's copy, read from the emulator's NAND file under the
//! file's extents, is compared with the source.
//!
//! Scale: the emulator's buffer is [`MatrixConfig::ssd_buffer`]; the lab
//! sends it blocks of 1/16 of the buffer (a real SSD's buffer holds many
//! blocks); `flash` runs with W = twice the buffer (`--device-cache`), so
//! that the device's own count of bytes written after a block (journal
//! and metadata rewrites among them) surely turned the buffer over.

use std::fs::{self, File};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use intact_faults::{EmulatedSsd, SsdEvent, SsdLayer, SSD_PAGE};
use intact_transfer::{
    send, FlashSettings, ReceiveOptions, SendOptions, VerifyLevel, VerifyMode, WriteHook,
};

use super::{fs_mib, sole_owner, Verdict};
use crate::judge::{judge_after, judge_during, Said};
use crate::server::{with_server, IDLE};
use crate::{io, Fault, LabError, MatrixConfig, Outcome};

/// Said in a cell's detail where Table 2's premise did not hold.
pub const PREMISE: &str =
    "this run read the faulted copy from the device (the emulator's log), so Table 2's miss does not apply";

/// The block size of the SSD cells: 1/16 of the emulator's buffer.
pub fn ssd_block(buffer: u64) -> u64 {
    (buffer / 16).max(SSD_PAGE as u64)
}

/// `flash`'s window on the emulator: twice its buffer.
pub fn ssd_window(buffer: u64) -> u64 {
    2 * buffer
}

/// One Table 2 cell: a fresh emulated SSD, the fault, one send, the
/// emulator's verdict, and what the cell must end in
/// ([`crate::Cell::expected`]).
pub(crate) fn run(
    cfg: &MatrixConfig,
    fault: Fault,
    mode: VerifyMode,
    size: u64,
    src: &Path,
) -> Result<(Verdict, Option<Outcome>), LabError> {
    let buffer = cfg.ssd_buffer;
    let block = ssd_block(buffer);
    // Room for the file, the flash filler (at most W per drain) and the
    // filler that turns the buffer over for the ground truth.
    let mib = fs_mib(size) + (8 * buffer).div_ceil(1 << 20);
    let ssd =
        Arc::new(EmulatedSsd::new(&cfg.dir, mib, buffer).map_err(io("making the emulated SSD"))?);
    let verdict = cell(&ssd, (fault, mode, size), src, block, cfg.negative_control);
    // Torn down here, not in a Drop that hides the error; a hook may
    // still hold the SSD while a session thread drops its options.
    let ssd = sole_owner(ssd)?;
    ssd.close().map_err(io("tearing down the emulated SSD"))?;
    verdict
}

/// `negative_control`: the receiver's re-reads go through the page
/// cache ([`MatrixConfig::negative_control`]).
fn cell(
    ssd: &Arc<EmulatedSsd>,
    (fault, mode, size): (Fault, VerifyMode, u64),
    src: &Path,
    block: u64,
    negative_control: bool,
) -> Result<(Verdict, Option<Outcome>), LabError> {
    // Read once: the model's lock must never be held across a write to
    // the file system it serves (its FUSE thread takes that lock).
    let buffer = ssd.model().buffer_bytes();
    let root = ssd.mnt().join("root");
    fs::create_dir_all(&root).map_err(io("making the server's root"))?;
    let final_path = root.join("data.bin");
    // The faulted page: the middle page of the middle block.
    let mid = size.div_ceil(block).max(1) / 2;
    let in_block = (size - mid * block).min(block);
    let page_at = (mid * block + in_block / 2 / SSD_PAGE as u64 * SSD_PAGE as u64)
        .min((size / SSD_PAGE as u64).saturating_sub(1) * SSD_PAGE as u64);
    let source = fs::read(src).map_err(io("reading the source"))?;
    let page = source
        .get(page_at as usize..page_at as usize + SSD_PAGE)
        .ok_or_else(|| io("the faulted page")(std::io::Error::other("the file is under a page")))?;

    let cache_wrong = Arc::new(AtomicBool::new(false));
    let fired = Arc::new(AtomicBool::new(false));
    let mut receive = ReceiveOptions {
        flash: FlashSettings::new(Some(ssd_window(buffer)), None),
        reread_through_cache: negative_control,
        ..ReceiveOptions::default()
    };
    match fault {
        Fault::SsdBuffer => ssd.arm(SsdLayer::Buffer, page),
        Fault::SsdMedia => ssd.arm(SsdLayer::Media, page),
        Fault::HostMemory => {
            let (ssd, wrong, fired) = (
                Arc::clone(ssd),
                Arc::clone(&cache_wrong),
                Arc::clone(&fired),
            );
            let hook: WriteHook =
                Arc::new(move |file: &File, _: &str, index: u64, _: u64, _: usize| {
                    // Once: a resent block must be able to heal.
                    if index == mid && !fired.swap(true, Ordering::SeqCst) {
                        let took = ssd.fs().wrong_cache_at(file, page_at + 100);
                        wrong.store(took.unwrap_or(false), Ordering::SeqCst);
                    }
                });
            receive.after_write = Some(hook);
        }
        _ => unreachable!("only the Table 2 faults run on the emulated SSD"),
    }
    let opts = SendOptions {
        verify: mode,
        block_size: block as usize,
        streams: 1,
        ..SendOptions::default()
    };
    let report = with_server(&root, receive, IDLE, |addr| {
        send(&[src.to_path_buf()], &addr, &opts, &|_| {})
    });
    let said = Said::from_report(&report, false).claimed_by(fault.claimed_by());
    let named = final_path.exists();
    // The emulator's record of the run itself, before the ground truth's
    // own writes and reads.
    let during: Vec<SsdEvent> = ssd.model().log().to_vec();

    // What an application reads now, through the page cache.
    let through_cache = named && fs::read(&final_path).map_err(io("reading the file"))? == source;
    // New writes turn the buffer over; then what the flash holds.
    ssd.write_filler(3 * buffer)
        .map_err(io("turning the emulator's buffer over"))?;
    let on_flash = named && {
        let f = File::open(&final_path).map_err(io("opening the file"))?;
        if ssd
            .buffered_under(&f, page_at)
            .map_err(io("the emulator's buffer"))?
        {
            return Err(io("the ground truth")(std::io::Error::other(
                "the faulted page is still in the emulator's buffer after 3x its size of filler",
            )));
        }
        ssd.nand_bytes_of(&f)
            .map_err(io("reading the emulator's NAND"))?
            == source
    };

    let mut log: Vec<String> = ssd
        .model()
        .log()
        .iter()
        .map(|e| format!("device page {}: {}", e.page, e.what))
        .collect();
    log.dedup();
    // Injected during the run (not by the ground truth's own writes).
    let fired_as = |what: &str| during.iter().find(|e| e.what == what).map(|e| e.page);
    let (faulted, evidence) = match fault {
        Fault::HostMemory => (
            None,
            "the page cache read back a flipped bit over the device's right byte".to_string(),
        ),
        Fault::SsdBuffer => (
            fired_as("buffered copy corrupted"),
            format!("emulator: {}", log.join(", ")),
        ),
        Fault::SsdMedia => (
            fired_as("programmed corrupted to NAND"),
            format!("emulator: {}", log.join(", ")),
        ),
        _ => unreachable!(),
    };
    // Table 2's misses rest on a premise: the mode's re-read was answered
    // by a good copy (the page cache's, or the SSD buffer's over a bad
    // program). Where the emulator saw this run read the faulted copy
    // itself (a re-read that came late, after the page left the buffer),
    // the mode had the wrong bytes in hand: it must have caught them, and
    // wrong bytes under `device` are then a LIE.
    let read_bad = faulted.is_some()
        && during.iter().any(|e| {
            Some(e.page) == faulted
                && (e.what == "read from NAND"
                    || (fault == Fault::SsdBuffer && e.what == "read from the buffer"))
        });
    let said = if read_bad {
        said.claimed_by(VerifyLevel::Device)
    } else {
        said
    };
    let (outcome, detail) = match fault {
        Fault::HostMemory if !cache_wrong.load(Ordering::SeqCst) => {
            (Outcome::NoEffect, "the injector did not take".into())
        }
        // Proven in place before the run went on: the run must leave
        // right bytes for a reader and on the flash. A mode that evicts
        // (riva, flash) drops the wrong cached copy; one that re-reads
        // through the cache must have seen it and resent the block, else
        // the wrong copy went away by itself (reclaimed): no effect.
        Fault::HostMemory => {
            let (o, d) = judge_after(&said, through_cache && on_flash);
            let evicts = said.level >= Some(VerifyLevel::Device);
            match (o, said.resent) {
                (Outcome::Repaired, 0) if evicts => (
                    o,
                    format!("the wrong cached copy was dropped by the eviction; {d}"),
                ),
                (Outcome::Repaired, 0) => (
                    Outcome::NoEffect,
                    format!("the wrong cached copy was gone without an eviction or a resend: {d}"),
                ),
                (Outcome::Repaired, _) => (
                    o,
                    format!("the re-read saw the wrong copy and the block was resent; {d}"),
                ),
                _ if !through_cache => (
                    o,
                    format!("a reader gets wrong bytes through the page cache; {d}"),
                ),
                _ => (o, d),
            }
        }
        _ => judge_during(&said, faulted.is_some(), on_flash, named),
    };
    let mut expected = fault.table_2(mode);
    let detail = if expected == Some(Outcome::Missed) && read_bad {
        expected = Some(Outcome::Repaired);
        format!("{PREMISE}; {detail}")
    } else {
        detail
    };
    Ok(((outcome, evidence, detail), expected))
}

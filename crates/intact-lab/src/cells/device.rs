//! Faults at the storage devices and in memory: a flipped bit on the
//! destination's device, in a checked buffer, or in the source's cache.

use std::collections::HashSet;
use std::fs::{self, File};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use intact_transfer::{LinkFault, ReceiveOptions, WriteHook};

use super::{Ctx, Verdict, BLOCK};
use crate::judge::{judge_during, Said};
use crate::{io, Fault, LabError};

/// device-write and device-write-extreme: flips on the device under a
/// block after it was written and before it was verified.
pub(crate) fn device_write(ctx: &Ctx) -> Result<Verdict, LabError> {
    let mid = ctx.size.div_ceil(BLOCK).max(1) / 2;
    let extreme = ctx.fault == Fault::DeviceWriteExtreme;
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let fired = Arc::new(AtomicU64::new(0));
    let hook: WriteHook = {
        let (lfs, seen, fired) = (Arc::clone(&ctx.lfs), Arc::clone(&seen), Arc::clone(&fired));
        Arc::new(
            move |file: &File, _: &str, index: u64, offset: u64, len: usize| {
                // Once per block: a resent block must be able to heal.
                if !seen.lock().expect("no panic").insert(index) {
                    return;
                }
                let r = if !extreme {
                    if index != mid {
                        return;
                    }
                    lfs.flip_bit_under(file, offset + len as u64 / 2)
                        .map(|()| 1)
                } else {
                    lfs.flip_every_page_under(file, offset, len as u64)
                };
                if let Ok(n) = r {
                    fired.fetch_add(n, Ordering::SeqCst);
                }
            },
        )
    };
    let receive = ReceiveOptions {
        after_write: Some(hook),
        ..ctx.receive()
    };
    let report = ctx.send(ctx.src, receive, &ctx.opts(ctx.mode));
    let n = fired.load(Ordering::SeqCst);
    let said = Said::from_report(&report, false);
    let named = ctx.final_path.exists();
    let (o, d) = judge_during(&said, n > 0, ctx.truth()?, named);
    Ok((o, format!("{n} page(s) flipped on the device"), d))
}

/// memory: a bit flipped in a received buffer after its digest was checked.
pub(crate) fn memory(ctx: &Ctx) -> Result<Verdict, LabError> {
    let mid = ctx.size.div_ceil(BLOCK).max(1) / 2;
    let fired = Arc::new(AtomicBool::new(false));
    let hook: LinkFault = {
        let fired = Arc::clone(&fired);
        Arc::new(move |_: &str, index: u64, data: &mut [u8]| {
            if index == mid && !fired.swap(true, Ordering::SeqCst) {
                let at = data.len() / 2;
                data[at] ^= 1;
            }
        })
    };
    let receive = ReceiveOptions {
        after_check: Some(hook),
        ..ctx.receive()
    };
    let report = ctx.send(ctx.src, receive, &ctx.opts(ctx.mode));
    let said = Said::from_report(&report, false);
    let named = ctx.final_path.exists();
    let (o, d) = judge_during(&said, fired.load(Ordering::SeqCst), ctx.truth()?, named);
    Ok((o, "1 bit flipped in a checked buffer".into(), d))
}

/// Puts a copy of the source on the loop file system whose page cache holds
/// a flipped bit at `size / 2` while its device holds the right bytes;
/// returns its path and whether the cache was read back wrong. The copy's
/// cache must be empty when this starts (a fresh file evicted, or a remount).
pub(crate) fn wrong_source_cache(
    ctx: &Ctx,
    evict_first: bool,
) -> Result<(std::path::PathBuf, bool), LabError> {
    let sdir = ctx.lfs.mnt().join("src");
    let lsrc = sdir.join("data.bin");
    let size = ctx.size;
    let at = size / 2;
    if evict_first {
        fs::create_dir_all(&sdir).map_err(io("source dir"))?;
        fs::copy(ctx.src, &lsrc).map_err(io("copying the source"))?;
    }
    let f = File::open(&lsrc).map_err(io("opening the source"))?;
    let cold = if evict_first {
        intact_cache::evict(&f, 0, size)
            .map_err(|e| io("evict")(e.into()))?
            .resident
            == 0
    } else {
        intact_cache::resident(&f, 0, size).map_err(|e| io("mincore")(e.into()))? == 0
    };
    let wrong = ctx
        .lfs
        .wrong_cache_at(&f, at)
        .map_err(io("making the source's cache wrong"))?;
    Ok((lsrc, cold && wrong))
}

/// source-read: the source's cache wrong, its device right.
pub(crate) fn source_read(ctx: &Ctx) -> Result<Verdict, LabError> {
    let (lsrc, injected) = wrong_source_cache(ctx, true)?;
    let report = ctx.send(&lsrc, ctx.receive(), &ctx.opts(ctx.mode));
    let said = Said::from_report(&report, false);
    let named = ctx.final_path.exists();
    let (o, d) = judge_during(&said, injected, ctx.truth()?, named);
    Ok((
        o,
        "the source cache holds a flipped bit, its device does not".into(),
        d,
    ))
}

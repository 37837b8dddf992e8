//! The cells that judge the level a run reports, where the tool has a
//! reason to believe bytes it did not check: blocks it holds from an
//! earlier run, a file it holds whole, a read path the file system does
//! not honour. Each fault is put in place and proven (the device read with
//! `O_DIRECT`, or the cache read back wrong) before the judged run, which
//! is then judged by [`judge_after`]: "repaired" means that run succeeded
//! and the device, after a remount, holds the source's bytes.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::os::unix::fs::FileExt;

use intact_faults::{FlipProxy, ProxyFault};
use intact_transfer::{partial_name, send, Journal, ReadPath, VerifyLevel, VerifyMode};

use super::{Ctx, Verdict, BLOCK};
use crate::judge::{judge_after, Said};
use crate::server::{with_server, IDLE};
use crate::{io, LabError, Outcome};

/// The source's byte at `at`.
fn source_byte(ctx: &Ctx, at: u64) -> Result<u8, LabError> {
    let mut b = [0u8; 1];
    File::open(ctx.src)
        .and_then(|f| f.read_exact_at(&mut b, at))
        .map_err(io("reading the source"))?;
    Ok(b[0])
}

/// Flips the device under `path` at `at` and proves it: the device then
/// differs from the source there. Returns the evidence, and whether the
/// page cache still serves the source's byte (the good copy that hides
/// the damage from any check that reads through it).
fn damage(ctx: &Ctx, path: &std::path::Path, at: u64) -> Result<(bool, bool), LabError> {
    let want = source_byte(ctx, at)?;
    let f = File::open(path).map_err(io("opening the file to damage"))?;
    ctx.lfs
        .flip_bit_under(&f, at)
        .map_err(io("flipping the device"))?;
    let on_device = ctx
        .lfs
        .device_byte_under(&f, at)
        .map_err(io("reading the device"))?;
    let mut cached = [0u8; 1];
    f.read_exact_at(&mut cached, at).map_err(io("read"))?;
    Ok((on_device != want, cached[0] == want))
}

/// The block size for held-block-resume: about a quarter of the file
/// (a power of two between 64 KiB and intact's 4 MiB), so that even a
/// 1 MiB file has blocks to hold when the send is cut.
fn held_block_size(size: u64) -> u64 {
    let quarter = (size / 4).max(1);
    let pow2 = 1u64 << (63 - quarter.leading_zeros());
    pow2.clamp(64 << 10, BLOCK)
}

/// held-block-resume: a `fiver` send cut three quarters of the way, with
/// blocks journaled; a bit flipped on the device under block 0 of the
/// partial file (the cache keeps the good copy); the send resumed in the
/// cell's mode. A resume that trusts the held block and reports `device`
/// is a LIE.
pub(crate) fn held_block_resume(ctx: &Ctx) -> Result<Verdict, LabError> {
    let bs = held_block_size(ctx.size);
    let opts = |mode| intact_transfer::SendOptions {
        block_size: bs as usize,
        ..ctx.opts(mode)
    };
    let cut = 4096 + ctx.size / 4 * 3;
    let (first, hit) = with_server(&ctx.root, ctx.receive(), IDLE, |addr| {
        let proxy = FlipProxy::start(addr, ProxyFault::CutAfter(cut)).expect("proxy on loopback");
        let r = send(
            &[ctx.src.to_path_buf()],
            &proxy.addr(),
            &opts(VerifyMode::Fiver),
            &|_| {},
        );
        (r, proxy.cut())
    });
    let first = Said::from_report(&first, false);
    if hit == 0 || first.ok {
        return Ok((
            Outcome::NoEffect,
            "the fiver send was not cut".into(),
            first.summary(),
        ));
    }
    let held = {
        let journal = Journal::open(&ctx.root)?;
        match journal.lookup(b"data.bin")? {
            Some(row) if !row.done => journal.blocks(row.id)?,
            _ => Vec::new(),
        }
    };
    let partial = ctx.root.join(partial_name(OsStr::new("data.bin")));
    if !held.iter().any(|b| b.index == 0) || !partial.exists() {
        return Ok((
            Outcome::NoEffect,
            format!(
                "the cut left block 0 unjournaled ({} of {} blocks held)",
                held.len(),
                ctx.size.div_ceil(bs)
            ),
            first.summary(),
        ));
    }
    let (damaged, cache_good) = damage(ctx, &partial, bs / 2)?;
    if !damaged {
        return Ok((
            Outcome::NoEffect,
            "the flip under block 0 did not reach the device".into(),
            String::new(),
        ));
    }
    let evidence = format!(
        "fiver cut after {cut} bytes, {} of {} blocks journaled; device flipped under block 0 of the partial file{}",
        held.len(),
        ctx.size.div_ceil(bs),
        if cache_good { " (cache kept the good copy)" } else { "" }
    );
    let second = ctx.send(ctx.src, ctx.receive(), &opts(ctx.mode));
    let said = Said::from_report(&second, false);
    let (o, d) = judge_after(&said, ctx.truth()?);
    Ok((o, evidence, format!("resumed in {}: {d}", ctx.mode)))
}

/// unchanged-damaged: a file sent whole in `fiver`, the device flipped
/// under it (the cache keeps the good copy), then sent again in the cell's
/// mode; riva asks `--require-level device`. Reporting it `unchanged` at a
/// level this run never checked, with exit 0, is a LIE under riva.
pub(crate) fn unchanged_damaged(ctx: &Ctx) -> Result<Verdict, LabError> {
    let first = ctx.send(ctx.src, ctx.receive(), &ctx.opts(VerifyMode::Fiver));
    let first = Said::from_report(&first, false);
    if !first.ok || !ctx.final_path.exists() {
        return Ok((
            Outcome::NoEffect,
            "the first (fiver) send did not complete".into(),
            first.summary(),
        ));
    }
    let (damaged, cache_good) = damage(ctx, &ctx.final_path, ctx.size / 2)?;
    if !damaged {
        return Ok((
            Outcome::NoEffect,
            "the flip under the final file did not reach the device".into(),
            String::new(),
        ));
    }
    let evidence = format!(
        "sent whole in fiver ({}); device flipped under the final file{}",
        first.summary(),
        if cache_good {
            " (cache kept the good copy)"
        } else {
            ""
        }
    );
    let riva = ctx.mode == VerifyMode::Riva;
    let opts = intact_transfer::SendOptions {
        require_level: match ctx.mode {
            VerifyMode::Riva => Some(VerifyLevel::Device),
            VerifyMode::Flash => Some(VerifyLevel::Media),
            _ => None,
        },
        ..ctx.opts(ctx.mode)
    };
    let second = ctx.send(ctx.src, ctx.receive(), &opts);
    let said = Said::from_report(&second, riva || ctx.mode == VerifyMode::Flash);
    let (o, d) = judge_after(&said, ctx.truth()?);
    Ok((o, evidence, format!("sent again in {}: {d}", ctx.mode)))
}

/// direct-data-journal: the source on an ext4 mounted `data=journal`
/// (where ext4 serves `O_DIRECT` through the page cache), its cache wrong
/// and its device right, sent with `--read-path direct`.
pub(crate) fn direct_data_journal(ctx: &Ctx) -> Result<Verdict, LabError> {
    let sdir = ctx.lfs.mnt().join("src");
    fs::create_dir_all(&sdir).map_err(io("source dir"))?;
    fs::copy(ctx.src, sdir.join("data.bin")).map_err(io("copying the source"))?;
    // data=journal holds fresh data in the journal and its pages dirty
    // until a checkpoint: a remount puts it in place and empties the cache,
    // so the flip under the file lands where reads will find it.
    ctx.lfs.remount().map_err(io("remounting"))?;
    let (lsrc, injected) = super::device::wrong_source_cache(ctx, false)?;
    if !injected {
        return Ok((
            Outcome::NoEffect,
            "the source's cache could not be made wrong".into(),
            String::new(),
        ));
    }
    let opts = intact_transfer::SendOptions {
        read_path: ReadPath::Direct,
        ..ctx.opts(ctx.mode)
    };
    let report = ctx.send(&lsrc, ctx.receive(), &opts);
    let said = Said::from_report(&report, false);
    let (o, d) = judge_after(&said, ctx.truth()?);
    Ok((
        o,
        "data=journal; the source cache holds a flipped bit, its device does not; --read-path direct".into(),
        d,
    ))
}

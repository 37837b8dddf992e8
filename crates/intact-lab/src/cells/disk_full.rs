//! disk-full: the destination fills up, space is freed, the send again.

use std::fs::{self, File};
use std::path::Path;

use super::{Ctx, Verdict};
use crate::judge::Said;
use crate::{io, LabError, Outcome};

pub(crate) fn disk_full(ctx: &Ctx) -> Result<Verdict, LabError> {
    fs::create_dir_all(&ctx.root).map_err(io("root"))?;
    // Leave room for half the file.
    let filler = ctx.lfs.mnt().join("filler");
    let free = free_bytes(ctx.lfs.mnt())?;
    let fill = free.saturating_sub(ctx.size / 2);
    let f = File::create(&filler).map_err(io("filler"))?;
    // SAFETY: plain syscall on a valid fd.
    let r = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, fill as i64) };
    if r != 0 {
        return Err(io("fallocate")(std::io::Error::last_os_error()));
    }
    drop(f);
    let first = ctx.send(ctx.src, ctx.receive(), &ctx.opts(ctx.mode));
    let said = Said::from_report(&first, false);
    let named = ctx.final_path.exists();
    fs::remove_file(&filler).map_err(io("removing the filler"))?;
    if said.ok {
        return Ok((Outcome::NoEffect, "the disk did not fill".into(), said.why));
    }
    if named {
        return Ok((
            Outcome::Missed,
            "a file got its final name on a full disk".into(),
            said.why,
        ));
    }
    ctx.resume(format!("first run failed: {}", said.why))
}

fn free_bytes(path: &Path) -> Result<u64, LabError> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("no NUL");
    // SAFETY: statvfs fills the zeroed struct we own.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io("statvfs")(std::io::Error::last_os_error()));
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

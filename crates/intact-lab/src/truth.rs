//! Ground truth, read without the tool under test's own eviction: the loop
//! file system is unmounted and mounted again (which writes everything
//! back and leaves none of its pages cached), then the file is compared
//! with the source.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use intact_faults::LoopFs;

use crate::{io, LabError};

/// Whether the device under `dest` (on `lfs`) holds the bytes of `src`.
/// Remounts `lfs` first, so every file on it must be closed; a missing
/// `dest` is "no".
pub(crate) fn device_equals(lfs: &LoopFs, dest: &Path, src: &Path) -> Result<bool, LabError> {
    if !dest.exists() {
        return Ok(false);
    }
    lfs.remount()
        .map_err(io("remounting the loop file system for the ground truth"))?;
    let Ok(mut d) = File::open(dest) else {
        return Ok(false);
    };
    let len = d.metadata().map_err(io("stat"))?.len();
    // Belt and braces: a remount that left pages behind would not be one.
    let cached = intact_cache::resident(&d, 0, len).map_err(|e| io("mincore")(e.into()))?;
    if cached != 0 {
        return Err(LabError::Io {
            what: format!(
                "{cached} pages of {} cached after a remount",
                dest.display()
            ),
            source: std::io::Error::other("cannot read the device"),
        });
    }
    let mut s = File::open(src).map_err(io("opening the source"))?;
    if s.metadata().map_err(io("stat"))?.len() != len {
        return Ok(false);
    }
    let (mut a, mut b) = (vec![0u8; 4 << 20], vec![0u8; 4 << 20]);
    loop {
        let n = d.read(&mut a).map_err(io("reading the destination"))?;
        if n == 0 {
            return Ok(true);
        }
        s.read_exact(&mut b[..n])
            .map_err(io("reading the source"))?;
        if a[..n] != b[..n] {
            return Ok(false);
        }
    }
}

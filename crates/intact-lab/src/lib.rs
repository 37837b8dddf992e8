//! intact's fault lab: every fault against every verification mode, with
//! ground truth from outside the tool under test.
//!
//! [`run_matrix`] runs each [`Fault`] × mode × size as one [`Cell`]: it
//! builds a fresh loop-mounted ext4 (intact-faults; for Kim et al.'s
//! Table 2 faults, an ext4 on the emulated SSD), transfers with
//! `intact send` into a server in this process (so that fault hooks can sit
//! in its receiver) or, for crashes, with the real `intact` binary, then
//! remounts the loop file system (so that nothing of it is cached) and
//! compares what the device holds with the source. Each cell ends in an
//! [`Outcome`]; a cell whose fault left no trace is [`Outcome::NoEffect`],
//! so an injector that silently does nothing cannot pass, and a run that
//! reported a level its bytes did not reach is [`Outcome::Lie`].
//!
//! Modules: [`Fault`] (fault), cells and outcomes (matrix), the ground
//! truth (truth), from a run's report to an outcome (judge), the
//! in-process server (server), and one module per family of cells (cells).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

mod cells;
mod fault;
mod judge;
mod matrix;
mod quiet;
mod server;
mod truth;

pub use cells::{ssd_block, ssd_window, PREMISE};
pub use fault::Fault;
pub use matrix::{size_name, Cell, Matrix, MatrixConfig, Outcome};

/// What went wrong in the lab itself (not in the tool under test).
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A system call or command failed.
    #[error("{what}: {source}")]
    Io {
        /// What the lab was doing.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The transfer engine refused to run at all.
    #[error(transparent)]
    Transfer(#[from] intact_transfer::TransferError),
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LabError {
    let what = what.into();
    move |source| LabError::Io { what, source }
}

fn ram_bytes() -> u64 {
    // SAFETY: sysconf has no memory arguments.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages.max(0) as u64) * (size.max(0) as u64)
}

/// Runs the matrix; `progress` sees each cell as it ends.
pub fn run_matrix(cfg: &MatrixConfig, progress: &dyn Fn(&Cell)) -> Result<Matrix, LabError> {
    fs::create_dir_all(&cfg.dir).map_err(io("making the work directory"))?;
    let mut m = Matrix {
        cells: Vec::new(),
        ram_bytes: ram_bytes(),
        negative_control: cfg.negative_control,
        skipped: Vec::new(),
        leftover_loops: Vec::new(),
        leftover_mounts: Vec::new(),
    };
    if let Err(why) = intact_faults::usable() {
        m.skipped.push(format!("every cell: {why}"));
        return Ok(m);
    }
    let ssd = intact_faults::ssd_usable();
    for &size in &cfg.sizes {
        let src = source_file(&cfg.dir, size)?;
        for &fault in &cfg.faults {
            for &mode in &cfg.modes {
                let intact = cfg.intact.as_deref().unwrap_or(Path::new(""));
                if fault.needs_binary() && cfg.intact.is_none() {
                    m.skipped
                        .push(format!("{}: no intact binary given", fault.name()));
                    continue;
                }
                if let (true, Err(why)) = (fault.on_ssd(), &ssd) {
                    m.skipped.push(format!("{}: {why}", fault.name()));
                    continue;
                }
                let mut attempt = 1;
                let mut cell = loop {
                    let before = quiet::cache_drops();
                    let t = Instant::now();
                    let mut cell = cells::run_cell(cfg, fault, mode, size, &src, intact)?;
                    cell.seconds = t.elapsed().as_secs_f64();
                    cell.reruns = attempt - 1;
                    if !fault.cache_sensitive() || quiet::cache_drops() == before {
                        break cell;
                    }
                    if attempt == quiet::ATTEMPTS {
                        m.skipped.push(format!(
                            "{}: the machine's caches were dropped (drop_caches) during each of {attempt} attempts",
                            cell.label()
                        ));
                        break cell;
                    }
                    attempt += 1;
                };
                if cell.reruns > 0 {
                    cell.detail += &format!(
                        " [run {} times: a global drop_caches disturbed the earlier runs]",
                        cell.reruns + 1
                    );
                }
                progress(&cell);
                m.cells.push(cell);
            }
        }
    }
    m.skipped.dedup();
    m.leftover_loops = intact_faults::loop_devices_of(&cfg.dir);
    m.leftover_mounts = intact_faults::mounts_under(&cfg.dir)
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    Ok(m)
}

/// The source file of `size` bytes (made once, kept for later runs).
fn source_file(dir: &Path, size: u64) -> Result<PathBuf, LabError> {
    let path = dir.join(format!("src-{size}")).join("data.bin");
    if fs::metadata(&path).is_ok_and(|m| m.len() == size) {
        return Ok(path);
    }
    fs::create_dir_all(path.parent().expect("has a parent")).map_err(io("source dir"))?;
    let mut stream = intact_sample::SampleBytes::new(size ^ 0x1a5);
    intact_sample::write_file(&path, size, &mut stream).map_err(io("making the source"))?;
    Ok(path)
}

//! `--warm`: the source stays in the page cache (every file is read
//! through before each run and the cache is never dropped), the
//! destination is ext4 (--dir on the disk, or --ram-ext4), and intact runs
//! with `--verify none`, so what is left is each tool's own per-file cost:
//! files per second for intact copy, intact send, cp -r and rsync -a,
//! interleaved like the cold runs. Each run still ends with `sync`, so the
//! tools that do not fsync pay for their writeback as intact pays for its
//! fsyncs.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use super::datasets::{walk_files, Shape};
use super::measure;
use super::table::{render, Baseline, Style, Work};
use super::tools::{self, Paths};

/// The warm table's ratio columns.
const BASELINES: [Baseline; 2] = [
    Baseline {
        label: "cp -r",
        prefix: "cp -r",
    },
    Baseline {
        label: "rsync -a",
        prefix: "rsync -a",
    },
];

/// Runs and prints one dataset's warm table.
pub(super) fn run_dataset(
    p: Paths<'_>,
    shape: &Shape,
    runs: usize,
    storage: &str,
) -> anyhow::Result<()> {
    let tools = tools::warm(p);
    let mut coldest = Residency::default();
    let rows = measure(&tools, runs, shape, p.dst, || {
        let r = read_through(p.src)?;
        if coldest.total == 0 || r.fraction() < coldest.fraction() {
            coldest = r;
        }
        Ok(())
    })?;
    println!(
        "\n{} (warm): {}, {:.0} MiB; source in the page cache, destination on {storage}; intact with --verify none\n",
        shape.name,
        shape.describe(),
        shape.bytes() as f64 / (1u64 << 20) as f64
    );
    print!(
        "{}",
        render(&rows, &Work::of(shape), &BASELINES, Style::Warm)
    );
    println!(
        "\nsource pages in the page cache at the start of a run, fewest seen: {} of {} ({:.1} %).",
        coldest.resident,
        coldest.total,
        coldest.fraction() * 100.0
    );
    Ok(())
}

/// Pages of a tree in the page cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Residency {
    pub resident: u64,
    pub total: u64,
}

impl Residency {
    fn fraction(self) -> f64 {
        if self.total == 0 {
            1.0
        } else {
            self.resident as f64 / self.total as f64
        }
    }
}

/// Reads every regular file under `dir` to its end (so that it is in the
/// page cache), then counts how many of its pages are resident.
pub(super) fn read_through(dir: &Path) -> anyhow::Result<Residency> {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    let mut buf = vec![0u8; 1 << 20];
    let mut r = Residency::default();
    walk_files(dir, |path, _| {
        let mut f = File::open(path)?;
        let mut len = 0u64;
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            len += n as u64;
        }
        r.total += len.div_ceil(page);
        r.resident += intact_cache::resident(&f, 0, len)?;
        Ok(())
    })?;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::super::datasets::{Group, Unit};
    use super::*;

    #[test]
    fn read_through_reads_every_page_of_the_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let shape = Shape {
            name: "t",
            unit: Unit::KiloFiles,
            groups: vec![Group {
                dir: "x/y",
                files: 5,
                size: 10_000,
                dirs: 2,
            }],
        };
        let src = tmp.path().join("data");
        shape.make(&src).unwrap();
        let r = read_through(&src).unwrap();
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
        assert_eq!(r.total, 5 * 10_000u64.div_ceil(page));
        // Residency is the kernel's to decide (a tmpfs or a busy machine
        // may differ), so only its bounds are asserted.
        assert!(r.resident <= r.total);
        assert!((0.0..=1.0).contains(&r.fraction()));
    }
}

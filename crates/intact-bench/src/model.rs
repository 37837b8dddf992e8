//! `intact-bench model`: does the RIVA model (the paper's Eq. 1) predict
//! a riva run from stage times measured *elsewhere*?
//!
//! The model intact prints after a riva run is fed with that run's own
//! stage times, and for `send` the transfer stage includes the sender
//! blocked on the socket while the receiver's verifier is behind, so
//! n · t_t is close to the total by construction. Here every input comes
//! from a separate run with no verifier to wait for:
//!
//! - t_t, the transfer stage: a `--verify none` send (transfer only), and,
//!   as a second variant, a `--verify fiver` send (the same plus the block
//!   and file digests at both ends that riva computes too, without any
//!   re-read). t_t = total / n, n = blocks per stream.
//! - t_c and t_e, the checksum and eviction stages: a pass over the tree
//!   the `none` run just wrote that does what riva's verifier does per
//!   block and nothing else (flush, evict and confirm the residency, read
//!   back, XXH3-128; batches of up to 8 MiB; one thread per stream, files
//!   handed out in order), timing eviction and read + hash apart.
//!
//! Then riva runs, interleaved with the others, and the prediction
//! n · max(t_t, t_c) + min(t_t, t_c) + t_e is compared with its time.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::Context;
use intact_cache::{DeviceReader, Prepared, ReadPath};
use intact_digest::{defaults, hash, AlignedBuf};

use crate::loop_ext4::LoopExt4;
use crate::runner::{command_line, interleaved, median, stop_on_signals, Spread};
use crate::transfer::{drop_caches, fresh, make_dataset};
use crate::verify::{datasets, send_once};

const MIB: u64 = 1 << 20;

/// intact send's default streams and block size (the runs use defaults).
const STREAMS: u64 = 4;
const BLOCK: u64 = defaults::BLOCK_BYTES as u64;

/// Bytes of blocks the verifier takes as one batch at most.
const BATCH_BYTES: usize = 8 << 20;

#[derive(clap::Args)]
pub struct ModelArgs {
    /// Directory for datasets and destinations (on a real disk, not tmpfs).
    #[arg(long, default_value = "/var/tmp/intact-bench")]
    dir: PathBuf,
    /// Rounds; each runs none (+ the verify pass), fiver and riva, in
    /// alternating order.
    #[arg(long, default_value_t = 7)]
    runs: usize,
    /// Scale of the datasets (as `verify`): 1.0 = one 4 GiB file,
    /// 2000 × 1 MiB, 20,000 × 16 KiB, 4 × 256 MiB + 2000 × 64 KiB.
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Only these datasets (large, medium, small, mixed).
    #[arg(long, value_delimiter = ',')]
    datasets: Vec<String>,
    /// Measure on a RAM-backed ext4 (a loop device over a file in
    /// /dev/shm, made and removed by this run) instead of --dir.
    #[arg(long)]
    ram_ext4: bool,
}

/// What one run of a round measured.
enum Run {
    /// `none`'s seconds and the verify pass over its output.
    None(f64, Pass),
    Fiver(f64),
    /// riva's seconds and the model intact printed from the run itself.
    Riva(f64, Option<f64>),
}

pub fn run(a: &ModelArgs) -> anyhow::Result<()> {
    stop_on_signals();
    let intact = crate::runner::intact_binary()?;
    let chosen: Vec<_> = datasets(a.scale)
        .into_iter()
        .filter(|(n, _)| a.datasets.is_empty() || a.datasets.iter().any(|d| d == n))
        .collect();
    let ram = if a.ram_ext4 {
        let bytes: u64 = chosen
            .iter()
            .flat_map(|(_, p)| p.iter().map(|d| d.files * d.file_size))
            .sum();
        let files: u64 = chosen
            .iter()
            .flat_map(|(_, p)| p.iter().map(|d| d.files))
            .sum();
        let largest = chosen
            .iter()
            .map(|(_, p)| p.iter().map(|d| d.files * d.file_size).sum::<u64>())
            .max()
            .unwrap_or(0);
        Some(LoopExt4::in_ram(
            (bytes + largest) / MIB + files * 2 * 8 / 1024 + 512,
        )?)
    } else {
        None
    };
    let dir = ram
        .as_ref()
        .map_or(a.dir.clone(), |r| r.mount.join("bench"));
    let storage = match &ram {
        Some(_) => "a RAM-backed ext4 (loop device over /dev/shm)".to_string(),
        None => format!("the disk ({})", a.dir.display()),
    };
    std::fs::create_dir_all(&dir)?;
    drop_caches();
    println!(
        "intact-bench model: loopback, on {storage}, scale {}, {} rounds of none (+ verify pass), fiver, riva in alternating order; page cache dropped before each run; each run ends with sync",
        a.scale, a.runs
    );
    let mut rows = Vec::new();
    for (name, parts) in &chosen {
        let src = dir.join(format!("verify-src-{name}")).join("data");
        let (mut blocks, mut files) = (0, 0);
        for p in parts {
            let at = if parts.len() == 1 {
                src.clone()
            } else {
                src.join(p.name)
            };
            make_dataset(&at, p)?;
            blocks += p.files * p.file_size.div_ceil(BLOCK);
            files += p.files;
        }
        let streams = STREAMS.clamp(1, files.max(1));
        let n = blocks.div_ceil(streams) as f64;
        let dst = dir.join("model-dst");
        let runs = interleaved(3, a.runs, |i| -> anyhow::Result<Run> {
            fresh(&dst)?;
            drop_caches();
            let what = format!("{name} run {i}");
            Ok(match i {
                0 => {
                    let (t, _) = send_once(&intact, &src, &dst, "none", None).context(what)?;
                    let pass = verify_pass(&dst, streams as usize)?;
                    Run::None(t, pass)
                }
                1 => Run::Fiver(
                    send_once(&intact, &src, &dst, "fiver", None)
                        .context(what)?
                        .0,
                ),
                _ => {
                    let (t, own) = send_once(&intact, &src, &dst, "riva", None).context(what)?;
                    Run::Riva(t, own.map(|m| m.0))
                }
            })
        })?;
        fresh(&dst)?;
        let (mut none, mut fiver, mut riva, mut own) = (vec![], vec![], vec![], vec![]);
        let (mut tc, mut te, mut pass_wall, mut device) = (vec![], vec![], vec![], vec![]);
        for r in runs.into_iter().flatten() {
            match r {
                Run::None(t, p) => {
                    none.push(t);
                    tc.push(p.read_hash / p.blocks as f64);
                    te.push(p.evict / p.blocks as f64);
                    pass_wall.push(p.wall);
                    device.push(p.device as f64 / p.blocks as f64);
                }
                Run::Fiver(t) => fiver.push(t),
                Run::Riva(t, m) => {
                    riva.push(t);
                    own.extend(m);
                }
            }
        }
        let tc = median(tc);
        let te = median(te);
        let eq1 = |total: f64| {
            let tt = total / n;
            n * tt.max(tc) + tt.min(tc) + te
        };
        rows.push(Row {
            name: name.to_string(),
            files,
            mib: parts.iter().map(|d| d.files * d.file_size).sum::<u64>() / MIB,
            n,
            none: median(none.clone()),
            fiver: median(fiver.clone()),
            pass_wall: median(pass_wall),
            ntc: n * tc,
            nte: n * te,
            device: median(device),
            pred_none: eq1(median(none.clone())),
            pred_fiver: eq1(median(fiver)),
            serial: median(none) + n * (tc + te),
            riva: Spread::of(&riva),
            own: (!own.is_empty()).then(|| median(own)),
        });
    }
    print_rows(&rows, &storage);
    println!("\ncommand: {}", command_line());
    Ok(())
}

struct Row {
    name: String,
    files: u64,
    mib: u64,
    n: f64,
    none: f64,
    fiver: f64,
    pass_wall: f64,
    ntc: f64,
    nte: f64,
    device: f64,
    pred_none: f64,
    pred_fiver: f64,
    serial: f64,
    riva: Spread,
    own: Option<f64>,
}

fn print_rows(rows: &[Row], storage: &str) {
    println!("\nStage times from separate runs (medians, seconds), on {storage}:\n");
    println!("| dataset | blocks per stream (n) | none | fiver | verify pass (wall) | n·t_c | n·t_e | blocks read from the device |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} ({} files, {} MiB) | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.3} | {:.0}% |",
            r.name,
            r.files,
            r.mib,
            r.n,
            r.none,
            r.fiver,
            r.pass_wall,
            r.ntc,
            r.nte,
            100.0 * r.device
        );
    }
    println!("\nPrediction (Eq. 1) against riva measured in the same rounds; error = (predicted − measured) / measured, |error| is Eq. 2:\n");
    println!("| dataset | riva measured s (min / median / max) | Eq. 1, t_t from none | error | Eq. 1, t_t from fiver | error | no overlap (none + n·(t_c + t_e)) | error | riva's own model (same run, circular) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let m = r.riva.median;
        let err = |p: f64| format!("{:+.1}%", 100.0 * (p - m) / m);
        println!(
            "| {} | {} | {:.2} | {} | {:.2} | {} | {:.2} | {} | {} |",
            r.name,
            r.riva,
            r.pred_none,
            err(r.pred_none),
            r.pred_fiver,
            err(r.pred_fiver),
            r.serial,
            err(r.serial),
            r.own.map_or("–".into(), |o| format!("{o:.2} ({})", err(o))),
        );
    }
}

/// What the verify pass measured.
struct Pass {
    /// Seconds, all threads summed: eviction (flush, drop, residency count).
    evict: f64,
    /// Seconds, all threads summed: read back and hash.
    read_hash: f64,
    blocks: u64,
    /// Blocks whose read came from the device (eviction confirmed).
    device: u64,
    wall: f64,
}

/// Riva's verifier, alone, over the files under `root` (the server's
/// state directory left out): `threads` threads take files in order.
fn verify_pass(root: &Path, threads: usize) -> anyhow::Result<Pass> {
    let mut files = Vec::new();
    walk(root, &mut files)?;
    let next = AtomicUsize::new(0);
    let t = Instant::now();
    let parts = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.max(1))
            .map(|_| s.spawn(|| verifier(&files, &next)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("verify pass thread"))
            .collect::<Vec<_>>()
    });
    let wall = t.elapsed().as_secs_f64();
    let mut p = Pass {
        evict: 0.0,
        read_hash: 0.0,
        blocks: 0,
        device: 0,
        wall,
    };
    for q in parts {
        let q = q?;
        p.evict += q.evict;
        p.read_hash += q.read_hash;
        p.blocks += q.blocks;
        p.device += q.device;
    }
    anyhow::ensure!(p.blocks > 0, "nothing to verify under {}", root.display());
    Ok(p)
}

/// One verifier thread: blocks of the files it takes, in batches of up to
/// 8 MiB as riva's verifier takes them (writeback started for the whole
/// batch, then each block evicted and its read-back requested, then each
/// read and hashed).
fn verifier(files: &[PathBuf], next: &AtomicUsize) -> anyhow::Result<Pass> {
    let mut p = Pass {
        evict: 0.0,
        read_hash: 0.0,
        blocks: 0,
        device: 0,
        wall: 0.0,
    };
    let mut buf = AlignedBuf::new(BLOCK as usize);
    let mut open: Vec<(File, DeviceReader)> = Vec::new();
    let mut batch: Vec<(usize, u64, usize)> = Vec::new();
    let mut bytes = 0;
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(path) = files.get(i) else { break };
        let f = File::open(path)?;
        let size = f.metadata()?.len();
        let r = DeviceReader::new(&f, ReadPath::Evict)?;
        open.push((f, r));
        let mut slot = open.len() - 1;
        let mut off = 0;
        while off < size {
            let len = (size - off).min(BLOCK) as usize;
            batch.push((slot, off, len));
            bytes += len;
            off += len as u64;
            if bytes >= BATCH_BYTES {
                check_batch(&mut open, &batch, &mut buf, &mut p)?;
                batch.clear();
                bytes = 0;
                // Only the current file can have blocks left.
                let current = open.pop().expect("the current file");
                open.clear();
                if off < size {
                    open.push(current);
                    slot = 0;
                }
            }
        }
    }
    if !batch.is_empty() {
        check_batch(&mut open, &batch, &mut buf, &mut p)?;
    }
    Ok(p)
}

fn check_batch(
    open: &mut [(File, DeviceReader)],
    batch: &[(usize, u64, usize)],
    buf: &mut AlignedBuf,
    p: &mut Pass,
) -> anyhow::Result<()> {
    for &(slot, off, len) in batch {
        let (f, r) = &open[slot];
        r.begin(f, off, len);
    }
    let mut prepared: Vec<Prepared> = Vec::with_capacity(batch.len());
    for &(slot, off, len) in batch {
        let t = Instant::now();
        let (f, r) = &mut open[slot];
        prepared.push(r.evict_then_prefetch(f, off, len)?);
        p.evict += t.elapsed().as_secs_f64();
    }
    for (&(slot, off, len), prep) in batch.iter().zip(prepared) {
        let t = Instant::now();
        let (f, r) = &mut open[slot];
        let outcome = r.finish(f, off, len, buf, prep)?;
        std::hint::black_box(hash(defaults::BLOCK_ALGORITHM, &buf[..len]));
        p.read_hash += t.elapsed().as_secs_f64();
        p.blocks += 1;
        p.device += u64::from(outcome.device);
    }
    Ok(())
}

/// Regular files under `p`, in name order, the server's `.intact` state
/// directory left out.
fn walk(p: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(p)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for e in entries {
        let meta = std::fs::symlink_metadata(&e)?;
        if meta.is_dir() && e.file_name().is_some_and(|n| n != ".intact") {
            walk(&e, out)?;
        } else if meta.is_file() {
            out.push(e);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verify_pass_reads_every_block_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut stream = intact_sample::SampleBytes::new(1);
        std::fs::create_dir_all(dir.path().join("a/.intact")).unwrap();
        std::fs::create_dir_all(dir.path().join(".intact")).unwrap();
        intact_sample::write_file(&dir.path().join(".intact/j"), 1000, &mut stream).unwrap();
        // 9 MiB + 1: three blocks; twenty 16 KiB files: one each.
        intact_sample::write_file(&dir.path().join("a/big"), (9 << 20) + 1, &mut stream).unwrap();
        for i in 0..20 {
            let p = dir.path().join(format!("a/s{i}"));
            intact_sample::write_file(&p, 16 << 10, &mut stream).unwrap();
        }
        for threads in [1, 4] {
            let p = verify_pass(dir.path(), threads).unwrap();
            assert_eq!(p.blocks, 23, "{threads} threads");
        }
    }
}

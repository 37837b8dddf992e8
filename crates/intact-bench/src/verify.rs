//! `intact-bench verify`: the cost of every verification mode, on the
//! transfer benchmark's datasets plus a mixed one, in two regimes:
//! loopback at full speed (the disk is the bottleneck) and a 1 Gbit/s
//! link between two network namespaces joined by a veth pair and shaped
//! with tc (the network is the bottleneck; the RIVA paper's HPCLab-WS).
//! Overheads are against `none` and against `fiver` (the paper's Eq. 3);
//! for riva the run's own model (Eq. 1, circular: see `model`) is shown.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context};

use crate::netns::Netns;
use crate::runner::{command_line, intact_binary, interleaved, median, stop_on_signals};
use crate::transfer::{drop_caches, fresh, make_dataset, run_cmd, start_server, Dataset};

const MIB: u64 = 1 << 20;
const MODES: [&str; 6] = ["none", "sequential", "file", "block", "fiver", "riva"];

#[derive(clap::Args)]
pub struct VerifyArgs {
    /// Directory for datasets and destinations (on a real disk, not tmpfs).
    #[arg(long, default_value = "/var/tmp/intact-bench")]
    dir: PathBuf,
    /// Runs per mode, interleaved in alternating order (the median is reported).
    #[arg(long, default_value_t = 7)]
    runs: usize,
    /// Scale of the datasets: 1.0 = one 4 GiB file, 2000 × 1 MiB,
    /// 20,000 × 16 KiB, and mixed = 4 × 256 MiB + 2000 × 64 KiB.
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Only these datasets (large, medium, small, mixed).
    #[arg(long, value_delimiter = ',')]
    datasets: Vec<String>,
    /// Only these regimes (loopback, 1gbit).
    #[arg(long, value_delimiter = ',')]
    regimes: Vec<String>,
}

/// The datasets, each as parts made side by side under one source.
pub(crate) fn datasets(scale: f64) -> Vec<(&'static str, Vec<Dataset>)> {
    let n = |x: f64| ((x * scale) as u64).max(1);
    vec![
        (
            "large",
            vec![Dataset {
                name: "large",
                files: 1,
                file_size: n(4096.0) * MIB,
            }],
        ),
        (
            "medium",
            vec![Dataset {
                name: "medium",
                files: n(2000.0),
                file_size: MIB,
            }],
        ),
        (
            "small",
            vec![Dataset {
                name: "small",
                files: n(20000.0),
                file_size: 16 * 1024,
            }],
        ),
        (
            "mixed",
            vec![
                Dataset {
                    name: "big",
                    files: 4,
                    file_size: n(256.0) * MIB,
                },
                Dataset {
                    name: "many",
                    files: n(2000.0),
                    file_size: 64 * 1024,
                },
            ],
        ),
    ]
}

pub fn run(a: &VerifyArgs) -> anyhow::Result<()> {
    stop_on_signals();
    let intact = intact_binary()?;
    std::fs::create_dir_all(&a.dir)?;
    let can_drop = drop_caches();
    let want = |list: &[String], name: &str| list.is_empty() || list.iter().any(|n| n == name);
    println!(
        "intact-bench verify: intact send, median of {} interleaved runs, page cache {}, each run ends with sync",
        a.runs,
        if can_drop { "dropped before each run" } else { "NOT dropped (not root)" }
    );
    let mut regimes: Vec<(&str, Option<Netns>)> = Vec::new();
    if want(&a.regimes, "loopback") {
        regimes.push(("loopback (disk-bound)", None));
    }
    if want(&a.regimes, "1gbit") {
        match Netns::start(0) {
            Ok(ns) => regimes.push(("1 Gbit/s veth between namespaces (network-bound)", Some(ns))),
            Err(e) => println!("\n1 Gbit/s regime skipped: {e:#}"),
        }
    }
    for (name, parts) in datasets(a.scale) {
        if !want(&a.datasets, name) {
            continue;
        }
        let src = a.dir.join(format!("verify-src-{name}")).join("data");
        let mut bytes = 0;
        let mut files = 0;
        for p in &parts {
            let at = if parts.len() == 1 {
                src.clone()
            } else {
                src.join(p.name)
            };
            make_dataset(&at, p)?;
            bytes += p.files * p.file_size;
            files += p.files;
        }
        for (regime, ns) in &regimes {
            println!(
                "\n{name}: {files} files, {:.0} MiB; {regime}\n",
                bytes as f64 / MIB as f64
            );
            println!("| mode | median s | MiB/s | overhead vs none | overhead vs fiver (Eq. 3) | riva's own model (same run; circular, see `model`) s | its error |");
            println!("|---|---:|---:|---:|---:|---:|---:|");
            let dst = a.dir.join("verify-dst");
            let mut results = Vec::new();
            let runs = interleaved(MODES.len(), a.runs, |i| {
                fresh(&dst)?;
                drop_caches();
                send_once(&intact, &src, &dst, MODES[i], ns.as_ref())
                    .with_context(|| format!("{name} {}", MODES[i]))
            })?;
            for (mode, r) in MODES.into_iter().zip(runs) {
                let times = r.iter().map(|x| x.0).collect();
                let models: Vec<(f64, f64)> = r.iter().filter_map(|x| x.1).collect();
                results.push((mode, median(times), models));
            }
            fresh(&dst)?;
            let base = |m: &str| results.iter().find(|r| r.0 == m).map(|r| r.1);
            let (none, fiver) = (base("none"), base("fiver"));
            for (mode, t, models) in &results {
                let over = |b: Option<f64>| {
                    b.map_or("–".into(), |b| format!("{:+.1}%", 100.0 * (t - b) / b))
                };
                let (pred, err) = if models.is_empty() {
                    ("–".to_string(), "–".to_string())
                } else {
                    let p = median(models.iter().map(|m| m.0).collect());
                    let e = median(models.iter().map(|m| m.1).collect());
                    (format!("{p:.2}"), format!("{e:.1}%"))
                };
                println!(
                    "| {mode} | {t:.2} | {:.0} | {} | {} | {pred} | {err} |",
                    bytes as f64 / MIB as f64 / t,
                    over(none),
                    over(fiver),
                );
            }
        }
    }
    println!("\noverhead = (t_mode - t_base) / t_base; riva's own model is fed with the same run's stage times, whose transfer stage includes the sender waiting for the verifier: on one large file it cannot fail by much. `intact-bench model` predicts riva from separate runs.");
    println!("command: {}", command_line());
    Ok(())
}

/// One timed send into a fresh server (in the namespace for the shaped
/// regime); returns seconds to the end of the final sync and, for riva,
/// the model's (predicted seconds, error %) from the JSON report.
pub(crate) fn send_once(
    intact: &Path,
    src: &Path,
    dst: &Path,
    mode: &str,
    ns: Option<&Netns>,
) -> anyhow::Result<(f64, Option<(f64, f64)>)> {
    let listen = match ns {
        Some(n) => format!("{}:0", n.inner_ip),
        None => "127.0.0.1:0".to_string(),
    };
    let mut cmd = match ns {
        Some(n) => n.command(intact),
        None => Command::new(intact),
    };
    // A non-loopback client needs a key.
    let key = dst.with_extension("key");
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&key)?;
        f.write_all(b"intact-bench key for the namespace regime")?;
    }
    cmd.args(["serve", "--key-file"])
        .arg(&key)
        .args(["--listen", &listen, "--root"])
        .arg(dst);
    let (mut server, addr) = start_server(&mut cmd)?;
    let t = Instant::now();
    let out = Command::new(intact)
        .args(["send", "--json", "--verify", mode, "--key-file"])
        .arg(&key)
        .arg(src)
        .arg(&addr)
        .output()?;
    run_cmd(&mut Command::new("sync"))?;
    let secs = t.elapsed().as_secs_f64();
    let _ = server.kill();
    let _ = server.wait();
    if !out.status.success() {
        bail!("send failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    if v["failed"] != 0 {
        bail!("send reported failures: {}", v["failed"]);
    }
    // The model is checked against the time including the final sync.
    let model = v["model"]["predicted_seconds"]
        .as_f64()
        .map(|p| (p, 100.0 * (p - secs).abs() / secs));
    Ok((secs, model))
}

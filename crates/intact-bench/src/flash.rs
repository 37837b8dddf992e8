//! `intact-bench flash`: Kim et al.'s workload scaled to this machine
//! (20 files of 256 MiB by default, then single files of 16 MiB to
//! 2 GiB) copied with `sequential`, `file`, `riva` and `flash` at N = 1,
//! 2, 4, … verifiers, on the disk (with W set so that the deferral is
//! exercised), on a RAM-backed ext4 and, with `--ssd`, on the fault lab's
//! emulated SSD (its write buffer W / 2, as in the lab), and Kim et al.'s own sequential
//! scheme as a baseline (`transfer+verify`: a `fiver` copy, then a `riva
//! --reverify` pass that re-reads both ends from the device). Runs
//! interleaved on a cold cache; min / median / max of wall seconds,
//! median CPU seconds and context switches (getrusage of the copies),
//! ratios to `sequential` and to `riva`, and the filler each flash run
//! wrote (reported apart: it is the price of reaching the media at the
//! end of a transfer).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context};

use crate::loop_ext4::LoopExt4;
use crate::runner::{children_rusage, intact_binary, interleaved, Spread};
use crate::transfer::{copy_state_home, drop_caches, fresh, make_dataset, Dataset};

#[derive(clap::Args)]
pub struct FlashArgs {
    /// Runs per command (interleaved).
    #[arg(long, default_value_t = 7)]
    runs: usize,
    /// Directory on the disk to measure in (a RAM-backed ext4 is measured
    /// too, unless --no-ram).
    #[arg(long, default_value = "/var/tmp/intact-bench-flash")]
    dir: PathBuf,
    /// Skip the RAM-backed ext4.
    #[arg(long)]
    no_ram: bool,
    /// Files in the dataset (Kim et al.: 20).
    #[arg(long, default_value_t = 20)]
    files: u64,
    /// Size of each file, in MiB (Kim et al.: 256).
    #[arg(long, default_value_t = 256)]
    file_mib: u64,
    /// The write-cache window W given to flash (`--device-cache`), in MiB.
    #[arg(long, default_value_t = 64)]
    window_mib: u64,
    /// The verifier counts flash is run with (`--verifiers`).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,64")]
    verifiers: Vec<u16>,
    /// Block size of every copy.
    #[arg(long, default_value = "4MiB")]
    block_size: String,
    /// Then single files of these sizes, in MiB, each its own table
    /// (Kim et al.: 16 MiB to 2 GiB).
    #[arg(long, value_delimiter = ',', default_value = "16,64,256,1024,2048")]
    single_mib: Vec<u64>,
    /// No single files.
    #[arg(long)]
    no_single: bool,
    /// Also measure on the fault lab's emulated SSD (FUSE; needs root and
    /// /dev/fuse), its write buffer half of W as in the fault lab. Choose
    /// a small --files/--file-mib and --no-single for it.
    #[arg(long)]
    ssd: bool,
}

/// Where runs are measured: its name, the directory, and what keeps it
/// (a RAM ext4, an emulated SSD) until the end.
type Place = (&'static str, PathBuf, Option<Box<dyn std::any::Any>>);

/// One measured command: its name, the modes' options.
struct Case {
    name: String,
    args: Vec<String>,
    /// A second copy run right after the first, timed with it (Kim et
    /// al.'s sequential scheme: transfer, then verify everything).
    then: Option<Vec<String>>,
}

/// One run of a case.
#[derive(Clone, Copy)]
struct Run {
    wall: f64,
    cpu: f64,
    switches: f64,
    filler: u64,
}

pub fn run(a: &FlashArgs) -> anyhow::Result<()> {
    crate::runner::stop_on_signals();
    if a.runs == 0 || a.files == 0 || a.verifiers.is_empty() {
        bail!("--runs, --files and --verifiers need at least one");
    }
    if !drop_caches() {
        bail!("dropping the page cache needs root: the runs start on a cold cache");
    }
    let intact = intact_binary()?;
    let d = Dataset {
        name: "kim",
        files: a.files,
        file_size: a.file_mib << 20,
    };
    let bytes = d.files * d.file_size;
    println!(
        "# intact-bench flash ({} runs each, interleaved, cold cache)",
        a.runs
    );
    println!("# {}", crate::runner::command_line());
    println!(
        "# dataset {} × {} MiB = {} MiB; W = {} MiB (dataset = {:.1} W)",
        d.files,
        a.file_mib,
        bytes >> 20,
        a.window_mib,
        bytes as f64 / (a.window_mib << 20) as f64
    );
    let mut sets = vec![d];
    if !a.no_single {
        sets.extend(a.single_mib.iter().map(|&mib| Dataset {
            name: "single",
            files: 1,
            file_size: mib << 20,
        }));
    }
    // The source and one destination of the largest set.
    let largest = sets
        .iter()
        .map(|d| d.files * d.file_size)
        .max()
        .unwrap_or(0);
    let room = 2 * (largest >> 20) + 1024;
    let mut places: Vec<Place> = vec![("disk", a.dir.clone(), None)];
    if !a.no_ram {
        let ram = LoopExt4::in_ram(room)?;
        places.push(("RAM ext4", ram.mount.clone(), Some(Box::new(ram))));
    }
    if a.ssd {
        intact_faults::ssd_usable().map_err(|e| anyhow::anyhow!("--ssd: {e}"))?;
        std::fs::create_dir_all(&a.dir)?;
        // W twice the emulator's buffer, as in the fault lab: a page
        // written again while buffered does not push another out.
        let ssd = intact_faults::EmulatedSsd::new(&a.dir, room, a.window_mib << 19)
            .context("--ssd: making the emulated SSD")?;
        places.push(("emulated SSD", ssd.mnt().to_path_buf(), Some(Box::new(ssd))));
    }
    let cases = cases(a);
    for (place, dir, _keep) in &places {
        for d in &sets {
            crate::runner::check_stop()?;
            measure(&intact, place, dir, d, &cases, a.runs)?;
        }
    }
    Ok(())
}

fn cases(a: &FlashArgs) -> Vec<Case> {
    let common = |mode: &str| {
        vec![
            "--verify".to_string(),
            mode.to_string(),
            "--block-size".to_string(),
            a.block_size.clone(),
        ]
    };
    let mut out: Vec<Case> = ["sequential", "file", "riva"]
        .iter()
        .map(|m| Case {
            name: m.to_string(),
            args: common(m),
            then: None,
        })
        .collect();
    // Kim et al.'s sequential: the whole transfer (checked on arrival
    // only), then every file of both ends re-read from the device
    // (`--reverify` in riva evicts and re-reads both ends).
    let mut verify_after = common("riva");
    verify_after.push("--reverify".into());
    out.push(Case {
        name: KIM_SEQUENTIAL.into(),
        args: common("fiver"),
        then: Some(verify_after),
    });
    for n in &a.verifiers {
        let mut args = common("flash");
        args.extend([
            "--device-cache".to_string(),
            format!("{}MiB", a.window_mib),
            "--verifiers".to_string(),
            n.to_string(),
        ]);
        out.push(Case {
            name: format!("flash N={n}"),
            args,
            then: None,
        });
    }
    out
}

fn measure(
    intact: &Path,
    place: &str,
    dir: &Path,
    d: &Dataset,
    cases: &[Case],
    runs: usize,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let src = dir.join("src");
    make_dataset(&src, d)?;
    let dst = dir.join("dst");
    let mut levels: Vec<String> = vec![String::new(); cases.len()];
    let samples = interleaved(cases.len(), runs, |i| {
        fresh(&dst)?;
        drop_caches();
        let c = &cases[i];
        let copy = |args: &[String]| -> anyhow::Result<serde_json::Value> {
            let out = Command::new(intact)
                .env("XDG_STATE_HOME", copy_state_home(&dst))
                .arg("copy")
                .arg("--json")
                .args(args)
                .arg(format!("{}/", src.display()))
                .arg(&dst)
                .output()
                .with_context(|| c.name.clone())?;
            if !out.status.success() {
                bail!(
                    "{} failed: {}",
                    c.name,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            serde_json::from_slice(&out.stdout)
                .with_context(|| format!("{}: the JSON report", c.name))
        };
        let before = children_rusage();
        let t0 = Instant::now();
        let mut v = copy(&c.args)?;
        if let Some(then) = &c.then {
            v = copy(then)?;
            // The verification pass must have re-read every byte.
            let all = d.files * d.file_size;
            if v["bytes_reverified"].as_u64() != Some(all) {
                bail!(
                    "{}: the verification pass re-verified {} of {all} bytes",
                    c.name,
                    v["bytes_reverified"]
                );
            }
        }
        let wall = t0.elapsed().as_secs_f64();
        let after = children_rusage();
        levels[i] = level_counts(&v);
        Ok(Run {
            wall,
            cpu: after.cpu - before.cpu,
            switches: after.switches - before.switches,
            filler: v["filler_bytes"].as_u64().unwrap_or(0),
        })
    })?;
    println!();
    let w_of = |b: u64| b as f64 / (cases_window(cases) << 20).max(1) as f64;
    println!(
        "## {place}: {} file{} × {} MiB ({:.1} W)",
        d.files,
        if d.files == 1 { "" } else { "s" },
        d.file_size >> 20,
        w_of(d.files * d.file_size)
    );
    println!("| copy | wall s min / median / max | CPU s median | context switches median | ÷ sequential | ÷ riva | ÷ {KIM_SEQUENTIAL} | filler MiB median | levels (last run) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let med = |s: &[Run], f: fn(&Run) -> f64| Spread::of(&s.iter().map(f).collect::<Vec<_>>());
    let wall_of = |name: &str| {
        cases
            .iter()
            .position(|c| c.name == name)
            .map(|i| med(&samples[i], |r| r.wall).median)
    };
    let (seq, riva, kim) = (
        wall_of("sequential"),
        wall_of("riva"),
        wall_of(KIM_SEQUENTIAL),
    );
    for (i, c) in cases.iter().enumerate() {
        let s = &samples[i];
        let wall = med(s, |r| r.wall);
        let ratio =
            |base: Option<f64>| base.map_or("-".into(), |b| format!("{:.2}", wall.median / b));
        println!(
            "| {} | {wall} | {:.2} | {:.0} | {} | {} | {} | {:.0} | {} |",
            c.name,
            med(s, |r| r.cpu).median,
            med(s, |r| r.switches).median,
            ratio(seq),
            ratio(riva),
            ratio(kim),
            med(s, |r| r.filler as f64).median / (1 << 20) as f64,
            levels[i]
        );
    }
    println!("targets (issue 14): flash ≤ 1.10× riva when the dataset is at least 4 W; flash ≤ 0.5× sequential (Kim et al.'s: {KIM_SEQUENTIAL}; intact's own `sequential` re-reads each file through the cache at its end)");
    Ok(())
}

/// Kim et al.'s sequential scheme as a case: a `fiver` copy, then a
/// `riva --reverify` pass re-reading both ends from the device.
const KIM_SEQUENTIAL: &str = "transfer+verify";

/// W in MiB, as the flash cases were given it.
fn cases_window(cases: &[Case]) -> u64 {
    cases
        .iter()
        .find_map(|c| {
            let at = c.args.iter().position(|a| a == "--device-cache")?;
            c.args.get(at + 1)?.strip_suffix("MiB")?.parse().ok()
        })
        .unwrap_or(0)
}

/// "level: files" for a run's report, e.g. `media 20`.
fn level_counts(v: &serde_json::Value) -> String {
    let mut counts = std::collections::BTreeMap::new();
    for f in v["files"].as_array().into_iter().flatten() {
        if f["kind"] == "file" {
            let level = f["level"].as_str().unwrap_or("failed").to_string();
            *counts.entry(level).or_insert(0) += 1;
        }
    }
    counts
        .iter()
        .map(|(l, n)| format!("{l} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

//! `intact-bench scale`: aggregate throughput of a plan's shards run at
//! once, N = 1, 2, 4, 8, each shard its own sender and its own server, on
//! loopback and with each server behind its own 1 Gbit/s link (a network
//! namespace per server, joined by a shaped veth pair). Scaling
//! efficiency is the aggregate over N × one pair's throughput; the disk's
//! own write rate (dd, O_DIRECT) is printed beside it, so the table says
//! where the shared disk, rather than intact, is the limit.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};

use crate::loop_ext4::LoopExt4;
use crate::netns::Netns;
use crate::runner::{
    command_line, intact_binary, interleaved, stop_on_signals, Meter, Sample, Spread,
};
use crate::transfer::{drop_caches, fresh, make_dataset, run_cmd, start_server, Dataset};

const MIB: u64 = 1 << 20;

#[derive(clap::Args, Clone)]
pub struct ScaleArgs {
    /// Directory for the dataset and the servers' roots (on a real disk).
    #[arg(long, default_value = "/var/tmp/intact-bench")]
    dir: PathBuf,
    /// Runs per N, interleaved in alternating order.
    #[arg(long, default_value_t = 7)]
    runs: usize,
    /// Shard counts to compare.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    shards: Vec<u32>,
    /// The dataset: this many files of --file-mib MiB.
    #[arg(long, default_value_t = 32)]
    files: u64,
    /// Size of each file, MiB.
    #[arg(long, default_value_t = 16)]
    file_mib: u64,
    /// Only these regimes (loopback, 1gbit).
    #[arg(long, value_delimiter = ',')]
    regimes: Vec<String>,
    /// Put the dataset and the servers' roots on a RAM-backed ext4 (a
    /// loop device over a file in /dev/shm) instead of --dir: intact's own
    /// cost, without the disk.
    #[arg(long)]
    ram: bool,
}

pub fn run(a: &ScaleArgs) -> anyhow::Result<()> {
    stop_on_signals();
    let intact = intact_binary()?;
    // The dataset, the roots of up to N servers and the dd probe.
    let ram = match a.ram {
        true => Some(LoopExt4::in_ram(a.files * a.file_mib * 2 + 1024 + 256)?),
        false => None,
    };
    let dir = ram.as_ref().map_or(a.dir.clone(), |r| r.mount.clone());
    let a = &ScaleArgs { dir, ..a.clone() };
    std::fs::create_dir_all(&a.dir)?;
    let src = a.dir.join("scale-src").join("data");
    let set = Dataset {
        name: "scale",
        files: a.files,
        file_size: a.file_mib * MIB,
    };
    make_dataset(&src, &set)?;
    let bytes = set.files * set.file_size;
    let max_n = a.shards.iter().copied().max().unwrap_or(1);
    let want = |name: &str| a.regimes.is_empty() || a.regimes.iter().any(|r| r == name);
    let can_drop = drop_caches();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "intact-bench scale: {} files × {} MiB ({} MiB), shards run at once, each its own `intact send --plan` and `intact serve`; {} interleaved runs per N; page cache {}; each run ends with sync",
        set.files,
        a.file_mib,
        bytes / MIB,
        a.runs,
        if can_drop { "dropped before each run" } else { "NOT dropped (not root)" }
    );
    let disk = disk_rate(&a.dir)?;
    println!("the disk under {}: {disk:.0} MiB/s written with dd (1 GiB, 4 MiB blocks, O_DIRECT): the shared disk's limit", a.dir.display());
    // Per shard: (the sender's namespace, the server's), or none (loopback).
    let mut regimes: Vec<(&str, Vec<(Netns, Netns)>)> = Vec::new();
    if want("loopback") {
        regimes.push(("loopback", Vec::new()));
    }
    if want("1gbit") {
        let made: anyhow::Result<Vec<(Netns, Netns)>> = (0..max_n).map(Netns::pair).collect();
        match made {
            Ok(ns) => regimes.push((
                "1 Gbit/s per host (each shard a sender host and a server host: two namespaces joined by a shaped veth)",
                ns,
            )),
            Err(e) => println!("\n1 Gbit/s regime skipped: {e:#}"),
        }
    }
    for (regime, nets) in &regimes {
        println!("\n{regime}\n");
        println!("| shards N | wall s, min / median / max | aggregate MiB/s (median) | efficiency vs N × one pair | CPU s (median) | cores busy (CPU s ÷ wall s, of {cores}) |");
        println!("|---:|---|---:|---:|---:|---:|");
        let runs = interleaved(a.shards.len(), a.runs, |i| {
            let n = a.shards[i];
            once(&intact, &a.dir, &src, n, nets).with_context(|| format!("{regime}, {n} shards"))
        })?;
        let one = a
            .shards
            .iter()
            .position(|&n| n == 1)
            .map(|i| Spread::of(&runs[i].iter().map(|r| r.wall).collect::<Vec<_>>()).median);
        for (n, r) in a.shards.iter().zip(&runs) {
            let wall = Spread::of(&r.iter().map(|x| x.wall).collect::<Vec<_>>());
            let cpu = Spread::of(&r.iter().map(|x| x.cpu).collect::<Vec<_>>());
            let rate = bytes as f64 / MIB as f64 / wall.median;
            let eff = one.map_or("–".to_string(), |t1| {
                let single = bytes as f64 / MIB as f64 / t1;
                format!("{:.2}", rate / (f64::from(*n) * single))
            });
            println!(
                "| {n} | {wall} | {rate:.0} | {eff} | {:.2} | {:.2} |",
                cpu.median,
                cpu.median / wall.median
            );
        }
    }
    fresh(&a.dir.join("scale-dst"))?;
    println!("\nefficiency = aggregate / (N × the aggregate of N = 1); the disk's dd rate above is the ceiling every N shares on loopback; cores busy near {cores}: the CPU is the ceiling. In the 1 Gbit/s regime every shard's sender and server are hosts of their own (a namespace each), joined only to each other.");
    println!("command: {}", command_line());
    Ok(())
}

/// Runs shards `0..n` of `plan` at once, shard I inside `host(I)` if it
/// is a namespace; every shard ends before the verdict (a failed one is
/// named), then a `sync`.
pub(crate) fn send_shards<'a>(
    intact: &Path,
    key: &Path,
    plan: &Path,
    n: u32,
    host: impl Fn(u32) -> Option<&'a Netns>,
) -> anyhow::Result<()> {
    let mut senders = Senders(Vec::new());
    for i in 0..n {
        let mut cmd = match host(i) {
            Some(ns) => ns.command(intact),
            None => Command::new(intact),
        };
        senders.0.push(
            cmd.args(["send", "-q", "--key-file"])
                .arg(key)
                .arg("--plan")
                .arg(plan)
                .args(["--shard", &i.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?,
        );
    }
    let mut failed = Vec::new();
    for (i, s) in senders.0.iter_mut().enumerate() {
        if !s.wait()?.success() {
            failed.push(i);
        }
    }
    if !failed.is_empty() {
        bail!("shard(s) {failed:?} failed (run one by hand with the same plan to see why)");
    }
    run_cmd(&mut Command::new("sync"))
}

/// Senders still running when a run ends early are killed and reaped.
struct Senders(Vec<Child>);

impl Drop for Senders {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if c.try_wait().ok().flatten().is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// The disk's sequential write rate with O_DIRECT, MiB/s.
fn disk_rate(dir: &Path) -> anyhow::Result<f64> {
    let f = dir.join("scale-dd");
    let t = Instant::now();
    run_cmd(
        Command::new("dd")
            .args([
                "if=/dev/zero",
                "bs=4M",
                "count=256",
                "oflag=direct",
                "conv=fsync",
            ])
            .arg(format!("of={}", f.display())),
    )?;
    let secs = t.elapsed().as_secs_f64();
    std::fs::remove_file(&f)?;
    Ok(1024.0 / secs)
}

/// One run: N servers (in their namespaces, if any), a plan of N shards
/// over them, every shard sent at once; seconds to the end of the last
/// shard and a sync.
fn once(
    intact: &Path,
    dir: &Path,
    src: &Path,
    n: u32,
    nets: &[(Netns, Netns)],
) -> anyhow::Result<Sample> {
    let dst = dir.join("scale-dst");
    fresh(&dst)?;
    std::fs::create_dir_all(&dst)?;
    let key = dir.join("scale.key");
    std::fs::write(&key, b"intact-bench key for the scale benchmark")?;
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    // CPU: every process the run starts (servers are reaped at its end);
    // wall: from the shards' start to the sync after the last.
    let mut meter = Meter::start();
    let mut servers: Vec<Child> = Vec::new();
    let mut to = Vec::new();
    let started = (|| -> anyhow::Result<()> {
        for i in 0..n {
            let root = dst.join(format!("root{i}"));
            let (mut cmd, listen) = match nets.get(i as usize) {
                Some((_, server)) => (server.command(intact), format!("{}:0", server.inner_ip)),
                None => (Command::new(intact), "127.0.0.1:0".to_string()),
            };
            cmd.args(["serve", "--key-file"])
                .arg(&key)
                .args(["--listen", &listen, "--root"])
                .arg(&root);
            let (child, addr) = start_server(&mut cmd)?;
            servers.push(child);
            to.push(addr);
        }
        Ok(())
    })();
    let result = started.and_then(|()| {
        let plan = dst.join("plan.json");
        run_cmd(
            Command::new(intact)
                .arg("plan")
                .arg(src)
                .args(["--shards", &n.to_string(), "--to", &to.join(","), "-o"])
                .arg(&plan),
        )?;
        drop_caches();
        meter.go();
        send_shards(intact, &key, &plan, n, |i| {
            nets.get(i as usize).map(|(sender, _)| sender)
        })?;
        meter.stop();
        Ok(())
    });
    for mut s in servers {
        let _ = s.kill();
        let _ = s.wait();
    }
    result?;
    Ok(meter.finish(0.0))
}

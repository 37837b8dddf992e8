//! `intact-bench split`: what splitting a large file across shards buys.
//! One server, N shards each its own `intact send --plan`, a dataset of
//! one large file and a few small ones; the same N shards with the plan
//! made `--no-split` (the large file sent whole by one shard) and split
//! (its block ranges sent by every shard), interleaved. Two regimes:
//! loopback, and every sender a host of its own (a network namespace)
//! with its own 1 Gbit/s link to the server's host, where the whole
//! file's shard is limited by its link and the split one by N links.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use crate::loop_ext4::LoopExt4;
use crate::netns::Netns;
use crate::runner::{
    command_line, intact_binary, interleaved, stop_on_signals, Meter, Sample, Spread,
};
use crate::scale::send_shards;
use crate::transfer::{drop_caches, fresh, run_cmd, start_server};

const MIB: u64 = 1 << 20;

#[derive(clap::Args, Clone)]
pub struct SplitArgs {
    /// Directory for the dataset and the server's root (on a real disk).
    #[arg(long, default_value = "/var/tmp/intact-bench")]
    dir: PathBuf,
    /// Runs per variant, interleaved in alternating order.
    #[arg(long, default_value_t = 7)]
    runs: usize,
    /// Shard counts.
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    shards: Vec<u32>,
    /// The large file, MiB.
    #[arg(long, default_value_t = 1024)]
    big_mib: u64,
    /// Small files beside it (1 MiB each).
    #[arg(long, default_value_t = 16)]
    small: u64,
    /// Only these regimes (loopback, 1gbit).
    #[arg(long, value_delimiter = ',')]
    regimes: Vec<String>,
    /// Put the dataset and the server's root on a RAM-backed ext4 (a loop
    /// device over a file in /dev/shm) instead of --dir.
    #[arg(long)]
    ram: bool,
}

/// The senders' hosts: none (loopback), or one namespace per shard with
/// its own shaped link to this one, where the server listens.
struct Hosts {
    nets: Vec<Netns>,
    /// The server's address as every sender reaches it.
    server_ip: String,
}

pub fn run(a: &SplitArgs) -> anyhow::Result<()> {
    stop_on_signals();
    let intact = intact_binary()?;
    let total = a.big_mib + a.small;
    let ram = match a.ram {
        true => Some(LoopExt4::in_ram(total * 2 + 512)?),
        false => None,
    };
    let dir = ram.as_ref().map_or(a.dir.clone(), |r| r.mount.clone());
    std::fs::create_dir_all(&dir)?;
    let src = dir.join("split-src").join("data");
    make_source(&src, a)?;
    let max_n = a.shards.iter().copied().max().unwrap_or(2);
    let want = |name: &str| a.regimes.is_empty() || a.regimes.iter().any(|r| r == name);
    let can_drop = drop_caches();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "intact-bench split: one {} MiB file and {} × 1 MiB, N shards to one `intact serve`, the plan made --no-split (the large file whole in one shard) or split (its ranges in every shard); {} interleaved runs per variant; page cache {}; each run ends with sync; on {}",
        a.big_mib,
        a.small,
        a.runs,
        if can_drop { "dropped before each run" } else { "NOT dropped (not root)" },
        if a.ram { "a RAM-backed ext4" } else { "the disk" }
    );
    let mut regimes: Vec<(&str, Hosts)> = Vec::new();
    if want("loopback") {
        regimes.push((
            "loopback",
            Hosts {
                nets: Vec::new(),
                server_ip: "127.0.0.1".into(),
            },
        ));
    }
    if want("1gbit") {
        match hosts(max_n) {
            Ok(h) => regimes.push((
                "1 Gbit/s per sender (each shard's sender a host of its own, with its own shaped link to the server's host)",
                h,
            )),
            Err(e) => println!("\n1 Gbit/s regime skipped: {e:#}"),
        }
    }
    let variants: Vec<(u32, bool)> = a
        .shards
        .iter()
        .flat_map(|&n| [(n, false), (n, true)])
        .collect();
    for (regime, h) in &regimes {
        println!("\n{regime}\n");
        println!("| shards N | plan | wall s, min / median / max | MiB/s (median) | CPU s (median) | cores busy (of {cores}) | wall, whole ÷ split |");
        println!("|---:|---|---|---:|---:|---:|---:|");
        let runs = interleaved(variants.len(), a.runs, |i| {
            let (n, split) = variants[i];
            once(&intact, &dir, &src, n, split, h)
                .with_context(|| format!("{regime}, {n} shards, split {split}"))
        })?;
        let walls: Vec<Spread> = runs
            .iter()
            .map(|r| Spread::of(&r.iter().map(|x| x.wall).collect::<Vec<_>>()))
            .collect();
        for (i, ((n, split), r)) in variants.iter().zip(&runs).enumerate() {
            let cpu = Spread::of(&r.iter().map(|x| x.cpu).collect::<Vec<_>>());
            let wall = &walls[i];
            let ratio = if *split {
                format!("{:.2}", walls[i - 1].median / wall.median)
            } else {
                "–".into()
            };
            println!(
                "| {n} | {} | {wall} | {:.0} | {:.2} | {:.2} | {ratio} |",
                if *split { "split" } else { "--no-split" },
                total as f64 / wall.median,
                cpu.median,
                cpu.median / wall.median
            );
        }
    }
    fresh(&dir.join("split-dst"))?;
    println!("\nwhole ÷ split above 1: splitting shortened the transfer. In the 1 Gbit/s regime one link carries ~112 MiB/s, so a large file sent whole takes at least its size over that, and split over N links; cores busy near {cores}: the CPU is the ceiling.");
    println!("command: {}", command_line());
    drop(ram);
    Ok(())
}

fn make_source(src: &Path, a: &SplitArgs) -> anyhow::Result<()> {
    let big = src.join("big.dat");
    let want = a.big_mib * MIB;
    if std::fs::metadata(&big).map(|m| m.len()).ok() != Some(want) {
        std::fs::create_dir_all(src)?;
        let mut f = std::io::BufWriter::new(std::fs::File::create(&big)?);
        for i in 0..a.big_mib {
            std::io::Write::write_all(&mut f, &intact_sample::bytes(MIB as usize, i))?;
        }
        std::io::Write::flush(&mut f)?;
    }
    for i in 0..a.small {
        let p = src.join(format!("small/{i:03}.dat"));
        if !p.exists() {
            std::fs::create_dir_all(p.parent().unwrap())?;
            std::fs::write(&p, intact_sample::bytes(MIB as usize, 1000 + i))?;
        }
    }
    Ok(())
}

/// `n` sender hosts, each joined to this namespace by its own shaped veth
/// (10.77.i.0/24); every one reaches the server at 10.77.0.1 (an address
/// of this namespace) over its own link.
fn hosts(n: u32) -> anyhow::Result<Hosts> {
    let nets = (0..n)
        .map(Netns::start)
        .collect::<anyhow::Result<Vec<_>>>()?;
    for (i, ns) in nets.iter().enumerate().skip(1) {
        run_cmd(Command::new("ip").args([
            "-n",
            &ns.name,
            "route",
            "add",
            "10.77.0.1/32",
            "via",
            &format!("10.77.{i}.1"),
        ]))?;
    }
    Ok(Hosts {
        nets,
        server_ip: "10.77.0.1".into(),
    })
}

/// One run: a server, a plan of `n` shards to it (split or not), every
/// shard sent at once; seconds to the end of the last shard and a sync.
fn once(
    intact: &Path,
    dir: &Path,
    src: &Path,
    n: u32,
    split: bool,
    h: &Hosts,
) -> anyhow::Result<Sample> {
    let dst = dir.join("split-dst");
    fresh(&dst)?;
    std::fs::create_dir_all(&dst)?;
    let key = dir.join("split.key");
    std::fs::write(&key, b"intact-bench key for the split benchmark")?;
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    let mut meter = Meter::start();
    let listen = if h.nets.is_empty() {
        "127.0.0.1:0"
    } else {
        "0.0.0.0:0"
    };
    let (mut server, addr) = start_server(
        Command::new(intact)
            .args(["serve", "--key-file"])
            .arg(&key)
            .args(["--listen", listen, "--root"])
            .arg(dst.join("root")),
    )?;
    let port = addr.rsplit(':').next().unwrap_or("").to_string();
    let to = format!("{}:{port}", h.server_ip);
    let result = (|| -> anyhow::Result<()> {
        let plan = dst.join("plan.json");
        let mut cmd = Command::new(intact);
        cmd.arg("plan")
            .arg(src)
            .args(["--shards", &n.to_string(), "--to", &to, "-o"])
            .arg(&plan);
        if !split {
            cmd.arg("--no-split");
        }
        run_cmd(&mut cmd)?;
        drop_caches();
        meter.go();
        send_shards(intact, &key, &plan, n, |i| h.nets.get(i as usize))?;
        meter.stop();
        if !dst.join("root/data/big.dat").exists() {
            bail!("the large file is not under its name after every shard ended");
        }
        Ok(())
    })();
    let _ = server.kill();
    let _ = server.wait();
    result?;
    Ok(meter.finish(0.0))
}

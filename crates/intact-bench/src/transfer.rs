//! `intact-bench transfer`: intact send/copy against a raw pipe (the
//! baseline: one pass, one socket, fsync at the receiving end; see
//! [`crate::pipe`]), cp, rsync and rsync over ssh (default cipher and
//! AES-128-GCM), on the same datasets in the same run, interleaved, with
//! the page cache dropped before every run. Each timed run ends with
//! `sync`, so tools that do not fsync (cp, rsync) are charged for their
//! writeback as intact and the raw pipe are for their fsyncs. Wall time
//! and CPU time (user + system of the tool's processes) are both kept.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context};

use crate::ramdisk::RamExt4;
use crate::runner::{
    command_line, have, intact_binary, interleaved, stop_on_signals, Meter, Sample, Spread,
};

#[derive(clap::Args)]
pub struct TransferArgs {
    /// Directory for datasets and destinations (on a real disk, not tmpfs).
    #[arg(long, default_value = "/var/tmp/intact-bench")]
    dir: PathBuf,
    /// Runs per tool, interleaved (min, median and max are reported).
    #[arg(long, default_value_t = 7)]
    runs: usize,
    /// Scale of the datasets: 1.0 = one 4 GiB file, 2000 × 1 MiB, 20,000 × 16 KiB.
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Only these datasets (large, medium, small).
    #[arg(long, value_delimiter = ',')]
    datasets: Vec<String>,
    /// Leave out rsync over ssh.
    #[arg(long)]
    no_ssh: bool,
    /// Measure on a RAM-backed ext4 (a loop device over a file in
    /// /dev/shm, made and removed by this run) instead of --dir.
    #[arg(long)]
    ram_ext4: bool,
    /// Also run `intact send --verify none` with a key: frames encrypted,
    /// and frames authenticated only (`serve --no-encrypt`), to measure
    /// what sealing costs against the keyless (plain) run.
    #[arg(long)]
    keyed: bool,
}

pub(crate) struct Dataset {
    pub name: &'static str,
    pub files: u64,
    pub file_size: u64,
}

const MIB: u64 = 1 << 20;

/// What every table says about encryption.
pub(crate) const ENCRYPTION_NOTE: &str =
    "rsync over ssh encrypts; intact send encrypts only with a key \
     (rows marked \"key\"; the others are keyless: plain frames); the raw pipe does not";

/// How an `intact send` run is keyed.
#[derive(Clone, Copy)]
enum Keying<'a> {
    /// No key: plain frames.
    None,
    /// A key: sealed frames, encrypted or (false) authenticated only.
    Key(&'a Path, bool),
}

/// A named tool: one timed run from the dataset into a fresh destination.
type Tool<'a> = (String, Box<dyn Fn() -> anyhow::Result<Sample> + 'a>);

pub fn run(a: &TransferArgs) -> anyhow::Result<()> {
    stop_on_signals();
    let intact = intact_binary()?;
    for need in ["cp", "rsync"] {
        if !have(need) {
            bail!("{need} is not installed: run scripts/setup --bench");
        }
    }
    let all = [
        Dataset {
            name: "large",
            files: 1,
            file_size: ((4096.0 * a.scale) as u64).max(1) * MIB,
        },
        Dataset {
            name: "medium",
            files: ((2000.0 * a.scale) as u64).max(1),
            file_size: MIB,
        },
        Dataset {
            name: "small",
            files: ((20000.0 * a.scale) as u64).max(1),
            file_size: 16 * 1024,
        },
    ];
    let chosen: Vec<&Dataset> = all
        .iter()
        .filter(|d| a.datasets.is_empty() || a.datasets.iter().any(|n| n == d.name))
        .collect();
    let ram = if a.ram_ext4 {
        // Sources, one destination as large as the largest, and room for
        // ext4's metadata (an inode and a block for each small file).
        let bytes: u64 = chosen.iter().map(|d| d.files * d.file_size).sum();
        let largest = chosen
            .iter()
            .map(|d| d.files * d.file_size)
            .max()
            .unwrap_or(0);
        let files: u64 = chosen.iter().map(|d| d.files).sum();
        let mib = (bytes + largest) / MIB + files * 2 * 8 / 1024 + 512;
        Some(RamExt4::create(mib)?)
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
    // The sshd's own files stay on the disk: only the data moves to RAM.
    let ssh = if a.no_ssh {
        None
    } else {
        Some(Sshd::start(&a.dir.join("sshd"))?)
    };
    let key = if a.keyed {
        std::fs::create_dir_all(&a.dir)?;
        let k = a.dir.join("bench.key");
        run_cmd(Command::new(&intact).arg("keygen").arg("--force").arg(&k))?;
        Some(k)
    } else {
        None
    };
    let can_drop = drop_caches();
    println!(
        "intact-bench transfer: on {storage}, scale {}, {} interleaved runs per tool, page cache {}, each run ends with sync",
        a.scale,
        a.runs,
        if can_drop { "dropped before each run" } else { "NOT dropped (not root)" }
    );
    for d in chosen {
        let src_parent = dir.join(format!("src-{}", d.name));
        let src = src_parent.join("data");
        make_dataset(&src, d)?;
        let bytes = d.files * d.file_size;
        let dst = dir.join("dst");
        let mut tools: Vec<Tool<'_>> = Vec::new();
        for mode in ["none", "fiver", "riva"] {
            let (bin, src, dst) = (&intact, &src, &dst);
            tools.push((
                format!("intact send --verify {mode}"),
                Box::new(move || intact_send(bin, src, dst, mode, Keying::None)),
            ));
        }
        if let Some(key) = &key {
            for encrypt in [true, false] {
                let (bin, src, dst) = (&intact, &src, &dst);
                tools.push((
                    format!(
                        "intact send --verify none, key{}",
                        if encrypt {
                            ", encrypted"
                        } else {
                            ", serve --no-encrypt"
                        }
                    ),
                    Box::new(move || intact_send(bin, src, dst, "none", Keying::Key(key, encrypt))),
                ));
            }
        }
        tools.push((
            "intact copy --verify none".into(),
            Box::new(|| {
                timed(|| {
                    run_cmd(
                        Command::new(&intact)
                            .args(["copy", "--verify", "none"])
                            .arg(&src)
                            .arg(&dst),
                    )
                })
            }),
        ));
        tools.push((
            "raw pipe (sendfile | socket | write+fsync)".into(),
            Box::new(|| crate::pipe::timed(&src, &dst)),
        ));
        tools.push((
            "cp -r".into(),
            Box::new(|| timed(|| run_cmd(Command::new("cp").arg("-r").arg(&src).arg(&dst)))),
        ));
        tools.push((
            "rsync -a".into(),
            Box::new(|| {
                timed(|| {
                    run_cmd(
                        Command::new("rsync")
                            .arg("-a")
                            .arg(&src)
                            .arg(format!("{}/", dst.display())),
                    )
                })
            }),
        ));
        if let Some(s) = &ssh {
            tools.push((
                format!("rsync -a -e ssh ({}, default)", s.default_cipher),
                Box::new(|| s.timed_rsync(&src, &dst, None)),
            ));
            tools.push((
                "rsync -a -e \"ssh -c aes128-gcm@openssh.com\"".into(),
                Box::new(|| s.timed_rsync(&src, &dst, Some("aes128-gcm@openssh.com"))),
            ));
        }
        let samples = interleaved(tools.len(), a.runs, |i| {
            fresh(&dst)?;
            drop_caches();
            (tools[i].1)().with_context(|| tools[i].0.clone())
        })?;
        fresh(&dst)?;
        println!(
            "\n{}: {} file(s) of {} KiB, {:.0} MiB; on {storage}\n",
            d.name,
            d.files,
            d.file_size / 1024,
            bytes as f64 / MIB as f64
        );
        print_table(&tools, &samples, bytes);
        println!("\n{ENCRYPTION_NOTE}.");
    }
    println!("\nwall and CPU: min / median / max seconds of {} runs; CPU = user + system seconds of the tool's processes (an sshd's sessions included; kernel writeback threads are nobody's).", a.runs);
    println!("ratio = the other tool's median / this tool's median (> 1: this tool is faster or cheaper).");
    println!("command: {}", command_line());
    Ok(())
}

fn print_table(tools: &[Tool<'_>], samples: &[Vec<Sample>], bytes: u64) {
    let stats: Vec<(Spread, Spread)> = samples
        .iter()
        .map(|v| {
            let wall: Vec<f64> = v.iter().map(|s| s.wall).collect();
            let cpu: Vec<f64> = v.iter().map(|s| s.cpu).collect();
            (Spread::of(&wall), Spread::of(&cpu))
        })
        .collect();
    let find = |prefix: &str| {
        tools
            .iter()
            .position(|t| t.0.starts_with(prefix))
            .map(|i| stats[i])
    };
    let pipe = find("raw pipe");
    let ssh = find("rsync -a -e ssh (");
    println!("| tool | wall s (min / median / max) | MiB/s | CPU s (min / median / max) | vs raw pipe: wall | CPU | vs rsync over ssh: wall | CPU |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for ((name, _), (wall, cpu)) in tools.iter().zip(&stats) {
        let r = |other: Option<(Spread, Spread)>, pick: fn(&(Spread, Spread)) -> f64, this: f64| {
            other.map_or("–".into(), |o| format!("{:.2}", pick(&o) / this))
        };
        let w = |s: &(Spread, Spread)| s.0.median;
        let c = |s: &(Spread, Spread)| s.1.median;
        println!(
            "| {} | {wall} | {:.0} | {cpu} | {} | {} | {} | {} |",
            name.replace('|', "\\|"),
            bytes as f64 / MIB as f64 / wall.median,
            r(pipe, w, wall.median),
            r(pipe, c, cpu.median),
            r(ssh, w, wall.median),
            r(ssh, c, cpu.median),
        );
    }
}

pub(crate) fn make_dataset(src: &Path, d: &Dataset) -> anyhow::Result<()> {
    // The marker names the shape, so a dataset made at another scale is
    // made again rather than measured under the wrong name.
    let marker = src.with_extension("complete");
    let shape = format!("{} x {}\n", d.files, d.file_size);
    if std::fs::read_to_string(&marker).is_ok_and(|m| m == shape) {
        return Ok(());
    }
    let _ = std::fs::remove_dir_all(src);
    let mut stream = intact_sample::SampleBytes::new(7);
    for i in 0..d.files {
        let dir = src.join(format!("d{:03}", i / 1000));
        std::fs::create_dir_all(&dir)?;
        intact_sample::write_file(&dir.join(format!("f{i:05}")), d.file_size, &mut stream)?;
    }
    std::fs::write(marker, shape)?;
    Ok(())
}

pub(crate) fn fresh(dst: &Path) -> anyhow::Result<()> {
    if dst.exists() {
        std::fs::remove_dir_all(dst)?;
    }
    std::fs::create_dir_all(dst)?;
    run_cmd(&mut Command::new("sync"))
}

/// Writes back dirty pages and drops the page cache; false if not allowed.
pub(crate) fn drop_caches() -> bool {
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", b"3\n").is_ok()
}

pub(crate) fn run_cmd(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).output()?;
    if !out.status.success() {
        bail!("{:?} failed: {}", cmd, String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// Times `f` plus a final sync.
pub(crate) fn timed(f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<Sample> {
    let mut m = Meter::start();
    f()?;
    run_cmd(&mut Command::new("sync"))?;
    m.stop();
    Ok(m.finish(0.0))
}

/// A fresh server per run (so its journal does not skip anything), timed
/// from the send's start to the end of the final sync; the server's CPU
/// is counted.
fn intact_send(
    intact: &Path,
    src: &Path,
    dst: &Path,
    verify: &str,
    keying: Keying<'_>,
) -> anyhow::Result<Sample> {
    let mut m = Meter::start();
    let mut cmd = Command::new(intact);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--root"])
        .arg(dst);
    let mut send = Command::new(intact);
    send.args(["send", "--verify", verify]);
    if let Keying::Key(key, encrypt) = keying {
        cmd.arg("--key-file").arg(key);
        if !encrypt {
            cmd.arg("--no-encrypt");
        }
        send.arg("--key-file").arg(key);
    }
    let (mut server, addr) = start_server(&mut cmd)?;
    m.go();
    let sent = run_cmd(send.arg(src).arg(&addr)).and_then(|()| run_cmd(&mut Command::new("sync")));
    m.stop();
    let _ = server.kill();
    let _ = server.wait();
    sent?;
    Ok(m.finish(0.0))
}

/// An sshd on a free loopback port with its own host and client keys.
struct Sshd {
    child: Child,
    port: u16,
    key: PathBuf,
    /// The client's first cipher, used when none is asked for.
    default_cipher: String,
}

impl Sshd {
    fn start(dir: &Path) -> anyhow::Result<Sshd> {
        let sshd = ["/usr/sbin/sshd", "/usr/bin/sshd"]
            .into_iter()
            .find(|p| Path::new(p).exists());
        let Some(sshd) = sshd else {
            bail!("sshd is not installed: run scripts/setup --bench (or pass --no-ssh)")
        };
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir)?;
        std::fs::create_dir_all("/run/sshd")?;
        for name in ["host", "client"] {
            run_cmd(
                Command::new("ssh-keygen")
                    .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                    .arg(dir.join(name)),
            )?;
        }
        std::fs::copy(dir.join("client.pub"), dir.join("authorized_keys"))?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let config = dir.join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nAuthorizedKeysFile {}\nPermitRootLogin prohibit-password\n\
                 PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile {}\n",
                dir.join("host").display(),
                dir.join("authorized_keys").display(),
                dir.join("sshd.pid").display()
            ),
        )?;
        let child = Command::new(sshd)
            .arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(&config)
            .stderr(Stdio::null())
            .spawn()?;
        let mut s = Sshd {
            child,
            port,
            key: dir.join("client"),
            default_cipher: String::new(),
        };
        let config = Command::new("ssh").args(["-G", "127.0.0.1"]).output()?;
        s.default_cipher = String::from_utf8_lossy(&config.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("ciphers "))
            .and_then(|c| c.split(',').next())
            .unwrap_or("?")
            .to_string();
        // Ready when a command runs through it.
        for _ in 0..50 {
            if s.ssh_command()
                .arg("127.0.0.1")
                .arg("true")
                .status()?
                .success()
            {
                return Ok(s);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        bail!("the benchmark's sshd did not come up on port {port}")
    }

    fn ssh_args(&self) -> String {
        format!(
            "ssh -p {} -i {} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR",
            self.port,
            self.key.display()
        )
    }

    fn ssh_command(&self) -> Command {
        let args = self.ssh_args();
        let mut parts = args.split(' ');
        let mut c = Command::new(parts.next().expect("ssh"));
        c.args(parts).stdout(Stdio::null()).stderr(Stdio::null());
        c
    }

    /// One timed rsync over ssh, with `cipher` or ssh's default; its CPU
    /// includes the sshd sessions (and the remote rsync) it caused.
    fn timed_rsync(&self, src: &Path, dst: &Path, cipher: Option<&str>) -> anyhow::Result<Sample> {
        let mut e = self.ssh_args();
        if let Some(c) = cipher {
            e.push_str(" -c ");
            e.push_str(c);
        }
        let before = self.sessions_cpu()?;
        let mut m = Meter::start();
        run_cmd(
            Command::new("rsync")
                .args(["-a", "-e", &e])
                .arg(src)
                .arg(format!("127.0.0.1:{}/", dst.display())),
        )?;
        run_cmd(&mut Command::new("sync"))?;
        m.stop();
        let after = self.sessions_cpu()?;
        Ok(m.finish(after - before))
    }

    /// CPU seconds of the sshd's sessions it has reaped so far, once it
    /// has reaped all of them.
    fn sessions_cpu(&self) -> anyhow::Result<f64> {
        let pid = self.child.id();
        let children = format!("/proc/{pid}/task/{pid}/children");
        for _ in 0..200 {
            if std::fs::read_to_string(&children)?.trim().is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        // Fields after the command's closing parenthesis start at field 3;
        // cutime and cstime are fields 16 and 17.
        let rest = stat.rsplit_once(')').context("/proc/PID/stat")?.1;
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 = f[13].parse::<f64>()? + f[14].parse::<f64>()?;
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        Ok(ticks / hz)
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts an `intact serve` command line; returns it and the address it
/// printed.
pub(crate) fn start_server(cmd: &mut Command) -> anyhow::Result<(Child, String)> {
    let mut server = cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn()?;
    let mut line = String::new();
    BufReader::new(server.stdout.take().expect("piped")).read_line(&mut line)?;
    let addr = line
        .split("listening on ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .context("no address from intact serve")?
        .to_string();
    Ok((server, addr))
}

//! `intact-bench transfer`: intact send/copy against a raw TCP pipe, cp,
//! rsync and rsync over ssh, on the same datasets in the same run, with
//! the page cache dropped before every run. Each timed run ends with
//! `sync`, so tools that do not fsync (cp, rsync, tar) are charged for
//! their writeback as intact is for its fsyncs.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};

use crate::runner::{have, intact_binary, median};

#[derive(clap::Args)]
pub struct TransferArgs {
    /// Directory for datasets and destinations (on a real disk, not tmpfs).
    #[arg(long, default_value = "/var/tmp/intact-bench")]
    dir: PathBuf,
    /// Runs per measurement (the median is reported).
    #[arg(long, default_value_t = 3)]
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
}

pub(crate) struct Dataset {
    pub name: &'static str,
    pub files: u64,
    pub file_size: u64,
}

const MIB: u64 = 1 << 20;

/// A named tool: one timed run from the dataset into a fresh destination.
type Tool<'a> = (&'a str, Box<dyn Fn() -> anyhow::Result<f64> + 'a>);

pub fn run(a: &TransferArgs) -> anyhow::Result<()> {
    let intact = intact_binary()?;
    for need in ["tar", "cp", "rsync"] {
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
    std::fs::create_dir_all(&a.dir)?;
    let ssh = if a.no_ssh {
        None
    } else {
        Some(Sshd::start(&a.dir.join("sshd"))?)
    };
    let can_drop = drop_caches();
    println!(
        "intact-bench transfer: median of {} runs, page cache {}, each run ends with sync; MiB/s (higher is better)",
        a.runs,
        if can_drop { "dropped before each run" } else { "NOT dropped (not root)" }
    );
    for d in all
        .iter()
        .filter(|d| a.datasets.is_empty() || a.datasets.iter().any(|n| n == d.name))
    {
        let src_parent = a.dir.join(format!("src-{}", d.name));
        let src = src_parent.join("data");
        make_dataset(&src, d)?;
        let bytes = d.files * d.file_size;
        println!(
            "\n{}: {} file(s) of {} KiB, {:.0} MiB\n",
            d.name,
            d.files,
            d.file_size / 1024,
            bytes as f64 / MIB as f64
        );
        println!("| tool | median s | MiB/s | vs raw TCP pipe | vs rsync over ssh |");
        println!("|---|---:|---:|---:|---:|");
        let dst = a.dir.join("dst");
        let mut tools: Vec<Tool<'_>> = vec![
            (
                "intact send --verify none",
                Box::new(|| intact_send(&intact, &src, &dst, "none")),
            ),
            (
                "intact send --verify fiver",
                Box::new(|| intact_send(&intact, &src, &dst, "fiver")),
            ),
            (
                "intact copy --verify none",
                Box::new(|| {
                    timed(&dst, || {
                        run_cmd(
                            Command::new(&intact)
                                .args(["copy", "--verify", "none"])
                                .arg(&src)
                                .arg(&dst),
                        )
                    })
                }),
            ),
            (
                "raw TCP pipe (tar | socket | tar)",
                Box::new(|| tar_pipe(&src, &dst)),
            ),
            (
                "cp -r",
                Box::new(|| {
                    timed(&dst, || {
                        run_cmd(Command::new("cp").arg("-r").arg(&src).arg(&dst))
                    })
                }),
            ),
            (
                "rsync -a",
                Box::new(|| {
                    timed(&dst, || {
                        run_cmd(
                            Command::new("rsync")
                                .arg("-a")
                                .arg(&src)
                                .arg(format!("{}/", dst.display())),
                        )
                    })
                }),
            ),
        ];
        if let Some(s) = &ssh {
            tools.push((
                "rsync -a -e ssh (127.0.0.1)",
                Box::new(|| timed(&dst, || s.rsync(&src, &dst))),
            ));
        }
        let mut results = Vec::new();
        for (name, f) in &tools {
            let mut times = Vec::new();
            for _ in 0..a.runs {
                fresh(&dst)?;
                drop_caches();
                times.push(f().with_context(|| name.to_string())?);
            }
            results.push((name.to_string(), median(times)));
        }
        fresh(&dst)?;
        let find = |prefix: &str| {
            results
                .iter()
                .find(|(n, _)| n.starts_with(prefix))
                .map(|r| r.1)
        };
        let pipe = find("raw TCP pipe");
        let rsync_ssh = find("rsync -a -e ssh");
        for (name, t) in &results {
            let ratio =
                |other: Option<f64>| other.map_or("–".into(), |o| format!("{:.2}", o / t));
            println!(
                "| {name} | {t:.2} | {:.0} | {} | {} |",
                bytes as f64 / MIB as f64 / t,
                ratio(pipe),
                ratio(rsync_ssh)
            );
        }
    }
    println!("\nratio = other tool's time / this tool's time (> 1: this tool is faster).");
    println!("command: cargo run --release -p intact-bench -- transfer");
    Ok(())
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
pub(crate) fn timed(_dst: &Path, f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let t = Instant::now();
    f()?;
    run_cmd(&mut Command::new("sync"))?;
    Ok(t.elapsed().as_secs_f64())
}

/// A fresh server per run (so its journal does not skip anything), timed
/// from the send's start to the end of the final sync.
fn intact_send(intact: &Path, src: &Path, dst: &Path, verify: &str) -> anyhow::Result<f64> {
    let mut cmd = Command::new(intact);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--root"])
        .arg(dst);
    let (mut server, addr) = start_server(&mut cmd)?;
    let t = timed(dst, || {
        run_cmd(
            Command::new(intact)
                .args(["send", "--verify", verify])
                .arg(src)
                .arg(&addr),
        )
    });
    let _ = server.kill();
    let _ = server.wait();
    t
}

/// tar into a loopback socket, untarred at the other end.
fn tar_pipe(src: &Path, dst: &Path) -> anyhow::Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let t = Instant::now();
    let mut untar = Command::new("tar")
        .args(["-xf", "-", "-C"])
        .arg(dst)
        .stdin(Stdio::piped())
        .spawn()?;
    let mut untar_in = untar.stdin.take().expect("piped");
    let receiver = std::thread::spawn(move || -> std::io::Result<u64> {
        let (mut sock, _) = listener.accept()?;
        std::io::copy(&mut sock, &mut untar_in)
    });
    let mut tar = Command::new("tar")
        .args(["-cf", "-", "-C"])
        .arg(src.parent().expect("dataset has a parent"))
        .arg(src.file_name().expect("dataset has a name"))
        .stdout(Stdio::piped())
        .spawn()?;
    let mut out = tar.stdout.take().expect("piped");
    let mut sock = TcpStream::connect(addr)?;
    std::io::copy(&mut out, &mut sock)?;
    sock.flush()?;
    drop(sock);
    tar.wait()?;
    receiver.join().expect("receiver thread")?;
    if !untar.wait()?.success() {
        bail!("tar -x failed");
    }
    run_cmd(&mut Command::new("sync"))?;
    Ok(t.elapsed().as_secs_f64())
}

/// An sshd on a free loopback port with its own host and client keys.
struct Sshd {
    child: Child,
    port: u16,
    key: PathBuf,
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
        let s = Sshd {
            child,
            port,
            key: dir.join("client"),
        };
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

    fn rsync(&self, src: &Path, dst: &Path) -> anyhow::Result<()> {
        run_cmd(
            Command::new("rsync")
                .args(["-a", "-e", &self.ssh_args()])
                .arg(src)
                .arg(format!("127.0.0.1:{}/", dst.display())),
        )
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

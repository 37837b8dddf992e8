//! The raw pipe: the baseline of the transfer tables. One pass, no relay
//! through a third process: the sender `sendfile`s each file into one
//! loopback TCP socket behind a minimal header (path length, path, size);
//! the receiver reads 1 MiB at a time, writes, fsyncs every file and, at
//! the end, every directory it created. No checksum, no encryption: the
//! least a transfer that ends durable on the destination has to do.
//!
//! Both ends are hidden subcommands of intact-bench, run as child
//! processes so that their CPU time is counted like every other tool's.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};

use crate::runner::{Meter, Sample};
use crate::transfer::run_cmd;

/// Bytes per read and write at the receiver.
const CHUNK: usize = 1 << 20;

#[derive(clap::Args)]
pub struct PipeRecvArgs {
    /// Directory the files are written under.
    dst: PathBuf,
}

#[derive(clap::Args)]
pub struct PipeSendArgs {
    /// File or directory to send (arrives under its own name).
    src: PathBuf,
    /// The receiver's address.
    addr: String,
}

/// Receives one connection's files under `dst`; prints the address it
/// listens on first.
pub fn recv(a: &PipeRecvArgs) -> anyhow::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    println!("listening on {}", listener.local_addr()?);
    std::io::stdout().flush()?;
    let (mut sock, _) = listener.accept()?;
    let mut buf = vec![0u8; CHUNK];
    let mut dirs = BTreeSet::from([a.dst.clone()]);
    loop {
        let mut len = [0u8; 4];
        sock.read_exact(&mut len)?;
        let len = u32::from_le_bytes(len) as usize;
        if len == 0 {
            break;
        }
        let mut name = vec![0u8; len];
        sock.read_exact(&mut name)?;
        let rel = PathBuf::from(OsString::from_vec(name));
        if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            bail!("refusing path {}", rel.display());
        }
        let mut size = [0u8; 8];
        sock.read_exact(&mut size)?;
        let mut left = u64::from_le_bytes(size);
        let path = a.dst.join(&rel);
        let parent = path.parent().context("a file has a parent")?;
        if !dirs.contains(parent) {
            std::fs::create_dir_all(parent)?;
            for d in parent.ancestors().take_while(|d| d.starts_with(&a.dst)) {
                dirs.insert(d.to_path_buf());
            }
        }
        let mut f = File::create(&path).with_context(|| path.display().to_string())?;
        while left > 0 {
            let n = left.min(CHUNK as u64) as usize;
            sock.read_exact(&mut buf[..n])?;
            f.write_all(&buf[..n])?;
            left -= n as u64;
        }
        f.sync_all()?;
    }
    // Deepest first, so that each directory's entry in its parent is
    // durable before the parent is synced.
    for d in dirs.iter().rev() {
        File::open(d)?.sync_all()?;
    }
    Ok(())
}

/// Sends `src` (a file or a tree) to a receiver.
pub fn send(a: &PipeSendArgs) -> anyhow::Result<()> {
    let base = a.src.parent().context("the source has a parent")?;
    let mut files = Vec::new();
    walk(&a.src, &mut files)?;
    let mut sock = TcpStream::connect(&a.addr)?;
    for path in files {
        let rel = path.strip_prefix(base)?.as_os_str().as_bytes();
        let file = File::open(&path)?;
        let size = file.metadata()?.len();
        let mut header = Vec::with_capacity(12 + rel.len());
        header.extend((rel.len() as u32).to_le_bytes());
        header.extend(rel);
        header.extend(size.to_le_bytes());
        sock.write_all(&header)?;
        let mut off: libc::off_t = 0;
        while (off as u64) < size {
            let want = (size - off as u64).min(1 << 30) as usize;
            // SAFETY: both descriptors are open for the call; `off` is ours.
            let n = unsafe { libc::sendfile(sock.as_raw_fd(), file.as_raw_fd(), &mut off, want) };
            if n < 0 {
                return Err(std::io::Error::last_os_error()).context("sendfile");
            }
            if n == 0 {
                bail!("{} shrank while being sent", path.display());
            }
        }
    }
    sock.write_all(&0u32.to_le_bytes())?;
    sock.shutdown(std::net::Shutdown::Write)?;
    // Wait for the receiver to finish (it closes after its last fsync).
    let _ = sock.read(&mut [0u8; 1]);
    Ok(())
}

/// Regular files under `p` (or `p` itself), in name order.
fn walk(p: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let meta = std::fs::symlink_metadata(p)?;
    if meta.is_file() {
        out.push(p.to_path_buf());
    } else if meta.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(p)?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()?;
        entries.sort();
        for e in entries {
            walk(&e, out)?;
        }
    }
    Ok(())
}

/// One timed raw-pipe transfer of `src` into `dst`, ending with `sync`
/// like every other tool's run.
pub fn timed(src: &Path, dst: &Path) -> anyhow::Result<Sample> {
    let exe = std::env::current_exe()?;
    let mut meter = Meter::start();
    let mut recv = Command::new(&exe)
        .arg("pipe-recv")
        .arg(dst)
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(recv.stdout.take().expect("piped")).read_line(&mut line)?;
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .context("no address from pipe-recv")?
        .to_string();
    meter.go();
    let sent = run_cmd(Command::new(&exe).arg("pipe-send").arg(src).arg(&addr));
    if sent.is_err() {
        let _ = recv.kill();
    }
    let received = recv.wait()?;
    sent?;
    if !received.success() {
        bail!("pipe-recv exited with {received}");
    }
    run_cmd(&mut Command::new("sync"))?;
    meter.stop();
    Ok(meter.finish(0.0))
}

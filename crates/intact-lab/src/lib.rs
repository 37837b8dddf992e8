//! intact's fault lab: every fault against every verification mode, with
//! ground truth from outside the tool under test.
//!
//! [`run_matrix`] runs each [`Fault`] × mode × size as one [`Cell`]: it
//! builds a fresh loop-mounted ext4 (intact-faults), transfers with
//! `intact send` into a server in this process (so that fault hooks can sit
//! in its receiver) or, for crashes, with the real `intact` binary, then
//! reads what the *device* holds (the page cache dropped and `mincore`
//! confirming it) and compares it with the source. Each cell ends in an
//! [`Outcome`]; a cell whose fault left no trace is [`Outcome::NoEffect`],
//! so an injector that silently does nothing cannot pass.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::FileExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use intact_faults::{FlipProxy, LoopFs, ProxyFault};
use intact_transfer::{
    send, CopyReport, LinkFault, LocalServer, ReceiveOptions, SendOptions, ServerConfig,
    VerifyMode, WriteHook,
};

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

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LabError {
    let what = what.into();
    move |source| LabError::Io { what, source }
}

/// A fault the lab injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// One bit flipped on the destination device under the middle block,
    /// after it was written and before it was verified; the page cache
    /// keeps the good copy (an undetected write error).
    DeviceWrite,
    /// The first bit of every 4 KiB page flipped on the device under every
    /// block, once each (the RIVA paper's extreme injection).
    DeviceWriteExtreme,
    /// The source's page cache holds a flipped bit while its device holds
    /// the right bytes (an undetected read error).
    SourceRead,
    /// A proxy flips one bit of the block data on the wire.
    NetworkFlip,
    /// A proxy cuts the connection halfway, then the same send again.
    NetworkCut,
    /// A proxy swallows everything after halfway (the server's idle
    /// timeout ends the session), then the same send again.
    NetworkStall,
    /// A bit flipped in a received buffer after its digest was checked and
    /// before it was written (the Z²FS t0–t1 window).
    Memory,
    /// The sender SIGKILLed at a random point, then the same send again.
    CrashSender,
    /// The server SIGKILLed at a random point, restarted, the send again.
    CrashServer,
    /// The destination file system fills up; space is freed; the send again.
    DiskFull,
}

impl Fault {
    /// Every fault, in table order.
    pub const ALL: [Fault; 10] = [
        Fault::DeviceWrite,
        Fault::DeviceWriteExtreme,
        Fault::SourceRead,
        Fault::NetworkFlip,
        Fault::NetworkCut,
        Fault::NetworkStall,
        Fault::Memory,
        Fault::CrashSender,
        Fault::CrashServer,
        Fault::DiskFull,
    ];

    /// Name in tables and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Fault::DeviceWrite => "device-write",
            Fault::DeviceWriteExtreme => "device-write-extreme",
            Fault::SourceRead => "source-read",
            Fault::NetworkFlip => "network-flip",
            Fault::NetworkCut => "network-cut",
            Fault::NetworkStall => "network-stall",
            Fault::Memory => "memory",
            Fault::CrashSender => "crash-sender",
            Fault::CrashServer => "crash-server",
            Fault::DiskFull => "disk-full",
        }
    }
}

impl std::str::FromStr for Fault {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Fault::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| format!("unknown fault '{s}'"))
    }
}

/// How a cell ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// The run succeeded after detecting the fault (a resend, a resume) and
    /// the device holds the source's bytes.
    Repaired,
    /// The run reported failure and no wrong file carries a final name.
    FailedClean,
    /// Silent corruption: the run succeeded but the device holds wrong
    /// bytes (or a failed run left a wrong file under its final name).
    Missed,
    /// The fault left no trace: not injected, or without effect. A lab
    /// bug, never a pass.
    NoEffect,
}

impl Outcome {
    /// Short form for tables.
    pub fn short(self) -> &'static str {
        match self {
            Outcome::Repaired => "repaired",
            Outcome::FailedClean => "failed",
            Outcome::Missed => "MISSED",
            Outcome::NoEffect => "NO-EFFECT",
        }
    }
}

/// One fault × mode × size.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Cell {
    /// The fault.
    pub fault: Fault,
    /// The verification mode.
    pub mode: VerifyMode,
    /// File size in bytes.
    pub size: u64,
    /// How it ended.
    pub outcome: Outcome,
    /// Evidence that the fault took effect.
    pub evidence: String,
    /// Anything else worth reading.
    pub detail: String,
    /// Wall-clock seconds.
    pub seconds: f64,
}

impl Cell {
    /// "fault × mode × size".
    pub fn label(&self) -> String {
        format!(
            "{} × {} × {}",
            self.fault.name(),
            self.mode,
            size_name(self.size)
        )
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct MatrixConfig {
    /// Work directory on a real disk (images, sources).
    pub dir: PathBuf,
    /// File sizes.
    pub sizes: Vec<u64>,
    /// Verification modes.
    pub modes: Vec<VerifyMode>,
    /// Faults.
    pub faults: Vec<Fault>,
    /// Kill-and-resume trials per crash cell.
    pub crash_trials: u32,
    /// The `intact` binary, for the crash faults (they need a process to kill).
    pub intact: Option<PathBuf>,
}

/// The whole run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Matrix {
    /// Every cell, in order.
    pub cells: Vec<Cell>,
    /// Physical memory here, in bytes: files below it stay cached.
    pub ram_bytes: u64,
    /// What could not be run, and why.
    pub skipped: Vec<String>,
    /// Loop devices left attached under the work directory afterwards.
    pub leftover_loops: Vec<String>,
}

impl Matrix {
    /// Why this run must fail CI: a riva cell not repaired, a fault that
    /// left no trace, a loop device left behind.
    pub fn problems(&self) -> Vec<String> {
        let mut p: Vec<String> = self
            .cells
            .iter()
            .filter(|c| {
                c.outcome == Outcome::NoEffect
                    || (c.mode == VerifyMode::Riva && c.outcome != Outcome::Repaired)
            })
            .map(|c| format!("{}: {} ({})", c.label(), c.outcome.short(), c.detail))
            .collect();
        p.extend(
            self.leftover_loops
                .iter()
                .map(|l| format!("loop device left attached: {l}")),
        );
        p
    }
}

/// 1 MiB, 100 MiB, 1 GiB.
pub fn size_name(b: u64) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
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
        skipped: Vec::new(),
        leftover_loops: Vec::new(),
    };
    if let Err(why) = intact_faults::usable() {
        m.skipped.push(format!("every cell: {why}"));
        return Ok(m);
    }
    for &size in &cfg.sizes {
        let src = source_file(&cfg.dir, size)?;
        for &fault in &cfg.faults {
            for &mode in &cfg.modes {
                let crash = matches!(fault, Fault::CrashSender | Fault::CrashServer);
                let intact = cfg.intact.as_deref().unwrap_or(Path::new(""));
                if crash && cfg.intact.is_none() {
                    m.skipped
                        .push(format!("{}: no intact binary given", fault.name()));
                    continue;
                }
                let t = Instant::now();
                let mut cell = run_cell(cfg, fault, mode, size, &src, intact)?;
                cell.seconds = t.elapsed().as_secs_f64();
                progress(&cell);
                m.cells.push(cell);
            }
        }
    }
    m.skipped.dedup();
    m.leftover_loops = intact_faults::loop_devices_of(&cfg.dir);
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

/// Whether the device under `dest` holds the bytes of `src`: the page
/// cache of `dest` is dropped first and `mincore` must confirm it.
fn device_equals(dest: &Path, src: &Path) -> Result<bool, LabError> {
    let Ok(d) = File::open(dest) else {
        return Ok(false);
    };
    let len = d.metadata().map_err(io("stat"))?.len();
    let ev = intact_cache::evict(&d, 0, len).map_err(|e| LabError::Io {
        what: "evicting the destination for the ground truth".into(),
        source: e.into(),
    })?;
    if ev.resident != 0 {
        return Err(LabError::Io {
            what: format!("{} pages of {} stayed cached", ev.resident, dest.display()),
            source: std::io::Error::other("cannot read the device"),
        });
    }
    let mut s = File::open(src).map_err(io("opening the source"))?;
    if s.metadata().map_err(io("stat"))?.len() != len {
        return Ok(false);
    }
    let mut d = d;
    let (mut a, mut b) = (vec![0u8; 4 << 20], vec![0u8; 4 << 20]);
    loop {
        let n = d.read(&mut a).map_err(io("reading the destination"))?;
        if n == 0 {
            return Ok(true);
        }
        s.read_exact(&mut b[..n])
            .map_err(io("reading the source"))?;
        if a[..n] != b[..n] {
            return Ok(false);
        }
    }
}

/// The block size the lab sends with (intact's default).
const BLOCK: u64 = 4 << 20;

fn opts(mode: VerifyMode) -> SendOptions {
    SendOptions {
        verify: mode,
        block_size: BLOCK as usize,
        streams: 1,
        ..SendOptions::default()
    }
}

/// Runs a server in this process rooted at `root` while `f` runs.
fn with_server<T>(root: &Path, receive: ReceiveOptions, f: impl FnOnce(String) -> T) -> T {
    with_server_idle(root, receive, Duration::from_secs(20), f)
}

fn with_server_idle<T>(
    root: &Path,
    receive: ReceiveOptions,
    idle_timeout: Duration,
    f: impl FnOnce(String) -> T,
) -> T {
    let server = LocalServer::start(ServerConfig {
        idle_timeout,
        receive,
        ..ServerConfig::local(root)
    })
    .expect("a server on loopback");
    let out = f(server.addr());
    let _ = server.stop();
    out
}

fn resent(r: &CopyReport) -> u64 {
    r.files.iter().map(|f| f.blocks_resent).sum()
}

/// Judges an in-process run: its report, whether the fault was injected,
/// and the device's bytes.
fn judge(
    report: Result<CopyReport, intact_transfer::TransferError>,
    injected: bool,
    final_path: &Path,
    src: &Path,
) -> Result<(Outcome, String), LabError> {
    if !injected {
        return Ok((Outcome::NoEffect, "the injector never fired".into()));
    }
    let (ok, detail) = match &report {
        Ok(r) if r.failed == 0 => (true, format!("{} blocks resent", resent(r))),
        Ok(r) => (
            false,
            r.files
                .iter()
                .find_map(|f| f.error.clone())
                .unwrap_or_default(),
        ),
        Err(e) => (false, e.to_string()),
    };
    let exists = final_path.exists();
    let equal = exists && device_equals(final_path, src)?;
    let detected = report.as_ref().is_ok_and(|r| resent(r) > 0);
    Ok(match (ok, equal) {
        (true, true) if detected => (Outcome::Repaired, detail),
        (true, true) => (
            Outcome::NoEffect,
            format!("success, right bytes, nothing resent: {detail}"),
        ),
        (true, false) => (
            Outcome::Missed,
            format!("reported verified; the device differs; {detail}"),
        ),
        (false, _) if exists && !equal => (
            Outcome::Missed,
            format!("failed, but a wrong file has its final name: {detail}"),
        ),
        (false, _) => (Outcome::FailedClean, detail),
    })
}

fn run_cell(
    cfg: &MatrixConfig,
    fault: Fault,
    mode: VerifyMode,
    size: u64,
    src: &Path,
    intact: &Path,
) -> Result<Cell, LabError> {
    // Room for a copy of the source and the destination, plus ext4's own
    // (journal, inode tables: about 1/16 of a small file system).
    let mib = (size >> 20) * 2 + 128 + (size >> 20) / 8;
    let lfs = Arc::new(LoopFs::new(&cfg.dir, mib).map_err(io("making the loop file system"))?);
    let root = lfs.mnt().join("root");
    let final_path = root.join("data.bin");
    let blocks = size.div_ceil(BLOCK).max(1);
    let mid = blocks / 2;
    let (outcome, evidence, detail) = match fault {
        Fault::DeviceWrite | Fault::DeviceWriteExtreme => {
            let seen = Arc::new(Mutex::new(HashSet::new()));
            let fired = Arc::new(AtomicU64::new(0));
            let hook: WriteHook = {
                let (lfs, seen, fired) = (Arc::clone(&lfs), Arc::clone(&seen), Arc::clone(&fired));
                Arc::new(
                    move |file: &File, _: &str, index: u64, offset: u64, len: usize| {
                        if !seen.lock().expect("no panic").insert(index) {
                            return;
                        }
                        let r = if fault == Fault::DeviceWrite {
                            if index != mid {
                                return;
                            }
                            lfs.flip_bit_under(file, offset + len as u64 / 2)
                                .map(|()| 1)
                        } else {
                            lfs.flip_every_page_under(file, offset, len as u64)
                        };
                        if let Ok(n) = r {
                            fired.fetch_add(n, Ordering::SeqCst);
                        }
                    },
                )
            };
            let receive = ReceiveOptions {
                after_write: Some(hook),
                after_check: None,
                ..ReceiveOptions::default()
            };
            let report = with_server(&root, receive, |addr| {
                send(&[src.to_path_buf()], &addr, &opts(mode), &|_| {})
            });
            let n = fired.load(Ordering::SeqCst);
            let (o, d) = judge(report, n > 0, &final_path, src)?;
            (o, format!("{n} page(s) flipped on the device"), d)
        }
        Fault::Memory => {
            let fired = Arc::new(AtomicBool::new(false));
            let hook: LinkFault = {
                let fired = Arc::clone(&fired);
                Arc::new(move |_: &str, index: u64, data: &mut [u8]| {
                    if index == mid && !fired.swap(true, Ordering::SeqCst) {
                        let at = data.len() / 2;
                        data[at] ^= 1;
                    }
                })
            };
            let receive = ReceiveOptions {
                after_write: None,
                after_check: Some(hook),
                ..ReceiveOptions::default()
            };
            let report = with_server(&root, receive, |addr| {
                send(&[src.to_path_buf()], &addr, &opts(mode), &|_| {})
            });
            let f = fired.load(Ordering::SeqCst);
            let (o, d) = judge(report, f, &final_path, src)?;
            (o, "1 bit flipped in a checked buffer".into(), d)
        }
        Fault::NetworkFlip => {
            let (report, flipped) = with_server(&root, ReceiveOptions::default(), |addr| {
                // Deep in the stream: inside the data of the middle block.
                let proxy = FlipProxy::start(addr, ProxyFault::FlipAt(vec![4096 + size / 2]))
                    .expect("proxy on loopback");
                let r = send(&[src.to_path_buf()], &proxy.addr(), &opts(mode), &|_| {});
                (r, proxy.flipped())
            });
            let (o, d) = judge(report, flipped > 0, &final_path, src)?;
            (o, format!("{flipped} bit(s) flipped on the wire"), d)
        }
        Fault::NetworkCut | Fault::NetworkStall => {
            let half = 4096 + size / 2;
            let (fault_kind, idle) = if fault == Fault::NetworkCut {
                (ProxyFault::CutAfter(half), Duration::from_secs(20))
            } else {
                (ProxyFault::StallAfter(half), Duration::from_secs(2))
            };
            let (first, hit) = with_server_idle(&root, ReceiveOptions::default(), idle, |addr| {
                let proxy = FlipProxy::start(addr, fault_kind).expect("proxy on loopback");
                let r = send(&[src.to_path_buf()], &proxy.addr(), &opts(mode), &|_| {});
                (r, proxy.cut())
            });
            let failed = first.as_ref().map_or(true, |r| r.failed > 0);
            let named_wrong = final_path.exists() && !device_equals(&final_path, src)?;
            if hit == 0 || !failed {
                (
                    Outcome::NoEffect,
                    "the connection was not interrupted".into(),
                    String::new(),
                )
            } else if named_wrong {
                (
                    Outcome::Missed,
                    "interrupted".into(),
                    "a wrong file has its final name".into(),
                )
            } else {
                let evidence = format!("the first send failed after {half} bytes on the wire");
                resume(&root, &final_path, src, mode, evidence)?
            }
        }
        Fault::SourceRead => {
            // The source on the loop file system: the device right, the
            // cache wrong.
            let sdir = lfs.mnt().join("src");
            fs::create_dir_all(&sdir).map_err(io("source dir"))?;
            let lsrc = sdir.join("data.bin");
            fs::copy(src, &lsrc).map_err(io("copying the source"))?;
            let f = File::open(&lsrc).map_err(io("opening the source"))?;
            let at = size / 2;
            let ev = intact_cache::evict(&f, 0, size).map_err(|e| io("evict")(e.into()))?;
            let mut truth = [0u8; 1];
            f.read_exact_at(&mut truth, at).map_err(io("read"))?;
            intact_cache::evict(&f, 0, size).map_err(|e| io("evict")(e.into()))?;
            lfs.flip_bit_under(&f, at)
                .map_err(io("flipping the source device"))?;
            let mut all = vec![0u8; 1 << 20];
            let mut off = 0;
            while off < size {
                let n = (size - off).min(1 << 20) as usize;
                f.read_exact_at(&mut all[..n], off).map_err(io("read"))?;
                off += n as u64;
            }
            let mut cached = [0u8; 1];
            f.read_exact_at(&mut cached, at).map_err(io("read"))?;
            lfs.flip_bit_under(&f, at)
                .map_err(io("restoring the source device"))?;
            let injected = ev.resident == 0 && cached != truth;
            let report = with_server(&root, ReceiveOptions::default(), |addr| {
                send(std::slice::from_ref(&lsrc), &addr, &opts(mode), &|_| {})
            });
            let (o, d) = judge(report, injected, &final_path, src)?;
            (
                o,
                "the source cache holds a flipped bit, its device does not".into(),
                d,
            )
        }
        Fault::DiskFull => disk_full(&lfs, &root, &final_path, src, size, mode)?,
        Fault::CrashSender | Fault::CrashServer => {
            crash(cfg, fault, &lfs, src, size, mode, intact)?
        }
    };
    Ok(Cell {
        fault,
        mode,
        size,
        outcome,
        evidence,
        detail,
        seconds: 0.0,
    })
}

fn disk_full(
    lfs: &LoopFs,
    root: &Path,
    final_path: &Path,
    src: &Path,
    size: u64,
    mode: VerifyMode,
) -> Result<(Outcome, String, String), LabError> {
    fs::create_dir_all(root).map_err(io("root"))?;
    // Leave room for half the file.
    let filler = lfs.mnt().join("filler");
    let free = free_bytes(lfs.mnt())?;
    let fill = free.saturating_sub(size / 2);
    let f = File::create(&filler).map_err(io("filler"))?;
    // SAFETY: plain syscall on a valid fd.
    let r = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, fill as i64) };
    if r != 0 {
        return Err(io("fallocate")(std::io::Error::last_os_error()));
    }
    drop(f);
    let first = with_server(root, ReceiveOptions::default(), |addr| {
        send(&[src.to_path_buf()], &addr, &opts(mode), &|_| {})
    });
    let failed = match &first {
        Ok(r) => r.failed > 0,
        Err(_) => true,
    };
    let why = match &first {
        Ok(r) => r
            .files
            .iter()
            .find_map(|f| f.error.clone())
            .unwrap_or_default(),
        Err(e) => e.to_string(),
    };
    let named = final_path.exists();
    fs::remove_file(&filler).map_err(io("removing the filler"))?;
    if !failed {
        return Ok((Outcome::NoEffect, "the disk did not fill".into(), why));
    }
    if named {
        return Ok((
            Outcome::Missed,
            "a file got its final name on a full disk".into(),
            why,
        ));
    }
    resume(
        root,
        final_path,
        src,
        mode,
        format!("first run failed: {why}"),
    )
}

/// Sends again after an interrupted run; repaired only if it completes
/// and the device holds the source's bytes.
fn resume(
    root: &Path,
    final_path: &Path,
    src: &Path,
    mode: VerifyMode,
    evidence: String,
) -> Result<(Outcome, String, String), LabError> {
    let second = with_server(root, ReceiveOptions::default(), |addr| {
        send(&[src.to_path_buf()], &addr, &opts(mode), &|_| {})
    });
    let ok = second.as_ref().is_ok_and(|r| r.failed == 0);
    let skipped: u64 = second
        .as_ref()
        .map(|r| r.files.iter().map(|f| f.bytes_skipped).sum())
        .unwrap_or(0);
    Ok(match (ok, ok && device_equals(final_path, src)?) {
        (true, true) => (
            Outcome::Repaired,
            evidence,
            format!("resumed, {skipped} bytes not sent again"),
        ),
        (true, false) => (
            Outcome::Missed,
            evidence,
            "resumed; the device differs".into(),
        ),
        (false, _) => (
            Outcome::FailedClean,
            evidence,
            "the resume failed too".into(),
        ),
    })
}

fn free_bytes(path: &Path) -> Result<u64, LabError> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("no NUL");
    // SAFETY: statvfs fills the zeroed struct we own.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io("statvfs")(std::io::Error::last_os_error()));
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// A real `intact serve` on 127.0.0.1:0; killed when dropped.
struct ServerProcess {
    child: Child,
    addr: String,
}

impl ServerProcess {
    fn start(intact: &Path, root: &Path, kill_after: Option<u64>) -> Result<Self, LabError> {
        let mut cmd = Command::new(intact);
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--root"])
            .arg(root);
        if let Some(n) = kill_after {
            cmd.env("INTACT_FAULT_KILL_AFTER_BYTES", n.to_string());
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(io("starting intact serve"))?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .map_err(io("reading the server's address"))?;
        let addr = line
            .split("listening on ")
            .nth(1)
            .and_then(|s| s.split(',').next())
            .unwrap_or_default()
            .to_string();
        Ok(ServerProcess { child, addr })
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn send_process(
    intact: &Path,
    src: &Path,
    addr: &str,
    mode: VerifyMode,
    kill_after: Option<u64>,
) -> Result<(std::process::ExitStatus, Option<serde_json::Value>), LabError> {
    let mut cmd = Command::new(intact);
    cmd.args(["send", "--json", "--streams", "1", "--verify", mode.name()])
        .arg(src)
        .arg(addr);
    if let Some(n) = kill_after {
        cmd.env("INTACT_FAULT_KILL_AFTER_BYTES", n.to_string());
    }
    let out = cmd.output().map_err(io("running intact send"))?;
    let mut json: Option<serde_json::Value> = serde_json::from_slice(&out.stdout).ok();
    if let Some(v) = json.as_mut() {
        v["stderr"] = String::from_utf8_lossy(&out.stderr).trim().into();
    }
    Ok((out.status, json))
}

/// Kill-and-resume trials: each kills one side at a pseudo-random point,
/// checks that no wrong file carries the final name, resumes, and checks
/// the device; a third send must find everything in place.
fn crash(
    cfg: &MatrixConfig,
    fault: Fault,
    lfs: &LoopFs,
    src: &Path,
    size: u64,
    mode: VerifyMode,
    intact: &Path,
) -> Result<(Outcome, String, String), LabError> {
    let mut seed = size ^ (mode.wire_id() as u64) << 32 ^ 0x9e37_79b9;
    let mut killed = 0;
    for trial in 0..cfg.crash_trials {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let at = 1 + (seed >> 11) % size.max(2).saturating_sub(1);
        let root = lfs.mnt().join(format!("root{trial}"));
        let final_path = root.join("data.bin");
        let first = if fault == Fault::CrashSender {
            let server = ServerProcess::start(intact, &root, None)?;
            send_process(intact, src, &server.addr, mode, Some(at))?.0
        } else {
            let server = ServerProcess::start(intact, &root, Some(at))?;
            let r = send_process(intact, src, &server.addr, mode, None)?.0;
            drop(server);
            r
        };
        let was_killed = if fault == Fault::CrashSender {
            first.signal() == Some(libc::SIGKILL)
        } else {
            !first.success()
        };
        if !was_killed {
            // The kill point fell after the last byte moved: no crash here.
            continue;
        }
        killed += 1;
        if final_path.exists() && !device_equals(&final_path, src)? {
            return Ok((
                Outcome::Missed,
                format!("trial {trial}: killed after {at} bytes"),
                "an unverified file carried its final name".into(),
            ));
        }
        let server = ServerProcess::start(intact, &root, None)?;
        let (status, json) = send_process(intact, src, &server.addr, mode, None)?;
        if !status.success() {
            let why = json
                .as_ref()
                .and_then(|v| v["stderr"].as_str())
                .unwrap_or("");
            return Ok((
                Outcome::FailedClean,
                format!("trial {trial}: killed after {at} bytes"),
                format!("the resumed send failed: {why}"),
            ));
        }
        if !device_equals(&final_path, src)? {
            return Ok((
                Outcome::Missed,
                format!("trial {trial}: killed after {at} bytes"),
                "the resumed send succeeded; the device differs".into(),
            ));
        }
        let sent = json
            .as_ref()
            .and_then(|v| v["bytes_sent"].as_u64())
            .unwrap_or(u64::MAX);
        // The journal is consistent: a third send moves nothing.
        let (status, json) = send_process(intact, src, &server.addr, mode, None)?;
        let again = json.as_ref().and_then(|v| v["bytes_sent"].as_u64());
        if !status.success() || again != Some(0) {
            return Ok((
                Outcome::FailedClean,
                format!("trial {trial}: killed after {at} bytes"),
                format!("a third send was not a no-op (sent {again:?})"),
            ));
        }
        if sent > size {
            return Ok((
                Outcome::FailedClean,
                format!("trial {trial}"),
                format!("the resume sent {sent} bytes of {size}"),
            ));
        }
        drop(server);
        // The next trial needs the room.
        fs::remove_dir_all(&root).map_err(io("removing a trial's root"))?;
    }
    if killed == 0 {
        return Ok((
            Outcome::NoEffect,
            "no trial was killed".into(),
            String::new(),
        ));
    }
    Ok((
        Outcome::Repaired,
        format!(
            "{killed} of {} trials killed mid-transfer",
            cfg.crash_trials
        ),
        "every resume completed with the source's bytes; a third send moved nothing".into(),
    ))
}

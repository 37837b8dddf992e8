// Each test binary uses a different part of this module.
#![allow(dead_code)]

//! A real `intact serve` for the integration tests, the binary run as a
//! command, and the small trees the CLI tests copy and send.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;

pub mod wire;

/// `intact <args>`, run to its end.
pub fn intact(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_intact"))
        .args(args)
        .output()
        .unwrap()
}

/// `intact send <args>`, run to its end.
/// Runs the binary with `args` and its own state directory (copies keep
/// their catalogs there, not in the user's).
pub fn intact_in(state: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_intact"))
        .args(args)
        .env("XDG_STATE_HOME", state)
        .output()
        .unwrap()
}

pub fn send(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_intact"))
        .arg("send")
        .args(args)
        .output()
        .unwrap()
}

/// A path as a command-line argument.
/// Paths `names` under `dir` (not created).
pub fn dirs<const N: usize>(dir: &Path, names: [&str; N]) -> [PathBuf; N] {
    names.map(|n| dir.join(n))
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// data/{a.bin, sub/x.dat, sub/y.tmp} under `root`.
pub fn data(root: &Path) -> PathBuf {
    let d = root.join("data");
    fs::create_dir_all(d.join("sub")).unwrap();
    fs::write(d.join("a.bin"), b"aaa").unwrap();
    fs::write(d.join("sub/x.dat"), b"xx").unwrap();
    fs::write(d.join("sub/y.tmp"), b"yy").unwrap();
    d
}

/// Every path under `root`, relative, sorted, leaving out intact's own
/// state at the top (`.intact/`: the journal and lock a server keeps in its
/// root, and a copy when it has no usable home directory).
pub fn listing(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = walkdir::WalkDir::new(root)
        .min_depth(1)
        .into_iter()
        .filter_entry(|e| !(e.depth() == 1 && e.file_name() == ".intact"))
        .map(|e| {
            e.unwrap()
                .path()
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    v.sort();
    v
}

/// What a source (`data`) that lost files leaves at the destination `dst`:
/// a file and a directory tree the source no longer has, an excluded
/// `keep.tmp`, a file beside `data`, and a symlink `data/link` to a
/// directory `outside` in `dir` (returned) holding `precious`.
/// A destination `dst` with a stale `data/old.dat` and a file `data/sub`
/// where the source (`data`) has a directory: that entry fails, so a
/// `--delete` must delete nothing.
pub fn blocked(dst: &Path) {
    fs::create_dir_all(dst.join("data")).unwrap();
    fs::write(dst.join("data/old.dat"), b"old").unwrap();
    fs::write(dst.join("data/sub"), b"in the way").unwrap();
}

pub fn stale(dir: &Path, dst: &Path) -> PathBuf {
    fs::create_dir_all(dst.join("data/gone/deeper")).unwrap();
    fs::write(dst.join("data/gone/deeper/z"), b"z").unwrap();
    fs::write(dst.join("data/old.dat"), b"old").unwrap();
    fs::write(dst.join("data/keep.tmp"), b"excluded, so protected").unwrap();
    fs::write(dst.join("beside.dat"), b"outside what data covers").unwrap();
    let outside = dir.join("outside");
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("precious"), b"p").unwrap();
    std::os::unix::fs::symlink(&outside, dst.join("data/link")).unwrap();
    outside
}

/// A running `intact serve` on 127.0.0.1:0; killed when dropped. Its log
/// lines (standard error) arrive on `log`.
pub struct Server {
    pub child: Child,
    pub port: u16,
    pub log: mpsc::Receiver<String>,
}

impl Server {
    /// Starts a server rooted at `root`, with extra arguments and environment.
    pub fn start_with(root: &Path, args: &[&str], env: &[(&str, String)]) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_intact"));
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--root"])
            .arg(root)
            .args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Server::spawn(cmd)
    }

    /// Runs `cmd` (an `intact serve --listen 127.0.0.1:0 …` its caller
    /// prepared) and reads the port it printed.
    pub fn spawn(mut cmd: Command) -> Server {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .split("127.0.0.1:")
            .nth(1)
            .and_then(|s| s.split(',').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        let (tx, log) = mpsc::channel();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        std::thread::spawn(move || {
            for l in stderr.lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        Server { child, port, log }
    }

    /// Starts a plain server rooted at `root`.
    pub fn start(root: &Path) -> Server {
        Server::start_with(root, &[], &[])
    }

    /// host:port.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fresh ext4 of `mib` MiB on a loop device, made by the test (so that
/// the test knows a device is under it), or None after a loud, counted
/// skip where loop devices cannot be made (not root, tools missing).
pub fn loop_ext4(test: &str, mib: u64) -> Option<intact_faults::LoopFs> {
    if let Err(why) = intact_faults::usable() {
        intact_testkit::skip(test, &why);
        return None;
    }
    Some(intact_faults::LoopFs::new(Path::new(env!("CARGO_TARGET_TMPDIR")), mib).unwrap())
}

/// `path`'s bytes as its device holds them: the page cache is dropped
/// (and `mincore` shows it gone) before the read.
pub fn on_device(path: &Path) -> Vec<u8> {
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len();
    let ev = intact_cache::evict(&f, 0, len).unwrap();
    assert_eq!(
        ev.resident,
        0,
        "could not drop {} from the cache",
        path.display()
    );
    std::fs::read(path).unwrap()
}

/// A connection to 127.0.0.1:`port` from the local address `from` (any of
/// 127.0.0.0/8 is this host's loopback): a client from another host, as
/// a server's per-address limits see it.
pub fn connect_from(from: [u8; 4], port: u16) -> std::net::TcpStream {
    use std::os::fd::FromRawFd;
    let sin = |ip: [u8; 4], port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: plain socket calls on a descriptor this function owns; the
    // addresses live across the calls.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "{}", std::io::Error::last_os_error());
        let s = std::net::TcpStream::from_raw_fd(fd);
        let a = sin(from, 0);
        let r = libc::bind(fd, (&a as *const libc::sockaddr_in).cast(), len);
        assert_eq!(r, 0, "bind {from:?}: {}", std::io::Error::last_os_error());
        let b = sin([127, 0, 0, 1], port);
        let r = libc::connect(fd, (&b as *const libc::sockaddr_in).cast(), len);
        assert_eq!(r, 0, "connect: {}", std::io::Error::last_os_error());
        s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .unwrap();
        s
    }
}

/// `cmd`, whose process will have an open-file limit of `n` (a server
/// whose budgets a test reaches).
pub fn with_nofile(cmd: &mut Command, n: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The resume tests' dataset under `root`: 24 files of ~256 KiB in
/// `data/many` and a 40 MiB `data/large.dat`; its path and total bytes.
pub fn resume_dataset(root: &Path) -> (PathBuf, u64) {
    const MIB: u64 = 1 << 20;
    let src = root.join("data");
    fs::create_dir_all(src.join("many")).unwrap();
    let mut total = 0;
    for i in 0..24 {
        let len = 256 * 1024 + i * 1000;
        fs::write(
            src.join(format!("many/f{i:02}")),
            intact_sample::bytes(len as usize, i),
        )
        .unwrap();
        total += len;
    }
    fs::write(
        src.join("large.dat"),
        intact_sample::bytes(40 * MIB as usize, 99),
    )
    .unwrap();
    (src, total + 40 * MIB)
}

/// Every file under `src` has the same bytes under `dst`.
pub fn same_data(src: &Path, dst: &Path) {
    for e in walkdir::WalkDir::new(src)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
    {
        let rel = e.path().strip_prefix(src).unwrap();
        assert_eq!(
            fs::read(e.path()).unwrap(),
            fs::read(dst.join(rel)).unwrap(),
            "{rel:?}"
        );
    }
}

/// `intact report merge --json --plan PLAN` of every report in `reports`:
/// its exit status and its JSON.
pub fn merged(plan: &Path, reports: &Path) -> (Option<i32>, serde_json::Value) {
    let mut args = vec![
        "report".to_string(),
        "merge".into(),
        "--json".into(),
        "--plan".into(),
        s(plan).into(),
    ];
    for e in fs::read_dir(reports).unwrap() {
        args.push(e.unwrap().path().display().to_string());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = intact(&args);
    (
        out.status.code(),
        serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null),
    )
}

/// `intact send --json ARGS… SRC ADDR`, its exit status and its report
/// (None if stdout was not one); `victim`, if given, is named as this
/// sender's process (a proxy's KillAfter kills it).
pub fn send_json(
    args: &[&str],
    src: &Path,
    addr: &str,
    victim: Option<&intact_faults::Victim>,
) -> (std::process::ExitStatus, Option<serde_json::Value>) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_intact"));
    cmd.args(["send", "--json"])
        .args(args)
        .arg(src)
        .arg(addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    if let Some(v) = victim {
        v.set(child.id());
    }
    let out = child.wait_with_output().unwrap();
    // Shown only when the test fails: what the sender said about it.
    eprintln!(
        "intact send {:?}: {}\n{}",
        out.status,
        addr,
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status, serde_json::from_slice(&out.stdout).ok())
}

/// Files under `root` whose names say they are partial.
pub fn partials(root: &Path) -> Vec<PathBuf> {
    walkdir::WalkDir::new(root)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".intact-partial")
        })
        .map(|e| e.path().to_path_buf())
        .collect()
}

// Each test binary uses a different part of this module.
#![allow(dead_code)]

//! A real `intact serve` for the integration tests.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;

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

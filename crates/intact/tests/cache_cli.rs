//! `intact cache` as a user runs it: the relay in front of a real
//! `intact serve --recovery-cache`, a real `intact send` through it, the
//! cache's report on SIGTERM; usage errors; an encrypted session passing
//! the relay unfollowed, and the report saying so.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

mod common;
use common::{intact, send, stderr, Server};

struct Cache {
    child: Child,
    relay: String,
}

impl Cache {
    /// `intact cache --relay UPSTREAM`, serving receivers on `listen`.
    fn start(upstream: &str, listen: &str) -> Option<Cache> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_intact"))
            .args([
                "cache",
                "--relay",
                upstream,
                "--relay-listen",
                "127.0.0.1:0",
            ])
            .args(["--listen", listen, "--memory", "64MiB", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stderr.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        // "intact cache: relaying 127.0.0.1:P to …; serving receivers on …"
        let relay = line
            .split("relaying ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .map(str::to_string);
        match relay {
            Some(relay) => Some(Cache { child, relay }),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                None
            }
        }
    }

    /// SIGTERM, then the JSON report it printed.
    fn report(mut self) -> serde_json::Value {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let out = std::mem::replace(&mut self.child, Command::new("true").spawn().unwrap())
            .wait_with_output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port to give `--listen` (the cache must exist before the server that
/// names it, and the server before the relay that forwards to it).
fn free_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

fn key(dir: &Path) -> String {
    let k = dir.join("key");
    assert!(intact(&["keygen", k.to_str().unwrap()]).status.success());
    k.to_str().unwrap().to_string()
}

/// Server, then cache, retrying if another process took the cache's port
/// in between.
fn pair(root: &Path, key: &str, serve_args: &[&str]) -> (Server, Cache) {
    for _ in 0..5 {
        let listen = free_port();
        let mut args = vec!["--key-file", key, "--recovery-cache", &listen];
        args.extend_from_slice(serve_args);
        let server = Server::start_with(root, &args, &[]);
        if let Some(cache) = Cache::start(&server.addr(), &listen) {
            return (server, cache);
        }
    }
    panic!("no port for the cache in 5 tries");
}

#[test]
fn through_the_relay_blocks_are_kept_then_dropped_once_the_file_is_verified() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let src = dir.path().join("big.dat");
    std::fs::write(&src, intact_sample::bytes(9 << 20, 4)).unwrap();
    let key = key(dir.path());
    let (server, cache) = pair(&root, &key, &["--no-encrypt"]);
    let out = send(&[
        "--key-file",
        &key,
        "--block-size",
        "1MiB",
        src.to_str().unwrap(),
        &cache.relay,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read(root.join("big.dat")).unwrap(),
        std::fs::read(&src).unwrap()
    );
    let r = cache.report();
    assert_eq!(r["cached"], 9, "{r}");
    assert_eq!(r["rejected"], 0, "{r}");
    assert_eq!(
        r["store"]["dropped"], 9,
        "the verified file's blocks were dropped: {r}"
    );
    assert_eq!(r["store"]["blocks"], 0, "{r}");
    assert_eq!(r["complete"], true, "{r}");
    drop(server);
}

#[test]
fn an_encrypted_session_passes_the_relay_unfollowed_and_the_report_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let src = dir.path().join("f.dat");
    std::fs::write(&src, intact_sample::bytes(3 << 20, 5)).unwrap();
    let key = key(dir.path());
    let (server, cache) = pair(&root, &key, &[]);
    let out = send(&["--key-file", &key, src.to_str().unwrap(), &cache.relay]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read(root.join("f.dat")).unwrap(),
        std::fs::read(&src).unwrap()
    );
    let r = cache.report();
    assert_eq!(r["cached"], 0, "{r}");
    assert!(r["encrypted"].as_u64().unwrap() >= 1, "{r}");
    assert_eq!(r["complete"], false, "{r}");
    drop(server);
}

#[test]
fn usage_errors_exit_2_and_a_missing_interface_fails_with_its_name() {
    for args in [
        vec!["cache", "--listen", "127.0.0.1:0"],
        vec!["cache", "--relay", "127.0.0.1:9", "--listen", "127.0.0.1:0"],
        vec![
            "cache",
            "--capture",
            "x",
            "--listen",
            "127.0.0.1:0",
            "--memory",
            "lots",
        ],
        vec!["serve", "--root", ".", "--recovery-cache", "nohost"],
        vec!["serve", "--root", ".", "--recovery-cache", "h:0"],
    ] {
        let out = intact(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    }
    let out = intact(&[
        "cache",
        "--capture",
        "no-such-if0",
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("no-such-if0"), "{}", stderr(&out));
    let help = common::stdout(&intact(&["cache", "--help"]));
    for said in [
        "--no-encrypt",
        "BLAKE3",
        "complete: false",
        "--recovery-cache",
    ] {
        assert!(help.contains(said), "--help does not say {said}");
    }
}

#[test]
fn a_store_on_disk_serves_the_blocks_an_earlier_run_left() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("blocks");
    std::fs::create_dir(&store).unwrap();
    let data = intact_sample::bytes(70_000, 8);
    let key = *blake3::hash(&data).as_bytes();
    std::fs::write(
        store.join(blake3::Hash::from_bytes(key).to_hex().as_str()),
        &data,
    )
    .unwrap();
    for _ in 0..5 {
        let listen = free_port();
        let mut child = Command::new(env!("CARGO_BIN_EXE_intact"))
            .args([
                "cache",
                "--relay",
                "127.0.0.1:9",
                "--relay-listen",
                "127.0.0.1:0",
            ])
            .args(["--listen", &listen, "--store"])
            .arg(&store)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stderr.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        if !line.contains("1 already there") {
            let _ = child.kill();
            let _ = child.wait();
            assert!(line.contains("cannot listen"), "{line}");
            continue;
        }
        let got = intact_netcache::RecoveryCaches::new(vec![listen]).fetch(&key, data.len());
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(got.expect("served from the directory").data, data);
        return;
    }
    panic!("no port for the cache in 5 tries");
}

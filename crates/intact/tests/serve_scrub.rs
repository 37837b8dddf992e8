//! `intact serve --scrub-every` scrubs in the background while clients
//! write into the same root, without a false alarm; `intact scrub
//! --repair-from HOST:PORT` repairs from a server started with
//! `--allow-fetch`, and is refused by one that was not.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

mod common;
use common::{intact_in, s, same_data, stderr, stdout, Server};

/// Writes round `round` of the dataset: every other file's bytes change.
fn write_round(src: &Path, round: u64) {
    fs::create_dir_all(src).unwrap();
    for i in 0..40u64 {
        let seed = if i % 2 == 0 { round * 100 + i } else { i };
        fs::write(
            src.join(format!("f{i:02}")),
            intact_sample::bytes(20_000 + i as usize * 7, seed),
        )
        .unwrap();
    }
    fs::write(src.join("big"), intact_sample::bytes(2 << 20, round + 1000)).unwrap();
}

#[test]
fn a_server_scrubs_in_the_background_while_clients_write_into_its_root_with_no_false_alarm() {
    let t = tempfile::tempdir().unwrap();
    let [src, root, state] = common::dirs(t.path(), ["src", "root", "st"]);
    let server = Server::start_with(&root, &["--scrub-every", "1s"], &[]);
    let mut passes = Vec::new();
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut round = 0;
    // Sends go on until the scrub has logged passes over files while they
    // ran (and at least three rounds replaced files it scrubs).
    while (passes.len() < 3 || round < 3) && Instant::now() < deadline {
        write_round(&src, round);
        let o = intact_in(&state, &["send", s(&src), &server.addr()]);
        assert!(o.status.success(), "round {round}: {}", stderr(&o));
        while let Ok(l) = server.log.try_recv() {
            if l.contains("scrub of root:") && l.contains(" files, ") && !l.contains(": 0 files") {
                passes.push(l.clone());
            }
            lines.push(l);
        }
        round += 1;
    }
    assert!(
        passes.len() >= 3,
        "the server logged no scrub passes in 120 s: {lines:#?}"
    );
    for l in lines.iter().filter(|l| l.contains("scrub")) {
        assert!(
            !(l.contains(" ROT ")
                || l.contains(" CHANGED ")
                || l.contains(" MISSING ")
                || l.contains(" UNREADABLE ")),
            "a false alarm while clients wrote: {l}"
        );
    }
    for p in &passes {
        assert!(
            p.contains("0 rotten, 0 changed, 0 missing, 0 unreadable"),
            "{p}"
        );
    }
    drop(server);
    same_data(&src, &root.join("src"));

    // Stopped: a scrub of its own finds the whole root clean.
    let o = intact_in(&state, &["scrub", "--json", s(&root)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["files"], 41, "{r}");
    assert_eq!(r["clean"], 41, "{r}");
}

#[test]
fn scrub_repairs_from_a_server_with_allow_fetch_and_is_refused_by_one_without() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst, replica, state) = (
        t.path().join("src"),
        t.path().join("dst"),
        t.path().join("replica"),
        t.path().join("st"),
    );
    fs::create_dir_all(&src).unwrap();
    fs::create_dir_all(&replica).unwrap();
    let data = intact_sample::bytes(600_000, 77);
    fs::write(src.join("f"), &data).unwrap();
    fs::write(replica.join("f"), &data).unwrap();
    let o = intact_in(&state, &["copy", &format!("{}/", s(&src)), s(&dst)]);
    assert!(o.status.success(), "{}", stderr(&o));
    // Rot in place: one byte, size and mtime kept.
    let path = dst.join("f");
    let mtime = fs::metadata(&path).unwrap().modified().unwrap();
    let f = fs::File::options().write(true).open(&path).unwrap();
    f.write_all_at(&[data[300_001] ^ 4], 300_001).unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);

    // Reading needs a key: refused without one.
    let o = intact_in(
        &state,
        &[
            "serve",
            "--root",
            s(&replica),
            "--listen",
            "127.0.0.1:0",
            "--allow-fetch",
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--allow-fetch needs --key-file"));
    let key = t.path().join("key");
    let o = intact_in(&state, &["keygen", s(&key)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let keyed = |addr: &str| {
        let args = [
            "scrub",
            s(&dst),
            "--repair-from",
            addr,
            "--key-file",
            s(&key),
        ];
        intact_in(&state, &args)
    };

    let closed = Server::start_with(&replica, &["--key-file", s(&key)], &[]);
    let o = keyed(&closed.addr());
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{}", stderr(&o));
    assert!(
        out.contains("NOT REPAIRED f:") && out.contains("--allow-fetch"),
        "{out}"
    );
    drop(closed);

    let open = Server::start_with(&replica, &["--allow-fetch", "--key-file", s(&key)], &[]);
    // Without the key this client is not let in: said before the scrub.
    let o = intact_in(&state, &["scrub", s(&dst), "--repair-from", &open.addr()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("replica server"), "{}", stderr(&o));
    let o = keyed(&open.addr());
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(
        out.contains("REPAIRED f: 4096 bytes from 127.0.0.1:"),
        "{out}"
    );
    assert!(fs::read(&path).unwrap() == data);
    let o = intact_in(&state, &["status", "--json", s(&dst)]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (v["repairs"].as_u64(), v["repaired_bytes"].as_u64()),
        (Some(1), Some(4096)),
        "{v}"
    );
    let o = intact_in(&state, &["scrub", s(&dst)]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
}

//! Issue 11, items 6 and 8 and the key items, attacked against a real
//! `intact serve`: a hand-written TCP relay between `intact send` and a
//! keyed server forges, replays, reorders, drops and alters frames, and
//! reads the wire; hand-written sockets announce 16 MiB frames before and
//! after authentication while the test reads the server's memory from
//! /proc; a keyring confines clients to their subtrees.

mod common;

use std::fs;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{connect_from, intact, s, stderr, Server};

/// What the relay does to the client's frames (counted from the first
/// sealed one: the client's Hello, Proof and Join are frames 0 to 2).
#[derive(Clone, Copy, Debug)]
enum Attack {
    /// Pass everything.
    None,
    /// Insert a made-up frame before sealed frame k.
    Forge(usize),
    /// Send sealed frame k twice.
    Replay(usize),
    /// Send sealed frames k + 1 and k in that order.
    Reorder(usize),
    /// Leave out sealed frame k.
    Drop(usize),
    /// Flip one bit of sealed frame k at `MARKER` if it shows, else in
    /// its middle.
    Flip(usize),
    /// Close the connection (both ways, cleanly, between frames) instead
    /// of passing sealed frame k.
    Cut(usize),
}

/// A relay on 127.0.0.1 in front of `server`; it records every byte
/// that passes, both ways.
struct Relay {
    addr: String,
    capture: Arc<Mutex<Vec<u8>>>,
}

const MARKER: &[u8] = b"INTACT-PLAINTEXT-MARKER-7f3a";

fn read_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut head = [0u8; 4];
    s.read_exact(&mut head).ok()?;
    let mut f = head.to_vec();
    f.resize(4 + u32::from_be_bytes(head) as usize, 0);
    s.read_exact(&mut f[4..]).ok()?;
    Some(f)
}

impl Relay {
    fn start(server: String, attack: Attack) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let capture = Arc::new(Mutex::new(Vec::new()));
        let cap = Arc::clone(&capture);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(upstream) = TcpStream::connect(&server) else {
                    return;
                };
                let (cap1, cap2) = (Arc::clone(&cap), Arc::clone(&cap));
                let (mut c_in, mut s_out) =
                    (client.try_clone().unwrap(), upstream.try_clone().unwrap());
                let (mut s_in, mut c_out) = (upstream, client);
                std::thread::spawn(move || {
                    let mut n = 0usize;
                    let mut held: Option<Vec<u8>> = None;
                    while let Some(mut f) = read_frame(&mut c_in) {
                        cap1.lock().unwrap().extend_from_slice(&f);
                        let sealed = n.checked_sub(3);
                        n += 1;
                        let mut out: Vec<Vec<u8>> = Vec::new();
                        match (attack, sealed) {
                            (Attack::Forge(k), Some(i)) if i == k => {
                                let mut fake = f.clone();
                                for (j, b) in fake[4..].iter_mut().enumerate() {
                                    *b = (j as u8).wrapping_mul(37) ^ 0x5a;
                                }
                                out.push(fake);
                                out.push(f);
                            }
                            (Attack::Replay(k), Some(i)) if i == k => {
                                out.push(f.clone());
                                out.push(f);
                            }
                            (Attack::Reorder(k), Some(i)) if i == k => held = Some(f),
                            (Attack::Reorder(k), Some(i)) if i == k + 1 => {
                                out.push(f);
                                out.extend(held.take());
                            }
                            (Attack::Drop(k), Some(i)) if i == k => {}
                            (Attack::Cut(k), Some(i)) if i == k => {
                                let _ = s_out.shutdown(Shutdown::Write);
                                let _ = c_in.shutdown(Shutdown::Both);
                                return;
                            }
                            (Attack::Flip(k), Some(i)) if i == k => {
                                let at = f
                                    .windows(MARKER.len())
                                    .position(|w| w == MARKER)
                                    .unwrap_or(f.len() / 2);
                                f[at] ^= 1;
                                out.push(f);
                            }
                            _ => out.push(f),
                        }
                        for f in out {
                            if s_out.write_all(&f).is_err() {
                                let _ = c_in.shutdown(Shutdown::Both);
                                return;
                            }
                        }
                    }
                    let _ = s_out.shutdown(Shutdown::Write);
                });
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        match s_in.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                cap2.lock().unwrap().extend_from_slice(&buf[..n]);
                                if c_out.write_all(&buf[..n]).is_err() {
                                    break;
                                }
                            }
                        }
                    }
                    let _ = c_out.shutdown(Shutdown::Both);
                });
            }
        });
        Relay { addr, capture }
    }

    fn saw(&self, needle: &[u8]) -> bool {
        self.capture
            .lock()
            .unwrap()
            .windows(needle.len())
            .any(|w| w == needle)
    }

    fn bytes(&self) -> usize {
        self.capture.lock().unwrap().len()
    }
}

/// A key made by `intact keygen`.
fn keygen(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    let out = intact(&["keygen", s(&p)]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    p
}

/// An 8 MiB source file full of the marker (so any frame of its data
/// shows it when readable), under `dir/src/`.
fn source(dir: &Path) -> PathBuf {
    let d = dir.join("src");
    fs::create_dir_all(&d).unwrap();
    let mut data = Vec::with_capacity(8 << 20);
    let mut i = 0u64;
    while data.len() < 8 << 20 {
        data.extend_from_slice(MARKER);
        data.extend_from_slice(&i.to_be_bytes());
        i += 1;
    }
    data.truncate(8 << 20);
    fs::write(d.join("big.dat"), &data).unwrap();
    d.join("big.dat")
}

fn send(key: &Path, src: &Path, addr: &str) -> std::process::Output {
    intact(&[
        "send",
        "--key-file",
        s(key),
        "--streams",
        "1",
        "--block-size",
        "1MiB",
        "--verify",
        "block",
        s(src),
        addr,
    ])
}

/// The server is alive and a normal send through no relay works.
fn still_serves(server: &mut Server, key: &Path, src: &Path, root: &Path) {
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "the server died"
    );
    let _ = fs::remove_file(root.join("big.dat"));
    let out = send(key, src, &server.addr());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        fs::read(root.join("big.dat")).unwrap(),
        fs::read(src).unwrap()
    );
}

#[test]
fn forged_replayed_reordered_dropped_and_altered_frames_fail_the_transfer() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("recv");
    let key = keygen(dir.path(), "key");
    let src = source(dir.path());
    let mut server = Server::start_with(&root, &["--key-file", s(&key)], &[]);
    // Sealed client frames: 0 Entry, then (after the server's Status) the
    // blocks, sent back to back: 1, 2, 3, ...
    for attack in [
        Attack::Forge(2),
        Attack::Replay(2),
        Attack::Reorder(2),
        Attack::Drop(2),
        Attack::Flip(2),
        Attack::Cut(2),
    ] {
        let relay = Relay::start(server.addr(), attack);
        let out = send(&key, &src, &relay.addr);
        assert_ne!(out.status.code(), Some(0), "{attack:?}: the send succeeded");
        assert!(
            !root.join("big.dat").exists(),
            "{attack:?}: a file under its final name"
        );
        assert!(
            relay.bytes() > 0,
            "{attack:?}: nothing went through the relay"
        );
        still_serves(&mut server, &key, &src, &root);
        fs::remove_file(root.join("big.dat")).unwrap();
    }
    // The server says why in its log: the tag, and the cut.
    let log: Vec<String> = server.log.try_iter().collect();
    for why in ["failed authentication", "without an authenticated Bye"] {
        assert!(log.iter().any(|l| l.contains(why)), "{why}: {log:?}");
    }
}

#[test]
fn the_wire_is_unreadable_unless_the_server_says_no_encrypt_and_then_still_authenticated() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("recv");
    let key = keygen(dir.path(), "key");
    let src = source(dir.path());
    {
        let server = Server::start_with(&root, &["--key-file", s(&key)], &[]);
        let relay = Relay::start(server.addr(), Attack::None);
        let out = send(&key, &src, &relay.addr);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert!(relay.bytes() > 8 << 20, "the data did not pass the relay");
        assert!(!relay.saw(MARKER), "the relay read the file's bytes");
        assert!(!relay.saw(b"big.dat"), "the relay read the file's name");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.contains("frames: encrypted, "), "{said}");
        assert_eq!(
            fs::read(root.join("big.dat")).unwrap(),
            fs::read(&src).unwrap()
        );
    }
    fs::remove_dir_all(&root).unwrap();
    let mut server = Server::start_with(&root, &["--key-file", s(&key), "--no-encrypt"], &[]);
    let relay = Relay::start(server.addr(), Attack::None);
    let out = send(&key, &src, &relay.addr);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        relay.saw(MARKER),
        "--no-encrypt: the data should be readable"
    );
    // The client is told what the server chose.
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("frames: authenticated, not encrypted"),
        "{said}"
    );
    fs::remove_file(root.join("big.dat")).unwrap();
    // Readable, but one flipped bit of a block (inside the marker) still
    // ends the session: the block's digest alone would have had it resent.
    let relay = Relay::start(server.addr(), Attack::Flip(2));
    let out = send(&key, &src, &relay.addr);
    assert_ne!(out.status.code(), Some(0), "an altered frame was accepted");
    assert!(!root.join("big.dat").exists());
    still_serves(&mut server, &key, &src, &root);
}

/// The server's peak resident memory so far, in KiB (VmHWM).
fn peak_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// The server's resident memory now, in KiB (VmRSS).
fn rss_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// The server's thread count.
fn threads(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/task")).unwrap().count()
}

/// (tx_queue, rx_queue) of both ends of the TCP connections between
/// `port` and each of `peers`, from /proc/net/tcp.
fn queues(port: u16, peers: &[u16]) -> Vec<(u64, u64)> {
    let tcp = fs::read_to_string("/proc/net/tcp").unwrap();
    let mut out = Vec::new();
    for l in tcp.lines().skip(1) {
        let f: Vec<&str> = l.split_whitespace().collect();
        let port_of = |a: &str| u16::from_str_radix(a.rsplit(':').next().unwrap(), 16).unwrap();
        let (local, remote) = (port_of(f[1]), port_of(f[2]));
        if (local == port && peers.contains(&remote)) || (remote == port && peers.contains(&local))
        {
            let (tx, rx) = f[4].split_once(':').unwrap();
            out.push((
                u64::from_str_radix(tx, 16).unwrap(),
                u64::from_str_radix(rx, 16).unwrap(),
            ));
        }
    }
    out
}

#[test]
fn forty_sockets_announcing_16_mib_frames_leave_the_server_small() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("recv");
    let key = keygen(dir.path(), "key");
    let src = source(dir.path());
    let mut server =
        Server::start_with(&root, &["--key-file", s(&key), "--max-sessions", "64"], &[]);
    let pid = server.child.id();
    let before = peak_kib(pid);
    let announce = (16u32 << 20).to_be_bytes();
    let junk = vec![0x41u8; 60 * 1024];

    // Before authentication: the header alone is refused and the socket
    // closed, with nothing allocated for it.
    let mut socks = Vec::new();
    for i in 0..40u8 {
        // From 127.0.0.2–11, four each: every one reaches the handshake
        // (at most 16 from one address may be authenticating).
        let mut s = connect_from([127, 0, 0, 2 + i / 4], server.port);
        s.write_all(&announce).unwrap();
        let _ = s.write_all(&junk);
        socks.push(s);
    }
    for mut s in socks {
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut buf = [0u8; 256];
        // The server closes it (a Refused may or may not come first).
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    }
    let pre = peak_kib(pid);

    // After authentication: 40 sessions, first idle (each session's own
    // set-up costs what it costs), then each announces a 16 MiB sealed
    // frame and sends 60 KiB of it; the test waits until the server has
    // read every byte (both ends' socket queues are empty) and compares.
    let threads_before = threads(pid);
    let k = intact_proto::Key::from_file(&key).unwrap();
    let mut held = Vec::new();
    let mut peers = Vec::new();
    for _ in 0..40 {
        let mut c = intact_proto::Connection::new(TcpStream::connect(server.addr()).unwrap());
        intact_proto::client_handshake(&mut c, Some(&k)).unwrap();
        let s = c.get_ref().try_clone().unwrap();
        peers.push(s.local_addr().unwrap().port());
        held.push((c, s));
    }
    // Every session is running (its receiving threads started) and the
    // server's memory has settled.
    let deadline = Instant::now() + Duration::from_secs(120);
    while threads(pid) < threads_before + 2 * 40 {
        assert!(Instant::now() < deadline, "sessions did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut last = (rss_kib(pid), Instant::now());
    while last.1.elapsed() < Duration::from_secs(1) {
        assert!(
            Instant::now() < deadline,
            "the server's memory did not settle"
        );
        std::thread::sleep(Duration::from_millis(100));
        let now = rss_kib(pid);
        if now != last.0 {
            last = (now, Instant::now());
        }
    }
    let idle = peak_kib(pid);
    for (_, s) in &mut held {
        s.write_all(&((16u32 << 20) + 16).to_be_bytes()).unwrap();
        s.write_all(&junk).unwrap();
    }
    loop {
        let q = queues(server.port, &peers);
        if q.len() == 2 * peers.len() && q.iter().all(|&(tx, rx)| tx == 0 && rx == 0) {
            break;
        }
        assert!(Instant::now() < deadline, "the server did not read: {q:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let post = peak_kib(pid);
    drop(held);
    eprintln!(
        "server VmHWM: {before} KiB at start, {pre} after 40 unauthenticated 16 MiB announcements, \
         {idle} with 40 idle authenticated sessions, {post} after each announced 16 MiB and sent 60 KiB"
    );
    // 40 × 16 MiB would be 640 MiB; what arrived is 40 × 60 KiB.
    assert!(pre < 64 * 1024, "VmHWM {pre} KiB before authentication");
    assert!(
        post - idle < 32 * 1024,
        "the announcements cost {} KiB",
        post - idle
    );
    still_serves(&mut server, &key, &src, &root);
}

#[test]
fn a_keyless_server_refuses_to_listen_beyond_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("recv");
    for listen in ["0.0.0.0:0", "[::]:0", "192.0.2.1:4750"] {
        let out = intact(&["serve", "--root", s(&root), "--listen", listen]);
        assert_eq!(out.status.code(), Some(2), "{listen}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("without a key") && err.contains("keygen"),
            "{err}"
        );
        assert!(!root.exists(), "{listen}: it went on to set up its root");
    }
    // --no-encrypt without a key is a usage error too.
    let out = intact(&["serve", "--root", s(&root), "--no-encrypt"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // The help says that keyless means plain frames.
    let help = common::stdout(&intact(&["serve", "--help"]));
    assert!(
        help.contains("frames are\nplain") || help.contains("frames are plain"),
        "{help}"
    );
}

#[test]
fn keygen_refuses_an_existing_file_and_writes_it_private() {
    let dir = tempfile::tempdir().unwrap();
    let key = keygen(dir.path(), "k");
    assert_eq!(
        fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let first = fs::read(&key).unwrap();
    let out = intact(&["keygen", s(&key)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("already exists"), "{}", stderr(&out));
    assert_eq!(fs::read(&key).unwrap(), first);
    let out = intact(&["keygen", "--force", s(&key)]);
    assert_eq!(out.status.code(), Some(0));
    assert_ne!(fs::read(&key).unwrap(), first);
}

fn private(path: &Path, text: &str) {
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).unwrap();
}

#[test]
fn keyring_clients_cannot_write_delete_or_read_each_others_subtrees() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("recv");
    let (a, b) = (keygen(dir.path(), "alice"), keygen(dir.path(), "bob"));
    let line = |p: &Path| fs::read_to_string(p).unwrap().trim().to_string();
    let ring = dir.path().join("ring");
    private(
        &ring,
        &format!(
            "intact-client-v1 alice groups/alice {}\nintact-client-v1 bob groups/bob {}\n\
             intact-client-v1 carol groups/carol carol's passphrase, long enough\n",
            line(&a),
            line(&b)
        ),
    );
    let carol = dir.path().join("carol");
    private(&carol, "carol's passphrase, long enough\n");
    let mut server = Server::start_with(&root, &["--key-file", s(&ring)], &[]);
    let addr = server.addr();
    let bob_dir = root.join("groups/bob");

    // Bob's tree: data/{f, old.dat}.
    let bsrc = dir.path().join("bsrc/data");
    fs::create_dir_all(&bsrc).unwrap();
    fs::write(bsrc.join("f"), b"bob's f").unwrap();
    fs::write(bsrc.join("old.dat"), b"bob's old").unwrap();
    let out = intact(&["send", "--key-file", s(&b), s(&bsrc), &addr]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(fs::read(bob_dir.join("data/f")).unwrap(), b"bob's f");
    let bob_before = common::listing(&bob_dir);

    // Alice sends the same names, also "into" ../bob and with --delete,
    // and a symlink pointing at bob's tree followed by a file through it.
    let asrc = dir.path().join("asrc/data");
    fs::create_dir_all(&asrc).unwrap();
    fs::write(asrc.join("f"), b"alice's f").unwrap();
    std::os::unix::fs::symlink("../../bob/data", asrc.join("link")).unwrap();
    for target in [
        addr.clone(),
        format!("{addr}:/groups/bob"),
        format!("{addr}:/bob"),
    ] {
        let out = intact(&["send", "--key-file", s(&a), "--delete", s(&asrc), &target]);
        assert_eq!(out.status.code(), Some(0), "{target}: {}", stderr(&out));
    }
    let out = intact(&[
        "send",
        "--key-file",
        s(&a),
        "--delete",
        "--dry-run",
        s(&asrc),
        &format!("{addr}:/.."),
    ]);
    assert_ne!(out.status.code(), Some(0), "a .. subdir was accepted");
    assert_eq!(
        fs::read(root.join("groups/alice/data/f")).unwrap(),
        b"alice's f"
    );
    assert_eq!(
        fs::read(root.join("groups/alice/groups/bob/data/f")).unwrap(),
        b"alice's f"
    );
    // Bob's files: all there, unchanged (the symlink is a link in alice's
    // tree, never followed).
    assert_eq!(common::listing(&bob_dir), bob_before);
    assert_eq!(fs::read(bob_dir.join("data/f")).unwrap(), b"bob's f");
    assert_eq!(
        fs::read(bob_dir.join("data/old.dat")).unwrap(),
        b"bob's old"
    );
    assert!(fs::symlink_metadata(root.join("groups/alice/data/link"))
        .unwrap()
        .file_type()
        .is_symlink());

    // Read: bob's file "f" has the same size and mtime as a file alice
    // now sends; were they in one tree (or one journal), the server would
    // call hers unchanged. She gets her own copy, sent in full.
    let asrc2 = dir.path().join("asrc2/data");
    fs::create_dir_all(&asrc2).unwrap();
    fs::write(asrc2.join("f"), b"ALICE's").unwrap();
    let mtime = fs::metadata(bob_dir.join("data/f"))
        .unwrap()
        .modified()
        .unwrap();
    fs::File::options()
        .write(true)
        .open(asrc2.join("f"))
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let out = intact(&[
        "send",
        "--json",
        "--key-file",
        s(&a),
        s(&asrc2),
        &format!("{addr}:/fresh"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        fs::read(root.join("groups/alice/fresh/data/f")).unwrap(),
        b"ALICE's"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let files = v["files"].as_array().unwrap_or_else(|| panic!("{v}"));
    assert_eq!(files.len(), 2, "{v}");
    for f in files {
        assert_eq!(f["unchanged"], false, "{v}");
    }
    assert!(files.iter().any(|f| f["bytes_sent"] == 7), "{v}");

    // A symlink planted (by a local user) where carol's subtree goes:
    // her session is refused; bob's tree is untouched.
    fs::create_dir_all(root.join("groups")).unwrap();
    std::os::unix::fs::symlink(&bob_dir, root.join("groups/carol")).unwrap();
    let csrc = dir.path().join("csrc");
    fs::create_dir_all(&csrc).unwrap();
    fs::write(csrc.join("planted.dat"), b"carol").unwrap();
    let out = intact(&["send", "--key-file", s(&carol), s(&csrc), &addr]);
    assert_ne!(out.status.code(), Some(0), "carol wrote through a symlink");
    assert!(!bob_dir.join("csrc").exists());
    assert_eq!(common::listing(&bob_dir), bob_before);

    // Each subtree has its own journal, under .intact/clients (0700).
    let clients = root.join(".intact/clients");
    assert_eq!(
        fs::metadata(&clients).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let journals: Vec<_> = fs::read_dir(&clients)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join(".intact/journal.sqlite").exists())
        .collect();
    assert_eq!(journals.len(), 2, "{journals:?}");
    assert!(server.child.try_wait().unwrap().is_none());
}

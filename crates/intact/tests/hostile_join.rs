//! Issue 11, finding F4 ("session ids travel in the clear"), attacked
//! against a real `intact serve`: a recording proxy between a victim
//! `intact send` and a keyed server captures the victim's Hello (its
//! session tag) and Join; an attacker holding the same pre-shared key
//! connects with that tag and a Join of its own, with no Join, and with
//! the victim's Join replayed. The attacker is a hand-written protocol-7
//! client whose handshake is built here from the construction documented
//! in intact-proto (auth.rs, seal.rs, session.rs); an honest run of the
//! same code is admitted and exchanges sealed frames with the server, so
//! its refusals are the server's judgement of the secret, not a broken
//! client. With the same code, a recorder who knows the key and both
//! Hellos cannot open the victim's sealed frames (forward secrecy).

mod common;
#[path = "hostile_join/v7.rs"]
mod v7;

use std::fs;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{intact, s, stderr, Server};
use intact_proto::{
    client_handshake_in, Connection, Entry, EntryKind, Message, ProtoError, SessionSecret,
    JOIN_UNOPENED, SECRET_MISMATCH, VERSION,
};
use v7::{
    decode, frame, hand_client, hello_fields, open, read_frame, refusal, seal, Join, Transcript,
};

// ---------------------------------------------------------------------
// A recording proxy that can hold a connection after its handshake.

/// What one connection through the proxy carried.
#[derive(Default)]
struct Captured {
    /// The client's frames, whole (prefix included), in order.
    client: Vec<Vec<u8>>,
    /// The server's bytes.
    server: Vec<u8>,
}

/// A proxy on 127.0.0.1 in front of a server; while `hold` is set, it
/// holds each connection's client frames after the first three (Hello,
/// Proof, Join: the handshake), so the session stays open and idle.
struct Recorder {
    addr: String,
    conns: Arc<Mutex<Vec<Arc<Mutex<Captured>>>>>,
    hold: Arc<AtomicBool>,
}

impl Recorder {
    fn start(server: String) -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let conns: Arc<Mutex<Vec<Arc<Mutex<Captured>>>>> = Arc::default();
        let hold = Arc::new(AtomicBool::new(true));
        let (all, held) = (Arc::clone(&conns), Arc::clone(&hold));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(upstream) = TcpStream::connect(&server) else {
                    return;
                };
                let cap = Arc::new(Mutex::new(Captured::default()));
                all.lock().unwrap().push(Arc::clone(&cap));
                let (cap1, cap2, held) = (Arc::clone(&cap), cap, Arc::clone(&held));
                let (mut c_in, mut s_out) =
                    (client.try_clone().unwrap(), upstream.try_clone().unwrap());
                let (mut s_in, mut c_out) = (upstream, client);
                std::thread::spawn(move || {
                    while let Some(f) = read_frame(&mut c_in) {
                        let n = {
                            let mut c = cap1.lock().unwrap();
                            c.client.push(f.clone());
                            c.client.len()
                        };
                        while n > 3 && held.load(Ordering::SeqCst) {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        if s_out.write_all(&f).is_err() {
                            break;
                        }
                    }
                    let _ = s_out.shutdown(Shutdown::Write);
                });
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n @ 1..) = s_in.read(&mut buf) {
                        cap2.lock().unwrap().server.extend_from_slice(&buf[..n]);
                        if c_out.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = c_out.shutdown(Shutdown::Both);
                });
            }
        });
        Recorder { addr, conns, hold }
    }

    fn connections(&self) -> Vec<Arc<Mutex<Captured>>> {
        self.conns.lock().unwrap().clone()
    }

    fn release(&self) {
        self.hold.store(false, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------------

/// A key made by `intact keygen`, and its 32 bytes.
fn keygen(dir: &Path, name: &str) -> (PathBuf, [u8; 32]) {
    let p = dir.join(name);
    let out = intact(&["keygen", s(&p)]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let line = fs::read_to_string(&p).unwrap();
    let hex = line.trim().strip_prefix("intact-key-v1 ").unwrap();
    let mut k = [0u8; 32];
    for (i, b) in k.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    (p, k)
}

fn dir_entry(file: u64, path: &str) -> Message {
    Message::Entry(Entry {
        file,
        path: intact_proto::WirePath::parse(path.as_bytes()).unwrap(),
        kind: EntryKind::Dir,
        mode: 0o700,
        mtime_sec: 1_700_000_000,
        mtime_nsec: 0,
        size: 0,
        block_size: 64 << 10,
        algorithm: intact_digest::defaults::BLOCK_ALGORITHM.wire_id(),
        verify: intact_transfer::VerifyMode::None.wire_id(),
        flags: 0,
        origin: Vec::new(),
        range: None,
    })
}

#[test]
fn an_attacker_with_the_key_and_a_victims_tag_cannot_join_its_session_nor_read_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("recv");
    let (key, psk) = keygen(dir.path(), "key");
    let server = Server::start_with(&root, &["--key-file", s(&key)], &[]);
    let proxy = Recorder::start(server.addr());

    // The victim: a directory it wants at mode 0750, one file in it.
    let src = dir.path().join("vsrc/data");
    fs::create_dir_all(&src).unwrap();
    let body = intact_sample::bytes(256 << 10, 3);
    fs::write(src.join("v.bin"), &body).unwrap();
    fs::set_permissions(&src, fs::Permissions::from_mode(0o750)).unwrap();
    let mut victim = Command::new(env!("CARGO_BIN_EXE_intact"))
        .args(["send", "--key-file", s(&key), "--streams", "2", s(&src)])
        .arg(&proxy.addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Both its streams authenticated and its first data frame held at
    // the proxy: its session is open on the server.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let conns = proxy.connections();
        if conns.len() >= 2 && conns.iter().any(|c| c.lock().unwrap().client.len() > 3) {
            break;
        }
        if let Some(st) = victim.try_wait().unwrap() {
            let out = victim.wait_with_output().unwrap();
            panic!("the victim ended early ({st}): {}", stderr(&out));
        }
        assert!(Instant::now() < deadline, "the victim never got going");
        std::thread::sleep(Duration::from_millis(20));
    }
    let conns = proxy.connections();
    let (victim_hello, victim_join, victim_offer) = {
        let c = conns[0].lock().unwrap();
        let hello = decode(&c.client[0]);
        let join = match decode(&c.client[2]) {
            Message::Join { payload } => payload,
            other => panic!("the victim's third frame: {other:?}"),
        };
        let offer = hello_fields(&hello).2;
        (hello, join, offer)
    };
    let (_, tag, _, _) = hello_fields(&victim_hello);
    // The secret is nowhere on the wire in the clear: only its sealed form.
    assert_eq!(victim_join.len(), 48);

    // Control: the hand-written client, honest (its own secret, its tag),
    // is admitted, and its sealed frames go both ways with the keys it
    // derived: the construction below is the server's.
    let own = SessionSecret::from_bytes([0x5a; 32]);
    let mut honest = hand_client(
        &server.addr(),
        &psk,
        own.tag(),
        victim_offer,
        Join::Sealed(own.clone()),
    );
    assert!(
        matches!(honest.answer, Message::Proof { .. }),
        "{:?}",
        honest.answer
    );
    let t = &honest.transcript;
    assert!(t.choice & 0x80 == 0, "the server encrypts");
    let keys = t.v7(&psk, &honest.dh, b"intact/7 frame keys", 64);
    let alg = t.cipher();
    honest
        .stream
        .write_all(&seal(alg, &keys[..32], 0, &dir_entry(1, "control")))
        .unwrap();
    let reply = read_frame(&mut honest.stream).expect("the server's reply");
    match open(alg, &keys[32..], 0, &reply) {
        Some(Message::FileResult(r)) => assert_eq!(r.file, 1),
        other => panic!("the control's reply did not open: {other:?}"),
    }
    drop(honest);

    // Attack 1: the victim's tag, a Join with a secret of the attacker's.
    let a = hand_client(
        &server.addr(),
        &psk,
        tag,
        victim_offer,
        Join::Sealed(SessionSecret::from_bytes([0x66; 32])),
    );
    assert_eq!(refusal(&a.answer), SECRET_MISMATCH);
    // Attack 2: the victim's tag and no Join (what a version 6 joiner sent).
    let a = hand_client(&server.addr(), &psk, tag, victim_offer, Join::Missing);
    assert!(
        refusal(&a.answer).contains("expected the session secret (Join)"),
        "{:?}",
        a.answer
    );
    // Attack 3: the victim's tag and its recorded Join, replayed.
    let a = hand_client(
        &server.addr(),
        &psk,
        tag,
        victim_offer,
        Join::Raw(victim_join.clone()),
    );
    assert_eq!(refusal(&a.answer), JOIN_UNOPENED);

    // The victim goes on and completes; its directory has its mode.
    proxy.release();
    let out = victim.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(fs::read(root.join("data/v.bin")).unwrap(), body);
    assert_eq!(
        fs::metadata(root.join("data"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o750
    );

    // Forward secrecy: a recorder holding the key and both Hellos (from
    // the capture) derives the keys of version 6 (no DH), and of version
    // 7 with the one thing it lacks guessed: none opens the victim's
    // first sealed frame. (The same code opened the control's frames with
    // the DH secret it knew.)
    let c = conns[0].lock().unwrap();
    let server_hello = decode(&read_frame(&mut &c.server[..]).unwrap());
    let t = Transcript::from_hellos(&victim_hello, &server_hello);
    assert!(t.choice & 0x80 == 0, "the victim's frames are encrypted");
    let first_sealed = &c.client[3];
    let alg = t.cipher();
    for version in [6, VERSION] {
        let k = t.v6(&psk, version);
        assert!(
            open(alg, &k[..32], 0, first_sealed).is_none(),
            "v6 keys opened it"
        );
    }
    for guess in [[0u8; 32], psk] {
        let k = t.v7(&psk, &guess, b"intact/7 frame keys", 64);
        assert!(
            open(alg, &k[..32], 0, first_sealed).is_none(),
            "a guessed DH opened it"
        );
    }
    drop(c);
    // The server logged the refusals with their reasons.
    let log: Vec<String> = server.log.try_iter().collect();
    for why in [
        SECRET_MISMATCH,
        JOIN_UNOPENED,
        "expected the session secret",
    ] {
        assert!(log.iter().any(|l| l.contains(why)), "{why}: {log:?}");
    }
}

fn private(path: &Path, text: &str) {
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).unwrap();
}

fn connect(
    addr: &str,
    key: &Path,
    secret: &SessionSecret,
) -> Result<Connection<TcpStream>, ProtoError> {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut c = Connection::new(s);
    let k = intact_proto::Key::from_file(key).unwrap();
    client_handshake_in(&mut c, Some(&k), secret).map(|()| c)
}

#[test]
fn streams_group_by_secret_and_a_keyring_client_never_joins_another_keys_session() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("recv");
    let (a, _) = keygen(dir.path(), "alice");
    let (b, _) = keygen(dir.path(), "bob");
    let line = |p: &Path| fs::read_to_string(p).unwrap().trim().to_string();
    let ring = dir.path().join("ring");
    private(
        &ring,
        &format!(
            "intact-client-v1 alice groups/alice {}\nintact-client-v1 bob groups/bob {}\n",
            line(&a),
            line(&b)
        ),
    );
    let server = Server::start_with(
        &root,
        &["--key-file", s(&ring), "--max-streams-per-session", "1"],
        &[],
    );
    let addr = server.addr();
    let secret = SessionSecret::from_bytes([0x42; 32]);
    let held = connect(&addr, &a, &secret).expect("alice's first stream");
    // A second stream of alice's session: grouped with the first, so
    // over the one stream a session may have.
    match connect(&addr, &a, &secret) {
        Err(ProtoError::Refused(r)) => assert!(r.contains("at most 1 streams"), "{r}"),
        other => panic!("alice's second stream: {:?}", other.map(|_| ())),
    }
    // Bob, with alice's very secret: a session of his own.
    let bob = connect(&addr, &b, &secret).expect("bob is not alice's session");
    // And alice with another secret: another session of hers.
    let other =
        connect(&addr, &a, &SessionSecret::from_bytes([0x43; 32])).expect("alice's second session");
    drop((held, bob, other));
}

#[test]
fn a_keyless_stream_without_its_join_or_with_another_secret_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("recv"));
    let secret = SessionSecret::from_bytes([0x24; 32]);
    let hello = frame(&Message::Hello {
        version: VERSION,
        keyed: false,
        nonce: [1; 32],
        session: secret.tag(),
        suite: 0,
        share: [0; 32],
    });
    for (join, why) in [
        (
            frame(&Message::Bye),
            "expected the session secret (Join), got Bye",
        ),
        (
            frame(&Message::Join {
                payload: vec![0x25; 32],
            }),
            SECRET_MISMATCH,
        ),
        (
            frame(&Message::Join {
                payload: vec![0x24; 31],
            }),
            "not 32 bytes",
        ),
    ] {
        let mut s = TcpStream::connect(server.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.write_all(&[hello.clone(), join].concat()).unwrap();
        let answer = decode(&read_frame(&mut s).expect("an answer"));
        assert!(refusal(&answer).contains(why), "{answer:?}");
    }
    // Control: the same Hello with its own secret is admitted.
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let join = frame(&Message::Join {
        payload: secret.bytes().to_vec(),
    });
    s.write_all(&[hello, join].concat()).unwrap();
    let answer = decode(&read_frame(&mut s).expect("an answer"));
    assert!(matches!(answer, Message::Hello { .. }), "{answer:?}");
}

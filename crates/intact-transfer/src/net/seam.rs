//! A panic seam for the test that checks that a panicking session frees
//! its places and leaves the others alone. It exists only in this crate's
//! own unit-test build (`#[cfg(test)]`): no other build, release binary or
//! integration test has it. A session named by one of the secrets
//! [`panic_secret`] makes panics right after it was admitted, while it
//! holds a session and a stream place. (A session's id is a hash of its
//! client's secret, so the seam recognises the ids of a known list.)

use intact_proto::SessionSecret;

use crate::net::sessions::Stream;

/// How many panicking secrets there are.
pub(crate) const PANIC_SECRETS: u32 = 72;

/// The `i`th secret whose session panics.
pub(crate) fn panic_secret(i: u32) -> SessionSecret {
    let mut s = [0u8; 32];
    s[..8].copy_from_slice(b"panic!!!");
    s[8..12].copy_from_slice(&i.to_be_bytes());
    SessionSecret::from_bytes(s)
}

/// Panics if `stream`'s session asks for it.
pub(crate) fn maybe_panic(stream: &Stream) {
    if (0..PANIC_SECRETS).any(|i| panic_secret(i).id() == stream.id()) {
        panic!("test seam: this session asked to panic");
    }
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use intact_proto::{client_handshake_in, Connection, Entry, EntryKind, Message, SessionSecret};

    use super::{panic_secret, PANIC_SECRETS};
    use crate::net::{send, wake, SendOptions, Server, ServerConfig};
    use crate::VerifyMode;

    fn fiver() -> SendOptions {
        SendOptions {
            verify: VerifyMode::Fiver,
            ..SendOptions::default()
        }
    }

    fn client(
        addr: &str,
        secret: &SessionSecret,
    ) -> Result<Connection<TcpStream>, intact_proto::ProtoError> {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut c = Connection::new(s);
        client_handshake_in(&mut c, None, secret)?;
        Ok(c)
    }

    fn dir_entry(id: u64, path: &str) -> Message {
        Message::Entry(Entry {
            file: id,
            path: intact_proto::WirePath::parse(path.as_bytes()).unwrap(),
            kind: EntryKind::Dir,
            mode: 0o755,
            mtime_sec: 1_700_000_000,
            mtime_nsec: 0,
            size: 0,
            block_size: 0,
            algorithm: 0,
            verify: 0,
            flags: 0,
            origin: Vec::new(),
            range: None,
        })
    }

    fn normal_send(addr: &str, dir: &std::path::Path, root: &std::path::Path, name: &str) {
        let src = dir.join(name);
        let data = intact_sample::bytes(300_000, name.len() as u64);
        std::fs::write(&src, &data).unwrap();
        let r = send(&[src], addr, &fiver(), &|_| {}).unwrap();
        assert_eq!(r.failed, 0, "{:?}", r.files);
        assert_eq!(std::fs::read(root.join(name)).unwrap(), data);
    }

    /// 72 sessions panic inside the server, mixed with 72 connections that
    /// abort (closed at once, garbage, half a Hello), while another session
    /// stays open across them and an honest send runs. Every panicking
    /// session must still be admitted (with 3 sessions allowed, two leaked
    /// places would refuse the next), the open session must still be
    /// answered, the honest send must finish, the log must account for
    /// every panic, and a normal send after it all must work.
    #[test]
    fn panicking_and_aborted_sessions_give_their_places_back() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let mut cfg = ServerConfig::local(&root);
        cfg.max_sessions = 3;
        let lines = Arc::new(Mutex::new(Vec::<String>::new()));
        let log = {
            let lines = Arc::clone(&lines);
            Arc::new(move |l: String| lines.lock().unwrap().push(l))
        };
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let sock = listener.local_addr().unwrap();
        let addr = sock.to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let server = Server::open(cfg).unwrap();
        let running = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || server.run(listener, stop, log))
        };

        let big = dir.path().join("honest.bin");
        let data = intact_sample::bytes(8 << 20, 11);
        std::fs::write(&big, &data).unwrap();
        let mut bystander = client(&addr, &SessionSecret::from_bytes([7; 32])).expect("admitted");
        let mut answered = |id: u64, path: &str| {
            bystander.send(&dir_entry(id, path)).unwrap();
            match bystander.read_message() {
                Ok(Some(Message::FileResult(r))) => assert_eq!(r.file, id),
                other => panic!("the bystander's entry {path} got {other:?}"),
            }
        };
        answered(1, "bystander_before");
        let honest = {
            let (big, addr) = (big.clone(), addr.clone());
            std::thread::spawn(move || send(&[big], &addr, &fiver(), &|_| {}))
        };
        for i in 0..PANIC_SECRETS {
            let mut c = client(&addr, &panic_secret(i)).unwrap_or_else(|e| {
                panic!("panicking session {i} was not admitted (a place leaked?): {e}")
            });
            assert!(
                c.read_message().map_or(true, |m| m.is_none()),
                "session {i} lived on"
            );
            let mut s = TcpStream::connect(&addr).unwrap();
            match i % 3 {
                0 => drop(s),
                1 => {
                    let _ = std::io::Write::write_all(&mut s, &[0xff; 64]);
                }
                _ => {
                    let _ = std::io::Write::write_all(&mut s, &[0, 0, 0, 60, 1, 0]);
                }
            }
        }
        answered(2, "bystander_after");
        bystander.send(&Message::Bye).unwrap();
        let _ = bystander.read_message();
        assert!(root.join("bystander_after").is_dir());
        let r = honest.join().unwrap().unwrap();
        assert_eq!(
            r.failed, 0,
            "the honest send beside the panics: {:?}",
            r.files
        );
        assert!(std::fs::read(root.join("honest.bin")).unwrap() == data);
        // A few panics are told one by one, the rest counted in one line
        // written with the next line after the 10 s window.
        let ended = Instant::now();
        std::thread::sleep(Duration::from_secs(11).saturating_sub(ended.elapsed()));
        normal_send(&addr, dir.path(), &root, "after_panics_1.bin");
        let until = Instant::now() + Duration::from_secs(30);
        let counted = |seen: &[String]| -> (usize, usize) {
            let told = seen
                .iter()
                .filter(|l| {
                    l.contains("panicked (a bug") && !l.contains("more lines like this one")
                })
                .count();
            let counted = seen
                .iter()
                .filter(|l| l.contains("more lines like this one") && l.contains("panicked"))
                .map(|l| l.split(' ').next().unwrap().parse::<usize>().unwrap_or(0))
                .sum();
            (told, counted)
        };
        let (told, n) = loop {
            let seen = lines.lock().unwrap().clone();
            let (told, n) = counted(&seen);
            if told + n >= 72 || Instant::now() > until {
                break (told, n);
            }
            drop(seen);
            normal_send(&addr, dir.path(), &root, "nudge.bin");
            std::thread::sleep(Duration::from_millis(500));
        };
        let seen = lines.lock().unwrap().clone();
        assert!((1..=5).contains(&told), "panics told one by one: {seen:?}");
        assert_eq!(told + n, 72, "panics told and counted: {seen:?}");
        normal_send(&addr, dir.path(), &root, "after_panics_2.bin");
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        wake(sock);
        running.join().unwrap();
    }
}

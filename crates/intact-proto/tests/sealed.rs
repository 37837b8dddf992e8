//! Sealed frames, attacked at the byte level: every test writes real
//! sealed frames through a keyed handshake on a socket pair, then does to
//! the bytes what a relay on the path could do (forge, alter, replay,
//! reorder, drop, reflect, cut, downgrade) and checks what the receiving
//! side reads.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use intact_proto::{
    client_handshake_with, server_handshake_keyring, Block, ClientKey, Connection, Key, Keyring,
    Message, ProtoError, Security, SessionSecret, HANDSHAKE_FRAME,
};

fn key(n: u8) -> Key {
    Key::from_passphrase(format!("sealed-test passphrase number {n}").as_bytes()).unwrap()
}

/// A keyed client and server connection on one socket pair, after their
/// handshake: (client, server, a second handle on the client's socket
/// for raw writes towards the server).
fn pair(encrypt: bool) -> (Connection<UnixStream>, Connection<UnixStream>, UnixStream) {
    let (a, b) = UnixStream::pair().unwrap();
    let raw = a.try_clone().unwrap();
    let server = std::thread::spawn(move || {
        let mut conn = Connection::new(b);
        let ring = Keyring::single(key(1));
        server_handshake_keyring(&mut conn, ring.clients(), encrypt, true, |_, _| Ok(())).unwrap();
        conn
    });
    let mut client = Connection::new(a);
    let sec = client_handshake_with(
        &mut client,
        Some(&key(1)),
        &SessionSecret::from_bytes([3; 32]),
        true,
    )
    .unwrap();
    let server = server.join().unwrap();
    assert_eq!(sec, server.security());
    assert!(matches!(sec, Security::Sealed { encrypted, .. } if encrypted == encrypt));
    (client, server, raw)
}

/// The sealed frames the client's writing half produces for `msgs`, as
/// raw bytes cut at frame boundaries (captured on a second socket pair,
/// never delivered).
fn sealed_frames(client: Connection<UnixStream>, msgs: &[Message]) -> Vec<Vec<u8>> {
    let (c, mut d) = UnixStream::pair().unwrap();
    let (_reader, mut w) = client.split(c);
    for m in msgs {
        w.write_message(m).unwrap();
    }
    w.flush().unwrap();
    drop(w);
    let mut bytes = Vec::new();
    d.read_to_end(&mut bytes).unwrap();
    let mut frames = Vec::new();
    let mut rest = &bytes[..];
    while !rest.is_empty() {
        let len = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
        frames.push(rest[..4 + len].to_vec());
        rest = &rest[4 + len..];
    }
    assert_eq!(frames.len(), msgs.len());
    frames
}

fn block(i: u64, marker: &[u8]) -> Message {
    Message::Block(Block {
        file: 1,
        index: i,
        source_level: 0,
        digest: vec![i as u8; 16],
        crcs: Vec::new(),
        patch: Vec::new(),
        strong: Vec::new(),
        data: marker.repeat(100),
    })
}

const MARKER: &[u8] = b"PLAINTEXT-MARKER-1234";

/// Delivers `frames` raw to the server and returns what it reads, up to
/// and including the first error.
fn deliver(
    mut server: Connection<UnixStream>,
    mut raw: UnixStream,
    frames: &[&[u8]],
) -> Vec<Result<Option<Message>, ProtoError>> {
    let w = {
        let bytes: Vec<u8> = frames.concat();
        std::thread::spawn(move || {
            raw.write_all(&bytes).unwrap();
            raw.shutdown(std::net::Shutdown::Write).unwrap();
        })
    };
    let mut got = Vec::new();
    loop {
        let r = server.read_message();
        let stop = !matches!(r, Ok(Some(_)));
        got.push(r);
        if stop {
            break;
        }
    }
    w.join().unwrap();
    got
}

fn msgs() -> Vec<Message> {
    vec![
        block(0, MARKER),
        block(1, MARKER),
        block(2, MARKER),
        Message::Bye,
    ]
}

#[test]
fn honest_frames_arrive_and_an_authenticated_bye_ends_cleanly() {
    for encrypt in [true, false] {
        let (client, server, raw) = pair(encrypt);
        let m = msgs();
        let f = sealed_frames(client, &m);
        let got = deliver(server, raw, &[&f[0], &f[1], &f[2], &f[3]]);
        assert_eq!(got.len(), 5, "{got:?}");
        for (g, want) in got.iter().zip(&m) {
            assert_eq!(g.as_ref().unwrap().as_ref().unwrap(), want);
        }
        assert!(matches!(got[4], Ok(None)), "{:?}", got[4]);
        // Encrypted: the marker is nowhere on the wire; not encrypted: it
        // is there to read (and still authenticated, see below).
        let on_wire = f.concat().windows(MARKER.len()).any(|w| w == MARKER);
        assert_eq!(on_wire, !encrypt, "encrypt {encrypt}");
    }
}

fn tampered(got: &[Result<Option<Message>, ProtoError>], ok_before: usize, what: &str) {
    assert_eq!(got.len(), ok_before + 1, "{what}: {got:?}");
    assert!(
        got[..ok_before].iter().all(|g| matches!(g, Ok(Some(_)))),
        "{what}: {got:?}"
    );
    assert!(
        matches!(got[ok_before], Err(ProtoError::Tampered)),
        "{what}: {:?}",
        got[ok_before]
    );
}

#[test]
fn forged_altered_replayed_reordered_and_dropped_frames_fail() {
    for encrypt in [true, false] {
        // Forged: a frame of the right shape the relay made up.
        let (client, server, raw) = pair(encrypt);
        let f = sealed_frames(client, &msgs());
        let mut forged = f[1].clone();
        for b in &mut forged[4..] {
            *b = b.wrapping_mul(31).wrapping_add(7);
        }
        tampered(&deliver(server, raw, &[&f[0], &forged]), 1, "forged");

        // Altered: one bit of the body (in the marker's bytes when the
        // body is readable), then one bit of the tag.
        for at in [40usize, 0] {
            let (client, server, raw) = pair(encrypt);
            let f = sealed_frames(client, &msgs());
            let mut altered = f[1].clone();
            let i = if at == 0 { altered.len() - 1 } else { at };
            altered[i] ^= 1;
            tampered(&deliver(server, raw, &[&f[0], &altered]), 1, "altered");
        }

        // Replayed: frame 0 twice.
        let (client, server, raw) = pair(encrypt);
        let f = sealed_frames(client, &msgs());
        tampered(&deliver(server, raw, &[&f[0], &f[0]]), 1, "replayed");

        // Reordered: 1 before 0.
        let (client, server, raw) = pair(encrypt);
        let f = sealed_frames(client, &msgs());
        tampered(&deliver(server, raw, &[&f[1], &f[0]]), 0, "reordered");

        // Dropped: 0, then 2 (1 dropped): the gap fails the next frame.
        let (client, server, raw) = pair(encrypt);
        let f = sealed_frames(client, &msgs());
        tampered(&deliver(server, raw, &[&f[0], &f[2]]), 1, "dropped");
    }
}

#[test]
fn a_frame_reflected_back_to_its_sender_fails() {
    // The server's own sealed frame, sent back to it as if from the client.
    let (client, server, raw) = pair(true);
    let (srv_reader, mut srv_writer) = {
        let other = server.get_ref().try_clone().unwrap();
        server.split(other)
    };
    srv_writer.send(&block(0, MARKER)).unwrap();
    // Take the server's frame off the client's socket, raw.
    let mut c = client.get_ref().try_clone().unwrap();
    let mut head = [0u8; 4];
    c.read_exact(&mut head).unwrap();
    let mut frame = head.to_vec();
    frame.resize(4 + u32::from_be_bytes(head) as usize, 0);
    c.read_exact(&mut frame[4..]).unwrap();
    tampered(&deliver(srv_reader, raw, &[&frame]), 0, "reflected");
    drop(client);
}

#[test]
fn a_cut_before_the_authenticated_bye_is_an_error_not_an_end() {
    let (client, server, raw) = pair(true);
    let f = sealed_frames(client, &msgs());
    // Everything but the Bye: the receiver must not take the close as the
    // end of the session.
    let got = deliver(server, raw, &[&f[0], &f[1], &f[2]]);
    assert_eq!(got.len(), 4, "{got:?}");
    assert!(
        matches!(got[3], Err(ProtoError::ClosedWithoutBye)),
        "{:?}",
        got[3]
    );
}

#[test]
fn the_halves_of_a_split_connection_each_keep_their_direction() {
    let (client, server, _raw) = pair(true);
    let c2 = client.get_ref().try_clone().unwrap();
    let (mut c_read, mut c_write) = client.split(c2);
    let s2 = server.get_ref().try_clone().unwrap();
    let (mut s_read, mut s_write) = server.split(s2);
    for i in 0..50 {
        c_write.send(&block(i, b"c2s")).unwrap();
        s_write.send(&block(i, b"s2c")).unwrap();
        assert_eq!(s_read.expect_message().unwrap(), block(i, b"c2s"));
        assert_eq!(c_read.expect_message().unwrap(), block(i, b"s2c"));
    }
    assert!(c_read.send(&Message::Bye).is_err());
    assert!(c_write.read_message().is_err());
}

/// Runs a keyed handshake through a relay that changes the suite byte of
/// the Hello going `to_server` (else the one coming back) to `suite`.
fn downgraded(
    to_server: bool,
    suite: u8,
) -> (Result<Security, ProtoError>, Result<(), ProtoError>) {
    let (a, relay_a) = UnixStream::pair().unwrap();
    let (relay_b, b) = UnixStream::pair().unwrap();
    let pump = |mut from: UnixStream, mut to: UnixStream, change: bool| {
        std::thread::spawn(move || {
            let mut first = true;
            loop {
                let mut head = [0u8; 4];
                if from.read_exact(&mut head).is_err() {
                    let _ = to.shutdown(std::net::Shutdown::Write);
                    return;
                }
                let mut frame = head.to_vec();
                frame.resize(4 + u32::from_be_bytes(head) as usize, 0);
                if from.read_exact(&mut frame[4..]).is_err() {
                    return;
                }
                if first && change {
                    // Hello: len, type, version(2), keyed, nonce(32), session(16), suite.
                    frame[4 + 1 + 2 + 1 + 32 + 16] = suite;
                }
                first = false;
                if to.write_all(&frame).is_err() {
                    return;
                }
            }
        })
    };
    let p1 = pump(
        relay_a.try_clone().unwrap(),
        relay_b.try_clone().unwrap(),
        to_server,
    );
    let p2 = pump(relay_b, relay_a, !to_server);
    let server = std::thread::spawn(move || {
        let mut conn = Connection::new(b);
        let ring = Keyring::single(key(1));
        server_handshake_keyring(&mut conn, ring.clients(), true, true, |_, _| Ok(()))
    });
    let mut conn = Connection::new(a);
    let c = client_handshake_with(
        &mut conn,
        Some(&key(1)),
        &SessionSecret::from_bytes([5; 32]),
        true,
    );
    drop(conn);
    let s = server.join().unwrap();
    let _ = (p1.join(), p2.join());
    (c, s)
}

#[test]
fn a_relay_cannot_change_the_offer_or_the_choice() {
    // Ask the server, in the client's name, not to encrypt: the server's
    // proof then covers another offer and the client refuses it.
    let (c, _) = downgraded(true, 2);
    assert!(matches!(c, Err(ProtoError::Auth(_))), "{c:?}");
    // Tell the client the server chose ChaCha20 without encryption: the
    // client's proof covers that choice and the server refuses it.
    let (c, s) = downgraded(false, 0x82);
    assert!(matches!(s, Err(ProtoError::Auth(_))), "{s:?}");
    assert!(c.is_err(), "{c:?}");
    // Tell the client the session is plain: refused outright.
    let (c, _) = downgraded(false, 0);
    assert!(matches!(c, Err(ProtoError::Auth(_))), "{c:?}");
}

#[test]
fn a_keyring_server_tells_which_client_proved_itself() {
    let ring = Keyring::parse(
        format!(
            "# three clients\nintact-client-v1 alice a sealed-test passphrase number 1\n\
             intact-client-v1 bob b/c {}\n\
             intact-client-v1 carol c sealed-test passphrase number 3\n",
            key(2).to_line().as_str()
        )
        .as_bytes(),
        "ring",
    )
    .unwrap();
    for (n, want) in [
        (1u8, Some(("alice", "a"))),
        (2, Some(("bob", "b/c"))),
        (3, Some(("carol", "c"))),
        (4, None),
    ] {
        let (a, b) = UnixStream::pair().unwrap();
        let ring = ring.clone();
        let server = std::thread::spawn(move || {
            let mut conn = Connection::new(b);
            server_handshake_keyring(
                &mut conn,
                ring.clients(),
                true,
                false,
                |_, c: Option<&ClientKey>| {
                    Ok((
                        c.unwrap().name.clone(),
                        c.unwrap().subtree.as_ref().map(|s| s.to_string()),
                    ))
                },
            )
        });
        let mut conn = Connection::new(a);
        let c = client_handshake_with(
            &mut conn,
            Some(&key(n)),
            &SessionSecret::from_bytes([1; 32]),
            true,
        );
        let s = server.join().unwrap();
        match want {
            Some((name, subtree)) => {
                c.unwrap();
                let (got, sub) = s.unwrap();
                assert_eq!(got, name);
                assert_eq!(sub.as_deref(), Some(subtree));
                assert!(matches!(conn.security(), Security::Sealed { .. }));
            }
            None => {
                assert!(c.is_err());
                assert!(matches!(s, Err(ProtoError::Auth(_))), "{s:?}");
            }
        }
    }
}

#[test]
fn before_authentication_a_large_frame_is_refused_at_its_prefix() {
    // A client that announces 16 MiB in its first frame: the server's
    // handshake refuses at the 4-byte prefix (it does not wait for, nor
    // make room for, 16 MiB).
    let (mut a, b) = UnixStream::pair().unwrap();
    a.write_all(&(16u32 << 20).to_be_bytes()).unwrap();
    let mut conn = Connection::new(b);
    let ring = Keyring::single(key(1));
    let r = server_handshake_keyring(&mut conn, ring.clients(), true, true, |_, _| Ok(()));
    assert!(
        matches!(r, Err(ProtoError::Oversized { len, max }) if len == 16 << 20 && max == HANDSHAKE_FRAME as u64),
        "{r:?}"
    );
    // The client side too: a server's first frame is bounded the same way.
    let (a, mut b) = UnixStream::pair().unwrap();
    b.write_all(&(HANDSHAKE_FRAME as u32 + 1).to_be_bytes())
        .unwrap();
    let mut conn = Connection::new(a);
    let r = client_handshake_with(
        &mut conn,
        Some(&key(1)),
        &SessionSecret::from_bytes([0; 32]),
        true,
    );
    assert!(matches!(r, Err(ProtoError::Oversized { .. })), "{r:?}");
}

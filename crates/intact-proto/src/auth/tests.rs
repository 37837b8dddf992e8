//! The version 7 handshake attacked in process: a relay that swaps a key
//! share, Joins that name another session, are missing, or do not open,
//! and the grouping of keyless and keyring clients by their secret.

use std::os::unix::net::UnixStream;
use std::thread::JoinHandle;

use super::*;

fn key(n: u8) -> Key {
    Key::from_passphrase(format!("auth unit test passphrase number {n}").as_bytes()).unwrap()
}

fn client(n: u8, name: &str) -> ClientKey {
    ClientKey {
        name: name.to_string(),
        key: key(n),
        subtree: None,
    }
}

/// A keyring server on `b` that admits every session and reports
/// (its session id, the client's name).
fn server(
    b: UnixStream,
    clients: Vec<ClientKey>,
) -> JoinHandle<Result<(SessionId, String), ProtoError>> {
    std::thread::spawn(move || {
        let mut conn = Connection::new(b);
        server_handshake_keyring(&mut conn, &clients, true, true, |id, c| {
            Ok((id, c.map_or(String::new(), |c| c.name.clone())))
        })
    })
}

/// What a hand-made keyed client sends after its Proof.
enum Join {
    /// `secret`, sealed under this connection's join key.
    Sealed(SessionSecret),
    /// These bytes as the Join's payload.
    Raw(Vec<u8>),
    /// A Bye instead of a Join.
    Missing,
}

/// A keyed client built from the handshake's parts: its Hello carries
/// `tag`, then it sends its Proof and `join`. Returns the server's answer
/// and the Join payload it sent.
fn hand_client(
    conn: &mut Connection<UnixStream>,
    k: &Key,
    tag: [u8; 16],
    join: Join,
) -> (Message, Vec<u8>) {
    let ours = nonce().unwrap();
    let (eph, share) = Ephemeral::new().unwrap();
    conn.send(&Message::Hello {
        version: VERSION,
        keyed: true,
        nonce: ours,
        session: tag,
        suite: 0,
        share,
    })
    .unwrap();
    let theirs = expect_hello(conn.expect_message().unwrap()).unwrap();
    let dh = eph.agree(&theirs.share).unwrap();
    let ex = Exchange {
        client_nonce: &ours,
        server_nonce: &theirs.nonce,
        tag: &tag,
        offer: 0,
        choice: theirs.suite,
        client_share: &share,
        server_share: &theirs.share,
    };
    let t = ex.transcript();
    let secrets = Secrets::new(k, &dh, &t);
    conn.write_message(&Message::Proof {
        mac: ex.proof(k, CLIENT_LABEL),
    })
    .unwrap();
    let payload = match join {
        Join::Sealed(s) => s.seal(&secrets.join_key()),
        Join::Raw(p) => p,
        Join::Missing => Vec::new(),
    };
    if payload.is_empty() {
        conn.send(&Message::Bye).unwrap();
    } else {
        conn.send(&Message::Join {
            payload: payload.clone(),
        })
        .unwrap();
    }
    (conn.expect_message().unwrap(), payload)
}

fn refused(m: &Message) -> &str {
    match m {
        Message::Refused { reason } => reason,
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn the_hand_made_client_is_admitted_when_its_join_is_honest() {
    // The control for the attacks below: the same code, honest, works.
    let (a, b) = UnixStream::pair().unwrap();
    let srv = server(b, vec![client(1, "one")]);
    let s = SessionSecret::from_bytes([4; 32]);
    let (answer, _) = hand_client(
        &mut Connection::new(a),
        &key(1),
        s.tag(),
        Join::Sealed(s.clone()),
    );
    assert!(matches!(answer, Message::Proof { .. }), "{answer:?}");
    assert_eq!(srv.join().unwrap().unwrap().0, s.id());
}

/// One keyed handshake of the hand-made client (tag `tag`, then `join`)
/// against a server of client key 1: the server's answer, the Join bytes
/// the client sent, and how the server's handshake ended.
fn attempt(
    tag: [u8; 16],
    join: Join,
) -> (Message, Vec<u8>, Result<(SessionId, String), ProtoError>) {
    let (a, b) = UnixStream::pair().unwrap();
    let srv = server(b, vec![client(1, "one")]);
    let (answer, recorded) = hand_client(&mut Connection::new(a), &key(1), tag, join);
    (answer, recorded, srv.join().unwrap())
}

#[test]
fn a_join_with_another_secret_a_missing_join_and_a_replayed_join_are_refused() {
    let victim = SessionSecret::from_bytes([1; 32]);
    let own = SessionSecret::from_bytes([2; 32]);
    // Another secret than the tag's: the attacker knows T, not S.
    let (answer, _, srv) = attempt(victim.tag(), Join::Sealed(own));
    assert_eq!(refused(&answer), SECRET_MISMATCH);
    assert!(matches!(srv, Err(ProtoError::Refused(ref r)) if r == SECRET_MISMATCH));
    // No Join at all.
    let (answer, _, srv) = attempt(victim.tag(), Join::Missing);
    assert!(refused(&answer).contains("expected the session secret (Join), got Bye"));
    assert!(srv.is_err());
    // The victim's own sealed Join, recorded on its connection, replayed
    // on another with the victim's tag: it was sealed for that one only.
    let (answer, recorded, srv) = attempt(victim.tag(), Join::Sealed(victim.clone()));
    assert!(matches!(answer, Message::Proof { .. }));
    assert_eq!(srv.unwrap().0, victim.id());
    let (answer, _, srv) = attempt(victim.tag(), Join::Raw(recorded));
    assert_eq!(refused(&answer), JOIN_UNOPENED);
    assert!(srv.is_err());
    // The secret in the clear (a keyless Join) on a keyed connection.
    let (answer, _, srv) = attempt(victim.tag(), Join::Raw(victim.bytes().to_vec()));
    assert_eq!(refused(&answer), JOIN_UNOPENED);
    assert!(srv.is_err());
}

/// Runs `client_handshake_with` through a relay that rewrites the
/// client's (`to_server`) or the server's Hello share; returns (client,
/// server) results.
fn through_relay(
    swap_client_share: bool,
    swap_server_share: bool,
) -> (
    Result<Security, ProtoError>,
    Result<(SessionId, String), ProtoError>,
) {
    let (a, relay_c) = UnixStream::pair().unwrap();
    let (relay_s, b) = UnixStream::pair().unwrap();
    let srv = server(b, vec![client(1, "one")]);
    let pipe = |from: UnixStream, to: UnixStream, swap: bool| {
        std::thread::spawn(move || {
            let mut from = Connection::new(from);
            let mut to = Connection::new(to);
            while let Ok(Some(mut m)) = from.read_message() {
                if let Message::Hello { share, .. } = &mut m {
                    if swap {
                        // A valid share of the relay's own.
                        *share = Ephemeral::new().unwrap().1;
                    }
                }
                if to.send(&m).is_err() {
                    break;
                }
            }
            let _ = to.get_ref().shutdown(std::net::Shutdown::Both);
        })
    };
    let up = pipe(
        relay_c.try_clone().unwrap(),
        relay_s.try_clone().unwrap(),
        swap_client_share,
    );
    let down = pipe(relay_s, relay_c, swap_server_share);
    let mut conn = Connection::new(a);
    let c = client_handshake_with(
        &mut conn,
        Some(&key(1)),
        &SessionSecret::from_bytes([5; 32]),
        true,
    );
    drop(conn);
    let s = srv.join().unwrap();
    up.join().unwrap();
    down.join().unwrap();
    (c, s)
}

#[test]
fn a_relay_that_swaps_either_key_share_breaks_the_proofs() {
    // Control: the relay passing everything untouched is invisible.
    let (c, s) = through_relay(false, false);
    assert!(c.is_ok() && s.is_ok(), "{c:?} {s:?}");
    for (cs, ss) in [(true, false), (false, true), (true, true)] {
        let (c, s) = through_relay(cs, ss);
        assert!(
            matches!(s, Err(ProtoError::Auth(_))),
            "{cs} {ss}: server {s:?}"
        );
        assert!(
            matches!(c, Err(ProtoError::Auth(_))),
            "{cs} {ss}: client {c:?}"
        );
    }
}

#[test]
fn a_small_order_share_is_refused_before_the_server_says_anything_else() {
    let (a, b) = UnixStream::pair().unwrap();
    let srv = server(b, vec![client(1, "one")]);
    let mut conn = Connection::new(a);
    conn.send(&Message::Hello {
        version: VERSION,
        keyed: true,
        nonce: [1; 32],
        session: [2; 16],
        suite: 0,
        share: [0; 32],
    })
    .unwrap();
    let m = conn.expect_message().unwrap();
    assert!(refused(&m).contains("small order"), "{m:?}");
    assert!(matches!(srv.join().unwrap(), Err(ProtoError::Auth(_))));
}

#[test]
fn keyless_clients_join_by_their_secret_sent_with_the_hello() {
    let s = SessionSecret::from_bytes([6; 32]);
    let (a, b) = UnixStream::pair().unwrap();
    let srv = server(b, vec![]);
    client_handshake_in(&mut Connection::new(a), None, &s).unwrap();
    let (id, _) = srv.join().unwrap().unwrap();
    assert_eq!(id, s.id());
    assert_ne!(id.0, s.tag(), "grouped by what the Hello shows");
    // A keyless Join naming another secret than the Hello's tag.
    let (a, b) = UnixStream::pair().unwrap();
    let srv = server(b, vec![]);
    let mut conn = Connection::new(a);
    conn.write_message(&Message::Hello {
        version: VERSION,
        keyed: false,
        nonce: [1; 32],
        session: s.tag(),
        suite: 0,
        share: [0; 32],
    })
    .unwrap();
    conn.send(&Message::Join {
        payload: vec![7; 32],
    })
    .unwrap();
    assert_eq!(refused(&conn.expect_message().unwrap()), SECRET_MISMATCH);
    assert!(srv.join().unwrap().is_err());
}

#[test]
fn keyring_clients_with_one_secret_are_two_sessions() {
    // Both clients' streams carry the same secret; the server sees each
    // client's name, and the id a keyring server groups by (the server's
    // admit closure: `id.within(name)`) differs.
    let s = SessionSecret::from_bytes([8; 32]);
    let ring = vec![client(1, "alice"), client(2, "bob")];
    let mut seen = Vec::new();
    for n in [1, 2] {
        let (a, b) = UnixStream::pair().unwrap();
        let srv = server(b, ring.clone());
        client_handshake_in(&mut Connection::new(a), Some(&key(n)), &s).unwrap();
        seen.push(srv.join().unwrap().unwrap());
    }
    assert_eq!(seen[0], (s.id(), "alice".to_string()));
    assert_eq!(seen[1], (s.id(), "bob".to_string()));
    assert_ne!(s.id().within("alice"), s.id().within("bob"));
}

//! The wire protocol against hostile bytes, split delivery and every
//! handshake outcome.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;

use intact_proto::{
    client_handshake, client_handshake_in, frame_len, server_handshake, server_handshake_admit,
    Block, Connection, Entry, EntryKind, EntryRange, FileResult, FileStatus, Key, Message,
    ProtoError, SessionSecret, WirePath, MAX_FRAME,
};
use proptest::prelude::*;

fn arb_path() -> impl Strategy<Value = WirePath> {
    proptest::collection::vec("[a-zA-Z0-9_. -]{1,12}", 1..5)
        .prop_filter_map("dot components are refused", |parts| {
            WirePath::parse(parts.join("/").as_bytes()).ok()
        })
}

fn arb_message() -> impl Strategy<Value = Message> {
    prop_oneof![
        (
            any::<u16>(),
            any::<bool>(),
            any::<[u8; 32]>(),
            any::<[u8; 16]>(),
            any::<u8>(),
            any::<[u8; 32]>()
        )
            .prop_map(
                |(version, keyed, nonce, session, suite, share)| Message::Hello {
                    version,
                    keyed,
                    nonce,
                    session,
                    suite,
                    share,
                }
            ),
        any::<[u8; 32]>().prop_map(|mac| Message::Proof { mac }),
        proptest::collection::vec(any::<u8>(), 0..=intact_proto::MAX_JOIN)
            .prop_map(|payload| Message::Join { payload }),
        ".{0,40}".prop_map(|reason| Message::Refused { reason }),
        (
            any::<u64>(),
            arb_path(),
            prop_oneof![
                Just(EntryKind::File),
                Just(EntryKind::Dir),
                "[a-z/.]{1,20}".prop_map(|t| EntryKind::Symlink(t.into_bytes()))
            ],
            (
                any::<u32>(),
                any::<i64>(),
                any::<u32>(),
                any::<u64>(),
                any::<u32>(),
                any::<u8>(),
                any::<u8>(),
                any::<u8>()
            ),
            proptest::collection::vec(1u8.., 0..100),
            (any::<bool>(), any::<[u8; 16]>(), 0u64..1000, 1u64..1000)
        )
            .prop_map(
                |(
                    file,
                    path,
                    kind,
                    (mode, mtime_sec, mtime_nsec, size, block_size, algorithm, verify, flags),
                    origin,
                    (ranged, split, first, len),
                )| {
                    // The RANGE flag is the encoding's, from `range`.
                    let flags = flags & !Entry::RANGE;
                    let range = (ranged && kind == EntryKind::File).then_some(EntryRange {
                        split,
                        first,
                        end: first + len,
                    });
                    Message::Entry(Entry {
                        file,
                        path,
                        kind,
                        mode,
                        mtime_sec,
                        mtime_nsec,
                        size,
                        block_size,
                        algorithm,
                        verify,
                        flags,
                        origin,
                        range,
                    })
                }
            ),
        (
            any::<u64>(),
            any::<u64>(),
            proptest::collection::vec(any::<u8>(), 0..64),
            proptest::collection::vec(any::<u8>(), 0..5000),
            any::<u8>(),
            proptest::collection::vec(any::<u32>(), 0..8),
            proptest::collection::btree_set(0..intact_proto::MAX_PAGES as u32, 0..8),
        )
            .prop_map(|(file, index, digest, data, source_level, crcs, patch)| {
                Message::Block(Block {
                    file,
                    index,
                    source_level,
                    digest,
                    crcs: crcs.iter().flat_map(|c| c.to_le_bytes()).collect(),
                    patch: patch.into_iter().collect(),
                    strong: Vec::new(),
                    data,
                })
            }),
        (
            any::<u64>(),
            any::<u64>(),
            any::<bool>(),
            proptest::collection::btree_set(0..intact_proto::MAX_PAGES as u32, 0..8),
        )
            .prop_map(|(file, index, ok, pages)| Message::BlockResult {
                file,
                index,
                ok,
                pages: pages.into_iter().collect(),
            }),
        (
            any::<u64>(),
            any::<u64>(),
            proptest::collection::vec(any::<u8>(), 0..64),
            any::<u8>()
        )
            .prop_map(|(file, blocks, digest, source_level)| Message::FileEnd {
                file,
                blocks,
                source_level,
                digest
            }),
        (
            any::<u64>(),
            any::<bool>(),
            any::<u8>(),
            ".{0,40}",
            any::<[u64; 5]>(),
            (any::<u8>(), any::<i64>(), any::<bool>(), any::<u8>())
        )
            .prop_map(
                |(
                    file,
                    ok,
                    level,
                    message,
                    [resident, evict, check, reverified, trusted],
                    (trusted_level, trusted_at, unchanged, split),
                )| {
                    Message::FileResult(FileResult {
                        file,
                        status: if ok {
                            FileStatus::Verified
                        } else {
                            FileStatus::Failed
                        },
                        level,
                        message,
                        resident,
                        evict_micros: evict,
                        check_micros: check,
                        unchanged,
                        reverified,
                        trusted,
                        trusted_level,
                        trusted_at,
                        split,
                        cache_repairs: resident ^ 5,
                        cache_micros: check ^ 3,
                        source_repairs: trusted ^ 9,
                        source_micros: reverified ^ 11,
                        digest: if split >= 2 {
                            vec![split; 32]
                        } else {
                            Vec::new()
                        },
                    })
                }
            ),
        Just(Message::Bye),
        Just(Message::Waiting),
        (
            any::<bool>(),
            proptest::collection::vec(any::<u8>(), 0..20),
            proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..20), 0..5),
            proptest::collection::vec((0u8..2, ".{0,20}"), 0..5)
        )
            .prop_map(|(dry_run, base, scopes, rules)| Message::DeleteStart {
                dry_run,
                base,
                scopes,
                rules,
            }),
        proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..30), 0..10)
            .prop_map(|paths| Message::DeleteKeep { paths }),
        Just(Message::DeleteRun),
        (
            proptest::collection::vec(".{0,20}", 0..5),
            proptest::collection::vec(".{0,20}", 0..5),
            proptest::collection::vec(".{0,40}", 0..3)
        )
            .prop_map(|(deleted, kept, errors)| Message::DeleteReport {
                deleted,
                kept,
                errors,
            }),
        Just(Message::DeleteDone),
        (arb_path(), any::<u64>(), 0..=intact_proto::MAX_BLOCK as u32)
            .prop_map(|(path, offset, len)| Message::Fetch { path, offset, len }),
        (
            any::<u64>(),
            proptest::result::maybe_ok(proptest::collection::vec(any::<u8>(), 0..200), ".{0,40}")
        )
            .prop_map(|(offset, result)| Message::Fetched { offset, result }),
        (
            any::<u64>(),
            proptest::option::of(proptest::collection::vec(
                (any::<u64>(), proptest::collection::vec(any::<u8>(), 0..64)),
                0..50
            )),
            any::<bool>()
        )
            .prop_map(|(file, b, whole)| Message::Status {
                file,
                holding: match (b, whole) {
                    (None, _) => intact_proto::Holding::Nothing,
                    (Some(b), false) => intact_proto::Holding::Blocks(b),
                    (Some(b), true) => intact_proto::Holding::Whole {
                        digest: b.first().map(|(_, d)| d.clone()).unwrap_or_default(),
                    },
                },
                strong: whole,
            }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn every_message_round_trips(msg in arb_message()) {
        let mut frame = Vec::new();
        msg.encode(&mut frame);
        prop_assert_eq!(frame_len(&frame).unwrap(), Some(frame.len()));
        // Any proper prefix is "need more", never an error or a frame.
        for cut in [0, 1, 3, 4, frame.len() / 2, frame.len() - 1] {
            prop_assert!(frame_len(&frame[..cut]).unwrap().is_none());
        }
        prop_assert_eq!(Message::decode(&frame[4..]).unwrap(), msg);
    }

    /// Arbitrary bytes never panic the decoder, and an accepted frame's
    /// length never exceeds the limit.
    #[test]
    fn hostile_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(Some(n)) = frame_len(&bytes) {
            prop_assert!(n <= MAX_FRAME + 4);
            let _ = Message::decode(&bytes[4..n]);
        }
        let _ = Message::decode(&bytes);
    }

    /// Flipping any byte of a valid frame body yields a clean result
    /// (another valid message, or an error), never a panic.
    #[test]
    fn corrupted_frames_fail_cleanly(msg in arb_message(), pos in any::<prop::sample::Index>(), flip in 1u8..) {
        let mut frame = Vec::new();
        msg.encode(&mut frame);
        let body = &mut frame[4..];
        let i = pos.index(body.len());
        body[i] ^= flip;
        let _ = Message::decode(body);
    }
}

#[test]
fn impossible_lengths_are_refused_before_buffering() {
    let huge = ((MAX_FRAME + 1) as u32).to_be_bytes();
    assert!(matches!(
        frame_len(&huge),
        Err(ProtoError::Oversized { .. })
    ));
    assert!(matches!(frame_len(&[0, 0, 0, 0]), Err(ProtoError::Empty)));
    assert!(matches!(
        Message::decode(&[200]),
        Err(ProtoError::UnknownType(200))
    ));
    // Trailing garbage after a valid message.
    let mut frame = Vec::new();
    Message::Bye.encode(&mut frame);
    frame.push(0);
    assert!(matches!(
        Message::decode(&frame[4..]),
        Err(ProtoError::Malformed { .. })
    ));
    // A path that escapes, inside an otherwise valid Entry.
    let mut frame = Vec::new();
    Message::Entry(Entry {
        file: 1,
        path: WirePath::parse(b"safe").unwrap(),
        kind: EntryKind::File,
        mode: 0o644,
        mtime_sec: 0,
        mtime_nsec: 0,
        size: 0,
        block_size: 4096,
        algorithm: 0,
        verify: 0,
        flags: 0,
        origin: Vec::new(),
        range: None,
    })
    .encode(&mut frame);
    let pos = frame.windows(4).position(|w| w == b"safe").unwrap();
    frame[pos..pos + 4].copy_from_slice(b"/etc");
    assert!(matches!(
        Message::decode(&frame[4..]),
        Err(ProtoError::BadPath { .. })
    ));
}

#[test]
fn text_is_strict_utf8_and_long_text_is_cut_on_a_character_boundary() {
    // Found by the fuzzer: lossy decoding did not round-trip.
    let mut frame = Vec::new();
    Message::Refused {
        reason: "é".into()
    }
    .encode(&mut frame);
    let last = frame.len() - 1;
    frame[last] = 0xff;
    assert!(matches!(
        Message::decode(&frame[4..]),
        Err(ProtoError::Malformed { .. })
    ));
    // 4097 bytes of 2-byte characters: cut to 4096, still valid UTF-8.
    let long = "é".repeat(4097 / 2 + 1);
    let mut frame = Vec::new();
    Message::Refused {
        reason: long.clone(),
    }
    .encode(&mut frame);
    match Message::decode(&frame[4..]).unwrap() {
        Message::Refused { reason } => {
            assert!(reason.len() <= 4096 && long.starts_with(&reason));
            assert_eq!(reason.len(), 4096);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn messages_survive_byte_at_a_time_delivery_and_eof_is_told_apart() {
    let (a, b) = UnixStream::pair().unwrap();
    let msgs = vec![
        Message::Bye,
        Message::Block(Block {
            file: 7,
            index: 3,
            source_level: 3,
            digest: vec![1; 16],
            crcs: Vec::new(),
            patch: Vec::new(),
            strong: Vec::new(),
            data: vec![0xAB; 200_000],
        }),
        Message::Refused { reason: "x".into() },
    ];
    let mut wire = Vec::new();
    for m in &msgs {
        m.encode(&mut wire);
    }
    let writer = std::thread::spawn(move || {
        let mut a = a;
        for chunk in wire.chunks(997) {
            a.write_all(chunk).unwrap();
        }
        // Half a frame, then close: the reader must call that an error.
        a.write_all(&[0, 0, 0, 9, 9]).unwrap();
    });
    let mut conn = Connection::new(b);
    for m in &msgs {
        assert_eq!(&conn.expect_message().unwrap(), m);
    }
    writer.join().unwrap();
    assert!(matches!(conn.read_message(), Err(ProtoError::Closed)));

    let (a, b) = UnixStream::pair().unwrap();
    drop(a);
    assert!(Connection::new(b).read_message().unwrap().is_none());
}

/// Runs both handshakes on a socket pair; returns (client, server) results.
fn handshake(
    client_key: Option<Key>,
    server_key: Option<Key>,
    loopback: bool,
) -> (Result<(), ProtoError>, Result<(), ProtoError>) {
    let (a, b) = UnixStream::pair().unwrap();
    let server = std::thread::spawn(move || {
        let mut conn = Connection::new(b);
        server_handshake(&mut conn, server_key.as_ref(), loopback)
    });
    let mut conn = Connection::new(a);
    let client = client_handshake(&mut conn, client_key.as_ref());
    drop(conn);
    (client, server.join().unwrap())
}

fn key(s: &str) -> Option<Key> {
    Some(Key::from_secret(s.as_bytes()).unwrap())
}

#[test]
fn handshake_outcomes() {
    let k = "correct horse battery staple";
    let (c, s) = handshake(key(k), key(k), false);
    assert!(c.is_ok() && s.is_ok(), "{c:?} {s:?}");

    let (c, s) = handshake(key(k), key("another key of enough length"), false);
    assert!(matches!(s, Err(ProtoError::Auth(_))), "{s:?}");
    // The client is told what the server's log says: another key.
    let c = c.unwrap_err().to_string();
    assert!(
        c.starts_with("authentication failed") && c.contains("different key at the server?"),
        "{c}"
    );

    let (c, s) = handshake(None, key(k), true);
    assert!(
        matches!(c, Err(ProtoError::Refused(ref r)) if r.contains("requires a key")),
        "{c:?}"
    );
    assert!(s.is_err());

    let (c, _) = handshake(key(k), None, true);
    assert!(
        matches!(c, Err(ProtoError::Refused(ref r)) if r.contains("no key")),
        "{c:?}"
    );

    let (c, s) = handshake(None, None, true);
    assert!(c.is_ok() && s.is_ok());

    let (c, _) = handshake(None, None, false);
    assert!(
        matches!(c, Err(ProtoError::Refused(ref r)) if r.contains("loopback")),
        "{c:?}"
    );
}

#[test]
fn other_versions_are_refused_with_a_reason() {
    let (a, b) = UnixStream::pair().unwrap();
    let server = std::thread::spawn(move || server_handshake(&mut Connection::new(b), None, true));
    let mut conn = Connection::new(a);
    conn.send(&Message::Hello {
        version: 99,
        keyed: false,
        nonce: [0; 32],
        session: [0; 16],
        suite: 0,
        share: [0; 32],
    })
    .unwrap();
    match conn.expect_message().unwrap() {
        Message::Refused { reason } => assert!(reason.contains("version 99"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(server.join().unwrap().is_err());
}

#[test]
fn a_version_3_hello_is_told_its_version_not_that_its_frame_is_bad() {
    // Version 3's Hello had no session id: type, version, keyed, nonce.
    let mut frame = vec![0, 0, 0, 36, 1, 0, 3, 0];
    frame.extend_from_slice(&[7; 32]);
    let (a, b) = UnixStream::pair().unwrap();
    let server = std::thread::spawn(move || server_handshake(&mut Connection::new(b), None, true));
    let mut conn = Connection::new(a);
    std::io::Write::write_all(&mut conn.get_ref(), &frame).unwrap();
    match conn.expect_message().unwrap() {
        Message::Refused { reason } => assert!(
            reason.contains(&format!(
                "version 3 is not spoken here ({} is)",
                intact_proto::VERSION
            )),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(server.join().unwrap().is_err());
}

#[test]
fn sessions_are_admitted_after_authentication_and_refused_with_a_reason() {
    let k = "correct horse battery staple";
    for keyed in [false, true] {
        let (a, b) = UnixStream::pair().unwrap();
        let sk = if keyed { key(k) } else { None };
        let server = std::thread::spawn(move || {
            server_handshake_admit(&mut Connection::new(b), sk.as_ref(), true, |s| {
                Err::<(), _>(format!("busy ({s})"))
            })
        });
        let ck = if keyed { key(k) } else { None };
        let id = SessionSecret::from_bytes([0xab; 32]);
        let c = client_handshake_in(&mut Connection::new(a), ck.as_ref(), &id);
        // The session is named by the secret (its id), not by the tag.
        let busy = format!("busy ({})", id.id());
        assert!(
            matches!(c, Err(ProtoError::Refused(ref r)) if *r == busy),
            "{keyed}: {c:?}"
        );
        assert!(server.join().unwrap().is_err());

        let (a, b) = UnixStream::pair().unwrap();
        let sk = if keyed { key(k) } else { None };
        let server = std::thread::spawn(move || {
            server_handshake_admit(&mut Connection::new(b), sk.as_ref(), true, Ok)
        });
        let ck = if keyed { key(k) } else { None };
        client_handshake_in(&mut Connection::new(a), ck.as_ref(), &id).unwrap();
        assert_eq!(server.join().unwrap().unwrap(), id.id(), "{keyed}");
    }
    // A wrong key is never admitted (admission sees only proven clients).
    let (a, b) = UnixStream::pair().unwrap();
    let server = std::thread::spawn(move || {
        server_handshake_admit(
            &mut Connection::new(b),
            key(k).as_ref(),
            true,
            |_| -> Result<(), String> { panic!("admitted an unproven client") },
        )
    });
    let other = key("another key of enough length");
    assert!(client_handshake(&mut Connection::new(a), other.as_ref()).is_err());
    assert!(matches!(server.join().unwrap(), Err(ProtoError::Auth(_))));
}

#[test]
fn key_files_must_be_private_and_long_enough() {
    let dir = std::env::temp_dir().join(format!("intact-key-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("key");
    std::fs::write(&path, "  a secret of sufficient length\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = Key::from_file(&path).unwrap_err().to_string();
    assert!(err.contains("chmod 600"), "{err}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    Key::from_file(&path).unwrap();
    std::fs::write(&path, "short\n").unwrap();
    assert!(Key::from_file(&path)
        .unwrap_err()
        .to_string()
        .contains("16 bytes"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_delete_list_longer_than_its_frame_is_refused_before_allocating() {
    // DeleteKeep claiming u32::MAX paths in a 5-byte body.
    let body = [13, 0xff, 0xff, 0xff, 0xff];
    assert!(matches!(
        Message::decode(&body),
        Err(ProtoError::Malformed { .. })
    ));
    // DeleteStart with more scopes than allowed.
    let mut body = vec![12, 0, 0, 0, 0, 0];
    body.extend_from_slice(&u32::MAX.to_be_bytes());
    assert!(matches!(
        Message::decode(&body),
        Err(ProtoError::Malformed { .. })
    ));
}

/// The body of `m`'s frame (without its length prefix).
fn body_of(m: &Message) -> Vec<u8> {
    let mut out = Vec::new();
    m.encode(&mut out);
    out.split_off(intact_proto::HEADER_LEN)
}

#[test]
fn a_range_on_a_directory_or_an_empty_range_is_malformed() {
    let file = Entry {
        file: 1,
        path: WirePath::parse(b"big").unwrap(),
        kind: EntryKind::File,
        mode: 0o644,
        mtime_sec: 1,
        mtime_nsec: 0,
        size: 1 << 20,
        block_size: 4096,
        algorithm: 1,
        verify: 5,
        flags: 0,
        origin: Vec::new(),
        range: Some(EntryRange {
            split: [5; 16],
            first: 3,
            end: 9,
        }),
    };
    let ok = Message::Entry(file.clone());
    assert_eq!(Message::decode(&body_of(&ok)).unwrap(), ok);
    // The flag comes from `range` alone: set in flags without a range, it
    // is not sent.
    let flagged = Message::Entry(Entry {
        flags: Entry::RANGE,
        range: None,
        ..file.clone()
    });
    let Message::Entry(back) = Message::decode(&body_of(&flagged)).unwrap() else {
        panic!()
    };
    assert_eq!((back.flags, back.range), (0, None));
    for (bad, why) in [
        (
            Entry {
                kind: EntryKind::Dir,
                ..file.clone()
            },
            "not a file",
        ),
        (
            Entry {
                range: Some(EntryRange {
                    split: [5; 16],
                    first: 9,
                    end: 9,
                }),
                ..file.clone()
            },
            "empty range",
        ),
    ] {
        match Message::decode(&body_of(&Message::Entry(bad))) {
            Err(ProtoError::Malformed { detail, .. }) => assert!(detail.contains(why), "{detail}"),
            other => panic!("{why}: {other:?}"),
        }
    }
    // A range cut short.
    let mut body = body_of(&ok);
    body.truncate(body.len() - 4);
    assert!(Message::decode(&body).is_err());
}

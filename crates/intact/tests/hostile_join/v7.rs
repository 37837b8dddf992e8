//! A hand-written protocol-7 client for hostile_join.rs, its handshake
//! built from the construction documented in intact-proto (auth.rs,
//! seal.rs, session.rs), not from intact-proto's own handshake code: to
//! attack the server (a Hello's tag and its Join chosen apart) and, by
//! being admitted when honest, to check that the documentation is what
//! the server does.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use intact_proto::{Message, SessionSecret, VERSION};
use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::agreement::{agree_ephemeral, EphemeralPrivateKey, UnparsedPublicKey, X25519};
use ring::rand::{SecureRandom, SystemRandom};

pub fn read_frame(s: &mut impl Read) -> Option<Vec<u8>> {
    let mut head = [0u8; 4];
    s.read_exact(&mut head).ok()?;
    let mut f = head.to_vec();
    f.resize(4 + u32::from_be_bytes(head) as usize, 0);
    s.read_exact(&mut f[4..]).ok()?;
    Some(f)
}

pub fn frame(m: &Message) -> Vec<u8> {
    let mut v = Vec::new();
    m.encode(&mut v);
    v
}

pub fn decode(f: &[u8]) -> Message {
    Message::decode(&f[4..]).unwrap_or_else(|e| panic!("{e}: {f:?}"))
}

/// A Hello's fields: (nonce, session tag, suite, share).
pub fn hello_fields(m: &Message) -> ([u8; 32], [u8; 16], u8, [u8; 32]) {
    match m {
        Message::Hello {
            nonce,
            session,
            suite,
            share,
            ..
        } => (*nonce, *session, *suite, *share),
        other => panic!("not a Hello: {other:?}"),
    }
}

/// What the handshake's keys are bound to.
pub struct Transcript {
    pub nonce_c: [u8; 32],
    pub nonce_s: [u8; 32],
    pub tag: [u8; 16],
    pub offer: u8,
    pub choice: u8,
    pub share_c: [u8; 32],
    pub share_s: [u8; 32],
}

impl Transcript {
    /// From a captured client Hello and server Hello.
    pub fn from_hellos(client: &Message, server: &Message) -> Transcript {
        let (nonce_c, tag, offer, share_c) = hello_fields(client);
        let (nonce_s, _, choice, share_s) = hello_fields(server);
        Transcript {
            nonce_c,
            nonce_s,
            tag,
            offer,
            choice,
            share_c,
            share_s,
        }
    }

    /// The proof of the side labelled `label` (auth.rs).
    pub fn proof(&self, psk: &[u8; 32], client: bool) -> [u8; 32] {
        let (label, first, second): (&[u8], _, _) = if client {
            (b"intact/1 client", &self.nonce_s, &self.nonce_c)
        } else {
            (b"intact/1 server", &self.nonce_c, &self.nonce_s)
        };
        let mut h = blake3::Hasher::new_keyed(psk);
        h.update(label);
        h.update(&VERSION.to_be_bytes());
        h.update(first);
        h.update(second);
        h.update(&self.tag);
        h.update(&[self.offer, self.choice]);
        h.update(&self.share_c);
        h.update(&self.share_s);
        *h.finalize().as_bytes()
    }

    /// Version 7's HKDF output for `label` (seal.rs): salt the nonces,
    /// input key material psk ‖ dh, info label ‖ version ‖ tag ‖ offer ‖
    /// choice ‖ both shares.
    pub fn v7(&self, psk: &[u8; 32], dh: &[u8; 32], label: &[u8], n: usize) -> Vec<u8> {
        let mut ikm = psk.to_vec();
        ikm.extend_from_slice(dh);
        let mut info = label.to_vec();
        info.extend_from_slice(&VERSION.to_be_bytes());
        info.extend_from_slice(&self.tag);
        info.extend_from_slice(&[self.offer, self.choice]);
        info.extend_from_slice(&self.share_c);
        info.extend_from_slice(&self.share_s);
        self.expand(&ikm, &info, n)
    }

    /// Version 6's frame keys (no DH: input key material the psk alone;
    /// info "intact/6 frame keys" ‖ version ‖ session ‖ offer ‖ choice):
    /// all a recorder who holds the key could derive then.
    pub fn v6(&self, psk: &[u8; 32], version: u16) -> Vec<u8> {
        let mut info = b"intact/6 frame keys".to_vec();
        info.extend_from_slice(&version.to_be_bytes());
        info.extend_from_slice(&self.tag);
        info.extend_from_slice(&[self.offer, self.choice]);
        self.expand(psk, &info, 64)
    }

    fn expand(&self, ikm: &[u8], info: &[u8], n: usize) -> Vec<u8> {
        let mut salt = self.nonce_c.to_vec();
        salt.extend_from_slice(&self.nonce_s);
        let hk = hkdf::Hkdf::<sha2::Sha256>::new(Some(&salt), ikm);
        let mut out = vec![0u8; n];
        hk.expand(info, &mut out).unwrap();
        out
    }

    /// The frames' AEAD, from the server's choice byte.
    pub fn cipher(&self) -> &'static aead::Algorithm {
        match self.choice & 0x7f {
            1 => &aead::AES_256_GCM,
            2 => &aead::CHACHA20_POLY1305,
            c => panic!("choice {c}"),
        }
    }
}

pub fn seq_nonce(seq: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&seq.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

/// Opens an encrypted sealed frame (prefix ‖ body ‖ tag) with `key` at
/// sequence number `seq`; the decoded message, or None.
pub fn open(alg: &'static aead::Algorithm, key: &[u8], seq: u64, f: &[u8]) -> Option<Message> {
    let k = LessSafeKey::new(UnboundKey::new(alg, key).unwrap());
    let mut body = f[4..].to_vec();
    let plain = k
        .open_in_place(seq_nonce(seq), Aad::from(&f[..4]), &mut body)
        .ok()?;
    Message::decode(plain).ok()
}

/// Seals `m` as an encrypted frame with `key` at sequence number `seq`.
pub fn seal(alg: &'static aead::Algorithm, key: &[u8], seq: u64, m: &Message) -> Vec<u8> {
    let k = LessSafeKey::new(UnboundKey::new(alg, key).unwrap());
    let mut f = frame(m);
    let sealed_len = (f.len() - 4 + 16) as u32;
    f[..4].copy_from_slice(&sealed_len.to_be_bytes());
    let mut body = f.split_off(4);
    k.seal_in_place_append_tag(seq_nonce(seq), Aad::from(&f[..4]), &mut body)
        .unwrap();
    f.extend_from_slice(&body);
    f
}

/// What the hand-written client sends after its Proof.
pub enum Join {
    /// This secret, sealed under the connection's join key.
    Sealed(SessionSecret),
    /// These bytes as the Join's payload.
    Raw(Vec<u8>),
    /// A Bye where the Join belongs.
    Missing,
}

/// A hand-written client's handshake: its answer and what it derived.
pub struct Hand {
    pub answer: Message,
    pub transcript: Transcript,
    pub dh: [u8; 32],
    pub stream: TcpStream,
}

pub fn hand_client(addr: &str, psk: &[u8; 32], tag: [u8; 16], offer: u8, join: Join) -> Hand {
    let rng = SystemRandom::new();
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let eph = EphemeralPrivateKey::generate(&X25519, &rng).unwrap();
    let share_c: [u8; 32] = eph
        .compute_public_key()
        .unwrap()
        .as_ref()
        .try_into()
        .unwrap();
    let mut nonce_c = [0u8; 32];
    rng.fill(&mut nonce_c).unwrap();
    let hello = Message::Hello {
        version: VERSION,
        keyed: true,
        nonce: nonce_c,
        session: tag,
        suite: offer,
        share: share_c,
    };
    stream.write_all(&frame(&hello)).unwrap();
    let theirs = decode(&read_frame(&mut stream).expect("the server's Hello"));
    let t = Transcript::from_hellos(&hello, &theirs);
    let dh: [u8; 32] = agree_ephemeral(eph, &UnparsedPublicKey::new(&X25519, t.share_s), |d| {
        d.try_into().unwrap()
    })
    .unwrap();
    let mut out = frame(&Message::Proof {
        mac: t.proof(psk, true),
    });
    let payload = match join {
        Join::Sealed(secret) => {
            let key = t.v7(psk, &dh, b"intact/7 join key", 32);
            let k = LessSafeKey::new(UnboundKey::new(&aead::CHACHA20_POLY1305, &key).unwrap());
            let mut sealed = secret.bytes().to_vec();
            k.seal_in_place_append_tag(
                Nonce::assume_unique_for_key([0; 12]),
                Aad::from(b"intact/7 join"),
                &mut sealed,
            )
            .unwrap();
            Some(sealed)
        }
        Join::Raw(p) => Some(p),
        Join::Missing => None,
    };
    out.extend(match payload {
        Some(payload) => frame(&Message::Join { payload }),
        None => frame(&Message::Bye),
    });
    stream.write_all(&out).unwrap();
    let answer = decode(&read_frame(&mut stream).expect("the server's answer"));
    if let Message::Proof { mac } = &answer {
        assert_eq!(*mac, t.proof(psk, false), "the server's proof");
    }
    Hand {
        answer,
        transcript: t,
        dh,
        stream,
    }
}

pub fn refusal(m: &Message) -> &str {
    match m {
        Message::Refused { reason } => reason,
        other => panic!("admitted: {other:?}"),
    }
}

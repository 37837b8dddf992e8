//! A hand-written client of `intact serve` (the protocol spoken frame by
//! frame) and what the hostile tests read of the server process: RSS and
//! descriptors from /proc, files on disk, and an honest send afterwards.

use std::collections::HashMap;
use std::fs;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use intact_digest::{defaults, hash, Algorithm};
use intact_proto::{
    client_handshake, Block, Connection, Entry, EntryKind, FileResult, Message, WirePath,
};
use intact_transfer::VerifyMode;

use super::{s, send, stderr, Server};

pub type Conn = Connection<TcpStream>;

pub fn connect(server: &Server) -> Conn {
    let stream = TcpStream::connect(server.addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut conn = Connection::new(stream);
    client_handshake(&mut conn, None).unwrap();
    conn
}

/// A stream of the session `secret` (keyless, loopback).
pub fn stream_of(server: &Server, secret: &intact_proto::SessionSecret) -> Conn {
    let stream = TcpStream::connect(server.addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut conn = Connection::new(stream);
    intact_proto::client_handshake_in(&mut conn, None, secret).unwrap();
    conn
}

/// A session that announces `e` (file id 1) and holds its path open, so
/// that another session's Entry on that path waits for it.
pub fn hold_path(server: &Server, e: &Entry) -> Conn {
    let mut a = stream_of(server, &intact_proto::SessionSecret::random().unwrap());
    a.send(&Message::Entry(e.clone())).unwrap();
    loop {
        match a.read_message().unwrap().expect("answered") {
            Message::Status { file: 1, .. } => return a,
            Message::FileResult(r) => panic!("the holder's file failed: {}", r.message),
            _ => {}
        }
    }
}

pub fn file_entry(id: u64, path: &str, size: u64, block_size: u32, mode: VerifyMode) -> Entry {
    Entry {
        file: id,
        path: WirePath::parse(path.as_bytes()).unwrap(),
        kind: EntryKind::File,
        mode: 0o644,
        mtime_sec: 1_600_000_000,
        mtime_nsec: 0,
        size,
        block_size,
        algorithm: defaults::BLOCK_ALGORITHM.wire_id(),
        verify: mode.wire_id(),
        flags: 0,
        origin: Vec::new(),
        range: None,
    }
}

pub fn dir_entry(id: u64, path: &str, mode: u32) -> Entry {
    Entry {
        kind: EntryKind::Dir,
        mode,
        mtime_sec: 1_000_000_000,
        ..file_entry(id, path, 0, 4096, VerifyMode::None)
    }
}

pub fn block(file: u64, index: u64, data: &[u8]) -> Message {
    Message::Block(Block {
        file,
        index,
        source_level: 0,
        digest: hash(defaults::BLOCK_ALGORITHM, data).as_bytes().to_vec(),
        crcs: intact_digest::page_crc_blob(data, intact_proto::WIRE_PAGE),
        patch: Vec::new(),
        strong: Vec::new(),
        data: data.to_vec(),
    })
}

/// FileEnd with the whole file's BLAKE3 (the sender's whole-file digest).
pub fn file_end(file: u64, blocks: u64, whole: &[u8]) -> Message {
    Message::FileEnd {
        file,
        blocks,
        source_level: 0,
        digest: hash(Algorithm::Blake3, whole).as_bytes().to_vec(),
    }
}

/// The next message, or None once the server closed the connection.
pub fn next(conn: &mut Conn) -> Option<Message> {
    conn.read_message().ok().flatten()
}

/// Reads until the FileResult of `id`. Like a sender with nothing more to
/// send, it says Waiting before each wait: the server commits its group
/// of verified files then.
pub fn result_of(conn: &mut Conn, id: u64) -> FileResult {
    loop {
        let _ = conn.send(&Message::Waiting);
        match next(conn) {
            Some(Message::FileResult(r)) if r.file == id => return r,
            Some(_) => {}
            None => panic!("connection closed before the result of file {id}"),
        }
    }
}

/// Reads until the Status of `id` (panics on its FileResult).
pub fn status_of(conn: &mut Conn, id: u64) {
    loop {
        match next(conn) {
            Some(Message::Status { file, .. }) if file == id => return,
            Some(Message::FileResult(r)) if r.file == id => {
                panic!("file {id} answered instead of a Status: {}", r.message)
            }
            Some(_) => {}
            None => panic!("connection closed before the Status of file {id}"),
        }
    }
}

pub fn bye(mut conn: Conn) {
    conn.send(&Message::Bye).unwrap();
    while let Some(m) = next(&mut conn) {
        if m == Message::Bye {
            return;
        }
    }
}

/// A line of /proc/PID/status, in kB.
pub fn proc_kb(pid: u32, key: &str) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
}

pub fn open_fds(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

pub fn alive(server: &mut Server) {
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "the server process died"
    );
}

/// Every regular file under `root` (outside `.intact`) with its bytes.
pub fn contents(root: &Path) -> HashMap<PathBuf, Vec<u8>> {
    walkdir::WalkDir::new(root)
        .into_iter()
        .filter_entry(|e| e.file_name() != ".intact")
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            let rel = e.path().strip_prefix(root).unwrap().to_path_buf();
            (rel, fs::read(e.path()).unwrap())
        })
        .collect()
}

/// An honest `intact send` of a small tree into `sub` still works, and
/// the bytes arrive.
pub fn honest_send_works(server: &Server, scratch: &Path, root: &Path, sub: &str) {
    let src = scratch.join(format!("honest-{sub}"));
    fs::create_dir_all(src.join("d")).unwrap();
    let data = intact_sample::bytes(300_000, 7);
    fs::write(src.join("d/f.bin"), &data).unwrap();
    let out = send(&[s(&src), &format!("{}:/{sub}", server.addr())]);
    assert!(out.status.success(), "{}", stderr(&out));
    let got = root.join(sub).join(format!("honest-{sub}/d/f.bin"));
    assert!(
        fs::read(got).unwrap() == data,
        "the honest send's bytes differ"
    );
}

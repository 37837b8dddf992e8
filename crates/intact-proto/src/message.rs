//! The messages of protocol version 11 and their byte encoding.
//!
//! Version 11 added split files: an [`Entry`] may carry a block range of
//! its file ([`Entry::range`]), the part one shard of a plan sends; the
//! receiver commits the file once ranges covering it have all verified,
//! and a [`FileResult`] says where the range stands ([`FileResult::split`]).
//! A range's FileEnd carries its range digest ([`range_digest`]), not the
//! whole file's.
//!
//! Version 10 added page-level resend: a [`Block`] carries the CRC-32C of
//! each [`WIRE_PAGE`]-byte page beside its digest ([`Block::crcs`]), a
//! [`Message::BlockResult`] that fails a block names the pages found bad
//! (`pages`), and the sender then sends only those pages, as a Block whose
//! [`Block::patch`] lists them.
//!
//! Version 9 added [`Entry::origin`]: the sender's name for the source of
//! each entry (`host:/absolute/path`), which the receiver keeps in its
//! catalog as the sender's claim.
//!
//! Version 8 added the pull exchange: [`Message::Fetch`] asks a server
//! for a byte range of a file under the client's root, answered by
//! [`Message::Fetched`] (the bytes, or why not). `intact scrub
//! --repair-from HOST:PORT` uses it to fetch the pages it found rotten;
//! a server answers only when started with `--allow-fetch`.
//!
//! Version 7 added an ephemeral X25519 key share to Hello (mixed into the
//! frame keys for forward secrecy, see [`crate::seal`]), made Hello's
//! session field the public tag of the client's session secret, and added
//! [`Message::Join`], in which the client sends that secret (sealed after
//! a keyed handshake's Proof, in the clear after a keyless Hello; see
//! [`crate::session`]): a server groups streams by the secret, never by
//! what a Hello shows.
//!
//! Version 6 added the frame-protection suite to Hello (after the
//! handshake every frame of a keyed session is sealed, see
//! [`crate::seal`]), and made FileEnd's whole-file digest one the
//! receiver checks.
//!
//! Version 4 added the client's session id to Hello (so a server can tell
//! the streams of one client apart from other clients'). Version 5 added
//! the `--delete` exchange: [`Message::DeleteStart`], [`Message::DeleteKeep`]
//! (in chunks), [`Message::DeleteRun`], answered by [`Message::DeleteReport`]
//! chunks and [`Message::DeleteDone`]. Version 6: [`Message::FileEnd`]
//! carries the whole file's BLAKE3, which the receiver compares with the
//! bytes it holds before it commits, and [`Holding::Whole`] carries the
//! digest the receiver holds instead of a list of block digests.
//!
//! A frame is a 4-byte big-endian body length, then the body: one type
//! byte and the fields. Integers are big-endian; byte strings carry a
//! 4-byte length. Every variable-length field has a hard limit, checked
//! before anything is allocated.

use crate::{ProtoError, WirePath, MAX_PATH_LEN};

/// Largest block payload, in bytes (16 MiB).
pub const MAX_BLOCK: usize = 16 << 20;
/// Largest digest carried, in bytes.
pub const MAX_DIGEST: usize = 64;
/// Largest free-text field (reasons, messages), in bytes.
pub const MAX_TEXT: usize = 4096;
/// Largest [`Entry::origin`], in bytes: a host name and a path.
pub const MAX_ORIGIN: usize = MAX_PATH_LEN + 256;
/// The page a [`Block::crcs`] entry covers, in bytes (4 KiB).
pub const WIRE_PAGE: usize = 4096;
/// Most pages of one block: [`MAX_BLOCK`] / [`WIRE_PAGE`].
pub const MAX_PAGES: usize = MAX_BLOCK / WIRE_PAGE;
/// Largest frame body: a full block, its page CRCs, a page list and the
/// headers.
pub const MAX_FRAME: usize = MAX_BLOCK + 8 * MAX_PAGES + 1024;
/// Bytes of the length prefix.
pub const HEADER_LEN: usize = 4;

/// What kind of tree entry an [`Entry`] announces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file; its blocks follow.
    File,
    /// A directory.
    Dir,
    /// A symbolic link with this target, created as a link, never followed.
    Symlink(Vec<u8>),
}

/// A file, directory or symlink the sender is about to transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Sender-chosen id that blocks and results refer to.
    pub file: u64,
    /// Where it goes, relative to the receiver's root.
    pub path: WirePath,
    /// What it is.
    pub kind: EntryKind,
    /// Permission bits (the low 12 bits of st_mode).
    pub mode: u32,
    /// Modification time, seconds since the epoch.
    pub mtime_sec: i64,
    /// Modification time, nanoseconds part.
    pub mtime_nsec: u32,
    /// Size in bytes (files only).
    pub size: u64,
    /// Block size the file is cut into, in bytes.
    pub block_size: u32,
    /// Digest algorithm of blocks and the whole file (intact's algorithm id).
    pub algorithm: u8,
    /// How the receiver must verify this file (intact's verify-mode id).
    pub verify: u8,
    /// [`Entry::REVERIFY`] and future flags.
    pub flags: u8,
    /// Where the sender says the entry comes from, `host:/absolute/path`
    /// (version 9; at most [`MAX_ORIGIN`] bytes, no NUL; empty: not
    /// named). A claim of the sender's, recorded as such.
    pub origin: Vec<u8>,
    /// Version 11: the blocks of the file this entry sends, when it is one
    /// range of a split file (files only); None: the whole file.
    pub range: Option<EntryRange>,
}

/// One range of a split file: blocks `first..end` of the file the Entry
/// announces (its size, mtime and block size are the whole file's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryRange {
    /// The split this range belongs to: every range of one file in one
    /// plan carries the same id, which only holders of the plan can make.
    pub split: [u8; 16],
    /// First block of the range.
    pub first: u64,
    /// One past its last block.
    pub end: u64,
}

/// The context of [`range_digest`]'s key derivation.
pub const RANGE_DIGEST_CONTEXT: &str = "intact 2026-11 range of a split file";

/// A range's digest, as its FileEnd carries it: a BLAKE3 key derivation
/// over the file's size and block size, the range, and the BLAKE3
/// chaining value of each of its blocks (`cvs`, block `first` first; each
/// is the block's subtree of the whole file's BLAKE3 tree, so the ranges'
/// values compose the file's BLAKE3 without reading it again).
pub fn range_digest(size: u64, block: u64, first: u64, end: u64, cvs: &[[u8; 32]]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key(RANGE_DIGEST_CONTEXT);
    for n in [size, block, first, end] {
        h.update(&n.to_be_bytes());
    }
    for cv in cvs {
        h.update(cv);
    }
    *h.finalize().as_bytes()
}

impl Entry {
    /// Flag: re-check a file the receiver already holds instead of
    /// trusting its journal.
    pub const REVERIFY: u8 = 1;
    /// Flag: fail the file unless its verification reaches the device.
    pub const REQUIRE_DEVICE: u8 = 2;
    /// Flag: device-level re-reads use O_DIRECT (else evict-then-read).
    pub const DIRECT: u8 = 4;
    /// Flag (with [`Entry::REQUIRE_DEVICE`]): fail the file unless its
    /// verification reaches the media behind the device's write cache
    /// (`--require-level media`).
    pub const REQUIRE_MEDIA: u8 = 8;
    /// Flag (version 11, set by the encoding from [`Entry::range`]): a
    /// range follows the origin.
    pub const RANGE: u8 = 16;
}

/// What the receiver already holds of a file just announced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holding {
    /// Nothing usable: send every block.
    Nothing,
    /// These blocks are on its disk and still match these digests. The
    /// sender skips a block only if its own copy has the same digest.
    Blocks(Vec<(u64, Vec<u8>)>),
    /// The file is held whole under its final name, and these are the
    /// BLAKE3 bytes of what it holds: recorded by the receiver's own
    /// whole-file comparison when the file was committed (trusted from its
    /// journal at a level at least the mode's), or computed now from a
    /// re-read in place (`--reverify`, or a record below the mode's aim).
    /// The sender compares them with its own source's digest: if equal it
    /// sends no block, only a FileEnd with that digest (the receiver then
    /// answers `unchanged`); else it sends every block (the receiver then
    /// writes the file anew).
    Whole {
        /// The whole file's BLAKE3, as the receiver holds it.
        digest: Vec<u8>,
    },
}

/// One block of a file, with the digest the sender computed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// The entry's id.
    pub file: u64,
    /// Block number (offset = index × block size).
    pub index: u64,
    /// The level the sender's read behind `digest` reached (intact's level
    /// id): `device` when it came from the source's device. The receiver
    /// records the lower of this and its own check's level.
    pub source_level: u8,
    /// Digest of the whole block.
    pub digest: Vec<u8>,
    /// Version 10: the CRC-32C of each [`WIRE_PAGE`]-byte page of the
    /// whole block (the last may be short), 4 little-endian bytes each;
    /// empty where the mode sends none (`none`). A receiver names the pages
    /// whose CRC differs when the block fails, and only those are resent.
    pub crcs: Vec<u8>,
    /// Version 10: empty for a whole block; otherwise the pages (in
    /// increasing order) whose bytes `data` carries, one after the other:
    /// a resend of only the pages the receiver named. The receiver merges
    /// them with the block's other pages as it holds them and checks the
    /// whole against `digest`.
    pub patch: Vec<u32>,
    /// Version 12: the BLAKE3 of the whole block (32 bytes), sent when the
    /// receiver asked for it in its Status (it has a recovery cache) and
    /// the file may be cached; else empty. A recovery cache keeps a block
    /// under this digest, and the receiver takes a block back from a cache
    /// only if its BLAKE3 equals the one that came over this channel.
    pub strong: Vec<u8>,
    /// The bytes: the whole block, or the pages `patch` lists.
    pub data: Vec<u8>,
}

/// Bytes of [`Block::strong`] when present.
pub const STRONG_LEN: usize = 32;

impl Block {
    /// The number of [`WIRE_PAGE`] pages of a block of `len` bytes.
    pub fn pages_of(len: usize) -> usize {
        len.div_ceil(WIRE_PAGE)
    }

    /// The byte range of page `page` in a block of `len` bytes.
    pub fn page_range(len: usize, page: u32) -> std::ops::Range<usize> {
        let start = (page as usize * WIRE_PAGE).min(len);
        start..(start + WIRE_PAGE).min(len)
    }
}

/// How a file ended at the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileStatus {
    /// Every block verified; the file carries its final name.
    Verified,
    /// Gave up (retries spent, I/O error, refused path); no final name.
    Failed,
}

/// The receiver's verdict on one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileResult {
    /// The entry's id.
    pub file: u64,
    /// Verified or failed.
    pub status: FileStatus,
    /// Verification level reached (intact's level id).
    pub level: u8,
    /// Why it failed, or notes.
    pub message: String,
    /// Device-level modes: pages found still resident after eviction.
    pub resident: u64,
    /// Device-level modes: microseconds spent flushing and evicting.
    pub evict_micros: u64,
    /// Microseconds spent re-reading and hashing for verification.
    pub check_micros: u64,
    /// The file was held whole under its final name; nothing was written.
    pub unchanged: bool,
    /// Bytes the receiver held and re-verified in place in this run (not
    /// sent), at the level of this run's checks.
    pub reverified: u64,
    /// Bytes the receiver held and trusted from its journal (not sent,
    /// not re-read beyond a check through the cache).
    pub trusted: u64,
    /// The lowest level recorded for the trusted bytes (intact's level id).
    pub trusted_level: u8,
    /// When the oldest trusted byte was verified, seconds since the epoch.
    pub trusted_at: i64,
    /// Version 11, for a range of a split file: [`FileResult::SPLIT_WAITING`],
    /// [`FileResult::SPLIT_COMMITTED`] or [`FileResult::SPLIT_HELD`]; 0
    /// otherwise.
    pub split: u8,
    /// Version 12: blocks of this file that failed a check and were
    /// repaired from a recovery cache (not asked of the sender again).
    pub cache_repairs: u64,
    /// Microseconds from those blocks' failures to their verified repairs.
    pub cache_micros: u64,
    /// Version 12: blocks of this file that failed a check and were
    /// repaired by the sender.
    pub source_repairs: u64,
    /// Microseconds from those blocks' failures to their verified repairs.
    pub source_micros: u64,
    /// Version 13, for a range of a split file that says the file is
    /// committed ([`FileResult::SPLIT_COMMITTED`], [`FileResult::SPLIT_HELD`]):
    /// the BLAKE3 of the file under its final name, as the receiver
    /// recorded it (composed from its confirmed ranges' chaining values),
    /// so that the sender can check it is the file its own ranges make;
    /// empty otherwise.
    pub digest: Vec<u8>,
}

impl FileResult {
    /// The range verified; the file waits for its other ranges.
    pub const SPLIT_WAITING: u8 = 1;
    /// The range verified, and with it every range of the file: this
    /// session committed the file under its final name.
    pub const SPLIT_COMMITTED: u8 = 2;
    /// The file was committed already, and this range of it is unchanged.
    pub const SPLIT_HELD: u8 = 3;
}

/// Values of [`Message::FileEnd`] fields.
pub struct FileEnd;

impl FileEnd {
    /// `blocks` value by which a sender abandons a file (its source changed
    /// or could not be read): the receiver must not give it its final name.
    pub const ABANDON: u64 = u64::MAX;
}

/// A protocol message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// First message of each side: protocol version, whether it holds a
    /// key, a fresh random challenge and, from a client, its session.
    Hello {
        /// Protocol version.
        version: u16,
        /// Whether this side authenticates with a pre-shared key.
        keyed: bool,
        /// Fresh random bytes for the challenge.
        nonce: [u8; 32],
        /// From a client: the tag of its session secret (version 7; the
        /// same on every stream of one run, see [`crate::SessionSecret`]);
        /// zeros from a server. Absent before version 4, read as zeros.
        session: [u8; 16],
        /// Frame protection (version 6): from a client, its offer (bit 0:
        /// AES is fast here; bit 1: do not encrypt); from a server, its
        /// choice (0 plain, 1 AES-256-GCM, 2 ChaCha20-Poly1305, +0x80 not
        /// encrypted). See [`crate::seal`]. Absent before 6: read as 0.
        suite: u8,
        /// This side's ephemeral X25519 public key share (version 7; zeros
        /// in a keyless handshake). Absent before 7: read as zeros.
        share: [u8; 32],
    },
    /// The client's session secret (version 7, see [`crate::session`]):
    /// sealed under the handshake's join key after a keyed Proof, the 32
    /// bytes in the clear after a keyless Hello.
    Join {
        /// At most [`MAX_JOIN`] bytes.
        payload: Vec<u8>,
    },
    /// Proof of holding the key (see [`crate::auth`]).
    Proof {
        /// Keyed hash over both challenges.
        mac: [u8; 32],
    },
    /// The session is refused; the connection then closes.
    Refused {
        /// Why.
        reason: String,
    },
    /// A tree entry follows.
    Entry(Entry),
    /// A block of a file.
    Block(Block),
    /// The receiver's verdict on one block: `ok` false asks for a resend.
    BlockResult {
        /// The entry's id.
        file: u64,
        /// Block number.
        index: u64,
        /// Whether it verified.
        ok: bool,
        /// Version 10, when `ok` is false: the pages (increasing, at most
        /// [`MAX_PAGES`]) whose CRC-32C differed from the block's
        /// [`Block::crcs`]; only they are to be resent. Empty: the whole
        /// block.
        pages: Vec<u32>,
    },
    /// All blocks of a file were sent; the whole-file digest.
    FileEnd {
        /// The entry's id.
        file: u64,
        /// How many blocks the file has; the receiver commits only if this
        /// matches its own count ([`FileEnd::ABANDON`] never does).
        blocks: u64,
        /// The level the sender's reads of the source reached for the
        /// whole file (intact's level id): the receiver records no more.
        source_level: u8,
        /// The whole file's BLAKE3 as the sender's source holds it (for an
        /// abandoned file, anything). The receiver commits only if it equals
        /// the BLAKE3 of the bytes it holds for the file; a file it holds
        /// whole commits unchanged only if it equals the digest it holds.
        digest: Vec<u8>,
    },
    /// The receiver's verdict on a file.
    FileResult(FileResult),
    /// Nothing more will be sent.
    Bye,
    /// `--delete`: the sender asks the server to prune, under `base`
    /// (empty: the root), each of `scopes` (relative to `base`; empty: `base`
    /// itself) of what the keep list (sent next in [`Message::DeleteKeep`]
    /// chunks) does not name and the rules do not protect. Paths are raw
    /// bytes here: the server checks them and refuses with a reason.
    DeleteStart {
        /// List only; remove nothing.
        dry_run: bool,
        /// The subdirectory of the root the send went to (empty: the root).
        base: Vec<u8>,
        /// The directories the sources cover, relative to `base`.
        scopes: Vec<Vec<u8>>,
        /// The include/exclude rules in order: (0 include / 1 exclude, pattern).
        rules: Vec<(u8, String)>,
    },
    /// `--delete`: a chunk of the paths (relative to `base`) the source has.
    DeleteKeep {
        /// Paths in this chunk.
        paths: Vec<Vec<u8>>,
    },
    /// `--delete`: the keep list is complete; prune now and answer.
    DeleteRun,
    /// `--delete`: a chunk of the server's answer (paths relative to `base`).
    DeleteReport {
        /// Removed (or, in a dry run, would be removed).
        deleted: Vec<String>,
        /// Directories kept because they hold protected entries.
        kept: Vec<String>,
        /// What could not be removed.
        errors: Vec<String>,
    },
    /// `--delete`: the answer is complete.
    DeleteDone,
    /// The sender will send nothing more until it gets results: the
    /// receiver should commit what it has verified and answer now.
    Waiting,
    /// Version 8: the client asks for `len` bytes of the regular file
    /// `path` (under its root) from `offset`; answered by
    /// [`Message::Fetched`]. One request at a time per connection.
    Fetch {
        /// The file, relative to the client's root on the server.
        path: WirePath,
        /// First byte.
        offset: u64,
        /// Bytes wanted, at most [`MAX_BLOCK`].
        len: u32,
    },
    /// Version 8: the answer to a [`Message::Fetch`]: the bytes (fewer
    /// than asked only at the end of the file), or why not.
    Fetched {
        /// The offset asked for.
        offset: u64,
        /// The bytes, at most [`MAX_BLOCK`], or the reason.
        result: Result<Vec<u8>, String>,
    },
    /// The receiver's answer to a file's Entry: what it already holds.
    /// (A file it holds whole and unchanged is answered by a FileResult.)
    Status {
        /// The entry's id.
        file: u64,
        /// What it holds.
        holding: Holding,
        /// Version 12: the receiver has a recovery cache and asks for each
        /// block's BLAKE3 ([`Block::strong`]) of this file.
        strong: bool,
    },
}

const HELLO: u8 = 1;
const PROOF: u8 = 2;
const REFUSED: u8 = 3;
const ENTRY: u8 = 4;
const BLOCK: u8 = 5;
const BLOCK_RESULT: u8 = 6;
const FILE_END: u8 = 7;
const FILE_RESULT: u8 = 8;
const BYE: u8 = 9;
const STATUS: u8 = 10;
const WAITING: u8 = 11;
const DELETE_START: u8 = 12;
const DELETE_KEEP: u8 = 13;
const DELETE_RUN: u8 = 14;
const DELETE_REPORT: u8 = 15;
const DELETE_DONE: u8 = 16;
const JOIN: u8 = 17;
const FETCH: u8 = 18;
const FETCHED: u8 = 19;

/// Largest Join payload, in bytes (a sealed secret is 48).
pub const MAX_JOIN: usize = 64;

/// Most scopes one DeleteStart may carry.
pub const MAX_DELETE_SCOPES: usize = 4096;
/// Most include/exclude rules one DeleteStart may carry.
pub const MAX_DELETE_RULES: usize = 4096;
/// Bytes of path data to put in one DeleteKeep or DeleteReport chunk
/// (well under [`MAX_FRAME`]; a sender splits its lists at this size).
pub const DELETE_CHUNK_BYTES: usize = 1 << 20;

/// Most blocks one Status may list (keeps the frame under the limit).
pub const MAX_STATUS_BLOCKS: usize = (MAX_FRAME - 64) / (8 + 4 + MAX_DIGEST);

impl Message {
    /// The message's name, for errors.
    pub fn name(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "Hello",
            Message::Proof { .. } => "Proof",
            Message::Join { .. } => "Join",
            Message::Refused { .. } => "Refused",
            Message::Entry(_) => "Entry",
            Message::Block(_) => "Block",
            Message::BlockResult { .. } => "BlockResult",
            Message::FileEnd { .. } => "FileEnd",
            Message::FileResult(_) => "FileResult",
            Message::Bye => "Bye",
            Message::Status { .. } => "Status",
            Message::Waiting => "Waiting",
            Message::DeleteStart { .. } => "DeleteStart",
            Message::DeleteKeep { .. } => "DeleteKeep",
            Message::DeleteRun => "DeleteRun",
            Message::DeleteReport { .. } => "DeleteReport",
            Message::DeleteDone => "DeleteDone",
            Message::Fetch { .. } => "Fetch",
            Message::Fetched { .. } => "Fetched",
        }
    }

    /// Appends the whole frame (length prefix included) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; HEADER_LEN]);
        let mut w = Writer(out);
        match self {
            Message::Hello {
                version,
                keyed,
                nonce,
                session,
                suite,
                share,
            } => {
                w.u8(HELLO);
                w.u16(*version);
                w.u8(u8::from(*keyed));
                w.raw(nonce);
                w.raw(session);
                w.u8(*suite);
                w.raw(share);
            }
            Message::Join { payload } => {
                w.u8(JOIN);
                w.bytes(&payload[..payload.len().min(MAX_JOIN)]);
            }
            Message::Proof { mac } => {
                w.u8(PROOF);
                w.raw(mac);
            }
            Message::Refused { reason } => {
                w.u8(REFUSED);
                w.bytes(truncate_text(reason).as_bytes());
            }
            Message::Entry(e) => {
                w.u8(ENTRY);
                w.u64(e.file);
                w.bytes(e.path.as_bytes());
                match &e.kind {
                    EntryKind::File => w.u8(0),
                    EntryKind::Dir => w.u8(1),
                    EntryKind::Symlink(t) => {
                        w.u8(2);
                        w.bytes(t);
                    }
                }
                w.u32(e.mode);
                w.u64(e.mtime_sec as u64);
                w.u32(e.mtime_nsec);
                w.u64(e.size);
                w.u32(e.block_size);
                w.u8(e.algorithm);
                w.u8(e.verify);
                let flags = e.flags & !Entry::RANGE;
                w.u8(flags | if e.range.is_some() { Entry::RANGE } else { 0 });
                w.bytes(&e.origin[..e.origin.len().min(MAX_ORIGIN)]);
                if let Some(r) = &e.range {
                    w.raw(&r.split);
                    w.u64(r.first);
                    w.u64(r.end);
                }
            }
            Message::Block(b) => {
                w.u8(BLOCK);
                w.u64(b.file);
                w.u64(b.index);
                w.u8(b.source_level);
                w.bytes(&b.digest);
                w.bytes(&b.crcs[..b.crcs.len().min(4 * MAX_PAGES)]);
                w.pages(&b.patch);
                w.bytes(&b.strong[..b.strong.len().min(STRONG_LEN)]);
                w.bytes(&b.data);
            }
            Message::BlockResult {
                file,
                index,
                ok,
                pages,
            } => {
                w.u8(BLOCK_RESULT);
                w.u64(*file);
                w.u64(*index);
                w.u8(u8::from(*ok));
                w.pages(pages);
            }
            Message::FileEnd {
                file,
                blocks,
                source_level,
                digest,
            } => {
                w.u8(FILE_END);
                w.u64(*file);
                w.u64(*blocks);
                w.u8(*source_level);
                w.bytes(digest);
            }
            Message::FileResult(r) => {
                w.u8(FILE_RESULT);
                w.u64(r.file);
                w.u8(match r.status {
                    FileStatus::Verified => 0,
                    FileStatus::Failed => 1,
                });
                w.u8(r.level);
                w.bytes(truncate_text(&r.message).as_bytes());
                w.u64(r.resident);
                w.u64(r.evict_micros);
                w.u64(r.check_micros);
                w.u8(u8::from(r.unchanged));
                w.u64(r.reverified);
                w.u64(r.trusted);
                w.u8(r.trusted_level);
                w.u64(r.trusted_at as u64);
                w.u8(r.split);
                w.u64(r.cache_repairs);
                w.u64(r.cache_micros);
                w.u64(r.source_repairs);
                w.u64(r.source_micros);
                w.bytes(&r.digest);
            }
            Message::Bye => w.u8(BYE),
            Message::Waiting => w.u8(WAITING),
            Message::DeleteStart {
                dry_run,
                base,
                scopes,
                rules,
            } => {
                w.u8(DELETE_START);
                w.u8(u8::from(*dry_run));
                w.bytes(&base[..base.len().min(MAX_PATH_LEN)]);
                let scopes = &scopes[..scopes.len().min(MAX_DELETE_SCOPES)];
                w.u32(scopes.len() as u32);
                for s in scopes {
                    w.bytes(&s[..s.len().min(MAX_PATH_LEN)]);
                }
                let rules = &rules[..rules.len().min(MAX_DELETE_RULES)];
                w.u32(rules.len() as u32);
                for (kind, pattern) in rules {
                    w.u8(*kind);
                    w.bytes(truncate_text(pattern).as_bytes());
                }
            }
            Message::DeleteKeep { paths } => {
                w.u8(DELETE_KEEP);
                w.u32(paths.len() as u32);
                for p in paths {
                    w.bytes(&p[..p.len().min(MAX_PATH_LEN)]);
                }
            }
            Message::DeleteRun => w.u8(DELETE_RUN),
            Message::DeleteReport {
                deleted,
                kept,
                errors,
            } => {
                w.u8(DELETE_REPORT);
                for list in [deleted, kept, errors] {
                    w.u32(list.len() as u32);
                    for t in list {
                        w.bytes(truncate_text(t).as_bytes());
                    }
                }
            }
            Message::DeleteDone => w.u8(DELETE_DONE),
            Message::Fetch { path, offset, len } => {
                w.u8(FETCH);
                w.bytes(path.as_bytes());
                w.u64(*offset);
                w.u32(*len);
            }
            Message::Fetched { offset, result } => {
                w.u8(FETCHED);
                w.u64(*offset);
                match result {
                    Ok(data) => {
                        w.u8(0);
                        w.bytes(&data[..data.len().min(MAX_BLOCK)]);
                    }
                    Err(why) => {
                        w.u8(1);
                        w.bytes(truncate_text(why).as_bytes());
                    }
                }
            }
            Message::Status {
                file,
                holding,
                strong,
            } => {
                w.u8(STATUS);
                w.u64(*file);
                w.u8(u8::from(*strong));
                match holding {
                    Holding::Nothing => w.u8(0),
                    Holding::Whole { digest } => {
                        w.u8(2);
                        w.bytes(&digest[..digest.len().min(MAX_DIGEST)]);
                    }
                    Holding::Blocks(b) => {
                        w.u8(1);
                        let b = &b[..b.len().min(MAX_STATUS_BLOCKS)];
                        w.u32(b.len() as u32);
                        for (i, d) in b {
                            w.u64(*i);
                            w.bytes(&d[..d.len().min(MAX_DIGEST)]);
                        }
                    }
                }
            }
        }
        let body = (out.len() - start - HEADER_LEN) as u32;
        out[start..start + HEADER_LEN].copy_from_slice(&body.to_be_bytes());
    }

    /// As [`Message::decode`] of a whole frame (its prefix, then its body)
    /// held in memory of its own: a Block's data is moved to the front of
    /// that memory and kept, not copied.
    pub(crate) fn decode_owned(mut frame: Vec<u8>) -> Result<Message, ProtoError> {
        let body = frame.get(HEADER_LEN..).unwrap_or_default();
        let Some((&BLOCK, rest)) = body.split_first() else {
            return Message::decode(body);
        };
        let mut r = Reader {
            buf: rest,
            name: "Block",
        };
        let (mut b, data) = r.block()?;
        if !r.buf.is_empty() {
            return Err(r.bad("bytes left over after the last field"));
        }
        // The data is the frame's last field.
        let len = data.len();
        let start = frame.len() - len;
        frame.copy_within(start.., 0);
        frame.truncate(len);
        b.data = frame;
        Ok(Message::Block(b))
    }

    /// Step 2 of decoding: parses one frame body (without its length prefix).
    pub fn decode(body: &[u8]) -> Result<Message, ProtoError> {
        let (&kind, rest) = body.split_first().ok_or(ProtoError::Empty)?;
        let name = match kind {
            HELLO => "Hello",
            PROOF => "Proof",
            REFUSED => "Refused",
            ENTRY => "Entry",
            BLOCK => "Block",
            BLOCK_RESULT => "BlockResult",
            FILE_END => "FileEnd",
            FILE_RESULT => "FileResult",
            BYE => "Bye",
            STATUS => "Status",
            WAITING => "Waiting",
            DELETE_START => "DeleteStart",
            DELETE_KEEP => "DeleteKeep",
            DELETE_RUN => "DeleteRun",
            DELETE_REPORT => "DeleteReport",
            DELETE_DONE => "DeleteDone",
            JOIN => "Join",
            FETCH => "Fetch",
            FETCHED => "Fetched",
            other => return Err(ProtoError::UnknownType(other)),
        };
        let mut r = Reader { buf: rest, name };
        let msg = match kind {
            HELLO => Message::Hello {
                version: r.u16()?,
                keyed: r.flag()?,
                nonce: r.array()?,
                // Before version 4 Hello ended here: an old peer is then
                // told its version is not spoken, not that its frame is bad.
                session: if r.buf.is_empty() {
                    [0; 16]
                } else {
                    r.array()?
                },
                // Before version 6 there was no suite: read as 0.
                suite: if r.buf.is_empty() { 0 } else { r.u8()? },
                // Before version 7 there was no key share: read as zeros.
                share: if r.buf.is_empty() {
                    [0; 32]
                } else {
                    r.array()?
                },
            },
            JOIN => Message::Join {
                payload: r.bytes(MAX_JOIN)?.to_vec(),
            },
            PROOF => Message::Proof { mac: r.array()? },
            REFUSED => Message::Refused { reason: r.text()? },
            ENTRY => {
                let file = r.u64()?;
                let path = WirePath::parse(r.bytes(MAX_PATH_LEN)?)?;
                let kind = match r.u8()? {
                    0 => EntryKind::File,
                    1 => EntryKind::Dir,
                    2 => {
                        let target = r.bytes(MAX_PATH_LEN)?;
                        if target.is_empty() || target.contains(&0) {
                            return Err(r.bad("empty symlink target or NUL in it"));
                        }
                        EntryKind::Symlink(target.to_vec())
                    }
                    _ => return Err(r.bad("unknown entry kind")),
                };
                let mut e = Entry {
                    file,
                    path,
                    kind,
                    mode: r.u32()?,
                    mtime_sec: r.u64()? as i64,
                    mtime_nsec: r.u32()?,
                    size: r.u64()?,
                    block_size: r.u32()?,
                    algorithm: r.u8()?,
                    verify: r.u8()?,
                    flags: r.u8()?,
                    origin: {
                        let o = r.bytes(MAX_ORIGIN)?;
                        if o.contains(&0) {
                            return Err(r.bad("NUL in the origin"));
                        }
                        o.to_vec()
                    },
                    range: None,
                };
                if e.flags & Entry::RANGE != 0 {
                    if e.kind != EntryKind::File {
                        return Err(r.bad("a range on an entry that is not a file"));
                    }
                    let range = EntryRange {
                        split: r.array()?,
                        first: r.u64()?,
                        end: r.u64()?,
                    };
                    if range.first >= range.end {
                        return Err(r.bad("an empty range"));
                    }
                    e.flags &= !Entry::RANGE;
                    e.range = Some(range);
                }
                Message::Entry(e)
            }
            BLOCK => {
                let (mut b, data) = r.block()?;
                b.data = data.to_vec();
                Message::Block(b)
            }
            BLOCK_RESULT => Message::BlockResult {
                file: r.u64()?,
                index: r.u64()?,
                ok: r.flag()?,
                pages: r.pages()?,
            },
            FILE_END => Message::FileEnd {
                file: r.u64()?,
                blocks: r.u64()?,
                source_level: r.u8()?,
                digest: r.bytes(MAX_DIGEST)?.to_vec(),
            },
            FILE_RESULT => Message::FileResult(FileResult {
                file: r.u64()?,
                status: match r.u8()? {
                    0 => FileStatus::Verified,
                    1 => FileStatus::Failed,
                    _ => return Err(r.bad("unknown file status")),
                },
                level: r.u8()?,
                message: r.text()?,
                resident: r.u64()?,
                evict_micros: r.u64()?,
                check_micros: r.u64()?,
                unchanged: r.flag()?,
                reverified: r.u64()?,
                trusted: r.u64()?,
                trusted_level: r.u8()?,
                trusted_at: r.u64()? as i64,
                split: r.u8()?,
                cache_repairs: r.u64()?,
                cache_micros: r.u64()?,
                source_repairs: r.u64()?,
                source_micros: r.u64()?,
                digest: r.bytes(MAX_DIGEST)?.to_vec(),
            }),
            STATUS => {
                let file = r.u64()?;
                let strong = r.flag()?;
                let holding = match r.u8()? {
                    0 => Holding::Nothing,
                    2 => Holding::Whole {
                        digest: r.bytes(MAX_DIGEST)?.to_vec(),
                    },
                    1 => {
                        let n = r.u32()? as usize;
                        if n > MAX_STATUS_BLOCKS || n * 12 > r.buf.len() {
                            return Err(r.bad("block list longer than the frame"));
                        }
                        let mut list = Vec::with_capacity(n);
                        for _ in 0..n {
                            list.push((r.u64()?, r.bytes(MAX_DIGEST)?.to_vec()));
                        }
                        Holding::Blocks(list)
                    }
                    _ => return Err(r.bad("unknown holding")),
                };
                Message::Status {
                    file,
                    holding,
                    strong,
                }
            }
            WAITING => Message::Waiting,
            DELETE_START => {
                let dry_run = r.flag()?;
                let base = r.bytes(MAX_PATH_LEN)?.to_vec();
                let n = r.count(MAX_DELETE_SCOPES, 4)?;
                let mut scopes = Vec::with_capacity(n);
                for _ in 0..n {
                    scopes.push(r.bytes(MAX_PATH_LEN)?.to_vec());
                }
                let n = r.count(MAX_DELETE_RULES, 5)?;
                let mut rules = Vec::with_capacity(n);
                for _ in 0..n {
                    let kind = r.u8()?;
                    if kind > 1 {
                        return Err(r.bad("unknown rule kind"));
                    }
                    rules.push((kind, r.text()?));
                }
                Message::DeleteStart {
                    dry_run,
                    base,
                    scopes,
                    rules,
                }
            }
            DELETE_KEEP => {
                let n = r.count(usize::MAX, 4)?;
                let mut paths = Vec::with_capacity(n);
                for _ in 0..n {
                    paths.push(r.bytes(MAX_PATH_LEN)?.to_vec());
                }
                Message::DeleteKeep { paths }
            }
            DELETE_RUN => Message::DeleteRun,
            DELETE_REPORT => {
                let mut lists = Vec::with_capacity(3);
                for _ in 0..3 {
                    let n = r.count(usize::MAX, 4)?;
                    let mut list = Vec::with_capacity(n);
                    for _ in 0..n {
                        list.push(r.text()?);
                    }
                    lists.push(list);
                }
                let errors = lists.pop().expect("3 lists");
                let kept = lists.pop().expect("3 lists");
                let deleted = lists.pop().expect("3 lists");
                Message::DeleteReport {
                    deleted,
                    kept,
                    errors,
                }
            }
            DELETE_DONE => Message::DeleteDone,
            FETCH => {
                let path = WirePath::parse(r.bytes(MAX_PATH_LEN)?)?;
                let offset = r.u64()?;
                let len = r.u32()?;
                if len as usize > MAX_BLOCK {
                    return Err(r.bad("range longer than a block"));
                }
                Message::Fetch { path, offset, len }
            }
            FETCHED => {
                let offset = r.u64()?;
                let result = match r.u8()? {
                    0 => Ok(r.bytes(MAX_BLOCK)?.to_vec()),
                    1 => Err(r.text()?),
                    _ => return Err(r.bad("unknown fetch result")),
                };
                Message::Fetched { offset, result }
            }
            _ => Message::Bye,
        };
        if !r.buf.is_empty() {
            return Err(r.bad("bytes left over after the last field"));
        }
        Ok(msg)
    }
}

/// Heap bytes one list item may take once decoded beyond its bytes on the
/// wire: its place in the list (a `Vec` or `String` header, 24 bytes, or
/// a block number and a digest, 32) and its own allocation's overhead
/// (glibc's smallest chunk is 32 bytes, for an item of 1 byte).
pub const LIST_ITEM_COST: u64 = 64;

/// What a frame `body` (its plaintext, without the length prefix) may
/// take in memory once decoded, beyond its own size: list items are each
/// a fresh allocation (a DeleteKeep of 4-byte paths decodes to about 7
/// times its wire size). 0 for a message without lists. Counts declared
/// by the body are believed only as far as its length allows (each item
/// takes at least 4 bytes on the wire), so this is an upper bound whatever
/// the body says, computed before anything is decoded.
pub fn decoded_extra(body: &[u8]) -> u64 {
    let at_most = (body.len() / 4) as u64;
    let items = match body.first() {
        Some(&DELETE_KEEP) => body
            .get(1..5)
            .map(|c| u64::from(u32::from_be_bytes(c.try_into().expect("4 bytes"))))
            .unwrap_or(0)
            .min(at_most),
        Some(&DELETE_START) => at_most.min((MAX_DELETE_SCOPES + MAX_DELETE_RULES) as u64),
        Some(&DELETE_REPORT) | Some(&STATUS) => at_most,
        _ => 0,
    };
    items * LIST_ITEM_COST
}

/// Step 1 of decoding: is a whole frame at the start of `buf`? Returns
/// its total length (prefix included), `None` if more bytes are needed, or
/// an error as soon as the prefix announces an impossible length, before
/// anything is buffered for it.
pub fn frame_len(buf: &[u8]) -> Result<Option<usize>, ProtoError> {
    let Some(prefix) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let len = u32::from_be_bytes(prefix.try_into().expect("4 bytes")) as usize;
    if len == 0 {
        return Err(ProtoError::Empty);
    }
    if len > MAX_FRAME {
        return Err(ProtoError::Oversized {
            len: len as u64,
            max: MAX_FRAME as u64,
        });
    }
    Ok((buf.len() >= HEADER_LEN + len).then_some(HEADER_LEN + len))
}

/// `s` cut to at most [`MAX_TEXT`] bytes, on a character boundary, so the
/// receiver's strict UTF-8 check accepts it.
fn truncate_text(s: &str) -> &str {
    let mut n = s.len().min(MAX_TEXT);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    &s[..n]
}

struct Writer<'a>(&'a mut Vec<u8>);

impl Writer<'_> {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn raw(&mut self, v: &[u8]) {
        self.0.extend_from_slice(v);
    }
    fn bytes(&mut self, v: &[u8]) {
        self.u32(v.len() as u32);
        self.raw(v);
    }
    /// A page list: its length, then each page number.
    fn pages(&mut self, v: &[u32]) {
        let v = &v[..v.len().min(MAX_PAGES)];
        self.u32(v.len() as u32);
        for p in v {
            self.u32(*p);
        }
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    name: &'static str,
}

impl<'a> Reader<'a> {
    fn bad(&self, detail: &'static str) -> ProtoError {
        ProtoError::Malformed {
            message: self.name,
            detail,
        }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if self.buf.len() < n {
            return Err(self.bad("field runs past the end of the frame"));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], ProtoError> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }
    fn u8(&mut self) -> Result<u8, ProtoError> {
        Ok(self.take(1)?[0])
    }
    fn flag(&mut self) -> Result<bool, ProtoError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(self.bad("boolean is neither 0 nor 1")),
        }
    }
    fn u16(&mut self) -> Result<u16, ProtoError> {
        Ok(u16::from_be_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, ProtoError> {
        Ok(u32::from_be_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, ProtoError> {
        Ok(u64::from_be_bytes(self.array()?))
    }
    fn bytes(&mut self, max: usize) -> Result<&'a [u8], ProtoError> {
        let len = self.u32()? as usize;
        if len > max {
            return Err(self.bad("byte string over its limit"));
        }
        self.take(len)
    }
    /// A list length: at most `max` and at most what the rest of the frame
    /// can hold at `min_item` bytes per item, checked before any allocation.
    fn count(&mut self, max: usize, min_item: usize) -> Result<usize, ProtoError> {
        let n = self.u32()? as usize;
        if n > max || n.saturating_mul(min_item) > self.buf.len() {
            return Err(self.bad("list longer than its limit or the frame"));
        }
        Ok(n)
    }
    /// A Block's fields (its data left empty) and its data, in the frame.
    fn block(&mut self) -> Result<(Block, &'a [u8]), ProtoError> {
        let b = Block {
            file: self.u64()?,
            index: self.u64()?,
            source_level: self.u8()?,
            digest: self.bytes(MAX_DIGEST)?.to_vec(),
            crcs: {
                let c = self.bytes(4 * MAX_PAGES)?;
                if c.len() % 4 != 0 {
                    return Err(self.bad("page CRCs are not 4 bytes each"));
                }
                c.to_vec()
            },
            patch: self.pages()?,
            strong: {
                let s = self.bytes(STRONG_LEN)?;
                if !s.is_empty() && s.len() != STRONG_LEN {
                    return Err(self.bad("a block's BLAKE3 is not 32 bytes"));
                }
                s.to_vec()
            },
            data: Vec::new(),
        };
        Ok((b, self.bytes(MAX_BLOCK)?))
    }
    /// A page list: at most [`MAX_PAGES`] page numbers, strictly
    /// increasing, each below [`MAX_PAGES`].
    fn pages(&mut self) -> Result<Vec<u32>, ProtoError> {
        let n = self.count(MAX_PAGES, 4)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let p = self.u32()?;
            if p as usize >= MAX_PAGES || out.last().is_some_and(|&last| p <= last) {
                return Err(self.bad("page list not increasing or past the largest block"));
            }
            out.push(p);
        }
        Ok(out)
    }
    fn text(&mut self) -> Result<String, ProtoError> {
        let b = self.bytes(MAX_TEXT)?;
        String::from_utf8(b.to_vec()).map_err(|_| self.bad("text is not UTF-8"))
    }
}

//! Turns a stream of choices (a seeded generator, or libFuzzer's bytes)
//! into a sequence of protocol messages a hostile client sends after its
//! handshake. Biased towards valid sequences (Entry, its blocks with the
//! right digests, FileEnd with the right count and whole-file digest,
//! Waiting, Bye) with small mutations, so that the receiver's inner states
//! are reached; out-of-place messages and `--delete` requests are mixed in.

// Shared with fuzz/fuzz_targets/session.rs, which uses other parts.
#![allow(dead_code)]

use intact_digest::{defaults, hash};
use intact_proto::{
    Block, Entry, EntryKind, FileEnd, FileResult, FileStatus, Holding, Message, WirePath,
};

/// Where choices come from. Exhausted bytes read as zeros, and a zero
/// choice is the plain, valid one, so a short fuzz input is a short valid
/// session rather than a pile of mutations.
pub struct Source<'a> {
    bytes: &'a [u8],
    pos: usize,
    rng: Option<u64>,
}

impl<'a> Source<'a> {
    /// Choices from libFuzzer's input.
    pub fn from_bytes(bytes: &'a [u8]) -> Source<'a> {
        Source {
            bytes,
            pos: 0,
            rng: None,
        }
    }

    /// Endless choices from a seeded generator (splitmix64).
    pub fn from_seed(seed: u64) -> Source<'static> {
        Source {
            bytes: &[],
            pos: 0,
            rng: Some(seed),
        }
    }

    fn next64(&mut self) -> u64 {
        match &mut self.rng {
            Some(s) => splitmix(s),
            None => {
                let mut v = 0u64;
                for _ in 0..8 {
                    v = (v << 8) | u64::from(self.byte());
                }
                v
            }
        }
    }

    fn byte(&mut self) -> u8 {
        if let Some(s) = &mut self.rng {
            return splitmix(s) as u8;
        }
        let b = self.bytes.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    /// A value below `n` (0 when `n` is 0); small inputs favour 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        if n <= 256 && self.rng.is_none() {
            return u64::from(self.byte()) % n;
        }
        self.next64() % n
    }

    /// True with about `pct` percent probability (never on exhausted bytes).
    pub fn chance(&mut self, pct: u32) -> bool {
        let v = u32::from(255 - self.byte());
        v * 100 < pct * 256
    }

    /// One of `xs` (the first on exhausted bytes).
    pub fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize].clone()
    }

    /// A seed for bytes generated locally (libFuzzer inputs stay small).
    pub fn seed(&mut self) -> u64 {
        self.next64()
    }
}

fn splitmix(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `n` pseudo-random bytes from `seed`.
pub fn bytes_from(seed: u64, n: usize) -> Vec<u8> {
    let mut s = seed;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        out.extend_from_slice(&splitmix(&mut s).to_le_bytes());
    }
    out.truncate(n);
    out
}

/// What the generator may do.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Announce block counts past `max_blocks` (size 2^40 with block size
    /// 1): a receiver that allocates per announced block aborts the whole
    /// process, so this is off unless `INTACT_FUZZ_HUGE` is set.
    pub huge: bool,
    /// Most blocks a file may announce when `huge` is off.
    pub max_blocks: u64,
    /// Most bytes of block data one sequence carries.
    pub max_data: usize,
    /// Most Block messages one file sends.
    pub max_blocks_sent: u64,
    /// An absolute path outside the server's root (a symlink target).
    pub outside: Vec<u8>,
    /// Sequences that trip bugs known today, off unless `INTACT_FUZZ_STRICT`
    /// names them (`samepath`, `reuse`; turn on by default once issue 11's
    /// fixes are merged): two entries of one sequence naming the same path
    /// (both get one partial file and a mix of their blocks is committed
    /// as verified, item 3), and an Entry reusing the id of a file still
    /// open (a block of the old file at the verifier then underflows the
    /// new file's counter, item 2).
    pub same_path: bool,
    /// See `same_path`.
    pub reuse_ids: bool,
}

/// Whether the strict part `what` is on: every part is, unless
/// `INTACT_FUZZ_LENIENT` names it (`reuse,samepath,modes,digest`, or `1`
/// for all) — for fuzzing a build that is known to miss one of them.
pub fn strict(what: &str) -> bool {
    !std::env::var("INTACT_FUZZ_LENIENT")
        .is_ok_and(|v| v == "1" || v.split(',').any(|p| p.trim() == what))
}

impl Limits {
    /// The bounds the CI test and the fuzz target use.
    pub fn new(outside: &std::path::Path) -> Limits {
        use std::os::unix::ffi::OsStrExt;
        Limits {
            huge: std::env::var_os("INTACT_FUZZ_HUGE").is_none_or(|v| v != "0"),
            max_blocks: 1 << 16,
            max_data: 256 << 10,
            max_blocks_sent: 300,
            outside: outside.as_os_str().as_bytes().to_vec(),
            same_path: strict("samepath"),
            reuse_ids: strict("reuse"),
        }
    }
}

/// The digest a Block carries for `data`.
pub fn block_digest(data: &[u8]) -> Vec<u8> {
    hash(defaults::BLOCK_ALGORITHM, data).as_bytes().to_vec()
}

/// The whole-file digest a FileEnd carries for `data`.
pub fn file_digest(data: &[u8]) -> Vec<u8> {
    blake3::hash(data).as_bytes().to_vec()
}

pub fn path(p: &str) -> WirePath {
    WirePath::parse(p.as_bytes()).expect("a valid wire path")
}

/// A file Entry with the usual fields.
pub fn file_entry(file: u64, p: &str, size: u64, block_size: u32, verify: u8) -> Entry {
    Entry {
        file,
        path: path(p),
        kind: EntryKind::File,
        mode: 0o644,
        mtime_sec: 1_700_000_000,
        mtime_nsec: 0,
        size,
        block_size,
        algorithm: defaults::BLOCK_ALGORITHM.wire_id(),
        verify,
        flags: 0,
        origin: Vec::new(),
        range: None,
    }
}

/// A Block of `data` with its correct digest.
pub fn block(file: u64, index: u64, data: &[u8]) -> Message {
    Message::Block(Block {
        file,
        index,
        source_level: 4,
        digest: block_digest(data),
        crcs: intact_digest::page_crc_blob(data, intact_proto::WIRE_PAGE),
        patch: Vec::new(),
        strong: Vec::new(),
        data: data.to_vec(),
    })
}

/// A FileEnd with `blocks` and the correct whole-file digest of `data`.
pub fn file_end(file: u64, blocks: u64, data: &[u8]) -> Message {
    Message::FileEnd {
        file,
        blocks,
        source_level: 4,
        digest: file_digest(data),
    }
}

const PATHS: &[&str] = &[
    "a",
    "b",
    "c",
    "d/a",
    "d/b",
    "d/e/f",
    "a",
    "b",
    "c",
    "d/a",
    "d/e/f",
    "d",
    "l/x",
    "m/x",
    ".intact/x",
    ".intact",
    "a/b",
    "l",
];

/// Where links and directories go (a link at "a" would fail every later
/// file Entry for "a", so they get paths of their own, mostly).
const LINK_PATHS: &[&str] = &["l", "m", "d/e", "l", "m", "a"];

/// Verify-mode ids: the six modes, and two this build does not know.
const VERIFY: &[u8] = &[
    0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 3, 4, 5, 3, 4, 5, 5, 6, 255,
];

const BLOCK_SIZES: &[u32] = &[
    64,
    1,
    2,
    3,
    7,
    512,
    4096,
    65536,
    1 << 20,
    16 << 20,
    u32::MAX,
    0,
];

const MODES: &[u32] = &[
    0o644,
    0o600,
    0o755,
    0o4755,
    0o2755,
    0o1777,
    0o7777,
    0,
    0o170_777,
    u32::MAX,
];

/// One file the generator announces.
struct Plan {
    id: u64,
    entry: Entry,
    /// The bytes the sender "has" (empty when the size is only announced).
    data: Vec<u8>,
    backed: bool,
}

fn gen_path(src: &mut Source) -> WirePath {
    if src.chance(3) {
        // The hidden partial name of another path, named directly.
        let name = intact_transfer::partial_name(std::ffi::OsStr::new(src.pick(&["a", "b"])));
        return path(name.to_str().expect("ascii"));
    }
    if src.chance(2) {
        // Long names and deep paths, up to the limits.
        let long = "n".repeat(src.pick(&[255usize, 256, 1000]));
        // Near MAX_PATH_LEN in few components (a judge walks it quickly).
        let deep = vec!["n".repeat(250); 16].join("/");
        return WirePath::parse(src.pick(&[long, deep]).as_bytes()).unwrap_or_else(|_| path("a"));
    }
    path(src.pick(PATHS))
}

fn gen_entry(
    src: &mut Source,
    lim: &Limits,
    id: u64,
    budget: &mut usize,
    used: &mut Vec<WirePath>,
) -> Plan {
    let mut p = gen_path(src);
    if !lim.same_path {
        let mut k = 0;
        while used.contains(&p) {
            p = path(&format!("u{k}"));
            k += 1;
        }
    }
    used.push(p.clone());
    let kind = if src.chance(12) {
        if src.chance(90) {
            p = path(src.pick(LINK_PATHS));
        }
        if src.chance(50) {
            EntryKind::Dir
        } else {
            let mut outside = lim.outside.clone();
            outside.extend_from_slice(b"/canary");
            EntryKind::Symlink(src.pick(&[
                b"../outside".to_vec(),
                lim.outside.clone(),
                outside,
                b"a".to_vec(),
                b"../../../../../../../tmp".to_vec(),
                b"d/../..".to_vec(),
            ]))
        }
    } else {
        EntryKind::File
    };
    let backed = !src.chance(15);
    // Half the time the file is "the same file again": a size, mtime and
    // content fixed by its path, so later sequences resume its partial
    // file, find it held whole, or re-verify it.
    let again = backed && src.chance(50);
    let bs = if !again && src.chance(40) {
        src.pick(BLOCK_SIZES)
    } else {
        64
    };
    let mut size = if again {
        let fixed = 64 * 3 + 5 + (u64::from(p.as_bytes()[0]) % 3) * 64;
        fixed.min(*budget as u64)
    } else if backed {
        let cap = (u64::from(bs).saturating_mul(3) + 2)
            .min(*budget as u64)
            .min(u64::from(bs).saturating_mul(lim.max_blocks_sent));
        src.below(cap + 1)
    } else {
        let b = u64::from(bs);
        src.pick(&[
            1 << 40,
            (1 << 40) + 1,
            u64::MAX,
            1 << 32,
            b.saturating_mul(lim.max_blocks),
            b.saturating_mul(lim.max_blocks).saturating_add(1),
            i64::MAX as u64,
        ])
    };
    if !lim.huge && bs > 0 && size.div_ceil(u64::from(bs)) > lim.max_blocks {
        size = u64::from(bs) * lim.max_blocks;
    }
    let data = if again {
        *budget -= size as usize;
        bytes_from(u64::from(p.as_bytes()[0]), size as usize)
    } else if backed {
        *budget -= size as usize;
        bytes_from(src.seed(), size as usize)
    } else {
        Vec::new()
    };
    let is_file = kind == EntryKind::File;
    let entry = Entry {
        file: id,
        path: p,
        kind,
        mode: if src.chance(20) {
            src.pick(MODES)
        } else {
            0o644
        },
        mtime_sec: if again {
            1_700_000_000
        } else {
            src.pick(&[1_700_000_000, 0, -1, i64::MIN, i64::MAX, 1])
        },
        mtime_nsec: if src.chance(10) {
            src.pick(&[1, 999_999_999, 1_000_000_000, u32::MAX])
        } else {
            0
        },
        size,
        block_size: bs,
        algorithm: if src.chance(3) {
            src.byte()
        } else {
            defaults::BLOCK_ALGORITHM.wire_id()
        },
        verify: src.pick(VERIFY),
        flags: if src.chance(25) { src.byte() & 7 } else { 0 },
        origin: Vec::new(),
        // Version 11: now and then one range of a split file (a split id
        // of two values, so ranges of one path meet), of any extent.
        range: (is_file && src.chance(8)).then(|| {
            let first = src.below(6);
            intact_proto::EntryRange {
                split: [src.below(2) as u8; 16],
                first,
                end: first + 1 + src.below(4),
            }
        }),
    };
    Plan {
        id,
        entry,
        data,
        backed,
    }
}

/// The messages of one file, in order, with mutations.
fn file_messages(src: &mut Source, plan: &Plan, ids: &[u64]) -> Vec<Message> {
    let mut out = vec![Message::Entry(plan.entry.clone())];
    if plan.entry.kind != EntryKind::File {
        return out;
    }
    let bs = u64::from(plan.entry.block_size).max(1);
    let size = plan.entry.size;
    let n = size.div_ceil(bs);
    let mut indexes: Vec<u64> = if plan.backed {
        (0..n).collect()
    } else {
        // Only announced: a few blocks near the start and the end, each
        // small enough to build.
        let mut v = vec![0, 1, n.saturating_sub(1), n];
        v.retain(|&i| i < n.saturating_add(1));
        v
    };
    if src.chance(15) {
        // Out of order.
        for i in (1..indexes.len()).rev() {
            let j = src.below(i as u64 + 1) as usize;
            indexes.swap(i, j);
        }
    }
    let mut data_seed = src.seed();
    for index in indexes {
        if src.chance(3) {
            continue; // a block never sent
        }
        let offset = index.saturating_mul(bs);
        let len = size.saturating_sub(offset).min(bs);
        if len > 256 << 10 {
            continue;
        }
        let mut data = if plan.backed {
            plan.data[offset as usize..(offset + len) as usize].to_vec()
        } else {
            data_seed = data_seed.wrapping_add(1);
            bytes_from(data_seed, len as usize)
        };
        let mut digest = block_digest(&data);
        let mut crcs = intact_digest::page_crc_blob(&data, intact_proto::WIRE_PAGE);
        // A page resend that follows the block (valid only where the
        // block's page was found bad and named).
        let mut patch = None;
        let mut b = Block {
            file: plan.id,
            index,
            source_level: if src.chance(10) { src.byte() } else { 4 },
            digest: Vec::new(),
            crcs: Vec::new(),
            patch: Vec::new(),
            strong: Vec::new(),
            data: Vec::new(),
        };
        if src.chance(10) {
            match src.below(13) {
                12 => {
                    // A BLAKE3 the server never asked for: right, wrong,
                    // or of a length no block has.
                    b.strong = match src.below(3) {
                        0 => blake3::hash(&data).as_bytes().to_vec(),
                        1 => vec![7; 32],
                        _ => vec![7; 31],
                    };
                }
                0 if !data.is_empty() => {
                    // Corrupted on the way: the digest is the original's.
                    let i = src.below(data.len() as u64) as usize;
                    data[i] ^= 1 << src.below(8);
                }
                1 if !digest.is_empty() => digest[0] ^= 1,
                2 => {
                    data.pop();
                }
                3 => data.push(0),
                4 if !data.is_empty() => {
                    // Other bytes with their own, correct digest.
                    data[0] ^= 0x80;
                    digest = block_digest(&data);
                }
                5 => b.index = index.wrapping_add(1),
                6 => b.index = src.pick(&[n, u64::MAX, 1 << 32]),
                7 => b.file = src.pick(ids).wrapping_add(src.below(2)),
                8 => digest = src.pick(&[Vec::new(), vec![0; 64], vec![0; 8]]),
                9 => crcs = src.pick(&[vec![0; 3], vec![0; 4], Vec::new()]),
                10 => b.patch = src.pick(&[vec![0], vec![1, 0], vec![u32::MAX]]),
                11 if !data.is_empty() => {
                    // Corrupted on the way, its page then resent alone (or
                    // a page it was not asked for, or short).
                    let i = src.below(data.len() as u64) as usize;
                    let page = (i / intact_proto::WIRE_PAGE) as u32;
                    let range = Block::page_range(data.len(), page);
                    let mut good = data[range].to_vec();
                    data[i] ^= 1;
                    let named = match src.below(4) {
                        0 => page.wrapping_add(1),
                        1 => {
                            good.pop();
                            page
                        }
                        _ => page,
                    };
                    patch = Some(Block {
                        file: b.file,
                        index: b.index,
                        source_level: 4,
                        digest: digest.clone(),
                        crcs: crcs.clone(),
                        patch: vec![named],
                        strong: Vec::new(),
                        data: good,
                    });
                }
                _ => digest.truncate(8),
            }
        }
        b.digest = digest;
        b.crcs = crcs;
        b.data = data;
        let dup = src.chance(5);
        out.push(Message::Block(b));
        if dup {
            out.push(out.last().expect("just pushed").clone());
        }
        if let Some(p) = patch {
            out.push(Message::Block(p));
        }
    }
    if src.chance(8) {
        return out; // never ended
    }
    let blocks = if src.chance(12) {
        src.pick(&[
            FileEnd::ABANDON,
            n.wrapping_add(1),
            n.saturating_sub(1),
            0,
            u64::MAX - 1,
        ])
    } else {
        n
    };
    let digest = if plan.backed && !src.chance(10) {
        file_digest(&plan.data)
    } else {
        src.pick(&[Vec::new(), vec![7; 32], vec![0; 64]])
    };
    out.push(Message::FileEnd {
        file: plan.id,
        blocks,
        source_level: if src.chance(10) { src.byte() } else { 4 },
        digest,
    });
    if src.chance(30) {
        out.push(Message::Waiting);
    }
    out
}

/// A message a client has no business sending after the handshake.
fn out_of_place(src: &mut Source, id: u64) -> Message {
    let fr = FileResult {
        file: id,
        status: FileStatus::Verified,
        level: 4,
        message: String::new(),
        resident: 0,
        evict_micros: 0,
        check_micros: 0,
        unchanged: false,
        reverified: 0,
        trusted: 0,
        trusted_level: 0,
        trusted_at: 0,
        split: 0,
        cache_repairs: 0,
        cache_micros: 0,
        source_repairs: 0,
        source_micros: 0,
        digest: Vec::new(),
    };
    match src.below(9) {
        0 if src.below(2) == 0 => Message::Join {
            payload: vec![0; src.below(intact_proto::MAX_JOIN as u64 + 1) as usize],
        },
        0 => Message::Hello {
            version: intact_proto::VERSION,
            keyed: false,
            nonce: [0; 32],
            session: [0; 16],
            suite: src.below(4) as u8,
            share: [0; 32],
        },
        1 => Message::Proof { mac: [0; 32] },
        2 => Message::Status {
            file: id,
            holding: Holding::Blocks(vec![(0, vec![0; 16])]),
            strong: false,
        },
        3 => Message::FileResult(fr),
        4 => Message::BlockResult {
            file: id,
            index: 0,
            ok: true,
            pages: Vec::new(),
        },
        5 => Message::Refused {
            reason: "no".into(),
        },
        6 => Message::DeleteReport {
            deleted: vec!["a".into()],
            kept: Vec::new(),
            errors: Vec::new(),
        },
        7 => Message::DeleteDone,
        _ => Message::Status {
            file: id,
            holding: Holding::Whole { digest: Vec::new() },
            strong: true,
        },
    }
}

/// A `--delete` exchange (possibly partial or out of order).
fn delete_messages(src: &mut Source) -> Vec<Message> {
    let bytes = |s: &str| s.as_bytes().to_vec();
    let base = src.pick(&["", "d", "m", ".intact", "../x", "d/e", ".intact-partial-x"]);
    let scopes = if src.chance(50) {
        Vec::new()
    } else {
        vec![bytes(src.pick(&["", "e", "a", ".intact", "l"]))]
    };
    let rules = if src.chance(30) {
        vec![(
            src.below(2) as u8,
            src.pick(&["*", "a", "**/x", "["]).to_string(),
        )]
    } else {
        Vec::new()
    };
    let mut out = vec![Message::DeleteStart {
        dry_run: src.chance(50),
        base: bytes(base),
        scopes,
        rules,
    }];
    if !src.chance(10) {
        out.push(Message::DeleteKeep {
            paths: vec![bytes("a"), bytes(src.pick(&["e/f", "x", "", "/abs"]))],
        });
    }
    if !src.chance(10) {
        out.push(Message::DeleteRun);
    }
    if src.chance(10) {
        let last = out.len() - 1;
        out.swap(0, last);
    }
    out
}

/// A whole sequence: what a client sends after its handshake.
pub fn generate(src: &mut Source, lim: &Limits) -> Vec<Message> {
    let files = 1 + src.below(4) as usize;
    let mut budget = lim.max_data;
    let mut plans: Vec<Plan> = Vec::new();
    let mut used = Vec::new();
    let mut next_id = src.pick(&[0u64, 1, u64::MAX - 3, 1 << 63]);
    for _ in 0..files {
        let id = if lim.reuse_ids && !plans.is_empty() && src.chance(10) {
            // An id still in use (or just ended).
            plans[src.below(plans.len() as u64) as usize].id
        } else {
            next_id = next_id.wrapping_add(1);
            next_id
        };
        plans.push(gen_entry(src, lim, id, &mut budget, &mut used));
    }
    let ids: Vec<u64> = plans.iter().map(|p| p.id).collect();
    let mut queues: Vec<std::collections::VecDeque<Message>> = plans
        .iter()
        .map(|p| file_messages(src, p, &ids).into())
        .collect();
    // Files overlap as a pipelining sender's do.
    let mut out = Vec::new();
    let interleave = src.chance(40);
    while queues.iter().any(|q| !q.is_empty()) {
        let live: Vec<usize> = (0..queues.len())
            .filter(|&i| !queues[i].is_empty())
            .collect();
        let q = if interleave {
            live[src.below(live.len() as u64) as usize]
        } else {
            live[0]
        };
        out.push(queues[q].pop_front().expect("live"));
        if src.chance(2) {
            out.push(Message::Waiting);
        }
    }
    if src.chance(6) {
        let at = src.below(out.len() as u64 + 1) as usize;
        let m = out_of_place(src, ids[0]);
        out.insert(at, m);
    }
    if src.chance(5) {
        let at = src.below(out.len() as u64 + 1) as usize;
        let del = delete_messages(src);
        out.splice(at..at, del);
    }
    if src.chance(3) && out.len() > 1 {
        // One message dropped, or two swapped.
        let i = src.below(out.len() as u64 - 1) as usize;
        if src.chance(50) {
            out.remove(i);
        } else {
            out.swap(i, i + 1);
        }
    }
    match src.below(20) {
        0..=15 => out.push(Message::Bye),
        16..=18 => {} // the client just goes away
        _ => {
            let at = src.below(out.len() as u64 + 1) as usize;
            out.insert(at, Message::Bye);
        }
    }
    out
}

//! What a receiving server allows one file, one stream and all its
//! sessions together, checked before anything is allocated or created.
//!
//! Every number an Entry carries comes from the network. The receiver
//! keeps per-block state for a file being received (about 70 bytes a
//! block: the digest it verified against) and holds about
//! [`DESCRIPTORS_PER_FILE`] descriptors per open file, so a file's block
//! count and the files open at once are bounded here, per file, per
//! stream (one TCP connection, one `receive`) and across the whole server,
//! before the receiver allocates that state or creates the partial file.
//! A file over a bound fails alone, with the bound named in its reason;
//! the session goes on.
//!
//! [`DESCRIPTORS_PER_FILE`]: crate::limits::DESCRIPTORS_PER_FILE

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use intact_proto::{Budget, Entry, Held, Party, MAX_BLOCK};

/// The smallest block a file larger than one block may be cut into (the
/// sender's own minimum, `--block-size 4KiB`).
pub const MIN_BLOCK_SIZE: u32 = 4 << 10;

/// What a receiving server allows. The defaults admit anything an honest
/// `intact send` does (at most [`MAX_FILES_IN_FLIGHT`] files in flight per
/// stream, blocks of 4 KiB to 16 MiB) while bounding what a hostile client
/// can make the server hold: per stream, about 140 MB of block state and
/// 4,096 descriptors; across the server, about 280 MB of block state and
/// the descriptors the process's open-file limit allows.
///
/// [`MAX_FILES_IN_FLIGHT`]: crate::net::MAX_FILES_IN_FLIGHT
#[derive(Clone, Debug)]
pub struct ReceiveLimits {
    /// Smallest block size of a file larger than one block
    /// (default [`MIN_BLOCK_SIZE`]). A block size above the protocol's
    /// largest block (16 MiB) is always refused.
    pub min_block_size: u32,
    /// Most blocks one file may have (default 2^20: 4 TiB at the default
    /// 4 MiB block, 16 TiB at 16 MiB); a larger file is refused with a
    /// hint to send it with a larger `--block-size`.
    pub max_blocks_per_file: u64,
    /// Most blocks of all the files one stream has open (default 2^21).
    pub max_blocks_per_stream: u64,
    /// Files one stream may have open (announced and not yet answered;
    /// default 1,024, the most an honest sender keeps in flight).
    pub max_files_per_stream: u64,
    /// Most bytes announced by the files one stream has open (default
    /// 64 TiB). Partial files are not pre-sized, so this is the disk one
    /// stream may claim, not what it holds.
    pub max_announced_bytes_per_stream: u64,
    /// Files open across every session of the server (default: what the
    /// process's open-file limit allows at 4 descriptors a file, from 64
    /// to 65,536).
    pub max_files: u64,
    /// Blocks of all the files open across every session (default 2^22).
    pub max_blocks: u64,
    /// How long an Entry may wait for a place in its session's share of
    /// the files and blocks before it is refused "server busy" (default
    /// 30 s; zero: refused at once). The places it waits for are mostly
    /// the session's own, held by files its streams are about to commit:
    /// a sender keeps more files in flight than a share of a busy server.
    pub admit_wait: std::time::Duration,
    /// What every session of one server holds now. Clones of one
    /// `ReceiveLimits` share it; a server's sessions all use its own.
    pub in_use: InUse,
}

impl Default for ReceiveLimits {
    fn default() -> Self {
        ReceiveLimits {
            min_block_size: MIN_BLOCK_SIZE,
            max_blocks_per_file: 1 << 20,
            max_blocks_per_stream: 1 << 21,
            max_files_per_stream: crate::net::MAX_FILES_IN_FLIGHT as u64,
            max_announced_bytes_per_stream: 64 << 40,
            max_files: crate::limits::files_within_descriptor_limit() as u64,
            max_blocks: 1 << 22,
            admit_wait: std::time::Duration::from_secs(30),
            in_use: InUse::default(),
        }
    }
}

/// Files, blocks and announced bytes held now, shared by the sessions of
/// one server (or counted for one stream).
#[derive(Clone, Debug, Default)]
pub struct InUse(Arc<Counters>);

#[derive(Debug, Default)]
struct Counters {
    files: AtomicU64,
    blocks: AtomicU64,
    bytes: AtomicU64,
}

impl InUse {
    /// Files held now.
    pub fn files(&self) -> u64 {
        self.0.files.load(Ordering::SeqCst)
    }

    /// Blocks held now.
    pub fn blocks(&self) -> u64 {
        self.0.blocks.load(Ordering::SeqCst)
    }

    /// Takes `want` if every counter stays within `max`; else says which
    /// does not (and takes nothing).
    fn take(&self, want: Amount, max: Amount) -> Result<Grant, Over> {
        let c = &self.0;
        let counters = [
            (&c.files, want.files, max.files, Over::Files),
            (&c.blocks, want.blocks, max.blocks, Over::Blocks),
            (&c.bytes, want.bytes, max.bytes, Over::Bytes),
        ];
        for (i, (counter, n, limit, over)) in counters.iter().enumerate() {
            let got = counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
                held.checked_add(*n).filter(|t| t <= limit)
            });
            if got.is_err() {
                for (counter, n, _, _) in &counters[..i] {
                    counter.fetch_sub(*n, Ordering::SeqCst);
                }
                return Err(*over);
            }
        }
        Ok(Grant {
            held: self.clone(),
            amount: want,
        })
    }
}

/// An amount of files, blocks and announced bytes.
#[derive(Debug, Clone, Copy)]
struct Amount {
    files: u64,
    blocks: u64,
    bytes: u64,
}

/// Which counter a file would take past its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    Files,
    Blocks,
    Bytes,
}

/// A share of a [`InUse`], given back when dropped.
#[derive(Debug)]
struct Grant {
    held: InUse,
    amount: Amount,
}

impl Drop for Grant {
    fn drop(&mut self) {
        let c = &self.held.0;
        c.files.fetch_sub(self.amount.files, Ordering::SeqCst);
        c.blocks.fetch_sub(self.amount.blocks, Ordering::SeqCst);
        c.bytes.fetch_sub(self.amount.bytes, Ordering::SeqCst);
    }
}

/// What one open file holds of its stream's, its session's and its
/// server's limits; given back when the file is answered (dropped).
#[derive(Debug)]
pub(crate) struct Slot {
    _stream: Grant,
    _server: Grant,
    _file: Held,
    _blocks: Held,
}

/// A session's places in its server's shared budgets (see
/// [`intact_proto::Budget`]): the files it has open, the per-block state
/// of those files, and the memory it holds for what its client sent.
/// Every session is guaranteed its share of each, whatever the others
/// hold; its streams share its places (clones).
#[derive(Clone, Debug)]
pub struct Shares {
    /// Files open across the session's streams.
    pub files: Party,
    /// Blocks of the files open across the session's streams.
    pub blocks: Party,
    /// Bytes held for what the client sent: frames its streams have read
    /// and not yet used, what their lists decode into, `--delete` keep
    /// lists (`None`: not budgeted, as in a test's own receiver).
    pub memory: Option<Party>,
}

/// A server's shared budgets, from which each session gets its [`Shares`].
#[derive(Clone, Debug)]
pub struct Budgets {
    files: Budget,
    blocks: Budget,
    memory: Budget,
}

impl Budgets {
    /// Budgets of `limits.max_files` open files, `limits.max_blocks`
    /// blocks and `memory` bytes for what clients send, for at most
    /// `sessions` sessions at once.
    pub fn new(limits: &ReceiveLimits, memory: u64, sessions: usize) -> Budgets {
        Budgets {
            files: Budget::new(limits.max_files, sessions),
            blocks: Budget::new(limits.max_blocks, sessions),
            memory: Budget::new(memory, sessions),
        }
    }

    /// A new session's places.
    pub fn session(&self) -> Shares {
        Shares {
            files: self.files.party(),
            blocks: self.blocks.party(),
            memory: Some(self.memory.party()),
        }
    }
}

impl Shares {
    /// Places for a stream that belongs to no server session: the whole
    /// file and block budgets of `limits` to itself, memory not budgeted.
    pub fn alone(limits: &ReceiveLimits) -> Shares {
        Shares {
            files: Budget::new(limits.max_files, 1).party(),
            blocks: Budget::new(limits.max_blocks, 1).party(),
            memory: None,
        }
    }
}

/// Why a file was refused a slot: the stream's limit (the receiver may
/// free some by committing its ready files) or the server's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The stream's own limit: committing its ready files may help.
    Stream(String),
    /// The whole server's limit (other sessions hold it).
    Server(String),
}

impl Refusal {
    pub fn reason(&self) -> &str {
        match self {
            Refusal::Stream(s) | Refusal::Server(s) => s,
        }
    }
}

/// The blocks of a file `e` announces, if its block size and block count
/// are within `limits`; else why not.
pub(crate) fn blocks_of(e: &Entry, limits: &ReceiveLimits) -> Result<u64, String> {
    let bs = u64::from(e.block_size);
    if bs == 0 {
        return Err("block size 0".into());
    }
    if bs > MAX_BLOCK as u64 {
        return Err(format!(
            "block size {bs} is larger than the largest block the protocol carries ({MAX_BLOCK} bytes)"
        ));
    }
    if e.block_size < limits.min_block_size && e.size > bs {
        return Err(format!(
            "block size {bs} is below this server's minimum of {} bytes for a file of more than one block",
            limits.min_block_size
        ));
    }
    let blocks = e.size.div_ceil(bs);
    if blocks > limits.max_blocks_per_file {
        return Err(format!(
            "{} bytes in blocks of {bs} is {blocks} blocks, more than this server's {} blocks per file; send it with a larger --block-size",
            e.size, limits.max_blocks_per_file
        ));
    }
    Ok(blocks)
}

/// The blocks and bytes `e` holds while it is received, of the `blocks`
/// of its file: one range's, or the whole file's.
pub(crate) fn range_share(e: &Entry, blocks: u64) -> (u64, u64) {
    match e.range {
        Some(r) if r.first < r.end && r.end <= blocks => (
            r.end - r.first,
            crate::source::range_bytes(e.size, u64::from(e.block_size), r.first, r.end),
        ),
        _ => (blocks, e.size),
    }
}

/// A slot for a file of `blocks` blocks and `size` bytes on a stream
/// holding `stream` of a session with `session`'s places, within the
/// stream's, the session's and the server's limits.
pub(crate) fn take_slot(
    limits: &ReceiveLimits,
    stream: &InUse,
    session: &Shares,
    blocks: u64,
    size: u64,
) -> Result<Slot, Refusal> {
    let want = Amount {
        files: 1,
        blocks,
        bytes: size,
    };
    let per_stream = Amount {
        files: limits.max_files_per_stream,
        blocks: limits.max_blocks_per_stream,
        bytes: limits.max_announced_bytes_per_stream,
    };
    let s = stream.take(want, per_stream).map_err(|over| {
        Refusal::Stream(match over {
            Over::Files => format!(
                "this connection already has {} files open, the server's limit per connection",
                limits.max_files_per_stream
            ),
            Over::Blocks => format!(
                "the files open on this connection would hold more than the server's {} blocks per connection",
                limits.max_blocks_per_stream
            ),
            Over::Bytes => format!(
                "the files open on this connection would announce more than the server's {} bytes per connection",
                limits.max_announced_bytes_per_stream
            ),
        })
    })?;
    let total = Amount {
        files: limits.max_files,
        blocks: limits.max_blocks,
        bytes: u64::MAX,
    };
    let t = limits.in_use.take(want, total).map_err(|over| {
        Refusal::Server(match over {
            Over::Files => format!(
                "server busy: {} files are open across all its sessions, its limit; try again later",
                limits.max_files
            ),
            _ => format!(
                "server busy: the files open across all its sessions hold {} blocks, its limit; try again later",
                limits.max_blocks
            ),
        })
    })?;
    let f = session.files.try_take(1).map_err(|r| {
        Refusal::Server(format!(
            "server busy: this session has {} files open and the other sessions the rest of the server's {} (each session is guaranteed {}); try again later",
            r.holds, r.total, r.share
        ))
    })?;
    let b = session.blocks.try_take(blocks).map_err(|r| {
        Refusal::Server(format!(
            "server busy: this session's open files hold {} blocks and the other sessions the rest of the server's {} (each session is guaranteed {}); try again later",
            r.holds, r.total, r.share
        ))
    })?;
    Ok(Slot {
        _stream: s,
        _server: t,
        _file: f,
        _blocks: b,
    })
}

/// The mode a received file or directory gets: its permission bits, and
/// its setuid, setgid and sticky bits only when the server keeps them.
pub(crate) fn incoming_mode(mode: u32, keep_special_bits: bool) -> u32 {
    if keep_special_bits {
        mode & 0o7777
    } else {
        mode & 0o777
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use intact_proto::{EntryKind, WirePath};

    fn entry(size: u64, block_size: u32) -> Entry {
        Entry {
            file: 1,
            path: WirePath::parse(b"f").unwrap(),
            kind: EntryKind::File,
            mode: 0o644,
            mtime_sec: 0,
            mtime_nsec: 0,
            size,
            block_size,
            algorithm: 0,
            verify: 0,
            flags: 0,
            origin: Vec::new(),
            range: None,
        }
    }

    #[test]
    fn block_size_and_count_are_bounded_before_anything_is_allocated() {
        let l = ReceiveLimits::default();
        assert!(blocks_of(&entry(1 << 40, 1), &l)
            .unwrap_err()
            .contains("minimum"));
        assert!(blocks_of(&entry(32 << 20, 1), &l).is_err());
        assert_eq!(blocks_of(&entry(1, 1), &l), Ok(1), "one small block");
        assert_eq!(blocks_of(&entry(0, 1), &l), Ok(0));
        assert!(blocks_of(&entry(1 << 40, 4096), &l)
            .unwrap_err()
            .contains("--block-size"));
        assert!(blocks_of(&entry(10, 0), &l).is_err());
        assert!(blocks_of(&entry(u64::MAX, u32::MAX), &l).is_err());
        assert_eq!(blocks_of(&entry(u64::MAX, 16 << 20), &l).ok(), None);
        assert_eq!(blocks_of(&entry(4 << 40, 4 << 20), &l), Ok(1 << 20));
    }

    #[test]
    fn slots_are_given_back_and_limits_hold_across_streams() {
        let l = ReceiveLimits {
            max_files_per_stream: 2,
            max_files: 3,
            max_blocks_per_stream: 100,
            ..ReceiveLimits::default()
        };
        let (a, b) = (InUse::default(), InUse::default());
        let p = Shares::alone(&l);
        let a1 = take_slot(&l, &a, &p, 10, 10).unwrap();
        let a2 = take_slot(&l, &a, &p, 10, 10).unwrap();
        assert!(matches!(
            take_slot(&l, &a, &p, 1, 1),
            Err(Refusal::Stream(_))
        ));
        let b1 = take_slot(&l, &b, &p, 10, 10).unwrap();
        let full = take_slot(&l, &b, &p, 1, 1).unwrap_err();
        assert!(matches!(full, Refusal::Server(_)), "{full:?}");
        assert_eq!((l.in_use.files(), b.files()), (3, 1), "nothing leaked");
        drop(a1);
        let b2 = take_slot(&l, &b, &p, 10, 10).unwrap();
        assert!(matches!(
            take_slot(&l, &InUse::default(), &p, 200, 1),
            Err(Refusal::Stream(_))
        ));
        drop((a2, b1, b2));
        assert_eq!((l.in_use.files(), l.in_use.blocks(), a.files()), (0, 0, 0));
    }

    #[test]
    fn one_session_cannot_take_the_blocks_every_other_session_is_guaranteed() {
        let l = ReceiveLimits {
            max_blocks: 1000,
            max_blocks_per_stream: 1000,
            ..ReceiveLimits::default()
        };
        // 4 sessions at most: 125 blocks guaranteed to each.
        let budgets = Budgets::new(&l, 0, 4);
        let (hog, other) = (budgets.session(), budgets.session());
        let streams: Vec<InUse> = (0..4).map(|_| InUse::default()).collect();
        // The hog's streams announce files of 100 blocks until refused.
        let mut held = Vec::new();
        for s in streams.iter().cycle().take(40) {
            match take_slot(&l, s, &hog, 100, 1) {
                Ok(slot) => held.push(slot),
                Err(r) => {
                    assert!(r.reason().contains("guaranteed 125"), "{r:?}");
                    break;
                }
            }
        }
        assert_eq!(held.len(), 6, "half the budget and its own share, no more");
        // Another session still gets its whole share, then no more.
        let mine = InUse::default();
        let ok = take_slot(&l, &mine, &other, 125, 1).unwrap();
        assert!(take_slot(&l, &mine, &other, 101, 1).is_err());
        drop((held, ok));
        assert_eq!(l.in_use.blocks(), 0, "nothing leaked");
    }

    #[test]
    fn one_session_cannot_take_the_open_files_every_other_session_is_guaranteed() {
        // 64 files, 4 sessions at most: 8 guaranteed to each.
        let l = ReceiveLimits {
            max_files: 64,
            ..ReceiveLimits::default()
        };
        let budgets = Budgets::new(&l, 0, 4);
        let (hog, other) = (budgets.session(), budgets.session());
        let streams: Vec<InUse> = (0..4).map(|_| InUse::default()).collect();
        let mut held = Vec::new();
        for s in streams.iter().cycle().take(64) {
            match take_slot(&l, s, &hog, 1, 1) {
                Ok(slot) => held.push(slot),
                Err(r) => {
                    assert!(r.reason().contains("guaranteed 8"), "{r:?}");
                    break;
                }
            }
        }
        assert_eq!(held.len(), 40, "half the files and its own share, no more");
        let mine = InUse::default();
        let ok: Vec<Slot> = (0..8)
            .map(|_| take_slot(&l, &mine, &other, 1, 1).unwrap())
            .collect();
        drop((held, ok));
        assert_eq!(l.in_use.files(), 0, "nothing leaked");
    }

    #[test]
    fn special_bits_are_stripped_unless_kept() {
        assert_eq!(incoming_mode(0o104755, false), 0o755);
        assert_eq!(incoming_mode(0o7777, false), 0o777);
        assert_eq!(incoming_mode(0o6755, true), 0o6755);
        assert_eq!(incoming_mode(0o170777, true), 0o777);
    }
}

//! The server's record of each split file being received: the one locked
//! partial file every range writes through, the live claims, and the
//! confirmed ranges this server knows to be true (`known`); and, between
//! two records of the same file (no range was being received for a
//! while), what the last one knew and the partial file's stamp then, so
//! that the next one need not read the confirmed ranges back if nobody
//! touched the file meanwhile.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::dest::PartialFile;
use crate::journal::RangeRecord;

/// Most files whose last record's knowledge is kept (past it, it is
/// forgotten, and those files' confirmed ranges are read back when they
/// are next opened).
const MAX_QUIET: usize = 65_536;

/// The split files being received, per destination root and path (shared
/// by the clones of one server's receive options).
#[derive(Clone, Default)]
pub struct Splits(Arc<Mutex<HashMap<SplitKey, Slot>>>);

/// (root device, root inode, path).
pub(super) type SplitKey = (u64, u64, Vec<u8>);

#[derive(Default)]
struct Slot {
    live: Weak<SplitFile>,
    quiet: Option<Quiet>,
}

/// What the last record of a file knew when its last claim dropped: a
/// digest of its known ranges (32 bytes, whatever their number: a next
/// record compares it with the journal's, which it reads anyway).
pub(super) struct Quiet {
    pub row: i64,
    pub stamp: FileStamp,
    pub known: [u8; 32],
}

/// The digest of a set of known ranges.
pub(super) fn digest_of(known: &Known) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    for (first, (end, cvs)) in known {
        h.update(&first.to_be_bytes());
        h.update(&end.to_be_bytes());
        h.update(cvs);
    }
    *h.finalize().as_bytes()
}

/// Confirmed ranges this server verified or read back: first block →
/// (end, BLAKE3 of their chaining values).
pub(super) type Known = BTreeMap<u64, (u64, [u8; 32])>;

/// The known entry of a confirmed range.
pub(super) fn known_of(r: &RangeRecord) -> (u64, (u64, [u8; 32])) {
    (r.first, (r.end, *blake3::hash(&r.cvs).as_bytes()))
}

/// One version of a partial file: any write, truncation, or a file made
/// anew (even on the same inode) gives another, where the file system
/// keeps a change time it tells truly. None where it cannot be relied on:
/// a network or FUSE file system (attributes may be cached), or a change
/// time too recent to be told from the next write's on a file system
/// with coarse times (ext4 with 128-byte inodes keeps seconds, FAT two;
/// git's "racily clean" rule): such a file's confirmed ranges are read
/// back. Writes through a shared mapping of a page already dirty change no
/// time at all: nothing but a read can see them.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct FileStamp {
    dev: u64,
    ino: u64,
    size: i64,
    ctime: (i64, i64),
}

/// How old a change time must be to be told from a later write's.
const SETTLED: std::time::Duration = std::time::Duration::from_secs(3);

/// File systems whose attributes may be cached (NFS, CIFS, SMB2, FUSE).
const UNTOLD: [i64; 4] = [0x6969, 0xFF53_4D42, 0xFE53_4D42, 0x6573_5546];

impl FileStamp {
    /// The stamp of `p` now, if it can be relied on (see [`FileStamp`]).
    pub fn of(p: &PartialFile) -> Option<FileStamp> {
        let fs = rustix::fs::fstatfs(p.file()).ok()?;
        #[allow(clippy::unnecessary_cast)]
        if UNTOLD.contains(&(fs.f_type as i64)) {
            return None;
        }
        let st = rustix::fs::fstat(p.file()).ok()?;
        let ctime = std::time::UNIX_EPOCH
            + std::time::Duration::new(st.st_ctime.max(0) as u64, st.st_ctime_nsec as u32);
        if ctime + SETTLED > std::time::SystemTime::now() {
            return None;
        }
        Some(FileStamp {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size,
            ctime: (st.st_ctime, st.st_ctime_nsec as i64),
        })
    }
}

/// One split file being received.
pub(super) struct SplitFile {
    pub id: [u8; 16],
    pub size: u64,
    pub mtime: (i64, u32),
    pub block: u32,
    inner: Mutex<Inner>,
    registry: Splits,
    key: SplitKey,
}

#[derive(Default)]
pub(super) struct Inner {
    /// Set by the first session to join: the locked partial file, its
    /// journal row, its (device, inode); or why it could not be.
    pub open: Option<Result<Open, String>>,
    /// Live claims: first block → end.
    pub claims: BTreeMap<u64, u64>,
    /// The confirmed ranges this server knows to be true of the partial
    /// file; a commit needs the journal's to be exactly these.
    pub known: Known,
    pub committing: bool,
    pub committed: bool,
    /// What the last record of the file knew (taken by the first session
    /// to open the file, whichever session made this record).
    pub quiet: Option<Quiet>,
}

pub(super) struct Open {
    pub template: PartialFile,
    pub row: i64,
    pub file_id: (u64, u64),
}

impl Splits {
    /// The record of `key`, joined or made (with `make`, holding what the
    /// last record of it knew).
    pub(super) fn join(
        &self,
        key: SplitKey,
        make: impl FnOnce() -> ([u8; 16], u64, (i64, u32), u32),
    ) -> Arc<SplitFile> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = map.get(&key).and_then(|s| s.live.upgrade()) {
            return f;
        }
        if map.len() > MAX_QUIET {
            // One quiet file forgotten (its ranges are read back when it
            // is next opened), not all of them.
            let idle = map
                .iter()
                .find(|(k, s)| s.live.strong_count() == 0 && **k != key)
                .map(|(k, _)| k.clone());
            if let Some(k) = idle {
                map.remove(&k);
            }
        }
        let (id, size, mtime, block) = make();
        let slot = map.entry(key.clone()).or_default();
        let f = Arc::new(SplitFile {
            id,
            size,
            mtime,
            block,
            inner: Mutex::new(Inner {
                quiet: slot.quiet.take(),
                ..Inner::default()
            }),
            registry: self.clone(),
            key,
        });
        slot.live = Arc::downgrade(&f);
        f
    }
}

impl SplitFile {
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every change under it is a plain field update: a panic leaves
        // it consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for SplitFile {
    /// The last claim is gone: what this record knew is kept for the next
    /// one, with the partial file's stamp now (while it is still locked);
    /// nothing is kept of a file committed or that could not be opened.
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        let quiet = match (&inner.open, inner.committed || inner.committing) {
            (Some(Ok(open)), false) => FileStamp::of(&open.template).map(|stamp| Quiet {
                row: open.row,
                stamp,
                known: digest_of(&inner.known),
            }),
            _ => None,
        };
        let mut map = self.registry.0.lock().unwrap_or_else(|p| p.into_inner());
        // Only into this record's own slot: a newer record made meanwhile
        // has its own knowledge.
        let ours = map
            .get(&self.key)
            .is_some_and(|s| std::ptr::eq(s.live.as_ptr(), self));
        if !ours {
            return;
        }
        match quiet {
            Some(q) => {
                if let Some(slot) = map.get_mut(&self.key) {
                    slot.quiet = Some(q);
                }
            }
            None => {
                map.remove(&self.key);
            }
        }
    }
}

/// A session's claim on blocks `first..end` of a split file; dropped (the
/// session's file ended, failed, or its connection went), the blocks are
/// free to be claimed again.
pub(super) struct Claim {
    pub file: Arc<SplitFile>,
    pub first: u64,
    /// Still in the file's claims (a confirmed range's claim is released
    /// inside the critical section that confirms it).
    pub live: bool,
}

impl Claim {
    pub fn release(&mut self, inner: &mut Inner) {
        if std::mem::take(&mut self.live) {
            inner.claims.remove(&self.first);
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if self.live {
            let file = Arc::clone(&self.file);
            self.release(&mut file.lock());
        }
    }
}

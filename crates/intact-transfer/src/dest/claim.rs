//! Claims: the paths of a destination that a transfer in this process is
//! receiving, one transfer per path at a time.
//!
//! A named partial file is also locked (`flock`, see `partial_open.rs`),
//! which excludes transfers of other processes; an unnamed file (see
//! `unnamed.rs`) has no name to lock. The claim is what excludes two
//! transfers of one path inside a server, whatever kind of partial file
//! each writes, and it is held longer than the lock: from the partial
//! file's opening until the file's journal row is written after its
//! commit (the caller keeps it, [`super::PartialFile::claim`]), so that
//! two sessions' renames and rows of one path never interleave (the row
//! could then name one session's digest for the other's bytes). A second
//! transfer of a claimed path waits up to [`super::partial_open`]'s bound,
//! as for the lock, then fails that file with the same opening words
//! ("being received by another session").
//!
//! Claims are keyed by the device and inode of the directory the file
//! goes in and its name there, in one table for the whole process: two
//! destinations whose roots overlap (a keyring client confined to a
//! subtree, another client writing into that subtree from the root) name
//! one directory entry by one key.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use intact_proto::WirePath;

use super::dest_err;
use crate::TransferError;

/// Directory device, directory inode, name in the directory.
type Key = (u64, u64, Box<[u8]>);

/// Why a file is refused while another transfer in this process holds its
/// path (opening as a partial file's lock's does, `partial_open.rs`).
pub(super) const CLAIMED: &str =
    "being received by another session (this process is receiving that path); try again when that transfer ends";

fn table() -> MutexGuard<'static, HashSet<Key>> {
    static HELD: OnceLock<Mutex<HashSet<Key>>> = OnceLock::new();
    // A panic while holding it leaves the set consistent (an insert or a
    // remove either happened or not).
    HELD.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// One path held by one transfer; released when the last handle drops
/// (the ranges of a split file share one).
#[derive(Debug)]
pub struct Claim {
    key: Key,
}

impl Drop for Claim {
    fn drop(&mut self) {
        table().remove(&self.key);
    }
}

/// Claims the entry `name` of the directory `dir` (the file `path`),
/// waiting up to `wait` for a transfer that holds it (polled, as the lock
/// is).
pub(super) fn claim_within(
    dir: &OwnedFd,
    name: &OsStr,
    path: &WirePath,
    wait: Duration,
) -> Result<Arc<Claim>, TransferError> {
    let st = rustix::fs::fstat(dir).map_err(|e| dest_err(path, e))?;
    claim_key_within((st.st_dev, st.st_ino), name, path, wait)
}

/// [`claim_within`] for the directory of device and inode `dir`.
fn claim_key_within(
    dir: (u64, u64),
    name: &OsStr,
    path: &WirePath,
    wait: Duration,
) -> Result<Arc<Claim>, TransferError> {
    let key: Key = (dir.0, dir.1, name.as_bytes().into());
    let deadline = Instant::now() + wait;
    loop {
        if table().insert(key.clone()) {
            return Ok(Arc::new(Claim { key }));
        }
        if Instant::now() >= deadline {
            return Err(dest_err(
                path,
                io::Error::new(io::ErrorKind::WouldBlock, CLAIMED),
            ));
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(p: &str) -> WirePath {
        WirePath::parse(p.as_bytes()).unwrap()
    }

    /// Claims `p` in the directory `dir` (ids no real directory has, so
    /// other tests' claims never meet these).
    fn claim(dir: (u64, u64), p: &str, wait: Duration) -> Result<Arc<Claim>, TransferError> {
        claim_key_within(dir, OsStr::new(p), &wire(p), wait)
    }

    #[test]
    fn a_claimed_entry_is_refused_until_every_handle_is_gone() {
        let root = (u64::MAX, 7);
        let a = claim(root, "a", Duration::ZERO).unwrap();
        let shared = Arc::clone(&a);
        let t = Instant::now();
        let err = claim(root, "a", Duration::from_millis(60)).unwrap_err();
        assert!(t.elapsed() >= Duration::from_millis(60), "it waited");
        assert!(err.to_string().contains(CLAIMED), "{err}");
        // Another name, and the same name in another directory, are free.
        let b = claim(root, "b", Duration::ZERO).unwrap();
        let other_root = claim((u64::MAX, 8), "a", Duration::ZERO).unwrap();
        drop(a);
        assert!(
            claim(root, "a", Duration::ZERO).is_err(),
            "a shared handle still holds it"
        );
        drop(shared);
        let again = claim(root, "a", Duration::ZERO).unwrap();
        drop((again, b, other_root));
    }

    #[test]
    fn a_waiting_transfer_gets_the_path_when_the_holder_lets_go() {
        let root = (u64::MAX, 9);
        let a = claim(root, "x", Duration::ZERO).unwrap();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(a);
        });
        let b = claim(root, "x", Duration::from_secs(5));
        t.join().unwrap();
        assert!(b.is_ok());
    }
}

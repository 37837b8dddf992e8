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
//! as for the lock, then fails that file with the same message.
//!
//! Claims are keyed by the destination root's device and inode and the
//! path under it, in one table for the whole process: every session's
//! `Destination` of one root shares it.

use std::collections::HashSet;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use intact_proto::WirePath;

use super::dest_err;
use super::partial_open::BUSY;
use crate::TransferError;

/// Root device, root inode, path under the root.
type Key = (u64, u64, Box<[u8]>);

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

/// Claims `path` under the root `root` (device, inode), waiting up to
/// `wait` for a transfer that holds it (polled, as the lock is).
pub(super) fn claim_within(
    root: (u64, u64),
    path: &WirePath,
    wait: Duration,
) -> Result<Arc<Claim>, TransferError> {
    let key: Key = (root.0, root.1, path.as_bytes().into());
    let deadline = Instant::now() + wait;
    loop {
        if table().insert(key.clone()) {
            return Ok(Arc::new(Claim { key }));
        }
        if Instant::now() >= deadline {
            return Err(dest_err(
                path,
                io::Error::new(io::ErrorKind::WouldBlock, BUSY),
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

    #[test]
    fn a_claimed_path_is_refused_until_every_handle_is_gone() {
        // A root id no real destination has, so other tests' claims never
        // meet these.
        let root = (u64::MAX, 7);
        let a = claim_within(root, &wire("d/a"), Duration::ZERO).unwrap();
        let shared = Arc::clone(&a);
        let t = Instant::now();
        let err = claim_within(root, &wire("d/a"), Duration::from_millis(60)).unwrap_err();
        assert!(t.elapsed() >= Duration::from_millis(60), "it waited");
        assert!(err.to_string().contains(BUSY), "{err}");
        // Another path, and the same path under another root, are free.
        let b = claim_within(root, &wire("d/b"), Duration::ZERO).unwrap();
        let other_root = claim_within((u64::MAX, 8), &wire("d/a"), Duration::ZERO).unwrap();
        drop(a);
        assert!(
            claim_within(root, &wire("d/a"), Duration::ZERO).is_err(),
            "a shared handle still holds it"
        );
        drop(shared);
        let again = claim_within(root, &wire("d/a"), Duration::ZERO).unwrap();
        drop((again, b, other_root));
    }

    #[test]
    fn a_waiting_transfer_gets_the_path_when_the_holder_lets_go() {
        let root = (u64::MAX, 9);
        let a = claim_within(root, &wire("x"), Duration::ZERO).unwrap();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(a);
        });
        let b = claim_within(root, &wire("x"), Duration::from_secs(5));
        t.join().unwrap();
        assert!(b.is_ok());
    }
}

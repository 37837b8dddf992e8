//! The directory of the last partial file opened, kept for the next one
//! in the same directory.
//!
//! Many small files arrive directory by directory. A partial file is
//! created, and later renamed to its final name, through its directory's
//! descriptor, which it holds until its commit; the next file of the same
//! directory shares that descriptor instead of opening the directory
//! again (one `openat2`, one `close` and, at a batch's commit, one `fstat`
//! fewer per file). A descriptor is shared for at most [`REUSE_FOR`] after
//! it was opened: a directory moved meanwhile takes the files that arrive
//! within that time with it, as it takes every file in flight already.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use intact_proto::WirePath;

/// The directories of `path` below the root, joined by `/`: the key of
/// the directory that holds it.
pub(super) fn key(path: &WirePath) -> Vec<u8> {
    let b = path.as_bytes();
    b[..b.iter().rposition(|&c| c == b'/').unwrap_or(0)].to_vec()
}

/// How long after its opening a directory's descriptor serves new files.
pub(super) const REUSE_FOR: Duration = Duration::from_secs(1);

/// The last directory opened for a partial file.
#[derive(Default)]
pub(super) struct LastParent(Mutex<Option<Kept>>);

/// A directory's path below the root (components joined by `/`), its
/// descriptor, and when it was opened.
type Kept = (Vec<u8>, Arc<OwnedFd>, Instant);

impl LastParent {
    /// The descriptor of the directory `key`, if it is the last one and
    /// young enough.
    pub(super) fn get(&self, key: &[u8]) -> Option<Arc<OwnedFd>> {
        let last = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match &*last {
            Some((k, fd, at)) if k == key && at.elapsed() < REUSE_FOR => Some(Arc::clone(fd)),
            _ => None,
        }
    }

    /// Keeps `fd`, just opened, as the directory `key`.
    pub(super) fn put(&self, key: Vec<u8>, fd: &Arc<OwnedFd>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((key, Arc::clone(fd), Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> Arc<OwnedFd> {
        Arc::new(OwnedFd::from(std::fs::File::open("/").unwrap()))
    }

    #[test]
    fn serves_only_the_same_directory_and_only_while_young() {
        let last = LastParent::default();
        assert!(last.get(b"a").is_none());
        let a = dir();
        last.put(b"a".to_vec(), &a);
        let got = last.get(b"a").expect("the same directory, just opened");
        assert!(Arc::ptr_eq(&got, &a));
        assert!(last.get(b"a/b").is_none());
        assert!(last.get(b"").is_none());
        // Aged past REUSE_FOR: opened again.
        *last.0.lock().unwrap() = Some((b"a".to_vec(), a, Instant::now() - REUSE_FOR));
        assert!(last.get(b"a").is_none());
    }
}

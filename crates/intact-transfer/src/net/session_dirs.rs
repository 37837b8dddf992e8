//! Which directories each session of a server created, shared by the
//! session's streams: `intact send` creates a file's parent directories on
//! whichever stream carries the file, and sends the directories' own
//! entries (mode and time) last, on one stream. A stream finishes only
//! the directories its session created.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use intact_proto::SessionId;

use crate::dest::CreatedDirs;

/// The directories created by each session running on a server. Clones
/// share it; a session's record lives while any of its streams does.
#[derive(Clone, Debug, Default)]
pub struct SessionDirs(Arc<Mutex<HashMap<SessionId, Weak<CreatedDirs>>>>);

impl SessionDirs {
    /// The record of `session` (joined with its other streams'), or, for a
    /// stream whose session is not known, a record of its own.
    pub(crate) fn join(&self, session: Option<SessionId>) -> Arc<CreatedDirs> {
        let Some(id) = session else {
            return Arc::new(CreatedDirs::default());
        };
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(dirs) = map.get(&id).and_then(Weak::upgrade) {
            return dirs;
        }
        // Sessions whose streams have all ended are forgotten here, so the
        // map holds at most the sessions running now (and one more).
        map.retain(|_, w| w.strong_count() > 0);
        let dirs = Arc::new(CreatedDirs::default());
        map.insert(id, Arc::downgrade(&dirs));
        dirs
    }

    /// Sessions with a record now.
    #[cfg(test)]
    fn len(&self) -> usize {
        let map = self.0.lock().unwrap();
        map.values().filter(|w| w.strong_count() > 0).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_of_one_session_share_a_record_and_others_do_not() {
        let reg = SessionDirs::default();
        let (a, b) = (SessionId([1; 16]), SessionId([2; 16]));
        let a1 = reg.join(Some(a));
        let a2 = reg.join(Some(a));
        assert!(Arc::ptr_eq(&a1, &a2));
        let b1 = reg.join(Some(b));
        assert!(!Arc::ptr_eq(&a1, &b1));
        let lone = reg.join(None);
        assert!(!Arc::ptr_eq(&lone, &a1) && !Arc::ptr_eq(&lone, &b1));
        drop((a1, a2));
        assert_eq!(reg.len(), 1, "a session's record ends with its streams");
        let a3 = reg.join(Some(a));
        assert!(!Arc::ptr_eq(&a3, &b1));
    }
}

//! The receiver's fault hooks (tests and the fault lab), as seen by the
//! receiver: present only in a build with the `fault-hooks` feature; in
//! any other (the `intact` binary) each is `None`/`false`, a constant the
//! compiler folds away.

use super::ReceiveOptions;
use crate::hooks::{CommitHook, LinkFault, WriteHook};

impl ReceiveOptions {
    /// Called after each block is written.
    pub(super) fn after_write(&self) -> Option<&WriteHook> {
        #[cfg(feature = "fault-hooks")]
        return self.after_write.as_ref();
        #[cfg(not(feature = "fault-hooks"))]
        None
    }

    /// Called on a block's bytes after their check, before their write.
    pub(super) fn after_check(&self) -> Option<&LinkFault> {
        #[cfg(feature = "fault-hooks")]
        return self.after_check.as_ref();
        #[cfg(not(feature = "fault-hooks"))]
        None
    }

    /// Called after a group's files took their final names, before their
    /// journal rows are written.
    pub(super) fn before_journal(&self) -> Option<&CommitHook> {
        #[cfg(feature = "fault-hooks")]
        return self.before_journal.as_ref();
        #[cfg(not(feature = "fault-hooks"))]
        None
    }

    /// The benchmark's control: no page CRCs computed or recorded.
    pub(super) fn without_page_crcs(&self) -> bool {
        #[cfg(feature = "fault-hooks")]
        return self.without_page_crcs;
        #[cfg(not(feature = "fault-hooks"))]
        false
    }

    /// The fault lab's broken riva (re-reads through the page cache).
    pub(super) fn reread_through_cache(&self) -> bool {
        #[cfg(feature = "fault-hooks")]
        return self.reread_through_cache;
        #[cfg(not(feature = "fault-hooks"))]
        false
    }
}

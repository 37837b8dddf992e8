//! What a session admits of an Entry before anything is allocated or
//! created for it: a file id that is free, a file within the server's
//! bounds (see [`crate::net::bounds`]), and a directory the session may
//! finish.

use intact_proto::Entry;
use intact_proto::{EntryKind, Message};

use super::{failed, verified_because, Session, MAX_PENDING_DIR_BYTES};
use crate::dest::Mtime;
use crate::net::bounds::{self, Refusal, Slot};
use crate::TransferError;

impl Session<'_> {
    /// Whether file id `id` still belongs to a file not yet answered (or
    /// to blocks still at the verifier): an Entry may not reuse it.
    pub(super) fn in_use(&self, id: u64) -> bool {
        self.files.contains_key(&id)
            || self.at_verifier.contains_key(&id)
            || self.ready.iter().any(|(r, _)| *r == id)
    }

    /// A slot for the file `e` announces (None for a directory or a
    /// symlink), or why the file is refused. At the stream's or the
    /// server's limit, the files this stream has ready are committed
    /// first (which frees their slots) and the slot asked for again.
    pub(super) fn admit(
        &mut self,
        e: &Entry,
    ) -> Result<Result<Option<Slot>, String>, TransferError> {
        if e.kind != EntryKind::File {
            return Ok(Ok(None));
        }
        let limits = &self.opts.limits;
        let blocks = match bounds::blocks_of(e, limits) {
            Ok(n) => n,
            Err(why) => return Ok(Err(why)),
        };
        match bounds::take_slot(limits, &self.in_use, &self.shares, blocks, e.size) {
            Ok(slot) => return Ok(Ok(Some(slot))),
            Err(_) if !self.ready.is_empty() => {}
            Err(refused) => return Ok(Err(refused.reason().to_string())),
        }
        self.commit()?;
        let limits = &self.opts.limits;
        Ok(
            bounds::take_slot(limits, &self.in_use, &self.shares, blocks, e.size)
                .map(Some)
                .map_err(|r: Refusal| r.reason().to_string()),
        )
    }

    /// Charges a directory kept for the session's end (`len` bytes of
    /// path) to the client's memory share; false when the share is spent
    /// (the directory is then finished at once).
    fn hold_dir(&mut self, len: usize) -> bool {
        let Some(memory) = &self.shares.memory else {
            return true;
        };
        memory
            .try_add(
                &mut self.dir_held,
                len as u64 + intact_proto::LIST_ITEM_COST,
            )
            .is_ok()
    }

    /// A directory entry: made if missing. Its mode and time are set at
    /// the session's end, and only if this session created it (an
    /// existing directory keeps its own); past [`MAX_PENDING_DIR_BYTES`]
    /// of paths kept, a created directory is finished at once.
    pub(super) fn dir(&mut self, e: Entry) -> Message {
        let id = e.file;
        if let Err(err) = self.dest.make_dir(&e.path) {
            return failed(id, &err.to_string());
        }
        if !self.dest.is_created_dir(&e.path, &self.created) {
            return verified_because(
                id,
                0,
                "the directory was already there: its mode and time are left as they are",
            );
        }
        let mtime = Mtime {
            sec: e.mtime_sec,
            nsec: e.mtime_nsec,
        };
        let len = e.path.as_bytes().len();
        if self.dir_bytes + len > MAX_PENDING_DIR_BYTES || !self.hold_dir(len) {
            return match self
                .dest
                .finish_created_dir(&e.path, e.mode, mtime, &self.created)
            {
                Ok(_) => verified_because(id, 0, ""),
                Err(err) => failed(id, &err.to_string()),
            };
        }
        self.dir_bytes += len;
        self.dirs.push((e.path, e.mode, mtime));
        verified_because(id, 0, "")
    }
}

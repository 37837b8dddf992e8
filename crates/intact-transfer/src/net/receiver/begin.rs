//! An Entry's answer: a symlink made, a directory left to the session, a
//! file held whole answered from its record (the quick check), or a file
//! whose blocks must come, with what an earlier run left of it.

use std::collections::HashMap;
use std::fs::File;

use intact_digest::{defaults, AlignedBuf};
use intact_proto::{Entry, EntryKind, Holding, Message};

use super::commit::{failed, verified_because};
use super::resume::{reverify_held, reverify_whole};
use super::{Incoming, ReceiveOptions};
use crate::dest::{Destination, Mtime, PartialFile};
use crate::journal::Journal;
use crate::net::whole_digest::{HeldWhole, Stamp};
use crate::profile::{Profile, Stage};
use crate::stage::verify::{stage_for, RereadFile, VerifyStage};
use crate::verify::VerifyMode;
use crate::TransferError;

/// What an Entry begins: a reply to send, or a directory for the session.
pub(super) enum Begun {
    Reply(Message),
    Dir(Entry),
}

/// Handles an Entry: the FileResult of a symlink or a file already held
/// whole, the Status of a file whose blocks must come, or a directory
/// (left to [`Session::dir`]).
pub(super) fn begin(
    dest: &Destination,
    journal: &Journal,
    opts: &ReceiveOptions,
    e: Entry,
    files: &mut HashMap<u64, Incoming>,
    buf: &mut AlignedBuf,
) -> Begun {
    let id = e.file;
    let result = |r: Result<(), TransferError>| match r {
        Ok(()) => verified_because(id, ""),
        Err(err) => failed(id, &err.to_string()),
    };
    let mtime = Mtime {
        sec: e.mtime_sec,
        nsec: e.mtime_nsec,
    };
    Begun::Reply(match &e.kind {
        EntryKind::Dir => return Begun::Dir(e),
        EntryKind::Symlink(target) => result(dest.make_symlink(&e.path, target, mtime)),
        EntryKind::File => match begin_file(dest, journal, opts, e, files, buf) {
            Ok(m) => m,
            Err(err) => failed(id, &err.to_string()),
        },
    })
}

fn begin_file(
    dest: &Destination,
    journal: &Journal,
    opts: &ReceiveOptions,
    e: Entry,
    files: &mut HashMap<u64, Incoming>,
    buf: &mut AlignedBuf,
) -> Result<Message, TransferError> {
    let id = e.file;
    let Some(mode) = VerifyMode::from_wire_id(e.verify) else {
        return Err(TransferError::Verification {
            path: e.path.to_string(),
            what: format!("unknown verification mode id {}", e.verify),
        });
    };
    if e.algorithm != defaults::BLOCK_ALGORITHM.wire_id() || e.block_size == 0 {
        return Err(TransferError::Verification {
            path: e.path.to_string(),
            what: "unsupported block algorithm or block size".into(),
        });
    }
    if let Some(range) = e.range {
        let (inc, holding) = super::split::begin_range(dest, journal, opts, e, range, mode, buf)?;
        files.insert(id, inc);
        return Ok(Message::Status {
            file: id,
            holding,
            strong: false,
        });
    }
    let required = super::required_level(e.flags);
    let same = |r: &crate::journal::FileRow| {
        r.size == e.size
            && r.mtime_sec == e.mtime_sec
            && r.mtime_nsec == e.mtime_nsec
            && r.block_size == e.block_size
    };
    let profile = &*opts.profile;
    let found = profile.time(Stage::Journal, || journal.lookup(e.path.as_bytes()))?;
    // A path the journal knows may have a named partial file of an earlier
    // attempt (of this version or another); one it does not know has none
    // of intact's (so a first transfer asks nothing more).
    let known = found.is_some();
    let row = found.filter(same);
    // Held whole, with the digest its commit compared (older rows have
    // none, and are received anew): the quick check. The sender compares
    // that digest with its source's own; size and mtime only pick the
    // candidate.
    if let Some((r, digest)) = row
        .as_ref()
        .filter(|r| r.done)
        .and_then(|r| Some((r, r.digest?)))
    {
        let _quick = profile.timer(Stage::Quick);
        if let Some(file) = dest.open_final(&e.path).filter(|f| unchanged_since(f, &e)) {
            // Taken before any read: the answer holds only for this version.
            let stamp = Stamp::of(&file).map_err(|err| TransferError::Destination {
                path: e.path.to_string(),
                source: err,
            })?;
            let reverify = e.flags & Entry::REVERIFY != 0;
            if !reverify && r.verified.level >= mode.level() {
                // Trusted at the level its record says, no higher.
                let level = r.verified.level;
                if let Some(want) = required.filter(|want| level < *want) {
                    return Err(TransferError::Verification {
                        path: e.path.to_string(),
                        what: format!("--require-level {want}: held at level {level}"),
                    });
                }
                let mut inc = Incoming::fresh(e.clone(), mode, None, r.id);
                inc.whole.held = Some(HeldWhole {
                    digest,
                    trusted: Some(r.verified),
                    stamp,
                });
                files.insert(id, inc);
                return Ok(Message::Status {
                    file: id,
                    holding: Holding::Whole {
                        digest: digest.to_vec(),
                    },
                    strong: false,
                });
            }
            if mode != VerifyMode::None {
                let inc = Incoming::fresh(e.clone(), mode, None, r.id);
                if let Some(inc) = reverify_whole(inc, journal, &file, opts, buf, &digest, stamp)? {
                    files.insert(id, inc);
                    return Ok(Message::Status {
                        file: id,
                        holding: Holding::Whole {
                            digest: digest.to_vec(),
                        },
                        strong: false,
                    });
                }
            }
        }
    }
    // A file of one block is received unnamed unless a named partial file
    // of its path is there: that one is resumed if its row is this
    // version's, else reused from its start (never left behind). A row of
    // a one-block file whose attempt left no partial file (it was
    // unnamed) has nothing to resume and is started afresh.
    let named_left = known && named_partial_left(dest, &e, profile);
    let resumed = row.filter(|r| !r.done && (!one_block(&e) || named_left));
    let fresh = resumed.is_none() && !named_left;
    let partial = profile.time(Stage::Create, || open_partial(dest, &e, fresh))?;
    // This session holds the path now (its claim, and a named partial's
    // lock): the journal says so (start, or reopen below, records it).
    let session = opts.session.map(|s| s.0);
    let row_id = match &resumed {
        Some(r) => r.id,
        None => profile.time(Stage::Journal, || {
            journal.start(
                e.path.as_bytes(),
                e.size,
                (e.mtime_sec, e.mtime_nsec),
                e.block_size,
                session,
                &e.origin,
            )
        })?,
    };
    let mut inc = Incoming::fresh(e, mode, Some(partial), row_id);
    inc.verify = open_stage(&inc, partial_reread(&inc), opts)?;
    let resumed_id = resumed.as_ref().map(|r| r.id);
    let holding = match resumed {
        Some(r) => {
            let list = reverify_held(&mut inc, journal.blocks(r.id)?, buf)?;
            if list.is_empty() {
                Holding::Nothing
            } else {
                Holding::Blocks(list)
            }
        }
        None => Holding::Nothing,
    };
    if resumed_id.is_some() {
        profile.time(Stage::Journal, || journal.reopen(row_id, session))?;
    }
    files.insert(id, inc);
    Ok(Message::Status {
        file: id,
        holding,
        strong: false,
    })
}

/// The file `e` is received into: where it is one block and nothing of
/// it is to be resumed, an unnamed file if the file system has them (see
/// `dest/unnamed.rs`); else its named partial file.
fn open_partial(dest: &Destination, e: &Entry, fresh: bool) -> Result<PartialFile, TransferError> {
    if fresh && one_block(e) {
        if let Some(p) = dest.unnamed(&e.path, e.mode)? {
            return Ok(p);
        }
    }
    dest.partial(&e.path, e.size)
}

/// Whether `e` is a file of one block with a named partial file of an
/// earlier attempt on disk (then it is received into that one, never
/// unnamed, so that it is not left behind). Where the look fails, true:
/// the named path fails the same way, and keeps what a named partial may
/// still need.
fn named_partial_left(dest: &Destination, e: &Entry, profile: &Profile) -> bool {
    one_block(e)
        && profile
            .time(Stage::Create, || dest.has_partial(&e.path))
            .unwrap_or(true)
}

/// Whether `e` is a file of one block (or none).
pub(super) fn one_block(e: &Entry) -> bool {
    e.size <= u64::from(e.block_size)
}

/// Whether the final file still has the size and mtime the entry announces.
pub(super) fn unchanged_since(file: &File, e: &Entry) -> bool {
    use std::os::unix::fs::MetadataExt;
    file.metadata().is_ok_and(|m| {
        m.len() == e.size && m.mtime() == e.mtime_sec && m.mtime_nsec() as u32 == e.mtime_nsec
    })
}

/// The verify stage of `inc`, re-reading `file` (its partial file, or
/// the final file re-verified in place) where the mode re-reads blocks;
/// with `--require-level device` a file system without a device fails
/// here.
pub(super) fn open_stage(
    inc: &Incoming,
    file: Option<RereadFile>,
    opts: &ReceiveOptions,
) -> Result<Box<dyn VerifyStage>, TransferError> {
    let direct = inc.entry.flags & Entry::DIRECT != 0;
    let stage =
        stage_for(inc.mode, file, direct, opts.reread_through_cache()).map_err(inc.path_err())?;
    if let Some(want) = super::required_level(inc.entry.flags) {
        if let Some(why) = stage.no_device_reason() {
            return Err(TransferError::Verification {
                path: inc.entry.path.to_string(),
                what: format!("--require-level {want}: the destination is on {why}"),
            });
        }
    }
    Ok(stage)
}

/// The partial file of `inc`, to re-read: in one range where the file
/// is one block.
pub(super) fn partial_reread(inc: &Incoming) -> Option<RereadFile> {
    let p = inc.partial.as_ref()?;
    Some(RereadFile {
        file: std::sync::Arc::clone(p.shared()),
        dev: p.dev(),
        one_range: inc.range.is_none() && one_block(&inc.entry),
    })
}

/// A held file whose sender's copy differs: forget what was held and
/// receive every block into a new partial file.
pub(super) fn start_anew(
    f: &mut Incoming,
    dest: &Destination,
    journal: &Journal,
    opts: &ReceiveOptions,
) -> Result<(), TransferError> {
    let e = f.entry.clone();
    let profile = &*opts.profile;
    let named_left = named_partial_left(dest, &e, profile);
    let partial = profile.time(Stage::Create, || open_partial(dest, &e, !named_left))?;
    let row = profile.time(Stage::Journal, || {
        journal.start(
            e.path.as_bytes(),
            e.size,
            (e.mtime_sec, e.mtime_nsec),
            e.block_size,
            opts.session.map(|s| s.0),
            &e.origin,
        )
    })?;
    let mut inc = Incoming::fresh(e, f.mode, Some(partial), row);
    inc.verify = open_stage(&inc, partial_reread(&inc), opts)?;
    inc.slot = f.slot.take();
    *f = inc;
    Ok(())
}

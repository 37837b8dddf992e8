//! Version 8's pull exchange, server side: a [`Message::Fetch`] is
//! answered with the bytes of a regular file under the session's root
//! (the root, or a keyring client's subtree: the same confined
//! [`Destination`] its writes go through, so symlinks are never followed
//! and nothing outside is reachable). Only a server started with
//! `--allow-fetch` answers; the bytes a reply holds are taken from the
//! session's share of the server's memory before they are read.

use intact_proto::{Held, Message, Party, ProtoError, WirePath, MAX_BLOCK};

use crate::dest::Destination;

/// How long a Fetch may wait for memory before its session ends (busy).
const MEMORY_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The answer to a Fetch of `len` bytes of `path` from `offset`: the
/// bytes (fewer only at the end of the file), or why not. A file that is
/// not there, not regular or unreadable is the client's answer; only a
/// server out of memory for it is an error (the session ends busy). The
/// memory the reply holds is given back when the caller drops it, once
/// the reply is sent.
pub(super) fn answer(
    dest: &Destination,
    memory: Option<&Party>,
    path: &WirePath,
    offset: u64,
    len: u32,
) -> Result<(Message, Option<Held>), ProtoError> {
    let reply = |result| Ok((Message::Fetched { offset, result }, None));
    let len = (len as usize).min(MAX_BLOCK);
    let Some(file) = dest.open_final(path) else {
        return reply(Err(format!("{path}: not a regular file here")));
    };
    let size = match file.metadata() {
        Ok(m) => m.len(),
        Err(e) => return reply(Err(format!("{path}: {e}"))),
    };
    let want = size.saturating_sub(offset).min(len as u64) as usize;
    // The bytes, then their frame: twice the range until it is sent.
    let held = match memory {
        Some(m) => Some(m.take(2 * want as u64, MEMORY_WAIT)?),
        None => None,
    };
    let data = match crate::dest::read_at_most(&file, offset, want) {
        Ok(d) => d,
        Err(e) => return reply(Err(format!("{path}: {e}"))),
    };
    Ok((
        Message::Fetched {
            offset,
            result: Ok(data),
        },
        held,
    ))
}

//! The block pipeline, one step after another, written once for `copy`
//! and for `send`/`serve` (the two halves run in one process or across
//! TCP; see [`crate::link`]):
//!
//! 1. **Source read** (sender): the read path chosen by the mode, and the
//!    block's digest ([`source`]; `riva` reads the digest's bytes from the
//!    device).
//! 2. **Transport**: the block and its digest go over the link
//!    ([`crate::link`]: moved in process, framed on TCP).
//! 3. **Check** (receiver): the digest against the bytes that arrived,
//!    before anything is written (`net::receiver::accept`).
//! 4. **Write** into the file's partial file (`net::receiver::accept`).
//! 5. **Verify**: the file's [`verify::VerifyStage`], chosen from the mode
//!    (nothing, a re-read through the cache, evict and re-read from the
//!    device, a whole-file re-read at its end). A written block is
//!    read back in [`crate::recheck`] (per block, and every read from
//!    the device) or in [`verify::reread_matches`] (through the cache:
//!    the whole-file re-read, a resume's trusted blocks).
//! 6. **Commit**: the whole-file BLAKE3 compared with the sender's, then
//!    a group of files made durable and renamed (`net::receiver::commit`,
//!    [`crate::dest`]).
//! 7. **Journal**: verified blocks and committed files recorded, for
//!    resume and the quick check ([`crate::journal`]).

pub(crate) mod source;
pub(crate) mod verify;

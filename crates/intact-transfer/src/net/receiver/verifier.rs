//! A session's verifier thread: the per-block re-read of the `riva` and
//! `block` verify stages, off the session thread.

use std::fs::File;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use intact_cache::DeviceReader;
use intact_digest::{AlignedBuf, Digest};

use super::Event;
use crate::recheck::{recheck_batch, Recheck, BATCH_BYTES};
use crate::verify::VerifyLevel;

/// Work for the verifier thread: re-read a written block (from the device
/// in `riva`, through the cache in `block`).
pub(super) struct Check {
    pub(super) id: u64,
    pub(super) index: u64,
    /// The level of the sender's read behind the digest.
    pub(super) source_level: VerifyLevel,
    pub(super) offset: u64,
    pub(super) len: usize,
    pub(super) digest: Digest,
    pub(super) file: Arc<File>,
    pub(super) reader: Arc<Mutex<DeviceReader>>,
    /// The CRC-32C of each page of the bytes received (for the catalog).
    pub(super) pages: Option<Vec<u8>>,
}

/// The verifier's verdict on one block.
pub(super) struct Checked {
    pub(super) id: u64,
    pub(super) index: u64,
    pub(super) source_level: VerifyLevel,
    pub(super) digest: Digest,
    pub(super) ok: Result<bool, std::io::Error>,
    pub(super) outcome: intact_cache::ReadOutcome,
    pub(super) took: Duration,
    /// As the [`Check`] had them.
    pub(super) pages: Option<Vec<u8>>,
}

/// The verifier thread of a session: it takes the blocks queued so far as
/// one batch (see [`crate::recheck`]) and sends a verdict for each.
pub(super) fn verifier(jobs: mpsc::Receiver<Check>, events: mpsc::Sender<Event>) {
    // Grown by the first re-read to its length: an idle session holds none.
    let mut buf = AlignedBuf::new(0);
    while let Ok(first) = jobs.recv() {
        let mut bytes = first.len;
        let mut batch = vec![first];
        while bytes < BATCH_BYTES {
            match jobs.try_recv() {
                Ok(c) => {
                    bytes += c.len;
                    batch.push(c);
                }
                Err(_) => break,
            }
        }
        let items: Vec<Recheck<'_>> = batch
            .iter()
            .map(|c| Recheck {
                file: &c.file,
                reader: Some(&*c.reader),
                offset: c.offset,
                len: c.len,
                digest: &c.digest,
            })
            .collect();
        let results = recheck_batch(&items, &mut buf);
        drop(items);
        for (c, r) in batch.into_iter().zip(results) {
            let done = Checked {
                id: c.id,
                index: c.index,
                source_level: c.source_level,
                digest: c.digest,
                ok: r.ok,
                outcome: r.outcome,
                took: r.took,
                pages: c.pages,
            };
            if events.send(Event::Checked(done)).is_err() {
                return;
            }
        }
    }
}

//! A file's blocks: what the receiver holds is checked against the
//! source, the rest sent (resent when a block fails), and FileEnd with
//! the whole-file digest.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime};

use intact_digest::Blake3Blocks;
use intact_proto::{Block, FileEnd, Holding, Message, WIRE_PAGE};

use super::stream::{Outgoing, Stream};
use crate::profile::Stage;
use crate::source_cache::SourceDigest;
use crate::TransferError;

impl Stream<'_> {
    /// The receiver's Status: sends every block it does not hold, and every
    /// block it holds with a digest other than the source's own (checked
    /// by reading the source here, which costs no network; in `riva` the
    /// read reaches the device). A file held whole is all or nothing: if
    /// the BLAKE3 the receiver holds is not the source's, every block is
    /// sent; if it is, none, and FileEnd carries that digest for the
    /// receiver to confirm.
    pub(super) fn send_missing(&mut self, id: u64, o: &mut Outgoing, holding: Holding) {
        self.receiver_needs = !matches!(holding, Holding::Whole { .. });
        let held: HashMap<u64, Vec<u8>> = match holding {
            Holding::Nothing => HashMap::new(),
            Holding::Blocks(b) => b.into_iter().collect(),
            Holding::Whole { .. } if self.ctx.entries[id as usize].range.is_some() => {
                o.report.error = Some(format!(
                    "{}: the server answered one range of the file with a whole-file digest",
                    o.report.path
                ));
                o.gave_up.get_or_insert(0);
                self.end_file(id, o);
                return;
            }
            Holding::Whole { digest } => {
                match self.holds_whole(o, id, &digest) {
                    Ok(true) => {
                        // Counted as unchanged (held and trusted, or
                        // re-verified in place), not as skipped blocks.
                        self.end_file(id, o);
                        return;
                    }
                    Ok(false) => {}
                    Err(err) => {
                        o.report.error = Some(err.to_string());
                        o.gave_up.get_or_insert(0);
                        self.end_file(id, o);
                        return;
                    }
                }
                HashMap::new()
            }
        };
        let blocks = o.report.blocks;
        let bs = self.ctx.opts.block_size as u64;
        let size = self.ctx.entries[id as usize].size;
        let first = self.ctx.entries[id as usize].range.map_or(0, |r| r.first);
        // The whole-file BLAKE3 for FileEnd, in every mode: per block
        // (power-of-two block sizes; held blocks from the read that checks
        // them), else streamed when every block is sent in order, else
        // read again before FileEnd.
        o.report.source_digest = Some(SourceDigest::Transfer);
        o.tree = Blake3Blocks::new(size, bs);
        let mut whole =
            (held.is_empty() && o.tree.is_none() && first == 0).then(blake3::Hasher::new);
        for index in first..first + blocks {
            if let Some(theirs) = held.get(&index) {
                match self.source_block_matches(o, id, index, theirs) {
                    Ok(true) => {
                        o.report.blocks_skipped += 1;
                        o.report.bytes_skipped += (size - index * bs).min(bs);
                        continue;
                    }
                    Ok(false) => {}
                    Err(err) => {
                        o.report.error = Some(err.to_string());
                        o.gave_up.get_or_insert(index);
                        break;
                    }
                }
            }
            if let Err(err) = self.send_block(o, id, index, whole.as_mut(), false, &[]) {
                o.report.error = Some(err.to_string());
                o.gave_up.get_or_insert(index);
                break;
            }
        }
        o.streamed = whole.map(|w| *w.finalize().as_bytes());
        if o.pending == 0 {
            self.end_file(id, o);
        }
    }

    /// Whether the BLAKE3 the receiver holds for a file it holds whole
    /// (`theirs`) equals the source's own, from the source-digest cache or
    /// read now (`--reverify`: always read, in riva from the device). The
    /// report says which.
    fn holds_whole(
        &mut self,
        o: &mut Outgoing,
        id: u64,
        theirs: &[u8],
    ) -> Result<bool, TransferError> {
        let (ours, from) = match o.cached.take() {
            Some((d, recorded_at)) => (d, SourceDigest::Cache { recorded_at }),
            None => {
                let start = SystemTime::now();
                let d = self.read_digest(o, id, self.ctx.opts.reverify)?;
                if let (Some(c), Some(k), Some(src)) = (self.ctx.cache, &o.key, &o.source) {
                    c.put(src.file(), k, start, &d);
                }
                (d, SourceDigest::Read)
            }
        };
        o.report.source_digest = Some(from);
        let same = <[u8; 32]>::try_from(theirs)
            .is_ok_and(|t| blake3::Hash::from_bytes(t) == blake3::Hash::from_bytes(ours));
        if same {
            o.digest = Some(ours);
            o.report.digest = Some(blake3::Hash::from_bytes(ours).to_hex().to_string());
        }
        Ok(same)
    }

    /// Whether block `index` of the source hashes to `theirs` (see
    /// [`SourceFile::matches`]); a block not sent has its part of the
    /// whole-file digest from the bytes this check read.
    fn source_block_matches(
        &mut self,
        o: &mut Outgoing,
        id: u64,
        index: u64,
        theirs: &[u8],
    ) -> Result<bool, TransferError> {
        let e = &self.ctx.entries[id as usize];
        let source = o.source.as_mut().expect("files have a source");
        let Some(bytes) = source.matches(e, index, theirs, &mut self.bufs)? else {
            return Ok(false);
        };
        if let Some(t) = o.tree.as_mut() {
            t.set(index, bytes);
        }
        Ok(true)
    }

    /// The whole-file BLAKE3 of what the source holds now (see
    /// [`SourceFile::whole_digest`]).
    fn read_digest(
        &mut self,
        o: &mut Outgoing,
        id: u64,
        device: bool,
    ) -> Result<[u8; 32], TransferError> {
        let e = &self.ctx.entries[id as usize];
        let source = o.source.as_mut().expect("files have a source");
        source.whole_digest(e, device, &mut self.bufs)
    }

    /// The whole-file BLAKE3 of the bytes sent (and held) for FileEnd.
    fn file_digest(&mut self, o: &mut Outgoing, id: u64) -> Result<[u8; 32], TransferError> {
        let e = &self.ctx.entries[id as usize];
        if let Some(r) = e.range {
            // A range's digest, from its blocks' BLAKE3 chaining values
            // (see intact_proto::range_digest); never a read of the file.
            let cvs = o.tree.as_ref().and_then(|t| t.range_cvs(r.first, r.end));
            let cvs = cvs.ok_or_else(|| TransferError::Verification {
                path: e.rel.to_string(),
                what: "a block's part of the range digest is missing".into(),
            })?;
            let digest = intact_proto::range_digest(e.size, r.block_size, r.first, r.end, &cvs);
            if let Some(m) = self.ctx.range_cvs {
                // A spread file's joined row composes its BLAKE3 from these.
                m.lock().unwrap_or_else(|p| p.into_inner()).insert(id, cvs);
            }
            return Ok(digest);
        }
        if let Some(d) = o.digest {
            return Ok(d);
        }
        if let Some(h) = o.tree.as_ref().and_then(Blake3Blocks::finalize) {
            return Ok(*h.as_bytes());
        }
        match o.streamed {
            Some(d) if !o.stale_digest => Ok(d),
            _ => self.read_digest(o, id, true),
        }
    }

    /// Reads block `index` of entry `id` (see [`SourceFile::read_for_send`])
    /// and sends it with its digest and page CRCs: the whole block, or,
    /// where the receiver named `pages`, only those pages (version 10's
    /// page-level resend; the digest and CRCs still cover the whole block,
    /// as read now).
    pub(super) fn send_block(
        &mut self,
        o: &mut Outgoing,
        id: u64,
        index: u64,
        whole: Option<&mut blake3::Hasher>,
        resend: bool,
        pages: &[u32],
    ) -> Result<(), TransferError> {
        let stage = Instant::now();
        let e = &self.ctx.entries[id as usize];
        let source = o.source.as_mut().expect("files have a source");
        let read = source.read_for_send(e, index, resend, &mut self.bufs)?;
        let t = Instant::now();
        let profile = self.ctx.profile;
        profile.add(Stage::Read, (t - stage).saturating_sub(read.hashing));
        let len = read.data.len();
        if let Some(w) = whole {
            w.update(&read.data);
        }
        if let Some(t) = o.tree.as_mut() {
            t.set(index, &read.data);
        }
        // For a recovery cache: the whole block's BLAKE3, also on a patch.
        let strong = if o.strong {
            blake3::hash(&read.data).as_bytes().to_vec()
        } else {
            Vec::new()
        };
        let hashed = t.elapsed() + read.hashing;
        o.report.checksum_seconds += hashed.as_secs_f64();
        profile.add(Stage::Digest, hashed);
        // Every page named: the block goes whole.
        let pages = if pages.len() >= Block::pages_of(len) {
            &[]
        } else {
            pages
        };
        let data = if pages.is_empty() {
            read.data
        } else {
            let mut only = Vec::with_capacity(pages.len() * WIRE_PAGE);
            for &p in pages {
                only.extend_from_slice(&read.data[Block::page_range(len, p)]);
            }
            only
        };
        let len = data.len();
        let msg = Message::Block(Block {
            file: id,
            index,
            source_level: read.level.wire_id(),
            digest: read.digest,
            crcs: read.crcs,
            patch: pages.to_vec(),
            strong,
            data,
        });
        let put = Instant::now();
        let sent = self.conn.put(msg).map_err(TransferError::Path);
        profile.add(Stage::Handoff, put.elapsed());
        sent?;
        o.report.transfer_stage_seconds += stage.elapsed().as_secs_f64();
        o.pending += 1;
        o.report.pages_resent += pages.len() as u64;
        o.report.bytes_sent += len as u64;
        o.stale_digest |= resend;
        let total = self.ctx.sent.fetch_add(len as u64, Ordering::Relaxed) + len as u64;
        (self.ctx.progress)(total);
        Ok(())
    }

    pub(super) fn end_file(&mut self, id: u64, o: &mut Outgoing) {
        let e = &self.ctx.entries[id as usize];
        let profile = self.ctx.profile;
        if let Some(src) = &mut o.source {
            if let Err(err) = profile.time(Stage::Open, || src.check_unchanged(e)) {
                o.report.error = Some(err.to_string());
                o.gave_up = Some(u64::MAX);
            }
        }
        let mut digest = Vec::new();
        if o.gave_up.is_none() && o.report.error.is_none() {
            let t = Instant::now();
            let d = self.file_digest(o, id);
            profile.add(Stage::Digest, t.elapsed());
            match d {
                Ok(d) => {
                    o.digest = Some(d);
                    o.report.digest = Some(blake3::Hash::from_bytes(d).to_hex().to_string());
                    digest = d.to_vec();
                }
                Err(err) => {
                    o.report.error = Some(err.to_string());
                    o.gave_up = Some(u64::MAX);
                }
            }
        }
        // A file the sender gave up on must never get its final name.
        let blocks = if o.gave_up.is_some() || o.report.error.is_some() {
            FileEnd::ABANDON
        } else {
            o.report.blocks
        };
        let msg = Message::FileEnd {
            file: id,
            blocks,
            source_level: self.source_level(o).level.wire_id(),
            digest,
        };
        if let Err(err) = profile.time(Stage::Handoff, || self.conn.put(msg)) {
            self.broken = Some(err.to_string());
        }
        o.ended = true;
    }
}

//! One file as the mount holds it: its catalog row, the CRC of every page
//! (kept in memory while the file is in use: the CRC cache), and the
//! blocks whose CRCs changed and are not yet in the catalog.
//!
//! Reads check whole pages: an unaligned read reads and checks the pages
//! around it and returns only the bytes asked for (PVFS §4.2). Writes keep
//! the CRCs right: a page the write covers whole gets its CRC from the
//! application's buffer before the bytes are handed on (chaining); a page
//! it covers in part is read, checked against its CRC, merged, and its
//! new CRC computed from the merged page (read-verify-modify-write). The
//! new CRCs go to the intent log before the data is written.

use std::collections::BTreeSet;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};

use intact_digest::{defaults, page_crc};

use crate::streams::BlockStreams;
use intact_transfer::{
    block_matches, crcs_of_blob, failing_block, rebuild_block, written_block, BlockRecord, Intent,
    Journal, Layout, MountRow, Page, RebuildError, TransferError,
};

/// What the catalog says of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Cataloged, and the file is as cataloged (or was written only
    /// through this mount): every read is checked.
    Cataloged,
    /// Cataloged, but its size or mtime differ from the catalog: another
    /// program changed it, so the catalog no longer describes it and its
    /// reads cannot be checked.
    Changed,
    /// Not in the catalog: its reads cannot be checked.
    Uncataloged,
}

impl Standing {
    /// Its name in extended attributes and logs.
    pub fn name(self) -> &'static str {
        match self {
            Standing::Cataloged => "cataloged",
            Standing::Changed => "changed outside the mount (not checked)",
            Standing::Uncataloged => "not cataloged (not checked)",
        }
    }
}

/// Why a read or write through a node failed.
#[derive(Debug)]
pub enum NodeError {
    /// The file could not be read or written.
    Io(std::io::Error),
    /// These pages do not hold what their CRC says (nothing was written).
    Bad(Vec<Page>),
    /// The catalog could not be read or written.
    Catalog(TransferError),
    /// The change would grow the file by more than [`MAX_GROWTH`] at once.
    TooBig,
}

/// The most one write or truncate may grow a cataloged file by: every new
/// page gets a CRC in memory and in the intent log (4 GiB: 1 Mi pages of
/// 4 KiB, 4 MiB of CRCs).
pub const MAX_GROWTH: u64 = 4 << 30;

impl From<std::io::Error> for NodeError {
    fn from(e: std::io::Error) -> Self {
        NodeError::Io(e)
    }
}

impl From<TransferError> for NodeError {
    fn from(e: TransferError) -> Self {
        NodeError::Catalog(e)
    }
}

/// Page CRCs of one block; `None`: the block has no usable record (its
/// digest failed, or none was kept), so none of its pages can be vouched
/// for and every read of them fails.
type BlockCrcs = Option<Vec<u32>>;

/// One file in the mount.
#[derive(Debug)]
pub struct Node {
    /// Its catalog row (None: not cataloged).
    pub row: Option<MountRow>,
    /// What the catalog says of it.
    pub standing: Standing,
    /// Its size and how its pages fall.
    pub layout: Layout,
    crcs: Vec<BlockCrcs>,
    /// Blocks whose CRCs changed and are not in the catalog yet.
    pub touched: BTreeSet<u64>,
    /// Blocks whose page CRCs the catalog lacks (older rows): computed at
    /// load from bytes that passed the block digest. The first change to
    /// such a block logs all of its CRCs, so that a crash cannot leave
    /// its other pages without one.
    derived: BTreeSet<u64>,
    /// Running digests of blocks being written in order (see
    /// `streams.rs`): a block one covers whole needs no read-back at
    /// commit.
    streams: BlockStreams,
    /// Open handles.
    pub open: usize,
    /// Whether the mount counts it among the files whose CRCs are in the
    /// intent log and not yet in the catalog.
    pub counted: bool,
}

/// The mtime of `m` as the catalog keeps it.
pub fn mtime_of(m: &std::fs::Metadata) -> (i64, u32) {
    (m.mtime(), m.mtime_nsec() as u32)
}

impl Node {
    /// A node for a file the catalog does not describe.
    pub fn unchecked(row: Option<MountRow>, standing: Standing, size: u64) -> Node {
        Node {
            row,
            standing,
            layout: Layout {
                size,
                block: defaults::BLOCK_BYTES as u64,
                page: intact_digest::PAGE_SIZE as u64,
            },
            crcs: Vec::new(),
            touched: BTreeSet::new(),
            derived: BTreeSet::new(),
            streams: BlockStreams::default(),
            open: 0,
            counted: false,
        }
    }

    /// Loads the node of `file`, cataloged as `row` (if it is), with the
    /// catalog's CRCs. A block recorded without page CRCs (older rows) is
    /// read and checked against its block digest, and its page CRCs are
    /// computed from the bytes that passed (chaining).
    pub fn load(journal: &Journal, row: Option<MountRow>, file: &File) -> Result<Node, NodeError> {
        let meta = file.metadata()?;
        let Some(row) = row.filter(|r| r.done) else {
            return Ok(Node::unchecked(None, Standing::Uncataloged, meta.len()));
        };
        if (meta.len(), mtime_of(&meta)) != (row.size, row.mtime) {
            return Ok(Node::unchecked(Some(row), Standing::Changed, meta.len()));
        }
        let layout = Layout {
            size: row.size,
            block: u64::from(row.block_size.max(1)),
            page: journal.page_size() as u64,
        };
        let mut crcs: Vec<BlockCrcs> = vec![None; layout.blocks() as usize];
        let mut derived = BTreeSet::new();
        let mut buf = Vec::new();
        for rec in journal.blocks(row.id)? {
            let Some(slot) = crcs.get_mut(rec.index as usize) else {
                continue;
            };
            let want = layout.pages_in_block(rec.index);
            *slot = match rec.pages.as_deref().map(crcs_of_blob) {
                Some(c) if c.len() == want => Some(c),
                _ => {
                    derived.insert(rec.index);
                    block_checked(file, &layout, &rec, &mut buf)?
                }
            };
        }
        Ok(Node {
            row: Some(row),
            standing: Standing::Cataloged,
            layout,
            crcs,
            touched: BTreeSet::new(),
            derived,
            streams: BlockStreams::default(),
            open: 0,
            counted: false,
        })
    }

    /// A node for a file just created through the mount (empty).
    pub fn created(row: MountRow, page: u64) -> Node {
        Node {
            layout: Layout {
                size: 0,
                block: u64::from(row.block_size.max(1)),
                page,
            },
            row: Some(row),
            standing: Standing::Cataloged,
            crcs: Vec::new(),
            touched: BTreeSet::new(),
            derived: BTreeSet::new(),
            streams: BlockStreams::default(),
            open: 0,
            counted: false,
        }
    }

    /// Whether reads are checked.
    pub fn checked(&self) -> bool {
        self.standing == Standing::Cataloged
    }

    fn crc(&self, p: &Page) -> Option<u32> {
        self.crcs
            .get(p.block as usize)?
            .as_ref()?
            .get(p.index)
            .copied()
    }

    /// Bytes `[offset, offset + size)` of `file` (fewer at its end), every
    /// page around them checked against its CRC when the file is
    /// cataloged.
    pub fn read(&self, file: &File, offset: u64, size: u32) -> Result<Vec<u8>, NodeError> {
        if !self.checked() {
            let mut buf = vec![0u8; size as usize];
            let n = read_full(file, &mut buf, offset)?;
            buf.truncate(n);
            return Ok(buf);
        }
        let end = offset.saturating_add(u64::from(size)).min(self.layout.size);
        if offset >= end {
            return Ok(Vec::new());
        }
        let pages = self.layout.pages(offset, end - offset);
        let (first, last) = (pages[0], pages[pages.len() - 1]);
        let span = first.offset..last.offset + last.len;
        let mut buf = vec![0u8; (span.end - span.start) as usize];
        file.read_exact_at(&mut buf, span.start)?;
        let bad = self.bad_pages(&pages, &buf, span.start);
        if !bad.is_empty() {
            return Err(NodeError::Bad(bad));
        }
        buf.drain(..(offset - span.start) as usize);
        buf.truncate((end - offset) as usize);
        Ok(buf)
    }

    fn bad_pages(&self, pages: &[Page], buf: &[u8], at: u64) -> Vec<Page> {
        pages
            .iter()
            .filter(|p| {
                let s = (p.offset - at) as usize;
                self.crc(p) != Some(page_crc(&buf[s..s + p.len as usize]))
            })
            .copied()
            .collect()
    }

    /// Page `p` of the file as it is now (the layout it has), checked
    /// against its CRC.
    fn checked_page(&self, file: &File, p: &Page) -> Result<Vec<u8>, NodeError> {
        let mut buf = vec![0u8; p.len as usize];
        file.read_exact_at(&mut buf, p.offset)?;
        if self.crc(p) != Some(page_crc(&buf)) {
            return Err(NodeError::Bad(vec![*p]));
        }
        Ok(buf)
    }

    /// The new CRCs of the pages of the layout `new` over
    /// `[start, end)`, where the file is to hold `data` at `offset` and
    /// zeros past its old end: pages covered whole by `data` from the
    /// buffer itself, others read, checked, merged, and summed.
    fn new_crcs(
        &self,
        file: &File,
        new: &Layout,
        start: u64,
        end: u64,
        data: &[u8],
        offset: u64,
    ) -> Result<Vec<(Page, u32)>, NodeError> {
        let old = self.layout;
        let data_end = offset + data.len() as u64;
        let mut out = Vec::new();
        let mut bad = Vec::new();
        let mut zeros: Option<(u64, u32)> = None;
        for p in new.pages(start, end - start) {
            let p_end = p.offset + p.len;
            if p.offset >= offset && p_end <= data_end {
                let s = (p.offset - offset) as usize;
                out.push((p, page_crc(&data[s..s + p.len as usize])));
                continue;
            }
            if p.offset >= old.size && (p_end <= offset || p.offset >= data_end) {
                // A page of the gap past the old end: zeros.
                let crc = match zeros {
                    Some((len, crc)) if len == p.len => crc,
                    _ => {
                        let crc = page_crc(&vec![0u8; p.len as usize]);
                        zeros = Some((p.len, crc));
                        crc
                    }
                };
                out.push((p, crc));
                continue;
            }
            let mut page = vec![0u8; p.len as usize];
            if p.offset < old.size {
                let was = old.page(p.block, p.index);
                match self.checked_page(file, &was) {
                    Ok(bytes) => {
                        let n = bytes.len().min(page.len());
                        page[..n].copy_from_slice(&bytes[..n]);
                    }
                    Err(NodeError::Bad(b)) => {
                        bad.extend(b);
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            let (lo, hi) = (p.offset.max(offset), p_end.min(data_end));
            if lo < hi {
                page[(lo - p.offset) as usize..(hi - p.offset) as usize]
                    .copy_from_slice(&data[(lo - offset) as usize..(hi - offset) as usize]);
            }
            out.push((p, page_crc(&page)));
        }
        if !bad.is_empty() {
            return Err(NodeError::Bad(bad));
        }
        Ok(out)
    }

    /// Writes `data` at `offset`: the new page CRCs are computed (and the
    /// partly covered pages checked) first, then logged by `log`, then the
    /// bytes written. Nothing is written if a page fails its check.
    pub fn write(
        &mut self,
        file: &File,
        offset: u64,
        data: &[u8],
        log: &mut dyn FnMut(&[Intent]) -> std::io::Result<()>,
    ) -> Result<(), NodeError> {
        if !self.checked() {
            file.write_all_at(data, offset)?;
            self.layout.size = self.layout.size.max(offset + data.len() as u64);
            return Ok(());
        }
        if data.is_empty() {
            return Ok(());
        }
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or(NodeError::TooBig)?;
        if end > self.layout.size.saturating_add(MAX_GROWTH) {
            return Err(NodeError::TooBig);
        }
        let new = Layout {
            size: self.layout.size.max(end),
            ..self.layout
        };
        let start = offset.min(self.layout.size);
        let crcs = self.new_crcs(file, &new, start, end, data, offset)?;
        self.log_pages(&crcs, None, log)?;
        if let Err(e) = file.write_all_at(data, offset) {
            // Part of it may have landed: take each page as it now is
            // (the write was not acknowledged; its error goes back).
            self.streams
                .forget(offset / new.block, (end - 1) / new.block);
            self.reconcile(file, &crcs);
            return Err(NodeError::Io(e));
        }
        self.apply(new, &crcs);
        self.streams.wrote(&new, offset, data);
        Ok(())
    }

    /// After a failed write: the CRC of each page it would have changed,
    /// as the page now is, and the size the file now has.
    fn reconcile(&mut self, file: &File, planned: &[(Page, u32)]) {
        let Ok(meta) = file.metadata() else { return };
        let new = Layout {
            size: meta.len().max(self.layout.size),
            ..self.layout
        };
        let mut now = Vec::new();
        for (p, _) in planned.iter().filter(|(p, _)| p.offset < new.size) {
            let p = new.page(p.block, p.index);
            let mut buf = vec![0u8; p.len as usize];
            if file.read_exact_at(&mut buf, p.offset).is_ok() {
                now.push((p, page_crc(&buf)));
            }
        }
        self.apply(new, &now);
    }

    /// Cuts or grows the file to `size`: the page at the new end is read,
    /// checked and summed again, new pages are zeros; logged first.
    pub fn truncate(
        &mut self,
        file: &File,
        size: u64,
        log: &mut dyn FnMut(&[Intent]) -> std::io::Result<()>,
    ) -> Result<(), NodeError> {
        if !self.checked() {
            file.set_len(size)?;
            self.layout.size = size;
            return Ok(());
        }
        let old = self.layout;
        if size > old.size.saturating_add(MAX_GROWTH) {
            return Err(NodeError::TooBig);
        }
        let new = Layout { size, ..old };
        let crcs = if size >= old.size {
            // The old last page grows with zeros; new pages are zeros.
            self.new_crcs(file, &new, old.size, size, &[], size)?
        } else if size == 0 {
            Vec::new()
        } else {
            let p = new.page_at(size - 1);
            let was = old.page(p.block, p.index);
            if was.len == p.len {
                Vec::new()
            } else {
                let bytes = self.checked_page(file, &was)?;
                vec![(p, page_crc(&bytes[..p.len as usize]))]
            }
        };
        self.log_pages(&crcs, Some(size), log)?;
        self.streams.resized(new.block, size.min(old.size));
        file.set_len(size)?;
        self.apply(new, &crcs);
        if size < old.size && size > 0 {
            self.touched.insert((size - 1) / new.block);
        }
        let blocks = new.blocks();
        self.touched.retain(|&b| b < blocks);
        if size < old.size {
            // The catalog must drop the blocks past the end.
            self.touched.insert(blocks.saturating_sub(1));
            if blocks == 0 {
                self.touched.clear();
                self.touched.insert(0);
            }
        }
        Ok(())
    }

    fn log_pages(
        &self,
        crcs: &[(Page, u32)],
        size: Option<u64>,
        log: &mut dyn FnMut(&[Intent]) -> std::io::Result<()>,
    ) -> Result<(), NodeError> {
        let Some(row) = &self.row else {
            return Ok(());
        };
        let page = |block: u64, index: usize, crc: u32| Intent::Page {
            file: row.id,
            block,
            index: index as u32,
            crc,
        };
        let mut intents: Vec<Intent> = Vec::new();
        let mut first = BTreeSet::new();
        for (p, _) in crcs {
            if self.derived.contains(&p.block) && first.insert(p.block) {
                // Its other pages' CRCs are in no record yet.
                if let Some(Some(c)) = self.crcs.get(p.block as usize) {
                    intents.extend(c.iter().enumerate().map(|(j, &crc)| page(p.block, j, crc)));
                }
            }
        }
        intents.extend(crcs.iter().map(|(p, crc)| page(p.block, p.index, *crc)));
        if let Some(size) = size {
            intents.push(Intent::Size { file: row.id, size });
        }
        log(&intents)?;
        Ok(())
    }

    fn apply(&mut self, new: Layout, crcs: &[(Page, u32)]) {
        self.layout = new;
        let blocks = new.blocks() as usize;
        self.crcs.resize(blocks, Some(Vec::new()));
        for (b, slot) in self.crcs.iter_mut().enumerate() {
            if let Some(c) = slot {
                c.resize(new.pages_in_block(b as u64), 0);
            }
        }
        for (p, crc) in crcs {
            let slot = &mut self.crcs[p.block as usize];
            if slot.is_none() {
                // A block nothing vouched for: only a rewrite of every one
                // of its pages makes it known again.
                let pages = new.pages_in_block(p.block);
                let mut whole: Vec<Option<u32>> = vec![None; pages];
                for (q, c) in crcs.iter().filter(|(q, _)| q.block == p.block) {
                    whole[q.index] = Some(*c);
                }
                if whole.iter().all(Option::is_some) {
                    *slot = Some(whole.into_iter().flatten().collect());
                }
            }
            if let Some(c) = slot.as_mut() {
                c[p.index] = *crc;
                self.touched.insert(p.block);
            }
        }
    }

    /// Records the touched blocks in the catalog: a block its writes
    /// covered in order takes the digest they fed (`streams.rs`); any
    /// other is read back, its pages checked against the CRCs written
    /// with them, and its digest computed; then the file's size and mtime. Returns the blocks
    /// recorded and the pages that no longer held what was written (their
    /// block is recorded with the CRCs written, so the damage stays
    /// visible).
    pub fn commit(
        &mut self,
        file: &File,
        journal: &Journal,
    ) -> Result<(usize, Vec<Page>), NodeError> {
        let Some(row) = self.row.clone().filter(|_| self.checked()) else {
            let n = self.touched.len();
            self.touched.clear();
            return Ok((n, Vec::new()));
        };
        let mut records = Vec::new();
        let mut bad = Vec::new();
        let mut buf = Vec::new();
        for &b in &self.touched {
            // Past the end, or a block nothing vouches for (its record,
            // failing, stays as it is).
            let Some(Some(crcs)) = self.crcs.get(b as usize).cloned() else {
                continue;
            };
            if let Some(digest) = self.streams.digest(&self.layout, b) {
                // Hashed from the program's buffers as they were written.
                records.push(written_block(b, digest.as_bytes().to_vec(), &crcs));
                continue;
            }
            match rebuild_block(file, &self.layout, b, &crcs, &mut buf) {
                Ok(r) => records.push(r),
                Err(RebuildError::Pages(pages)) => {
                    bad.extend(pages.iter().map(|&j| self.layout.page(b, j)));
                    records.push(failing_block(b, &crcs));
                }
                Err(RebuildError::Io(e)) => return Err(NodeError::Io(e)),
            }
        }
        let meta = file.metadata()?;
        journal.mount_written(
            row.id,
            self.layout.size,
            mtime_of(&meta),
            &records,
            self.layout.blocks(),
        )?;
        if let Some(r) = self.row.as_mut() {
            (r.size, r.mtime, r.digest) = (self.layout.size, mtime_of(&meta), None);
            r.mounted_at = intact_transfer::unix_now();
        }
        let n = self.touched.len();
        for b in std::mem::take(&mut self.touched) {
            self.derived.remove(&b);
        }
        self.streams.committed(&self.layout);
        Ok((n, bad))
    }
}

/// A block recorded without page CRCs: read it, check its digest, and take
/// the CRCs of the bytes that passed (None if it failed).
fn block_checked(
    file: &File,
    layout: &Layout,
    rec: &BlockRecord,
    buf: &mut Vec<u8>,
) -> Result<BlockCrcs, NodeError> {
    if !block_matches(file, layout, rec.index, &rec.digest, buf)? {
        return Ok(None);
    }
    Ok(Some(
        buf.chunks(layout.page as usize).map(page_crc).collect(),
    ))
}

/// Reads into `buf` at `offset` until it is full or the file ends.
fn read_full(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], offset + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use intact_digest::hash;
    use intact_transfer::Journal;
    use proptest::prelude::*;

    /// A journal and a file under a fresh root, the file created through
    /// the catalog as the mount creates it, with 16 KiB blocks.
    struct Fixture {
        _dir: tempfile::TempDir,
        journal: Journal,
        file: File,
        path: std::path::PathBuf,
    }

    fn fixture() -> Fixture {
        fixture_with(16 << 10)
    }

    fn fixture_with(block: u32) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path()).unwrap();
        let path = dir.path().join("f");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let m = file.metadata().unwrap();
        journal.mount_create(b"f", block, mtime_of(&m)).unwrap();
        Fixture {
            _dir: dir,
            journal,
            file,
            path,
        }
    }

    fn load(f: &Fixture) -> Node {
        let row = f.journal.mount_row(b"f").unwrap();
        Node::load(&f.journal, row, &f.file).unwrap()
    }

    fn no_log(_: &[Intent]) -> std::io::Result<()> {
        Ok(())
    }

    #[derive(Debug, Clone)]
    enum Op {
        Write(u64, Vec<u8>),
        Read(u64, u32),
        Truncate(u64),
        Commit,
    }

    /// Offsets near every boundary that matters: pages (4 KiB) and blocks
    /// (16 KiB), and anywhere.
    fn offset() -> impl Strategy<Value = u64> {
        prop_oneof![
            (
                0u64..6,
                prop::sample::select(vec![0i64, 1, -1, 4095, 4096, 4097])
            )
                .prop_map(|(k, d)| (k as i64 * 16384 + d).max(0) as u64),
            0u64..70_000,
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (offset(), prop::collection::vec(any::<u8>(), 0..9000))
                .prop_map(|(o, d)| Op::Write(o, d)),
            3 => (offset(), 0u32..20_000).prop_map(|(o, n)| Op::Read(o, n)),
            1 => offset().prop_map(Op::Truncate),
            1 => Just(Op::Commit),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Writes, reads and truncates through a node match a plain byte
        /// model, and the catalog they leave checks every byte again when
        /// loaded afresh (block digests rebuilt, page CRCs right).
        #[test]
        fn a_node_matches_a_plain_file_and_leaves_a_catalog_that_holds(
            ops in prop::collection::vec(op(), 1..25),
            // 16 KiB blocks, and blocks that are not a multiple of the page.
            block in prop::sample::select(vec![16u32 << 10, 10_000]),
        ) {
            let f = fixture_with(block);
            let mut node = load(&f);
            let mut model: Vec<u8> = Vec::new();
            // What a crash would leave to go by: the CRCs in the catalog
            // and those logged since the last commit.
            let mut logged: Vec<Intent> = Vec::new();
            for op in ops {
                let mut log = |i: &[Intent]| {
                    logged.extend_from_slice(i);
                    Ok(())
                };
                match op {
                    Op::Write(o, d) => {
                        node.write(&f.file, o, &d, &mut log).unwrap();
                        if !d.is_empty() {
                            let end = o as usize + d.len();
                            if model.len() < end {
                                model.resize(end, 0);
                            }
                            model[o as usize..end].copy_from_slice(&d);
                        }
                    }
                    Op::Read(o, n) => {
                        let got = node.read(&f.file, o, n).unwrap();
                        let lo = (o as usize).min(model.len());
                        let hi = (o as usize + n as usize).min(model.len());
                        prop_assert_eq!(got, model[lo..hi].to_vec());
                    }
                    Op::Truncate(s) => {
                        node.truncate(&f.file, s, &mut log).unwrap();
                        model.resize(s as usize, 0);
                    }
                    Op::Commit => {
                        let (_, bad) = node.commit(&f.file, &f.journal).unwrap();
                        prop_assert!(bad.is_empty());
                        logged.clear();
                    }
                }
                covered(&f, block, &logged)?;
            }
            node.commit(&f.file, &f.journal).unwrap();
            prop_assert_eq!(std::fs::read(&f.path).unwrap(), model.clone());
            let fresh = load(&f);
            prop_assert_eq!(fresh.standing, Standing::Cataloged);
            let all = fresh.read(&f.file, 0, model.len() as u32 + 1).unwrap();
            prop_assert_eq!(all, model);
            for rec in f.journal.blocks(fresh.row.as_ref().unwrap().id).unwrap() {
                let mut buf = vec![0u8; fresh.layout.block_len(rec.index) as usize];
                f.file.read_exact_at(&mut buf, rec.index * fresh.layout.block).unwrap();
                let d = hash(defaults::BLOCK_ALGORITHM, &buf);
                prop_assert_eq!(
                    d.as_bytes(),
                    rec.digest.as_slice(),
                    "block {} digest", rec.index
                );
            }
        }
    }

    /// Every page of the file as it is on disk has its CRC either in the
    /// catalog or in the log: what recovery after a crash needs.
    fn covered(f: &Fixture, block: u32, logged: &[Intent]) -> Result<(), TestCaseError> {
        let size = std::fs::metadata(&f.path).unwrap().len();
        let layout = Layout {
            size,
            block: u64::from(block),
            page: 4096,
        };
        let id = f.journal.mount_row(b"f").unwrap().unwrap().id;
        let cataloged: std::collections::HashMap<u64, Vec<u32>> = f
            .journal
            .blocks(id)
            .unwrap()
            .into_iter()
            .map(|b| (b.index, crcs_of_blob(&b.pages.unwrap_or_default())))
            .collect();
        for p in layout.pages(0, size) {
            let mut buf = vec![0u8; p.len as usize];
            f.file.read_exact_at(&mut buf, p.offset).unwrap();
            let actual = page_crc(&buf);
            let in_catalog = cataloged.get(&p.block).and_then(|c| c.get(p.index)) == Some(&actual);
            let in_log = logged.iter().any(|i| {
                matches!(i, Intent::Page { block, index, crc, .. }
                    if (*block, *index as usize, *crc) == (p.block, p.index, actual))
            });
            prop_assert!(
                in_catalog || in_log,
                "page {}/{} at {} has no CRC a crash could go by",
                p.block,
                p.index,
                p.offset
            );
        }
        Ok(())
    }

    /// Flips one bit of the file behind the node's back, its mtime kept
    /// (as rot on a device leaves it).
    fn flip(f: &Fixture, at: u64) {
        let was = f.file.metadata().unwrap().modified().unwrap();
        let mut b = [0u8; 1];
        f.file.read_exact_at(&mut b, at).unwrap();
        b[0] ^= 1;
        f.file.write_all_at(&b, at).unwrap();
        f.file.set_modified(was).unwrap();
    }

    #[test]
    fn a_bad_page_fails_every_read_that_touches_it_and_no_other() {
        let f = fixture();
        let mut node = load(&f);
        let data: Vec<u8> = (0..40_000u32).map(|i| (i * 7) as u8).collect();
        node.write(&f.file, 0, &data, &mut no_log).unwrap();
        node.commit(&f.file, &f.journal).unwrap();
        flip(&f, 5 * 4096 + 9);
        let node = load(&f);
        for (o, n, bad) in [
            (5 * 4096, 1, true),
            (5 * 4096 + 4095, 1, true),
            (6 * 4096 - 1, 2, true),
            (5 * 4096 - 1, 1, false),
            (6 * 4096, 4096, false),
            (0, 5 * 4096, false),
            (4095, 3, false),
        ] {
            match node.read(&f.file, o, n) {
                Err(NodeError::Bad(p)) => {
                    assert!(bad, "read {o}+{n} refused");
                    assert_eq!(p.len(), 1);
                    assert_eq!((p[0].offset, p[0].len), (5 * 4096, 4096));
                }
                Ok(got) => {
                    assert!(!bad, "read {o}+{n} passed over the flipped page");
                    assert_eq!(got, data[o as usize..(o + u64::from(n)) as usize]);
                }
                Err(e) => panic!("{e:?}"),
            }
        }
    }

    /// The digest the catalog holds for each block of the file.
    fn cataloged_digests(f: &Fixture) -> Vec<(u64, Vec<u8>)> {
        let id = f.journal.mount_row(b"f").unwrap().unwrap().id;
        let mut d: Vec<(u64, Vec<u8>)> = f
            .journal
            .blocks(id)
            .unwrap()
            .into_iter()
            .map(|r| (r.index, r.digest))
            .collect();
        d.sort();
        d
    }

    /// A block written whole, in order, gets its digest from the writes:
    /// a byte flipped on disk between the write and the commit is not
    /// read back at the commit (its digest is the written bytes'), and the
    /// next read of that page fails. A block changed out of order is read
    /// back, so the same flip is reported at the commit; and a stream
    /// overtaken by a later write in the middle never gives its old digest.
    #[test]
    fn blocks_written_in_order_take_their_digest_from_the_writes_and_others_are_read_back() {
        let block = 16u64 << 10;
        let data: Vec<u8> = (0..2 * block).map(|i| (i * 7 + i / 4096) as u8).collect();
        let digest = |b: &[u8]| hash(defaults::BLOCK_ALGORITHM, b).as_bytes().to_vec();

        // In order, in three writes cut across the block boundary.
        let f = fixture();
        let mut node = load(&f);
        for (a, b) in [(0, 5_000), (5_000, 20_000), (20_000, 2 * block as usize)] {
            node.write(&f.file, a as u64, &data[a..b], &mut no_log)
                .unwrap();
        }
        flip(&f, 100);
        let (n, bad) = node.commit(&f.file, &f.journal).unwrap();
        assert_eq!((n, bad.len()), (2, 0), "nothing read back at the commit");
        let want = vec![
            (0, digest(&data[..block as usize])),
            (1, digest(&data[block as usize..])),
        ];
        assert_eq!(cataloged_digests(&f), want, "the written bytes' digests");
        assert!(
            matches!(load(&f).read(&f.file, 0, 10), Err(NodeError::Bad(_))),
            "the flipped page fails its next read"
        );

        // Block 1 written from its middle first: read back at the commit.
        let f = fixture();
        let mut node = load(&f);
        let b1 = block as usize;
        node.write(&f.file, 0, &data[..b1], &mut no_log).unwrap();
        node.write(&f.file, block + 8192, &data[b1 + 8192..], &mut no_log)
            .unwrap();
        node.write(&f.file, block, &data[b1..b1 + 8192], &mut no_log)
            .unwrap();
        flip(&f, block + 100);
        let (_, bad) = node.commit(&f.file, &f.journal).unwrap();
        let at: Vec<u64> = bad.iter().map(|p| p.offset).collect();
        assert_eq!(at, vec![block], "the flip found at the commit");

        // A whole block, then a few bytes in its middle: the digest is
        // of the block as it ends up.
        let f = fixture();
        let mut node = load(&f);
        node.write(&f.file, 0, &data[..b1], &mut no_log).unwrap();
        node.write(&f.file, 100, &[0xAB; 100], &mut no_log).unwrap();
        let (_, bad) = node.commit(&f.file, &f.journal).unwrap();
        assert!(bad.is_empty());
        let now = std::fs::read(&f.path).unwrap();
        assert_eq!(&now[100..200], &[0xAB; 100][..]);
        assert_eq!(cataloged_digests(&f), vec![(0, digest(&now))]);

        // A whole block cut short and grown back with zeros.
        let f = fixture();
        let mut node = load(&f);
        node.write(&f.file, 0, &data[..b1], &mut no_log).unwrap();
        node.truncate(&f.file, 8000, &mut no_log).unwrap();
        node.truncate(&f.file, block, &mut no_log).unwrap();
        node.commit(&f.file, &f.journal).unwrap();
        let now = std::fs::read(&f.path).unwrap();
        assert_eq!(now[8000..], vec![0u8; b1 - 8000][..]);
        assert_eq!(cataloged_digests(&f), vec![(0, digest(&now))]);
    }

    /// A write of many blocks leaves CRCs a fresh load checks every byte
    /// against, and one large read finds exactly the flipped pages (first,
    /// middle, last), also where blocks are not a multiple of the page.
    #[test]
    fn a_large_read_finds_exactly_the_bad_pages_a_large_write_left_checkable() {
        for block in [1u32 << 20, 10_000] {
            let f = fixture_with(block);
            let mut node = load(&f);
            let len = (5u64 << 19) + 100;
            let data: Vec<u8> = (0..len).map(|i| (i * 13 + i / 4096) as u8).collect();
            node.write(&f.file, 0, &data, &mut no_log).unwrap();
            node.commit(&f.file, &f.journal).unwrap();
            let node = load(&f);
            assert_eq!(
                node.read(&f.file, 0, len as u32).unwrap(),
                data,
                "block {block}"
            );
            let targets = [3 * 4096 + 5, len / 2, len - 1];
            for &at in &targets {
                flip(&f, at);
            }
            let node = load(&f);
            let want: Vec<u64> = targets
                .iter()
                .map(|&at| node.layout.page_at(at).offset)
                .collect();
            match node.read(&f.file, 0, len as u32) {
                Err(NodeError::Bad(p)) => {
                    let got: Vec<u64> = p.iter().map(|p| p.offset).collect();
                    assert_eq!(got, want, "block {block}");
                }
                r => panic!("block {block}: {r:?}"),
            }
            let clean = node.layout.page_at(len / 2).offset + 4096 * 3;
            let n = (len - 1 - 4096 * 3 - clean) as u32;
            assert_eq!(
                node.read(&f.file, clean, n).unwrap(),
                data[clean as usize..clean as usize + n as usize],
                "block {block}"
            );
        }
    }

    #[test]
    fn a_partial_write_over_a_bad_page_is_refused_and_writes_nothing() {
        let f = fixture();
        let mut node = load(&f);
        node.write(&f.file, 0, &[5u8; 12_000], &mut no_log).unwrap();
        node.commit(&f.file, &f.journal).unwrap();
        flip(&f, 4096 + 1);
        let mut node = load(&f);
        let mut logged = 0;
        let r = node.write(&f.file, 4096 + 100, &[9u8; 10], &mut |i| {
            logged += i.len();
            Ok(())
        });
        assert!(matches!(r, Err(NodeError::Bad(_))), "{r:?}");
        assert_eq!(logged, 0, "nothing logged");
        let mut b = [0u8; 10];
        f.file.read_exact_at(&mut b, 4096 + 100).unwrap();
        assert_eq!(b, [5u8; 10], "nothing written");
        // A write covering the bad page whole needs no old bytes: it
        // replaces them, and the page reads right again.
        node.write(&f.file, 4096, &[7u8; 4096], &mut no_log)
            .unwrap();
        assert_eq!(node.read(&f.file, 4096, 4096).unwrap(), vec![7u8; 4096]);
    }

    #[test]
    fn every_page_a_write_changes_is_logged_before_the_bytes_land() {
        let f = fixture();
        let mut node = load(&f);
        let path = f.path.clone();
        let mut seen = Vec::new();
        // A write past the end: the gap's pages (zeros) are logged too.
        node.write(&f.file, 10_000, &[1u8; 5000], &mut |i| {
            // The bytes are not there yet when the log is written.
            assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
            seen.extend_from_slice(i);
            Ok(())
        })
        .unwrap();
        let pages: Vec<(u64, u32)> = seen
            .iter()
            .map(|i| match i {
                Intent::Page { block, index, .. } => (*block, *index),
                Intent::Size { .. } => panic!("no size change logged for a write"),
            })
            .collect();
        assert_eq!(pages, vec![(0, 0), (0, 1), (0, 2), (0, 3)]);
    }
}

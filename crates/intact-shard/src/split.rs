//! Splitting files larger than a fair share (bytes ÷ shards) into block
//! ranges, each sent by another shard of the same server: the server
//! commits the file once every range has verified (see the receiver's
//! `split.rs`). A file is split only among the shards of one server,
//! because the ranges meet in that server's partial file.

use intact_transfer::{SourceEntry, SourceKind, MAX_RANGES, MAX_RANGE_BLOCKS, MIN_SPLIT_BLOCK};

use crate::plan::ENTRY_COST;

/// One range of a split file, placed in a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The file's index in the scan.
    pub entry: usize,
    /// Its blocks.
    pub first: u64,
    pub end: u64,
    /// The shard that sends it.
    pub shard: usize,
}

/// Where the split files went, and what the shards hold from them.
#[derive(Debug, Default)]
pub struct Placement {
    pub pieces: Vec<Piece>,
    /// Per shard: the weight of its pieces.
    pub loads: Vec<u64>,
    /// Files larger than a fair share left whole, and why.
    pub whole: Vec<(usize, &'static str)>,
}

impl Placement {
    /// Whether entry `i` was split.
    pub fn is_split(&self, i: usize) -> bool {
        self.pieces.iter().any(|p| p.entry == i)
    }
}

/// Splits every file of `items` larger than `bytes ÷ shards` among the
/// shards of the least-loaded server that has two or more (shard I goes to
/// server I mod `servers`), largest file first, each range to a distinct
/// least-loaded shard of that server; ranges are cut at blocks of `block`
/// bytes and hold at most [`MAX_RANGE_BLOCKS`] blocks.
pub fn place(
    entries: &[SourceEntry],
    items: &[usize],
    shards: usize,
    servers: usize,
    block: u64,
) -> Placement {
    let mut out = Placement {
        loads: vec![0; shards],
        ..Placement::default()
    };
    let files: Vec<usize> = items
        .iter()
        .copied()
        .filter(|&i| entries[i].kind == SourceKind::File)
        .collect();
    let total: u128 = files.iter().map(|&i| u128::from(entries[i].size)).sum();
    let fair = u64::try_from(total / shards as u128).unwrap_or(u64::MAX);
    if shards < 2 || fair == 0 {
        return out;
    }
    let mut large: Vec<usize> = files
        .into_iter()
        .filter(|&i| entries[i].size > fair)
        .collect();
    large.sort_by_key(|&i| (std::cmp::Reverse(entries[i].size), i));
    let members = |s: usize| -> Vec<usize> { (s..shards).step_by(servers).collect() };
    for i in large {
        let size = entries[i].size;
        let blocks = size.div_ceil(block);
        if blocks < 2 || block < MIN_SPLIT_BLOCK || !block.is_power_of_two() {
            out.whole
                .push((i, "it is one block, or the block size cannot be split at"));
            continue;
        }
        // The least-loaded server with two shards or more.
        let server = (0..servers.min(shards))
            .filter(|&s| members(s).len() >= 2)
            .min_by_key(|&s| (members(s).iter().map(|&m| out.loads[m]).sum::<u64>(), s));
        let Some(server) = server else {
            out.whole.push((
                i,
                "every server has one shard (a file's ranges must go to one server)",
            ));
            continue;
        };
        let mut own = members(server);
        own.sort_by_key(|&m| (out.loads[m], m));
        let least = blocks.div_ceil(MAX_RANGE_BLOCKS);
        if least > MAX_RANGES {
            out.whole.push((
                i,
                "it would take more ranges than a server accepts for one file",
            ));
            continue;
        }
        let k = size
            .div_ceil(fair)
            .min(own.len() as u64)
            .max(least)
            .clamp(2, blocks);
        // In u128: j × blocks may pass u64 for a (sparse) file of exabytes.
        let cut = |j: u64| (u128::from(j) * u128::from(blocks) / u128::from(k)) as u64;
        for j in 0..k {
            let (first, end) = (cut(j), cut(j + 1));
            let shard = own[(j as usize) % own.len()];
            let bytes = intact_transfer::range_bytes(size, block, first, end);
            out.loads[shard] += bytes + ENTRY_COST;
            out.pieces.push(Piece {
                entry: i,
                first,
                end,
                shard,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use intact_transfer::SourceEntry;

    fn intact_proto_path() -> intact_proto::WirePath {
        intact_proto::WirePath::from_relative(std::path::Path::new("f")).unwrap()
    }

    fn file(size: u64) -> SourceEntry {
        SourceEntry {
            rel: intact_proto_path(),
            abs: "/f".into(),
            kind: SourceKind::File,
            mode: 0o644,
            mtime: intact_transfer::Mtime { sec: 1, nsec: 0 },
            size,
            range: None,
        }
    }

    #[test]
    fn a_large_file_is_cut_at_blocks_among_one_servers_shards() {
        const MIB: u64 = 1 << 20;
        let entries = vec![file(100 * MIB), file(MIB), file(3 * MIB)];
        // 4 shards, 2 servers: server 0 has shards 0 and 2.
        let p = place(&entries, &[0, 1, 2], 4, 2, 4 * MIB);
        let big: Vec<&Piece> = p.pieces.iter().filter(|x| x.entry == 0).collect();
        assert_eq!(big.len(), 2, "{p:?}");
        let mut shards: Vec<usize> = big.iter().map(|x| x.shard).collect();
        shards.sort();
        assert_eq!(shards, [0, 2]);
        assert_eq!(
            (big[0].first, big[0].end, big[1].first, big[1].end),
            (0, 12, 12, 25)
        );
        assert!(!p.is_split(1) && !p.is_split(2));
        // One server per shard: nothing can be split.
        let p = place(&entries, &[0, 1, 2], 2, 2, 4 * MIB);
        assert!(p.pieces.is_empty());
        assert_eq!(p.whole.len(), 1);
        // A (sparse) file too large for the ranges a server accepts stays
        // whole, and sizes near u64::MAX neither overflow nor panic.
        let p = place(
            &[file(u64::MAX / 2), file(u64::MAX / 2)],
            &[0, 1],
            4,
            1,
            4096,
        );
        assert!(p.pieces.is_empty() && p.whole.len() == 2, "{p:?}");
        // A file of one block stays whole.
        let p = place(&[file(MIB), file(10)], &[0, 1], 2, 1, 4 * MIB);
        assert!(p.pieces.is_empty() && p.whole.len() == 1);
    }
}

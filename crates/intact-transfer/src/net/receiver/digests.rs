//! The digest each block of an incoming file verified against, kept as
//! blocks arrive: the memory follows the blocks received, not the count
//! an Entry announced (which the server's budgets bound, see
//! [`crate::net::bounds`]).

use intact_digest::Digest;

/// One slot per block of a file, `None` until the block verified.
#[derive(Debug)]
pub(super) struct BlockDigests {
    count: usize,
    /// The first block of the file that has a slot: 0, or a range's first
    /// block (a range of a split file keeps slots for its own blocks only).
    first: usize,
    /// Slots from block `first` up to the highest block set so far.
    slots: Vec<Option<Digest>>,
}

impl BlockDigests {
    /// A file of `count` blocks, none verified; nothing allocated yet.
    #[cfg(test)]
    pub fn new(count: usize) -> BlockDigests {
        BlockDigests::range(count, 0)
    }

    /// A range of a file of `count` blocks, from block `first`: blocks
    /// before it are outside, as blocks past the end are.
    pub fn range(count: usize, first: usize) -> BlockDigests {
        BlockDigests {
            count,
            first,
            slots: Vec::new(),
        }
    }

    /// Blocks of the file.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Block `index`'s digest if it verified; `None` outside the file.
    pub fn get(&self, index: usize) -> Option<Option<&Digest>> {
        let at = index.checked_sub(self.first)?;
        (index < self.count).then(|| self.slots.get(at).and_then(Option::as_ref))
    }

    /// Sets (or, with `None`, clears) block `index`; false (and nothing
    /// changed) outside the file. Slots grow up to `index` only.
    pub fn set(&mut self, index: usize, digest: Option<Digest>) -> bool {
        let Some(at) = index.checked_sub(self.first).filter(|_| index < self.count) else {
            return false;
        };
        if at >= self.slots.len() {
            if digest.is_none() {
                return true;
            }
            self.slots.resize(at + 1, None);
        }
        self.slots[at] = digest;
        true
    }

    /// The slots from block `first` up to the highest block set (all of
    /// them once every block verified).
    pub fn slots(&self) -> &[Option<Digest>] {
        &self.slots
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use intact_digest::{hash, Algorithm};

    #[test]
    fn slots_grow_with_the_blocks_set_not_the_count_announced() {
        let mut d = BlockDigests::new(1 << 20);
        assert_eq!(d.slots.capacity(), 0);
        let x = hash(Algorithm::Crc32c, b"x");
        assert!(d.set(3, Some(x)));
        assert!(d.slots.len() <= 4);
        assert_eq!(d.get(3), Some(Some(&x)));
        assert_eq!(d.get(5), Some(None));
        assert_eq!(d.get(1 << 20), None);
        assert!(!d.set(1 << 20, Some(x)));
        assert!(d.set(7, None), "clearing past the slots allocates nothing");
        assert!(d.slots.len() <= 4);
        assert_eq!(d.slots().iter().filter(|s| s.is_some()).count(), 1);
        assert_eq!(d.len(), 1 << 20);
    }

    #[test]
    fn a_range_has_slots_for_its_own_blocks_only() {
        let mut d = BlockDigests::range(1 << 20, (1 << 20) - 2);
        let x = hash(Algorithm::Crc32c, b"x");
        assert!(d.set((1 << 20) - 1, Some(x)));
        assert!(d.slots.len() <= 2, "{}", d.slots.len());
        assert_eq!(d.get((1 << 20) - 1), Some(Some(&x)));
        assert_eq!(d.get((1 << 20) - 2), Some(None));
        assert_eq!(d.get(5), None, "before the range");
        assert!(!d.set(5, Some(x)));
    }
}

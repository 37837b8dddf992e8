//! Whether anyone dropped the machine's caches while a cell ran.
//!
//! Many cells depend on what the page cache holds (a good copy hiding a
//! flipped bit on the device, a wrong page hiding the source's right
//! bytes). A `echo 3 > /proc/sys/vm/drop_caches` by another job on the
//! machine (benchmarks do it) in the middle of a cell changes the fault:
//! a MISSED turns into a "repaired", a LIE into a pass. The kernel counts
//! those drops in `/proc/vmstat` (`drop_pagecache`), so a cell whose fault
//! is cache-sensitive ([`crate::Fault::cache_sensitive`]) and during which
//! the count moved is run again.

/// How many times a cell is run when a global cache drop disturbs it.
pub(crate) const ATTEMPTS: u32 = 5;

/// The kernel's count of global page-cache drops, if it keeps one.
pub(crate) fn cache_drops() -> Option<u64> {
    std::fs::read_to_string("/proc/vmstat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("drop_pagecache "))?
        .trim()
        .parse()
        .ok()
}

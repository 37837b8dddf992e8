//! What a `--delete` keep list costs the server per path, read from the
//! allocator (glibc's `mallinfo2`, every arena): the same for 4,000-byte
//! paths as for 4-byte ones, and within what the server charges
//! ([`KEEP_PATH_COST`]). Its own test binary, one test: nothing else
//! allocates meanwhile.

use intact_transfer::{KeepSet, KEEP_PATH_COST};

/// Bytes allocated and in use now: from the arenas and in mappings of
/// their own (large blocks).
fn in_use() -> u64 {
    // SAFETY: mallinfo2 only reads the allocator's counters.
    let m = unsafe { libc::mallinfo2() };
    (m.uordblks + m.hblkhd) as u64
}

/// Heap bytes per path of a set of `n` paths of `len` bytes (one path
/// buffer, rewritten for each, so only the set's memory is counted).
fn per_path(n: u32, len: usize) -> f64 {
    let mut path = vec![b'x'; len];
    let before = in_use();
    let mut set = KeepSet::default();
    for i in 0..n {
        path[..4].copy_from_slice(&i.to_be_bytes());
        set.insert(&path);
    }
    let grew = in_use().saturating_sub(before);
    assert_eq!(set.len(), n as usize);
    grew as f64 / f64::from(n)
}

#[test]
fn a_kept_path_costs_the_same_whatever_its_length_and_no_more_than_charged() {
    let short = per_path(200_000, 4);
    let long = per_path(200_000, 4000);
    eprintln!("bytes per kept path: {short:.1} (4-byte paths), {long:.1} (4,000-byte paths)");
    assert!(short > 0.0, "the allocator's counter did not move");
    assert!((long - short).abs() < 1.0, "{short} vs {long}");
    assert!(long <= KEEP_PATH_COST as f64, "{long} > {KEEP_PATH_COST}");
}

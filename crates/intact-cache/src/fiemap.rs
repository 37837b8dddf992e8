//! Physical extents of a file (FIEMAP), for fault injection under a file.

use std::fs::File;
use std::os::fd::AsRawFd;

use crate::CacheError;

/// One extent: `length` bytes at file offset `logical` live at byte
/// `physical` of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Offset in the file.
    pub logical: u64,
    /// Offset on the device.
    pub physical: u64,
    /// Bytes.
    pub length: u64,
    /// FIEMAP_EXTENT_* flags.
    pub flags: u32,
}

impl Extent {
    /// Data not yet allocated, inline, encoded or otherwise not at a plain
    /// device offset: changing `physical` would not change the file.
    pub fn is_plain(&self) -> bool {
        // UNKNOWN | DELALLOC | ENCODED | DATA_ENCRYPTED | NOT_ALIGNED | DATA_INLINE | UNWRITTEN
        const NOT_PLAIN: u32 = 0x2 | 0x4 | 0x8 | 0x80 | 0x100 | 0x200 | 0x800;
        self.flags & NOT_PLAIN == 0
    }
}

const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
const FIEMAP_FLAG_SYNC: u32 = 0x1;
const FIEMAP_EXTENT_LAST: u32 = 0x1;
const BATCH: usize = 64;

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawExtent {
    logical: u64,
    physical: u64,
    length: u64,
    reserved64: [u64; 2],
    flags: u32,
    reserved: [u32; 3],
}

#[repr(C)]
struct RawMap {
    start: u64,
    length: u64,
    flags: u32,
    mapped: u32,
    count: u32,
    reserved: u32,
    extents: [RawExtent; BATCH],
}

/// Every extent of `file` (flushed first, so delayed allocations are real).
pub fn extents(file: &File) -> Result<Vec<Extent>, CacheError> {
    let mut out = Vec::new();
    let mut start = 0u64;
    loop {
        let mut map = RawMap {
            start,
            length: u64::MAX - start,
            flags: FIEMAP_FLAG_SYNC,
            mapped: 0,
            count: BATCH as u32,
            reserved: 0,
            extents: [RawExtent::default(); BATCH],
        };
        // SAFETY: the ioctl fills at most `count` extents of our struct.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_FIEMAP, &mut map as *mut RawMap) };
        if r != 0 {
            return Err(CacheError::last("ioctl(FIEMAP)"));
        }
        let got = &map.extents[..map.mapped as usize];
        for e in got {
            out.push(Extent {
                logical: e.logical,
                physical: e.physical,
                length: e.length,
                flags: e.flags,
            });
        }
        match got.last() {
            Some(e) if e.flags & FIEMAP_EXTENT_LAST == 0 => start = e.logical + e.length,
            _ => return Ok(out),
        }
    }
}

/// The device offset of file offset `logical`, if it lies in a plain extent.
pub fn physical_offset(file: &File, logical: u64) -> Result<Option<u64>, CacheError> {
    Ok(extents(file)?
        .into_iter()
        .find(|e| e.is_plain() && e.logical <= logical && logical < e.logical + e.length)
        .map(|e| e.physical + (logical - e.logical)))
}

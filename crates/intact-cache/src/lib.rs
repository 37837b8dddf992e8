//! Page-cache control for device-level verification.
//!
//! A checksum computed right after a write reads the page cache, not the
//! device, so it cannot see what the device stored (the RIVA paper, Sec. 2).
//! This crate makes a verification read reach the device and proves it did:
//!
//! - [`evict`] flushes a byte range (dirty pages cannot be dropped), drops
//!   it with `POSIX_FADV_DONTNEED`, and confirms with [`resident`]
//!   (`cachestat`, or `mincore` where the kernel lacks it), a bounded
//!   number of rounds; it returns an [`Eviction`]
//!   that counts the pages still resident. [`resident`] only counts.
//! - [`ReadPath`] is how a verification read reaches the data: evict then
//!   read, `O_DIRECT`, or the cache. It is a value to choose, log and report.
//! - [`DeviceReader`] reads ranges of one file by a [`ReadPath`], falls back
//!   from `O_DIRECT` to evict-then-read when the file system refuses it, and
//!   says per read what it really did ([`ReadOutcome`]).
//! - [`backing`] tells whether a device read is possible at all under a
//!   file: tmpfs has no device, and on network, FUSE and ZFS file systems
//!   eviction does not reach the bytes' real home ([`Backing`]).
//! - [`DeviceCounter`] reads the block device's own count of bytes
//!   written, so that a re-read can wait until a device's write cache has
//!   turned over (`--verify flash`).
//! - [`extents`] lists a file's physical extents (FIEMAP), so that tests
//!   and the fault lab can change bytes on the device under a file.

mod backing;
mod counter;
mod evict;
mod fiemap;
mod read;

pub use backing::{backing, backing_on, Backing};
pub use counter::DeviceCounter;
pub use evict::{evict, resident, start_writeback, Eviction, PAGE};
pub use fiemap::{extents, physical_offset, Extent};
pub use read::{prefetch, DeviceReader, Prepared, ReadOutcome, ReadPath};

/// What went wrong, and in which system call.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A system call failed.
    #[error("{op}: {source}")]
    Io {
        /// The call.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl CacheError {
    pub(crate) fn last(op: &'static str) -> CacheError {
        CacheError::Io {
            op,
            source: std::io::Error::last_os_error(),
        }
    }
}

impl From<CacheError> for std::io::Error {
    fn from(e: CacheError) -> std::io::Error {
        match e {
            CacheError::Io { op, source } => {
                std::io::Error::new(source.kind(), format!("{op}: {source}"))
            }
        }
    }
}

//! Whether a read can reach a device under a file at all.

use std::fs::File;
use std::os::fd::AsRawFd;

use crate::CacheError;

/// What lies under a file's page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Backing {
    /// A local block-device file system: an evicted page is read back from
    /// the device.
    Device {
        /// File-system name, for reports.
        fs: &'static str,
    },
    /// No read can be proven to reach a device: the best level is `cache`.
    CacheOnly {
        /// File-system name.
        fs: &'static str,
        /// Why, in a few words.
        why: &'static str,
    },
    /// A file system intact does not know: it is not assumed to have a
    /// device (it may be a network, FUSE or in-memory one), so the best
    /// level is `cache`.
    Unknown {
        /// Its `statfs` magic number.
        magic: u32,
    },
}

impl Backing {
    /// Whether an evicted page is read back from a device.
    pub fn has_device(self) -> bool {
        matches!(self, Backing::Device { .. })
    }

    /// Whether the file system keeps its data in memory (tmpfs, ramfs):
    /// there is no device at all, pages cannot be dropped, so an eviction
    /// there only spends its retries and back-off for nothing.
    pub fn in_memory(self) -> bool {
        matches!(self, Backing::CacheOnly { fs, .. } if NO_DEVICE.iter().any(|(_, n)| *n == fs))
    }

    /// The file system's name.
    pub fn fs(self) -> &'static str {
        match self {
            Backing::Device { fs } | Backing::CacheOnly { fs, .. } => fs,
            Backing::Unknown { .. } => "unknown",
        }
    }

    /// Why no read under this file can be proven to reach a device (None
    /// when one can).
    pub fn no_device_reason(self) -> Option<String> {
        match self {
            Backing::Device { .. } => None,
            Backing::CacheOnly { fs, why } => Some(format!("{fs}: {why}")),
            Backing::Unknown { magic } => Some(format!(
                "an unknown file system 0x{magic:x}: not assumed to have a device"
            )),
        }
    }
}

// statfs(2) magic numbers (linux/magic.h and the file systems' own headers).
const NO_DEVICE: &[(i64, &str)] = &[
    (0x0102_1994, "tmpfs"),
    (0x8584_58f6, "ramfs"),
    (0x6265_6572, "sysfs"),
    (0x9fa0, "proc"),
];
const REMOTE: &[(i64, &str)] = &[
    (0x6969, "nfs"),
    (0x6573_5546, "fuse"),
    (0x517b, "smb"),
    (0xfe53_4d42, "smb2"),
    (0xff53_4d42, "cifs"),
    (0x0102_1997, "9p"),
    (0x00c3_6400, "ceph"),
    (0x5346_414f, "afs"),
    (0x7375_7245, "coda"),
    (0x0bd0_0bd0, "lustre"),
    (0x4750_4653, "gpfs"),
    (0x1983_0326, "beegfs"),
];
const OWN_CACHE: &[(i64, &str)] = &[(0x2fc1_2fc1, "zfs")];
// A stacked file system: the layer under it may be anything (a tmpfs, as
// in many containers), and its statfs magic does not say which.
const STACKED: &[(i64, &str)] = &[(0x794c_7630, "overlay")];
const KNOWN_LOCAL: &[(i64, &str)] = &[
    (0xef53, "ext4"),
    (0x5846_5342, "xfs"),
    (0x9123_683e, "btrfs"),
    (0xf2f5_2010, "f2fs"),
    (0x4d44, "vfat"),
    (0x2011_bab0, "exfat"),
    (0x3153_464a, "jfs"),
    (0xe0f5_e1e2, "erofs"),
    (0x7371_7368, "squashfs"),
    (0x0116_1970, "gfs2"),
    (0x7461_636f, "ocfs2"),
    (0x4244, "hfs"),
    (0x5346_544e, "ntfs"),
];

/// What lies under `file`, from `fstatfs`.
pub fn backing(file: &File) -> Result<Backing, CacheError> {
    // SAFETY: fstatfs fills the zeroed struct we own.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd, valid pointer.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } != 0 {
        return Err(CacheError::last("fstatfs"));
    }
    Ok(classify(st.f_type as i64 & 0xffff_ffff))
}

/// How long a thread keeps an answer of [`backing_on`].
pub const BACKING_KEPT: std::time::Duration = std::time::Duration::from_secs(1);

/// As [`backing`], for `file` on the file system whose device number
/// (`st_dev`) is `dev`: a thread asks the kernel again only when the file
/// system differs from the last one it asked about, or that answer is
/// older than [`BACKING_KEPT`], so a reader of many files of one file
/// system saves an `fstatfs` per file.
///
/// A device number names one file system only while it is mounted: an
/// unmounted one's number may be given to the next (btrfs, NFS, FUSE and
/// overlay draw from one pool). An answer is kept for a second only, so
/// it could describe the wrong file system only if, within that second,
/// the file system it was asked for was unmounted (none of its files
/// open) and another of a different kind was mounted under the same
/// number and read from by the same thread.
pub fn backing_on(file: &File, dev: u64) -> Result<Backing, CacheError> {
    thread_local! {
        static LAST: std::cell::Cell<Option<(u64, Backing, std::time::Instant)>> =
            const { std::cell::Cell::new(None) };
    }
    match LAST.get() {
        Some((d, b, at)) if d == dev && at.elapsed() < BACKING_KEPT => Ok(b),
        _ => {
            let b = backing(file)?;
            LAST.set(Some((dev, b, std::time::Instant::now())));
            Ok(b)
        }
    }
}

fn classify(magic: i64) -> Backing {
    let find =
        |table: &[(i64, &'static str)]| table.iter().find(|(m, _)| *m == magic).map(|(_, n)| *n);
    if let Some(fs) = find(NO_DEVICE) {
        return Backing::CacheOnly {
            fs,
            why: "the file system keeps its data in memory; there is no device to read",
        };
    }
    if let Some(fs) = find(REMOTE) {
        return Backing::CacheOnly {
            fs,
            why: "a network or FUSE file system: eviction only reaches the local cache, not the storage",
        };
    }
    if let Some(fs) = find(STACKED) {
        return Backing::CacheOnly {
            fs,
            why: "a stacked file system: the device of the layer under it is not known",
        };
    }
    if let Some(fs) = find(OWN_CACHE) {
        return Backing::CacheOnly {
            fs,
            why: "the file system caches data outside the page cache (ZFS ARC), where eviction does not reach",
        };
    }
    match find(KNOWN_LOCAL) {
        Some(fs) => Backing::Device { fs },
        None => Backing::Unknown {
            magic: magic as u32,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_the_kinds() {
        assert_eq!(classify(0xef53), Backing::Device { fs: "ext4" });
        assert!(!classify(0x0102_1994).has_device());
        assert!(classify(0x0102_1994).in_memory());
        assert!(!classify(0x6969).in_memory() && !classify(0xef53).in_memory());
        assert!(
            !classify(0x794c_7630).in_memory(),
            "overlay may sit on a disk"
        );
        assert_eq!(classify(0x6969).fs(), "nfs");
        assert!(!classify(0x2fc1_2fc1).has_device());
        assert_eq!(classify(0x1234), Backing::Unknown { magic: 0x1234 });
        assert!(!classify(0x1234).has_device());
        assert!(classify(0x1234)
            .no_device_reason()
            .unwrap()
            .contains("unknown file system 0x1234"));
    }

    #[test]
    fn a_tmpfs_is_cache_only() {
        // A tmpfs the test mounted (root) or saw to be one (/dev/shm).
        let Some(tmp) = intact_testkit::tmpfs("a_tmpfs_is_cache_only") else {
            return;
        };
        let f = tempfile::tempfile_in(tmp.path()).unwrap();
        assert_eq!(backing(&f).unwrap().fs(), "tmpfs");
        assert!(!backing(&f).unwrap().has_device());
    }

    #[test]
    fn backing_on_asks_again_for_another_file_system() {
        use std::os::unix::fs::MetadataExt;
        let Some(tmp) = intact_testkit::tmpfs("backing_on_asks_again_for_another_file_system")
        else {
            return;
        };
        let in_memory = tempfile::tempfile_in(tmp.path()).unwrap();
        // The test's own binary: on the build's file system, not the tmpfs.
        let other = File::open(std::env::current_exe().unwrap()).unwrap();
        let dev = |f: &File| f.metadata().unwrap().dev();
        assert_ne!(dev(&in_memory), dev(&other));
        assert!(
            !backing(&other).unwrap().in_memory(),
            "the build is not on a tmpfs"
        );
        // Alternating: each answer is its own file system's, never the
        // one asked about just before.
        for _ in 0..2 {
            assert!(backing_on(&in_memory, dev(&in_memory)).unwrap().in_memory());
            assert_eq!(
                backing_on(&other, dev(&other)).unwrap(),
                backing(&other).unwrap()
            );
        }
        // Kept for the device: a file of another file system presented as
        // the same device gets the kept answer (which is why callers pass
        // the file's own st_dev).
        assert!(backing_on(&in_memory, dev(&in_memory)).unwrap().in_memory());
        assert!(backing_on(&other, dev(&in_memory)).unwrap().in_memory());
        // Kept no longer than BACKING_KEPT: asked again after it.
        std::thread::sleep(BACKING_KEPT);
        assert!(!backing_on(&other, dev(&in_memory)).unwrap().in_memory());
    }
}

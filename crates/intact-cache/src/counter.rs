//! The block device's own count of bytes written, for verification that
//! waits until a device's write cache has turned over (`--verify flash`).
//!
//! Linux keeps, per block device, the sectors written since boot
//! (`/sys/dev/block/MAJ:MIN/stat`, field 7, in 512-byte units whatever the
//! device's sector size). That counter sees every writer's traffic to the
//! device, which is what pushes a block out of an SSD's DRAM buffer, not
//! only intact's. A partition's counter sees only the partition, so the
//! whole disk's is used: the write buffer belongs to the disk.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::CacheError;

/// Sysfs's unit for sector counts and sizes.
const SECTOR: u64 = 512;

/// The counter of bytes written to the block device under a file.
#[derive(Debug, Clone)]
pub struct DeviceCounter {
    name: String,
    stat: PathBuf,
    capacity: u64,
}

impl DeviceCounter {
    /// The counter of the whole block device holding `file`; None where
    /// the file system has no block device in sysfs (tmpfs, btrfs's
    /// anonymous device numbers, network and FUSE file systems).
    pub fn for_file(file: &File) -> Result<Option<DeviceCounter>, CacheError> {
        let meta = file.metadata().map_err(|source| CacheError::Io {
            op: "fstat",
            source,
        })?;
        let dev = meta.dev();
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        Ok(Self::under(
            Path::new("/sys/dev/block"),
            &format!("{major}:{minor}"),
        ))
    }

    /// The counter for device `majmin` as `sysfs_dev_block` lists it
    /// (separate so that a test can point it at a made-up tree).
    fn under(sysfs_dev_block: &Path, majmin: &str) -> Option<DeviceCounter> {
        let mut dir = std::fs::canonicalize(sysfs_dev_block.join(majmin)).ok()?;
        if dir.join("partition").exists() {
            dir = dir.parent()?.to_path_buf();
        }
        let name = dir.file_name()?.to_string_lossy().into_owned();
        let sectors: u64 = std::fs::read_to_string(dir.join("size"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let c = DeviceCounter {
            name,
            stat: dir.join("stat"),
            capacity: sectors * SECTOR,
        };
        c.bytes_written().ok()?;
        Some(c)
    }

    /// The device's name (`sda`, `nvme0n1`, `loop3`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The whole device's capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes written to the device since boot, by anyone.
    pub fn bytes_written(&self) -> Result<u64, CacheError> {
        let text = std::fs::read_to_string(&self.stat).map_err(|source| CacheError::Io {
            op: "reading the device's stat",
            source,
        })?;
        parse_sectors_written(&text)
            .map(|s| s.saturating_mul(SECTOR))
            .ok_or_else(|| CacheError::Io {
                op: "reading the device's stat",
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("no sectors-written field in {}", self.stat.display()),
                ),
            })
    }
}

/// Field 7 of a block device's `stat` (Documentation/block/stat.rst).
fn parse_sectors_written(stat: &str) -> Option<u64> {
    stat.split_whitespace().nth(6)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn the_sectors_written_are_the_seventh_field() {
        let line = "    5390     2759   735394     4274      641     4084    88456      687        0     2148     5233     3071       14    38224      268       45        3\n";
        assert_eq!(parse_sectors_written(line), Some(88456));
        assert_eq!(parse_sectors_written("1 2 3"), None);
        assert_eq!(parse_sectors_written("1 2 3 4 5 6 x"), None);
    }

    #[test]
    fn a_partition_counts_with_its_whole_disk() {
        // A made-up sysfs: dev/block/8:1 -> devices/sda/sda1 (a partition).
        let t = tempfile::tempdir().unwrap();
        let disk = t.path().join("devices/sda");
        let part = disk.join("sda1");
        std::fs::create_dir_all(&part).unwrap();
        std::fs::write(part.join("partition"), "1\n").unwrap();
        std::fs::write(part.join("size"), "100\n").unwrap();
        std::fs::write(part.join("stat"), "0 0 0 0 0 0 7 0\n").unwrap();
        std::fs::write(disk.join("size"), "2000\n").unwrap();
        let mut stat = File::create(disk.join("stat")).unwrap();
        stat.write_all(b"0 0 0 0 0 0 1000 0\n").unwrap();
        let by = t.path().join("dev/block");
        std::fs::create_dir_all(&by).unwrap();
        std::os::unix::fs::symlink(&part, by.join("8:1")).unwrap();
        let c = DeviceCounter::under(&by, "8:1").unwrap();
        assert_eq!(c.name(), "sda");
        assert_eq!(c.capacity(), 2000 * 512);
        assert_eq!(c.bytes_written().unwrap(), 1000 * 512);
        // A device sysfs does not list has no counter.
        assert!(DeviceCounter::under(&by, "9:9").is_none());
    }
}

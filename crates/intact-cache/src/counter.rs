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

/// One disk under a file system: its name, its `stat`, its capacity.
#[derive(Debug, Clone)]
struct Leaf {
    name: String,
    stat: PathBuf,
    capacity: u64,
}

/// The counters of bytes written to the disks under a file: one disk, or
/// for a stacked device (LVM and other device-mapper targets, md RAID)
/// every disk it is built on, each of which has its own write cache.
#[derive(Debug, Clone)]
pub struct DeviceCounter {
    name: String,
    leaves: Vec<Leaf>,
}

impl DeviceCounter {
    /// The counters of the disks holding `file`; None where the file
    /// system has no block device in sysfs (tmpfs, btrfs's anonymous
    /// device numbers, network and FUSE file systems). An error reading
    /// sysfs is an error, not "no device".
    pub fn for_file(file: &File) -> Result<Option<DeviceCounter>, CacheError> {
        let meta = file.metadata().map_err(|source| CacheError::Io {
            op: "fstat",
            source,
        })?;
        let dev = meta.dev();
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        Self::under(Path::new("/sys"), &format!("{major}:{minor}")).map_err(|source| {
            CacheError::Io {
                op: "reading the block device's sysfs",
                source,
            }
        })
    }

    /// The counters for device `majmin` in the sysfs tree at `sys` (a
    /// parameter so that a test can point it at a made-up tree).
    fn under(sys: &Path, majmin: &str) -> std::io::Result<Option<DeviceCounter>> {
        let dir = match std::fs::canonicalize(sys.join("dev/block").join(majmin)) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let dir = whole_disk(dir);
        let name = dir_name(&dir);
        let mut leaves = Vec::new();
        collect_leaves(sys, &dir, &mut leaves, 0)?;
        let c = DeviceCounter { name, leaves };
        c.bytes_written()?;
        Ok(Some(c))
    }

    /// The device's name (`sda`, `nvme0n1`, `loop3`, `dm-0`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The disks counted: the device itself, or those it is built on.
    pub fn disks(&self) -> Vec<&str> {
        self.leaves.iter().map(|l| l.name.as_str()).collect()
    }

    /// The largest disk's capacity in bytes (each disk's write cache is
    /// its own; the largest one's is the longest to turn over).
    pub fn capacity(&self) -> u64 {
        self.leaves.iter().map(|l| l.capacity).max().unwrap_or(0)
    }

    /// Bytes written to each disk since boot, by anyone, in the order of
    /// [`DeviceCounter::disks`].
    pub fn bytes_written(&self) -> std::io::Result<Vec<u64>> {
        self.leaves
            .iter()
            .map(|l| {
                let text = std::fs::read_to_string(&l.stat)?;
                parse_sectors_written(&text)
                    .map(|s| s.saturating_mul(SECTOR))
                    .ok_or_else(|| {
                        std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            format!("no sectors-written field in {}", l.stat.display()),
                        )
                    })
            })
            .collect()
    }
}

/// A partition's disk, else the device itself.
fn whole_disk(dir: PathBuf) -> PathBuf {
    match dir.parent() {
        Some(parent) if dir.join("partition").exists() => parent.to_path_buf(),
        _ => dir,
    }
}

fn dir_name(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The disks under `dir`: itself where it is built on nothing (its
/// `slaves` is empty or absent), else the disks under each of those.
fn collect_leaves(sys: &Path, dir: &Path, out: &mut Vec<Leaf>, depth: u32) -> std::io::Result<()> {
    if depth > 16 {
        return Err(std::io::Error::other(
            "block devices stacked more than 16 deep",
        ));
    }
    let mut below = Vec::new();
    match std::fs::read_dir(dir.join("slaves")) {
        Ok(entries) => {
            for e in entries {
                below.push(e?.file_name());
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    if below.is_empty() {
        let name = dir_name(dir);
        if out.iter().any(|l| l.name == name) {
            return Ok(());
        }
        let sectors: u64 = std::fs::read_to_string(dir.join("size"))?
            .trim()
            .parse()
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "bad size"))?;
        out.push(Leaf {
            name,
            stat: dir.join("stat"),
            capacity: sectors * SECTOR,
        });
        return Ok(());
    }
    below.sort();
    for b in below {
        let d = whole_disk(std::fs::canonicalize(sys.join("class/block").join(&b))?);
        collect_leaves(sys, &d, out, depth + 1)?;
    }
    Ok(())
}

/// Field 7 of a block device's `stat` (Documentation/block/stat.rst).
fn parse_sectors_written(stat: &str) -> Option<u64> {
    stat.split_whitespace().nth(6)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sectors_written_are_the_seventh_field() {
        let line = "    5390     2759   735394     4274      641     4084    88456      687        0     2148     5233     3071       14    38224      268       45        3\n";
        assert_eq!(parse_sectors_written(line), Some(88456));
        assert_eq!(parse_sectors_written("1 2 3"), None);
        assert_eq!(parse_sectors_written("1 2 3 4 5 6 x"), None);
    }

    /// A made-up sysfs: `devices/NAME` with `size` (sectors) and `stat`
    /// (sectors written), linked from `dev/block/MAJ:MIN` and
    /// `class/block/NAME`.
    fn disk(sys: &Path, path: &str, majmin: &str, size: u64, written: u64) -> PathBuf {
        let dir = sys.join("devices").join(path);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("size"), format!("{size}\n")).unwrap();
        std::fs::write(dir.join("stat"), format!("0 0 0 0 0 0 {written} 0\n")).unwrap();
        for (d, n) in [
            ("dev/block", majmin),
            ("class/block", path.rsplit('/').next().unwrap()),
        ] {
            std::fs::create_dir_all(sys.join(d)).unwrap();
            std::os::unix::fs::symlink(&dir, sys.join(d).join(n)).unwrap();
        }
        dir
    }

    /// Disk sda of `size` sectors, `written` so far, with partition sda1.
    fn sda_with_sda1(sys: &Path, size: u64, written: u64) {
        disk(sys, "sda", "8:0", size, written);
        let part = disk(sys, "sda/sda1", "8:1", 100, 7);
        std::fs::write(part.join("partition"), "1\n").unwrap();
    }

    #[test]
    fn a_partition_counts_with_its_whole_disk() {
        let t = tempfile::tempdir().unwrap();
        let sys = t.path();
        sda_with_sda1(sys, 2000, 1000);
        let c = DeviceCounter::under(sys, "8:1").unwrap().unwrap();
        assert_eq!((c.name(), c.disks()), ("sda", vec!["sda"]));
        assert_eq!(c.capacity(), 2000 * 512);
        assert_eq!(c.bytes_written().unwrap(), vec![1000 * 512]);
        // A device sysfs does not list has no counter.
        assert!(DeviceCounter::under(sys, "9:9").unwrap().is_none());
    }

    #[test]
    fn a_stacked_device_counts_each_disk_it_is_built_on() {
        // dm-0 (LVM) over a partition of sda and over sdb.
        let t = tempfile::tempdir().unwrap();
        let sys = t.path();
        sda_with_sda1(sys, 4000, 10);
        disk(sys, "sdb", "8:16", 8000, 20);
        let dm = disk(sys, "dm-0", "253:0", 500, 99);
        std::fs::create_dir_all(dm.join("slaves")).unwrap();
        for s in ["sda1", "sdb"] {
            std::os::unix::fs::symlink(sys.join("class/block").join(s), dm.join("slaves").join(s))
                .unwrap();
        }
        let c = DeviceCounter::under(sys, "253:0").unwrap().unwrap();
        assert_eq!((c.name(), c.disks()), ("dm-0", vec!["sda", "sdb"]));
        assert_eq!(c.capacity(), 8000 * 512, "the largest disk's");
        assert_eq!(c.bytes_written().unwrap(), vec![10 * 512, 20 * 512]);
    }
}

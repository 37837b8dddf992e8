//! An ext4 of the benchmark's own on a loop device, formatted and mounted
//! for one benchmark run, then unmounted, detached and deleted on every way
//! out (an error, a stop asked for by SIGINT/SIGTERM, the end):
//! - in RAM ([`LoopExt4::in_ram`]: a file in /dev/shm): the same file
//!   system as on the disk, with the device time taken out; what is left is
//!   the tools' own cost;
//! - on the disk ([`LoopExt4::on_disk`]: a file in the benchmark's
//!   directory, the loop device doing direct I/O so that nothing is cached
//!   twice): a fresh, journaled ext4 on the real device, whatever the file
//!   system holding the directory is (this machine's root is an ext4
//!   without a journal, see `transfer`'s note on it).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use crate::transfer::run_cmd;

const PREFIX: &str = "intact-bench-ram-";
const DISK_PREFIX: &str = "intact-bench-ext4-";

pub struct LoopExt4 {
    /// Where the file system is mounted.
    pub mount: PathBuf,
    image: PathBuf,
    loopdev: Option<String>,
    mounted: bool,
}

impl LoopExt4 {
    /// Makes, formats and mounts a RAM-backed ext4 of `mib` MiB.
    pub fn in_ram(mib: u64) -> anyhow::Result<LoopExt4> {
        remove_stale(Path::new("/dev/shm"), PREFIX);
        let pid = std::process::id();
        LoopExt4::make(
            PathBuf::from(format!("/dev/shm/{PREFIX}{pid}.img")),
            PathBuf::from(format!("/var/tmp/{PREFIX}{pid}")),
            false,
            mib,
        )
    }

    /// Makes, formats and mounts an ext4 of `mib` MiB in a file in `dir`
    /// (on the disk), its loop device doing direct I/O.
    pub fn on_disk(dir: &Path, mib: u64) -> anyhow::Result<LoopExt4> {
        std::fs::create_dir_all(dir)?;
        remove_stale(dir, DISK_PREFIX);
        let pid = std::process::id();
        LoopExt4::make(
            dir.join(format!("{DISK_PREFIX}{pid}.img")),
            dir.join(format!("{DISK_PREFIX}{pid}")),
            true,
            mib,
        )
    }

    fn make(image: PathBuf, mount: PathBuf, direct: bool, mib: u64) -> anyhow::Result<LoopExt4> {
        let mut r = LoopExt4 {
            mount,
            image,
            loopdev: None,
            mounted: false,
        };
        std::fs::File::create(&r.image)?.set_len(mib << 20)?;
        let mut losetup = Command::new("losetup");
        losetup.args(["--find", "--show"]);
        if direct {
            losetup.arg("--direct-io=on");
        }
        let out = losetup.arg(&r.image).output().context("losetup")?;
        if !out.status.success() {
            anyhow::bail!("losetup: {}", String::from_utf8_lossy(&out.stderr));
        }
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        r.loopdev = Some(dev.clone());
        // Initialised now, so that no background thread writes to it later.
        run_cmd(Command::new("mkfs.ext4").args([
            "-q",
            "-F",
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0",
            &dev,
        ]))?;
        std::fs::create_dir_all(&r.mount)?;
        run_cmd(Command::new("mount").arg(&dev).arg(&r.mount))?;
        r.mounted = true;
        Ok(r)
    }
}

impl Drop for LoopExt4 {
    fn drop(&mut self) {
        if self.mounted {
            unmount(&self.mount);
        }
        if let Some(dev) = &self.loopdev {
            let _ = Command::new("losetup").args(["-d", dev]).status();
        }
        let _ = std::fs::remove_file(&self.image);
        let _ = std::fs::remove_dir(&self.mount);
    }
}

fn unmount(mount: &Path) {
    let _ = Command::new("sync").status();
    let ok = Command::new("umount")
        .arg(mount)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        let _ = Command::new("umount").arg("-l").arg(mount).status();
    }
}

/// Removes what a benchmark killed by SIGKILL left: mounts, loop devices
/// and images (`dir/PREFIX<pid>.img`) of processes that are gone.
fn remove_stale(dir: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(prefix)
            .and_then(|n| n.strip_suffix(".img"))
        else {
            continue;
        };
        if Path::new("/proc").join(pid).exists() {
            continue;
        }
        // The RAM image's mount point is on the disk, the disk image's
        // beside it.
        let mount = match prefix == PREFIX {
            true => PathBuf::from(format!("/var/tmp/{prefix}{pid}")),
            false => dir.join(format!("{prefix}{pid}")),
        };
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        if mounts.contains(&format!(" {} ", mount.display())) {
            unmount(&mount);
        }
        let image = e.path();
        if let Ok(out) = Command::new("losetup").arg("-j").arg(&image).output() {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if let Some(dev) = line.split(':').next() {
                    let _ = Command::new("losetup").args(["-d", dev]).status();
                }
            }
        }
        let _ = std::fs::remove_file(&image);
        let _ = std::fs::remove_dir(&mount);
    }
}

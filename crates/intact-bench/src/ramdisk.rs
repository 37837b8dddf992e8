//! A RAM-backed ext4: a file in /dev/shm on a loop device, formatted and
//! mounted for one benchmark run, then unmounted, detached and deleted on
//! every way out (an error, a stop asked for by SIGINT/SIGTERM, the end).
//! The same file system as on the disk, with the device time taken out:
//! what is left is the tools' own cost.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use crate::transfer::run_cmd;

const PREFIX: &str = "intact-bench-ram-";

pub struct RamExt4 {
    /// Where the file system is mounted.
    pub mount: PathBuf,
    image: PathBuf,
    loopdev: Option<String>,
    mounted: bool,
}

impl RamExt4 {
    /// Makes, formats and mounts a RAM-backed ext4 of `mib` MiB.
    pub fn create(mib: u64) -> anyhow::Result<RamExt4> {
        remove_stale();
        let pid = std::process::id();
        let mut r = RamExt4 {
            mount: PathBuf::from(format!("/var/tmp/{PREFIX}{pid}")),
            image: PathBuf::from(format!("/dev/shm/{PREFIX}{pid}.img")),
            loopdev: None,
            mounted: false,
        };
        std::fs::File::create(&r.image)?.set_len(mib << 20)?;
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&r.image)
            .output()
            .context("losetup")?;
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

impl Drop for RamExt4 {
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
/// and images of processes that are gone.
fn remove_stale() {
    let Ok(entries) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|n| n.strip_suffix(".img"))
        else {
            continue;
        };
        if Path::new("/proc").join(pid).exists() {
            continue;
        }
        let mount = PathBuf::from(format!("/var/tmp/{PREFIX}{pid}"));
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

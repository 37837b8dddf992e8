//! A loop-mounted ext4 image, removed on every path (unmount, detach) by
//! Drop, even when the caller panics.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use intact_digest::AlignedBuf;

const PAGE: u64 = 4096;

/// Whether loop file systems can be made here; the reason if not.
pub fn usable() -> Result<(), String> {
    // SAFETY: no arguments, no memory.
    if unsafe { libc::geteuid() } != 0 {
        return Err("needs root (loop devices and mount)".into());
    }
    for tool in ["mkfs.ext4", "losetup", "mount", "umount"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Err(format!("{tool} is missing (scripts/setup installs it)"));
        }
    }
    Ok(())
}

fn run(cmd: &str, args: &[&str]) -> io::Result<String> {
    let out = Command::new(cmd).args(args).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{cmd} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Loop devices attached to image files under `dir`.
pub fn loop_devices_of(dir: &Path) -> Vec<String> {
    let Ok(out) = run("losetup", &["-l", "-n", "-O", "NAME,BACK-FILE"]) else {
        return Vec::new();
    };
    let dir = dir.to_string_lossy();
    out.lines()
        .filter_map(|l| l.split_once(char::is_whitespace))
        .filter(|(_, back)| back.trim().starts_with(dir.as_ref()))
        .map(|(name, _)| name.to_string())
        .collect()
}

/// A fresh ext4 (4 KiB blocks) in an image under a temporary directory,
/// attached to a loop device and mounted.
pub struct LoopFs {
    dir: tempfile::TempDir,
    dev: Option<String>,
    mnt: PathBuf,
    mounted: bool,
}

impl LoopFs {
    /// Makes and mounts an ext4 of `mib` MiB in a temporary directory
    /// under `parent` (which must be on a real disk).
    pub fn new(parent: &Path, mib: u64) -> io::Result<LoopFs> {
        let dir = tempfile::tempdir_in(parent)?;
        let img = dir.path().join("ext4.img");
        File::create(&img)?.set_len(mib << 20)?;
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt)?;
        let mut fs = LoopFs {
            dir,
            dev: None,
            mnt,
            mounted: false,
        };
        let img = img.to_str().expect("UTF-8 temp path").to_string();
        // No blocks reserved for root: the lab fills file systems as root.
        run("mkfs.ext4", &["-q", "-F", "-b", "4096", "-m", "0", &img])?;
        fs.dev = Some(run("losetup", &["--find", "--show", &img])?);
        let mnt = fs.mnt.to_str().expect("UTF-8 temp path").to_string();
        run("mount", &[fs.device(), &mnt])?;
        fs.mounted = true;
        Ok(fs)
    }

    /// Where it is mounted.
    pub fn mnt(&self) -> &Path {
        &self.mnt
    }

    /// The directory holding the image (for leak checks).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The loop device.
    pub fn device(&self) -> &str {
        self.dev.as_deref().expect("attached")
    }

    fn open_device(&self) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(self.device())
    }

    /// Flips the lowest bit of the byte at file offset `logical` on the
    /// device, leaving whatever the page cache holds of the file untouched.
    /// The file's data is synced first, so that it has a place on the device.
    pub fn flip_bit_under(&self, file: &File, logical: u64) -> io::Result<()> {
        file.sync_all()?;
        let phys = intact_cache::physical_offset(file, logical)?
            .ok_or_else(|| io::Error::other("the byte is not in a plain extent"))?;
        let dev = self.open_device()?;
        let sector = phys / PAGE * PAGE;
        let mut buf = AlignedBuf::new(PAGE as usize);
        dev.read_exact_at(&mut buf, sector)?;
        buf[(phys - sector) as usize] ^= 1;
        dev.write_all_at(&buf, sector)
    }

    /// Flips the first bit of every 4 KiB page of `offset..offset + len` of
    /// the file on the device (the RIVA paper's extreme injection); returns
    /// the pages flipped.
    pub fn flip_every_page_under(&self, file: &File, offset: u64, len: u64) -> io::Result<u64> {
        file.sync_all()?;
        let dev = self.open_device()?;
        let (start, end) = (offset / PAGE * PAGE, offset + len);
        let mut flipped = 0;
        const CHUNK: u64 = 4 << 20;
        let mut buf = AlignedBuf::new(CHUNK as usize);
        for e in intact_cache::extents(file)? {
            let lo = e.logical.max(start);
            let hi = (e.logical + e.length).min(end);
            if lo >= hi {
                continue;
            }
            if !e.is_plain() {
                return Err(io::Error::other(
                    "part of the range is not in a plain extent",
                ));
            }
            let mut at = lo;
            while at < hi {
                let n = (hi - at).min(CHUNK).div_ceil(PAGE) * PAGE;
                let phys = e.physical + (at - e.logical);
                dev.read_exact_at(&mut buf[..n as usize], phys)?;
                for p in (0..n).step_by(PAGE as usize) {
                    buf[p as usize] ^= 1;
                    flipped += 1;
                }
                dev.write_all_at(&buf[..n as usize], phys)?;
                at += n;
            }
        }
        Ok(flipped)
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        if self.mounted {
            let m = self.mnt.to_string_lossy().to_string();
            if run("umount", &[&m]).is_err() {
                let _ = run("umount", &["-l", &m]);
            }
        }
        if let Some(dev) = &self.dev {
            let _ = run("losetup", &["-d", dev]);
        }
    }
}

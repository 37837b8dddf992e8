//! A loop-mounted ext4 image, removed on every path (unmount, detach) by
//! Drop, even when the caller panics.
//!
//! Set-up and tear-down must hold under load: the loop device is attached
//! by `mount -o loop`, which sets the kernel's autoclear flag (the device
//! detaches itself when its last user closes it, even if this process is
//! killed), and the image is never tied to a fixed `/dev/loopN`. Tear-down
//! retries `umount` until the kernel lets go of the file system, then waits
//! until `losetup -j IMAGE` shows nothing: within a bounded time, never a
//! fixed number of tries.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use intact_digest::AlignedBuf;

const PAGE: u64 = 4096;

/// How long set-up, a remount or tear-down may wait for the kernel to
/// release a busy file system or loop device: generous, because another
/// heavy job can slow both down, yet bounded, so that a real leak is
/// reported instead of hanging the run.
const RELEASE_WITHIN: Duration = Duration::from_secs(60);

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

/// Calls `attempt` until it returns `Ok(true)`, sleeping a little longer
/// each time, for at most [`RELEASE_WITHIN`]; then the last error.
fn until_released(what: &str, mut attempt: impl FnMut() -> io::Result<bool>) -> io::Result<()> {
    let deadline = Instant::now() + RELEASE_WITHIN;
    let mut pause = Duration::from_millis(5);
    loop {
        let last = match attempt() {
            Ok(true) => return Ok(()),
            Ok(false) => io::Error::other("not yet"),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                last.kind(),
                format!("{what}: not done after {RELEASE_WITHIN:?}: {last}"),
            ));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(200));
    }
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

/// Mount points at or under `dir` (from `/proc/self/mountinfo`), so that a
/// run can prove it left no file system mounted.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mountinfo)
        .filter(|m| m.starts_with(dir))
        .collect()
}

/// mountinfo writes space, tab, newline and backslash as `\ooo` (octal).
fn unescape_mountinfo(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .and_then(|o| std::str::from_utf8(o).ok())
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match (b[i], octal) {
            (b'\\', Some(c)) => {
                out.push(c);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// Unmounts the file system mounted at `mnt` (nothing if none is),
/// retrying while the kernel says it is busy (a thread of the caller, or
/// another process such as udev, still holding it), within a bounded time.
pub(crate) fn unmount_within(mnt: &Path) -> io::Result<()> {
    let mnt_s = mnt.to_string_lossy().to_string();
    until_released(&format!("umount {mnt_s}"), || {
        if !mounts_under(mnt).iter().any(|m| m == mnt) {
            return Ok(true);
        }
        run("umount", &[&mnt_s]).map(|_| true)
    })
}

/// Loop devices attached to `img` (`losetup -j`).
fn attached_to(img: &Path) -> io::Result<Vec<String>> {
    let out = run("losetup", &["-j", &img.to_string_lossy()])?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_once(':').map(|(dev, _)| dev.to_string()))
        .collect())
}

/// A fresh ext4 (4 KiB blocks) in an image under a temporary directory,
/// attached to a loop device and mounted.
pub struct LoopFs {
    dir: tempfile::TempDir,
    img: PathBuf,
    dev: String,
    /// Held open for the life of the `LoopFs`: the autoclear device then
    /// stays attached (the same device) across [`LoopFs::remount`], and
    /// detaches by itself once this and the mount are gone.
    hold: Option<File>,
    mnt: PathBuf,
    options: String,
    mounted: AtomicBool,
}

impl LoopFs {
    /// Makes and mounts an ext4 of `mib` MiB in a temporary directory
    /// under `parent` (which must be on a real disk).
    pub fn new(parent: &Path, mib: u64) -> io::Result<LoopFs> {
        LoopFs::with_options(parent, mib, "")
    }

    /// As [`LoopFs::new`], mounted with extra `mount -o` options (for
    /// example `data=journal`), which every remount keeps.
    pub fn with_options(parent: &Path, mib: u64, options: &str) -> io::Result<LoopFs> {
        let dir = tempfile::tempdir_in(parent)?;
        let img = dir.path().join("ext4.img");
        File::create(&img)?.set_len(mib << 20)?;
        LoopFs::over(dir, img, options, &[])
    }

    /// Makes an ext4 in the existing file `img` (`mkfs.ext4` with
    /// `mkfs_extra` arguments too) and mounts it under `dir`, which the
    /// `LoopFs` then owns.
    pub(crate) fn over(
        dir: tempfile::TempDir,
        img: PathBuf,
        options: &str,
        mkfs_extra: &[&str],
    ) -> io::Result<LoopFs> {
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt)?;
        let img_s = img.to_str().expect("UTF-8 temp path").to_string();
        let mnt_s = mnt.to_str().expect("UTF-8 temp path").to_string();
        // No blocks reserved for root: the lab fills file systems as root.
        let mut mkfs = vec!["-q", "-F", "-b", "4096", "-m", "0"];
        mkfs.extend_from_slice(mkfs_extra);
        mkfs.push(&img_s);
        run("mkfs.ext4", &mkfs)?;
        let opts = if options.is_empty() {
            "loop".to_string()
        } else {
            format!("loop,{options}")
        };
        let mut fs = LoopFs {
            dir,
            img,
            dev: String::new(),
            hold: None,
            mnt,
            options: options.to_string(),
            mounted: AtomicBool::new(false),
        };
        // `mount -o loop` finds a free device itself and sets autoclear; a
        // device another job grabbed at the same moment makes it fail, so
        // it is tried again. From here on, Drop cleans up after a failure.
        until_released("mount -o loop", || {
            run("mount", &["-o", &opts, &img_s, &mnt_s]).map(|_| true)
        })?;
        fs.mounted.store(true, Ordering::SeqCst);
        fs.dev = attached_to(&fs.img)?
            .into_iter()
            .next()
            .ok_or_else(|| io::Error::other("mounted, but no loop device holds the image"))?;
        fs.hold = Some(File::open(&fs.dev)?);
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

    /// The loop device (the same one for the life of the `LoopFs`).
    pub fn device(&self) -> &str {
        &self.dev
    }

    /// Unmounts and mounts the file system again on the same loop device,
    /// with the same options. Unmounting writes everything back (for
    /// `data=journal`, checkpoints the journal) and drops every cached page
    /// of this file system, so whatever is read afterwards comes from the
    /// device: ground truth that owes nothing to the tool under test. Every
    /// file on it must be closed (it waits for that, within a bounded time).
    pub fn remount(&self) -> io::Result<()> {
        self.unmount()?;
        let mnt = self.mnt.to_string_lossy().to_string();
        let mut args = Vec::new();
        if !self.options.is_empty() {
            args.extend(["-o", self.options.as_str()]);
        }
        args.extend([self.dev.as_str(), mnt.as_str()]);
        until_released("mount", || run("mount", &args).map(|_| true))?;
        self.mounted.store(true, Ordering::SeqCst);
        Ok(())
    }

    fn unmount(&self) -> io::Result<()> {
        if !self.mounted.load(Ordering::SeqCst) {
            return Ok(());
        }
        unmount_within(&self.mnt)?;
        self.mounted.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Unmounts and detaches, waiting until the kernel has released the
    /// loop device; the error says what was left behind. Drop does the
    /// same and ignores the error.
    pub fn close(mut self) -> io::Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> io::Result<()> {
        let unmounted = self.unmount();
        if unmounted.is_err() {
            // Last resort, so that the next cell can run; the error stays.
            let _ = run("umount", &["-l", &self.mnt.to_string_lossy()]);
            self.mounted.store(false, Ordering::SeqCst);
        }
        // Closing the last opener lets autoclear detach the device.
        self.hold = None;
        let detached = until_released(&format!("detaching {}", self.dev), || {
            let left = attached_to(&self.img)?;
            // Autoclear acts when the kernel drops its last reference,
            // which can come a little after umount returns; asking for the
            // detach as well costs nothing.
            for d in &left {
                let _ = run("losetup", &["-d", d]);
            }
            Ok(left.is_empty())
        });
        unmounted.and(detached)
    }

    /// Switches the loop device to direct I/O on its backing file (no
    /// page cache of the image between the device and what backs it);
    /// an error if the kernel did not (`/sys/block/loopN/loop/dio`).
    pub(crate) fn direct_io(&self) -> io::Result<()> {
        run("losetup", &["--direct-io=on", &self.dev])?;
        let name = self.dev.trim_start_matches("/dev/");
        let dio = std::fs::read_to_string(format!("/sys/block/{name}/loop/dio"))?;
        if dio.trim() != "1" {
            return Err(io::Error::other(format!(
                "{}: the kernel kept buffered I/O on the backing file",
                self.dev
            )));
        }
        Ok(())
    }

    fn open_device(&self) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(self.device())
    }

    /// The byte at file offset `logical` as the device holds it (read from
    /// the loop device with `O_DIRECT` at the file's FIEMAP extent),
    /// whatever the page cache holds. The file's data is synced first.
    pub fn device_byte_under(&self, file: &File, logical: u64) -> io::Result<u8> {
        file.sync_all()?;
        let phys = intact_cache::physical_offset(file, logical)?
            .ok_or_else(|| io::Error::other("the byte is not in a plain extent"))?;
        let sector = phys / PAGE * PAGE;
        let mut buf = AlignedBuf::new(PAGE as usize);
        self.open_device()?.read_exact_at(&mut buf, sector)?;
        Ok(buf[(phys - sector) as usize])
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

    /// Leaves the page cache of `file` holding a flipped bit at `logical`
    /// while the device holds the right byte (a host-memory fault after the
    /// write, Kim et al.'s Table 2): the file is synced, the bit flipped on
    /// the device, the page evicted and read back into the cache, then the
    /// device restored. Returns whether it took: the cache reads back wrong
    /// and the device right.
    pub fn wrong_cache_at(&self, file: &File, logical: u64) -> io::Result<bool> {
        let truth = self.device_byte_under(file, logical)?;
        self.flip_bit_under(file, logical)?;
        let page = logical / PAGE * PAGE;
        intact_cache::evict(file, page, PAGE).map_err(io::Error::other)?;
        let mut cached = [0u8; 1];
        file.read_exact_at(&mut cached, logical)?;
        self.flip_bit_under(file, logical)?;
        let restored = self.device_byte_under(file, logical)?;
        let mut again = [0u8; 1];
        file.read_exact_at(&mut again, logical)?;
        Ok(cached[0] != truth && again[0] == cached[0] && restored == truth)
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
        let _ = self.teardown();
    }
}

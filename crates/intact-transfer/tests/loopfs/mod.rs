//! A loop-mounted ext4 image made by a test, removed on every path
//! (unmount, detach) by Drop, even when the test fails.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use intact_digest::AlignedBuf;

/// Whether loop file systems can be made here; if not, says so loudly.
pub fn usable(test: &str) -> bool {
    // SAFETY: no arguments, no memory.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP {test}: needs root (loop devices and mount)");
        return false;
    }
    for tool in ["mkfs.ext4", "losetup", "mount", "umount"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            eprintln!("SKIP {test}: {tool} is missing (scripts/setup installs it)");
            return false;
        }
    }
    true
}

fn run(cmd: &str, args: &[&str]) -> std::io::Result<String> {
    let out = Command::new(cmd).args(args).output()?;
    if !out.status.success() {
        return Err(std::io::Error::other(format!(
            "{cmd} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

pub struct LoopFs {
    _dir: tempfile::TempDir,
    dev: Option<String>,
    mnt: PathBuf,
    mounted: bool,
}

impl LoopFs {
    /// A fresh ext4 of `mib` MiB (4 KiB blocks), mounted.
    pub fn new(mib: u64) -> std::io::Result<LoopFs> {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))?;
        let img = dir.path().join("ext4.img");
        File::create(&img)?.set_len(mib << 20)?;
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt)?;
        let mut fs = LoopFs {
            _dir: dir,
            dev: None,
            mnt,
            mounted: false,
        };
        let img = img.to_str().expect("UTF-8 temp path");
        run("mkfs.ext4", &["-q", "-F", "-b", "4096", img])?;
        fs.dev = Some(run("losetup", &["--find", "--show", img])?);
        run(
            "mount",
            &[fs.dev.as_deref().unwrap(), fs.mnt.to_str().unwrap()],
        )?;
        fs.mounted = true;
        Ok(fs)
    }

    pub fn mnt(&self) -> &Path {
        &self.mnt
    }

    /// Flips the lowest bit of the byte at file offset `logical` on the
    /// device (through the loop device, with O_DIRECT), leaving whatever
    /// the page cache holds of the file untouched.
    pub fn flip_bit_under(&self, file: &File, logical: u64) {
        file.sync_all().unwrap();
        let phys = intact_cache::physical_offset(file, logical)
            .unwrap()
            .expect("the byte lies in a plain extent");
        let dev = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(self.dev.as_deref().unwrap())
            .unwrap();
        let sector = phys / 4096 * 4096;
        let mut buf = AlignedBuf::new(4096);
        dev.read_exact_at(&mut buf, sector).unwrap();
        buf[(phys - sector) as usize] ^= 1;
        dev.write_all_at(&buf, sector).unwrap();
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        if self.mounted {
            let m = self.mnt.to_str().unwrap();
            if run("umount", &[m]).is_err() {
                let _ = run("umount", &["-l", m]);
            }
        }
        if let Some(dev) = &self.dev {
            let _ = run("losetup", &["-d", dev]);
        }
    }
}

//! Test support shared by intact's test suites.
//!
//! [`skip`] is the one way a test that cannot run here says so. `cargo
//! test` hides a passing test's output, so a skipped device test would
//! otherwise show as a green `ok`. A skip therefore:
//!
//! - prints `SKIP <test>: <why>` on stderr (seen with `--nocapture`);
//! - appends the same line to the file named by `INTACT_SKIP_LOG`, which
//!   `scripts/test` sets, counts and prints at the end of the run;
//! - panics when `CI` is set: CI runs as root on a machine that has every
//!   tool the suite needs, so nothing may be skipped there.

use std::io::Write;

/// Environment variable naming the file skips are appended to.
pub const SKIP_LOG: &str = "INTACT_SKIP_LOG";

/// Records that `test` cannot run here because of `why`; the caller then
/// returns. Panics under CI (the `CI` variable set and not empty or
/// "false"), where every test must run.
pub fn skip(test: &str, why: &str) {
    let line = format!("SKIP {test}: {why}");
    eprintln!("{line}");
    if let Some(path) = std::env::var_os(SKIP_LOG) {
        // O_APPEND writes of one short line do not interleave between the
        // test threads and processes of one run.
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = f.write_all(format!("{line}\n").as_bytes());
        }
    }
    if in_ci() {
        panic!("{line} (CI is set: every test must run here)");
    }
}

/// Whether this run is CI's.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// Whether the process runs as root (loop devices, mounts, setpriv).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no arguments and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `statfs` magic of tmpfs (linux/magic.h).
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// A tmpfs directory for one test, known to be tmpfs by the test itself:
/// a tmpfs it mounted (root), or a directory under `/dev/shm` that
/// `statfs` shows is tmpfs. Unmounted (if mounted) and removed on drop.
pub struct Tmpfs {
    dir: tempfile::TempDir,
    mounted: bool,
}

impl Tmpfs {
    /// The directory.
    pub fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if self.mounted {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .status();
        }
    }
}

/// A fresh tmpfs for `test` (see [`Tmpfs`]), or None after [`skip`]
/// when neither mounting one nor `/dev/shm` is possible here.
pub fn tmpfs(test: &str) -> Option<Tmpfs> {
    if is_root() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=256m", "intact-test"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            skip(test, "root, but mount -t tmpfs failed");
            return None;
        }
        let fs = Tmpfs { dir, mounted: true };
        assert_eq!(fs_magic(fs.path()), Some(TMPFS_MAGIC), "the mount is tmpfs");
        return Some(fs);
    }
    match tempfile::tempdir_in("/dev/shm") {
        Ok(dir) if fs_magic(dir.path()) == Some(TMPFS_MAGIC) => Some(Tmpfs {
            dir,
            mounted: false,
        }),
        Ok(_) => {
            skip(test, "not root, and /dev/shm is not a tmpfs");
            None
        }
        Err(e) => {
            skip(test, &format!("not root, and no /dev/shm: {e}"));
            None
        }
    }
}

/// The `statfs` type of the file system holding `path`.
fn fs_magic(path: &std::path::Path) -> Option<i64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statfs fills the zeroed struct we own.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string, valid pointer.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_type as i64 & 0xffff_ffff)
}

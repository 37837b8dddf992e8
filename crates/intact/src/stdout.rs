//! Standard output that its reader may close. `intact copy --json | head`
//! closes the pipe early; like coreutils, intact then stops writing and
//! says nothing (no panic, no "Broken pipe" message), and its exit status
//! still tells how the work itself went.

use std::fmt;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once a write found the reader gone; later writes are skipped.
static CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes `args` and a newline to standard output. A closed pipe is not an
/// error (the rest of the output is dropped); any other write error is.
pub fn line(args: fmt::Arguments<'_>) -> io::Result<()> {
    write(|out| {
        out.write_fmt(args)?;
        out.write_all(b"\n")
    })
}

/// Writes `bytes` to standard output, as [`line`] does.
pub fn bytes(bytes: &[u8]) -> io::Result<()> {
    write(|out| out.write_all(bytes))
}

fn write(f: impl FnOnce(&mut io::StdoutLock<'static>) -> io::Result<()>) -> io::Result<()> {
    if CLOSED.load(Ordering::Relaxed) {
        return Ok(());
    }
    let mut out = io::stdout().lock();
    match f(&mut out).and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
            CLOSED.store(true, Ordering::Relaxed);
            Ok(())
        }
        r => r,
    }
}

/// `println!` that ends quietly on a closed pipe and returns the other
/// write errors (`outln!(...)?`).
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::stdout::line(format_args!($($arg)*))
    };
}
pub(crate) use outln;

//! The process entry point, without std's `main` wrapper.
//!
//! Before a Rust `main` runs, std sets up what a short `intact sum FILE`
//! pays for on every run: it asks glibc for the main thread's stack bounds
//! (`pthread_getattr_np`, which opens and parses /proc/self/maps) and maps
//! an alternate signal stack, to print "has overflowed its stack" instead
//! of a bare SIGSEGV. That was ~50k instructions and eight system calls of
//! a 4 KiB `intact sum` (callgrind, strace), about a tenth of its CPU time.
//! intact has no deep recursion; a stack overflow still ends the process
//! (the kernel's guard gap raises SIGSEGV), only without that message.
//!
//! What std's wrapper does that intact relies on is done here, the same
//! way: standard descriptors 0-2 are opened on /dev/null if closed (so a
//! file intact opens never becomes its standard output), SIGPIPE is
//! ignored (a closed pipe is an EPIPE error, see `stdout`), a panic exits
//! with status 101 after the panic hook printed it, and standard output is
//! flushed at exit (`std::process::exit` does).

use std::ffi::c_int;
use std::process::ExitCode;

/// Runs `main` as std's wrapper would and exits with its status.
// Unit tests have the harness's main, which does not call this.
#[cfg_attr(test, allow(dead_code))]
pub fn run(main: fn() -> ExitCode) -> ! {
    sanitize_standard_fds();
    // SAFETY: setting a signal's disposition to "ignore" is always sound.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let status = match std::panic::catch_unwind(main) {
        Ok(code) => status_of(code),
        // The panic hook has printed the message; 101 is std's status.
        Err(_) => 101,
    };
    std::process::exit(status)
}

/// The number behind `code` (std does not expose it; it does compare).
fn status_of(code: ExitCode) -> c_int {
    (0..=u8::MAX)
        .find(|&n| ExitCode::from(n) == code)
        .map_or(1, c_int::from)
}

/// Opens /dev/null on any of descriptors 0, 1 and 2 that is closed, as std
/// does before `main`; aborts if that fails.
fn sanitize_standard_fds() {
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    // SAFETY: `fds` is a valid array of three pollfd; timeout 0.
    while unsafe { libc::poll(fds.as_mut_ptr(), 3, 0) } == -1 {
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            // poll unusable (e.g. a sandbox): ask each descriptor instead.
            _ => {
                for pfd in &mut fds {
                    // SAFETY: F_GETFD only reads the descriptor's flags.
                    let closed = unsafe { libc::fcntl(pfd.fd, libc::F_GETFD) } == -1
                        && std::io::Error::last_os_error().raw_os_error() == Some(libc::EBADF);
                    pfd.revents = if closed { libc::POLLNVAL } else { 0 };
                }
                break;
            }
        }
    }
    for pfd in fds {
        if pfd.revents & libc::POLLNVAL != 0 {
            // SAFETY: a NUL-terminated path; the lowest free descriptor,
            // which is `pfd.fd` since the lower ones are open by now.
            let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
            if fd != pfd.fd {
                std::process::abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_come_back_as_numbers() {
        assert_eq!(status_of(ExitCode::SUCCESS), 0);
        assert_eq!(status_of(ExitCode::FAILURE), 1);
        assert_eq!(status_of(ExitCode::from(2)), 2);
        assert_eq!(status_of(ExitCode::from(255)), 255);
    }
}

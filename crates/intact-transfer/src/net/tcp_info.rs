//! The kernel's `TCP_INFO` of a socket, read once for the two places that
//! use it: the server's watchdog (bytes moved) and the sender's stream
//! tuner (time held back by the send buffer, round trips).

use std::net::TcpStream;
use std::os::fd::AsRawFd;

/// `s`'s `tcp_info`, where the kernel fills it at least up to and
/// including the field ending at byte `through` (older kernels fill less;
/// e.g. `offset_of!(libc::tcp_info, tcpi_bytes_received) + 8`); None
/// otherwise.
pub(crate) fn tcp_info(s: &TcpStream, through: usize) -> Option<libc::tcp_info> {
    // SAFETY: all-zero is a valid tcp_info (plain integers).
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` is writable for `len` bytes; the kernel writes at
    // most that and says how many.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (r == 0 && len as usize >= through).then_some(info)
}

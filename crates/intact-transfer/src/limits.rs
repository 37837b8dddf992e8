//! Process limits the transfer engine needs.

/// Raises the soft limit on open files to the hard limit and returns it.
/// Each file in flight holds a descriptor on both sides (1024 files per
/// stream, several streams), beyond the usual soft limit of 1024.
pub fn raise_open_file_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                return raised.rlim_cur;
            }
        }
    }
    lim.rlim_cur
}

/// The soft limit on open files now (0 if it cannot be read).
pub fn open_file_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit with a valid rlimit struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 0;
    }
    lim.rlim_cur
}

/// Descriptors a file being received holds at most (its partial file, a
/// duplicate for the verifier, the device reader's, its directory).
pub const DESCRIPTORS_PER_FILE: u64 = 4;

/// Descriptors kept free for everything else a server does (listening,
/// connections, the journal, logging) and for a background scrub.
const DESCRIPTOR_RESERVE: u64 = 256 + crate::scrub::MAX_SCRUB_DESCRIPTORS;

/// How many files a server may hold open across all its sessions within
/// the process's open-file limit (call after
/// [`raise_open_file_limit`]): at most 65,536, at least 64.
pub fn files_within_descriptor_limit() -> usize {
    let n = open_file_limit().saturating_sub(DESCRIPTOR_RESERVE) / DESCRIPTORS_PER_FILE;
    n.clamp(64, 65_536) as usize
}

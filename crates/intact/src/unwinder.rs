//! The unwinder linked into the binary, not loaded at start.
//!
//! std unwinds (panics, backtraces) with libgcc's unwinder, which rustc
//! links as the shared libgcc_s.so.1 unless glibc itself is static. Every
//! start then maps one more library and resolves its symbols, and every
//! symbol intact imports from libc is looked up in one more object first:
//! ~35k of the ~580k instructions of `intact sum` on a 4 KiB file, and
//! ~0.15 ms of its ~1.5 ms CPU (callgrind; whole-process CPU medians,
//! README "intact sum on files of 1 MiB and less").
//!
//! Naming libgcc's static unwinder (libgcc_eh.a, part of every gcc
//! install, the one `cargo static-release` and `gcc -static-libgcc` use)
//! here puts it on the link line before std's `-lgcc_s`, so the linker
//! takes the `_Unwind_*` functions from it and `--as-needed` (rustc's
//! default) drops libgcc_s.so.1. Unwinding is the same code, found the
//! same way (PT_GNU_EH_FRAME through dl_iterate_phdr); the test below
//! unwinds a panic and walks the stack in a binary linked this way.

#[cfg(all(
    target_os = "linux",
    target_env = "gnu",
    not(target_feature = "crt-static")
))]
#[link(name = "gcc_eh", kind = "static")]
extern "C" {}

#[cfg(test)]
mod tests {
    fn libgcc_s_mapped() -> bool {
        let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
        maps.contains("libgcc_s")
    }

    /// This test binary is linked as the `intact` binary is: it must
    /// unwind a panic and walk its own stack without libgcc_s.so.1.
    #[cfg(all(
        target_os = "linux",
        target_env = "gnu",
        not(target_feature = "crt-static")
    ))]
    #[test]
    fn panics_unwind_without_libgcc_s() {
        assert!(!libgcc_s_mapped(), "libgcc_s.so.1 is loaded at start");
        let caught = std::panic::catch_unwind(|| -> u32 { panic!("deliberate test panic") });
        assert!(caught.is_err(), "the panic was not caught");
        let trace = std::backtrace::Backtrace::force_capture().to_string();
        assert!(
            trace.contains("panics_unwind_without_libgcc_s"),
            "the backtrace does not show this test: {trace}"
        );
        assert!(!libgcc_s_mapped(), "unwinding loaded libgcc_s.so.1");
    }
}

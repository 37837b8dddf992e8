//! The six C math functions intact calls, defined in the binary, so that
//! libm.so.6 is not loaded at start.
//!
//! `exp`, `expm1`, `log`, `log10`, `log1p` and `pow` are all intact needs
//! from libm (the reliability model, progress-bar rates, SQLite's `log`),
//! yet linking them from libm.so.6 made every start map one more library,
//! fault in 12 of its pages and resolve its symbols: ~34k of ~390k
//! instructions and ~0.07 ms of CPU of `intact sum` on a 4 KiB file
//! (callgrind; README, "intact sum on files of 1 MiB and less"). glibc's
//! static libm cannot be linked into a dynamic binary (its IFUNC resolvers
//! need libc's private `_dl_x86_cpu_features`), so they come from the
//! `libm` crate (rust-lang's port of musl/FreeBSD's libm). Defined here,
//! the linker takes them before libm.so.6, which `--as-needed` (rustc's
//! default) then drops. The linker still exports them (libm.so.6, on the
//! command line, defines the same names), so a library loaded later that
//! calls `pow` would get this one; none that intact loads does (libc,
//! its NSS modules).
//!
//! The results are those of FreeBSD's msun, within 1 ulp of glibc's; the
//! test below compares each with glibc's own (loaded by `dlopen`) on
//! 200,000 inputs and the special values. Output printed at full f64
//! precision can differ in its last digit from a glibc-libm build (e.g.
//! the switching time of `intact reliability --json --solve-switch`). A math function not defined
//! here that code starts to call brings libm.so.6 back (and fails the
//! test), it does not break the build. The static build (`cargo
//! static-release`) keeps glibc's static libm.

#[cfg(all(
    target_os = "linux",
    target_env = "gnu",
    not(target_feature = "crt-static")
))]
mod symbols {
    #[no_mangle]
    extern "C" fn exp(x: f64) -> f64 {
        libm::exp(x)
    }

    #[no_mangle]
    extern "C" fn expm1(x: f64) -> f64 {
        libm::expm1(x)
    }

    #[no_mangle]
    extern "C" fn log(x: f64) -> f64 {
        libm::log(x)
    }

    #[no_mangle]
    extern "C" fn log10(x: f64) -> f64 {
        libm::log10(x)
    }

    #[no_mangle]
    extern "C" fn log1p(x: f64) -> f64 {
        libm::log1p(x)
    }

    #[no_mangle]
    extern "C" fn pow(x: f64, y: f64) -> f64 {
        libm::pow(x, y)
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use std::ffi::{c_void, CStr};

    extern "C" {
        fn exp(x: f64) -> f64;
        fn expm1(x: f64) -> f64;
        fn log(x: f64) -> f64;
        fn log10(x: f64) -> f64;
        fn log1p(x: f64) -> f64;
        fn pow(x: f64, y: f64) -> f64;
    }

    fn libm_mapped() -> bool {
        let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
        maps.contains("/libm.so") || maps.contains("/libm-")
    }

    /// glibc's function `name` from libm.so.6, opened apart from the
    /// process's own symbols.
    fn glibc(lib: *mut c_void, name: &CStr) -> *mut c_void {
        // SAFETY: `lib` is a live dlopen handle, `name` NUL-terminated.
        let f = unsafe { libc::dlsym(lib, name.as_ptr()) };
        assert!(!f.is_null(), "libm.so.6 has no {name:?}");
        // SAFETY: looking a name up in the process's own scope.
        let ours = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        assert_ne!(f, ours, "{name:?}: glibc's is the one defined here");
        f
    }

    /// Distance in units in the last place; 0 for two NaNs, u64::MAX when
    /// only one is NaN.
    fn ulps(a: f64, b: f64) -> u64 {
        if a.is_nan() || b.is_nan() {
            return if a.is_nan() && b.is_nan() {
                0
            } else {
                u64::MAX
            };
        }
        if a == b {
            return 0;
        }
        // Map the bit patterns onto one monotonic integer line.
        let key = |x: f64| {
            let i = x.to_bits() as i64;
            if i < 0 {
                i64::MIN - i
            } else {
                i
            }
        };
        key(a).abs_diff(key(b))
    }

    #[test]
    fn libm_is_not_loaded_and_results_are_glibc_s_within_one_ulp() {
        assert!(!libm_mapped(), "libm.so.6 is loaded at start");
        // SAFETY: a NUL-terminated name; RTLD_LOCAL keeps its symbols out
        // of the process's global scope.
        let lib = unsafe { libc::dlopen(c"libm.so.6".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            intact_testkit::skip(
                "libm_is_not_loaded_and_results_are_glibc_s_within_one_ulp",
                "libm.so.6 cannot be opened to compare with",
            );
            return;
        }
        type Unary = unsafe extern "C" fn(f64) -> f64;
        type Binary = unsafe extern "C" fn(f64, f64) -> f64;
        let unary: [(&CStr, Unary, (f64, f64)); 5] = [
            (c"exp", exp, (-750.0, 712.0)),
            (c"expm1", expm1, (-50.0, 712.0)),
            (c"log", log, (-1.0, 1e300)),
            (c"log10", log10, (-1.0, 1e300)),
            (c"log1p", log1p, (-1.5, 1e300)),
        ];
        let special = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            f64::MIN_POSITIVE,
            5e-324,
            f64::MAX,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            1e-300,
            0.5,
            2.0,
            10.0,
        ];
        let mut x = 0x853c_49e6_748f_ea9bu64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // Uniform in [lo, hi) for half the draws, log-uniform magnitudes
        // for the other half (most inputs of a log are small or huge).
        let mut draw = |lo: f64, hi: f64, i: usize| {
            let u = (next() >> 11) as f64 / (1u64 << 53) as f64;
            if i % 2 == 0 {
                lo + u * (hi - lo)
            } else {
                10f64.powf(-300.0 + 600.0 * u).min(hi)
            }
        };
        let (mut compared, mut differ) = (0usize, 0usize);
        for (name, ours, (lo, hi)) in unary {
            let theirs: Unary = unsafe { std::mem::transmute(glibc(lib, name)) };
            let inputs = special
                .iter()
                .copied()
                .chain((0..30_000).map(|i| draw(lo, hi, i)));
            for v in inputs {
                // SAFETY: plain math functions of one double.
                let (a, b) = unsafe { (ours(v), theirs(v)) };
                assert!(ulps(a, b) <= 1, "{name:?}({v:e}): {a:e} here, glibc {b:e}");
                compared += 1;
                differ += usize::from(a.to_bits() != b.to_bits());
            }
        }
        let theirs_pow: Binary = unsafe { std::mem::transmute(glibc(lib, c"pow")) };
        let pairs = special
            .iter()
            .flat_map(|&a| special.iter().map(move |&b| (a, b)))
            .chain((0..50_000).map(|i| (draw(0.0, 1e10, i), draw(-60.0, 60.0, 0))))
            .chain((0..400).map(|k| (10.0, -(k as f64) / 4.0)));
        for (a, b) in pairs {
            // SAFETY: plain math functions of two doubles.
            let (p, q) = unsafe { (pow(a, b), theirs_pow(a, b)) };
            assert!(
                ulps(p, q) <= 1,
                "pow({a:e}, {b:e}): {p:e} here, glibc {q:e}"
            );
            compared += 1;
            differ += usize::from(p.to_bits() != q.to_bits());
        }
        // SAFETY: the handle came from dlopen and nothing of it is used after.
        unsafe { libc::dlclose(lib) };
        assert!(compared > 200_000, "{compared}");
        eprintln!("{compared} results compared with glibc's, {differ} differ by 1 ulp");
    }
}

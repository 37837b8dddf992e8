//! Probabilities kept as natural logarithms, so that 1e-40 (or 1e-400)
//! neither underflows nor loses its digits when summed or multiplied.

use std::fmt;

/// A probability in [0, 1], stored as its natural logarithm.
#[derive(Clone, Copy, PartialEq, PartialOrd)]
pub struct Prob {
    ln: f64,
}

impl Prob {
    /// Probability zero.
    pub const ZERO: Prob = Prob {
        ln: f64::NEG_INFINITY,
    };
    /// Probability one.
    pub const ONE: Prob = Prob { ln: 0.0 };

    /// From a plain value in [0, 1].
    pub fn new(p: f64) -> Prob {
        debug_assert!((0.0..=1.0).contains(&p), "probability {p}");
        Prob { ln: p.ln() }
    }

    /// From a natural logarithm (≤ 0).
    pub fn from_ln(ln: f64) -> Prob {
        Prob { ln: ln.min(0.0) }
    }

    /// From a base-10 logarithm (≤ 0).
    pub fn from_log10(log10: f64) -> Prob {
        Prob::from_ln(log10 * std::f64::consts::LN_10)
    }

    /// Natural logarithm.
    pub fn ln(self) -> f64 {
        self.ln
    }

    /// Base-10 logarithm.
    pub fn log10(self) -> f64 {
        self.ln / std::f64::consts::LN_10
    }

    /// The plain value (0 if below f64's range).
    pub fn value(self) -> f64 {
        self.ln.exp()
    }

    /// −log10, the papers' "reliability score" (higher is better).
    pub fn score(self) -> f64 {
        -self.log10()
    }

    /// Probability of either of two disjoint events: `self + other`.
    pub fn plus(self, other: Prob) -> Prob {
        let (hi, lo) = if self.ln >= other.ln {
            (self.ln, other.ln)
        } else {
            (other.ln, self.ln)
        };
        if hi == f64::NEG_INFINITY {
            return Prob::ZERO;
        }
        Prob::from_ln(hi + (lo - hi).exp().ln_1p())
    }

    /// Probability of two independent events both happening: `self × other`.
    pub fn times(self, other: Prob) -> Prob {
        Prob::from_ln(self.ln + other.ln)
    }

    /// Sum of many disjoint events.
    pub fn sum(items: impl IntoIterator<Item = Prob>) -> Prob {
        items.into_iter().fold(Prob::ZERO, Prob::plus)
    }

    /// Mantissa and decimal exponent, for printing values below f64's range.
    pub fn sci(self) -> (f64, i64) {
        if self.ln == f64::NEG_INFINITY {
            return (0.0, 0);
        }
        let l = self.log10();
        let e = l.floor();
        (10f64.powf(l - e), e as i64)
    }
}

impl fmt::Display for Prob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (m, e) = self.sci();
        if m == 0.0 {
            return f.write_str("0");
        }
        let prec = f.precision().unwrap_or(2);
        // Rounding the mantissa may carry into the exponent (9.999 → 10.0).
        let rounded = format!("{m:.prec$}");
        if rounded.starts_with("10") {
            write!(f, "{:.prec$}e{}", 1.0, e + 1)
        } else {
            write!(f, "{rounded}e{e}")
        }
    }
}

impl fmt::Debug for Prob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Prob({self:.4})")
    }
}

impl serde::Serialize for Prob {
    /// As a number where f64 can hold it, else as a string like "2.4e-400".
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let v = self.value();
        if v == 0.0 && self.ln != f64::NEG_INFINITY || v != 0.0 && v < f64::MIN_POSITIVE {
            s.serialize_str(&format!("{self:.4}"))
        } else {
            s.serialize_f64(v)
        }
    }
}

/// ln C(n, k), summed term by term (exact enough for the small k the
/// models use; cost grows with k).
pub fn ln_choose(n: f64, k: u64) -> f64 {
    if k as f64 > n {
        return f64::NEG_INFINITY;
    }
    (0..k).map(|j| ((n - j as f64) / (j + 1) as f64).ln()).sum()
}

/// ln k!
pub fn ln_factorial(k: u64) -> f64 {
    (2..=k).map(|j| (j as f64).ln()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_values_survive_arithmetic() {
        let a = Prob::from_log10(-400.0);
        let b = Prob::from_log10(-401.0);
        let s = a.plus(b);
        assert!((s.log10() - (-400.0 + 1.1f64.log10())).abs() < 1e-12);
        assert!((a.times(b).log10() + 801.0).abs() < 1e-9);
        assert_eq!(format!("{a}"), "1.00e-400");
        assert_eq!(format!("{:.1}", Prob::new(9.99e-5)), "1.0e-4");
    }

    #[test]
    fn zero_and_one_behave() {
        assert_eq!(Prob::ZERO.plus(Prob::ZERO), Prob::ZERO);
        assert_eq!(Prob::ZERO.plus(Prob::new(0.5)).value(), 0.5);
        assert_eq!(Prob::ONE.times(Prob::new(0.25)).value(), 0.25);
        assert_eq!(Prob::ZERO.to_string(), "0");
    }

    #[test]
    fn choose_and_factorial() {
        assert!((ln_choose(10.0, 3).exp() - 120.0).abs() < 1e-9);
        assert!((ln_factorial(5).exp() - 120.0).abs() < 1e-9);
        assert_eq!(ln_choose(2.0, 3), f64::NEG_INFINITY);
    }
}

//! RIVA's analysis (RIVA paper, Section 5.2.3): how likely an undetected
//! disk error (UDE) in a transferred block escapes verification.
//!
//! A transfer with verification does four disk I/Os on a block: read at the
//! source, write at the destination, and one re-read at each end for the
//! checksum. Verification that reads the page cache checks none of the
//! device I/O, so one UDE in the block gets through: P ≈ bE. Verification
//! that re-reads from the device misses only errors that hit two I/Os
//! alike: P ≈ bE², bounded by 12bE².

use crate::prob::Prob;

/// How a transfer is verified, as far as this analysis distinguishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verification {
    /// No end-to-end check: a UDE in the transfer's read or write stays.
    None,
    /// Checksums computed from the page cache (sequential, file, block,
    /// fiver): blind to the device, so a UDE goes through.
    Cache,
    /// Checksums re-read from the device (riva).
    Device,
}

/// Probabilities for one block under one verification.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct BlockRisk {
    /// Computed exactly (in log space).
    pub exact: Prob,
    /// The paper's approximation (bE, or 2bE² for device re-reads).
    pub paper_approx: Prob,
    /// The paper's upper bound (12bE² for device re-reads; else = approx).
    pub paper_bound: Prob,
}

/// 1 − (1 − E)^n, without cancellation.
fn any_error(n: f64, e: f64) -> Prob {
    Prob::new((-(n * (-e).ln_1p()).exp_m1()).clamp(0.0, 1.0))
}

/// Probability that a UDE in a block of `bits` goes undetected when each
/// disk I/O has undetected bit error rate `uber`.
pub fn block_risk(verification: Verification, bits: f64, uber: f64) -> BlockRisk {
    let (b, e) = (bits, uber);
    let be = Prob::new((b * e).min(1.0));
    match verification {
        // Two device I/Os (source read, destination write), neither checked.
        Verification::None => {
            let p = any_error(2.0 * b, e);
            let approx = Prob::new((2.0 * b * e).min(1.0));
            BlockRisk {
                exact: p,
                paper_approx: approx,
                paper_bound: approx,
            }
        }
        // Eq. 5: 1 − (1 − E)^b ≈ bE.
        Verification::Cache => BlockRisk {
            exact: any_error(b, e),
            paper_approx: be,
            paper_bound: be,
        },
        // Eq. 6–7: (E² + (1−E)²)^b − (1−E)^2b. Both terms are close to
        // e^(−2bE), so it is computed as (1−E)^2b · expm1(b·ln1p(E²/(1−E)²)),
        // using E² + (1−E)² = (1−E)² (1 + E²/(1−E)²).
        //
        // The exact value is ≈ bE², not the paper's 2bE²: its expansion
        // keeps the C(b,1) terms of both binomials but drops the C(b,2) and
        // C(2b,2) terms, which are of the same order (b²E²) and contribute
        // −bE². Its conclusion ("RIVA reduces it to bE²") and the 12bE²
        // bound still hold; we report both.
        Verification::Device => {
            let q = (e / (1.0 - e)).powi(2);
            let ln_first = 2.0 * b * (-e).ln_1p();
            let ln_second = (b * q.ln_1p()).exp_m1().ln();
            let two_be2 = Prob::from_ln((2.0 * b).ln() + 2.0 * e.ln());
            BlockRisk {
                exact: Prob::from_ln(ln_first + ln_second),
                paper_approx: two_be2,
                paper_bound: Prob::from_ln((12.0 * b).ln() + 2.0 * e.ln()),
            }
        }
    }
}

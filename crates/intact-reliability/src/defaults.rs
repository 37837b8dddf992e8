//! The reliability of intact's own default checksums, by the same model.

use intact_digest::{defaults, Algorithm};

use crate::checksum::ChecksumModel;
use crate::prob::Prob;
use crate::system::{zettabyte_goal, Environment, Protection};

/// One of intact's checksums at the granularity it guards.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DefaultScore {
    /// What it guards ("page", "block", "file").
    pub unit: &'static str,
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Bytes it covers.
    pub bytes: u64,
    /// P(a unit read back is silently corrupt), with the checksum verified
    /// over the reader's copy, the disk copy and the writer's dirty copy.
    pub p_udc: Prob,
    /// −log10(p_udc).
    pub score: f64,
    /// The Zettabyte goal for reads of this size (bytes / 2^70).
    pub goal: Prob,
    /// Goal's score.
    pub goal_score: f64,
    /// Whether p_udc ≤ goal.
    pub meets_goal: bool,
}

/// The sizes intact's file digest is evaluated at (1 GiB: a typical
/// large file; larger files only lower the per-byte goal proportionally).
pub const FILE_BYTES: u64 = 1 << 30;

/// Scores of intact's default page, block and file checksums in `env`
/// (whose block size is ignored: each checksum is taken at its own size).
pub fn default_scores(env: &Environment) -> Vec<DefaultScore> {
    [
        (
            "page",
            defaults::PAGE_ALGORITHM,
            defaults::PAGE_BYTES as u64,
        ),
        (
            "block",
            defaults::BLOCK_ALGORITHM,
            defaults::BLOCK_BYTES as u64,
        ),
        ("file", defaults::FILE_ALGORITHM, FILE_BYTES),
    ]
    .into_iter()
    .map(|(unit, algorithm, bytes)| {
        let bits = bytes * 8;
        let model = ChecksumModel::for_algorithm(algorithm, bits)
            .expect("intact's defaults are all modelled");
        let e = Environment {
            block_bits: bits,
            ..*env
        };
        let p_udc = Protection::uniform(model).p_sys_udc(&e);
        let goal = zettabyte_goal(bytes as f64);
        DefaultScore {
            unit,
            algorithm,
            bytes,
            p_udc,
            score: p_udc.score(),
            goal,
            goal_score: goal.score(),
            meets_goal: p_udc <= goal,
        }
    })
    .collect()
}

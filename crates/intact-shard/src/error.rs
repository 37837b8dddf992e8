//! Errors of planning, sharding and merging.

use std::path::PathBuf;

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// The command line asks for something that cannot be done.
    #[error("{0}")]
    Usage(String),
    /// A plan could not be read or written, or is not a plan.
    #[error("plan {}: {why}", path.display())]
    Plan {
        /// The plan file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The shard index is outside the plan.
    #[error("shard {index} is not in the plan, which has shards 0 to {} ({shards} shards); an array job or MPI run must have exactly as many tasks as the plan has shards", shards.saturating_sub(1))]
    NoSuchShard {
        /// The index asked for.
        index: u32,
        /// How many the plan has.
        shards: u32,
    },
    /// A shard report could not be read, or is not one.
    #[error("report {}: {why}", path.display())]
    Report {
        /// The report file.
        path: PathBuf,
        /// Why.
        why: String,
    },
}

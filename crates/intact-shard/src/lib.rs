//! Scale-out for intact on the engines sites already run: a [`Plan`]
//! scans the sources once and cuts them into shards balanced by bytes,
//! each bound for one server; each shard is an ordinary `intact send`,
//! started by a Slurm job array, MPI ranks or a Kubernetes Indexed Job,
//! which finds its index with [`shard_index`]; [`merge`] makes one report
//! of the shards' reports and says what is missing or failed.

/// Most shards a plan may have.
pub const MAX_SHARDS: u32 = 100_000;

mod balance;
mod engine;
mod error;
mod merge;
mod pathtext;
mod plan;
mod split;

pub use balance::{assign, imbalance};
pub use engine::{shard_index, ShardIndex, ENGINE_VARS};
pub use error::ShardError;
pub use merge::{merge, Failure, Merged, ShardRun, ShardStamp};
pub use pathtext::PathText;
pub use plan::{
    write_whole, Plan, PlanInput, PlannedEntry, PlannedRange, Shard, Unreadable, DEFAULT_BLOCK,
    ENTRY_COST, PLAN_FORMAT,
};

//! intact's transfer engine.
//!
//! [`scan`] turns source paths into [`SourceEntry`]s (directories before
//! their contents, symlinks as links). [`Destination`] is the receiving
//! root: every path is resolved under it without following symlinks, a
//! file is written under a hidden partial name and gets its final name
//! only through [`Destination::commit_batch`] (fsync or syncfs, rename,
//! directory fsync).
//! One block pipeline, in two halves: a sender half (read, digest, send,
//! resend) and a receiver half (check, write, verify, commit, journal),
//! joined by a link. [`send`] and [`serve`] run them across TCP
//! (intact-proto), several streams at once; [`copy`] runs the same two
//! halves in process, messages handed over without serialising. Every
//! [`VerifyMode`] works on both, and each file reports the [`VerifyLevel`]
//! it really reached.
//!
//! Device-level verification (`riva`) evicts and re-reads through
//! intact-cache and reports the level each file really reached.

mod adopt;
mod block_size;
mod copy;
mod credits;
mod dest;
mod error;
mod flash;
mod hooks;
mod journal;
mod keep_set;
mod limits;
mod link;
mod model;
mod net;
mod profile;
mod prune;
mod recheck;
mod replica;
mod report;
mod scrub;
mod select;
mod source;
mod source_cache;
mod stage;
mod verify;

pub use adopt::{catalog_add, AdoptOptions, AdoptReport, Adopted};
pub use block_size::{
    mib as block_size_name, BlockSizeReport, Cost, Predicted, Stages,
    CANDIDATES as AUTO_BLOCK_CANDIDATES,
};
pub use copy::{copy, copy_scanned, CopyOptions};
pub use dest::{partial_name, Destination, Mtime, PartialFile};
pub use error::TransferError;
pub use flash::{FlashSettings, DEFAULT_SHARE, MAX_DEFAULT_WINDOW};
pub use hooks::{CommitHook, LinkFault, ScrubReadHook, WriteHook};
pub use intact_cache::ReadPath;
pub use journal::unix_now;
pub use journal::{
    blob_of_crcs, block_matches, crcs_of_blob, failing_block, rebuild_block, recover_intents,
    written_block, BlockRecord, CatalogFile, CatalogSummary, DoneFile, FileRow, Intent, IntentLog,
    Journal, Layout, MountRow, MountSummary, Owner, Page, RebuildError, Recovered, ScrubMark,
    ScrubPass, ScrubState, VerifiedAt, INTENT_LOG, STATE_DIR,
};
pub use keep_set::{KeepSet, Keeps, KEEP_PATH_COST};
pub use limits::raise_open_file_limit;
pub use model::RivaModel;
pub use net::{
    delete_remote, receive, send, send_scanned, serve, wake, DeleteRequest, LocalServer,
    ReceiveLimits, ReceiveOptions, RootError, RootLock, ScrubSchedule, SendOptions, Server,
    ServerConfig, SessionSummary, Spread, SpreadReport, StreamsReport, Working, WorkingNow,
    AUTO_MAX_STREAMS, AUTO_MIN_RTT, AUTO_START_STREAMS, MAX_BYTES_IN_FLIGHT, MAX_FILES_IN_FLIGHT,
    MAX_KEEP_PATHS, MAX_RANGE_BYTES, MIN_RANGE_BYTES,
};
pub use profile::{Profile, Stage, StageTime};

/// Most blocks one range of a split file may have (a range's Status
/// lists them all when the file was committed already).
pub const MAX_RANGE_BLOCKS: u64 = intact_proto::MAX_STATUS_BLOCKS as u64;
/// Most ranges (claimed and confirmed) a server accepts for one split file.
pub const MAX_RANGES: u64 = net::receiver::MAX_RANGES as u64;
/// The smallest block size a split file may be cut at.
pub const MIN_SPLIT_BLOCK: u64 = net::receiver::MIN_SPLIT_BLOCK as u64;
pub use prune::{prune, prune_under, PruneReport};
pub use recheck::Verifiers;
pub use replica::Replica;
pub use report::{CopyReport, FileReport, Progress, RangeReport};
pub use scrub::{
    catalog_root_of, open_catalog, open_catalog_if_free, open_or_create_catalog, scrub,
    scrub_catalog, FileScrub, Repair, RotRange, ScrubOptions, ScrubProgress, ScrubReport,
};
pub use select::{Filter, Rule, RuleKind};
pub use source::{
    origin, range_bytes, restat, scan, scan_with, Placement, Scan, ScanOptions, SourceEntry,
    SourceKind, SourceRange, SourceSpec,
};
pub use source_cache::{SourceCache, SourceCacheSetting, SourceDigest, SourceKey};
pub use verify::{DeviceStats, Reached, VerifyLevel, VerifyMode};

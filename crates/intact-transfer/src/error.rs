//! Errors of the transfer engine.

use std::path::PathBuf;

/// What can go wrong with one file or a whole transfer.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// Options that contradict each other.
    #[error("{0}")]
    Usage(String),
    /// A source could not be read.
    #[error("{}: {}", path.display(), intact_digest::io_reason(source))]
    Source {
        /// The source path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The destination refused a write, a rename or a directory.
    #[error("{path}: {}", intact_digest::io_reason(source))]
    Destination {
        /// The destination path, relative to the root.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A destination path would pass through a symlink or a non-directory.
    #[error("{path}: refused, the path passes through '{component}', which is not a directory (symlinks are never followed)")]
    NotADirectory {
        /// The destination path, relative to the root.
        path: String,
        /// The component that is not a directory.
        component: String,
    },
    /// A block kept failing verification.
    #[error("{path}: block {index} failed verification {attempts} times")]
    BlockRetries {
        /// The destination path.
        path: String,
        /// Block number.
        index: u64,
        /// How many attempts were made.
        attempts: u32,
    },
    /// A file's re-read after the transfer did not match the source.
    #[error("{path}: {what}")]
    Verification {
        /// The destination path.
        path: String,
        /// What did not match.
        what: String,
    },
    /// The source changed while it was being sent.
    #[error("{}: changed while being sent ({what})", path.display())]
    SourceChanged {
        /// The source path.
        path: PathBuf,
        /// What changed.
        what: &'static str,
    },
    /// The receiver's journal failed.
    #[error("journal: {0}")]
    Journal(String),
    /// The path names intact's own state under the root.
    #[error("{0}: refused, names under .intact and .intact-partial-* are reserved for intact")]
    Reserved(String),
    /// Another process holds the root (a running serve, copy or mount).
    #[error(
        "the catalog of {} is in use by another intact process ({}): a running serve, copy or mount keeps it; run this again when it ends (for a mount: after `umount`)",
        root.display(),
        pid.map_or("PID unknown".to_string(), |p| format!("PID {p}"))
    )]
    InUse {
        /// The root.
        root: PathBuf,
        /// The holder's PID, if its lock file says.
        pid: Option<u32>,
    },
    /// The server could not be reached.
    #[error("cannot connect to {addr}: {}", intact_digest::io_reason(source))]
    Connect {
        /// host:port.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A stream held open files and sent no data for them (no Block, no
    /// FileEnd) within its deadline: it ends, and its files' places go
    /// back to the server.
    #[error(
        "ended: {files} files open and no data sent for {secs} s (the server's --idle-timeout)"
    )]
    NoData {
        /// Files the stream held open.
        files: usize,
        /// The deadline, in seconds.
        secs: u64,
    },
    /// What the server reported (`send --delete`), as it said it.
    #[error("{0}")]
    Remote(String),
    /// A path could not be expressed on the wire, or the protocol failed.
    #[error(transparent)]
    Path(#[from] intact_proto::ProtoError),
}

//! The ways `intact-bench wan` moves an item (intact's and the peers'),
//! what each verifies and encrypts, and what one run of a way measured.

use intact_transfer::Spread as SpreadWhen;

use crate::runner::stat_cpu;

/// One way to move the file.
pub(super) enum Way {
    /// intact send with this --spread, this many streams (None:
    /// `--streams auto`) and this block size (None: the default).
    Intact(SpreadWhen, Option<usize>, Option<usize>),
    /// rsync -a -e ssh, with this cipher (None: ssh's default).
    Rsync(Option<&'static str>),
    /// rclone copy over SFTP through the same sshd.
    Rclone,
    /// xrdcp to an xrootd.
    Xrdcp,
    /// globus-url-copy to a GridFTP server.
    Gridftp,
}

impl Way {
    /// intact's defaults (`--spread auto --streams auto`, the default
    /// block size): the way the others are compared with on the page.
    pub(super) fn is_default(&self) -> bool {
        matches!(self, Way::Intact(SpreadWhen::Auto, None, None))
    }

    /// What the way verifies, in a few words (the legend below each run's
    /// tables says it in full).
    pub(super) fn verifies(&self) -> &'static str {
        match self {
            Way::Intact(..) => "every block's XXH3 on arrival; each block re-read from the device after eviction, at both ends (level device)",
            Way::Rsync(_) => "a whole-file checksum of the bytes it wrote, from memory (never re-read)",
            Way::Rclone => "size, and an MD5 md5sum computes over the written file through the page cache",
            Way::Xrdcp => "an Adler-32 the server computes over the written file through the page cache",
            Way::Gridftp => "an MD5 the server computes over the written file through the page cache",
        }
    }

    /// Whether its data is encrypted on the link, and how (`cipher`: ssh's
    /// default; `frames`: what intact's report said of its frames, which
    /// every intact run checks begins with "encrypted").
    pub(super) fn encrypts(&self, cipher: Option<&str>, frames: &str) -> String {
        match self {
            Way::Intact(..) => format!("yes ({frames}, pre-shared key)"),
            Way::Rsync(Some(c)) => format!("yes (ssh, {c})"),
            Way::Rsync(None) => {
                format!("yes (ssh, {})", cipher.unwrap_or("its default cipher"))
            }
            Way::Rclone => "yes (ssh: rclone's own SSH client, its cipher not recorded)".into(),
            Way::Xrdcp => "no (XRootD's TLS needs certificates this testbed has none of)".into(),
            Way::Gridftp => "no (GSI needs certificates; anonymous, data in clear)".into(),
        }
    }
}

pub(super) const WHAT: &str = "what each verifies: intact riva checks every block's XXH3 on arrival and re-reads it from the destination's device after evicting it (level device), at both ends, frames encrypted (AES-256-GCM or ChaCha20-Poly1305); rsync compares a whole-file checksum the receiver computes over the bytes it wrote, from memory (never re-read), over ssh's encryption";

pub(super) const RCLONE_VERIFIES: &str = "rclone over SFTP compares each file's size and the source's MD5 with the one md5sum computes at the far end over the file it wrote, read through the page cache, over ssh's encryption";

pub(super) struct Run {
    pub secs: f64,
    /// The tool's CPU seconds at both ends (the delay line's left out).
    pub cpu: f64,
    /// The delay line's threads' CPU seconds meanwhile.
    pub line: f64,
    pub ranges: u64,
    /// intact's streams at the end of the run (`--streams auto` grows
    /// them); 0 for a peer.
    pub streams: usize,
    /// Why `--streams auto` added streams, step by step.
    pub steps: Vec<String>,
    /// A peer's run that failed (its tool's error, or a copy that did not
    /// check): left out of the figures, reported beside them.
    pub failed: Option<String>,
    /// How intact's frames were protected, as its report says ("" for a
    /// peer).
    pub frames: String,
}

/// CPU seconds of this process's delay line threads so far (named
/// `delayline-…`; they run in this process beside intact's two ends).
pub(super) fn line_cpu() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("delayline"))
        })
        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
        .filter_map(|stat| stat_cpu(&stat))
        .map(|(own, _)| own)
        .sum()
}

/// The streams intact ended its runs with, `a` or `a–b` (– for a peer).
pub(super) fn streams_range(runs: &[&Run]) -> String {
    let lo = runs.iter().map(|r| r.streams).min().unwrap_or(0);
    let hi = runs.iter().map(|r| r.streams).max().unwrap_or(0);
    match (lo, hi) {
        (0, 0) => "–".into(),
        (a, b) if a == b => a.to_string(),
        (a, b) => format!("{a}–{b}"),
    }
}

/// A single file's BLAKE3, to check a peer's copy.
pub(super) fn digest_of(path: &std::path::Path) -> anyhow::Result<String> {
    let bytes = std::fs::read(path)?;
    Ok(intact_digest::hash_parallel(intact_digest::Algorithm::Blake3, &bytes).to_hex())
}

/// A way's block size that stands for `--block-size auto`.
pub(super) const AUTO_BLOCK: usize = 0;

//! Command-line flags, parsed into plain values. Building what the flags ask
//! for (thread pools, plans, file lists) happens in the command modules.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use intact_digest::Algorithm;

/// Move and keep scientific data with integrity verified on the device.
#[derive(Debug, Parser)]
#[command(name = "intact", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Copy files and trees locally through the verified block pipeline.
    #[command(long_about = crate::verify_help::copy_about())]
    Copy(CopyArgs),
    /// Receive transfers: the daemon that `intact send` talks to.
    #[command(long_about = SERVE_ABOUT)]
    Serve(ServeArgs),
    /// Send files and trees to an `intact serve` over TCP.
    #[command(long_about = SEND_ABOUT, override_usage = SEND_USAGE)]
    Send(SendArgs),
    /// Write a fresh random key file for `serve` and `send --key-file`.
    #[command(long_about = KEYGEN_ABOUT)]
    Keygen(KeygenArgs),
    // Its texts are constants: `crate::sum_parse` builds the same command alone.
    #[command(about = SUM_SHORT, long_about = SUM_ABOUT)]
    Sum(SumArgs),
    /// Make a sample dataset in a temporary directory, run intact's main job on it, print the report.
    Demo(DemoArgs),
    /// Probability of undetected corruption: the Z²FS framework, RIVA's analysis, intact's defaults.
    #[command(long_about = RELIABILITY_ABOUT)]
    Reliability(ReliabilityArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(long_about = crate::generate::COMPLETIONS_ABOUT)]
    Completions(CompletionsArgs),
    /// Print intact's man page (roff), or write one per command into a directory.
    #[command(long_about = crate::generate::MAN_ABOUT)]
    Man(ManArgs),
    /// Re-read cataloged files from the device and report rot by byte range.
    #[command(long_about = crate::scrub::SCRUB_ABOUT)]
    Scrub(crate::scrub::ScrubArgs),
    /// What the catalog of a root holds: levels at arrival, scrubs, rot.
    #[command(long_about = crate::scrub::STATUS_ABOUT)]
    Status(crate::scrub::StatusArgs),
    /// Adopt files already under a root into its catalog (`catalog add`).
    #[command(long_about = crate::catalog::CATALOG_ABOUT)]
    Catalog(crate::catalog::CatalogArgs),
    /// Present a cataloged root through FUSE, every read checked against its page CRCs.
    #[command(long_about = crate::mount::MOUNT_ABOUT)]
    Mount(crate::mount::MountArgs),
    /// Scan sources once and cut them into balanced shards for `send --plan` (Slurm, MPI, Kubernetes).
    #[command(long_about = crate::shard::PLAN_ABOUT)]
    Plan(crate::shard::PlanArgs),
    /// Merge the JSON reports of a plan's shards (`report merge`).
    #[command(long_about = crate::shard::REPORT_ABOUT)]
    Report(crate::shard::ReportArgs),
    /// A recovery cache near a destination: keeps blocks seen on mirrored packets or a relay, serves repairs.
    #[command(long_about = crate::cache::CACHE_ABOUT)]
    Cache(crate::cache::CacheArgs),
}

const RELIABILITY_ABOUT: &str = "\
Probability of undetected corruption, by the analytical framework of the
Z²FS paper (Zhang et al.) and the RIVA paper's analysis.

Default mode: P_sys-udc and the reliability score (−log10 P) of the paper's
systems (ncfs, zfs, e2zfs-xor, e2zfs-fletcher, z2fs-static, z2fs-dynamic)
for one memory and one disk, against the Zettabyte goal (one undetected
corruption per 2^70 bytes read in blocks of --block-size).
--solve-switch: also solve Z²FS's checksum switching time t_switch.
--transfer: RIVA's probability that an undetected disk error in one
transferred block escapes verification (bE with page-cache verification,
bE² with device re-reads), per --verify mode.
--defaults: the score of intact's own default page, block and file
checksums, for the paper's four configurations.

Memory: --mem-index (−log10 λ), --lambda (errors/bit/s) or --fit-per-mbit.
Disk: --disk-index (−log10 UBER) or --uber. --config N takes both from the
paper's Table I (1: worst, 2: non-ECC + regular disk, 3: ECC + regular disk,
4: ECC + best disk); a memory or disk flag given with it replaces that half
(the first line of the output shows the values used).";

#[derive(Debug, Args)]
pub struct ReliabilityArgs {
    /// One of the paper's Table I configurations (1-4) for memory and disk;
    /// an explicit memory or disk flag replaces that half.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..=4))]
    pub config: Option<u8>,

    /// Memory reliability index, −log10(λ) [default: 14.2, non-ECC].
    #[arg(long, value_name = "X", group = "memory")]
    pub mem_index: Option<f64>,

    /// Memory error rate λ, in bit flips per bit per second.
    #[arg(long, value_name = "L", group = "memory")]
    pub lambda: Option<f64>,

    /// Memory error rate in FIT per Mbit (failures per 10^9 hours per 2^20 bits).
    #[arg(long, value_name = "F", group = "memory")]
    pub fit_per_mbit: Option<f64>,

    /// Disk reliability index, −log10(UBER) [default: 12].
    #[arg(long, value_name = "X", group = "disk")]
    pub disk_index: Option<f64>,

    /// Disk undetected bit error rate.
    #[arg(long, value_name = "E", group = "disk")]
    pub uber: Option<f64>,

    /// Block size [default: 4KiB; with --transfer, intact's transfer block size].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub block_size: Option<usize>,

    /// Seconds a block stays in the reader's memory (t_resident).
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    pub resident: f64,

    /// Seconds a dirty block stays in the writer's memory before flushing.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    pub flush: f64,

    /// Only this system (ncfs, zfs, e2zfs-xor, e2zfs-fletcher, z2fs-static, z2fs-dynamic).
    #[arg(long, value_name = "S", value_parser = parse_system)]
    pub system: Option<intact_reliability::System>,

    /// Switching time for z2fs-dynamic, in seconds [default: solved for the goal].
    #[arg(long, value_name = "SECS")]
    pub t_switch: Option<f64>,

    /// Also solve Z²FS's checksum switching time t_switch for the goal.
    #[arg(long)]
    pub solve_switch: bool,

    /// RIVA's per-block probabilities for a transfer instead of file systems.
    #[arg(long, conflicts_with_all = ["defaults", "system", "solve_switch"])]
    pub transfer: bool,

    /// With --transfer: only this verification mode.
    #[arg(long, value_name = "MODE", requires = "transfer", value_parser = crate::verify_help::verify_parser())]
    pub verify: Option<intact_transfer::VerifyMode>,

    /// The score of intact's default checksums for the paper's four configurations.
    #[arg(long, conflicts_with_all = ["system", "solve_switch"])]
    pub defaults: bool,

    /// Print one JSON document instead of tables.
    #[arg(long)]
    pub json: bool,
}

fn parse_system(s: &str) -> Result<intact_reliability::System, String> {
    intact_reliability::System::ALL
        .into_iter()
        .find(|x| x.name() == s)
        .ok_or_else(|| {
            let names: Vec<_> = intact_reliability::System::ALL
                .iter()
                .map(|x| x.name())
                .collect();
            format!("unknown system '{s}' (known: {})", names.join(", "))
        })
}

const SERVE_ABOUT: &str = "\
Receive transfers from `intact send` and write them under --root, and only
there: every path from the wire is relative and normalised, and is resolved
without following symlinks. Each block is checked against the digest that
travels with it and asked for again if it fails; a file gets its final name
only once verified and fsynced (see `intact copy --help` for the modes).

With --key-file, clients must prove they hold the same key (mutual
challenge-response over keyed BLAKE3; the key never crosses the wire), and
every frame after that is sealed with per-connection keys (HKDF-SHA256 over
the key and both sides' fresh nonces) by AES-256-GCM where both CPUs have
AES instructions, else ChaCha20-Poly1305: encrypted, and numbered, so a
forged, altered, replayed, reordered or dropped frame ends the session.
--no-encrypt keeps every frame authenticated but leaves its bytes readable
(for a capture-based cache on the path). Make a key with `intact keygen
FILE`; a key file holding anything else is a passphrase (16 bytes or more),
stretched with Argon2id. A key file may instead be a keyring that confines
each client to its own subtree of the root, one line per client:
`intact-client-v1 NAME SUBTREE SECRET` (SECRET: `intact-key-v1 HEX` or a
passphrase; subtrees may not contain one another; each has its own journal
under ROOT/.intact/clients/).

Without a key there is no secret to derive frame keys from: frames are
plain (neither encrypted nor authenticated), only loopback clients are
served, and a keyless server refuses to listen on any address that is
not loopback. --listen 127.0.0.1:0 picks a free port; the first line
printed says which. SIGINT or SIGTERM
stop the server: new connections are refused, transfers in progress keep
their partial data hidden, nothing unverified is ever given its final name.

The root is checked before anything listens (a directory, created if
missing) and locked (ROOT/.intact/lock holds the server's PID): a second
server on the same root refuses to start and names the first. One client
is one `intact send` run, whatever its --streams. The log has one line per
client session with its totals and one per failure; -v adds one per
stream and per refused connection.

Exit status: 0 once stopped by a signal; 1 if it cannot start (the root is
in use, the address is taken, the journal cannot be opened); 2 for usage
errors (a --root that is not a usable directory, a bad --key-file, a
keyless server asked to listen beyond loopback).";

const KEYGEN_ABOUT: &str = "\
Write a fresh key: 32 random bytes from the operating system, as one line
`intact-key-v1 <64 hex digits>`. The file is created with mode 600 and
never replaces an existing file (O_EXCL) unless --force is given (then the
new key is written beside it, mode 600, and renamed over it). Give the
same file to `intact serve --key-file` and `intact send --key-file`, or
put its line into a keyring line of the server (see `intact serve --help`).

Exit status: 0 if the key was written; 1 if it could not be; 2 for usage
errors (the file exists and --force was not given).";

#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// The key file to create.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,

    /// Replace FILE if it exists.
    #[arg(long)]
    pub force: bool,
}

const SEND_USAGE: &str = "intact send [OPTIONS] <SRC>... <HOST:PORT>
       intact send [OPTIONS] --plan <PLAN> [--shard <I>]";

const SEND_ABOUT: &str = "\
Send files and trees to `intact serve` at HOST:PORT, optionally into a
subdirectory of its root (HOST:PORT:/subdir). Each SRC arrives under its
own name (`DIR/`: its contents), as with `intact copy`; -L,
--include/--exclude, --dry-run, --bwlimit and --delete work as there.
With --delete, once every entry was sent and verified, the server removes
what it holds under the sent directories (inside its root, or the
subdirectory) and the sources no longer have; excluded entries, .intact/
and partial files are kept, symlinks are removed as links, never
followed; if any entry failed, nothing is deleted. --delete --dry-run
sends nothing and asks the server what it would delete. Several TCP
streams (--streams) carry many files at once; blocks and results flow
both ways without waiting for round trips. A block that fails verification is resent alone, up to
--retries times; then that file fails and the others go on.

Resume: the server keeps a journal of verified blocks (SQLite, in
ROOT/.intact/), with the mode and level each was verified at. Running the
same send again after either side was interrupted sends only the blocks
not yet verified, and a file the server already holds whole is not sent
again if the whole-file BLAKE3 it recorded at commit equals the sender's
BLAKE3 of its source (read now, or from the source-digest cache); size
and mtime only pick the candidate, unlike rsync's quick check. What is held counts only at the level it was checked
at: held blocks and files recorded below what --verify aims at are
re-verified in place by that mode (riva: re-read from the device at both
ends); --reverify re-verifies every held file that way. The report counts
bytes sent, re-verified in place and trusted from the journal.

Scale-out: `intact send --plan PLAN [--shard I] --report FILE` sends one
shard of a plan made by `intact plan` (its entries, to its server), with
the flags above as for any send; without --shard, the index comes from the
engine running it (Slurm job array, Kubernetes Indexed Job, MPI rank; see
--shard). Its report carries the plan's id and the shard's index for
`intact report merge`; running a failed shard again resumes it.

Exit status: 0 if everything arrived verified; 1 if anything failed;
2 for usage errors.";

/// `intact sum`'s line in `intact --help` (as clap shows a doc comment:
/// without its final period).
pub const SUM_SHORT: &str =
    "Print or check file digests, in the formats of sha256sum, b3sum and xxhsum";

pub const SUM_ABOUT: &str = "\
Print or check file digests.

Output lines have the format of the usual tool for each algorithm, so lists
interoperate both ways: sha256, sha512, sha1 and md5 like sha256sum/sha512sum/sha1sum/md5sum,
blake3 like b3sum, xxh128 like `xxhsum -H2`, xxh3 like `xxhsum -H3`
(`XXH3 (NAME) = HEX`). crc32c and adler32 print `HEX  NAME` (8 hex digits,
big-endian, as xrdcp prints them).

Files are hashed in parallel; BLAKE3, CRC-32C and Adler-32 also split one
large file across threads. Large regular files are memory-mapped; --no-mmap
forces plain reads into 4 KiB-aligned buffers.

Exit status: 0 if every file was hashed (and, with --check, matched);
1 if any file was missing, unreadable, a directory, mismatched, or a check
line was malformed; 2 for usage errors.";

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The directory everything is received under (created if missing).
    #[arg(long, value_name = "DIR")]
    pub root: PathBuf,

    /// Address to listen on (port 0: any free port, printed at start).
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:4750")]
    pub listen: String,

    /// Pre-shared key file (mode 600) or keyring; clients must hold the
    /// same key (a keyring confines each client to its subtree).
    #[arg(long, value_name = "F")]
    pub key_file: Option<PathBuf>,

    /// Authenticate every frame but do not encrypt it (a capture-based
    /// cache on the path can then read the data); needs --key-file.
    #[arg(long, requires = "key_file")]
    pub no_encrypt: bool,

    /// Clients served at once (one `intact send` run is one client,
    /// whatever its --streams); more are refused with a reason.
    #[arg(long, value_name = "N", default_value_t = 16, alias = "max-connections", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_sessions: u32,

    /// TCP streams one client may open (`intact send --streams`).
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_streams_per_session: u32,

    /// Seconds a client may go without progress (no reply of ours read, no
    /// whole message answered, less than 16 KiB sent) before it is
    /// dropped; also bounds the handshake (at most 10 s).
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    pub idle_timeout: u64,

    /// Memory the server may hold at once for what all clients send:
    /// frames received and not yet written, --delete keep lists (40 bytes
    /// a path), e.g. 2GiB; each of --max-sessions clients is guaranteed a
    /// share of it (raised to two 16 MiB frames per client).
    #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = parse_size)]
    pub frame_memory: usize,

    /// Seconds a file may wait for a place among the files a client may
    /// hold open before it is refused "server busy" (0: at once). The
    /// places are mostly the client's own, given back as its streams
    /// commit: a sender keeps more files in flight than a busy server's
    /// share for one client.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub admit_wait: u64,

    /// Keep the setuid, setgid and sticky bits of received files and
    /// directories (by default they are cleared: a client must not be able
    /// to plant a setuid file owned by the server's user). Directories a
    /// session did not create keep their own mode and time in any case.
    #[arg(long)]
    pub keep_special_bits: bool,

    /// Paths the source of one `send --delete` may have at most (the list
    /// the server holds to know what to keep); more are refused with a reason.
    #[arg(long, value_name = "N", default_value_t = intact_transfer::MAX_KEEP_PATHS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_delete_paths: usize,

    /// Let clients fetch byte ranges of the files under their root (the
    /// root, or a keyring client's subtree): what `intact scrub
    /// --repair-from HOST:PORT` asks a replica for. Off by default: a
    /// client that may write here may not read here unless this is given.
    /// Needs --key-file (a keyless server would let any local user read).
    #[arg(long)]
    pub allow_fetch: bool,

    /// Scrub the root's catalog in the background (as `intact scrub`, at
    /// the idle I/O priority class): a pass at start and once per period
    /// over the files not scrubbed within it (e.g. 7d, 12h); what it finds
    /// is logged and kept for `intact status`.
    #[arg(long, value_name = "AGE", value_parser = crate::scrub::parse_age)]
    pub scrub_every: Option<std::time::Duration>,

    /// At most this many bytes read per second by the background scrub
    /// (500 = 500 KiB/s, 10M, 1G).
    #[arg(long, value_name = "RATE", requires = "scrub_every", value_parser = crate::tree_args::parse_rate)]
    pub scrub_rate: Option<u64>,

    /// Recovery caches near this server (`intact cache`, fed by mirrored
    /// packets or relaying the senders): a block that fails its check is
    /// asked of them, by the BLAKE3 its sender adds to each block when
    /// this is set, before the sender is asked again. A cache's block is
    /// taken only if it hashes to that BLAKE3; a cache that is down only
    /// makes repairs come from the sender. Mirror capture needs senders to
    /// use --no-encrypt (this server then needs it too), or the relay.
    #[arg(long, value_name = "HOST:PORT[,HOST:PORT...]", value_delimiter = ',', value_parser = parse_cache_addr)]
    pub recovery_cache: Vec<String>,

    /// Log a line per stream and per refused connection, not only one per
    /// client session (with its totals) and one per failure.
    #[arg(short, long)]
    pub verbose: bool,

    #[command(flatten)]
    pub flash: FlashArgs,
}

#[derive(Debug, Args)]
pub struct SendArgs {
    /// Files and directories to send, each arriving under its own name
    /// (`DIR/`, with a trailing slash: its contents), then the server as
    /// HOST:PORT or HOST:PORT:/subdir ([IPv6]:PORT too).
    #[arg(value_name = "SRC... HOST:PORT", num_args = 1.., required_unless_present = "plan")]
    pub operands: Vec<PathBuf>,

    /// Send one shard of a plan made by `intact plan` (which names the
    /// sources and the server: give neither here).
    #[arg(long, value_name = "PLAN", conflicts_with_all = ["operands", "delete"])]
    pub plan: Option<PathBuf>,

    /// The shard to send (0, 1, …). Default: the index the engine gives,
    /// from SLURM_ARRAY_TASK_ID (a Slurm job array), JOB_COMPLETION_INDEX
    /// (a Kubernetes Indexed Job), OMPI_COMM_WORLD_RANK (Open MPI),
    /// PMI_RANK or PMIX_RANK (other MPI launchers), the first one set.
    #[arg(long, value_name = "I", requires = "plan")]
    pub shard: Option<u32>,

    /// Also write the JSON report to FILE (for `intact report merge`);
    /// `{shard}` in the name becomes the shard's index. Written at the
    /// start (saying the run has not ended) and replaced at the end, on
    /// SIGINT or SIGTERM, or when the connection is lost; not with --dry-run.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,

    /// Pre-shared key file (mode 600): a key from `intact keygen` or a
    /// passphrase, the same as the server's (or as this client's keyring line).
    #[arg(long, value_name = "F")]
    pub key_file: Option<PathBuf>,

    /// After everything was sent and verified, have the server remove
    /// what it holds under the sent directories and the sources no longer
    /// have (excluded entries are kept; symlinks are removed as links,
    /// never followed). With --dry-run, only list it (nothing is sent).
    #[arg(long)]
    pub delete: bool,

    /// Spread each file of 32MiB or more over the streams as block ranges
    /// (16MiB to 256MiB), so that one file fills every stream's TCP window
    /// on a long link; the server commits it once all ranges verified.
    /// auto: when a TCP connect takes 1ms or more; always; never. Only
    /// --verify riva, block, fiver and none verify a range alone.
    #[arg(long, value_name = "WHEN", default_value = "auto")]
    pub spread: intact_transfer::Spread,

    /// Keep files matching PATTERN out of recovery caches (the server's
    /// `--recovery-cache`): their blocks go without the BLAKE3 a cache
    /// keeps them by, so their repairs come from this sender. Patterns as
    /// --exclude; default: every file may be cached.
    #[arg(long, value_name = "PATTERN")]
    pub cache_exclude: Vec<String>,

    /// Let files matching PATTERN be cached even if a later
    /// --cache-exclude matches them (e.g. --cache-include '*.h5'
    /// --cache-exclude '*').
    #[arg(long, value_name = "PATTERN")]
    pub cache_include: Vec<String>,

    #[command(flatten)]
    pub tree: crate::tree_args::TreeArgs,

    #[command(flatten)]
    pub pipeline: PipelineArgs,
}

/// Options shared by `copy` and `send`.
#[derive(Debug, Args)]
pub struct PipelineArgs {
    /// Verification mode: how far each file is checked.
    #[arg(long, value_name = "MODE", default_value_t = intact_transfer::VerifyMode::DEFAULT, value_parser = crate::verify_help::verify_parser())]
    pub verify: intact_transfer::VerifyMode,

    /// How riva's device reads (the source's and the destination's
    /// re-reads) reach the device: evict (flush, drop the pages, confirm
    /// with cachestat, or mincore before Linux 6.5, then read) or direct
    /// (O_DIRECT; falls back to evict where the file system refuses it).
    #[arg(long, value_name = "PATH", default_value = "evict", value_parser = parse_read_path)]
    pub read_path: intact_cache::ReadPath,

    /// Fail every file that does not reach this level (none, network,
    /// cache, device, media) instead of accepting it with a warning; e.g.
    /// riva to a tmpfs destination reaches only `cache`.
    #[arg(long, value_name = "LEVEL", value_parser = parse_level)]
    pub require_level: Option<intact_transfer::VerifyLevel>,

    /// Block size: a multiple of 4KiB from 4KiB to 16MiB, or auto:
    /// chosen among 1 to 16MiB by the RIVA paper's model (Eq. 1) from a
    /// probe of a few hundredths of a second (copy: the source read
    /// directly and a few blocks written, evicted and re-read on the
    /// destination's file system; send: the source, and the connect's
    /// round trip; the server's device is not probed). It keeps 4MiB
    /// unless another size is predicted 5% faster, keeps 4MiB unprobed
    /// under 1GiB in files larger than 1MiB, and in a copy keeps the size
    /// at which the destination's journal already holds a file. Files
    /// held at one size are sent again at another; the resume command
    /// names the size chosen. Not with --plan. The --json report's
    /// block_size says what was measured, predicted and chosen.
    #[arg(long, value_name = "SIZE|auto", default_value = "4MiB", value_parser = crate::block_size::parse_block_size_or_auto)]
    pub block_size: crate::block_size::BlockSize,

    /// Streams: files (or a large file's ranges) in flight at once, each
    /// its own TCP connection for send. auto (the default): 4; a send
    /// whose round trip is 1 ms or more adds streams, up to 16, while the
    /// kernel reports their send buffers, not the link, holding them back
    /// (TCP_INFO), and its report says when and why. N: exactly N (1 to
    /// 256).
    #[arg(long, value_name = "N|auto", default_value = "auto", value_parser = parse_streams)]
    pub streams: Streams,

    /// Resends of one block before its file fails.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub retries: u32,

    /// Re-verify files the destination already holds, by the --verify
    /// mode's own means (riva: re-read from the device at both ends),
    /// instead of trusting its journal's record of them.
    #[arg(long)]
    pub reverify: bool,

    /// Do not use the source-digest cache ($XDG_CACHE_HOME/intact, else
    /// ~/.cache/intact): every source the destination holds whole is read
    /// to compare its digest with the destination's. (--reverify never
    /// uses it.)
    #[arg(long)]
    pub no_source_cache: bool,

    /// Print one JSON report (per-file size, digest, blocks resent, mode, level, times).
    #[arg(long)]
    pub json: bool,

    /// Print every entry as it is done.
    #[arg(short, long)]
    pub verbose: bool,

    /// Print nothing but errors (no summary, no warnings).
    #[arg(short, long, conflicts_with_all = ["verbose", "json"])]
    pub quiet: bool,
}

#[derive(Debug, Args)]
pub struct CopyArgs {
    /// Files and directories to copy, each into DST under its own name
    /// (`DIR/`, with a trailing slash: its contents).
    #[arg(value_name = "SRC", num_args = 1.., required = true)]
    pub sources: Vec<PathBuf>,

    /// The destination directory (created if missing), or for a single
    /// file, its new name.
    #[arg(value_name = "DST", required = true)]
    pub dest: PathBuf,

    /// After everything was copied and verified, remove what the
    /// destination holds under the copied directories and the sources no
    /// longer have (excluded entries are kept; symlinks are removed as
    /// links, never followed). With --dry-run, only list it.
    #[arg(long)]
    pub delete: bool,

    #[command(flatten)]
    pub tree: crate::tree_args::TreeArgs,

    #[command(flatten)]
    pub pipeline: PipelineArgs,

    #[command(flatten)]
    pub flash: FlashArgs,
}

/// How the receiving end runs `--verify flash` (`copy`, `serve`).
#[derive(Debug, Args)]
pub struct FlashArgs {
    /// --verify flash: the destination device's write-cache window W; a
    /// block is re-read only after W bytes were written to the device
    /// after it (counted by the device's own sectors-written counter).
    /// Default: 0.1% of the device's capacity (Kim et al.), at most 1GiB.
    #[arg(long, value_name = "SIZE", value_parser = parse_window)]
    pub device_cache: Option<u64>,

    /// --verify flash: filler a receiving stream may write at once (to a
    /// scratch file on the destination, fsynced, then removed) to push the
    /// blocks not yet due past the window when the sender waits; a
    /// server's stream writes in all at most 4 times the bytes it
    /// received (a copy's, two drains more). Blocks the
    /// filler cannot push past are re-read at once and reported at level
    /// device, with the reason. Default: W; 0 writes none.
    #[arg(long, value_name = "SIZE", value_parser = parse_size_or_zero)]
    pub max_filler: Option<u64>,

    /// Threads that share the receiver's re-reads of written blocks and
    /// their page checks (riva, block, flash), blocks of one file among
    /// them: one pool for all sessions, taking each session's batches in
    /// turn (up to 8 MiB each); each thread holds a buffer of one block.
    /// With 1, each session re-reads on its own thread. Default: one per
    /// core.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub verifiers: Option<u16>,
}

impl FlashArgs {
    /// The receiver's settings.
    pub fn settings(&self) -> intact_transfer::FlashSettings {
        intact_transfer::FlashSettings::new(self.device_cache, self.max_filler)
    }

    /// The receiver's verifier threads.
    pub fn verifiers(&self) -> intact_transfer::Verifiers {
        match self.verifiers {
            Some(n) => intact_transfer::Verifiers::new(usize::from(n)),
            None => intact_transfer::Verifiers::default(),
        }
    }
}

fn parse_size_u64(s: &str) -> Result<u64, String> {
    parse_size(s).map(|n| n as u64)
}

/// `--max-filler`: a size, or 0 (no filler at all), with or without a unit.
fn parse_size_or_zero(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    if !num.is_empty() && num.bytes().all(|b| b == b'0') {
        // The unit must still be one (0KiB is 0; 0x is not a size).
        return parse_size(&format!("1{unit}")).map(|_| 0);
    }
    parse_size_u64(s)
}

/// `--device-cache`: a window of no bytes would claim the media at once.
fn parse_window(s: &str) -> Result<u64, String> {
    match parse_size_u64(s)? {
        0 => Err("the device's write cache window must be more than 0 bytes".into()),
        n => Ok(n),
    }
}

fn parse_read_path(s: &str) -> Result<intact_cache::ReadPath, String> {
    match s.parse()? {
        intact_cache::ReadPath::Cached => Err(
            "--read-path cached would not reach the device; use --verify block for cached re-reads"
                .into(),
        ),
        p => Ok(p),
    }
}

fn parse_level(s: &str) -> Result<intact_transfer::VerifyLevel, String> {
    s.parse()
}

#[derive(Debug, Args)]
pub struct SumArgs {
    /// Files to hash (with --check: checksum lists to verify); '-' or none reads standard input.
    #[arg(value_name = "PATH")]
    pub paths: Vec<PathBuf>,

    /// Digest algorithm: crc32c, xxh3, xxh128, blake3, sha256, sha1, md5, adler32, sha512 [default: blake3].
    /// With --check, lines tagged with an algorithm (e.g. `XXH3 (f) = ...`) use their tag.
    #[arg(short, long, value_name = "A", value_parser = parse_algorithm)]
    pub algo: Option<Algorithm>,

    /// Read checksum lists from PATHs and verify every file they name.
    #[arg(short, long)]
    pub check: bool,

    /// With --check, do not print a line for each file that matched.
    #[arg(short, long, requires = "check")]
    pub quiet: bool,

    /// With --check, print nothing on standard output; the exit status tells.
    #[arg(long, requires = "check", conflicts_with = "json")]
    pub status: bool,

    /// With --check, skip files the lists name that do not exist.
    #[arg(long, requires = "check")]
    pub ignore_missing: bool,

    /// With --check, fail on improperly formatted lines (intact always does; for sha256sum scripts).
    #[arg(long, requires = "check")]
    pub strict: bool,

    /// Print BSD-style lines (`SHA256 (NAME) = HEX`) for every algorithm.
    #[arg(long, conflicts_with_all = ["check", "json"])]
    pub tag: bool,

    /// End each line with NUL, not newline, and do not escape names.
    #[arg(short, long, conflicts_with_all = ["check", "json"])]
    pub zero: bool,

    /// Hash regular files found under directories (symlinks and special files are skipped with a note).
    #[arg(short, long, conflicts_with = "check")]
    pub recursive: bool,

    /// Number of threads [default: all cores].
    #[arg(short, long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub jobs: Option<u16>,

    /// Print one JSON document (per-file digests, sizes, times, errors) instead of lines.
    #[arg(long)]
    pub json: bool,

    /// Also compute per-block digests with this block size (e.g. 4MiB); needs --json.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, requires = "json", conflicts_with = "check")]
    pub block_size: Option<usize>,

    /// Also compute the CRC-32C of every 4 KiB page; needs --json.
    #[arg(long, requires = "json", conflicts_with = "check")]
    pub pages: bool,

    /// Never memory-map files; always read them into aligned buffers.
    #[arg(long)]
    pub no_mmap: bool,

    /// Memory-map every regular file (to measure; the default picks per file).
    #[arg(long, conflicts_with = "no_mmap")]
    pub mmap: bool,
}

/// `intact completions SHELL`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_name = "SHELL")]
    pub shell: clap_complete::Shell,
}

/// `intact man [COMMAND] [--dir DIR]`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// The command whose page to print (copy, send, ...) [default: intact's own].
    #[arg(value_name = "COMMAND", conflicts_with = "dir")]
    pub command: Option<String>,

    /// Write intact.1 and one page per command (intact-copy.1, ...) into
    /// this directory instead of printing intact.1.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,

    /// Size of the large sample file, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 256)]
    pub large_mib: u64,
}

fn parse_algorithm(s: &str) -> Result<Algorithm, String> {
    s.parse()
        .map_err(|e: intact_digest::DigestError| e.to_string())
}

/// Parses a byte size: a number with an optional unit (K, KiB, M, MiB, G,
/// GiB; all powers of 1024, since block sizes are).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: usize = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (examples: 4096, 64KiB, 4MiB)"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        other => return Err(format!("unknown size unit '{other}' (use K, M or G)")),
    };
    let size = n
        .checked_mul(1usize << shift)
        .ok_or_else(|| format!("'{s}' is too large"))?;
    if size == 0 {
        return Err("size must be greater than 0".into());
    }
    Ok(size)
}

/// A recovery cache's address: HOST:PORT.
fn parse_cache_addr(s: &str) -> Result<String, String> {
    match s.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) => {
            Ok(s.to_string())
        }
        _ => Err(format!("'{s}' is not HOST:PORT")),
    }
}

/// `--streams`: how many streams a transfer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Streams {
    /// [`intact_transfer::AUTO_START_STREAMS`], growing on a long link.
    Auto,
    /// Exactly this many.
    Fixed(u16),
}

impl Streams {
    /// Streams connected before data moves.
    pub fn start(self) -> usize {
        match self {
            Streams::Auto => intact_transfer::AUTO_START_STREAMS,
            Streams::Fixed(n) => usize::from(n),
        }
    }

    /// Streams a send may grow to.
    pub fn max(self) -> usize {
        match self {
            Streams::Auto => intact_transfer::AUTO_MAX_STREAMS,
            Streams::Fixed(n) => usize::from(n),
        }
    }
}

fn parse_streams(s: &str) -> Result<Streams, String> {
    if s == "auto" {
        return Ok(Streams::Auto);
    }
    match s.parse::<u16>() {
        Ok(n @ 1..=256) => Ok(Streams::Fixed(n)),
        _ => Err(format!(
            "{s:?} is not a stream count: auto, or a number from 1 to 256"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn max_filler_takes_zero_and_sizes() {
        assert_eq!(parse_size_or_zero("0"), Ok(0));
        assert_eq!(parse_size_or_zero("0MiB"), Ok(0));
        assert_eq!(parse_size_or_zero("4MiB"), Ok(4 << 20));
        assert!(parse_size_or_zero("0x").is_err());
        assert!(parse_size_or_zero("").is_err());
    }

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn streams_are_auto_or_a_count_from_1_to_256() {
        assert_eq!(parse_streams("auto"), Ok(Streams::Auto));
        assert_eq!(parse_streams("1"), Ok(Streams::Fixed(1)));
        assert_eq!(parse_streams("256"), Ok(Streams::Fixed(256)));
        for bad in ["0", "257", "-1", "", "Auto", "4x"] {
            assert!(parse_streams(bad).is_err(), "{bad}");
        }
        assert_eq!(Streams::Auto.start(), 4);
        assert_eq!(Streams::Auto.max(), 16);
        assert_eq!(Streams::Fixed(7).start(), Streams::Fixed(7).max());
    }

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("4M"), Ok(4 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("0").is_err());
        assert!(parse_size("4X").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
    }
}

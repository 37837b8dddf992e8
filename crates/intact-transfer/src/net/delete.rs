//! `send --delete`: the sender asks the server to prune, after the
//! transfer succeeded (or, in a dry run, instead of it), with what the
//! source has; the server checks every path and bound before it holds
//! anything, prunes through [`prune_under`] and answers with its report.
//!
//! The exchange, on a connection of its own after the handshake:
//! DeleteStart (base, scopes, rules, dry run), DeleteKeep chunks,
//! DeleteRun; the server answers DeleteReport chunks and DeleteDone, or
//! Refused with the reason. Then Bye, answered by Bye.

use std::path::Path;

use intact_proto::{
    Connection, Held, Message, Party, ProtoError, Refused, WirePath, DELETE_CHUNK_BYTES,
    LIST_ITEM_COST,
};

use crate::journal::STATE_DIR;
use crate::keep_set::{KeepSet, KEEP_PATH_COST};
use crate::link::Outbound;
use crate::prune::{prune_under, PruneReport};
use crate::select::{Filter, Rule, RuleKind};
use crate::TransferError;

/// Most keep paths a server accepts in one request, unless configured.
pub const MAX_KEEP_PATHS: usize = 10_000_000;
/// Most bytes of include/exclude patterns one request may carry (an
/// honest send has a few short ones): matching costs the pattern's length
/// for every byte of every path pruned.
pub const MAX_RULE_BYTES: usize = 16 << 10;
/// What a request's scopes and rules may hold in memory per byte of them
/// and per item, charged to the client's share: a rule keeps its text
/// twice and its compiled form (up to 40 bytes per pattern byte).
const REQUEST_BYTE_COST: u64 = 48;
const REQUEST_ITEM_COST: u64 = 128;

/// What `send --delete` asks of the server (paths relative to `base`).
#[derive(Debug, Clone, Default)]
pub struct DeleteRequest {
    /// The directories the sources cover (empty: `base` itself).
    pub scopes: Vec<Vec<u8>>,
    /// Every path the source has.
    pub keep: Vec<Vec<u8>>,
    /// The include/exclude rules of the send.
    pub filter: Filter,
    /// List only.
    pub dry_run: bool,
}

/// The server's side of one request, from DeleteStart to DeleteRun.
pub(crate) struct Pending {
    base: Vec<u8>,
    scopes: Vec<Vec<u8>>,
    filter: Filter,
    pub(crate) dry_run: bool,
    keep: KeepSet,
    max_paths: usize,
    /// The session's place in the server's memory for what clients send,
    /// which the keep list is charged to (None: not budgeted).
    memory: Option<Party>,
    /// What the keep list holds of it.
    held: Option<Held>,
}

/// Why `what` was refused a part of the client's memory share.
fn busy(what: &str, r: &Refused) -> String {
    format!(
        "--delete refused: server busy: {what} would take more of its memory than this client may hold now ({} MiB held of {} MiB, {} MiB guaranteed to each client); try again later",
        r.holds >> 20,
        r.total >> 20,
        r.share >> 20
    )
}

/// Empty, or a path from the wire that stays inside and does not name
/// intact's own state.
fn checked(what: &str, rel: &[u8], top: bool) -> Result<(), String> {
    if rel.is_empty() {
        return Ok(());
    }
    let p = WirePath::parse(rel).map_err(|e| format!("--delete refused: the {what} {e}"))?;
    for (i, c) in p.as_bytes().split(|&b| b == b'/').enumerate() {
        if (top && i == 0 && c == STATE_DIR.as_bytes()) || c.starts_with(b".intact-partial-") {
            return Err(format!(
                "--delete refused: the {what} '{p}' names intact's own state"
            ));
        }
    }
    Ok(())
}

impl Pending {
    /// Checks a DeleteStart; the keep list to come is charged to `memory`
    /// ([`KEEP_PATH_COST`] a path).
    pub(crate) fn start(
        dry_run: bool,
        base: Vec<u8>,
        scopes: Vec<Vec<u8>>,
        rules: Vec<(u8, String)>,
        max_paths: Option<usize>,
        memory: Option<Party>,
    ) -> Result<Pending, String> {
        checked("subdirectory", &base, true)?;
        for s in &scopes {
            checked("scope", s, base.is_empty())?;
        }
        let rule_bytes: usize = rules.iter().map(|(_, p)| p.len()).sum();
        if rule_bytes > MAX_RULE_BYTES {
            return Err(format!(
                "--delete refused: its include/exclude patterns take {rule_bytes} bytes, more than this server's {MAX_RULE_BYTES}"
            ));
        }
        let mut held = None;
        if let Some(memory) = &memory {
            let bytes = base.len() + scopes.iter().map(|s| s.len()).sum::<usize>() + rule_bytes;
            let items = scopes.len() + rules.len() + 1;
            let cost = bytes as u64 * REQUEST_BYTE_COST + items as u64 * REQUEST_ITEM_COST;
            memory
                .try_add(&mut held, cost)
                .map_err(|r| busy("its scopes and rules", &r))?;
        }
        let filter = Filter::new(
            rules
                .iter()
                .map(|(k, p)| {
                    let kind = if *k == 0 {
                        RuleKind::Include
                    } else {
                        RuleKind::Exclude
                    };
                    Rule::new(kind, p)
                })
                .collect(),
        );
        Ok(Pending {
            base,
            scopes,
            filter,
            dry_run,
            keep: KeepSet::default(),
            max_paths: max_paths.unwrap_or(MAX_KEEP_PATHS),
            memory,
            held,
        })
    }

    /// Takes a DeleteKeep chunk, within the server's bounds: paths per
    /// request, and the session's share of the server's memory, taken
    /// before the set grows.
    pub(crate) fn keep(&mut self, paths: Vec<Vec<u8>>) -> Result<(), String> {
        if self.keep.len().saturating_add(paths.len()) > self.max_paths {
            return Err(format!(
                "--delete refused: the source has more than {} paths, this server's limit for one --delete",
                self.max_paths
            ));
        }
        if let Some(memory) = &self.memory {
            let cost = paths.len() as u64 * KEEP_PATH_COST;
            let what = format!("a keep list of {} paths", self.keep.len() + paths.len());
            memory
                .try_add(&mut self.held, cost)
                .map_err(|r| busy(&what, &r))?;
        }
        for p in &paths {
            self.keep.insert(p);
        }
        Ok(())
    }

    /// Prunes (or lists) and sends the report in chunks, then DeleteDone.
    /// The report's lines are charged to the client's memory share as
    /// they are made; past it the pruning stops (and says so).
    pub(crate) fn run(
        mut self,
        root: &Path,
        out: &mut dyn Outbound,
    ) -> Result<PruneReport, ProtoError> {
        let memory = self.memory.take();
        let mut lines = None;
        let mut allow = |n: usize| match &memory {
            Some(m) => m.try_add(&mut lines, n as u64 + LIST_ITEM_COST).is_ok(),
            None => true,
        };
        let report = prune_under(
            root,
            &self.base,
            &self.scopes,
            &self.keep,
            &self.filter,
            self.dry_run,
            &mut allow,
        );
        let errors: Vec<String> = report.errors.iter().map(|e| e.to_string()).collect();
        let mut chunk = (Vec::new(), Vec::new(), Vec::new());
        let mut size = 0;
        let items = report
            .deleted
            .iter()
            .map(|d| (0, d))
            .chain(report.kept.iter().map(|k| (1, k)))
            .chain(errors.iter().map(|e| (2, e)));
        for (list, text) in items {
            if size + text.len() + 4 > DELETE_CHUNK_BYTES {
                send_chunk(out, &mut chunk)?;
                size = 0;
            }
            size += text.len() + 4;
            match list {
                0 => chunk.0.push(text.clone()),
                1 => chunk.1.push(text.clone()),
                _ => chunk.2.push(text.clone()),
            }
        }
        send_chunk(out, &mut chunk)?;
        out.send(Message::DeleteDone)?;
        Ok(report)
    }
}

type Chunk = (Vec<String>, Vec<String>, Vec<String>);

fn send_chunk(out: &mut dyn Outbound, chunk: &mut Chunk) -> Result<(), ProtoError> {
    let (deleted, kept, errors) = std::mem::take(chunk);
    if deleted.is_empty() && kept.is_empty() && errors.is_empty() {
        return Ok(());
    }
    out.put(Message::DeleteReport {
        deleted,
        kept,
        errors,
    })
}

/// The client's side: sends `req` (under `base`, the send's subdirectory)
/// on a connection that passed its handshake, and collects the answer.
pub(crate) fn request<S: std::io::Read + std::io::Write>(
    conn: &mut Connection<S>,
    base: Option<&WirePath>,
    req: &DeleteRequest,
) -> Result<PruneReport, TransferError> {
    let rules = req
        .filter
        .rules()
        .iter()
        .map(|r| {
            let k = match r.kind() {
                RuleKind::Include => 0,
                RuleKind::Exclude => 1,
            };
            (k, r.text().to_string())
        })
        .collect();
    conn.write_message(&Message::DeleteStart {
        dry_run: req.dry_run,
        base: base.map(|b| b.as_bytes().to_vec()).unwrap_or_default(),
        scopes: req.scopes.clone(),
        rules,
    })?;
    let mut chunk = Vec::new();
    let mut size = 0;
    for p in &req.keep {
        if size + p.len() + 4 > DELETE_CHUNK_BYTES {
            conn.write_message(&Message::DeleteKeep {
                paths: std::mem::take(&mut chunk),
            })?;
            size = 0;
        }
        size += p.len() + 4;
        chunk.push(p.clone());
    }
    if !chunk.is_empty() {
        conn.write_message(&Message::DeleteKeep { paths: chunk })?;
    }
    conn.send(&Message::DeleteRun)?;
    let mut report = PruneReport::default();
    loop {
        match conn.expect_message()? {
            Message::DeleteReport {
                deleted,
                kept,
                errors,
            } => {
                report.deleted.extend(deleted);
                report.kept.extend(kept);
                report
                    .errors
                    .extend(errors.into_iter().map(TransferError::Remote));
            }
            Message::DeleteDone => break,
            Message::Refused { reason } => return Err(TransferError::Remote(reason)),
            other => {
                return Err(ProtoError::Unexpected {
                    got: other.name(),
                    wanted: "DeleteReport or DeleteDone",
                }
                .into())
            }
        }
    }
    conn.send(&Message::Bye)?;
    // The server's Bye (or its close) ends the session.
    let _ = conn.read_message();
    Ok(report)
}

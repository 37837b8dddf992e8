//! The RIVA paper's execution-time model (Sec. 4, Eq. 1 and 2), fed with
//! the per-block stage times a riva run measured.
//!
//! Transfer, eviction and checksum of different blocks overlap, so the
//! slower of the transfer stage (t_t per block) and the checksum stage
//! (t_c per block) sets the pace, and the other adds its time for one
//! block, plus one eviction (t_e):
//!
//! ```text
//! t_RIVA = n · max(t_t, t_c) + min(t_t, t_c) + t_e        (Eq. 1)
//! ε      = 100 · |t_RIVA − t_actual| / t_actual            (Eq. 2)
//! ```
//!
//! With several streams each works through its share of the blocks, so
//! n is the number of blocks per stream.

use crate::report::CopyReport;
use crate::verify::VerifyMode;

/// The model's inputs, its prediction and its error against the run.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct RivaModel {
    /// Blocks verified (skipped and unchanged blocks excluded).
    pub blocks: u64,
    /// Streams the blocks were shared among.
    pub streams: usize,
    /// Mean transfer-stage seconds per block (t_t).
    pub transfer_per_block: f64,
    /// Mean checksum-stage seconds per block (t_c).
    pub checksum_per_block: f64,
    /// Mean eviction seconds per block (t_e).
    pub evict_per_block: f64,
    /// Eq. 1.
    pub predicted_seconds: f64,
    /// The run's wall-clock seconds.
    pub measured_seconds: f64,
    /// Eq. 2, in percent.
    pub error_percent: f64,
}

impl RivaModel {
    /// The model of a riva run, if it verified any block.
    pub fn of(report: &CopyReport, streams: usize) -> Option<RivaModel> {
        let files: Vec<_> = report
            .files
            .iter()
            .filter(|f| f.kind == "file" && f.verify == VerifyMode::Riva)
            .filter(|f| f.error.is_none() && !f.unchanged)
            .collect();
        let blocks: u64 = files.iter().map(|f| f.blocks - f.blocks_skipped).sum();
        if blocks == 0 {
            return None;
        }
        let n = blocks as f64;
        let tt = files.iter().map(|f| f.transfer_stage_seconds).sum::<f64>() / n;
        let tc = files.iter().map(|f| f.verify_stage_seconds).sum::<f64>() / n;
        let te = files.iter().map(|f| f.evict_seconds).sum::<f64>() / n;
        // A stream cannot share fewer files than it has.
        let streams = streams.clamp(1, files.len().max(1));
        let per_stream = (n / streams as f64).ceil();
        let predicted = per_stream * tt.max(tc) + tt.min(tc) + te;
        let measured = report.seconds;
        Some(RivaModel {
            blocks,
            streams,
            transfer_per_block: tt,
            checksum_per_block: tc,
            evict_per_block: te,
            predicted_seconds: predicted,
            measured_seconds: measured,
            error_percent: 100.0 * (predicted - measured).abs() / measured.max(1e-9),
        })
    }
}

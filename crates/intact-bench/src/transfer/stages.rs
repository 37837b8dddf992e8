//! The per-stage profile: after a dataset's timed runs, one more cold run
//! of each intact command with `--json`, untimed, and its report's
//! `stages` printed as a table: where a file's time goes (source opens,
//! reads, digests, the link, journal rows, partial-file creation, writes,
//! verification, commits) in thread-seconds and per 1,000 files, with
//! how often each stage ran.

use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use serde_json::Value;

use super::datasets::Shape;
use super::tools::{Paths, BOTH_MODES};
use super::{copy_state_home, drop_caches, fresh, start_server};

/// Prints the profile of `intact copy` and `intact send` in each of
/// [`BOTH_MODES`] on `shape`.
pub(super) fn print(p: Paths<'_>, shape: &Shape) -> anyhow::Result<()> {
    println!(
        "\nPer-stage profile, {} (one more cold run of each, untimed, from its --json report; \
         thread-seconds summed over all streams, so stages overlap and a blocked stage counts \
         its wait; send: the server's stages only as its results report verify and evict):",
        shape.name
    );
    for command in ["copy", "send"] {
        for mode in BOTH_MODES {
            fresh(p.dst)?;
            drop_caches();
            let report = run_json(p, command, mode)
                .with_context(|| format!("intact {command} --verify {mode}"))?;
            shape.check_copy(&p.dst.join("data"))?;
            println!("\nintact {command} --verify {mode}");
            print!("{}", table(&report, shape.files())?);
        }
    }
    fresh(p.dst)
}

/// The JSON report of one run of `intact <command> --verify <mode> --json`.
fn run_json(p: Paths<'_>, command: &str, mode: &str) -> anyhow::Result<Value> {
    let mut cmd = Command::new(p.intact);
    let mut server = None;
    match command {
        "copy" => {
            cmd.env("XDG_STATE_HOME", copy_state_home(p.dst))
                .args(["copy", "--json", "--verify", mode])
                .arg(p.src)
                .arg(p.dst);
        }
        _ => {
            let (child, addr) = start_server(
                Command::new(p.intact)
                    .args(["serve", "--listen", "127.0.0.1:0", "--root"])
                    .arg(p.dst),
            )?;
            server = Some(child);
            cmd.args(["send", "--json", "--verify", mode])
                .arg(p.src)
                .arg(addr);
        }
    }
    let out = cmd.stderr(Stdio::piped()).output();
    if let Some(mut s) = server {
        let _ = s.kill();
        let _ = s.wait();
    }
    let out = out?;
    if !out.status.success() {
        bail!("failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The report's stages as a table.
fn table(report: &Value, files: u64) -> anyhow::Result<String> {
    let Some(stages) = report.get("stages").and_then(Value::as_array) else {
        bail!("the report has no per-stage profile (stages)");
    };
    let wall = report.get("seconds").and_then(Value::as_f64).unwrap_or(0.0);
    let per_k = |s: f64| s * 1e3 / (files.max(1) as f64 / 1e3);
    let mut t = format!(
        "  {:<8} {:<8} {:>10} {:>16} {:>9}\n",
        "stage", "side", "thread-s", "ms/1,000 files", "calls"
    );
    for s in stages {
        let name = s.get("stage").and_then(Value::as_str).unwrap_or("?");
        let side = s.get("side").and_then(Value::as_str).unwrap_or("?");
        let secs = s.get("seconds").and_then(Value::as_f64).unwrap_or(0.0);
        let calls = s.get("calls").and_then(Value::as_u64).unwrap_or(0);
        t.push_str(&format!(
            "  {name:<8} {side:<8} {secs:>10.3} {:>16.1} {calls:>9}\n",
            per_k(secs)
        ));
    }
    t.push_str(&format!(
        "  (wall {wall:.3} s by the report: {:.1} ms per 1,000 files)\n",
        per_k(wall)
    ));
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_without_stages_is_an_error_not_an_empty_table() {
        let v: Value = serde_json::json!({"seconds": 1.0, "files": []});
        assert!(table(&v, 10).is_err());
    }

    #[test]
    fn rows_are_per_thousand_files() {
        let v: Value = serde_json::json!({
            "seconds": 2.0,
            "stages": [{"stage": "open", "side": "sender", "seconds": 0.5, "calls": 4000}]
        });
        let t = table(&v, 2000).unwrap();
        // 0.5 s over 2 thousand files: 250 ms per 1,000.
        assert!(t.contains("open"), "{t}");
        assert!(t.contains("250.0"), "{t}");
        assert!(t.contains("4000"), "{t}");
        assert!(t.contains("1000.0 ms per 1,000 files"), "{t}");
    }
}

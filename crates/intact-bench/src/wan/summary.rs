//! One item's runs over one link, summed up: the table printed, every run
//! as a CSV row, the chart, and the rows of the page.

use intact_faults::DelayLine;

use super::page;
use super::way::{streams_range, Run, Way};
use super::WanArgs;
use crate::runner::Spread;

/// What the summary of any item on a link needs to know of it.
pub(super) struct Context<'a> {
    pub a: &'a WanArgs,
    pub kind: page::LinkKind,
    /// The file names' stem (the link, the buffers).
    pub stem: &'a str,
    /// iperf3's throughput on the link, bits per second.
    pub iperf: Option<f64>,
    /// ssh's default cipher, where the sshd runs.
    pub cipher: Option<&'a str>,
    pub wan: Option<&'a DelayLine>,
}

/// Prints the table of `title` (`bytes` sent each run) from `runs` (per
/// way, in `ways`' order), writes its runs to `csv` and its chart, and
/// returns its rows for the page.
pub(super) fn summarise(
    cx: &Context<'_>,
    ways: &[(String, Way)],
    title: &str,
    bytes: u64,
    runs: &[Vec<Run>],
    csv: Option<&mut csv::Writer<std::fs::File>>,
) -> anyhow::Result<page::Item> {
    println!();
    println!("{title}:");
    println!(
        "{:<52} {:>26} {:>10} {:>22} {:>10} {:>8} {:>9} {:>12}",
        "way",
        "seconds min / median / max",
        "Mbit/s",
        "CPU s (both ends)",
        "line CPU s",
        "ranges",
        "streams",
        "÷ iperf3"
    );
    let mbit_s = |secs: f64| (bytes * 8) as f64 / secs / 1e6;
    if let Some(w) = csv {
        for (way, all) in runs.iter().enumerate() {
            for (n, r) in all.iter().enumerate() {
                let ok = |v: String| if r.failed.is_some() { String::new() } else { v };
                let mbps = mbit_s(r.secs);
                let (rtt, rate) = match cx.kind {
                    page::LinkKind::Wan { rtt_ms } => (rtt_ms.to_string(), "1000".to_string()),
                    // Neither shaped: the CSV leaves them empty.
                    page::LinkKind::Unshaped => (String::new(), String::new()),
                };
                w.write_record([
                    rtt,
                    rate,
                    cx.a.sender_wmem.map_or(String::new(), |b| b.to_string()),
                    title.to_string(),
                    ways[way].0.clone(),
                    (n + 1).to_string(),
                    // A failed run's time and CPU measure nothing.
                    ok(format!("{:.3}", r.secs)),
                    ok(format!("{mbps:.1}")),
                    ok(format!("{:.3}", r.cpu)),
                    // No delay line, no line CPU.
                    if cx.wan.is_some() {
                        ok(format!("{:.3}", r.line))
                    } else {
                        String::new()
                    },
                    r.ranges.to_string(),
                    r.streams.to_string(),
                    cx.iperf
                        .map_or(String::new(), |b| format!("{:.0}", b / 1e6)),
                    r.failed.clone().unwrap_or_default(),
                ])?;
            }
        }
        w.flush()?;
    }
    let mut bars = Vec::new();
    let (mut rows, mut failures) = (Vec::new(), Vec::new());
    for (way, all) in runs.iter().enumerate() {
        let v: Vec<&Run> = all.iter().filter(|r| r.failed.is_none()).collect();
        if let Some(why) = all.iter().find_map(|r| r.failed.as_deref()) {
            // A tool's message may hold control bytes (xrootd's, a NUL).
            let why = page::one_line(why);
            let (failed, of) = (all.len() - v.len(), all.len());
            println!(
                "{:<52} failed in {failed} of {of} runs, first: {why}",
                ways[way].0
            );
            failures.push(format!(
                "{} failed in {failed} of {of} runs, first: {why}",
                ways[way].0
            ));
        }
        if v.is_empty() {
            continue;
        }
        let secs = Spread::of(&v.iter().map(|r| r.secs).collect::<Vec<_>>());
        let cpu = Spread::of(&v.iter().map(|r| r.cpu).collect::<Vec<_>>());
        // Cores kept busy, run by run (not one run's CPU over another's time).
        let busy = Spread::of(&v.iter().map(|r| r.cpu / r.secs).collect::<Vec<_>>());
        let line = Spread::of(&v.iter().map(|r| r.line).collect::<Vec<_>>());
        let mbps = mbit_s(secs.median);
        bars.push(crate::plot::Bar {
            label: ways[way].0.clone(),
            min: mbit_s(secs.max),
            median: mbps,
            max: mbit_s(secs.min),
            cpu: cpu.median,
        });
        rows.push(page::Row {
            way: ways[way].0.clone(),
            default: ways[way].1.is_default(),
            verifies: ways[way].1.verifies(),
            encrypts: ways[way]
                .1
                .encrypts(cx.cipher, v.first().map_or("", |r| r.frames.as_str())),
            secs,
            cpu,
            busy: busy.median,
            mbit: mbps,
            of_iperf: cx.iperf.map(|b| mbps * 1e6 / b),
            runs_ok: v.len(),
            runs: all.len(),
        });
        println!(
            "{:<52} {:>26} {:>10.0} {:>22} {:>10} {:>8} {:>9} {:>12}",
            ways[way].0,
            format!("{:.2} / {:.2} / {:.2}", secs.min, secs.median, secs.max),
            mbps,
            format!("{:.2} / {:.2} / {:.2}", cpu.min, cpu.median, cpu.max),
            match cx.wan {
                Some(_) => format!("{:.2}", line.median),
                None => "–".to_string(),
            },
            v.first().map_or(0, |r| r.ranges),
            streams_range(&v),
            cx.iperf
                .map_or("–".into(), |b| format!("{:.2}", mbps * 1e6 / b)),
        );
    }
    for (way, all) in runs.iter().enumerate() {
        for (n, r) in all.iter().enumerate().filter(|(_, r)| !r.steps.is_empty()) {
            println!("{}, run {}: {}", ways[way].0, n + 1, r.steps.join("; "));
        }
    }
    if let Some(line) = cx.wan {
        println!("delay line so far: {}", line.summary());
    }
    let mut charted = None;
    if let Some(dir) = &cx.a.out {
        let png = dir.join(format!("{}-{}.png", cx.stem, crate::plot::slug(title)));
        let chart = format!(
            "{title}: {}{}, {} runs each",
            cx.kind.described(),
            cx.a.sender_wmem.map_or(String::new(), |b| format!(
                ", sender's buffers {} KiB",
                b >> 10
            )),
            cx.a.runs
        );
        crate::plot::bars_png(&png, &chart, &bars, cx.iperf.map(|b| b / 1e6))?;
        println!("chart: {}", png.display());
        charted = Some(png);
    }
    Ok(page::Item {
        title: title.to_string(),
        rows,
        failures,
        chart: charted,
    })
}

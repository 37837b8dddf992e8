//! The transfer tables: per tool, the spread of wall and CPU seconds over
//! the interleaved runs, the rate, CPU seconds per unit of work (per GiB
//! or per 1,000 files, the dataset says which), and the ratio of its
//! medians to each baseline tool's (`other / this`: > 1 means this tool is
//! faster or cheaper). Formatting only: nothing here times anything.

use crate::runner::{Sample, Spread};

use super::datasets::{Shape, Unit, GIB, MIB};

/// One tool's runs, summarised.
#[derive(Clone, Debug)]
pub struct Row {
    pub name: String,
    pub wall: Spread,
    pub cpu: Spread,
}

impl Row {
    pub fn of(name: &str, samples: &[Sample]) -> Row {
        let wall: Vec<f64> = samples.iter().map(|s| s.wall).collect();
        let cpu: Vec<f64> = samples.iter().map(|s| s.cpu).collect();
        Row {
            name: name.to_string(),
            wall: Spread::of(&wall),
            cpu: Spread::of(&cpu),
        }
    }
}

/// A tool the others are compared with, found by its name's start.
#[derive(Clone, Copy, Debug)]
pub struct Baseline {
    /// The column header's words ("rsync over ssh").
    pub label: &'static str,
    /// The start of its row's name.
    pub prefix: &'static str,
}

/// How much a run moves, and which unit its CPU is quoted per.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Work {
    pub bytes: u64,
    pub files: u64,
    pub unit: Unit,
}

impl Work {
    pub fn of(shape: &Shape) -> Work {
        Work {
            bytes: shape.bytes(),
            files: shape.files(),
            unit: shape.unit,
        }
    }

    /// CPU seconds per GiB or per 1,000 files.
    pub fn per_unit(&self, cpu: f64) -> f64 {
        let units = match self.unit {
            Unit::Gib => self.bytes as f64 / GIB as f64,
            Unit::KiloFiles => self.files as f64 / 1000.0,
        };
        cpu / units
    }

    /// Files per second: the fewest seconds give the most files per second.
    pub fn files_per_sec(&self, wall: Spread) -> Spread {
        let f = self.files as f64;
        Spread {
            min: f / wall.max,
            median: f / wall.median,
            max: f / wall.min,
        }
    }
}

/// Which columns a table has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// Cold runs: wall, MiB/s and files/s at the median, CPU.
    Cold,
    /// Warm runs: files/s first, as a spread.
    Warm,
}

/// `other / this` to two places, or "–" when either is missing or zero.
pub fn ratio(other: f64, this: f64) -> String {
    if other.is_finite() && this.is_finite() && this > 0.0 && other > 0.0 {
        format!("{:.2}", other / this)
    } else {
        "–".into()
    }
}

/// The table in Markdown: one row per tool, ratio columns for each
/// baseline that ran (a missing one, say rsync over ssh with --no-ssh,
/// has no columns).
pub fn render(rows: &[Row], work: &Work, baselines: &[Baseline], style: Style) -> String {
    let present: Vec<(&Baseline, &Row)> = baselines
        .iter()
        .filter_map(|b| {
            rows.iter()
                .find(|r| r.name.starts_with(b.prefix))
                .map(|r| (b, r))
        })
        .collect();
    let per = format!("CPU s per {} (median)", work.unit.label());
    let mut head = match style {
        Style::Cold => vec![
            "tool".to_string(),
            "wall s (min / median / max)".into(),
            "MiB/s".into(),
            "files/s".into(),
            "CPU s (min / median / max)".into(),
            per,
        ],
        Style::Warm => vec![
            "tool".to_string(),
            "files/s (min / median / max)".into(),
            "wall s (min / median / max)".into(),
            "CPU s (min / median / max)".into(),
            per,
        ],
    };
    for (b, _) in &present {
        head.push(format!("vs {}: wall", b.label));
        head.push("CPU".into());
    }
    let mut out = format!("| {} |\n", head.join(" | "));
    out.push_str(&format!("|---|{}\n", "---:|".repeat(head.len() - 1)));
    for r in rows {
        let mut cells = vec![r.name.replace('|', "\\|")];
        match style {
            Style::Cold => {
                cells.push(r.wall.to_string());
                cells.push(format!(
                    "{:.0}",
                    work.bytes as f64 / MIB as f64 / r.wall.median
                ));
                cells.push(format!("{:.0}", work.files as f64 / r.wall.median));
                cells.push(r.cpu.to_string());
            }
            Style::Warm => {
                let fps = work.files_per_sec(r.wall);
                cells.push(format!(
                    "{:.0} / {:.0} / {:.0}",
                    fps.min, fps.median, fps.max
                ));
                cells.push(r.wall.to_string());
                cells.push(r.cpu.to_string());
            }
        }
        cells.push(format!("{:.3}", work.per_unit(r.cpu.median)));
        for (_, base) in &present {
            cells.push(ratio(base.wall.median, r.wall.median));
            cells.push(ratio(base.cpu.median, r.cpu.median));
        }
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, wall: [f64; 3], cpu: [f64; 3]) -> Row {
        let s = |v: [f64; 3]| Spread {
            min: v[0],
            median: v[1],
            max: v[2],
        };
        Row {
            name: name.into(),
            wall: s(wall),
            cpu: s(cpu),
        }
    }

    #[test]
    fn per_unit_divides_by_gib_or_thousands_of_files() {
        let gib = Work {
            bytes: 4 * GIB,
            files: 1,
            unit: Unit::Gib,
        };
        assert_eq!(gib.per_unit(2.0), 0.5);
        let kf = Work {
            bytes: 1,
            files: 20_000,
            unit: Unit::KiloFiles,
        };
        assert_eq!(kf.per_unit(3.0), 0.15);
    }

    #[test]
    fn files_per_second_turns_the_spread_around() {
        let w = Work {
            bytes: 0,
            files: 1000,
            unit: Unit::KiloFiles,
        };
        let fps = w.files_per_sec(Spread {
            min: 0.5,
            median: 1.0,
            max: 4.0,
        });
        assert_eq!((fps.min, fps.median, fps.max), (250.0, 1000.0, 2000.0));
    }

    #[test]
    fn ratio_is_other_over_this() {
        assert_eq!(ratio(2.0, 1.0), "2.00");
        assert_eq!(ratio(1.0, 4.0), "0.25");
        assert_eq!(ratio(f64::NAN, 1.0), "–");
        assert_eq!(ratio(1.0, 0.0), "–");
    }

    const SSH: Baseline = Baseline {
        label: "rsync over ssh",
        prefix: "rsync -a -e ssh (",
    };
    const CP: Baseline = Baseline {
        label: "cp -r",
        prefix: "cp -r",
    };

    #[test]
    fn cold_table_has_ratios_to_every_baseline() {
        let rows = [
            row(
                "intact send --verify riva",
                [1.0, 2.0, 3.0],
                [0.5, 1.0, 1.5],
            ),
            row("cp -r", [1.0, 1.0, 1.0], [0.2, 0.25, 0.3]),
            row(
                "rsync -a -e ssh (x, default)",
                [3.0, 4.0, 9.0],
                [2.0, 3.0, 4.0],
            ),
        ];
        let work = Work {
            bytes: 2 * GIB,
            files: 2000,
            unit: Unit::Gib,
        };
        let t = render(&rows, &work, &[SSH, CP], Style::Cold);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "| tool | wall s (min / median / max) | MiB/s | files/s | CPU s (min / median / max) | CPU s per GiB (median) | vs rsync over ssh: wall | CPU | vs cp -r: wall | CPU |"
        );
        assert_eq!(
            lines[1],
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        assert_eq!(
            lines[2],
            "| intact send --verify riva | 1.00 / 2.00 / 3.00 | 1024 | 1000 | 0.50 / 1.00 / 1.50 | 0.500 | 2.00 | 3.00 | 0.50 | 0.25 |"
        );
        assert_eq!(lines.len(), 5);
        assert!(
            lines[4].ends_with("| 1.00 | 1.00 | 0.25 | 0.08 |"),
            "{}",
            lines[4]
        );
    }

    #[test]
    fn warm_table_leads_with_files_per_second_and_drops_absent_baselines() {
        let rows = [
            row(
                "intact copy --verify none",
                [0.5, 1.0, 2.0],
                [0.4, 0.5, 0.6],
            ),
            row("cp -r", [0.25, 0.5, 1.0], [0.1, 0.2, 0.3]),
        ];
        let work = Work {
            bytes: 0,
            files: 5000,
            unit: Unit::KiloFiles,
        };
        let t = render(&rows, &work, &[SSH, CP], Style::Warm);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "| tool | files/s (min / median / max) | wall s (min / median / max) | CPU s (min / median / max) | CPU s per 1,000 files (median) | vs cp -r: wall | CPU |"
        );
        assert_eq!(
            lines[2],
            "| intact copy --verify none | 2500 / 5000 / 10000 | 0.50 / 1.00 / 2.00 | 0.40 / 0.50 / 0.60 | 0.100 | 0.50 | 0.40 |"
        );
    }

    #[test]
    fn pipes_in_names_are_escaped() {
        let rows = [row("a | b", [1.0; 3], [1.0; 3])];
        let work = Work {
            bytes: MIB,
            files: 1,
            unit: Unit::Gib,
        };
        assert!(render(&rows, &work, &[], Style::Cold).contains("| a \\| b |"));
    }
}

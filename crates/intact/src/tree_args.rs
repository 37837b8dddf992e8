//! Flags that choose what `copy` and `send` take from the source tree and
//! how fast they go: `-L`, `--include`/`--exclude`, `--dry-run`, `--bwlimit`.

use clap::{ArgMatches, Args};
use intact_transfer::{Filter, Rule, RuleKind, ScanOptions};

/// Options shared by `copy` and `send` about the tree they take.
#[derive(Debug, Args)]
pub struct TreeArgs {
    #[command(flatten)]
    pub select: SelectArgs,

    /// Show what would be transferred (and deleted), with sizes; change nothing.
    #[arg(short = 'n', long)]
    pub dry_run: bool,

    /// Limit the transfer to RATE bytes per second, averaged over blocks
    /// (rsync's units: a bare number is KiB/s; K, M, G suffixes; 0 = no limit).
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub bwlimit: Option<u64>,
}

impl TreeArgs {
    /// See [`SelectArgs::scan_options`].
    pub fn scan_options(&self, matches: Option<&ArgMatches>) -> ScanOptions {
        self.select.scan_options(matches)
    }
}

/// Which entries of the source tree are taken (`copy`, `send`, `plan`).
#[derive(Debug, Args)]
pub struct SelectArgs {
    /// Follow symlinks (on the command line and in the tree) and copy what
    /// they point to, like rsync -L. Without it every symlink is copied as
    /// a link; a source named with a trailing '/' (e.g. `link/`) gives the
    /// contents of the directory it points to.
    #[arg(short = 'L', long)]
    pub copy_links: bool,

    /// Leave out entries matching PATTERN (rsync syntax: `*`, `**`, `?`,
    /// `[a-z]`; a trailing '/' matches directories only; a leading '/'
    /// anchors at the top of the transfer). May be repeated; with
    /// --include, the first pattern that matches decides.
    #[arg(long, value_name = "PATTERN")]
    pub exclude: Vec<String>,

    /// Take entries matching PATTERN even if a later --exclude matches
    /// them (e.g. --include '*/' --include '*.dat' --exclude '*').
    #[arg(long, value_name = "PATTERN")]
    pub include: Vec<String>,
}

impl SelectArgs {
    /// The scan options these flags ask for. The include and exclude
    /// rules keep the order they were typed in, taken from `matches` (the
    /// subcommand's), since the first rule that matches decides.
    pub fn scan_options(&self, matches: Option<&ArgMatches>) -> ScanOptions {
        ScanOptions {
            copy_links: self.copy_links,
            filter: ordered_filter(
                matches,
                ("include", &self.include),
                ("exclude", &self.exclude),
            ),
        }
    }
}

/// Include and exclude rules (the flags with ids `include.0` and
/// `exclude.0`) in the order they were typed, taken from `matches`.
pub fn ordered_filter(
    matches: Option<&ArgMatches>,
    include: (&str, &[String]),
    exclude: (&str, &[String]),
) -> Filter {
    let mut rules: Vec<(usize, Rule)> = Vec::new();
    for (id, kind, values) in [
        (include.0, RuleKind::Include, include.1),
        (exclude.0, RuleKind::Exclude, exclude.1),
    ] {
        let at: Vec<usize> = matches
            .and_then(|m| m.indices_of(id))
            .map(|i| i.collect())
            .unwrap_or_default();
        for (n, p) in values.iter().enumerate() {
            // Without positions, includes go first (rsync's common idiom).
            let pos = at.get(n).copied().unwrap_or(match kind {
                RuleKind::Include => n,
                RuleKind::Exclude => usize::MAX / 2 + n,
            });
            rules.push((pos, Rule::new(kind, p)));
        }
    }
    rules.sort_by_key(|(pos, _)| *pos);
    Filter::new(rules.into_iter().map(|(_, r)| r).collect())
}

/// The matches of the subcommand being run, parsed again from the command
/// line (clap's derive keeps values, not their order).
pub fn subcommand_matches() -> Option<ArgMatches> {
    use clap::CommandFactory;
    let m = crate::args::Cli::command()
        .try_get_matches_from(std::env::args_os())
        .ok()?;
    m.subcommand().map(|(_, sub)| sub.clone())
}

/// Parses a rate as rsync does: a bare number is KiB per second; K, M, G
/// (and KiB, MiB, GiB, KB, MB, GB) are powers of 1024 bytes per second.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| {
        format!("'{s}' is not a rate (examples: 500 for 500 KiB/s, 10M, 1G; 0 for no limit)")
    })?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "k" | "kib" | "kb" => 10,
        "b" => 0,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        other => return Err(format!("unknown rate unit '{other}' (use K, M or G)")),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("'{s}' is too large"))
}

#[cfg(test)]
mod tests {
    use super::parse_rate;

    #[test]
    fn rates_parse_like_rsync() {
        assert_eq!(parse_rate("500"), Ok(500 << 10));
        assert_eq!(parse_rate("10M"), Ok(10 << 20));
        assert_eq!(parse_rate("1g"), Ok(1 << 30));
        assert_eq!(parse_rate("0"), Ok(0));
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("3X").is_err());
    }
}

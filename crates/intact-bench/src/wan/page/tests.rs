//! The page's block: rendering, splicing, and keeping the sections of
//! links a run did not measure.

use super::*;

fn spread(min: f64, median: f64, max: f64) -> Spread {
    Spread { min, median, max }
}

fn row(way: &str, default: bool, secs: f64) -> Row {
    Row {
        way: way.into(),
        default,
        verifies: "something",
        encrypts: "no".into(),
        secs: spread(secs * 0.9, secs, secs * 1.1),
        cpu: spread(1.0, 2.0, 3.0),
        busy: 2.0 / secs,
        mbit: 8000.0 / secs,
        of_iperf: Some(0.5),
        runs_ok: 3,
        runs: 3,
    }
}

#[test]
fn a_block_replaces_only_the_old_block() {
    let old = format!("# Page\n\nby hand\n\n{BEGIN}\nold figures\n{END}\nafter, by hand\n");
    let block = format!("{BEGIN}\nnew figures\n{END}\n");
    let new = splice(&old, &block).unwrap();
    assert_eq!(
        new,
        format!("# Page\n\nby hand\n\n{BEGIN}\nnew figures\n{END}\nafter, by hand\n")
    );
    // Again: the same page.
    assert_eq!(splice(&new, &block).unwrap(), new);
}

#[test]
fn a_page_without_a_block_gets_one_at_its_end() {
    let block = format!("{BEGIN}\nx\n{END}\n");
    assert_eq!(
        splice("# Page\n\ntext\n\n\n", &block).unwrap(),
        format!("# Page\n\ntext\n\n{block}")
    );
    assert_eq!(splice("", &block).unwrap(), block);
}

#[test]
fn broken_markers_leave_the_page_alone() {
    let block = format!("{BEGIN}\nx\n{END}\n");
    assert!(splice(&format!("{BEGIN}\nno end\n"), &block).is_err());
    assert!(splice(&format!("{END}\n{BEGIN}\n"), &block).is_err());
    assert!(splice(&format!("{BEGIN}\n{END}\n{BEGIN}\n{END}\n"), &block).is_err());
}

#[test]
fn every_row_says_what_it_verifies_and_compares_with_the_default() {
    let links = [Link {
        kind: LinkKind::Wan { rtt_ms: 30 },
        facts: vec!["iperf3: 950 Mbit/s".into()],
        csv: Some(PathBuf::from("/d/docs/bench-runs/page/wan-30ms.csv")),
        items: vec![Item {
            title: "1024 MiB, one file".into(),
            rows: vec![row("intact", true, 10.0), row("rsync", false, 20.0)],
            failures: vec!["xrdcp: it broke".into()],
            chart: Some(PathBuf::from("/d/docs/bench-runs/page/wan-30ms-1024.png")),
        }],
    }];
    let md = render(
        ("intact-bench wan", "2026-11-25"),
        Path::new("/d/docs"),
        &links,
        &[],
        &[LinkKind::Wan { rtt_ms: 89 }],
        &["rsync checks X"],
    );
    assert!(md.starts_with(BEGIN) && md.trim_end().ends_with(END));
    assert!(md.contains(
        "### 1 Gbit/s, 30 ms round trip\n\nMeasured on 2026-11-25 by `intact-bench wan`.\n"
    ));
    assert!(md.contains("- iperf3: 950 Mbit/s"));
    assert!(md.contains("[wan-30ms.csv](bench-runs/page/wan-30ms.csv)"));
    assert!(md.contains("![1024 MiB, one file](bench-runs/page/wan-30ms-1024.png)"));
    assert!(md.contains(
        "| **`intact`** | something | no | 9.00 / 10.00 / 11.00 | 800 | 0.50 | 2.00 | 0.20 | – |"
    ));
    // rsync took twice as long as the default.
    assert!(md.contains(
        "| `rsync` | something | no | 18.00 / 20.00 / 22.00 | 400 | 0.50 | 2.00 | 0.10 | 2.00× |"
    ));
    assert!(md.contains("- failed: xrdcp: it broke"));
    assert!(md.contains("Not measured yet"));
    assert!(md.contains(": 89 ms."));
    assert!(md.contains("- rsync checks X"));
    let done = render(("w", "d"), Path::new("/d"), &links, &[], &[], &[]);
    assert!(!done.contains("Not measured yet"));
}

#[test]
fn a_cell_or_a_fact_cannot_break_the_table_or_the_list() {
    let mut r = row("a | b", false, 1.0);
    r.encrypts = "yes\n| x |".into();
    let mut t = String::new();
    table(&mut t, &[r]);
    let line = t.lines().nth(2).unwrap();
    assert!(
        line.starts_with("| `a \\| b` | something | yes \\| x \\| |"),
        "{line}"
    );
    assert_eq!(t.lines().count(), 3);
    let links = [Link {
        kind: LinkKind::Wan { rtt_ms: 0 },
        facts: vec!["xrdcp not measured: line one\n## line two\0 <b>".into()],
        csv: None,
        items: Vec::new(),
    }];
    let md = render(("w", "d"), Path::new("/d"), &links, &[], &[], &[]);
    assert!(md.contains("- xrdcp not measured: line one ## line two  &lt;b>\n"));
    assert!(!md.contains("\n## line two"));
}

#[test]
fn a_crlf_page_keeps_its_line_after_the_block() {
    let old = format!("a\r\n{BEGIN}\r\nold\r\n{END}\r\nb\r\n");
    let block = format!("{BEGIN}\nnew\n{END}\n");
    let once = splice(&old, &block).unwrap();
    assert_eq!(once, format!("a\r\n{block}b\r\n"));
    assert_eq!(splice(&once, &block).unwrap(), once);
}

#[test]
fn a_page_with_broken_markers_is_refused_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("p.md");
    check(&page).unwrap();
    std::fs::write(&page, format!("{BEGIN}\nno end\n")).unwrap();
    assert!(check(&page).is_err());
    std::fs::write(&page, format!("x\n{BEGIN}\n{END}\n")).unwrap();
    check(&page).unwrap();
}

#[test]
fn links_are_relative_to_the_page() {
    assert_eq!(rel(Path::new("/a/b"), Path::new("/a/b/c/d.png")), "c/d.png");
    assert_eq!(
        rel(Path::new("/a/b"), Path::new("/a/c/d.png")),
        "../c/d.png"
    );
    assert_eq!(rel(Path::new("/a"), Path::new("/x/y.png")), "/x/y.png");
}

fn link(rtt_ms: u64, secs: f64) -> Link {
    Link {
        kind: LinkKind::Wan { rtt_ms },
        facts: vec![format!("iperf3 at {rtt_ms} ms")],
        csv: None,
        items: vec![Item {
            title: "a file".into(),
            rows: vec![row("intact", true, secs), row("rsync", false, 2.0 * secs)],
            // Ends in a space, as a tool's quoted output may.
            failures: vec![format!("xrdcp at {rtt_ms} ms: it said ")],
            chart: Some(PathBuf::from(format!("/d/runs/wan-{rtt_ms}ms-a.png"))),
        }],
    }
}

/// The text of `page` from `from` up to (not including) `to`.
fn between<'a>(page: &'a str, from: &str, to: &str) -> &'a str {
    let start = page.find(from).expect("from");
    let end = start + page[start..].find(to).expect("to");
    &page[start..end]
}

/// The page as a run of `links` leaves it, the links of `pending` (round
/// trips) still to come.
fn page_after(doc: &str, run: (&str, &str), links: &[Link], pending: &[u64]) -> String {
    let kept = sections(doc);
    let pending: Vec<LinkKind> = pending
        .iter()
        .map(|&rtt_ms| LinkKind::Wan { rtt_ms })
        .collect();
    let block = render(run, Path::new("/d"), links, &kept, &pending, &["legend"]);
    splice(doc, &block).unwrap()
}

#[test]
fn a_run_replaces_the_sections_of_its_links_and_keeps_the_others() {
    let doc = "# Page\n\nby hand\n";
    let both = page_after(
        doc,
        ("run one", "2026-11-25"),
        &[link(0, 1.0), link(30, 3.0)],
        &[],
    );
    let one = page_after(&both, ("run two", "2026-11-26"), &[link(89, 9.0)], &[]);
    let headings: Vec<&str> = one.lines().filter(|l| l.starts_with("### ")).collect();
    assert_eq!(
        headings,
        [
            "### 1 Gbit/s, 0 ms round trip",
            "### 1 Gbit/s, 30 ms round trip",
            "### 1 Gbit/s, 89 ms round trip"
        ]
    );
    // Each section names its own run; the kept ones are as they were.
    assert_eq!(
        one.matches("Measured on 2026-11-25 by `run one`.").count(),
        2
    );
    assert_eq!(
        one.matches("Measured on 2026-11-26 by `run two`.").count(),
        1
    );
    // The kept sections, byte for byte as the first run wrote them: the
    // last line of each (its failure, with its trailing space) included.
    let zero = between(&both, "### 1 Gbit/s, 0 ms", "\n\n### 1 Gbit/s, 30 ms");
    let thirty = between(&both, "### 1 Gbit/s, 30 ms", "\n\nWhat each tool verifies");
    assert!(
        zero.ends_with("- failed: xrdcp at 0 ms: it said "),
        "{zero:?}"
    );
    assert!(
        thirty.ends_with("- failed: xrdcp at 30 ms: it said "),
        "{thirty:?}"
    );
    assert!(one.contains(&format!("{zero}\n\n### 1 Gbit/s, 30 ms")));
    assert!(one.contains(&format!("{thirty}\n\n### 1 Gbit/s, 89 ms")));
    assert!(one.contains("![a file](runs/wan-89ms-a.png)"));
    assert!(one.starts_with("# Page\n\nby hand\n\n"));
    // A link measured again is replaced, not added twice.
    let again = page_after(&one, ("run three", "2026-11-27"), &[link(30, 4.0)], &[]);
    assert_eq!(again.matches("30 ms round trip").count(), 1);
    assert_eq!(again.matches("by `run one`").count(), 1);
    assert!(again.contains("Measured on 2026-11-27 by `run three`."));
    assert!(again.contains("| **`intact`** | something | no | 3.60 / 4.00 / 4.40 |"));
    // Rewriting the same run's links gives the same page, and so does a
    // run of another link (the kept sections do not change).
    assert_eq!(
        page_after(&again, ("run three", "2026-11-27"), &[link(30, 4.0)], &[]),
        again
    );
    let zero_again = between(&again, "### 1 Gbit/s, 0 ms", "\n\n### 1 Gbit/s, 30 ms");
    assert_eq!(zero_again, zero);
}

#[test]
fn a_link_still_to_come_keeps_its_older_section_or_is_named() {
    let doc = page_after("", ("run one", "d1"), &[link(30, 3.0)], &[]);
    // A run of 0, 30 and 89 ms, after its first link: 30 ms is the older
    // run's still, and both links still to come are named, 30 ms as an
    // earlier run's.
    let mid = page_after(&doc, ("run two", "d2"), &[link(0, 1.0)], &[30, 89]);
    assert!(mid.contains("### 1 Gbit/s, 30 ms round trip\n\nMeasured on d1 by `run one`."));
    assert!(mid.contains(
        "\nNot measured yet by this run (it was still going, or was cut short, when this was \
         written): 30 ms, 89 ms (the section of 30 ms above is an earlier run's).\n"
    ));
    // Once done, nothing is pending.
    let done = page_after(
        &mid,
        ("run two", "d2"),
        &[link(0, 1.0), link(30, 2.0), link(89, 9.0)],
        &[],
    );
    assert!(!done.contains("Not measured yet"));
    assert!(!done.contains("run one"));
}

#[test]
fn a_block_from_before_sections_named_their_run_gives_each_its_run() {
    // As c786798 wrote it: the run once, at the top (and a failure line
    // quoting a tool that says "Regenerated by `x`", which is not the run).
    let old = format!(
        "x\n{BEGIN}\n\n## The wide area, every link and peer (generated 2026-11-25)\n\n\
         Regenerated by `intact-bench wan --rtt-ms 0,30,89`; everything between the markers is its output. \
         Times are wall seconds; CPU use is CPU seconds over wall seconds (cores kept busy).\n\n\
         ### 1 Gbit/s, 0 ms round trip\n\n- fact 0\n\n#### a, 0 ms\n\n| t |\n\n\
         ### 1 Gbit/s, 30 ms round trip\n\n- fact 30\n- failed: it said Regenerated by `x` (generated y)\n\n\
         Not measured yet (the run was still going, or was cut short, when this was written): 89 ms.\n\n\
         What each tool verifies, in full:\n\n- legend\n\n{END}\nafter\n"
    );
    let kept = sections(&old);
    let run = "Measured on 2026-11-25 by `intact-bench wan --rtt-ms 0,30,89`, by an older \
               generator: its CPU use is the median CPU over the median time (not the median of \
               each run's own), and an rclone row's cipher is ssh's default, which rclone's own \
               SSH client may not use (not recorded).";
    assert_eq!(
        kept,
        [
            Kept {
                kind: LinkKind::Wan { rtt_ms: 0 },
                text: format!(
                    "### 1 Gbit/s, 0 ms round trip\n\n{run}\n\n- fact 0\n\n#### a, 0 ms\n\n| t |"
                )
            },
            Kept {
                kind: LinkKind::Wan { rtt_ms: 30 },
                text: format!(
                    "### 1 Gbit/s, 30 ms round trip\n\n{run}\n\n- fact 30\n\
                     - failed: it said Regenerated by `x` (generated y)"
                )
            },
        ]
    );
    let new = page_after(&old, ("run two", "2026-11-26"), &[link(89, 9.0)], &[]);
    assert!(new.starts_with("x\n") && new.ends_with("\nafter\n"));
    assert!(!new.contains("Not measured yet"));
    assert!(!new.contains("peer (generated "));
    assert_eq!(new.matches(run).count(), 2);
}

#[test]
fn a_run_line_comes_from_the_top_of_the_block_never_from_a_quoted_tool() {
    // A top without the command, and a failure that quotes one: the
    // section gets no run line rather than the tool's words.
    let old = format!(
        "{BEGIN}\n\n## The wide area (generated 2026-11-25)\n\n\
         ### 1 Gbit/s, 30 ms round trip\n\n- failed: it said Regenerated by `x`\n\n{END}\n"
    );
    let kept = sections(&old);
    assert_eq!(kept.len(), 1);
    assert_eq!(
        kept[0].text,
        "### 1 Gbit/s, 30 ms round trip\n\n- failed: it said Regenerated by `x`"
    );
}

#[test]
fn a_block_from_a_later_build_before_sections_gets_its_run_without_the_caveat() {
    // As 53e11fe wrote it: CPU use already the median of each run's own.
    let old = format!(
        "{BEGIN}\n\n## The wide area, every link and peer (generated 2026-11-25)\n\n\
         Regenerated by `w --rtt-ms 30`; everything between the markers is its output. CPU use \
         is each run's CPU seconds over its wall seconds (cores kept busy, both ends together; \
         median).\n\n### 1 Gbit/s, 30 ms round trip\n\n- fact\n\n{END}\n"
    );
    assert_eq!(
        sections(&old)[0].text,
        "### 1 Gbit/s, 30 ms round trip\n\nMeasured on 2026-11-25 by `w --rtt-ms 30`.\n\n- fact"
    );
}

#[test]
fn several_links_still_to_come_with_earlier_sections_are_named_together() {
    let doc = page_after("", ("run one", "d1"), &[link(30, 3.0), link(89, 9.0)], &[]);
    let mid = page_after(&doc, ("run two", "d2"), &[link(0, 1.0)], &[30, 89]);
    assert!(
        mid.contains(": 30 ms, 89 ms (the sections of 30 ms, 89 ms above are an earlier run's).\n")
    );
}

#[test]
fn the_unshaped_link_comes_first_and_is_kept_like_any_other() {
    let mut unshaped = link(0, 0.5);
    unshaped.kind = LinkKind::Unshaped;
    unshaped.items[0].failures.clear();
    let doc = page_after("", ("run one", "d1"), &[link(0, 1.0), link(89, 9.0)], &[]);
    let both = page_after(&doc, ("run two", "d2"), &[unshaped], &[]);
    let headings: Vec<&str> = both.lines().filter(|l| l.starts_with("### ")).collect();
    assert_eq!(
        headings,
        [
            "### Unshaped: veth through the switch, no rate limit, no added delay",
            "### 1 Gbit/s, 0 ms round trip",
            "### 1 Gbit/s, 89 ms round trip"
        ]
    );
    assert!(both.contains("#### a file, unshaped\n"));
    // A later run of a wide-area link keeps the unshaped section as it is.
    let unshaped_text = between(&both, "### Unshaped", "\n\n### 1 Gbit/s, 0 ms");
    assert!(unshaped_text.contains("Measured on d2 by `run two`."));
    let later = page_after(&both, ("run three", "d3"), &[link(89, 8.0)], &[]);
    assert!(later.contains(&format!("{unshaped_text}\n\n### 1 Gbit/s, 0 ms")));
}

#[test]
fn an_unshaped_link_still_to_come_is_named() {
    let block = render(
        ("w", "d"),
        Path::new("/d"),
        &[link(89, 9.0)],
        &[],
        &[LinkKind::Unshaped, LinkKind::Wan { rtt_ms: 30 }],
        &[],
    );
    assert!(block.contains(
        "Not measured yet by this run (it was still going, or was cut short, when this was \
         written): unshaped, 30 ms.\n"
    ));
}

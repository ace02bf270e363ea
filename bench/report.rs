//! Rendering: each part's rows, held in one struct per part, become a markdown table and a CSV
//! file from the same cells; the goals; the part files and `RESULTS.md` assembled from
//! them.

use crate::support::repo;
use std::path::Path;
use std::time::Duration;

/// What a part hands back: its section of the report, its raw rows, its charts.
pub struct Part {
    pub markdown: String,
    pub csv: String,
    pub charts: Vec<Chart>,
}

/// An SVG chart, written to `<part><suffix>.svg` (the main chart has no suffix).
pub struct Chart {
    pub suffix: String,
    pub svg: String,
}

impl Chart {
    /// The part's main chart, `<part>.svg`.
    pub fn main(svg: String) -> Chart {
        Chart::named("", svg)
    }

    /// Another chart of the part, `<part><suffix>.svg`.
    pub fn named(suffix: &str, svg: String) -> Chart {
        Chart {
            suffix: suffix.to_string(),
            svg,
        }
    }
}

/// One measured value. Markdown shows it for reading; CSV keeps one more decimal, fractions
/// rather than percentages, bytes rather than KB.
pub enum Cell {
    Text(String),
    Count(usize),
    /// The same number of decimals in both.
    Fixed(f64, usize),
    /// This many decimals in markdown, one more in CSV.
    Measure(f64, usize),
    /// A fraction: `87.3 %` in markdown, `0.8730` in CSV.
    Percent(f64),
    /// A size in bytes: `220 KB` in markdown, `225280` in CSV.
    Kilobytes(usize),
    /// Measurements in sequence: `1.0 / 2.0` in markdown, `1.00 2.00` in CSV.
    Series(Vec<f64>, usize),
    /// Counts side by side: `3 / 4` in markdown, `3 4` in CSV.
    Counts(Vec<usize>),
}

impl Cell {
    fn markdown(&self) -> String {
        match self {
            Cell::Text(text) => text.clone(),
            Cell::Count(count) => count.to_string(),
            Cell::Fixed(value, decimals) | Cell::Measure(value, decimals) => {
                format!("{value:.decimals$}")
            }
            Cell::Percent(fraction) => format!("{:.1} %", fraction * 100.0),
            Cell::Kilobytes(bytes) => format!("{} KB", bytes / 1024),
            Cell::Series(values, decimals) => joined(values, *decimals, " / "),
            Cell::Counts(counts) => joined_counts(counts, " / "),
        }
    }

    fn csv(&self) -> String {
        match self {
            Cell::Text(text) => csv_field(text),
            Cell::Count(count) => count.to_string(),
            Cell::Fixed(value, decimals) => format!("{value:.decimals$}"),
            Cell::Measure(value, decimals) => {
                let decimals = decimals + 1;
                format!("{value:.decimals$}")
            }
            Cell::Percent(fraction) => format!("{fraction:.4}"),
            Cell::Kilobytes(bytes) => bytes.to_string(),
            Cell::Series(values, decimals) => joined(values, decimals + 1, " "),
            Cell::Counts(counts) => joined_counts(counts, " "),
        }
    }
}

/// Numbers with `decimals` decimals, joined by `separator`.
pub fn joined(values: &[f64], decimals: usize, separator: &str) -> String {
    let texts: Vec<String> = values.iter().map(|v| format!("{v:.decimals$}")).collect();
    texts.join(separator)
}

fn joined_counts(counts: &[usize], separator: &str) -> String {
    let texts: Vec<String> = counts.iter().map(ToString::to_string).collect();
    texts.join(separator)
}

/// Quoted when it holds a comma, a quote or a line break (RFC 4180).
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

/// A column: its heading in markdown and its name in CSV. A quantity shown one way to readers
/// and another to machines (added µs in markdown, raw ms in CSV) is two columns, one in each.
pub struct Column {
    markdown: Option<&'static str>,
    csv: Option<&'static str>,
    left_aligned: bool,
}

impl Column {
    pub const fn both(markdown: &'static str, csv: &'static str) -> Column {
        Column {
            markdown: Some(markdown),
            csv: Some(csv),
            left_aligned: false,
        }
    }

    pub const fn markdown(heading: &'static str) -> Column {
        Column {
            markdown: Some(heading),
            csv: None,
            left_aligned: false,
        }
    }

    pub const fn csv(name: &'static str) -> Column {
        Column {
            markdown: None,
            csv: Some(name),
            left_aligned: false,
        }
    }

    /// Left-aligned in markdown (text); numbers are right-aligned.
    pub const fn left(self) -> Column {
        Column {
            left_aligned: true,
            ..self
        }
    }

    fn alignment(&self) -> &'static str {
        if self.left_aligned {
            "---"
        } else {
            "---:"
        }
    }
}

/// A part's row: its columns, and its cells in the same order.
pub trait Row {
    const COLUMNS: &'static [Column];
    fn cells(&self) -> Vec<Cell>;
}

/// The rows as a markdown table, headings and alignment first.
pub fn markdown_table<R: Row>(rows: &[R]) -> String {
    let shown = |column: &Column| column.markdown.is_some();
    let headings: Vec<&str> = R::COLUMNS.iter().filter_map(|c| c.markdown).collect();
    let alignments: Vec<&str> = R::COLUMNS
        .iter()
        .filter(|c| shown(c))
        .map(Column::alignment)
        .collect();
    let mut out = format!("| {} |\n|{}|\n", headings.join(" | "), alignments.join("|"));
    for row in rows {
        let cells = visible_cells(row, shown, Cell::markdown);
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    out
}

/// The rows as CSV: a header line, then [`csv_rows`].
pub fn csv_table<R: Row>(rows: &[R]) -> String {
    let names: Vec<&str> = R::COLUMNS.iter().filter_map(|c| c.csv).collect();
    format!("{}\n{}", names.join(","), csv_rows(rows))
}

/// The rows as CSV lines without a header.
pub fn csv_rows<R: Row>(rows: &[R]) -> String {
    let shown = |column: &Column| column.csv.is_some();
    rows.iter()
        .map(|row| visible_cells(row, shown, Cell::csv).join(",") + "\n")
        .collect()
}

fn visible_cells<R: Row>(
    row: &R,
    shown: impl Fn(&Column) -> bool,
    render: fn(&Cell) -> String,
) -> Vec<String> {
    let cells = row.cells();
    assert_eq!(cells.len(), R::COLUMNS.len(), "a cell per column");
    R::COLUMNS
        .iter()
        .zip(&cells)
        .filter(|(column, _)| shown(column))
        .map(|(_, cell)| render(cell))
        .collect()
}

/// A goal from the issue, with what was measured.
pub fn goal(text: &str, met: Option<bool>, measured: &str) -> String {
    let verdict = match met {
        Some(true) => "**met**",
        Some(false) => "**not met**",
        None => "**not measured**",
    };
    format!("- Goal: {text}: {verdict} ({measured})\n")
}

/// The code a run measured: the checkout's commit, and whether its tree had changes beyond
/// the benchmark's own results.
#[derive(Clone, Debug, PartialEq)]
pub struct Stamp {
    pub commit: String,
    pub dirty: bool,
}

/// Where a part file records its stamp (first line, for [`assemble`] to read).
const STAMP_MARK: &str = "<!-- bench-stamp: ";

impl Stamp {
    /// The checkout's stamp, read once before any part writes its results.
    pub fn of_checkout() -> Stamp {
        let git = |args: &[&str]| {
            std::process::Command::new("git")
                .args(args)
                .current_dir(repo())
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        };
        let commit = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
        let outputs = [
            ":!bench/results",
            ":!bench/results-quick",
            ":!bench/RESULTS.md",
            ":!bench/RESULTS-quick.md",
        ];
        let status = git(&[&["status", "--porcelain", "--", "."][..], &outputs].concat());
        Stamp {
            commit,
            dirty: status.is_none_or(|changes| !changes.is_empty()),
        }
    }

    pub fn mark(&self) -> String {
        let state = if self.dirty { "dirty" } else { "clean" };
        format!("{STAMP_MARK}{} {state} -->", self.commit)
    }

    fn read(markdown: &str) -> Option<Stamp> {
        let line = markdown.lines().next()?.strip_prefix(STAMP_MARK)?;
        let mut words = line.trim_end_matches("-->").split_whitespace();
        let commit = words.next()?.to_string();
        let dirty = words.next()? == "dirty";
        Some(Stamp { commit, dirty })
    }

    pub fn describe(&self) -> String {
        let short: String = self.commit.chars().take(12).collect();
        if self.dirty {
            format!("commit `{short}` with uncommitted changes")
        } else {
            format!("commit `{short}`")
        }
    }
}

/// `<name>.md`, `.csv` and its charts' `.svg` in `dir`; the markdown opens with the stamp,
/// the command, the machine and how long the part ran.
pub fn write_part(dir: &Path, name: &str, header: &RunHeader, part: Part, took: Duration) {
    let command = format!("cargo run --release --example bench -- {}", header.run);
    let markdown = format!(
        "{}\n_{}; command: `{command}`; {}; this part ran {}._\n\n{}",
        header.stamp.mark(),
        capitalised(&header.stamp.describe()),
        header.machine,
        run_time(took),
        part.markdown
    );
    std::fs::write(dir.join(format!("{name}.md")), markdown).expect("write md");
    std::fs::write(dir.join(format!("{name}.csv")), part.csv).expect("write csv");
    for chart in part.charts {
        let file = format!("{name}{}.svg", chart.suffix);
        std::fs::write(dir.join(file), chart.svg).expect("write svg");
    }
}

/// "12 s" under a minute, "3.2 minutes" from there.
fn run_time(took: Duration) -> String {
    let seconds = took.as_secs_f64();
    if seconds < 60.0 {
        format!("{seconds:.0} s")
    } else {
        format!("{:.1} minutes", seconds / 60.0)
    }
}

/// What every part of one run is stamped with.
pub struct RunHeader {
    pub stamp: Stamp,
    pub run: String,
    pub machine: String,
}

fn capitalised(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map(|first| first.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// `report` (relative to the repository): an introduction, then every part file in `dir` in
/// name order, with links pointing into `dir`.
pub fn assemble(dir: &Path, report: &str, stamp: &Stamp) {
    let folder = dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("results");
    let parts: Vec<String> = part_files(dir)
        .iter()
        .map(|name| std::fs::read_to_string(dir.join(name)).unwrap_or_default())
        .collect();
    let out = assembled(&parts, folder, stamp);
    std::fs::write(repo().join(report), out).expect("report");
    println!("wrote {report}");
}

/// The report from its parts' files: parts of another commit than `stamp` (or none) keep
/// their place, marked stale in their heading, so no reader takes them for this run's.
fn assembled(parts: &[String], folder: &str, stamp: &Stamp) -> String {
    let stale: Vec<bool> = parts
        .iter()
        .map(|part| Stamp::read(part).as_ref() != Some(stamp))
        .collect();
    let state = if stale.contains(&true) {
        "Parts marked **stale** were measured on other code and are not part of this run."
    } else {
        "Every part below is from this one run."
    };
    let mut out = format!(
        "# Benchmark results\n\nOne run of {}: {state} Produced by `make bench` (parts: \
         `make bench-schedule`, `make bench-hop`, `make bench-quality`, `make bench-memory`, \
         `make bench-scaleout`, `make bench-overload`, `make bench-pools`, `make bench-profile`; \
         a small run: `make bench-quick`). Raw numbers are in `bench/{folder}/*.csv`, charts in \
         `bench/{folder}/*.svg`. How to read them: `bench/README.md`.\n\n",
        stamp.describe()
    );
    for (part, stale) in parts.iter().zip(stale) {
        out.push_str(&if stale {
            marked_stale(part)
        } else {
            part.clone()
        });
        out.push('\n');
    }
    out.replace("](results/", &format!("]({folder}/"))
}

/// `part` with a **Stale** line under its first `## ` heading: the heading (and so every
/// link to its anchor) stays as it is from one run to the next.
fn marked_stale(part: &str) -> String {
    let from = Stamp::read(part).map_or("no recorded commit".into(), |s| s.describe());
    let mut marked = false;
    part.lines()
        .map(|line| {
            if !marked && line.starts_with("## ") {
                marked = true;
                format!("{line}\n\n**Stale:** measured on {from}, not this run's.\n")
            } else {
                format!("{line}\n")
            }
        })
        .collect()
}

fn part_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("results")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".md") && n.starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    names.sort();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_under_a_minute_reads_in_seconds() {
        assert_eq!(run_time(Duration::from_secs(18)), "18 s");
        assert_eq!(run_time(Duration::from_secs(192)), "3.2 minutes");
    }

    struct Sample {
        name: &'static str,
        hit_rate: f64,
        added_us: f64,
        raw_ms: f64,
    }

    impl Row for Sample {
        const COLUMNS: &'static [Column] = &[
            Column::both("workload", "workload").left(),
            Column::both("hit rate", "hit_rate"),
            Column::markdown("added µs"),
            Column::csv("raw_ms"),
        ];

        fn cells(&self) -> Vec<Cell> {
            vec![
                Cell::Text(self.name.into()),
                Cell::Percent(self.hit_rate),
                Cell::Fixed(self.added_us, 0),
                Cell::Measure(self.raw_ms, 3),
            ]
        }
    }

    const ROWS: [Sample; 1] = [Sample {
        name: "shared prefix, 45 req/s",
        hit_rate: 0.8772,
        added_us: 70.4,
        raw_ms: 0.34191,
    }];

    #[test]
    fn one_row_renders_as_markdown_and_csv() {
        assert_eq!(
            markdown_table(&ROWS),
            "| workload | hit rate | added µs |\n|---|---:|---:|\n\
             | shared prefix, 45 req/s | 87.7 % | 70 |\n"
        );
        assert_eq!(
            csv_table(&ROWS),
            "workload,hit_rate,raw_ms\n\"shared prefix, 45 req/s\",0.8772,0.3419\n"
        );
    }

    fn part(stamp: &Stamp, heading: &str) -> String {
        format!("{}\n_x._\n\n## {heading}\n\ntext\n", stamp.mark())
    }

    #[test]
    fn a_part_of_another_commit_is_marked_stale_under_its_heading() {
        let run = Stamp {
            commit: "a".repeat(40),
            dirty: false,
        };
        let old = Stamp {
            commit: "b".repeat(40),
            dirty: false,
        };
        let dirty = Stamp {
            dirty: true,
            ..run.clone()
        };
        let parts = [
            part(&run, "1. One"),
            part(&old, "2. Two"),
            part(&dirty, "3. Three"),
            "## 4. Unstamped\n".to_string(),
        ];
        let report = assembled(&parts, "results", &run);
        assert!(report.contains("## 1. One\n"), "{report}");
        let marked = |heading: &str, from: &str| {
            report.contains(&format!("{heading}\n\n**Stale:** measured on {from}"))
        };
        assert!(marked(
            "## 2. Two",
            "commit `bbbbbbbbbbbb`, not this run's."
        ));
        assert!(marked(
            "## 3. Three",
            "commit `aaaaaaaaaaaa` with uncommitted"
        ));
        assert!(marked("## 4. Unstamped", "no recorded commit"));
        assert!(report.contains("are not part of this run"));
        let whole = assembled(&parts[..1], "results", &run);
        assert!(
            whole.contains("Every part below is from this one run."),
            "{whole}"
        );
        assert!(!whole.contains("stale"));
    }
}

//! `tensortune report`: one self-contained HTML page about a records database.
//!
//! The page has a table of every workload and target (trials, errors, best latency and
//! GFLOP/s, as `tensortune records` prints it), then a section per workload with its tuning
//! curve (the SVG of `tensortune plot`, inlined) and, per target, the loop nest of its best
//! schedule (as `tensortune show` prints it). It loads nothing from anywhere and runs no
//! script: a browser opened on the file, offline, shows all of it.

use std::fmt::Write as _;
use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use tensortune_records::{Database, Summary, Timestamp};
use tensortune_schedules::ops::WorkloadSpec;

use super::inspect::replay_and_lower;
use super::plot::{curves, render_svg};
use super::records::{format_seconds, write_out};
use super::CliError;

/// `tensortune report`: an HTML page of a database's workloads, curves and best schedules.
#[derive(Debug, Args)]
#[command(
    after_help = "The page is one file with no external resources: open it in any \
    browser, or attach it to a note.\n\n\
    Example:\n  tensortune report --db tuning.db --out report.html"
)]
pub struct ReportArgs {
    /// The records database: a SQLite file, or a `postgres://` URL.
    #[arg(long, value_name = "DB")]
    pub db: PathBuf,
    /// The HTML file to write (`-` for stdout).
    #[arg(long, value_name = "FILE", default_value = "report.html")]
    pub out: PathBuf,
}

/// The CSS of the page: readable defaults, a striped table, wide loop nests scroll.
const STYLE: &str = "\
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;padding:0 1em;color:#222}
h1{font-size:1.6em;margin-bottom:.2em}
h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ccc;padding-bottom:.2em}
h3{font-size:1em;margin-bottom:.3em}
p.meta{color:#666;margin-top:0}
table{border-collapse:collapse;font-size:.92em;width:100%}
th,td{padding:.3em .8em;text-align:left;border-bottom:1px solid #e4e4e4}
th{background:#f3f3f3}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.key,td.target{overflow-wrap:break-word}
td.target{font-family:ui-monospace,monospace;font-size:.85em}
tbody tr:nth-child(even){background:#fafafa}
figure{margin:1em 0}
pre{background:#f7f7f7;border:1px solid #e4e4e4;padding:.8em;overflow-x:auto;font-size:.85em;line-height:1.35}
.note{color:#a33}
";

/// Text safe inside HTML elements and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A key or target for a table cell: escaped, and breakable after each comma, so a long
/// one wraps between its parts rather than inside a name.
fn breakable(text: &str) -> String {
    escape(text).replace(',', ",<wbr>")
}

/// The HTML page of a database.
pub fn render(db: &Database) -> Result<String, CliError> {
    let rows = db.summary()?;
    let mut keys: Vec<String> = Vec::new();
    for row in &rows {
        if !keys.contains(&row.workload.key) {
            keys.push(row.workload.key.clone());
        }
    }
    let title = format!("tensortune report: {}", db.location().display());
    let trials: u64 = rows.iter().map(|r| r.trials).sum();
    let mut html = String::new();
    // `write!` into a String cannot fail: the results are ignored below.
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>{}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n<h1>tensortune report</h1>\n\
         <p class=\"meta\">{} &middot; {} workload(s), {trials} record(s) &middot; written {} \
         by tensortune {}</p>\n",
        escape(&title),
        escape(&db.location().display().to_string()),
        keys.len(),
        Timestamp::now(),
        env!("CARGO_PKG_VERSION"),
    );
    if rows.is_empty() {
        html.push_str("<p>This database has no records.</p>\n</body>\n</html>\n");
        return Ok(html);
    }
    html.push_str(&summary_table(&rows, &keys));
    for (i, key) in keys.iter().enumerate() {
        let targets: Vec<String> = rows
            .iter()
            .filter(|r| &r.workload.key == key)
            .map(|r| r.target.clone())
            .collect();
        html.push_str(&workload_section(db, i, key, &targets)?);
    }
    html.push_str("</body>\n</html>\n");
    Ok(html)
}

/// The table of workloads and targets; each workload links to its section.
fn summary_table(rows: &[Summary], keys: &[String]) -> String {
    let mut html = String::from(
        "<table id=\"summary\">\n<thead><tr><th>workload</th><th>target</th><th>trials</th>\
         <th>errors</th><th>best</th><th>GFLOP/s</th></tr></thead>\n<tbody>\n",
    );
    for row in rows {
        let section = keys
            .iter()
            .position(|k| k == &row.workload.key)
            .unwrap_or(0);
        let _ = writeln!(
            html,
            "<tr><td class=\"key\"><a href=\"#workload-{section}\">{}</a></td><td class=\"target\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td></tr>",
            breakable(&row.workload.key),
            breakable(&row.target),
            row.trials,
            row.errors,
            row.best_s.map_or_else(|| "-".to_string(), format_seconds),
            row.best_gflops()
                .map_or_else(|| "-".to_string(), |g| format!("{g:.1}")),
        );
    }
    html.push_str("</tbody>\n</table>\n");
    html
}

/// A workload's section: its curve over every target, then each target's best loop nest.
fn workload_section(
    db: &Database,
    index: usize,
    key: &str,
    targets: &[String],
) -> Result<String, CliError> {
    let mut html = String::new();
    let _ = writeln!(
        html,
        "<section class=\"workload\" id=\"workload-{index}\">\n<h2>{}</h2>",
        escape(key)
    );
    let svg = render_svg(key, &curves(db, key, targets)?, (900, 420))?;
    let _ = writeln!(html, "<figure class=\"curve\">\n{svg}\n</figure>");
    // A workload of an op this build does not know still gets its row and curve.
    let dag = WorkloadSpec::parse(key).and_then(|w| w.build());
    for target in targets {
        let _ = writeln!(
            html,
            "<h3>best schedule on <code>{}</code></h3>",
            escape(target)
        );
        let Some(best) = db.best(key, target)? else {
            html.push_str("<p class=\"note\">No successful record.</p>\n");
            continue;
        };
        let figures = format!(
            "{}, {} GFLOP/s, measured {}",
            best.outcome
                .timing()
                .map_or_else(|| "-".to_string(), |t| format_seconds(t.median_s)),
            best.gflops()
                .map_or_else(|| "-".to_string(), |g| format!("{g:.1}")),
            best.measured_at
        );
        let _ = writeln!(html, "<p>{}</p>", escape(&figures));
        let nest = match &dag {
            Ok(dag) => replay_and_lower(dag, &best.trace_json).map(|(_, func)| func.to_string()),
            Err(e) => Err(CliError::Usage(format!(
                "the op library cannot build it: {e}"
            ))),
        };
        match nest {
            Ok(text) => {
                let _ = writeln!(html, "<pre class=\"loop-nest\">{}</pre>", escape(&text));
            }
            // One bad record must not cost the whole page: say why there is no loop nest.
            Err(e) => {
                let _ = writeln!(
                    html,
                    "<p class=\"note\">No loop nest: {}</p>",
                    escape(&e.to_string())
                );
            }
        }
    }
    html.push_str("</section>\n");
    Ok(html)
}

/// `tensortune report`: writes the page to `--out` (or `out` for `-`) and says so on `out`.
pub fn report(args: &ReportArgs, out: &mut dyn Write) -> Result<(), CliError> {
    super::output::refuse_clobbering(&[("--db", &args.db)], &[("--out", &args.out)])?;
    let db = Database::open_read_only(&args.db)?;
    let html = render(&db)?;
    if args.out.as_os_str() == "-" {
        return write_out(out, &html);
    }
    super::output::write_file(&args.out, html.as_bytes())?;
    write_out(out, &format!("wrote {}\n", args.out.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensortune_records::{NewRecord, Timing, Workload};
    use tensortune_schedules::schedule::State;

    #[test]
    fn escape_covers_markup_and_quotes() {
        assert_eq!(
            escape(r#"<a href="x">&'"#),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }

    #[test]
    fn the_page_has_a_row_a_curve_and_a_loop_nest_per_workload() {
        let dir = std::env::temp_dir().join(format!("tensortune-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("r.db");
        let _ = std::fs::remove_file(&path);
        let mut db = Database::open(&path).expect("open");
        let mut batch = Vec::new();
        for spec in ["matmul:M=8,N=8,K=8", "softmax:M=4,N=16"] {
            let w = WorkloadSpec::parse(spec).expect("spec");
            let dag = w.build().expect("dag");
            let trace = State::new(&dag).trace().to_json();
            let timing = Timing {
                median_s: 1e-6,
                min_s: 1e-6,
                max_s: 1e-6,
                repeats: 1,
            };
            let workload = Workload::new(w.canonical(), dag.flops());
            batch.push(NewRecord::measured(workload, "llvm <t>", trace, timing));
        }
        db.insert_batch(None, &batch).expect("insert");
        let html = render(&db).expect("render");
        assert_eq!(html.matches("<svg").count(), 2);
        assert_eq!(html.matches("<pre class=\"loop-nest\">").count(), 2);
        assert_eq!(html.matches("<tr><td class=\"key\">").count(), 2);
        assert!(html.contains("llvm &lt;t&gt;"), "targets are escaped");
        assert!(html.contains("softmax:M=4,N=16,dtype=f32"));
        assert!(!html.contains("<script"), "the page runs no script");
        assert!(
            !html.contains("src=") && !html.contains("<link"),
            "loads nothing"
        );
    }
}

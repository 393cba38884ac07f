//! `tensortune plot`: the tuning curve of a workload as an SVG picture.
//!
//! A tuning curve is the best GFLOP/s found so far against the number of trials, one line per
//! tuning run. A run's trials are its records in measurement order, failures included (they
//! cost a trial too); its line starts at its first successful trial and steps up where the run
//! found something faster. Each run counts only its own records: a resumed run searched from
//! the database's best, but its line shows what it measured itself. Records with no run
//! (imported without one) form one more line. `tensortune report` draws the same pictures.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use plotters::prelude::*;
use tensortune_records::{Database, Record, RunId};

use super::records::{workload_key, write_out};
use super::CliError;

/// `tensortune plot`: a workload's tuning curve as SVG.
#[derive(Debug, Args)]
#[command(
    after_help = "Every run that tuned the workload is one line; with no --target, \
    the runs of every target are drawn.\n\n\
    Examples:\n  \
    tensortune plot --db tuning.db --workload matmul:M=512,N=512,K=512 --out curve.svg\n  \
    tensortune plot --db tuning.db --workload matmul:M=512,N=512,K=512 --out - > curve.svg"
)]
pub struct PlotArgs {
    /// The records database: a SQLite file, or a `postgres://` URL.
    #[arg(long, value_name = "DB")]
    pub db: PathBuf,
    /// The workload spec, e.g. `matmul:M=512,N=512,K=512` (any key order, defaults optional).
    #[arg(long, value_name = "SPEC")]
    pub workload: String,
    /// Only the runs on this target key.
    #[arg(long, value_name = "TARGET")]
    pub target: Option<String>,
    /// The SVG file to write (`-` for stdout).
    #[arg(long, value_name = "FILE", default_value = "curve.svg")]
    pub out: PathBuf,
}

/// A point of a curve: the trial (from 1) and the best GFLOP/s so far.
pub type Point = (u32, f64);

/// One line of a tuning curve: `(trial, best GFLOP/s so far)` corners of a step function.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    /// What the legend calls it: the run, and its target where several are drawn.
    pub label: String,
    /// How many trials the run made (its records, failures included).
    pub trials: usize,
    /// The corners of the step line, trials counted from 1: a point at the first success,
    /// then at each improvement the old and the new best at that trial, and a last point at
    /// the run's last trial.
    pub points: Vec<Point>,
    /// Where the best improved (the first success included): the trials drawn as dots, so a
    /// run with one success still shows.
    pub improvements: Vec<Point>,
}

impl Curve {
    /// The best GFLOP/s the run reached, if any trial succeeded.
    pub fn best(&self) -> Option<f64> {
        self.points.last().map(|p| p.1)
    }
}

/// The curves of a workload, one per run (and one for records with no run), over the given
/// targets, in the order of the runs' ids.
pub fn curves(db: &Database, key: &str, targets: &[String]) -> Result<Vec<Curve>, CliError> {
    let runs: BTreeMap<RunId, _> = db.runs()?.into_iter().map(|r| (r.id, r)).collect();
    let mut out = Vec::new();
    for target in targets {
        let mut by_run: BTreeMap<Option<RunId>, Vec<Record>> = BTreeMap::new();
        for record in db.records(key, target)? {
            by_run.entry(record.run).or_default().push(record);
        }
        for (run, mut records) in by_run {
            // Measurement order; records of one batch share a time, and their ids keep the
            // order they were inserted in.
            records.sort_by_key(|r| (r.measured_at, r.id));
            let mut label = match run {
                Some(id) => match runs.get(&id).and_then(|r| r.seed) {
                    Some(seed) => format!("run {} (seed {seed})", id.0),
                    None => format!("run {}", id.0),
                },
                None => "records with no run".to_string(),
            };
            if targets.len() > 1 {
                label = format!("{label}, {target}");
            }
            let (points, improvements) = step_points(&records);
            out.push(Curve {
                label,
                trials: records.len(),
                points,
                improvements,
            });
        }
    }
    Ok(out)
}

/// The corners of the best-so-far step line of records in measurement order, and the
/// improvements among them.
fn step_points(records: &[Record]) -> (Vec<Point>, Vec<Point>) {
    let mut points = Vec::new();
    let mut improvements = Vec::new();
    let mut best: Option<f64> = None;
    for (i, record) in records.iter().enumerate() {
        let trial = i as u32 + 1;
        let Some(g) = record.gflops() else { continue };
        match best {
            None => points.push((trial, g)),
            Some(b) if g > b => {
                points.push((trial, b));
                points.push((trial, g));
            }
            Some(_) => continue,
        }
        improvements.push((trial, g));
        best = Some(best.map_or(g, |b| b.max(g)));
    }
    if let (Some(b), Some(&(last, _))) = (best, points.last()) {
        let n = records.len() as u32;
        if last < n {
            points.push((n, b));
        }
    }
    (points, improvements)
}

/// The curves drawn as an SVG document of `size` pixels, titled `title`.
pub fn render_svg(title: &str, curves: &[Curve], size: (u32, u32)) -> Result<String, CliError> {
    let draw_error = |e: String| CliError::Internal(format!("drawing the curve: {e}"));
    let max_trials = curves.iter().map(|c| c.trials).max().unwrap_or(0).max(1) as u32;
    let top = curves.iter().filter_map(Curve::best).fold(0.0f64, f64::max);
    // Headroom above the best line, and a visible axis when nothing succeeded.
    let top = if top > 0.0 { top * 1.08 } else { 1.0 };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_error(e.to_string()))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(56)
            .build_cartesian_2d(0u32..max_trials, 0f64..top)
            .map_err(|e| draw_error(e.to_string()))?;
        chart
            .configure_mesh()
            .x_desc("trials")
            .y_desc("best GFLOP/s so far")
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(|e| draw_error(e.to_string()))?;
        for (i, curve) in curves.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let label = match curve.best() {
                Some(b) => format!("{}: {b:.1} GFLOP/s in {} trials", curve.label, curve.trials),
                None => format!("{}: no success in {} trials", curve.label, curve.trials),
            };
            chart
                .draw_series(LineSeries::new(
                    curve.points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(|e| draw_error(e.to_string()))?
                .label(label)
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2))
                });
            chart
                .draw_series(
                    curve
                        .improvements
                        .iter()
                        .map(|&p| Circle::new(p, 3, color.filled())),
                )
                .map_err(|e| draw_error(e.to_string()))?;
        }
        if !curves.is_empty() {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .background_style(WHITE.mix(0.85))
                .border_style(RGBColor(200, 200, 200))
                .draw()
                .map_err(|e| draw_error(e.to_string()))?;
        }
        root.present().map_err(|e| draw_error(e.to_string()))?;
    }
    Ok(svg)
}

/// The targets to draw: the one asked for, or every target the workload has records on.
/// No record at all is the user's error: a wrong spec, database or target.
pub(crate) fn plot_targets(
    db: &Database,
    key: &str,
    target: Option<&str>,
) -> Result<Vec<String>, CliError> {
    let have = db.targets_of(key)?;
    match target {
        Some(t) if have.iter().any(|h| h == t) => Ok(vec![t.to_string()]),
        Some(t) => Err(CliError::Usage(format!(
            "{}: no records of {key} on target `{t}`{}",
            db.location().display(),
            if have.is_empty() {
                String::new()
            } else {
                format!("; it has records for: {}", have.join(" | "))
            }
        ))),
        None if have.is_empty() => Err(CliError::Usage(format!(
            "{}: no records of {key}",
            db.location().display()
        ))),
        None => Ok(have),
    }
}

/// `tensortune plot`: writes the curve to `--out` (or `out` for `-`) and says so on `out`.
pub fn plot(args: &PlotArgs, out: &mut dyn Write) -> Result<(), CliError> {
    super::output::refuse_clobbering(&[("--db", &args.db)], &[("--out", &args.out)])?;
    let db = Database::open_read_only(&args.db)?;
    let key = workload_key(&db, &args.workload)?;
    let targets = plot_targets(&db, &key, args.target.as_deref())?;
    let curves = curves(&db, &key, &targets)?;
    let svg = render_svg(&key, &curves, (800, 480))?;
    if args.out.as_os_str() == "-" {
        return write_out(out, &svg);
    }
    super::output::write_file(&args.out, svg.as_bytes())?;
    let trials: usize = curves.iter().map(|c| c.trials).sum();
    write_out(
        out,
        &format!(
            "wrote {} ({} run(s), {trials} trial(s) of {key})\n",
            args.out.display(),
            curves.len()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensortune_records::{NewRecord, NewRun, Timing, Workload};

    const CPU: &str = "llvm -mcpu=test";

    fn timing(s: f64) -> Timing {
        Timing {
            median_s: s,
            min_s: s,
            max_s: s,
            repeats: 1,
        }
    }

    /// Two runs of matmul 8³ (flops 1024): latencies in ms, `None` a failure.
    fn sample_db(path: &std::path::Path, runs: &[&[Option<f64>]]) -> Database {
        let mut db = Database::open(path).expect("open");
        let w = Workload::new("matmul:K=8,M=8,N=8,dtype=f32", 1024.0);
        for (r, latencies) in runs.iter().enumerate() {
            let run = db
                .begin_run(&NewRun {
                    tool_version: "test".into(),
                    target: CPU.into(),
                    seed: Some(r as u64),
                    options: "{}".into(),
                    plan: None,
                })
                .expect("run");
            let batch: Vec<NewRecord> = latencies
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    let trace = format!(r#"{{"steps":[],"n":"{r}-{i}"}}"#);
                    match l {
                        Some(ms) => NewRecord::measured(w.clone(), CPU, &trace, timing(ms * 1e-3)),
                        None => NewRecord::failed(
                            w.clone(),
                            CPU,
                            &trace,
                            tensortune_records::ErrorKind::Runtime,
                            "x",
                        ),
                    }
                })
                .collect();
            db.insert_batch(Some(run), &batch).expect("insert");
        }
        db
    }

    fn temp_path(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tensortune-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join(name);
        let _ = std::fs::remove_file(&path);
        path
    }

    #[test]
    fn a_curve_steps_up_at_each_improvement_and_ends_at_the_last_trial() {
        let path = temp_path("steps.db");
        // 1024 flops: 1e-3 ms is 1.024 GFLOP/s, 5e-4 ms is 2.048.
        let db = sample_db(
            &path,
            &[
                &[None, Some(1e-3), Some(2e-3), Some(5e-4), None],
                &[Some(1e-3)],
            ],
        );
        let key = "matmul:K=8,M=8,N=8,dtype=f32";
        let curves = curves(&db, key, &[CPU.to_string()]).expect("curves");
        assert_eq!(curves.len(), 2);
        assert_eq!(curves[0].trials, 5);
        let p: Vec<(u32, String)> = curves[0]
            .points
            .iter()
            .map(|&(t, g)| (t, format!("{g:.3}")))
            .collect();
        let want = [(2, "1.024"), (4, "1.024"), (4, "2.048"), (5, "2.048")];
        let want: Vec<(u32, String)> = want.iter().map(|&(t, g)| (t, g.to_string())).collect();
        assert_eq!(p, want);
        assert!(curves[0].label.starts_with("run "), "{}", curves[0].label);
        assert!(curves[0].label.ends_with("(seed 0)"), "{}", curves[0].label);
        assert_eq!(curves[0].improvements.len(), 2);
        assert_eq!(curves[0].improvements[1].0, 4);
        assert_eq!(curves[1].points, vec![(1, 1.024)]);
        assert_eq!(curves[1].improvements, curves[1].points);
    }

    #[test]
    fn the_svg_has_a_line_and_a_legend_per_run() {
        let path = temp_path("svg.db");
        let db = sample_db(&path, &[&[Some(2e-3), Some(1e-3)], &[None, None]]);
        let key = "matmul:K=8,M=8,N=8,dtype=f32";
        let svg = render_svg(
            key,
            &curves(&db, key, &[CPU.into()]).expect("c"),
            (640, 400),
        )
        .expect("svg");
        assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
        assert!(svg.contains(key));
        assert!(svg.contains("best GFLOP/s so far"));
        assert!(
            svg.contains("1.0 GFLOP/s in 2 trials"),
            "legend of the first run"
        );
        assert!(
            svg.contains("no success in 2 trials"),
            "legend of the second run"
        );
    }

    #[test]
    fn plot_writes_a_file_and_rejects_unknown_workloads_and_targets() {
        let path = temp_path("plot.db");
        drop(sample_db(&path, &[&[Some(1e-3)]]));
        let svg = temp_path("curve.svg");
        let mut out = Vec::new();
        let args = PlotArgs {
            db: path.clone(),
            workload: "matmul:M=8,N=8,K=8".into(),
            target: None,
            out: svg.clone(),
        };
        plot(&args, &mut out).expect("plot");
        assert!(String::from_utf8(out)
            .expect("utf-8")
            .contains("1 run(s), 1 trial(s)"));
        assert!(std::fs::read_to_string(&svg)
            .expect("svg")
            .contains("</svg>"));

        let other = PlotArgs {
            workload: "matmul:M=9,N=8,K=8".into(),
            ..args
        };
        let e = plot(&other, &mut Vec::new()).expect_err("no records");
        assert_eq!(e.exit_code(), 2, "{e}");
        let wrong_target = PlotArgs {
            workload: "matmul:M=8,N=8,K=8".into(),
            target: Some("cuda".into()),
            ..other
        };
        let e = plot(&wrong_target, &mut Vec::new()).expect_err("no such target");
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains(CPU), "{e}");
    }
}

//! `tensortune model`: the learned cost model on a records database.
//!
//! - `model eval`: per workload, train on a random 80% of its records (with `--held-out`, on
//!   the other workloads' records) and report on the rest the pairwise ranking accuracy,
//!   Spearman correlation and top-5 recall of the gradient-boosted model beside those of the
//!   random model and of the analytic one (the features' own cost estimate, untrained).
//! - `model train`: train on every record of a target and save the model, so that a new
//!   tuning run can start warm.

use super::CliError;
use std::io::Write;
use std::path::PathBuf;
use tensortune_cost_model::dataset::samples_from_records;
use tensortune_cost_model::eval::{evaluate, EvalOptions, RankingMetrics, Split};
use tensortune_cost_model::{GbdtModel, GbdtOptions, ModelError, Objective};
use tensortune_records::Database;

/// Arguments of `tensortune model`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tensortune model eval --db tuning.db\n  tensortune model train --db tuning.db --out model.json"
)]
pub struct ModelArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: ModelCommand,
}

/// The `model` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ModelCommand {
    /// Held-out ranking quality of the cost model, per workload, beside the random and the
    /// analytic (untrained) models.
    #[command(
        after_help = "Example:\n  tensortune model eval --db tuning.db\n  tensortune model eval --db tuning.db --held-out\n  tensortune model eval --db tuning.db --objective both --json"
    )]
    Eval(EvalArgs),
    /// Train the cost model on every record of a target and save it.
    #[command(after_help = "Example:\n  tensortune model train --db tuning.db --out model.json")]
    Train(TrainArgs),
}

/// Where the records come from.
#[derive(Debug, clap::Args)]
pub struct Source {
    /// The records database: a SQLite file, or a `postgres://` URL.
    #[arg(long, value_name = "DB")]
    pub db: PathBuf,
    /// Target key (as `tensortune records` lists them); may be omitted when the database
    /// holds one target.
    #[arg(long)]
    pub target: Option<String>,
}

/// Arguments of `tensortune model eval`.
#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// Records to evaluate on.
    #[command(flatten)]
    pub source: Source,
    /// Loss of the gradient-boosted model: `rank-pairwise`, `pack-sum` (Ansor's), or `both`.
    #[arg(long, default_value = "rank-pairwise")]
    pub objective: String,
    /// Workloads with fewer records are skipped.
    #[arg(long, default_value_t = 50)]
    pub min_records: usize,
    /// Seed of the split.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Train each workload's model on the other workloads' records only and test it on all of
    /// its own (shapes the model never saw), instead of on a random 80% of its own.
    #[arg(long)]
    pub held_out: bool,
    /// Boosting rounds.
    #[arg(long)]
    pub rounds: Option<u32>,
    /// Histogram bins per feature.
    #[arg(long)]
    pub max_bin: Option<u32>,
    /// Maximum depth of a tree.
    #[arg(long)]
    pub max_depth: Option<u32>,
    /// Minimum hessian in a child (larger: smaller trees).
    #[arg(long)]
    pub min_child_weight: Option<f64>,
    /// Learning rate: the step each round's tree takes.
    #[arg(long)]
    pub eta: Option<f64>,
    /// `rank-pairwise` only: pairs sampled per program in each round.
    #[arg(long)]
    pub pairs_per_program: Option<u32>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `tensortune model train`.
#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    /// Records to train on.
    #[command(flatten)]
    pub source: Source,
    /// Where to write the model (JSON).
    #[arg(long, value_name = "PATH")]
    pub out: PathBuf,
    /// Loss: `rank-pairwise` or `pack-sum` (Ansor's).
    #[arg(long, default_value = "rank-pairwise")]
    pub objective: String,
}

fn model_error(e: ModelError) -> CliError {
    match e {
        ModelError::Records(r) => r.into(),
        e @ (ModelError::NoData(_)
        | ModelError::InvalidOptions(_)
        | ModelError::Io { .. }
        | ModelError::BadModelFile { .. }) => CliError::Usage(e.to_string()),
        e => CliError::Internal(e.to_string()),
    }
}

fn objectives(s: &str) -> Result<Vec<Objective>, CliError> {
    if s == "both" {
        return Ok(Objective::ALL.to_vec());
    }
    Objective::parse(s).map(|o| vec![o]).ok_or_else(|| {
        CliError::Usage(format!(
            "unknown objective `{s}`: expected pack-sum, rank-pairwise or both"
        ))
    })
}

/// Opens the database and picks the target.
fn open(source: &Source) -> Result<(Database, String), CliError> {
    let db = Database::open_read_only(&source.db)?;
    let targets = db.targets()?;
    let target = match &source.target {
        Some(t) if targets.contains(t) => t.clone(),
        Some(t) => {
            return Err(CliError::Usage(format!(
                "{} has no records for target `{t}`; it has: {}",
                tensortune_records::redacted(&source.db),
                if targets.is_empty() {
                    "none".to_string()
                } else {
                    targets.join(", ")
                }
            )))
        }
        None => match targets.as_slice() {
            [t] => t.clone(),
            [] => {
                return Err(CliError::Usage(format!(
                    "{} has no records",
                    tensortune_records::redacted(&source.db)
                )))
            }
            _ => {
                return Err(CliError::Usage(format!(
                    "{} has records of several targets; choose one with --target: {}",
                    tensortune_records::redacted(&source.db),
                    targets.join(", ")
                )))
            }
        },
    };
    Ok((db, target))
}

fn fmt(x: Option<f64>) -> String {
    x.map_or_else(|| "-".to_string(), |v| format!("{v:.3}"))
}

fn row(
    out: &mut dyn Write,
    label: &str,
    counts: &str,
    apart: &str,
    name: &str,
    m: &RankingMetrics,
) -> std::io::Result<()> {
    writeln!(
        out,
        "{label:<48} {counts:>11} {apart:>6}  {name:<18} {:>8} {:>8} {:>8} {:>6}",
        fmt(m.pairwise_accuracy),
        fmt(m.pairwise_accuracy_apart),
        fmt(m.spearman),
        fmt(m.top_k_recall)
    )
}

/// The records a model cannot learn from here because their workload is a model's layer, as
/// a clause for the summary line (empty when there are none).
fn not_library_ops(loaded: &tensortune_cost_model::dataset::DatasetReport) -> String {
    match loaded.not_library_ops {
        0 => String::new(),
        n => format!(
            ", {n} records of a model's layers left out (their DAGs are in the model, not in \
             the workload key)"
        ),
    }
}

/// Runs `tensortune model eval`.
pub fn eval(args: &EvalArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let objectives = objectives(&args.objective)?;
    let (db, target) = open(&args.source)?;
    let (samples, loaded) = samples_from_records(&db, &target).map_err(model_error)?;
    let mut gbdt = GbdtOptions {
        seed: args.seed,
        ..GbdtOptions::default()
    };
    // Bounds far past any use, so a typo cannot train for hours.
    if let Some(r) = args.rounds {
        super::check_count("--rounds", r as usize, 1, 10_000)?;
        gbdt.rounds = r;
    }
    if let Some(b) = args.max_bin {
        super::check_count("--max-bin", b as usize, 2, 65_536)?;
        gbdt.max_bin = b;
    }
    if let Some(d) = args.max_depth {
        super::check_count("--max-depth", d as usize, 1, 32)?;
        gbdt.max_depth = d;
    }
    if let Some(w) = args.min_child_weight {
        super::check_real("--min-child-weight", w, 0.0, 1e6)?;
        gbdt.min_child_weight = w;
    }
    if let Some(e) = args.eta {
        super::check_real("--eta", e, 1e-6, 1.0)?;
        gbdt.eta = e;
    }
    if let Some(n) = args.pairs_per_program {
        super::check_count("--pairs-per-program", n as usize, 1, 4096)?;
        gbdt.pairs_per_sample = n;
    }
    let opts = EvalOptions {
        split: if args.held_out {
            Split::HeldOut
        } else {
            Split::Within
        },
        min_samples: args.min_records,
        seed: args.seed,
        gbdt,
        objectives,
        ..EvalOptions::default()
    };
    let started = std::time::Instant::now();
    let report = evaluate(&samples, &opts).map_err(model_error)?;
    let eval_s = started.elapsed().as_secs_f64();
    let io = |e: std::io::Error| CliError::Internal(e.to_string());
    if args.json {
        let json = serde_json::json!({
            "target": target,
            "records": loaded.records,
            "samples": loaded.samples,
            "failed": loaded.failed,
            "skipped_records": loaded.skipped.len(),
            "not_library_ops": loaded.not_library_ops,
            "eval_s": eval_s,
            "gbdt_options": opts.gbdt,
            "eval": report,
        });
        writeln!(out, "{json}").map_err(io)?;
        return Ok(());
    }
    writeln!(
        out,
        "target {}: {} records, {} samples ({} failed), {} records that no longer replay{}",
        tensortune_schedules::text::single_line(&target),
        loaded.records,
        loaded.samples,
        loaded.failed,
        loaded.no_longer_replay(),
        not_library_ops(&loaded)
    )
    .map_err(io)?;
    writeln!(
        out,
        "{:<48} {:>11} {:>6}  {:<18} {:>8} {:>8} {:>8} {:>6}",
        "workload", "train/test", ">5%", "model", "pairwise", "pw >5%", "spearman", "top-5"
    )
    .map_err(io)?;
    for w in &report.workloads {
        let counts = format!("{}/{}", w.train, w.test);
        let apart = w
            .pairs_apart_share
            .map_or_else(|| "-".to_string(), |x| format!("{:.0}%", 100.0 * x));
        let key = tensortune_schedules::text::single_line(&w.workload);
        for (i, (name, m)) in w.models.iter().enumerate() {
            let (label, c, a) = if i == 0 {
                (key.as_ref(), counts.as_str(), apart.as_str())
            } else {
                ("", "", "")
            };
            row(out, label, c, a, name, m).map_err(io)?;
        }
    }
    let shares: Vec<f64> = report
        .workloads
        .iter()
        .filter_map(|w| w.pairs_apart_share)
        .collect();
    let mean_apart = if shares.is_empty() {
        "-".to_string()
    } else {
        format!(
            "{:.0}%",
            100.0 * shares.iter().sum::<f64>() / shares.len() as f64
        )
    };
    for (i, (name, m)) in report.mean.iter().enumerate() {
        row(
            out,
            if i == 0 { "mean over workloads" } else { "" },
            "",
            if i == 0 { mean_apart.as_str() } else { "" },
            name,
            m,
        )
        .map_err(io)?;
    }
    writeln!(
        out,
        "training and evaluating took {eval_s:.2} s (every model, every workload)"
    )
    .map_err(io)?;
    for (w, n) in &report.skipped {
        writeln!(
            out,
            "skipped {w}: {n} records (fewer than {})",
            args.min_records
        )
        .map_err(io)?;
    }
    Ok(())
}

/// Runs `tensortune model train`.
pub fn train(args: &TrainArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let objective = match objectives(&args.objective)?.as_slice() {
        [o] => *o,
        _ => return Err(CliError::Usage("choose one objective to train with".into())),
    };
    super::output::refuse_clobbering(&[("--db", &args.source.db)], &[("--out", &args.out)])?;
    let (db, target) = open(&args.source)?;
    let options = GbdtOptions {
        objective,
        ..GbdtOptions::default()
    };
    let (model, loaded) = GbdtModel::from_records(&db, &target, options).map_err(model_error)?;
    model.save(&args.out).map_err(model_error)?;
    writeln!(
        out,
        "trained on {} samples of target {} ({} records that no longer replay{}){}; wrote {}",
        loaded.samples,
        tensortune_schedules::text::single_line(&target),
        loaded.no_longer_replay(),
        not_library_ops(&loaded),
        if model.is_trained() {
            ""
        } else {
            " - too few to learn from, saved untrained"
        },
        args.out.display()
    )
    .map_err(|e| CliError::Internal(e.to_string()))
}

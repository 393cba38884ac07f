//! `tensortune tune-model` and `tensortune run-model`: an ONNX model as the unit of work.
//!
//! `tune-model` imports the model, prints its tasks (op, shape, count, FLOPs) and tunes them
//! all under one budget with the task scheduler, resuming from the database like `tune`.
//! `run-model` compiles each task's best record (its default schedule where it has none, as
//! the summary says), runs the network on `.npy` inputs (random ones without `--inputs`),
//! writes the first output, and reports the end-to-end latency and the time of each step.

use super::{check_count, resolve_threads, CliError};
use crate::model::{self, LoadOptions, Model, Plan};
use crate::tune::Target;
use ndarray::ArrayD;
use std::io::Write;
use std::path::PathBuf;
use tensortune_model::ImportOptions;
use tensortune_tuner::TuneOptions;

/// Arguments of `tensortune tune-model`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tensortune tune-model model.onnx --db model.db --trials 2000 --input-shape x=1x3x224x224\n  tensortune tune-model model.onnx --db model.db --trials 0   (list the tasks only)\n  tensortune tune-model model.onnx --db model.db --trials 2000 --buckets 1,2,4,8   (dynamic batch)"
)]
pub struct TuneModelArgs {
    /// The ONNX model.
    pub model: PathBuf,
    /// The records database (created if missing; a run on an existing one resumes).
    #[arg(long, value_name = "PATH")]
    pub db: PathBuf,
    /// Trials for the whole model, shared among its tasks by the task scheduler (0: list the
    /// tasks and stop).
    #[arg(long, default_value_t = 64)]
    pub trials: usize,
    /// Fix an input's shape, e.g. `x=1x3x224x224` (needed for dynamic dimensions). Repeat for
    /// several inputs.
    #[arg(long = "input-shape", value_name = "NAME=D1xD2x...")]
    pub input_shapes: Vec<String>,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Threads for parallel loops (1: serial kernels; 0: every core).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Candidates measured per round.
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,
    /// For a model whose batch dimension is dynamic: the batch sizes to tune, e.g. `1,2,4,8`,
    /// each its own set of tasks, all under the one budget (`run-model --buckets` runs a
    /// batch on the smallest bucket that holds it).
    #[arg(long, value_name = "B1,B2,...")]
    pub buckets: Option<String>,
    /// When each measurement first evicts the kernel's buffers from the CPU caches:
    /// `past-llc` (when together they are larger than the last-level cache), `always`
    /// (inside a network the other layers push a layer's weights out of the caches between
    /// two of its runs: a layer whose weights are megabytes is then tuned for reading them
    /// from memory, but its activations, which the layer before leaves in the caches, are
    /// evicted too) or `never`.
    #[arg(long, default_value = "past-llc", value_parser = ["never", "past-llc", "always"])]
    pub flush_cache: String,
    /// No progress on stderr.
    #[arg(long)]
    pub quiet: bool,
}

/// Arguments of `tensortune run-model`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tensortune run-model model.onnx --db model.db --inputs x.npy --output y.npy\n  tensortune run-model model.onnx --input-shape x=1x3x48x192 --repeat 20\n  tensortune run-model model.onnx --db model.db --buckets 1,2,4,8 --inputs batch3.npy --output y.npy"
)]
pub struct RunModelArgs {
    /// The ONNX model.
    pub model: PathBuf,
    /// The records database to take each task's best program from (without it, or for a
    /// task it has no record of, the default schedule).
    #[arg(long, value_name = "PATH")]
    pub db: Option<PathBuf>,
    /// Input `.npy` files (float32), comma-separated, in the model's input order; random
    /// inputs where none are given.
    #[arg(long, value_name = "X.npy,...", value_delimiter = ',')]
    pub inputs: Vec<PathBuf>,
    /// Write the first output to this `.npy` file.
    #[arg(long, value_name = "OUT.npy")]
    pub output: Option<PathBuf>,
    /// Fix an input's shape, e.g. `x=1x3x224x224`. Repeat for several inputs.
    #[arg(long = "input-shape", value_name = "NAME=D1xD2x...")]
    pub input_shapes: Vec<String>,
    /// Threads for parallel loops (0: every core).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Inferences timed; the median is reported, with each step's median.
    #[arg(long, default_value_t = 10)]
    pub repeat: usize,
    /// For a model whose batch dimension is dynamic: the buckets it was tuned for, e.g.
    /// `1,2,4,8`. The batch of the inputs runs on the smallest bucket that holds it, padded
    /// with zero rows that are sliced off the outputs (in chunks past the largest).
    #[arg(long, value_name = "B1,B2,...")]
    pub buckets: Option<String>,
}

/// The `--input-shape` flags as import options; the shapes of `.npy` inputs fill in the rest.
pub(super) fn import_options(flags: &[String]) -> Result<ImportOptions, CliError> {
    let mut opts = ImportOptions::default();
    for f in flags {
        let (name, shape) = tensortune_model::parse_input_shape(f).map_err(CliError::Usage)?;
        opts.input_shapes.insert(name, shape);
    }
    Ok(opts)
}

pub(super) fn model_error(e: model::Error) -> CliError {
    if e.is_user_error() {
        CliError::Usage(e.to_string())
    } else {
        CliError::Internal(e.to_string())
    }
}

/// Prints the tasks of a plan: key, ops, count, FLOPs.
fn print_tasks(plan: &Plan, out: &mut dyn Write) -> std::io::Result<()> {
    let total: f64 = plan
        .tasks
        .iter()
        .map(|t| t.dag.flops() * t.count as f64)
        .sum();
    writeln!(
        out,
        "{} tasks, {} steps, {:.3} GFLOP per inference",
        plan.tasks.len(),
        plan.steps.len(),
        total / 1e9
    )?;
    writeln!(
        out,
        "{:>3}  {:<22} {:>5} {:>10}  workload",
        "#", "ops", "count", "MFLOP"
    )?;
    for (i, t) in plan.tasks.iter().enumerate() {
        writeln!(
            out,
            "{:>3}  {:<22} {:>5} {:>10.3}  {}",
            i,
            t.ops,
            t.count,
            t.dag.flops() / 1e6,
            t.key
        )?;
    }
    Ok(())
}

/// Runs `tensortune tune-model`.
pub fn tune_model(args: &TuneModelArgs, out: &mut dyn Write) -> Result<(), CliError> {
    check_count("--trials", args.trials, 0, 100_000_000)?;
    check_count("--batch-size", args.batch_size, 1, 1_000_000)?;
    let threads = resolve_threads("--threads", args.threads)?;
    let import = import_options(&args.input_shapes)?;
    let io = |e: std::io::Error| CliError::Internal(e.to_string());
    let plans: Vec<(Option<usize>, Plan)> = match &args.buckets {
        None => vec![(
            None,
            model::plan_file(&args.model, &import).map_err(model_error)?,
        )],
        Some(text) => {
            let buckets = model::buckets::parse_buckets(text).map_err(CliError::Usage)?;
            let bytes = read_model(&args.model)?;
            model::buckets::bucket_plans(&bytes, &import, &buckets)
                .map_err(model_error)?
                .into_iter()
                .map(|(b, p)| (Some(b), p))
                .collect()
        }
    };
    for (bucket, plan) in &plans {
        if let Some(b) = bucket {
            writeln!(out, "bucket {b}:").map_err(io)?;
        }
        print_tasks(plan, out).map_err(io)?;
    }
    if args.trials == 0 || plans.iter().all(|(_, p)| p.tasks.is_empty()) {
        return Ok(());
    }
    let opts = TuneOptions {
        trials: args.trials,
        batch_size: args.batch_size,
        seed: args.seed,
        threads,
        quiet: args.quiet,
        db: Some(args.db.clone()),
        ..TuneOptions::default()
    };
    let refs: Vec<&Plan> = plans.iter().map(|(_, p)| p).collect();
    let flush = crate::runtime::CacheFlush::parse(&args.flush_cache).unwrap_or_default();
    let target = Target::host(threads).with_cache_flush(flush);
    let reports = model::tune_plans(&refs, &target, &opts).map_err(|e| match e {
        crate::tune::TuneError::Records(r) if r.is_user_error() => CliError::Usage(r.to_string()),
        crate::tune::TuneError::Tuner(tensortune_tuner::tuning::TuneError::Records(r))
            if r.is_user_error() =>
        {
            CliError::Usage(r.to_string())
        }
        crate::tune::TuneError::Tuner(e @ tensortune_tuner::tuning::TuneError::Measurer(_)) => {
            CliError::Usage(e.to_string())
        }
        e => CliError::Internal(e.to_string()),
    })?;
    let mut total = 0.0;
    for (i, (key, r)) in reports.iter().enumerate() {
        // The ops of its first plan, its count summed over the plans (buckets) that run it.
        let of_key = || refs.iter().flat_map(|p| &p.tasks).filter(|t| t.key == *key);
        let count: usize = of_key().map(|t| t.count).sum();
        let ops = of_key().next().map_or("", |t| t.ops.as_str());
        let lat = r.best_latency_s;
        total += lat.unwrap_or(f64::NAN) * count as f64;
        let best = lat.map_or("no valid program".to_string(), |l| {
            super::records::format_seconds(l)
        });
        writeln!(
            out,
            "task {i} ({ops}, x{count}): best {best}, {} trials ({} failed)",
            r.trials, r.errors
        )
        .map_err(io)?;
    }
    writeln!(
        out,
        "weighted total of the tasks' best latencies: {:.3} ms",
        total * 1e3
    )
    .map_err(io)?;
    writeln!(out, "records: {}", args.db.display()).map_err(io)?;
    Ok(())
}

/// Runs `tensortune run-model`.
pub fn run_model(args: &RunModelArgs, out: &mut dyn Write) -> Result<(), CliError> {
    check_count("--repeat", args.repeat, 1, 100_000)?;
    if let Some(o) = &args.output {
        let inputs: Vec<(&str, &std::path::Path)> =
            std::iter::once(("MODEL", args.model.as_path()))
                .chain(args.db.iter().map(|p| ("--db", p.as_path())))
                .chain(args.inputs.iter().map(|p| ("--inputs", p.as_path())))
                .collect();
        super::output::refuse_clobbering(&inputs, &[("--output", o)])?;
    }
    let threads = resolve_threads("--threads", args.threads)?;
    let mut import = import_options(&args.input_shapes)?;
    let arrays: Vec<ArrayD<f32>> = args
        .inputs
        .iter()
        .map(|p| crate::npy::read::<f32>(p).map_err(|e| CliError::Usage(e.to_string())))
        .collect::<Result<_, _>>()?;
    if !arrays.is_empty() {
        let names = input_names(&args.model)?;
        if names.len() != arrays.len() {
            return Err(CliError::Usage(format!(
                "the model takes {} inputs ({}), got {} --inputs",
                names.len(),
                names.join(", "),
                arrays.len()
            )));
        }
        if args.buckets.is_none() {
            // The inputs' own shapes fix the model's dynamic dimensions.
            for (n, a) in names.iter().zip(&arrays) {
                import
                    .input_shapes
                    .entry(n.clone())
                    .or_insert_with(|| a.shape().to_vec());
            }
        }
    }
    let opts = LoadOptions {
        import,
        db: args.db.clone(),
        threads,
    };
    if let Some(text) = &args.buckets {
        let buckets = model::buckets::parse_buckets(text).map_err(CliError::Usage)?;
        return run_buckets(args, &opts, &buckets, arrays, out);
    }
    let model = Model::load(&args.model, &opts).map_err(model_error)?;
    let inputs: Vec<ArrayD<f32>> = if arrays.is_empty() {
        random_inputs(&model)
    } else {
        arrays
    };
    time_and_report(&model, &inputs, args, |outs| outs, out)
}

fn random_inputs(model: &Model) -> Vec<ArrayD<f32>> {
    model
        .inputs()
        .iter()
        .enumerate()
        .map(|(k, (_, s))| random(s, k as u64))
        .collect()
}

/// `run-model --buckets`: the batch on the smallest bucket that holds it (timed step by step
/// like any model), or in chunks of the largest bucket.
fn run_buckets(
    args: &RunModelArgs,
    opts: &LoadOptions,
    buckets: &[usize],
    arrays: Vec<ArrayD<f32>>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let io = |e: std::io::Error| CliError::Internal(e.to_string());
    let bm = model::BucketedModel::load(&args.model, opts, buckets).map_err(model_error)?;
    let inputs = if arrays.is_empty() {
        // Random inputs of the smallest bucket's shapes.
        let smallest = bm.buckets().first().copied().unwrap_or(1);
        let m = bm
            .model(smallest)
            .ok_or_else(|| CliError::Internal("no bucket".into()))?;
        random_inputs(m)
    } else {
        arrays
    };
    let views: Vec<_> = inputs.iter().map(|a| a.view()).collect();
    let n = bm.batch_of(&views).map_err(model_error)?;
    let bucket = bm.bucket_for(n);
    if n <= bucket {
        writeln!(
            out,
            "batch {n} on bucket {bucket} of {buckets:?} ({} padded row(s))",
            bucket - n
        )
        .map_err(io)?;
        let model = bm
            .model(bucket)
            .ok_or_else(|| CliError::Internal("no bucket".into()))?;
        let padded = bm.pad_inputs(&views, bucket);
        let batched = bm.batched_outputs().to_vec();
        return time_and_report(
            model,
            &padded,
            args,
            |outs| model::buckets::slice_outputs(outs, &batched, n),
            out,
        );
    }
    writeln!(
        out,
        "batch {n} in chunks of bucket {bucket} of {buckets:?} (the last one padded)"
    )
    .map_err(io)?;
    let mut times = Vec::with_capacity(args.repeat);
    let mut first = None;
    for _ in 0..args.repeat + 1 {
        let start = std::time::Instant::now();
        let outs = bm.run(&views).map_err(model_error)?;
        times.push(start.elapsed().as_secs_f64());
        first.get_or_insert(outs);
    }
    times.remove(0);
    write_first_output(args, first.as_deref())?;
    writeln!(
        out,
        "end-to-end latency: {:.3} ms (median of {} runs)",
        median(times) * 1e3,
        args.repeat
    )
    .map_err(io)
}

fn write_first_output(args: &RunModelArgs, outs: Option<&[ArrayD<f32>]>) -> Result<(), CliError> {
    if let (Some(path), Some(outs)) = (&args.output, outs) {
        let a = outs
            .first()
            .ok_or_else(|| CliError::Internal("the model has no output".into()))?;
        super::run::write_npy_atomic(path, a)?;
    }
    Ok(())
}

/// Runs `model` on `inputs` `--repeat` times after a warm-up, writes the first output (after
/// `keep`, which slices a padded batch back), and prints the summary.
fn time_and_report(
    model: &Model,
    inputs: &[ArrayD<f32>],
    args: &RunModelArgs,
    keep: impl Fn(Vec<ArrayD<f32>>) -> Vec<ArrayD<f32>>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let views: Vec<_> = inputs.iter().map(|a| a.view()).collect();
    let mut runs = Vec::with_capacity(args.repeat);
    let mut first = None;
    for _ in 0..args.repeat + 1 {
        let start = std::time::Instant::now();
        let (outs, steps) = model.run_timed(&views).map_err(model_error)?;
        runs.push((start.elapsed().as_secs_f64(), steps));
        first.get_or_insert(outs);
    }
    // The first run is the warm-up (first touch of every buffer).
    runs.remove(0);
    write_first_output(args, first.map(keep).as_deref())?;
    report(model, &runs, out).map_err(|e| CliError::Internal(e.to_string()))
}

pub(super) fn read_model(path: &std::path::Path) -> Result<Vec<u8>, CliError> {
    std::fs::read(path)
        .map_err(|e| CliError::Usage(format!("cannot read `{}`: {e}", path.display())))
}

/// The names of the model's inputs, read without compiling anything.
fn input_names(path: &std::path::Path) -> Result<Vec<String>, CliError> {
    let bytes = read_model(path)?;
    tensortune_model::import::input_names(&bytes).map_err(|e| CliError::Usage(e.to_string()))
}

fn random(shape: &[usize], seed: u64) -> ArrayD<f32> {
    let mut r = tensortune_schedules::data::SplitMix64(seed.wrapping_add(1));
    ArrayD::from_shape_fn(ndarray::IxDyn(shape), |_| (r.unit() * 2.0 - 1.0) as f32)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The summary: where each task's program came from, each step's median time, the total.
fn report(
    model: &Model,
    runs: &[(f64, Vec<model::StepTime>)],
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let defaults: Vec<&model::TaskInfo> = model
        .tasks()
        .iter()
        .filter(|t| matches!(t.source, crate::build::Source::Default))
        .collect();
    writeln!(
        out,
        "{} tasks: {} from records, {} on their default schedule",
        model.tasks().len(),
        model.tasks().len() - defaults.len(),
        defaults.len()
    )?;
    for t in &defaults {
        writeln!(out, "  default schedule (no record): {} ({})", t.ops, t.key)?;
    }
    let Some((_, first)) = runs.first() else {
        return Ok(());
    };
    writeln!(
        out,
        "{:>4}  {:<40} {:<22} {:>10}",
        "step", "layer", "ops", "ms"
    )?;
    for (i, s) in first.iter().enumerate() {
        let t = median(
            runs.iter()
                .filter_map(|(_, st)| st.get(i).map(|x| x.seconds))
                .collect(),
        );
        let name: String = s.name.chars().take(40).collect();
        writeln!(
            out,
            "{:>4}  {:<40} {:<22} {:>10.4}",
            i,
            name,
            s.ops,
            t * 1e3
        )?;
    }
    let total = median(runs.iter().map(|(t, _)| *t).collect());
    writeln!(
        out,
        "end-to-end latency: {:.3} ms (median of {} runs)",
        total * 1e3,
        runs.len()
    )
}

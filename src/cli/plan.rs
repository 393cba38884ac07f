//! `tensortune plan`, `tensortune tune --plan FILE --shard I/N`, and the progress of plans
//! that `tensortune records` shows.
//!
//! The shard index may come from the engine that started the process: `--shard auto/N`
//! reads SLURM's `SLURM_ARRAY_TASK_ID` (less `SLURM_ARRAY_TASK_MIN`, so `--array=1-4` works
//! as well as `--array=0-3`) or Kubernetes' `JOB_COMPLETION_INDEX`. These are read here, in
//! the command line, and nowhere else.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use tensortune_records::{Database, RunPlan};

use super::run::parse_workload;
use super::tune::{parse_weighted, TuneArgs};
use super::{check_count, CliError};
use crate::plan::{Plan, PlanModel, PlanTask, Shard};

/// Arguments of `tensortune plan`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  \
    tensortune plan --workload matmul:M=512,N=512,K=512@2 --workload softmax:M=512,N=512 \
    --trials 64 --out plan.json\n  \
    tensortune plan --model cls.onnx --input-shape x=1x3x48x192 --trials 64 --out plan.json\n  \
    tensortune tune --plan plan.json --shard 0/2 --db postgres://tune@db-host/records")]
pub struct PlanArgs {
    /// A workload to tune, optionally with a weight: `SPEC[@WEIGHT]`, as `tune` takes it.
    #[arg(
        long = "workload",
        value_name = "SPEC[@WEIGHT]",
        required_unless_present = "models"
    )]
    pub workloads: Vec<String>,
    /// An ONNX model whose layers are tasks of the plan, cut as `tune-model` cuts them (each
    /// distinct layer once, weighted by its count). Repeat for several. The workers find it
    /// beside the plan file (or at the path given) and check that it is the same file.
    #[arg(long = "model", value_name = "MODEL.onnx")]
    pub models: Vec<PathBuf>,
    /// With `--model`: fix an input's shape, e.g. `x=1x3x224x224`.
    #[arg(
        long = "input-shape",
        value_name = "NAME=D1xD2x...",
        requires = "models"
    )]
    pub input_shapes: Vec<String>,
    /// With `--model`: the batch buckets of a model with a dynamic batch, e.g. `1,2,4,8`.
    #[arg(long, value_name = "B1,B2,...", requires = "models")]
    pub buckets: Option<String>,
    /// Candidates to measure for each task.
    #[arg(long, default_value_t = 64)]
    pub trials: usize,
    /// The target every task is tuned for.
    #[arg(long, default_value = "llvm")]
    pub target: String,
    /// The seed of every task's run.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The plan file to write (replaced whole); default: stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// Runs `tensortune plan`.
pub fn plan(args: &PlanArgs, out: &mut dyn Write) -> Result<(), CliError> {
    check_count("--trials", args.trials, 1, 100_000_000)?;
    if let Some(o) = &args.out {
        let inputs: Vec<(&str, &std::path::Path)> = args
            .models
            .iter()
            .map(|m| ("--model", m.as_path()))
            .collect();
        super::output::refuse_clobbering(&inputs, &[("--out", o)])?;
    }
    let mut tasks = Vec::new();
    for w in &args.workloads {
        let (spec, weight) = parse_weighted(w)?;
        let (ws, dag) = parse_workload(&spec)?;
        tasks.push(PlanTask {
            workload: ws.canonical(),
            weight,
            trials: args.trials,
            flops: dag.flops(),
        });
    }
    let models = add_model_tasks(args, &mut tasks)?;
    let plan = Plan::with_models(&args.target, args.seed, models, tasks)
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let text = plan.to_json();
    let io = |e: std::io::Error| CliError::Internal(e.to_string());
    match &args.out {
        None => out.write_all(text.as_bytes()).map_err(io),
        Some(path) => {
            tensortune_records::write_bytes_atomic(path, text.as_bytes())
                .map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))?;
            writeln!(
                out,
                "plan {}: {} task(s), {} trials each, target `{}` -> {}",
                plan.id,
                plan.tasks.len(),
                args.trials,
                plan.target,
                path.display()
            )
            .map_err(io)
        }
    }
}

/// The layers of `--model`s as tasks, added to `tasks` (a layer already there, from another
/// model or bucket or a `--workload`, adds its count to that task's weight); returns the
/// models as the plan names them.
fn add_model_tasks(args: &PlanArgs, tasks: &mut Vec<PlanTask>) -> Result<Vec<PlanModel>, CliError> {
    let mut models = Vec::new();
    if args.models.is_empty() {
        return Ok(models);
    }
    let import = super::network::import_options(&args.input_shapes)?;
    let buckets = args
        .buckets
        .as_deref()
        .map(crate::model::buckets::parse_buckets)
        .transpose()
        .map_err(CliError::Usage)?;
    for path in &args.models {
        let bytes = super::network::read_model(path)?;
        let plans = crate::model::model_plans(&bytes, &import, buckets.as_deref())
            .map_err(super::network::model_error)?;
        for t in plans.iter().flat_map(|p| &p.tasks) {
            match tasks.iter_mut().find(|p| p.workload == t.key) {
                Some(p) => p.weight += t.count as f64,
                None => tasks.push(PlanTask {
                    workload: t.key.clone(),
                    weight: t.count as f64,
                    trials: args.trials,
                    flops: t.dag.flops(),
                }),
            }
        }
        models.push(PlanModel {
            path: path.display().to_string(),
            sha256: tensortune_records::sha256_hex_bytes(&bytes),
            input_shapes: import.input_shapes.clone(),
            buckets: buckets.clone().unwrap_or_default(),
        });
    }
    Ok(models)
}

/// The DAG of every layer of the plan's models, by task key: each model read (beside the
/// plan file, or at its path) and checked against the hash the plan holds.
fn model_dags(
    plan: &Plan,
    file: &Path,
) -> Result<HashMap<String, tensortune_schedules::ComputeDag>, CliError> {
    let mut dags = HashMap::new();
    for m in &plan.models {
        let given = Path::new(&m.path);
        let beside = file.parent().map(|d| d.join(given));
        let path = match beside {
            Some(p) if given.is_relative() && p.exists() => p,
            _ => given.to_path_buf(),
        };
        let bytes = super::network::read_model(&path)?;
        if tensortune_records::sha256_hex_bytes(&bytes) != m.sha256 {
            return Err(CliError::Usage(format!(
                "{}: not the model plan {} was made from (its SHA-256 differs)",
                path.display(),
                plan.id
            )));
        }
        let import = tensortune_model::ImportOptions {
            input_shapes: m.input_shapes.clone(),
            ..Default::default()
        };
        let buckets = (!m.buckets.is_empty()).then_some(m.buckets.as_slice());
        let plans = crate::model::model_plans(&bytes, &import, buckets)
            .map_err(super::network::model_error)?;
        for t in plans.into_iter().flat_map(|p| p.tasks) {
            dags.entry(t.key).or_insert(t.dag);
        }
    }
    Ok(dags)
}

/// Reads and checks a plan file; returns the plan and its text as read.
pub(super) fn read_plan(path: &Path) -> Result<(Plan, String), CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))?;
    let plan =
        Plan::parse(&text).map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))?;
    Ok((plan, text))
}

/// The shard of `--shard`: `I/N`, or `auto/N` with the index from the engine.
pub(super) fn resolve_shard(flag: Option<&str>) -> Result<Shard, CliError> {
    let usage = |e: crate::plan::PlanError| CliError::Usage(format!("--shard: {e}"));
    match flag {
        None => Ok(Shard::ALL),
        Some(text) => match text.strip_prefix("auto/") {
            None => text.parse().map_err(usage),
            Some(count) => {
                let index = engine_index()?;
                format!("{index}/{count}").parse().map_err(usage)
            }
        },
    }
}

/// The index a job array or an indexed job gave this process.
fn engine_index() -> Result<u32, CliError> {
    let read = |name: &str| -> Result<Option<u32>, CliError> {
        match std::env::var(name) {
            Err(_) => Ok(None),
            Ok(v) => v
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| CliError::Usage(format!("{name} is `{v}`, not a task index"))),
        }
    };
    if let Some(id) = read("SLURM_ARRAY_TASK_ID")? {
        let min = read("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
        return id.checked_sub(min).ok_or_else(|| {
            CliError::Usage(format!(
                "SLURM_ARRAY_TASK_ID {id} is below SLURM_ARRAY_TASK_MIN {min}"
            ))
        });
    }
    read("JOB_COMPLETION_INDEX")?.ok_or_else(|| {
        CliError::Usage(
            "--shard auto/N takes the index from SLURM_ARRAY_TASK_ID (a SLURM job array) or \
             JOB_COMPLETION_INDEX (a Kubernetes Indexed Job); neither is set"
                .to_string(),
        )
    })
}

/// Records measured so far for each workload of a plan, by any shard; none where the
/// database does not exist yet.
fn plan_records(db: &Database, plan: &Plan) -> Result<HashMap<String, u64>, CliError> {
    let mut done = HashMap::new();
    for p in db.plan_progress(&plan.id)? {
        *done.entry(p.workload).or_insert(0) += p.records;
    }
    Ok(done)
}

/// `tensortune tune --plan FILE [--shard I/N]`: tunes the tasks of one shard, one run each,
/// with the plan's target, seed and trials; a task whose trials the database already holds
/// (from an earlier attempt of the shard) is skipped, a task begun is finished.
pub(super) fn tune_plan(args: &TuneArgs, file: &Path, out: &mut dyn Write) -> Result<(), CliError> {
    let shard = resolve_shard(args.shard.as_deref())?;
    let (plan, text) = read_plan(file)?;
    let dags = model_dags(&plan, file)?;
    let done = {
        let mut db = Database::open(&args.db)?;
        db.put_plan(&plan.id, &text)?;
        plan_records(&db, &plan)?
    };
    let run_plan = RunPlan {
        id: plan.id.clone(),
        shard: shard.index,
        shards: shard.count,
    };
    let (mut tuned, mut skipped) = (0, 0);
    for t in plan.shard(shard) {
        let task = &plan.tasks[t];
        let measured = done.get(&task.workload).copied().unwrap_or(0);
        let left = (task.trials as u64).saturating_sub(measured);
        if left == 0 {
            skipped += 1;
            continue;
        }
        let task_args = TuneArgs {
            workloads: vec![format!("{}@{}", task.workload, task.weight)],
            target: plan.target.clone(),
            trials: left as usize,
            seed: plan.seed,
            plan: None,
            shard: None,
            ..args.clone()
        };
        match dags.get(&task.workload) {
            Some(dag) => super::tune::tune_tasks(
                &task_args,
                vec![(task.workload.clone(), dag.clone(), task.weight)],
                Some(run_plan.clone()),
                out,
            )?,
            None => super::tune::tune_with(&task_args, Some(run_plan.clone()), out)?,
        }
        tuned += 1;
    }
    writeln!(
        out,
        "plan {}: shard {shard}: {tuned} task(s) tuned, {skipped} already done",
        plan.id
    )
    .map_err(|e| CliError::Internal(e.to_string()))
}

/// The lines of `tensortune records` about plans: per plan, its tasks done, under way and
/// left, then each task not done with its records so far.
pub(super) fn progress_lines(db: &Database) -> Result<String, CliError> {
    let mut text = String::new();
    for stored in db.plans()? {
        let Ok(plan) = Plan::parse(&stored.body) else {
            text.push_str(&format!(
                "plan {}: unreadable plan body\n",
                tensortune_schedules::text::single_line(&stored.id)
            ));
            continue;
        };
        let records = plan_records(db, &plan)?;
        let count = |t: &PlanTask| records.get(&t.workload).copied().unwrap_or(0);
        let done = plan
            .tasks
            .iter()
            .filter(|t| count(t) >= t.trials as u64)
            .count();
        let begun = plan
            .tasks
            .iter()
            .filter(|t| (1..t.trials as u64).contains(&count(t)))
            .count();
        text.push_str(&format!(
            "plan {}: {} task(s): {done} done, {begun} under way, {} left\n",
            plan.id,
            plan.tasks.len(),
            plan.tasks.len() - done - begun
        ));
        for t in plan.tasks.iter().filter(|t| count(t) < t.trials as u64) {
            text.push_str(&format!(
                "  {}: {}/{} trials\n",
                t.workload,
                count(t),
                t.trials
            ));
        }
    }
    Ok(text)
}

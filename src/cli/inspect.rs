//! `tensortune workloads` (the op library) and `tensortune show` (a best schedule as a trace
//! and as its lowered loop nest).

use super::run::parse_workload;
use super::CliError;
use crate::tune::Target;
use std::io::Write;
use std::path::PathBuf;
use tensortune_records::Database;
use tensortune_schedules::ir::LoweredFunc;
use tensortune_schedules::lower::lower;
use tensortune_schedules::ops::OPS;
use tensortune_schedules::trace::Trace;
use tensortune_schedules::ComputeDag;

/// Arguments of `tensortune workloads`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  tensortune workloads")]
pub struct WorkloadsArgs {}

/// Arguments of `tensortune show`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Example:\n  tensortune show --db tuning.db --workload matmul:M=512,N=512,K=512"
)]
pub struct ShowArgs {
    /// The records database.
    #[arg(long, value_name = "DB")]
    pub db: PathBuf,
    /// The workload spec.
    #[arg(long, value_name = "SPEC")]
    pub workload: String,
    /// The target key (default: this CPU, one thread).
    #[arg(long, value_name = "T")]
    pub target: Option<String>,
}

/// Lists the op library: name, keys with defaults, input order.
pub fn workloads(_args: &WorkloadsArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let mut text = String::new();
    for op in OPS {
        let mut keys: Vec<String> = op.required.iter().map(|k| k.to_string()).collect();
        keys.extend(op.optional.iter().map(|(k, d)| format!("{k}={d}")));
        keys.push("dtype=f32".into());
        text.push_str(&format!(
            "{:<17} {:<40} {}\n",
            op.name,
            keys.join(","),
            op.signature
        ));
        text.push_str(&format!("{:<17} {}\n", "", op.about));
    }
    text.push_str(
        "\nspec: NAME:KEY=VALUE,...  e.g. conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1\n",
    );
    out.write_all(text.as_bytes())
        .map_err(|e| CliError::Internal(e.to_string()))
}

/// Prints the best record of a workload as its trace and its lowered loop nest.
pub fn show(args: &ShowArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let (w, dag) = parse_workload(&args.workload)?;
    let db = Database::open_read_only(&args.db)?;
    let target = args.target.clone().unwrap_or_else(|| Target::host(1).key());
    let key = w.canonical();
    let Some(r) = db.best(&key, &target)? else {
        let have = db.targets_of(&key)?;
        return Err(CliError::Usage(format!(
            "{}: no successful record of {key} for target `{target}`{}",
            args.db.display(),
            if have.is_empty() {
                String::new()
            } else {
                format!("; it has records for: {}", have.join(" | "))
            }
        )));
    };
    let (trace, func) = replay_and_lower(&dag, &r.trace_json)?;
    let t = r.outcome.timing().map(|t| t.median_s).unwrap_or(f64::NAN);
    let text = format!(
        "{key} on {target}\n{:.3} ms, {:.1} GFLOP/s\n\ntrace:\n{}\nloop nest:\n{}",
        t * 1e3,
        r.gflops().unwrap_or(0.0),
        trace,
        func
    );
    out.write_all(text.as_bytes())
        .map_err(|e| CliError::Internal(e.to_string()))
}

/// A stored trace replayed on a workload's DAG, and the loop nest it lowers to: what `show`
/// prints and `report` shows for each best record.
pub(crate) fn replay_and_lower(
    dag: &ComputeDag,
    trace_json: &str,
) -> Result<(Trace, LoweredFunc), CliError> {
    let trace =
        Trace::from_json(trace_json).map_err(|e| CliError::Usage(format!("stored trace: {e}")))?;
    let state = trace
        .replay(dag)
        .map_err(|e| CliError::Usage(format!("stored trace does not replay: {e}")))?;
    let func = lower(&state).map_err(|e| CliError::Internal(e.to_string()))?;
    Ok((trace, func))
}

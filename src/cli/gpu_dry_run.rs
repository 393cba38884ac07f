//! `tensortune tune --target cuda --dry-run`: everything of GPU tuning that needs no GPU.
//! Candidates are drawn from the GPU sketches as the search's first generation is, checked by
//! the GPU verifier, compiled to PTX, assembled by `ptxas` where one is found, and, for
//! workloads small enough, run in the lockstep GPU interpreter against the reference. Nothing
//! is written to a database: none of it is a measurement.

use super::tune::TuneArgs;
use super::CliError;
use crate::backend::cuda::{CudaBackend, GpuDevice, GpuTimingOptions, LockstepDevice};
use crate::backend::{Backend, Purpose};
use crate::codegen::nvptx::PtxasResources;
use crate::measure::reference::{random_inputs, OutputView, Reference};
use crate::measure::MeasureOptions;
use rand::SeedableRng;
use rayon::prelude::*;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use tensortune_schedules::gpu::interp::MAX_WORK;
use tensortune_schedules::lower::lower;
use tensortune_schedules::target::{CudaKey, TargetKey};
use tensortune_schedules::ComputeDag;
use tensortune_tuner::sketch::rules::generate_for;
use tensortune_tuner::sketch::sample::sample;
use tensortune_tuner::TuneOptions;

/// What became of the candidates of one workload.
#[derive(Debug, Default, serde::Serialize)]
struct DryRunReport {
    workload: String,
    target: String,
    sketches: usize,
    drawn: usize,
    /// Did not instantiate or lower.
    invalid: usize,
    /// Refused by the GPU verifier.
    refused: usize,
    /// PTX made.
    ptx: usize,
    /// Of those, assembled by ptxas (`None`: no ptxas).
    assembled: Option<usize>,
    /// ptxas errors (the first few).
    ptxas_errors: Vec<String>,
    /// Of those assembled, how many keep something in local memory: a stack frame or
    /// register spills (`ptxas -v`), which a thread's accumulators must not need.
    local_memory: Option<usize>,
    /// Registers per thread of the assembled kernels: the least, the median, the most.
    registers: Option<[u32; 3]>,
    /// Ran in the lockstep interpreter and matched the reference.
    simulated_right: usize,
    /// Ran in the interpreter and did not (wrong, a race, a divergent barrier).
    simulated_wrong: usize,
    /// The first reasons candidates were refused or invalid, one line each.
    reasons: Vec<String>,
    /// The first reasons simulated candidates were wrong (a bug of the GPU path, never of
    /// the candidate: a verified program must compute the reference).
    wrong: Vec<String>,
    /// Why nothing was simulated, if so.
    not_simulated: Option<String>,
}

impl DryRunReport {
    fn note(&mut self, why: String) {
        if self.reasons.len() < 3 {
            self.reasons
                .push(tensortune_schedules::text::single_line(&why).to_string());
        }
    }
}

/// Assembles `ptx` for `arch` with `-v`; the kernel's resources, or the first line of
/// ptxas's complaint when it refuses.
fn assemble(ptxas: &Path, ptx: &str, arch: &str) -> Result<PtxasResources, String> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // A folder of this process's own (pid and a counter), removed afterwards.
    let dir = std::env::temp_dir().join(format!(
        "tensortune-ptxas-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("temp dir: {e}"))?;
    let src = dir.join("k.ptx");
    let result = std::fs::write(&src, ptx)
        .map_err(|e| format!("writing PTX: {e}"))
        .and_then(|()| {
            Command::new(ptxas)
                .arg(format!("-arch={arch}"))
                .arg("-v")
                .arg("-o")
                .arg(dir.join("k.cubin"))
                .arg(&src)
                .output()
                .map_err(|e| format!("{}: {e}", ptxas.display()))
        });
    let _ = std::fs::remove_dir_all(&dir);
    let out = result?;
    let log = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        return Ok(PtxasResources::parse(&log));
    }
    Err(log.lines().next().unwrap_or("ptxas failed").to_string())
}

/// Runs the dry run of every task and prints one line (or JSON object) per workload.
pub(crate) fn dry_run(
    args: &TuneArgs,
    key: &CudaKey,
    tasks: &[(String, ComputeDag, f64)],
    opts: &TuneOptions,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let backend = CudaBackend::offline(key).map_err(|e| CliError::Usage(e.to_string()))?;
    let ptxas = crate::codegen::nvptx::find_ptxas();
    let io = |e: std::io::Error| CliError::Internal(e.to_string());
    for (workload, dag, _) in tasks {
        let r = dry_run_one(&backend, workload, dag, opts, args.trials, ptxas.as_deref());
        if args.json {
            let j = serde_json::to_string(&r).map_err(|e| CliError::Internal(e.to_string()))?;
            writeln!(out, "{j}").map_err(io)?;
            continue;
        }
        let assembled = match (r.assembled, r.local_memory, r.registers) {
            (Some(n), Some(l), Some([lo, mid, hi])) => format!(
                ", {n} assembled by ptxas ({lo}/{mid}/{hi} registers least/median/most, \
                 {l} with local memory)"
            ),
            (Some(n), _, _) => format!(", {n} assembled by ptxas"),
            (None, _, _) => ", no ptxas to assemble with".to_string(),
        };
        let simulated = match &r.not_simulated {
            Some(why) => format!("not simulated ({why})"),
            None => format!(
                "{} right and {} wrong in the lockstep interpreter",
                r.simulated_right, r.simulated_wrong
            ),
        };
        writeln!(
            out,
            "{workload}: dry run for `{}`: {} candidates of {} sketches; {} refused by the GPU verifier, {} invalid; {} PTX{assembled}; {simulated}",
            r.target, r.drawn, r.sketches, r.refused, r.invalid, r.ptx
        )
        .map_err(io)?;
        for why in &r.reasons {
            writeln!(out, "  e.g. {why}").map_err(io)?;
        }
        for why in &r.wrong {
            writeln!(out, "  wrong: {why}").map_err(io)?;
        }
        for e in &r.ptxas_errors {
            writeln!(out, "  ptxas: {e}").map_err(io)?;
        }
    }
    Ok(())
}

fn dry_run_one(
    backend: &CudaBackend,
    workload: &str,
    dag: &ComputeDag,
    opts: &TuneOptions,
    draws: usize,
    ptxas: Option<&Path>,
) -> DryRunReport {
    let mut r = DryRunReport {
        workload: workload.to_string(),
        target: TargetKey::Cuda(CudaKey {
            arch: Some(backend.arch().to_string()),
        })
        .to_string(),
        ..DryRunReport::default()
    };
    let sketches = generate_for(dag, opts, &backend.target(), &backend.rules());
    r.sketches = sketches.len();
    if sketches.is_empty() {
        r.note("no GPU sketch covers this workload".into());
        return r;
    }
    let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(opts.seed);
    let states: Vec<_> = (0..draws)
        .map(|n| {
            let sk = &sketches[n % sketches.len()];
            let dec = sample(sk, &mut rng, opts);
            sk.instantiate(dag, &dec).map_err(|e| e.to_string())
        })
        .collect();
    r.drawn = states.len();
    let compiled: Vec<_> = states
        .par_iter()
        .map(|s| {
            let s = s.as_ref().map_err(|e| (false, e.clone()))?;
            let f = lower(s).map_err(|e| (false, e.to_string()))?;
            backend.compile(&f).map_err(|e| (true, e.to_string()))
        })
        .collect();
    let mut ok = Vec::new();
    for c in compiled {
        match c {
            Ok(a) => ok.push(a),
            Err((refused, why)) => {
                if refused {
                    r.refused += 1;
                } else {
                    r.invalid += 1;
                }
                r.note(why);
            }
        }
    }
    r.ptx = ok.len();
    if let Some(ptxas) = ptxas {
        let results: Vec<_> = ok
            .par_iter()
            .map(|a| assemble(ptxas, &a.ptx, backend.arch()))
            .collect();
        let assembled: Vec<PtxasResources> =
            results.iter().filter_map(|x| x.clone().ok()).collect();
        r.assembled = Some(assembled.len());
        r.local_memory = Some(assembled.iter().filter(|a| a.uses_local_memory()).count());
        let mut regs: Vec<u32> = assembled.iter().map(|a| a.registers).collect();
        regs.sort_unstable();
        if let (Some(&lo), Some(&mid), Some(&hi)) =
            (regs.first(), regs.get(regs.len() / 2), regs.last())
        {
            r.registers = Some([lo, mid, hi]);
        }
        r.ptxas_errors = results
            .into_iter()
            .filter_map(Result::err)
            .take(3)
            .collect();
    }
    // The interpreter runs a thread-statement at a time: only small workloads, else a
    // candidate takes minutes. A flop is about one unit of its work.
    if dag.flops() > MAX_WORK as f64 / 4.0 {
        r.not_simulated = Some(format!(
            "{:.1e} FLOPs, too many for the interpreter: dry-run a smaller shape to simulate",
            dag.flops()
        ));
        return r;
    }
    let seed = opts.seed;
    let check = MeasureOptions {
        seed,
        ..MeasureOptions::default()
    }
    .check_options();
    let reference = random_inputs(dag, seed).and_then(|i| {
        let reference = Reference::new(dag, &i, &check)?;
        Ok((i, reference))
    });
    let (inputs, reference) = match reference {
        Ok(x) => x,
        Err(e) => {
            r.not_simulated = Some(e.to_string());
            return r;
        }
    };
    let timing = GpuTimingOptions::for_purpose(Purpose::Tuning, backend.desc());
    let results: Vec<_> = ok
        .par_iter()
        .map(|a| {
            let mut device = LockstepDevice::new(backend.desc().clone());
            let run = device.run(a, &inputs, &timing)?;
            let views: Vec<OutputView<'_>> = run.outputs.iter().map(OutputView::of_nd).collect();
            reference.check(&views)
        })
        .collect();
    for res in results {
        match res {
            Ok(()) => r.simulated_right += 1,
            Err(e) => {
                r.simulated_wrong += 1;
                if r.wrong.len() < 3 {
                    r.wrong
                        .push(tensortune_schedules::text::single_line(&e.to_string()).to_string());
                }
            }
        }
    }
    r
}

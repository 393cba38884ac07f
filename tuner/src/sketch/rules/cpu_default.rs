//! A CPU schedule without tuning: what a workload runs on when no record of it exists (`run`
//! and `codegen` without `--db`, `Kernel::from_records` and a model's untuned layers).
//!
//! The op's loops as written ([`State::new`]) run a matmul with its reduction innermost,
//! reading `B` across rows: a small fraction of what a tiled program does
//! (docs/measurements.md, "A default schedule worth running"). Where they
//! do not compile well, seeded draws of the CPU sketches (the search's own space, so every
//! draw is a program the search could have measured) and the loops as written are ranked by
//! the analytic estimate of their cycles (the cost model's), and the best taken. Nothing is
//! measured, so the choice is the same on every run for one target description; making it
//! costs the lowering and the estimate of the draws (milliseconds).

#[cfg(feature = "model")]
use super::{cpu_rules, generate_for};
#[cfg(feature = "model")]
use crate::TuneOptions;
use tensortune_schedules::expr::Intrinsic;
use tensortune_schedules::ir::{LoweredFunc, Stmt};
use tensortune_schedules::schedule::State;
use tensortune_schedules::target::TargetDesc;
use tensortune_schedules::{ComputeDag, Expr};

/// Seeded random instances of the CPU sketches [`cpu_default_schedule`] ranks.
pub const CPU_DEFAULT_DRAWS: usize = 64;

/// A schedule of `dag` for the CPU `target` without tuning: the op's loops as written
/// ([`State::new`]) where they compile to fast code as they are (a row sum, a dot product,
/// a depthwise window: see `compiles_well`); otherwise, of them and [`CPU_DEFAULT_DRAWS`]
/// seeded random instances of the CPU sketches (the same on every run, the sketches taken
/// in turn), the one whose lowered program the analytic estimate gives the fewest cycles
/// (`tensortune_cost_model::features::estimated_cycles`: a program that recomputes pays
/// for it), ties going to the earlier. For a GPU target, and in a build without the
/// `model` feature (no estimate: a build script's reuse stack), the loops as written.
pub fn cpu_default_schedule(dag: &ComputeDag, target: &TargetDesc) -> State {
    let naive = State::new(dag);
    if !matches!(target, TargetDesc::Cpu(_))
        || tensortune_schedules::lower::lower(&naive).is_ok_and(|f| compiles_well(&f))
    {
        return naive;
    }
    estimated_best(dag, target, naive)
}

/// Of `naive` and the seeded draws, the one the analytic estimate gives the fewest cycles.
#[cfg(feature = "model")]
fn estimated_best(dag: &ComputeDag, target: &TargetDesc, naive: State) -> State {
    use rand::SeedableRng;
    use tensortune_cost_model::features::estimated_cycles;
    use tensortune_cost_model::CoreModel;
    let core = CoreModel::for_target(target);
    let cycles = |s: &State| {
        tensortune_schedules::lower::lower(s)
            .ok()
            .map(|f| estimated_cycles(&f, &core))
            .filter(|c| c.is_finite())
    };
    // The op's loops as written compete too, first: a draw must be estimated strictly
    // faster to replace them (and a tie keeps the earlier draw).
    let mut best: Option<(f64, State)> = cycles(&naive).map(|c| (c, naive.clone()));
    let opts = TuneOptions {
        threads: target.threads(),
        ..TuneOptions::default()
    };
    let sketches = generate_for(dag, &opts, target, &cpu_rules());
    if !sketches.is_empty() {
        let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(0);
        for n in 0..CPU_DEFAULT_DRAWS {
            let k = n % sketches.len();
            let dec = crate::sketch::sample::sample(&sketches[k], &mut rng, &opts);
            let Ok(s) = sketches[k].instantiate(dag, &dec) else {
                continue;
            };
            if let Some(c) = cycles(&s) {
                if best.as_ref().is_none_or(|(b, _)| c < *b) {
                    best = Some((c, s));
                }
            }
        }
    }
    best.map_or(naive, |(_, s)| s)
}

/// Without the cost model (a build without the `model` feature: the reuse stack of a build
/// script) there is no estimate to rank draws by: the loops as written.
#[cfg(not(feature = "model"))]
fn estimated_best(_dag: &ComputeDag, _target: &TargetDesc, naive: State) -> State {
    naive
}

/// The shortest innermost reduction loop `compiles_well` counts on the code generator to
/// fold on registers.
const FOLDED_ROW: i64 = 16;

/// Reduction loops this short LLVM unrolls whole, so that it vectorizes the spatial loop
/// around them (the op's loops as written of a depthwise conv2d: 3 × 3 windows).
const UNROLLED_REDUCTION: i64 = 16;

/// True if the op's loops as written compile to fast code on the CPU, where the analytic
/// estimate (which costs loops as the loop IR states them) would call them scalar: every
/// update is either in a fold the code generator runs on registers ([`Stmt::as_fold`]: a
/// row sum, a dot product, over at least [`FOLDED_ROW`] iterations) or sits in reduction
/// loops of at most [`UNROLLED_REDUCTION`] iterations in all (which LLVM unrolls and
/// vectorizes around), and no statement calls `exp`, `log` or `tanh` (libm, one element at
/// a time, outside a vectorized loop). A matmul (its reduction reading `B` across rows), a
/// conv2d (channels × window) and a softmax (`exp`) do not.
fn compiles_well(f: &LoweredFunc) -> bool {
    fn walk(s: &Stmt, loops: &mut Vec<(u32, i64)>) -> bool {
        match s {
            Stmt::For {
                var, extent, body, ..
            } => {
                if *extent >= FOLDED_ROW
                    && body.as_fold(var.id).is_some_and(|fold| !calls_libm(fold.x))
                {
                    return true;
                }
                loops.push((var.id, *extent));
                let ok = walk(body, loops);
                loops.pop();
                ok
            }
            Stmt::Seq(v) => v.iter().all(|s| walk(s, loops)),
            Stmt::Allocate { body, .. } => walk(body, loops),
            Stmt::If {
                then, otherwise, ..
            } => walk(then, loops) && otherwise.as_deref().is_none_or(|o| walk(o, loops)),
            Stmt::Store { buf, index, value } => store_compiles_well(*buf, index, value, loops),
            Stmt::Sync | Stmt::Prefetch { .. } | Stmt::Shuffle { .. } => true,
        }
    }
    walk(&f.body, &mut Vec::new())
}

/// True if `e` calls `exp`, `log` or `tanh`.
fn calls_libm(e: &Expr) -> bool {
    let mut libm = false;
    e.visit(&mut |e| {
        libm |= matches!(
            e,
            Expr::Call(Intrinsic::Exp | Intrinsic::Log | Intrinsic::Tanh, _)
        )
    });
    libm
}

/// A store outside a fold: no libm call, and if it updates its own element, inside
/// reduction loops (the innermost loops around it that its index does not use) of at most
/// [`UNROLLED_REDUCTION`] iterations in all.
fn store_compiles_well(
    buf: tensortune_schedules::BufId,
    index: &Expr,
    value: &Expr,
    loops: &[(u32, i64)],
) -> bool {
    if calls_libm(value) {
        return false;
    }
    let mut update = false;
    value.visit(&mut |e| {
        update |= matches!(e, Expr::BufLoad { buf: b, index: i, .. } if *b == buf && **i == *index)
    });
    if !update {
        return true;
    }
    loops
        .iter()
        .rev()
        .take_while(|(v, _)| !index.uses_var(*v))
        .try_fold(1i64, |n, (_, e)| n.checked_mul(*e))
        .is_some_and(|n| n <= UNROLLED_REDUCTION)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensortune_schedules::ops::WorkloadSpec;

    fn dag(spec: &str) -> ComputeDag {
        WorkloadSpec::parse(spec)
            .and_then(|s| s.build())
            .unwrap_or_else(|e| panic!("{spec}: {e}"))
    }

    fn naive_compiles_well(spec: &str) -> bool {
        let f = tensortune_schedules::lower::lower(&State::new(&dag(spec)))
            .unwrap_or_else(|e| panic!("{spec}: {e}"));
        compiles_well(&f)
    }

    /// Which ops keep their loops as written: the folds (a row sum, a dot product over a
    /// row of at least one register) and short windows; not a matmul (its reduction reads
    /// `B` across rows), a conv2d (channels × window: its innermost loop, the window's
    /// row, is shorter than a register, so not a fold either) or a softmax (`exp`).
    #[test]
    fn loops_as_written_that_compile_well() {
        for (spec, well) in [
            ("reduce_sum:M=8,N=64", true),
            ("dense_bias_relu:M=4,N=32,K=64", true),
            (
                "depthwise_conv2d:N=1,C=4,H=9,W=9,R=3,S=3,stride=1,pad=1",
                true,
            ),
            ("matmul:M=16,N=16,K=64", false),
            ("conv2d:N=1,C=8,H=9,W=9,K=8,R=3,S=3,stride=1,pad=1", false),
            ("softmax:M=4,N=64", false),
        ] {
            assert_eq!(naive_compiles_well(spec), well, "{spec}");
        }
    }

    /// The choice is the loops as written where they compile well, a tiled draw for a
    /// matmul, the same on every call, and the loops as written on a GPU target.
    #[cfg(feature = "model")]
    #[test]
    fn default_is_deterministic_and_tiles_a_matmul() {
        let cpu = TargetDesc::cpu(512, 1);
        let d = dag("matmul:M=64,N=64,K=64");
        let a = cpu_default_schedule(&d, &cpu);
        assert_eq!(a.trace(), cpu_default_schedule(&d, &cpu).trace());
        assert!(!a.trace().steps.is_empty(), "{}", a.trace());
        let d = dag("reduce_sum:M=8,N=64");
        assert!(cpu_default_schedule(&d, &cpu).trace().steps.is_empty());
        let gpu = TargetDesc::Cuda(
            tensortune_schedules::target::CudaDesc::for_arch("sm_90").expect("known arch"),
        );
        let d = dag("matmul:M=64,N=64,K=64");
        assert!(cpu_default_schedule(&d, &gpu).trace().steps.is_empty());
    }
}

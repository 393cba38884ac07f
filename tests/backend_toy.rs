//! The backend seam: a second backend, defined here and nowhere else, tunes a matmul end to
//! end through the same `tune()` with its own target description and rule list, and no
//! change to the tuner. It "compiles" a program to its loop IR and runs it on the reference
//! interpreter, on a CPU described with 128-bit vectors (4 f32 lanes), with a sketch rule of
//! its own beside two of the library's.

use std::time::Instant;
use tensortune::backend::{Backend, Purpose};
use tensortune::measure::{random_inputs, CheckOptions, OutputView, Reference};
use tensortune::records::Database;
use tensortune::schedules::ir::LoweredFunc;
use tensortune::schedules::ops::WorkloadSpec;
use tensortune::schedules::target::{TargetDesc, TargetKey};
use tensortune::schedules::trace::Trace;
use tensortune::schedules::{interp, ComputeDag, TensorId};
use tensortune::tuner::measure::{MeasureError, MeasureErrorKind, MeasureResult, Timing};
use tensortune::tuner::sketch::rules::{
    generate_for, Applies, MultiLevelTiling, RuleContext, RuleError, SketchBuilder, SketchRule,
    Variant, REGISTER_TILE_VECTORS,
};
use tensortune::tuner::sketch::{ChoiceKind, Hole, SketchStep};
use tensortune::TuneOptions;

/// This backend's own rule: the innermost loop split for the target's lanes and vectorized,
/// nothing else. Built with the public builder only.
struct Columns;

impl SketchRule for Columns {
    fn name(&self) -> &str {
        "columns"
    }
    fn applies(&self, _cx: &RuleContext, _t: TensorId) -> Applies {
        Applies::Yes
    }
    fn apply(&self, cx: &RuleContext, b: &SketchBuilder, t: TensorId) -> Vec<Variant> {
        let build = || -> Result<SketchBuilder, RuleError> {
            let mut b = b.clone();
            let p = b.pos(t)?;
            let n = b.stage_leaves(p)? as u32;
            // The reduce loops come last; split the innermost spatial one.
            let spatial = cx.dag.op(t).shape.len() as u32;
            if n == 0 || spatial == 0 {
                return Err(RuleError::NoLoop { stage: p, iter: 0 });
            }
            b.split(p, spatial - 1, 2, Some(cx.lanes(t)))?;
            let hole = b.choice(vec![0, 16], ChoiceKind::Unroll);
            b.defer(SketchStep::AutoUnroll { tensor: t, hole });
            Ok(b)
        };
        vec![("columns".to_string(), build())]
    }
}

/// Programs run on the loop-IR interpreter of a CPU with 4 f32 lanes.
struct Interpreter;

impl Backend for Interpreter {
    type Artifact = LoweredFunc;

    fn target_key(&self) -> TargetKey {
        TargetKey::llvm("interpreter-4-lanes", vec![], 1)
    }

    fn target(&self) -> TargetDesc {
        TargetDesc::cpu(128, 1)
    }

    fn rules(&self) -> Vec<Box<dyn SketchRule>> {
        let tiling = MultiLevelTiling::new("SSRS").expect("a valid structure");
        vec![Box::new(Columns), Box::new(tiling)]
    }

    fn compile(&self, func: &LoweredFunc) -> Result<LoweredFunc, MeasureError> {
        Ok(func.clone())
    }

    fn run(
        &self,
        dag: &ComputeDag,
        artifacts: &[LoweredFunc],
        _purpose: Purpose,
        seed: u64,
    ) -> Vec<MeasureResult> {
        // The same reference check as every backend's: inputs from the seed, outputs compared
        // with the direct evaluator's under the shared tolerance.
        let check = CheckOptions {
            full_check_max_flops: f64::INFINITY,
            check_points: 0,
            seed,
        };
        let reference = random_inputs(dag, seed)
            .and_then(|ins| Reference::new(dag, &ins, &check).map(|r| (ins, r)));
        let (ins, reference) = match reference {
            Ok(r) => r,
            Err(e) => return artifacts.iter().map(|_| Err(e.clone())).collect(),
        };
        artifacts
            .iter()
            .map(|f| {
                let start = Instant::now();
                let got = interp::run(f, &ins)
                    .map_err(|e| MeasureError::new(MeasureErrorKind::Runtime, e.to_string()))?;
                let seconds = start.elapsed().as_secs_f64();
                let views: Vec<OutputView> = got.iter().map(OutputView::of_nd).collect();
                reference.check(&views)?;
                Timing::from_repeats(vec![seconds], 1)
                    .ok_or_else(|| MeasureError::new(MeasureErrorKind::Internal, "no timing"))
            })
            .collect()
    }
}

#[test]
fn a_second_backend_tunes_through_the_same_tune() {
    let dir = std::env::temp_dir().join(format!("tt-backend-toy-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let db_path = dir.join("r.db");
    let spec = WorkloadSpec::parse("matmul:M=32,N=48,K=16").expect("spec");
    let opts = TuneOptions {
        trials: 16,
        batch_size: 8,
        population: 32,
        generations: 2,
        seed: 1,
        quiet: true,
        remeasure_top: 2,
        db: Some(db_path.clone()),
        ..TuneOptions::default()
    };
    let backend = Interpreter;
    let report = tensortune::tune(&spec, &backend, &opts).expect("tunes");
    let key = backend.target_key().to_string();
    assert_eq!(report.target, key);
    assert_eq!(report.trials, 16);
    assert_eq!(
        report.errors, 0,
        "every program the interpreter ran matched the reference"
    );
    assert!(report.best_latency_s.is_some_and(|l| l > 0.0));

    // The search made its sketches from this backend's description and rules: 4 lanes (the
    // register tile up to `REGISTER_TILE_VECTORS` vectors of them), the SSRS tiling (three
    // loops per spatial axis) and the rule defined above.
    let dag = spec.build().expect("dag");
    let sketches = generate_for(&dag, &opts, &backend.target(), &backend.rules());
    let names: Vec<&str> = sketches.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["C:columns", "C:tile", "C:tile+pack"]);
    for h in sketches.iter().flat_map(|s| &s.holes) {
        if let Hole::Tile {
            parts, max_inner, ..
        } = h
        {
            let tile = 4 * REGISTER_TILE_VECTORS;
            assert!(
                matches!(max_inner, None | Some(4)) || *max_inner == Some(tile),
                "{h:?}"
            );
            assert!(*parts == 2 || *parts == 3, "{h:?}");
        }
    }
    // Every measured program is one of those sketches, filed under this backend's key; both
    // this backend's own rule and the library's tiling were measured.
    let db = Database::open_read_only(&db_path).expect("db");
    assert_eq!(db.targets().expect("targets"), vec![key.clone()]);
    let records = db.records(&spec.canonical(), &key).expect("records");
    assert_eq!(records.len(), report.trials);
    let mut measured: Vec<String> = records
        .iter()
        .map(|r| {
            let trace = Trace::from_json(&r.trace_json).expect("trace");
            trace.sketch.expect("from a sketch").name
        })
        .collect();
    measured.sort();
    measured.dedup();
    assert!(
        measured.iter().all(|n| names.contains(&n.as_str())),
        "{measured:?}"
    );
    assert!(measured.iter().any(|n| n == "C:columns"), "{measured:?}");
    assert!(
        measured.iter().any(|n| n.starts_with("C:tile")),
        "{measured:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

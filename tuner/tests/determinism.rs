//! A fixed-seed tuning run on the simulated measurer measures the same programs, in the same
//! order, as the golden file `tests/golden/determinism.txt` records: the sketches, the
//! sampling, the evolutionary search and the task scheduler together. Refactoring any of them
//! without meaning to change the search must leave this file as it is; a change that means to
//! change the search rewrites it with `BLESS=1 cargo test --release -p tensortune-tuner --test
//! determinism` and shows the new trials in the diff.
//!
//! The cost model is a fixed linear function of the features defined here, not XGBoost, so the
//! golden does not depend on a library's floating-point summation order on one machine.

// This needs the cost model and the tuning loop: the `model` feature (on by default).
#![cfg(feature = "model")]

use std::path::Path;
use tensortune_cost_model::{CostModel, ModelError, ProgramFeatures, Sample};
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::schedule::State;
use tensortune_schedules::ComputeDag;
use tensortune_tuner::search::SearchSpace;
use tensortune_tuner::simulate::SimulatedMeasurer;
use tensortune_tuner::sketch::Sketch;
use tensortune_tuner::tuning::{Silent, TaskInput, Tuner};
use tensortune_tuner::{MeasureResult, Measurer, TuneOptions};

/// Scores a program by a fixed weighted sum of its features; informed once it has seen one
/// batch, so the search ranks and evolves after the first round.
struct Linear {
    seen: usize,
}

impl CostModel for Linear {
    fn update(&mut self, samples: &[Sample]) -> Result<(), ModelError> {
        self.seen += samples.len();
        Ok(())
    }
    fn predict(&self, programs: &[ProgramFeatures]) -> Result<Vec<f64>, ModelError> {
        Ok(programs
            .iter()
            .map(|p| {
                p.as_flat()
                    .iter()
                    .enumerate()
                    // Weights in [-1, 1) varying with the column; f64 sums in a fixed order.
                    .map(|(i, v)| f64::from(*v).ln_1p() * (((i * 37) % 17) as f64 / 8.5 - 1.0))
                    .sum()
            })
            .collect())
    }
    fn is_informed(&self) -> bool {
        self.seen > 0
    }
}

/// Logs every program it is asked to measure, with its workload, and delegates.
struct Logging {
    inner: SimulatedMeasurer,
    keys: Vec<(ComputeDag, String)>,
    log: Vec<String>,
}

impl Measurer for Logging {
    fn measure(&mut self, dag: &ComputeDag, candidates: &[State]) -> Vec<MeasureResult> {
        let key = self
            .keys
            .iter()
            .find(|(d, _)| d == dag)
            .map(|(_, k)| k.clone())
            .unwrap_or_default();
        self.log.extend(
            candidates
                .iter()
                .map(|c| format!("{key}\t{}", c.trace().to_json())),
        );
        self.inner.measure(dag, candidates)
    }
    fn target_key(&self) -> String {
        self.inner.target_key()
    }
}

/// The programs a run of `specs` with `threads` measures, one line each.
fn trial_log(specs: &[&str], threads: usize, trials: usize, seed: u64) -> Vec<String> {
    let opts = TuneOptions {
        trials,
        batch_size: 8,
        population: 32,
        generations: 2,
        threads,
        seed,
        quiet: true,
        ..TuneOptions::default()
    };
    let tasks: Vec<TaskInput> = specs
        .iter()
        .map(|s| {
            let w = WorkloadSpec::parse(s).expect("spec");
            TaskInput {
                key: w.canonical(),
                dag: w.build().expect("dag"),
                weight: 1.0,
            }
        })
        .collect();
    let sketches: Vec<Sketch> = tasks
        .iter()
        .flat_map(|t| SearchSpace::new(t.dag.clone(), &opts).sketches)
        .collect();
    let mut logging = Logging {
        inner: SimulatedMeasurer::new(&sketches, seed, 1e-3),
        keys: tasks
            .iter()
            .map(|t| (t.dag.clone(), t.key.clone()))
            .collect(),
        log: Vec::new(),
    };
    let mut tuner = Tuner::new(opts, &mut logging, None, Box::new(Linear { seen: 0 }));
    tuner.run(tasks, &mut Silent).expect("run");
    logging.log
}

#[test]
fn fixed_seed_run_measures_the_golden_trials() {
    let mut lines = vec![
        "# serial: matmul (packing), dense+relu (fusion), conv2d (padding), softmax (rfactor)"
            .to_string(),
    ];
    lines.extend(trial_log(
        &[
            "matmul:M=64,N=64,K=64",
            "dense_bias_relu:M=16,N=32,K=24",
            "conv2d:N=1,C=4,H=8,W=8,K=8,R=3,S=3,pad=1",
            "softmax:M=8,N=32",
        ],
        1,
        64,
        7,
    ));
    lines.push("# four threads: matmul (parallel holes)".to_string());
    lines.extend(trial_log(&["matmul:M=32,N=48,K=16"], 4, 16, 3));
    let text = lines.join("\n") + "\n";
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/determinism.txt");
    if std::env::var_os("BLESS").is_some() {
        std::fs::create_dir_all(path.parent().expect("has a parent")).expect("mkdir");
        std::fs::write(&path, &text).expect("write golden");
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("missing {}: run with BLESS=1", path.display()));
    let first_difference = want
        .lines()
        .zip(text.lines())
        .position(|(w, g)| w != g)
        .or((want.lines().count() != text.lines().count()).then_some(usize::MAX));
    assert_eq!(
        first_difference,
        None,
        "the trials differ from {} (first differing line shown as its index; rerun with \
         BLESS=1 and review the diff if the change is meant)",
        path.display()
    );
    // Four tasks sharing sixty-four trials; the threaded run adds sixteen; two comment lines.
    assert_eq!(text.lines().count(), 64 + 16 + 2);
}

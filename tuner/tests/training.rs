//! What the tuning loop gives its cost model: cut-short programs are trained on like the
//! others, the budget's last batch is not (no search follows it), and while the model has
//! learnt nothing a round evolves a population only by scores that are an estimate (the
//! analytic one an untrained GBDT model falls back to), never by a random model's noise.

// These need the cost model and the tuning loop: the `model` feature (on by default).
#![cfg(feature = "model")]

use std::sync::{Arc, Mutex};
use tensortune_cost_model::{
    CostModel, GbdtModel, GbdtOptions, ModelError, ProgramFeatures, Sample,
};
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::schedule::State;
use tensortune_schedules::ComputeDag;
use tensortune_tuner::search::SearchSpace;
use tensortune_tuner::simulate::SimulatedMeasurer;
use tensortune_tuner::tuning::{Silent, TaskInput, Tuner};
use tensortune_tuner::{MeasureResult, Measurer, TuneOptions};

/// The simulated measurer, with the hopeless cutoff the CPU measurer applies: a program
/// slower than `factor` times the best so far (this batch's included) is cut short.
struct Cutting {
    inner: SimulatedMeasurer,
    cutoff: Option<(Option<f64>, f64)>,
}

impl Measurer for Cutting {
    fn measure(&mut self, dag: &ComputeDag, candidates: &[State]) -> Vec<MeasureResult> {
        let mut best = self.cutoff.and_then(|(b, _)| b);
        let mut out = self.inner.measure(dag, candidates);
        for t in out.iter_mut().flatten() {
            match (self.cutoff, best) {
                (Some((_, f)), Some(b)) if t.median_s > f * b => t.cut_short = true,
                _ => {}
            }
            if !t.cut_short && best.is_none_or(|b| t.median_s < b) {
                best = Some(t.median_s);
            }
        }
        out
    }
    fn target_key(&self) -> String {
        self.inner.target_key()
    }
    fn set_cutoff(&mut self, best_s: Option<f64>, factor: f64) {
        self.cutoff = (factor > 0.0).then_some((best_s, factor));
    }
}

/// A GBDT model that logs how many samples each update brings and how many programs each
/// prediction scores; `prior: false` hides that its untrained scores are an estimate.
struct Logged {
    inner: GbdtModel,
    prior: bool,
    updates: Arc<Mutex<Vec<usize>>>,
    predictions: Arc<Mutex<Vec<usize>>>,
}

impl CostModel for Logged {
    fn update(&mut self, samples: &[Sample]) -> Result<(), ModelError> {
        self.updates.lock().unwrap().push(samples.len());
        self.inner.update(samples)
    }
    fn predict(&self, programs: &[ProgramFeatures]) -> Result<Vec<f64>, ModelError> {
        self.predictions.lock().unwrap().push(programs.len());
        self.inner.predict(programs)
    }
    fn is_informed(&self) -> bool {
        self.inner.is_informed()
    }
    fn has_prior(&self) -> bool {
        self.prior && self.inner.has_prior()
    }
}

/// Tunes a matmul on the simulated measurer with a logged GBDT model; returns the samples
/// of each update, the programs scored by each prediction, and the tuner's trained count.
fn logged_run(prior: bool) -> (Vec<usize>, Vec<usize>, usize) {
    let w = WorkloadSpec::parse("matmul:M=256,N=128,K=192").unwrap();
    let task = TaskInput {
        key: w.canonical(),
        dag: w.build().unwrap(),
        weight: 1.0,
    };
    let o = TuneOptions {
        trials: 64,
        batch_size: 16,
        population: 128,
        generations: 3,
        model_warmup: 32,
        // Tight, so that the simulated programs get cut short.
        hopeless_factor: 1.5,
        seed: 5,
        quiet: true,
        ..TuneOptions::default()
    };
    let space = SearchSpace::new(task.dag.clone(), &o);
    let mut m = Cutting {
        inner: SimulatedMeasurer::new(&space.sketches, 7, 1e-3),
        cutoff: None,
    };
    let updates = Arc::new(Mutex::new(Vec::new()));
    let predictions = Arc::new(Mutex::new(Vec::new()));
    let model = Logged {
        inner: GbdtModel::new(GbdtOptions {
            warmup_samples: 32,
            ..GbdtOptions::default()
        })
        .unwrap(),
        prior,
        updates: updates.clone(),
        predictions: predictions.clone(),
    };
    let mut tuner = Tuner::new(o.clone(), &mut m, None, Box::new(model));
    let s = tuner.run(vec![task], &mut Silent).unwrap();
    let report = &s.tasks[0];
    assert_eq!(report.trials, 64);
    assert!(
        report.cut_short > 0,
        "the cutoff must cut some programs short"
    );
    let updates = updates.lock().unwrap().clone();
    let predictions = predictions.lock().unwrap().clone();
    (updates, predictions, tuner.trained_on())
}

#[test]
fn cut_short_programs_train_the_model_and_an_untrained_one_evolves_only_by_an_estimate() {
    let (with_prior, without) = (logged_run(true), logged_run(false));
    for (updates, predictions, trained) in [&with_prior, &without] {
        // Every batch but the last is trained on, cut-short programs included.
        assert_eq!(updates, &vec![16, 16, 16], "samples per update");
        assert_eq!(*trained, 48);
        assert!(predictions.len() > 3, "{predictions:?}");
    }
    // Without an estimate, rounds 1 and 2 (before the warm-up of 32 samples) are one scoring
    // each of a random sample of 4 x 16 programs; from round 3 the trained model ranks whole
    // populations (128) over generations.
    let p = &without.1;
    assert!(
        p[..2].iter().all(|&n| n <= 64),
        "untrained rounds without an estimate score only their batch: {p:?}"
    );
    assert!(
        p[2..].iter().any(|&n| n > 64),
        "trained rounds score a population: {p:?}"
    );
    // With one (an untrained GBDT model scores with the analytic estimate), round 1 already
    // evolves a population: its first scoring is the whole population, and the untrained
    // rounds score once a generation instead of once.
    let q = &with_prior.1;
    assert!(q[0] > 64, "the first round scores a population: {q:?}");
    assert!(
        q.len() > p.len(),
        "untrained rounds evolve over generations: {q:?} against {p:?}"
    );
}

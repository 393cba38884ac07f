//! One generation of the evolutionary search for matmul 512³: 2048 programs (Ansor's
//! population; the tuner's default is now 1024, see `TuneOptions::population`) drawn from the
//! sketches and scored by the cost model, as the tuner does before each measured batch.
//!
//! Two scorers: the [`RandomModel`] (the price of the search without a model: sampling,
//! lowering, feature extraction) and a [`GbdtModel`] trained on 300 random programs of the same
//! workload, labelled by the simulated measurer (`tensortune_tuner::simulate`, a known cost of
//! the decisions) so that no program has to run. After the criterion groups, a summary times
//! one generation phase by phase: lowering, feature extraction, prediction, and the rest
//! (sampling random programs, fingerprints, ranking).
//!
//! What it showed is in docs/measurements.md ("Search"): lowering dominates a generation.
//!
//! Run pinned to one core, as docs/benchmarks.md asks (the scorer lowers and featurizes in
//! parallel, as the tuner does, over the cores it may use):
//! `taskset -c 1 cargo bench --bench search` (summary only: `-- --summary-only`).

use criterion::Criterion;

/// The allocator the `tensortune` binary uses.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use rand::rngs::ChaCha8Rng;
use rand::SeedableRng;
use rayon::prelude::*;
use std::collections::HashSet;
use std::time::{Duration, Instant};
use tensortune::TuneOptions;
use tensortune_cost_model::{
    CostModel, GbdtModel, GbdtOptions, ProgramFeatures, RandomModel, Sample,
};
use tensortune_schedules::ir::LoweredFunc;
use tensortune_schedules::lower::lower;
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::schedule::State;
use tensortune_tuner::search::{Scorer, SearchSpace};
use tensortune_tuner::simulate::SimulatedMeasurer;

const SPEC: &str = "matmul:M=512,N=512,K=512";

/// The workload: `SPEC`, or the one in the environment variable `TT_SEARCH_SPEC`.
fn spec() -> String {
    std::env::var("TT_SEARCH_SPEC").unwrap_or_else(|_| SPEC.to_string())
}
const POPULATION: usize = 2048;
/// The measured batch the round proposes; the tuner's default batch size.
const BATCH: usize = 64;

/// Seconds spent in each phase of scoring, summed over calls.
#[derive(Default, Clone, Copy)]
struct Phases {
    lower_s: f64,
    features_s: f64,
    predict_s: f64,
    programs: usize,
}

/// The tuner's model scorer (lower and featurize in parallel, predict the ones that lowered,
/// `-inf` for the others), with each phase timed apart.
struct TimedScorer<'a> {
    model: &'a dyn CostModel,
    phases: Phases,
}

impl Scorer for TimedScorer<'_> {
    fn score(&mut self, states: &[State]) -> Vec<f64> {
        let t = Instant::now();
        let lowered: Vec<Option<LoweredFunc>> = states.par_iter().map(|s| lower(s).ok()).collect();
        self.phases.lower_s += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let feats: Vec<Option<ProgramFeatures>> = lowered
            .par_iter()
            .map(|f| f.as_ref().map(ProgramFeatures::extract))
            .collect();
        self.phases.features_s += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let ok: Vec<ProgramFeatures> = feats.iter().flatten().cloned().collect();
        let pred = self
            .model
            .predict(&ok)
            .unwrap_or_else(|_| vec![0.0; ok.len()]);
        self.phases.predict_s += t.elapsed().as_secs_f64();
        self.phases.programs += states.len();
        let mut it = pred.into_iter();
        feats
            .iter()
            .map(|f| match f {
                Some(_) => it.next().unwrap_or(f64::NEG_INFINITY),
                None => f64::NEG_INFINITY,
            })
            .collect()
    }
}

struct Setup {
    space: SearchSpace,
    opts: TuneOptions,
    random: RandomModel,
    gbdt: GbdtModel,
}

fn setup() -> Setup {
    let spec = WorkloadSpec::parse(&spec()).expect("spec");
    let dag = spec.build().expect("dag");
    let opts = TuneOptions {
        generations: 1,
        population: POPULATION,
        ..TuneOptions::default()
    };
    let space = SearchSpace::new(dag.clone(), &opts);
    // 300 random programs labelled by the simulated cost: what the model would have learnt
    // from a few measured batches, without running anything.
    let sim = SimulatedMeasurer::new(&space.sketches, 7, 1e-3);
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let flops = dag.flops();
    let samples: Vec<Sample> = (0..300)
        .filter_map(|_| {
            let c = space.random(&mut rng, &opts)?;
            let latency = sim.latency(&c.state)?;
            let func = lower(&c.state).ok()?;
            Some(Sample {
                features: ProgramFeatures::extract(&func),
                workload: spec.canonical(),
                throughput: flops / latency,
            })
        })
        .collect();
    let mut gbdt = GbdtModel::new(GbdtOptions {
        warmup_samples: 0,
        ..GbdtOptions::default()
    })
    .expect("model");
    gbdt.update(&samples).expect("trains");
    assert!(gbdt.is_trained(), "{} samples", samples.len());
    Setup {
        space,
        opts,
        random: RandomModel::new(3),
        gbdt,
    }
}

/// One search round of one generation; returns the phases and the whole round's seconds.
fn generation(s: &Setup, model: &dyn CostModel, seed: u64) -> (Phases, f64) {
    let mut scorer = TimedScorer {
        model,
        phases: Phases::default(),
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let t = Instant::now();
    let batch = s
        .space
        .propose(&mut scorer, &HashSet::new(), &[], BATCH, &s.opts, &mut rng);
    let total = t.elapsed().as_secs_f64();
    assert!(!batch.is_empty());
    (scorer.phases, total)
}

fn bench(c: &mut Criterion, s: &Setup) {
    let mut g = c.benchmark_group("search_generation_matmul_512_2048_programs");
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    let mut seed = 0;
    g.bench_function("random_model", |b| {
        b.iter(|| {
            seed += 1;
            generation(s, &s.random, seed)
        })
    });
    g.bench_function("gbdt_model", |b| {
        b.iter(|| {
            seed += 1;
            generation(s, &s.gbdt, seed)
        })
    });
    g.finish();
}

fn summary(s: &Setup) {
    let threads = rayon::current_num_threads();
    println!(
        "\none search generation, {}: {POPULATION} programs scored, batch of {BATCH} \
         ({threads} rayon thread(s))",
        spec()
    );
    for (name, model) in [
        ("random model", &s.random as &dyn CostModel),
        ("gbdt model", &s.gbdt),
    ] {
        // The median round of five, with its phases.
        let mut rounds: Vec<(Phases, f64)> =
            (0..5).map(|i| generation(s, model, 100 + i)).collect();
        rounds.sort_by(|a, b| a.1.total_cmp(&b.1));
        let (p, total) = rounds[2];
        let rest = total - p.lower_s - p.features_s - p.predict_s;
        let pct = |x: f64| 100.0 * x / total;
        println!(
            "  {name:<13} {:8.1} ms  lowering {:5.1}%  features {:5.1}%  prediction {:5.1}%  \
             sampling and ranking {:5.1}%  ({} programs scored, {:.1} us each)",
            total * 1e3,
            pct(p.lower_s),
            pct(p.features_s),
            pct(p.predict_s),
            pct(rest),
            p.programs,
            total * 1e6 / p.programs.max(1) as f64,
        );
    }
}

fn main() {
    let s = setup();
    let summary_only = std::env::args().any(|a| a == "--summary-only");
    if !summary_only {
        let mut c = Criterion::default().configure_from_args();
        bench(&mut c, &s);
        c.final_summary();
    }
    summary(&s);
}

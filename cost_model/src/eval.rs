//! Held-out evaluation of cost models on measured samples (what `tensortune model eval`
//! prints).
//!
//! For each workload with at least [`EvalOptions::min_samples`] samples, by
//! [`EvalOptions::split`]:
//! - [`Split::Within`]: shuffle its samples with the seed, train each model on the first
//!   [`EvalOptions::train_fraction`] and score the rest;
//! - [`Split::HeldOut`]: train on every sample of the *other* workloads and score all of its
//!   own: how well the model ranks the programs of a shape it never saw, which is what a warm
//!   start on a new workload relies on.
//!
//! Scores come from [`crate::metrics`]. Beside each gradient-boosted model stand two untrained
//! ones: `random`, whose figures are averaged over [`EvalOptions::random_repeats`] seeds so
//! that its expected 0.5 shows as about 0.5, and `analytic` ([`AnalyticModel`]: the
//! features' own cost estimate, what the search ranks with before it has trained).

use std::collections::BTreeMap;

use rand::rngs::ChaCha8Rng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;

use crate::error::ModelError;
use crate::metrics::{
    pairwise_accuracy, pairwise_accuracy_apart, share_of_pairs_apart, spearman, top_k_recall,
};
use crate::model::analytic::AnalyticModel;
use crate::model::gbdt::{GbdtModel, GbdtOptions, Objective};
use crate::model::random::RandomModel;
use crate::model::{CostModel, Sample};

/// Which samples a workload's models train on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Split {
    /// A random part of the workload's own samples ([`EvalOptions::train_fraction`]).
    #[default]
    Within,
    /// Every sample of the other workloads; the workload's own are all tested.
    HeldOut,
}

/// How to evaluate.
#[derive(Clone, Debug, PartialEq)]
pub struct EvalOptions {
    /// Which samples each workload's models train on.
    pub split: Split,
    /// Fraction of each workload's samples trained on (the rest is tested), for
    /// [`Split::Within`].
    pub train_fraction: f64,
    /// Workloads with fewer samples are skipped.
    pub min_samples: usize,
    /// Seed of the split and of the random model.
    pub seed: u64,
    /// `k` of the top-k recall.
    pub top_k: usize,
    /// Seeds the random model's figures are averaged over.
    pub random_repeats: usize,
    /// The gradient-boosted model's options; one model is evaluated per objective listed.
    pub gbdt: GbdtOptions,
    /// Objectives to evaluate.
    pub objectives: Vec<Objective>,
}

impl Default for EvalOptions {
    fn default() -> EvalOptions {
        EvalOptions {
            split: Split::Within,
            train_fraction: 0.8,
            min_samples: 50,
            seed: 0,
            top_k: 5,
            random_repeats: 10,
            gbdt: GbdtOptions::default(),
            objectives: vec![GbdtOptions::default().objective],
        }
    }
}

/// The factor [`RankingMetrics::pairwise_accuracy_apart`] counts pairs past: on one AVX-512
/// core, a second timing of every record of a tuning run orders 0.85-0.93 of all pairs as
/// the first did and 0.90-0.97 of those more than 5% apart (docs/measurements.md,
/// "How far timings let a model rank").
pub const PAIRS_APART: f64 = 1.05;

/// Ranking quality on one test set (`None` where a figure is undefined, e.g. all tied).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RankingMetrics {
    /// Fraction of correctly ordered pairs.
    pub pairwise_accuracy: Option<f64>,
    /// The same over the pairs whose measured throughputs are more than 5% apart
    /// ([`PAIRS_APART`]): what one timing can tell apart.
    pub pairwise_accuracy_apart: Option<f64>,
    /// Spearman rank correlation.
    pub spearman: Option<f64>,
    /// Recall of the true top-k among the predicted top-k.
    pub top_k_recall: Option<f64>,
}

impl RankingMetrics {
    fn of(pred: &[f64], truth: &[f64], k: usize) -> RankingMetrics {
        RankingMetrics {
            pairwise_accuracy: pairwise_accuracy(pred, truth),
            pairwise_accuracy_apart: pairwise_accuracy_apart(pred, truth, PAIRS_APART),
            spearman: spearman(pred, truth),
            top_k_recall: top_k_recall(pred, truth, k),
        }
    }

    fn mean(all: &[&RankingMetrics]) -> RankingMetrics {
        let avg = |f: &dyn Fn(&RankingMetrics) -> Option<f64>| {
            let v: Vec<f64> = all.iter().filter_map(|m| f(m)).collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        };
        RankingMetrics {
            pairwise_accuracy: avg(&|m| m.pairwise_accuracy),
            pairwise_accuracy_apart: avg(&|m| m.pairwise_accuracy_apart),
            spearman: avg(&|m| m.spearman),
            top_k_recall: avg(&|m| m.top_k_recall),
        }
    }
}

/// The figures of one workload.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WorkloadEval {
    /// Workload key.
    pub workload: String,
    /// Samples trained on.
    pub train: usize,
    /// Samples tested.
    pub test: usize,
    /// Of the test set's pairs with different throughputs, the share more than 5% apart
    /// ([`PAIRS_APART`], [`share_of_pairs_apart`]): the rest are near-ties that timing noise
    /// orders about as often one way as the other, for every model.
    pub pairs_apart_share: Option<f64>,
    /// Per model (`gbdt-<objective>`, `random`): the test figures.
    pub models: BTreeMap<String, RankingMetrics>,
}

/// The whole evaluation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EvalReport {
    /// How the samples were split.
    pub split: Split,
    /// `k` of the top-k recall.
    pub top_k: usize,
    /// Per evaluated workload.
    pub workloads: Vec<WorkloadEval>,
    /// Workloads skipped for too few samples, with their sample count.
    pub skipped: Vec<(String, usize)>,
    /// Per model: the mean over workloads of each figure.
    pub mean: BTreeMap<String, RankingMetrics>,
}

/// The model name used in reports for a gradient-boosted model with `objective`.
pub fn gbdt_name(objective: Objective) -> String {
    format!("gbdt-{}", objective.name())
}

/// Each model trained on `train`, its figures on `test`; the random model's averaged over
/// [`EvalOptions::random_repeats`] seeds.
fn score(
    train: &[&Sample],
    test: &[&Sample],
    opts: &EvalOptions,
) -> Result<BTreeMap<String, RankingMetrics>, ModelError> {
    let train: Vec<Sample> = train.iter().map(|s| (*s).clone()).collect();
    let test_features: Vec<_> = test.iter().map(|s| s.features.clone()).collect();
    let truth: Vec<f64> = test.iter().map(|s| s.throughput).collect();
    let mut models = BTreeMap::new();
    for &objective in &opts.objectives {
        let mut model = GbdtModel::new(GbdtOptions {
            objective,
            ..opts.gbdt.clone()
        })?;
        model.fit(train.clone())?;
        let pred = model.predict(&test_features)?;
        models.insert(
            gbdt_name(objective),
            RankingMetrics::of(&pred, &truth, opts.top_k),
        );
    }
    let runs: Vec<RankingMetrics> = (0..opts.random_repeats.max(1))
        .map(|r| {
            let model = RandomModel::new(opts.seed.wrapping_add(1000 + r as u64));
            let pred = model.predict(&test_features)?;
            Ok(RankingMetrics::of(&pred, &truth, opts.top_k))
        })
        .collect::<Result<_, ModelError>>()?;
    models.insert(
        "random".to_string(),
        RankingMetrics::mean(&runs.iter().collect::<Vec<_>>()),
    );
    // Untrained: what the features' own cost estimate ranks (ties drawn by the seed).
    let analytic = AnalyticModel::new(opts.seed).predict(&test_features)?;
    models.insert(
        "analytic".to_string(),
        RankingMetrics::of(&analytic, &truth, opts.top_k),
    );
    Ok(models)
}

/// Evaluates on `samples` (any mix of workloads); see the module documentation.
pub fn evaluate(samples: &[Sample], opts: &EvalOptions) -> Result<EvalReport, ModelError> {
    if !(opts.train_fraction > 0.0 && opts.train_fraction < 1.0) {
        return Err(ModelError::InvalidOptions(
            "train fraction must lie strictly between 0 and 1".into(),
        ));
    }
    let mut by_workload: BTreeMap<&str, Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        by_workload.entry(s.workload.as_str()).or_default().push(s);
    }
    let mut report = EvalReport {
        split: opts.split,
        top_k: opts.top_k,
        workloads: Vec::new(),
        skipped: Vec::new(),
        mean: BTreeMap::new(),
    };
    for (w, (workload, group)) in by_workload.iter().enumerate() {
        if group.len() < opts.min_samples.max(2) {
            report.skipped.push((workload.to_string(), group.len()));
            continue;
        }
        let (train, test): (Vec<&Sample>, Vec<&Sample>) = match opts.split {
            Split::Within => {
                let mut order: Vec<&Sample> = group.clone();
                let mut rng = ChaCha8Rng::seed_from_u64(opts.seed.wrapping_add(w as u64));
                order.shuffle(&mut rng);
                let n_train = ((order.len() as f64 * opts.train_fraction).round() as usize)
                    .clamp(1, order.len() - 1);
                let (train, test) = order.split_at(n_train);
                (train.to_vec(), test.to_vec())
            }
            Split::HeldOut => {
                let others: Vec<&Sample> = by_workload
                    .iter()
                    .filter(|(other, _)| *other != workload)
                    .flat_map(|(_, g)| g.iter().copied())
                    .collect();
                if others.len() < 2 {
                    // Nothing else to learn from: the workload cannot be held out.
                    report.skipped.push((workload.to_string(), group.len()));
                    continue;
                }
                (others, group.clone())
            }
        };
        report.workloads.push(WorkloadEval {
            workload: workload.to_string(),
            train: train.len(),
            test: test.len(),
            pairs_apart_share: share_of_pairs_apart(
                &test.iter().map(|s| s.throughput).collect::<Vec<_>>(),
                PAIRS_APART,
            ),
            models: score(&train, &test, opts)?,
        });
    }
    let names: Vec<String> = report
        .workloads
        .first()
        .map(|w| w.models.keys().cloned().collect())
        .unwrap_or_default();
    for name in names {
        let all: Vec<&RankingMetrics> = report
            .workloads
            .iter()
            .filter_map(|w| w.models.get(&name))
            .collect();
        report.mean.insert(name, RankingMetrics::mean(&all));
    }
    Ok(report)
}

//! Gradient-boosted trees (XGBoost) over per-store features: the model the search ranks with.
//!
//! **Training set.** [`GbdtModel::update`] *adds* the samples given to the model's training
//! set and retrains from scratch on all of it (as Ansor's `XGBModel` does): the search passes
//! each measured batch once. Retraining on everything keeps the model a pure function of its
//! samples and options, so a saved model reloads and continues exactly.
//!
//! **Targets.** Throughputs are normalized per workload (the best program of a workload
//! scores 1, failed programs 0).
//!
//! **Objectives** ([`Objective`]):
//! - [`Objective::RankPairwise`] (the default): XGBoost's `rank:pairwise` with one query
//!   group per workload over one row per program ([`ProgramFeatures::program_row`]: its
//!   costliest store's row, the sum of all its rows, its row count), each carrying the
//!   program's normalized throughput as relevance; pairs are sampled uniformly over the whole
//!   list (`lambdarank_pair_method=mean`).
//! - [`Objective::PackSumSquaredError`] (Ansor's loss): squared error between the
//!   summed row scores and the normalized throughput, each program weighted by its normalized
//!   throughput so the model is most accurate about the fast programs the search cares about.
//!   XGBoost has no built-in loss over sums of rows, so it runs as a custom objective: the
//!   programs are XGBoost *groups* of rows, and the gradient of a row is that of its group.
//!   A program's score is the *sum* of the scores of its rows (its stores).
//!
//! Pack-sum weighs programs by throughput, so it is most accurate about the fastest few and
//! less about the order of the rest, which the search's pairwise choices also depend on. How
//! the two rank and search: docs/measurements.md ("The cost model's training set, and an
//! objective that ranks better but searches worse"; "One row per program, its main store and
//! its totals").
//!
//! **Warm-up.** Until the training set holds [`GbdtOptions::warmup_samples`] samples, or when
//! the samples carry no ranking information (fewer than two programs with rows, or all
//! targets equal), `update` trains nothing and `predict` answers with the
//! [`AnalyticModel`], the features' own cost estimate, where Ansor draws random scores before
//! its 100th measurement: the search's first round then measures fewer hopeless programs
//! (docs/measurements.md, "A micro-kernel feature group"). [`GbdtModel::is_trained`] tells
//! which.

use std::path::Path;

use super::xgboost::{self, Booster, DMatrix};
use serde::{Deserialize, Serialize};

use super::analytic::AnalyticModel;
use super::{validate, CostModel, Sample};
use crate::error::ModelError;
use crate::features::{ProgramFeatures, FEATURE_NAMES, N_FEATURES, N_PROGRAM_FEATURES};

/// The loss the trees are fitted with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Objective {
    /// Ansor's: throughput-weighted squared error of the per-program sum of row scores.
    PackSumSquaredError,
    /// XGBoost's `rank:pairwise`, one query group per workload.
    RankPairwise,
}

impl Objective {
    /// Every objective, for comparisons.
    pub const ALL: [Objective; 2] = [Objective::PackSumSquaredError, Objective::RankPairwise];

    /// The name used on the command line and in files: `pack-sum` or `rank-pairwise`.
    pub fn name(self) -> &'static str {
        match self {
            Objective::PackSumSquaredError => "pack-sum",
            Objective::RankPairwise => "rank-pairwise",
        }
    }

    /// Parses [`Objective::name`].
    pub fn parse(s: &str) -> Option<Objective> {
        Objective::ALL.into_iter().find(|o| o.name() == s)
    }
}

/// Hyper-parameters of [`GbdtModel`]. The tree parameters are Ansor's (`xgb_model.py`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GbdtOptions {
    /// The loss (default `rank:pairwise`: see the module documentation for the comparison).
    pub objective: Objective,
    /// Boosting rounds per training (trees in the model). 100 at `eta` 0.05: with one row per
    /// program, held-out ranking rose with smaller steps, and 300 rounds ranked as 100 did in
    /// three times the training time (docs/measurements.md, "One row per program, its main
    /// store and its totals").
    pub rounds: u32,
    /// Maximum tree depth. 6 (XGBoost's default; Ansor uses 10): a tuning run's training set
    /// is a few hundred programs, and depths 4 to 10 ranked held-out programs alike
    /// (docs/measurements.md, "Cost model").
    pub max_depth: u32,
    /// Histogram bins per feature (`hist` tree method). 32, against XGBoost's default of
    /// 256 (see `max_depth` for the measurements; on an AVX2 host earlier, 32, 64 and 256
    /// bins ranked within 0.01 of each other).
    pub max_bin: u32,
    /// Learning rate (Ansor: 0.2; see `rounds`).
    pub eta: f64,
    /// Minimum loss reduction to split (Ansor: 0.001).
    pub gamma: f64,
    /// Minimum hessian in a child (Ansor: 0).
    pub min_child_weight: f64,
    /// Seed of XGBoost and of the warm-up random model.
    pub seed: u64,
    /// XGBoost threads; 0 uses every core.
    pub threads: u32,
    /// Samples needed before the first training (Ansor: 100).
    pub warmup_samples: usize,
    /// `rank:pairwise` only: pairs sampled per program (64: a program's row is now one
    /// sample, where a store's was before).
    pub pairs_per_sample: u32,
}

impl Default for GbdtOptions {
    fn default() -> GbdtOptions {
        GbdtOptions {
            objective: Objective::RankPairwise,
            rounds: 100,
            max_depth: 6,
            max_bin: 32,
            eta: 0.05,
            gamma: 0.001,
            min_child_weight: 0.0,
            seed: 43,
            threads: 0,
            warmup_samples: 100,
            pairs_per_sample: 64,
        }
    }
}

/// Most boosting rounds a model may ask for.
const MAX_ROUNDS: u32 = 10_000;
/// Deepest trees.
const MAX_DEPTH: u32 = 24;
/// Most histogram bins per feature.
const MAX_BIN: u32 = 4096;
/// Most XGBoost threads.
const MAX_THREADS: u32 = 1024;
/// Most pairs per program for `rank:pairwise`.
const MAX_PAIRS: u32 = 4096;

impl GbdtOptions {
    fn check(&self) -> Result<(), ModelError> {
        let bad = |m: &str| Err(ModelError::InvalidOptions(m.to_string()));
        // Upper bounds too: the options come from model files and command lines, and a
        // file asking for 4 billion rounds or a depth of 1000 would hang the tuner in
        // training instead of failing. Each bound is far above any setting that ranks
        // better (docs/measurements.md: 300 rounds and depth 10 ranked as the defaults do).
        if !(1..=MAX_ROUNDS).contains(&self.rounds) {
            return bad(&format!("rounds must be 1 to {MAX_ROUNDS}"));
        }
        if self.max_depth > MAX_DEPTH {
            return bad(&format!("max_depth must be at most {MAX_DEPTH}"));
        }
        if self.max_bin > MAX_BIN {
            return bad(&format!("max_bin must be at most {MAX_BIN}"));
        }
        if self.threads > MAX_THREADS {
            return bad(&format!(
                "threads must be at most {MAX_THREADS} (0: every core)"
            ));
        }
        if self.pairs_per_sample > MAX_PAIRS {
            return bad(&format!("pairs_per_sample must be at most {MAX_PAIRS}"));
        }
        if !(self.eta.is_finite() && self.eta > 0.0) {
            return bad("eta must be a positive number");
        }
        if self.max_depth == 0 {
            return bad("max_depth must be at least 1");
        }
        if self.max_bin < 2 {
            return bad("max_bin must be at least 2");
        }
        if !(self.gamma.is_finite() && self.gamma >= 0.0) {
            return bad("gamma must be a non-negative number");
        }
        if !(self.min_child_weight.is_finite() && self.min_child_weight >= 0.0) {
            return bad("min_child_weight must be a non-negative number");
        }
        Ok(())
    }
}

/// Gradient-boosted trees over [`ProgramFeatures`]; see the module documentation.
pub struct GbdtModel {
    options: GbdtOptions,
    samples: Vec<Sample>,
    booster: Option<Booster>,
    fallback: AnalyticModel,
}

impl std::fmt::Debug for GbdtModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GbdtModel")
            .field("options", &self.options)
            .field("samples", &self.samples.len())
            .field("trained", &self.booster.is_some())
            .finish()
    }
}

/// Magic and version of the model file.
const FILE_FORMAT: &str = "tensortune-gbdt-model";
/// 2: `rank:pairwise` trees score one row per program ([`ProgramFeatures::program_row`]);
/// version 1's scored each store. A version 1 file still loads: its training set (the same
/// rows) is kept and its trees are trained anew.
const FILE_VERSION: u32 = 2;

/// The model file: JSON with the options, the training set and XGBoost's own JSON model.
#[derive(Serialize, Deserialize)]
struct ModelFile {
    format: String,
    version: u32,
    feature_names: Vec<String>,
    options: GbdtOptions,
    /// XGBoost's JSON model, as text; absent while untrained.
    booster: Option<String>,
    samples: Vec<Sample>,
}

impl GbdtModel {
    /// An untrained model.
    pub fn new(options: GbdtOptions) -> Result<GbdtModel, ModelError> {
        options.check()?;
        Ok(GbdtModel {
            fallback: AnalyticModel::new(options.seed),
            options,
            samples: Vec::new(),
            booster: None,
        })
    }

    /// A model trained on every record of `target` in a records database (all workloads),
    /// ignoring the warm-up threshold, so that a new run starts warm. Records whose traces
    /// no longer replay are skipped and listed in the report.
    pub fn from_records(
        db: &tensortune_records::Database,
        target: &str,
        options: GbdtOptions,
    ) -> Result<(GbdtModel, crate::dataset::DatasetReport), ModelError> {
        let (samples, report) = crate::dataset::samples_from_records(db, target)?;
        let mut model = GbdtModel::new(options)?;
        model.fit(samples)?;
        Ok((model, report))
    }

    /// A model trained on the records of `target` of every workload but those in `except`
    /// (the ones about to be tuned, whose own records a resumed run feeds it anyway), at most
    /// `per_workload` records each: the warm start of a run on a new shape. `None` when those
    /// records hold nothing to rank.
    pub fn warm_from_records(
        db: &tensortune_records::Database,
        target: &str,
        except: &[&str],
        per_workload: usize,
        options: GbdtOptions,
    ) -> Result<Option<(GbdtModel, crate::dataset::DatasetReport)>, ModelError> {
        let (samples, report) = crate::dataset::samples_from_some_records(
            db,
            target,
            |key| !except.contains(&key),
            per_workload,
        )?;
        let mut model = GbdtModel::new(options)?;
        model.fit(samples)?;
        Ok(model.is_trained().then_some((model, report)))
    }

    /// Replaces the training set with `samples` and trains now, whatever the warm-up
    /// threshold (still a no-op on samples without ranking information).
    pub fn fit(&mut self, samples: Vec<Sample>) -> Result<(), ModelError> {
        validate(&samples)?;
        self.samples = samples;
        self.booster = self.train()?;
        Ok(())
    }

    /// True once trees were trained (otherwise `predict` gives the analytic estimate).
    pub fn is_trained(&self) -> bool {
        self.booster.is_some()
    }

    /// The training set.
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    /// The options.
    pub fn options(&self) -> &GbdtOptions {
        &self.options
    }

    /// Writes the model (options, training set, trees) to a JSON file, atomically.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), ModelError> {
        let path = path.as_ref();
        let booster =
            match &self.booster {
                Some(b) => {
                    let bytes = b.save_json()?;
                    Some(String::from_utf8(bytes).map_err(|e| {
                        ModelError::Xgboost(format!("model JSON is not UTF-8: {e}"))
                    })?)
                }
                None => None,
            };
        let file = ModelFile {
            format: FILE_FORMAT.to_string(),
            version: FILE_VERSION,
            feature_names: FEATURE_NAMES.iter().map(|s| s.to_string()).collect(),
            options: self.options.clone(),
            booster,
            samples: self.samples.clone(),
        };
        let io = |e: std::io::Error| ModelError::Io {
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        let text = serde_json::to_vec(&file).map_err(|e| ModelError::Io {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        // Atomic, through a temporary of its own: never a half-written model, and never a
        // neighbouring file (`model.tmp`) overwritten or removed.
        tensortune_records::write_bytes_atomic(path, &text).map_err(io)
    }

    /// Reads a model written by [`GbdtModel::save`]. A file written for another feature
    /// layout is refused ([`ModelError::BadModelFile`]): its trees would read the wrong
    /// columns. A `rank:pairwise` model of file version 1 (trees over store rows) is
    /// retrained from its training set.
    pub fn load(path: impl AsRef<Path>) -> Result<GbdtModel, ModelError> {
        let path = path.as_ref();
        // serde and XGBoost quote what they reject as it was: keep the message one line.
        let bad = |m: String| ModelError::BadModelFile {
            path: path.to_path_buf(),
            message: tensortune_schedules::text::single_line(&m).into_owned(),
        };
        let text = std::fs::read(path).map_err(|e| ModelError::Io {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let file: ModelFile = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
        if file.format != FILE_FORMAT || !(1..=FILE_VERSION).contains(&file.version) {
            return Err(bad(format!(
                "format {} version {}, expected {FILE_FORMAT} version {FILE_VERSION}",
                file.format, file.version
            )));
        }
        if file.feature_names.len() != N_FEATURES
            || file
                .feature_names
                .iter()
                .zip(FEATURE_NAMES)
                .any(|(a, b)| a != b)
        {
            return Err(bad(
                "it was trained on another feature layout; retrain it from the records".into(),
            ));
        }
        validate(&file.samples).map_err(|e| bad(e.to_string()))?;
        file.options.check().map_err(|e| bad(e.to_string()))?;
        let columns = match file.options.objective {
            Objective::RankPairwise => N_PROGRAM_FEATURES,
            Objective::PackSumSquaredError => N_FEATURES,
        };
        let retrain =
            file.version < FILE_VERSION && file.options.objective == Objective::RankPairwise;
        let booster = match &file.booster {
            Some(_) if retrain => None,
            Some(json) => {
                super::booster_check::check_booster(json, columns).map_err(bad)?;
                let mut b = Booster::load_json(json.as_bytes()).map_err(|e| bad(e.to_string()))?;
                b.set_param("nthread", &file.options.threads.to_string())?;
                b.set_param("verbosity", "0")?;
                Some(b)
            }
            None => None,
        };
        let trained = file.booster.is_some();
        let mut model = GbdtModel {
            fallback: AnalyticModel::new(file.options.seed),
            options: file.options,
            samples: file.samples,
            booster,
        };
        if retrain && trained {
            // Trees of the old layout: train this version's from the same samples.
            model.booster = model.train()?;
        }
        Ok(model)
    }

    /// Trains on the current training set; `None` when it carries no ranking information.
    fn train(&self) -> Result<Option<Booster>, ModelError> {
        quiet_xgboost();
        let Some(data) = TrainingData::build(&self.samples, self.options.objective) else {
            return Ok(None);
        };
        let mut dtrain = DMatrix::from_dense(&data.rows, data.labels.len())?;
        dtrain.set_labels(&data.labels)?;
        dtrain.set_group(&data.groups)?;
        if let Some(w) = &data.weights {
            dtrain.set_weights(w)?;
        }
        let mut booster = Booster::new(&[&dtrain])?;
        let o = &self.options;
        let objective = match o.objective {
            // The gradient comes from `pack_sum_squared_error`; the built-in objective only
            // fixes the (identity) link. A zero base score keeps the sum of rows unbiased.
            Objective::PackSumSquaredError => "reg:squarederror",
            Objective::RankPairwise => "rank:pairwise",
        };
        let params = [
            ("verbosity", "0".to_string()),
            ("objective", objective.to_string()),
            ("base_score", "0".to_string()),
            ("tree_method", "hist".to_string()),
            ("max_depth", o.max_depth.to_string()),
            ("max_bin", o.max_bin.to_string()),
            ("eta", o.eta.to_string()),
            ("gamma", o.gamma.to_string()),
            ("min_child_weight", o.min_child_weight.to_string()),
            ("seed", o.seed.to_string()),
            ("nthread", o.threads.to_string()),
            ("disable_default_eval_metric", "1".to_string()),
        ];
        for (k, v) in &params {
            booster.set_param(k, v)?;
        }
        if o.objective == Objective::RankPairwise {
            // XGBoost's default pairs only involve each query's top 32 documents; the search
            // needs the whole order, so sample pairs uniformly instead.
            booster.set_param("lambdarank_pair_method", "mean")?;
            booster.set_param(
                "lambdarank_num_pair_per_sample",
                &o.pairs_per_sample.to_string(),
            )?;
        }
        for round in 0..o.rounds {
            match o.objective {
                Objective::PackSumSquaredError => {
                    booster.update_custom(&dtrain, pack_sum_squared_error)?
                }
                Objective::RankPairwise => booster.update(&dtrain, round as i32)?,
            }
        }
        Ok(Some(booster))
    }
}

impl CostModel for GbdtModel {
    /// Adds `samples` to the training set and, past the warm-up, retrains on all of it.
    fn update(&mut self, samples: &[Sample]) -> Result<(), ModelError> {
        validate(samples)?;
        self.samples.extend_from_slice(samples);
        if self.samples.len() >= self.options.warmup_samples {
            self.booster = self.train()?;
        }
        Ok(())
    }

    /// Informed once trained (before, its scores are the analytic estimate's).
    fn is_informed(&self) -> bool {
        self.is_trained()
    }

    /// Always: untrained, it scores with the analytic estimate.
    fn has_prior(&self) -> bool {
        true
    }

    /// Sums the trees' scores of each program's rows (0.0 for a program without stores);
    /// the analytic estimate while untrained.
    fn predict(&self, programs: &[ProgramFeatures]) -> Result<Vec<f64>, ModelError> {
        let Some(booster) = &self.booster else {
            return self.fallback.predict(programs);
        };
        if self.options.objective == Objective::RankPairwise {
            return predict_programs(booster, programs);
        }
        let rows: usize = programs.iter().map(|p| p.num_rows()).sum();
        if rows == 0 {
            return Ok(vec![0.0; programs.len()]);
        }
        let mut flat = Vec::with_capacity(rows * N_FEATURES);
        for p in programs {
            flat.extend_from_slice(p.as_flat());
        }
        let dmat = DMatrix::from_dense(&flat, rows)?;
        let scores = booster.predict(&dmat)?;
        if scores.len() != rows {
            return Err(ModelError::Xgboost(format!(
                "predicted {} values for {rows} rows",
                scores.len()
            )));
        }
        let mut out = Vec::with_capacity(programs.len());
        let mut at = 0;
        for p in programs {
            let n = p.num_rows();
            out.push(scores[at..at + n].iter().map(|&s| s as f64).sum());
            at += n;
        }
        Ok(out)
    }
}

/// `rank:pairwise`'s scores: the trees' score of each program's row
/// ([`ProgramFeatures::program_row`]).
fn predict_programs(
    booster: &Booster,
    programs: &[ProgramFeatures],
) -> Result<Vec<f64>, ModelError> {
    if programs.is_empty() {
        return Ok(Vec::new());
    }
    let mut flat = Vec::with_capacity(programs.len() * N_PROGRAM_FEATURES);
    for p in programs {
        flat.extend_from_slice(&p.program_row());
    }
    let dmat = DMatrix::from_dense(&flat, programs.len())?;
    let scores = booster.predict(&dmat)?;
    if scores.len() != programs.len() {
        return Err(ModelError::Xgboost(format!(
            "predicted {} values for {} programs",
            scores.len(),
            programs.len()
        )));
    }
    Ok(scores.into_iter().map(f64::from).collect())
}

/// The training set laid out for XGBoost.
struct TrainingData {
    /// Row-major features of every row (pack-sum: the stores' rows; pairwise: one row per
    /// program).
    rows: Vec<f32>,
    /// Per row: the normalized throughput of its program.
    labels: Vec<f32>,
    /// Rows per group (pack-sum: per program; pairwise: per workload).
    groups: Vec<u32>,
    /// Per group weights (pack-sum only: the program's normalized throughput).
    weights: Option<Vec<f32>>,
}

impl TrainingData {
    /// `None` when the samples cannot rank anything: fewer than two programs with rows, or
    /// one target value for all.
    fn build(samples: &[Sample], objective: Objective) -> Option<TrainingData> {
        let targets = normalized_targets(samples);
        let usable: Vec<usize> = (0..samples.len())
            .filter(|&i| samples[i].features.num_rows() > 0)
            .collect();
        if usable.len() < 2 {
            return None;
        }
        let first = targets[usable[0]];
        if usable.iter().all(|&i| targets[i] == first) {
            return None;
        }
        let mut order = usable;
        if objective == Objective::RankPairwise {
            // Query groups must be contiguous: order by workload, stable within one.
            order.sort_by(|&a, &b| samples[a].workload.cmp(&samples[b].workload));
            return Some(TrainingData::programs(samples, &targets, &order));
        }
        // Pack-sum: every store's row, one group (and weight) per program.
        let rows_total: usize = order.iter().map(|&i| samples[i].features.num_rows()).sum();
        let mut data = TrainingData {
            rows: Vec::with_capacity(rows_total * N_FEATURES),
            labels: Vec::with_capacity(rows_total),
            groups: Vec::new(),
            weights: None,
        };
        let mut weights = Vec::new();
        for &i in &order {
            let s = &samples[i];
            let n = s.features.num_rows();
            data.rows.extend_from_slice(s.features.as_flat());
            data.labels
                .extend(std::iter::repeat_n(targets[i] as f32, n));
            data.groups.push(n as u32);
            weights.push(targets[i] as f32);
        }
        data.weights = Some(weights);
        Some(data)
    }

    /// `rank:pairwise`'s training set: one row per program ([`ProgramFeatures::program_row`]),
    /// labelled with its normalized throughput, one query group per workload (`order` is
    /// sorted by workload).
    fn programs(samples: &[Sample], targets: &[f64], order: &[usize]) -> TrainingData {
        let mut data = TrainingData {
            rows: Vec::with_capacity(order.len() * N_PROGRAM_FEATURES),
            labels: Vec::with_capacity(order.len()),
            groups: Vec::new(),
            weights: None,
        };
        let mut prev_workload: Option<&str> = None;
        for &i in order {
            let s = &samples[i];
            data.rows.extend_from_slice(&s.features.program_row());
            data.labels.push(targets[i] as f32);
            match data.groups.last_mut() {
                Some(last) if prev_workload == Some(s.workload.as_str()) => *last += 1,
                _ => data.groups.push(1),
            }
            prev_workload = Some(s.workload.as_str());
        }
        data
    }
}

/// Sets XGBoost's global verbosity to errors only, once per process: otherwise it prints
/// warnings on stderr (e.g. that `XGDMatrixSetUIntInfo`, with which [`DMatrix::set_group`]
/// sets groups, is deprecated) in the middle of a tuning run's progress output.
fn quiet_xgboost() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // A failure only leaves the warnings on.
        let _ = xgboost::set_global_config(r#"{"verbosity": 0}"#);
    });
}

/// Throughput divided by the best throughput of the same workload (0 where all failed).
pub(crate) fn normalized_targets(samples: &[Sample]) -> Vec<f64> {
    let mut best: std::collections::HashMap<&str, f64> = std::collections::HashMap::new();
    for s in samples {
        let b = best.entry(s.workload.as_str()).or_insert(0.0);
        *b = b.max(s.throughput);
    }
    samples
        .iter()
        .map(|s| {
            let b = best.get(s.workload.as_str()).copied().unwrap_or(0.0);
            if b > 0.0 {
                s.throughput / b
            } else {
                0.0
            }
        })
        .collect()
}

/// Gradient and hessian of `sum_g w_g (sum_{r in g} pred_r - y_g)^2 / 2` per row, where `g`
/// runs over the DMatrix's groups (programs), `w_g` is the group weight and every row of a
/// group carries the label `y_g`. XGBoost calls this through a plain function pointer, so
/// an inconsistent matrix (which `TrainingData` never builds) gives zero gradients rather
/// than a panic.
fn pack_sum_squared_error(preds: &[f32], dtrain: &DMatrix) -> (Vec<f32>, Vec<f32>) {
    let n = preds.len();
    let zeros = || (vec![0.0; n], vec![0.0; n]);
    let (Ok(labels), Ok(weights), Ok(bounds)) =
        (dtrain.labels(), dtrain.weights(), dtrain.group_bounds())
    else {
        return zeros();
    };
    if labels.len() != n || bounds.last().map(|&b| b as usize) != Some(n) {
        return zeros();
    }
    let mut grad = vec![0.0f32; n];
    let mut hess = vec![0.0f32; n];
    for (g, w) in bounds.windows(2).enumerate() {
        let (lo, hi) = (w[0] as usize, w[1] as usize);
        if lo >= hi || hi > n {
            continue;
        }
        let weight = weights.get(g).copied().unwrap_or(1.0);
        let sum: f32 = preds[lo..hi].iter().sum();
        let residual = sum - labels[lo];
        for r in lo..hi {
            grad[r] = residual * weight;
            hess[r] = weight;
        }
    }
    (grad, hess)
}

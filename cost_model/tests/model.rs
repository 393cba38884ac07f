//! The cost models: learning a known ranking, save and load, and degenerate training sets.

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use tensortune_cost_model::metrics::pairwise_accuracy;
use tensortune_cost_model::{
    CostModel, GbdtModel, GbdtOptions, ModelError, Objective, ProgramFeatures, RandomModel, Sample,
    N_FEATURES,
};

const WORKLOAD: &str = "synthetic:N=1";

fn options(objective: Objective) -> GbdtOptions {
    GbdtOptions {
        objective,
        warmup_samples: 0,
        rounds: 100,
        threads: 2,
        ..GbdtOptions::default()
    }
}

/// Programs of one row whose true throughput is a known function of a few columns.
fn synthetic(n: usize, seed: u64) -> Vec<Sample> {
    synthetic_rows(n, seed, 1)
}

/// Programs of `1..=max_rows` rows whose true throughput is a known function of a few
/// columns, summed over the rows (as a program's cost sums over its stores); 40 columns are
/// random, the others 0.
fn synthetic_rows(n: usize, seed: u64, max_rows: usize) -> Vec<Sample> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let rows = rng.random_range(1..=max_rows);
            let mut flat = vec![0f32; rows * N_FEATURES];
            let mut value = 0.0f64;
            for r in 0..rows {
                let row = &mut flat[r * N_FEATURES..(r + 1) * N_FEATURES];
                for v in row.iter_mut().take(40) {
                    *v = rng.random_range(0.0..10.0);
                }
                let (a, b, c, d) = (row[3] as f64, row[17] as f64, row[30] as f64, row[5] as f64);
                value += 2.0 * a + (b - 5.0).powi(2) + if c > 5.0 { 8.0 } else { 0.0 } - 0.5 * d;
            }
            Sample {
                features: ProgramFeatures::from_flat(flat).unwrap(),
                workload: WORKLOAD.into(),
                throughput: 1e9 * (value + 60.0).max(1.0),
            }
        })
        .collect()
}

fn accuracy_on_fresh_data(model: &GbdtModel, max_rows: usize) -> f64 {
    let test = synthetic_rows(300, 99, max_rows);
    let features: Vec<ProgramFeatures> = test.iter().map(|s| s.features.clone()).collect();
    let truth: Vec<f64> = test.iter().map(|s| s.throughput).collect();
    let pred = model.predict(&features).unwrap();
    pairwise_accuracy(&pred, &truth).unwrap()
}

#[test]
fn learns_a_synthetic_ranking() {
    let mut model = GbdtModel::new(options(Objective::PackSumSquaredError)).unwrap();
    // Untrained, it scores with the analytic estimate: a prior, not yet informed.
    assert!(model.has_prior() && !model.is_informed());
    model.update(&synthetic(600, 1)).unwrap();
    assert!(model.is_trained() && model.is_informed());
    let acc = accuracy_on_fresh_data(&model, 1);
    assert!(acc >= 0.9, "pack-sum: pairwise accuracy {acc}");
    // Measured 0.95 (pack-sum) and 0.95 (rank:pairwise over one row per program; 0.79 when
    // it scored each store's row).
    let mut model = GbdtModel::new(GbdtOptions {
        rounds: 50,
        ..options(Objective::RankPairwise)
    })
    .unwrap();
    model.update(&synthetic(600, 1)).unwrap();
    let acc = accuracy_on_fresh_data(&model, 1);
    assert!(acc >= 0.85, "rank:pairwise: pairwise accuracy {acc}");
    // The random model is near chance on the same data.
    let test = synthetic(300, 99);
    let features: Vec<ProgramFeatures> = test.iter().map(|s| s.features.clone()).collect();
    let truth: Vec<f64> = test.iter().map(|s| s.throughput).collect();
    let pred = RandomModel::new(5).predict(&features).unwrap();
    let acc = pairwise_accuracy(&pred, &truth).unwrap();
    assert!((0.4..0.6).contains(&acc), "random: {acc}");
}

#[test]
fn learns_sums_over_stores() {
    // Two-row programs: the trees score rows, the loss sees their sum (measured: 0.83).
    let mut model = GbdtModel::new(options(Objective::PackSumSquaredError)).unwrap();
    model.update(&synthetic_rows(600, 11, 2)).unwrap();
    let acc = accuracy_on_fresh_data(&model, 2);
    assert!(acc >= 0.75, "pack-sum, two rows: pairwise accuracy {acc}");
}

#[test]
fn ranks_programs_by_their_totals() {
    // Programs of one to three stores whose throughput sums a function of each store's
    // columns: rank:pairwise sees one row per program, its costliest store's and the sums
    // (measured: 0.87).
    let mut model = GbdtModel::new(options(Objective::RankPairwise)).unwrap();
    model.update(&synthetic_rows(600, 11, 3)).unwrap();
    assert!(model.is_trained());
    let acc = accuracy_on_fresh_data(&model, 3);
    assert!(
        acc >= 0.8,
        "rank:pairwise, up to three rows: pairwise accuracy {acc}"
    );
}

/// Version 1 files held `rank:pairwise` trees over store rows; such a file loads, and its
/// trees are trained anew from its samples in this version's layout.
#[test]
fn a_version_1_ranking_model_is_retrained_on_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.json");
    let samples = synthetic_rows(200, 5, 2);
    // Trees over store rows: what a version 1 rank:pairwise file carried.
    let mut rows = GbdtModel::new(options(Objective::PackSumSquaredError)).unwrap();
    rows.update(&samples).unwrap();
    rows.save(&path).unwrap();
    let mut file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    file["version"] = serde_json::json!(1);
    file["options"]["objective"] = serde_json::json!("rank-pairwise");
    std::fs::write(&path, serde_json::to_vec(&file).unwrap()).unwrap();
    let loaded = GbdtModel::load(&path).unwrap();
    assert!(loaded.is_trained());
    assert_eq!(loaded.samples().len(), 200);
    let mut fresh = GbdtModel::new(options(Objective::RankPairwise)).unwrap();
    fresh.update(&samples).unwrap();
    let probe: Vec<ProgramFeatures> = synthetic_rows(50, 6, 2)
        .into_iter()
        .map(|s| s.features)
        .collect();
    assert_eq!(
        loaded.predict(&probe).unwrap(),
        fresh.predict(&probe).unwrap(),
        "the retrained trees are a fresh fit's"
    );
    // The same file as version 2 names trees of the wrong layout: refused, not misread.
    file["version"] = serde_json::json!(2);
    std::fs::write(&path, serde_json::to_vec(&file).unwrap()).unwrap();
    let r = GbdtModel::load(&path);
    assert!(matches!(r, Err(ModelError::BadModelFile { .. })), "{r:?}");
    // A version this tool does not know yet is refused.
    file["version"] = serde_json::json!(3);
    std::fs::write(&path, serde_json::to_vec(&file).unwrap()).unwrap();
    let r = GbdtModel::load(&path);
    assert!(matches!(r, Err(ModelError::BadModelFile { .. })), "{r:?}");
}

#[test]
fn save_then_load_predicts_identically() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.json");
    for objective in Objective::ALL {
        let mut model = GbdtModel::new(options(objective)).unwrap();
        model.update(&synthetic(200, 2)).unwrap();
        model.save(&path).unwrap();
        let loaded = GbdtModel::load(&path).unwrap();
        assert!(loaded.is_trained());
        assert_eq!(loaded.samples().len(), 200);
        assert_eq!(loaded.options(), model.options());
        let probe: Vec<ProgramFeatures> =
            synthetic(50, 3).into_iter().map(|s| s.features).collect();
        let a = model.predict(&probe).unwrap();
        let b = loaded.predict(&probe).unwrap();
        assert_eq!(a, b, "{objective:?}");
    }
    // An untrained model round-trips too.
    let fresh = GbdtModel::new(GbdtOptions::default()).unwrap();
    fresh.save(&path).unwrap();
    assert!(!GbdtModel::load(&path).unwrap().is_trained());
}

#[test]
fn bad_model_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = GbdtModel::load(dir.path().join("nope.json"));
    assert!(matches!(missing, Err(ModelError::Io { .. })), "{missing:?}");
    let garbage = dir.path().join("garbage.json");
    std::fs::write(&garbage, "{ not json").unwrap();
    let r = GbdtModel::load(&garbage);
    assert!(matches!(r, Err(ModelError::BadModelFile { .. })), "{r:?}");
    // A valid file whose feature layout differs.
    let path = dir.path().join("m.json");
    GbdtModel::new(GbdtOptions::default())
        .unwrap()
        .save(&path)
        .unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replacen("float_mad", "float_fma", 1)).unwrap();
    let r = GbdtModel::load(&path);
    assert!(matches!(r, Err(ModelError::BadModelFile { .. })), "{r:?}");
    // A corrupted booster.
    let mut model = GbdtModel::new(options(Objective::PackSumSquaredError)).unwrap();
    model.update(&synthetic(20, 4)).unwrap();
    model.save(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let cut = text.find("\"booster\":\"").unwrap() + 20;
    std::fs::write(&path, format!("{}{}", &text[..cut], &text[cut + 40..])).unwrap();
    let r = GbdtModel::load(&path);
    assert!(matches!(r, Err(ModelError::BadModelFile { .. })), "{r:?}");
    // Options that would train for days (4 billion rounds, trees 1000 deep): refused when
    // loaded, where before the tuner hung in its first training.
    let saved = dir.path().join("ok.json");
    GbdtModel::new(GbdtOptions::default())
        .unwrap()
        .save(&saved)
        .unwrap();
    let text = std::fs::read_to_string(&saved).unwrap();
    for (from, to) in [
        ("\"rounds\":100", "\"rounds\":4294967295"),
        ("\"max_depth\":6", "\"max_depth\":1000"),
        ("\"max_bin\":32", "\"max_bin\":4294967295"),
        ("\"pairs_per_sample\":64", "\"pairs_per_sample\":4294967295"),
    ] {
        assert!(text.contains(from), "the saved file spells {from}");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
        let r = GbdtModel::load(&path);
        assert!(
            matches!(r, Err(ModelError::BadModelFile { .. })),
            "{to}: {r:?}"
        );
    }
    for bad in [
        GbdtOptions {
            rounds: u32::MAX,
            ..GbdtOptions::default()
        },
        GbdtOptions {
            threads: 1 << 20,
            ..GbdtOptions::default()
        },
    ] {
        assert!(matches!(
            GbdtModel::new(bad),
            Err(ModelError::InvalidOptions(_))
        ));
    }
}

#[test]
fn degenerate_training_sets_are_sound() {
    let one = synthetic(1, 5);
    for objective in Objective::ALL {
        // One program: nothing to rank; the model stays untrained and still answers.
        let mut model = GbdtModel::new(options(objective)).unwrap();
        model.update(&one).unwrap();
        assert!(!model.is_trained());
        assert_eq!(model.predict(&[one[0].features.clone()]).unwrap().len(), 1);

        // Constant targets: same.
        let mut constant = synthetic(30, 6);
        constant.iter_mut().for_each(|s| s.throughput = 5e9);
        let mut model = GbdtModel::new(options(objective)).unwrap();
        model.update(&constant).unwrap();
        assert!(!model.is_trained());

        // All failed (throughput 0): same.
        constant.iter_mut().for_each(|s| s.throughput = 0.0);
        let mut model = GbdtModel::new(options(objective)).unwrap();
        model.update(&constant).unwrap();
        assert!(!model.is_trained());
    }
    // NaN, infinite or negative throughputs: a clear error, and nothing is added.
    for bad in [f64::NAN, f64::INFINITY, -1.0] {
        let mut samples = synthetic(10, 7);
        samples[4].throughput = bad;
        let mut model = GbdtModel::new(options(Objective::PackSumSquaredError)).unwrap();
        let r = model.update(&samples);
        assert!(
            matches!(r, Err(ModelError::InvalidThroughput { index: 4, .. })),
            "{bad}: {r:?}"
        );
        assert!(model.samples().is_empty());
        let mut random = RandomModel::new(0);
        assert!(random.update(&samples).is_err());
    }
    // Programs without rows score 0; an empty batch predicts nothing.
    let mut model = GbdtModel::new(options(Objective::PackSumSquaredError)).unwrap();
    model.update(&synthetic(50, 8)).unwrap();
    let empty = ProgramFeatures::from_flat(Vec::new()).unwrap();
    assert_eq!(
        model.predict(std::slice::from_ref(&empty)).unwrap(),
        vec![0.0]
    );
    assert!(model.predict(&[]).unwrap().is_empty());
    // A training set of only empty programs is a no-op too.
    let mut model = GbdtModel::new(options(Objective::PackSumSquaredError)).unwrap();
    let empties: Vec<Sample> = (0..5)
        .map(|i| Sample {
            features: empty.clone(),
            workload: WORKLOAD.into(),
            throughput: i as f64,
        })
        .collect();
    model.update(&empties).unwrap();
    assert!(!model.is_trained());
}

#[test]
fn warmup_waits_for_enough_samples() {
    let mut model = GbdtModel::new(GbdtOptions {
        warmup_samples: 100,
        rounds: 20,
        threads: 2,
        ..GbdtOptions::default()
    })
    .unwrap();
    let data = synthetic(120, 9);
    model.update(&data[..60]).unwrap();
    assert!(!model.is_trained());
    model.update(&data[60..]).unwrap();
    assert!(model.is_trained());
    assert_eq!(model.samples().len(), 120);
}

#[test]
fn invalid_options_are_refused() {
    for o in [
        GbdtOptions {
            rounds: 0,
            ..GbdtOptions::default()
        },
        GbdtOptions {
            eta: f64::NAN,
            ..GbdtOptions::default()
        },
        GbdtOptions {
            max_depth: 0,
            ..GbdtOptions::default()
        },
        GbdtOptions {
            max_bin: 1,
            ..GbdtOptions::default()
        },
    ] {
        assert!(matches!(
            GbdtModel::new(o),
            Err(ModelError::InvalidOptions(_))
        ));
    }
}

#[test]
fn random_model_is_seeded() {
    let programs: Vec<ProgramFeatures> =
        synthetic(10, 10).into_iter().map(|s| s.features).collect();
    let a = RandomModel::new(3).predict(&programs).unwrap();
    let b = RandomModel::new(3).predict(&programs).unwrap();
    let c = RandomModel::new(4).predict(&programs).unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert!(a.iter().all(|x| (0.0..1.0).contains(x)));
}

/// Found by `fuzz_model`: a model file whose sample held part of a row (or a value too large
/// for `f32`) loaded, breaking the features' invariant; and an objective name with a line
/// break made a two-line error.
#[test]
fn model_files_are_checked_like_features_and_fail_on_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.json");
    let mut model = GbdtModel::new(options(Objective::PackSumSquaredError)).unwrap();
    model.update(&synthetic(4, 5)).unwrap();
    model.save(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let mut file: serde_json::Value = serde_json::from_str(&text).unwrap();
    let damaged = [
        serde_json::json!([1.0]),
        serde_json::json!(vec![1e300; N_FEATURES]),
    ];
    for bad in damaged {
        file["samples"][0]["features"]["values"] = bad;
        std::fs::write(&path, file.to_string()).unwrap();
        let r = GbdtModel::load(&path);
        assert!(matches!(r, Err(ModelError::BadModelFile { .. })), "{r:?}");
    }
    let renamed = text.replace("\"pack-sum-squared-error\"", "\"pack\\nsum\"");
    assert_ne!(renamed, text, "the file names its objective");
    std::fs::write(&path, renamed).unwrap();
    let e = GbdtModel::load(&path).unwrap_err().to_string();
    assert!(e.contains("pack\\nsum") && !e.contains('\n'), "{e}");
}

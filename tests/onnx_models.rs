//! Whole models against ONNX Runtime: small models built with `onnx.helper`
//! (`tests/onnx/fixtures.py`: an MLP, a ResNet basic block with batch normalization, a
//! depthwise-separable block), and a real published CNN (PP-OCR's MobileNetV3 text-direction
//! classifier from the rapidocr-onnxruntime wheel, `tests/onnx/real_model.py`), imported,
//! tuned with a tiny budget and run with the tuned kernels.
//!
//! The expected outputs are ONNX Runtime's, computed by the scripts. Without Python, onnx and
//! onnxruntime (or the wheel, for the real model), each test says what is missing and passes:
//! `scripts/setup.sh --for-tests` installs them.

#[path = "onnx/common.rs"]
mod common;

use common::{npy, script, skip_without_onnx, tune_briefly, worst};
use std::path::Path;
use std::process::Command;
use tensortune::model::{LoadOptions, Model};

#[test]
fn small_models_match_onnx_runtime() {
    if skip_without_onnx() {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary folder");
    let status = Command::new("python3")
        .arg(script("fixtures.py"))
        .arg(dir.path())
        .status()
        .expect("python3 runs");
    assert!(status.success(), "fixtures.py failed");
    for name in ["mlp", "resnet_block", "depthwise_separable", "layout_mix"] {
        let model = Model::load(
            dir.path().join(format!("{name}.onnx")),
            &LoadOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let x = npy(&dir.path().join(format!("{name}.input.npy")));
        let want = npy(&dir.path().join(format!("{name}.expected.npy")));
        let got = model
            .run(&[x.view()])
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let w = worst(&got[0], &want, 1e-4, 1e-3);
        println!(
            "{name}: {} tasks, worst error {w:.3} of the tolerance",
            model.tasks().len()
        );
        assert!(
            w <= 1.0,
            "{name}: differs from ONNX Runtime ({w} times the tolerance)"
        );
    }
}

#[test]
fn a_real_cnn_tuned_briefly_matches_onnx_runtime() {
    let wheels = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-data");
    if skip_without_onnx() {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary folder");
    let out = Command::new("python3")
        .arg(script("real_model.py"))
        .arg(&wheels)
        .arg(dir.path())
        .output()
        .expect("python3 runs");
    if out.status.code() == Some(3) {
        eprintln!("skipped: the rapidocr-onnxruntime 1.4.4 wheel is not in target/test-data (scripts/setup.sh --for-tests downloads it)");
        return;
    }
    assert!(
        out.status.success(),
        "real_model.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.path().join("cls.onnx");
    let mut opts = LoadOptions::default();
    opts.import
        .input_shapes
        .insert("x".into(), vec![1, 3, 48, 192]);
    let plan = tensortune::model::plan_file(&path, &opts.import).expect("the model imports");
    // A tiny budget: one round of two candidates for a few of the tasks.
    let db = dir.path().join("cls.db");
    let tuned = tune_briefly(&plan, &db);
    assert!(tuned >= 1, "no task got a valid program");
    opts.db = Some(db);
    let model = Model::load(&path, &opts).expect("the model loads");
    let from_records = model
        .tasks()
        .iter()
        .filter(|t| matches!(t.source, tensortune::build::Source::Record { .. }))
        .count();
    assert!(from_records >= 1, "no task runs a tuned record");
    let x = npy(&dir.path().join("cls.input.npy"));
    let got = model.run(&[x.view()]).expect("the model runs");
    let probs = worst(
        &got[0],
        &npy(&dir.path().join("cls.expected.npy")),
        1e-4,
        1e-3,
    );
    let logits = worst(
        &got[1],
        &npy(&dir.path().join("cls.logits.npy")),
        1e-3,
        1e-3,
    );
    println!(
        "cls: {} tasks ({from_records} from records), probabilities {:?}, worst errors {probs:.3} and {logits:.3} of the tolerance",
        model.tasks().len(),
        got[0].as_slice()
    );
    assert!(probs <= 1.0 && logits <= 1.0, "differs from ONNX Runtime");
}

// Shared by the tests that check whole models against ONNX Runtime (tests/onnx_models.rs,
// tests/build_model.rs): Python's presence, the fixture scripts, `.npy` files, tolerances.

use std::path::{Path, PathBuf};
use std::process::Command;
use tensortune::model::{tune_model, Plan};
use tensortune::ndarray::ArrayD;
use tensortune::{Target, TuneOptions};

/// Whether python3 imports onnx, onnxruntime and numpy.
pub fn python_has_onnx() -> bool {
    Command::new("python3")
        .args(["-c", "import onnx, onnxruntime, numpy"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// True, after saying why, where python3 lacks onnx, onnxruntime or numpy: the caller's test
/// then passes without running.
pub fn skip_without_onnx() -> bool {
    if python_has_onnx() {
        return false;
    }
    eprintln!(
        "skipped: python3 with onnx, onnxruntime and numpy is needed (scripts/setup.sh --for-tests)"
    );
    true
}

/// The path of a script of tests/onnx.
pub fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/onnx")
        .join(name)
}

/// An f32 `.npy` file.
pub fn npy(path: &Path) -> ArrayD<f32> {
    tensortune::npy::read::<f32>(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The largest `|got - want| / (atol + rtol·|want|)`: at most 1 is within tolerance.
pub fn worst(got: &ArrayD<f32>, want: &ArrayD<f32>, atol: f32, rtol: f32) -> f32 {
    assert_eq!(got.shape(), want.shape());
    got.iter()
        .zip(want.iter())
        .map(|(g, w)| (g - w).abs() / (atol + rtol * w.abs()))
        .fold(0.0, f32::max)
}

/// Tunes `plan` into `db` with a tiny budget (one round of two candidates for a few tasks);
/// how many tasks got a valid program.
pub fn tune_briefly(plan: &Plan, db: &Path) -> usize {
    let tune = TuneOptions {
        trials: 8,
        batch_size: 2,
        db: Some(db.to_path_buf()),
        quiet: true,
        remeasure_top: 0,
        ..TuneOptions::default()
    };
    tune_model(plan, &Target::host(1), &tune)
        .expect("tuning runs")
        .iter()
        .filter(|r| r.best_latency_s.is_some())
        .count()
}

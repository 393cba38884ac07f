//! ONNX's own node conformance tests, as the `onnx` wheel ships them
//! (`onnx/backend/test/data/node/test_*`, up to onnx 1.19): for every test whose nodes are
//! all of ops the importer supports, the model runs through the importer and the executor
//! (default schedules) on the test's inputs, and each output must match the test's within
//! ONNX's own tolerance (`|got - want| <= 1e-7 + 1e-3·|want|`, NaN matching NaN).
//!
//! A test the importer refuses (an attribute, an input type, a rank it does not support) is
//! skipped and printed with the importer's reason; any other failure fails the test. The
//! list of tests run, passed and skipped is printed (`--nocapture` to see it). Without Python
//! and onnx 1.19 or older, the test says so and passes.

use std::path::{Path, PathBuf};
use std::process::Command;
use tensortune::model::{LoadOptions, Model};
use tensortune::ndarray::ArrayD;
use tensortune_model::graph::Data;
use tensortune_model::{ImportOptions, ModelError};

/// The node tests' folder of the installed onnx package, if any.
fn node_tests() -> Option<PathBuf> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import onnx, os; print(os.path.dirname(onnx.__file__))",
        ])
        .output()
        .ok()?;
    let dir =
        PathBuf::from(String::from_utf8(out.stdout).ok()?.trim()).join("backend/test/data/node");
    dir.is_dir().then_some(dir)
}

/// Float inputs of node tests that models hold as initializers: `Resize`'s scales and roi,
/// `Pad`'s constant value.
const AT_IMPORT: &[&str] = &["scales", "roi", "constant_value", "value"];

fn supported(op: &str) -> bool {
    tensortune_model::ops::ANCHOR_OPS.contains(&op)
        || tensortune_model::ew::is_elementwise(op)
        || tensortune_model::layout::is_layout(op)
        || op == "Constant"
}

/// What happened to one node test.
enum Outcome {
    Passed,
    Skipped(String),
    Failed(String),
}

fn read_tensor(path: &Path) -> Result<Data, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    tensortune_model::tensor::decode_tensor(&bytes).map_err(|e| e.to_string())
}

fn numbered(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    (0..)
        .map(|i| dir.join(format!("{prefix}_{i}.pb")))
        .take_while(|p| p.exists())
        .collect()
}

fn close(got: &ArrayD<f32>, want: &[f32]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("{} elements, want {}", got.len(), want.len()));
    }
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= 1e-7 + 1e-3 * w.abs();
        if !ok {
            return Some(format!("element {i}: {g} where the test wants {w}"));
        }
    }
    None
}

fn run_case(dir: &Path) -> Outcome {
    let bytes = match std::fs::read(dir.join("model.onnx")) {
        Ok(b) => b,
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    for set in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let set = set.path();
        if !set.is_dir() {
            continue;
        }
        let inputs: Result<Vec<Data>, String> = numbered(&set, "input")
            .iter()
            .map(|p| read_tensor(p))
            .collect();
        let inputs = match inputs {
            Ok(i) => i,
            Err(e) => return Outcome::Skipped(format!("input data: {e}")),
        };
        // Inputs the importer needs at import (integer tensors: shapes, axes, pads; the
        // float scales and roi of Resize, Pad's value) are bound as constants, as a model
        // would have them as initializers; the rest are run-time inputs.
        let names = tensortune_model::import::input_names(&bytes).unwrap_or_default();
        let mut import = ImportOptions::default();
        let mut arrays = Vec::new();
        for (n, d) in names.iter().zip(inputs) {
            match d {
                Data::F32(a) if !AT_IMPORT.contains(&n.as_str()) => {
                    import.input_shapes.insert(n.clone(), a.shape().to_vec());
                    arrays.push(a);
                }
                d => {
                    import.constants.insert(n.clone(), d);
                }
            }
        }
        let opts = LoadOptions {
            import,
            ..LoadOptions::default()
        };
        let model = match Model::from_bytes(&bytes, &opts) {
            Ok(m) => m,
            Err(tensortune::model::Error::Import(
                e @ (ModelError::Unsupported { .. }
                | ModelError::InputShape { .. }
                | ModelError::Malformed(_)),
            )) => return Outcome::Skipped(e.to_string()),
            Err(e) => return Outcome::Failed(e.to_string()),
        };
        let views: Vec<_> = arrays.iter().map(|a| a.view()).collect();
        let got = match model.run(&views) {
            Ok(g) => g,
            Err(e) => return Outcome::Failed(e.to_string()),
        };
        for (k, p) in numbered(&set, "output").iter().enumerate() {
            let want = match read_tensor(p) {
                Ok(Data::F32(a)) => a,
                Ok(Data::I64(_)) => return Outcome::Skipped("an integer output".into()),
                Err(e) => return Outcome::Skipped(format!("output data: {e}")),
            };
            let Some(g) = got.get(k) else {
                return Outcome::Failed(format!("output {k} missing"));
            };
            if g.shape() != want.shape() {
                return Outcome::Failed(format!(
                    "output {k} has shape {:?}, want {:?}",
                    g.shape(),
                    want.shape()
                ));
            }
            let want: Vec<f32> = want.iter().copied().collect();
            if let Some(why) = close(g, &want) {
                return Outcome::Failed(format!("output {k}: {why}"));
            }
        }
    }
    Outcome::Passed
}

#[test]
fn onnx_node_tests_of_supported_ops_pass() {
    let Some(root) = node_tests() else {
        eprintln!("skipped: onnx's node tests not found (pip install 'onnx<1.20': later wheels do not ship them)");
        return;
    };
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    dirs.sort();
    let (mut passed, mut skipped, mut failed, mut other) = (0, Vec::new(), Vec::new(), 0);
    for dir in &dirs {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let ops = std::fs::read(dir.join("model.onnx"))
            .ok()
            .and_then(|b| tensortune_model::import::op_types(&b).ok())
            .unwrap_or_default();
        if ops.is_empty() || !ops.iter().all(|o| supported(o)) {
            other += 1;
            continue;
        }
        match run_case(dir) {
            Outcome::Passed => {
                passed += 1;
                println!("passed  {name}");
            }
            Outcome::Skipped(why) => {
                println!("skipped {name}: {why}");
                skipped.push(name);
            }
            Outcome::Failed(why) => {
                println!("FAILED  {name}: {why}");
                failed.push(format!("{name}: {why}"));
            }
        }
    }
    println!(
        "onnx node tests of supported ops: {} run, {passed} passed, {} skipped, {} failed ({other} tests of other ops not run)",
        passed + failed.len(),
        skipped.len(),
        failed.len()
    );
    assert!(
        passed > 100,
        "only {passed} node tests passed: is the folder right?"
    );
    assert!(
        failed.is_empty(),
        "{} node tests failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

//! Compile-time reuse of a whole model: `Build::model` turns ONNX files and a records database
//! into a static library and a module with `run(inputs) -> outputs` per model; a program
//! compiled from it by `rustc` alone (no tensortune, no LLVM, no ONNX parser) runs each
//! network and matches ONNX Runtime.
//!
//! The models: the fixtures of `tests/onnx/fixtures.py` (an MLP, a ResNet block, a
//! depthwise-separable block, and layout ops between convolutions), one of them tuned briefly
//! so that its kernels come from records, and the published PP-OCR classifier of
//! `tests/onnx/real_model.py` where its wheel is at hand. Without Python, onnx and onnxruntime
//! the test says so and passes (`scripts/setup.sh --for-tests` installs them).

#[path = "../examples/common/built_program.rs"]
mod built_program;
#[path = "onnx/common.rs"]
mod common;

use common::{npy, script, skip_without_onnx, tune_briefly, worst};
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use tensortune::build::{Build, ModelSource, ReuseError, Source};
use tensortune::ndarray::{ArrayD, IxDyn};

fn write_f32(path: &Path, a: &ArrayD<f32>) {
    let bytes: Vec<u8> = a.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(path, bytes).expect("write input");
}

/// A raw f32 file, shaped like `like`.
fn read_f32(path: &Path, like: &ArrayD<f32>) -> ArrayD<f32> {
    let v: Vec<f32> = std::fs::read(path)
        .expect("read output")
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    ArrayD::from_shape_vec(IxDyn(like.shape()), v).expect("as many elements as expected")
}

/// A program that runs model `NAME` of the generated module on `IN.bin` (raw f32), twice
/// (the second run reuses the buffers of the first and must agree exactly), and writes
/// output `k` to `OUT.k.bin`; it refuses an input of the wrong length.
fn main_rs(models: &[&str]) -> String {
    let mut arms = String::new();
    for m in models {
        let _ = writeln!(
            arms,
            "        {m:?} => (tuned::{m}::run(&[&x]), tuned::{m}::run(&[&x]), tuned::{m}::run(&[&x[1..]]).is_err(), tuned::{m}::tasks()),"
        );
    }
    format!(
        r#"include!(concat!(env!("OUT_DIR"), "/tuned.rs"));
fn main() {{
    let args: Vec<String> = std::env::args().collect();
    let bytes = std::fs::read(&args[2]).expect("input");
    let x: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let (first, second, refused, tasks) = match args[1].as_str() {{
{arms}        other => panic!("no model {{other}}"),
    }};
    let first = first.expect("first run");
    assert_eq!(first, second.expect("second run"), "a second run differs");
    assert!(refused, "a short input was accepted");
    for (k, out) in first.iter().enumerate() {{
        let bytes: Vec<u8> = out.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(format!("{{}}.{{k}}.bin", args[3]), bytes).expect("output");
    }}
    let tuned = tasks.iter().filter(|t| t.source.starts_with("record")).count();
    println!("{{}} tasks, {{tuned}} from records", tasks.len());
}}
"#
    )
}

#[test]
fn built_models_run_without_llvm_and_match_onnx_runtime() {
    if skip_without_onnx() {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary folder");
    let d = dir.path();
    let status = Command::new("python3")
        .arg(script("fixtures.py"))
        .arg(d)
        .status()
        .expect("python3 runs");
    assert!(status.success(), "fixtures.py failed");
    // (model, its outputs' expected files, atol, rtol)
    let mut models: Vec<(&str, Vec<&str>, f32)> = vec![
        ("mlp", vec!["mlp.expected.npy"], 1e-4),
        ("resnet_block", vec!["resnet_block.expected.npy"], 1e-4),
        (
            "depthwise_separable",
            vec!["depthwise_separable.expected.npy"],
            1e-4,
        ),
        ("layout_mix", vec!["layout_mix.expected.npy"], 1e-4),
    ];
    let wheels = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-data");
    let real = Command::new("python3")
        .arg(script("real_model.py"))
        .arg(&wheels)
        .arg(d)
        .output()
        .expect("python3 runs");
    match real.status.code() {
        Some(0) => models.push(("cls", vec!["cls.expected.npy", "cls.logits.npy"], 1e-3)),
        Some(3) => eprintln!("the rapidocr-onnxruntime 1.4.4 wheel is not in target/test-data: the published model is left out (scripts/setup.sh --for-tests downloads it)"),
        _ => panic!("real_model.py failed: {}", String::from_utf8_lossy(&real.stderr)),
    }

    // Tune the ResNet block briefly, so that some of its kernels come from records.
    let db = d.join("models.db");
    let plan = tensortune::model::plan_file(&d.join("resnet_block.onnx"), &Default::default())
        .expect("the block imports");
    tune_briefly(&plan, &db);

    let mut build = Build::new(&db).fallback(true).out_dir(d.join("out"));
    for (m, _, _) in &models {
        let mut src = ModelSource::new(d.join(format!("{m}.onnx")));
        if *m == "cls" {
            src = src.input_shape("x", &[1, 3, 48, 192]);
        }
        build = build.model_source(src);
    }
    let built = build.write().expect("the module builds");
    let block = &built
        .models
        .iter()
        .find(|(n, _)| n == "resnet_block")
        .expect("the block is built")
        .1;
    let from_records = block
        .iter()
        .filter(|(_, s)| matches!(s, Source::Record { .. }))
        .count();
    assert!(from_records >= 1, "no task of the block runs a record");

    let names: Vec<&str> = models.iter().map(|m| m.0).collect();
    let src = d.join("main.rs");
    std::fs::write(&src, main_rs(&names)).expect("write main.rs");
    let exe = built_program::compile_main(&d.join("out"), &src, &built.lib_name)
        .unwrap_or_else(|e| panic!("rustc: {e}"));

    for (m, expected, atol) in &models {
        let x = npy(&d.join(format!("{m}.input.npy")));
        write_f32(&d.join(format!("{m}.in.bin")), &x);
        let run = Command::new(&exe)
            .arg(m)
            .arg(d.join(format!("{m}.in.bin")))
            .arg(d.join(format!("{m}.out")))
            .output()
            .expect("the program runs");
        let stdout = String::from_utf8_lossy(&run.stdout);
        assert!(
            run.status.success(),
            "{m}: {stdout}{}",
            String::from_utf8_lossy(&run.stderr)
        );
        for (k, e) in expected.iter().enumerate() {
            let want = npy(&d.join(e));
            let got = read_f32(&d.join(format!("{m}.out.{k}.bin")), &want);
            let w = worst(&got, &want, *atol, 1e-3);
            println!(
                "{m}: {} output {k}: worst error {w:.3} of the tolerance",
                stdout.trim()
            );
            assert!(
                w <= 1.0,
                "{m}: output {k} differs from ONNX Runtime ({w} times the tolerance)"
            );
        }
    }

    let said = built_program::check_no_llvm(&exe, "tt_tuned_resnet_block_t0")
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{said}");
}

#[test]
fn a_model_that_does_not_import_fails_the_build_with_its_reason() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let db = dir.path().join("empty.db");
    drop(tensortune::records::Database::open(&db).expect("db"));
    let bad = dir.path().join("bad.onnx");
    std::fs::write(&bad, b"not a model").expect("write");
    let err = Build::new(&db)
        .fallback(true)
        .out_dir(dir.path().join("out"))
        .model(&bad)
        .write()
        .expect_err("a file that is not ONNX");
    assert!(
        matches!(err, ReuseError::Model { user: true, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("bad.onnx"), "{err}");

    // A model named like a kernel of the same module is refused before anything compiles.
    let good = dir.path().join("m.onnx");
    std::fs::write(&good, tensortune::model::testing::mlp_bytes()).expect("write");
    let err = Build::new(&db)
        .fallback(true)
        .out_dir(dir.path().join("out"))
        .model_source(ModelSource::new(&good).name("ffi"))
        .write()
        .expect_err("a reserved name");
    assert!(err.to_string().contains("`ffi`"), "{err}");
}

/// A model built without Python: the MLP that `tensortune_model::testing` writes, whose
/// result is known in closed form; with no records at all and no fallback the build fails.
#[test]
fn a_model_without_records_needs_fallback() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let db = dir.path().join("empty.db");
    drop(tensortune::records::Database::open(&db).expect("db"));
    let path = dir.path().join("mlp.onnx");
    std::fs::write(&path, tensortune::model::testing::mlp_bytes()).expect("write");
    let err = Build::new(&db)
        .out_dir(dir.path().join("out"))
        .model(&path)
        .write()
        .expect_err("no records, no fallback");
    assert!(matches!(err, ReuseError::NoTarget { .. }), "{err:?}");
    let built = Build::new(&db)
        .fallback(true)
        .out_dir(dir.path().join("out"))
        .model(&path)
        .write()
        .expect("with fallback");
    assert_eq!(built.models.len(), 1);
    assert!(built.models[0]
        .1
        .iter()
        .all(|(_, s)| matches!(s, Source::Default)));
    let text = std::fs::read_to_string(&built.module).expect("module");
    assert!(text.contains("pub mod mlp {"), "{text}");
}

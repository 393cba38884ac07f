//! A whole ONNX model built into a program (`tensortune::build::Build::model`) and timed: the
//! module is generated from a records database, compiled by `rustc` alone, and run on an
//! input `.npy` file; it prints the median end-to-end latency, the slowest steps, and writes
//! the first output as raw f32 for a comparison.
//!
//! `cargo run --release --example model_build -- --model cls.onnx --db cls.db
//! --input-shape x=1x3x48x192 --inputs x.npy --repeat 50 --out target/model-build`
//!
//! benches/onnx_floor.sh runs it beside `run-model` and ONNX Runtime.

#[path = "common/args.rs"]
mod args;
#[path = "common/built_program.rs"]
mod built_program;

use std::path::PathBuf;
use std::process::Command;
use tensortune::build::{Build, ModelSource, Source};

/// Runs `model` on the raw f32 input file: `calls` warm-up runs, then `calls` timed; prints
/// the median latency in seconds, then (from as many runs timed step by step) the sum of
/// the steps' medians and the five slowest steps, then writes output 0.
const MAIN: &str = r#"
include!(concat!(env!("OUT_DIR"), "/tuned.rs"));
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let calls: usize = args[1].parse().expect("calls");
    let bytes = std::fs::read(&args[2]).expect("input");
    let x: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let mut m = tuned::MODEL::load().expect("load");
    let mut times = Vec::with_capacity(calls);
    let mut out = Vec::new();
    for round in 0..2 {
        for _ in 0..calls {
            let t = std::time::Instant::now();
            out = m.run(&[&x]).expect("run");
            if round == 1 {
                times.push(t.elapsed().as_secs_f64());
            }
        }
    }
    println!("{}", median(times));
    let mut per_step: Vec<(&str, Vec<f64>)> = Vec::new();
    for _ in 0..calls {
        let (_, steps) = m.run_timed(&[&x]).expect("run");
        for (i, (name, s)) in steps.into_iter().enumerate() {
            if per_step.len() <= i {
                per_step.push((name, Vec::new()));
            }
            per_step[i].1.push(s);
        }
    }
    let mut medians: Vec<(&str, f64)> = per_step.into_iter().map(|(n, v)| (n, median(v))).collect();
    let total: f64 = medians.iter().map(|m| m.1).sum();
    println!("  {:>8.1} us  sum of the {} steps' medians", total * 1e6, medians.len());
    medians.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (name, s) in medians.iter().take(5) {
        println!("  {:>8.1} us  {name}", s * 1e6);
    }
    let bytes: Vec<u8> = out[0].iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(&args[3], bytes).expect("output");
}
"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model: PathBuf = args::arg("--model", PathBuf::from("cls.onnx"));
    let db: PathBuf = args::arg("--db", PathBuf::from("cls.db"));
    let inputs: PathBuf = args::arg("--inputs", PathBuf::from("x.npy"));
    let shape: String = args::arg("--input-shape", String::new());
    let repeat: usize = args::arg("--repeat", 50).max(1);
    let out: PathBuf = args::arg("--out", PathBuf::from("target/model-build"));
    let mut src = ModelSource::new(&model).name("net");
    if !shape.is_empty() {
        let (name, dims) = tensortune::model::parse_input_shape(&shape)?;
        src = src.input_shape(name, &dims);
    }
    let built = Build::new(&db)
        .fallback(true)
        .model_source(src)
        .out_dir(&out)
        .write()?;
    let tuned = built.models[0]
        .1
        .iter()
        .filter(|(_, s)| matches!(s, Source::Record { .. }))
        .count();
    println!(
        "built {} tasks ({tuned} from records of {})",
        built.models[0].1.len(),
        db.display()
    );
    let main = out.join("main.rs");
    std::fs::write(&main, MAIN.replace("MODEL", "net"))?;
    let exe = built_program::compile_main(&out, &main, &built.lib_name)?;
    let x = tensortune::npy::read::<f32>(&inputs)?;
    let raw: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let input_bin = out.join("input.bin");
    std::fs::write(&input_bin, raw)?;
    let run = Command::new(&exe)
        .arg(repeat.to_string())
        .arg(&input_bin)
        .arg(out.join("output0.bin"))
        .output()?;
    if !run.status.success() {
        return Err(String::from_utf8_lossy(&run.stderr).into_owned().into());
    }
    let text = String::from_utf8_lossy(&run.stdout);
    let mut lines = text.lines();
    let median: f64 = lines.next().unwrap_or("nan").parse()?;
    println!(
        "built program: end-to-end latency {:.3} ms (median of {repeat}); slowest steps:",
        median * 1e3
    );
    for l in lines {
        println!("{l}");
    }
    println!("output 0 written to {}", out.join("output0.bin").display());
    Ok(())
}

//! What the compiler made of each record's innermost loop, as CSV beside `feature_rows`'s
//! rows: for trying whether the compiled micro-kernel ranks programs better than the cost
//! model's features of the loop IR (`scripts/ranking_replica.py --extra`).
//!
//! Each record that `feature_rows` writes a row for (the same records in the same order: the
//! host CPU's one-thread target, those that replay) is compiled as `tensortune tune` compiles
//! it, and its assembly's hottest loop is found: the basic block that branches back to itself
//! with the most FMA instructions. Its row: the FMAs, the stores from vector registers
//! (`vmov*` to memory: none where the accumulators stay in registers across the loop), the
//! instructions with a memory operand, the instructions, and, with `--mca TOOL` (an `llvm-mca` of LLVM 19, for instance
//! `llvm-mca-19`), the cycles per iteration and the block's reciprocal throughput that tool
//! computes for the host's CPU model (`-mcpu`), 0 where it fails. A record without such a
//! loop (no FMA in a loop) or that does not compile gets zeros.
//!
//! `cargo run --release --example hot_loops -- tuning.db PREFIX [--mca llvm-mca-19]` writes
//! `PREFIX.hot.csv` (written beside its name and renamed into place). About 20 ms a record to
//! compile and as much again for `llvm-mca`.

use std::fmt::Write as _;
use std::process::Command;
use tensortune::codegen::llvm::emit_asm;
use tensortune::codegen::{CodegenOptions, HostTarget};
use tensortune::records::Database;
use tensortune::schedules::lower::lower;
use tensortune::schedules::trace::Trace;
use tensortune::{Target, WorkloadSpec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (db, prefix, mca) = match args.as_slice() {
        [db, prefix] => (db, prefix, None),
        [db, prefix, flag, tool] if flag == "--mca" => (db, prefix, Some(tool.as_str())),
        _ => return Err("usage: hot_loops DB PREFIX [--mca LLVM_MCA]".into()),
    };
    let key = Target::host(1).target_key().to_string();
    let cpu = &HostTarget::host().cpu;
    let db = Database::open_read_only(db)?;
    let opts = CodegenOptions::default();
    let mut out = String::new();
    let (mut rows, mut without) = (0usize, 0usize);
    for info in db.workloads()? {
        let records = db.records(&info.workload.key, &key)?;
        let Some(dag) = WorkloadSpec::parse(&info.workload.key)
            .ok()
            .and_then(|s| s.build().ok())
        else {
            continue;
        };
        for r in &records {
            // `samples_from_records` keeps exactly the records whose trace parses, replays and
            // lowers, so that row i here is row i there.
            let Some(func) = Trace::from_json(&r.trace_json)
                .ok()
                .and_then(|t| t.replay(&dag).ok())
                .and_then(|s| lower(&s).ok())
            else {
                continue;
            };
            let asm = emit_asm(&func, &opts).ok();
            let hot = asm.as_deref().and_then(hottest_loop);
            let mut row = [0.0f64; 6];
            if let Some(h) = &hot {
                row[0] = h.fmas as f64;
                row[1] = h.vector_stores as f64;
                row[2] = h.memory_operands as f64;
                row[3] = h.instructions as f64;
                if let Some(tool) = mca {
                    if let Some((cycles, rthroughput)) = run_mca(tool, cpu, &h.text) {
                        row[4] = cycles;
                        row[5] = rthroughput;
                    }
                }
            } else {
                without += 1;
            }
            writeln!(
                out,
                "{}",
                row.iter()
                    .map(|v| v.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            )?;
            rows += 1;
        }
    }
    let path = format!("{prefix}.hot.csv");
    let tmp = format!("{path}.tmp");
    std::fs::write(&tmp, out)?;
    std::fs::rename(&tmp, &path)?;
    let _ = std::fs::remove_dir_all(mca_dir());
    eprintln!("{rows} rows ({without} without an FMA loop) to {path}");
    Ok(())
}

/// The hottest loop of a function's assembly.
struct HotLoop {
    fmas: usize,
    vector_stores: usize,
    memory_operands: usize,
    instructions: usize,
    /// The block's instructions, for `llvm-mca`.
    text: String,
}

/// The block that branches back to its own label with the most FMAs, from its label to that
/// branch (AT&T syntax, as LLVM prints it).
fn hottest_loop(asm: &str) -> Option<HotLoop> {
    let lines: Vec<&str> = asm.lines().collect();
    let mut best: Option<HotLoop> = None;
    for (i, line) in lines.iter().enumerate() {
        let Some(label) = line.strip_suffix(':').filter(|l| l.starts_with(".LBB")) else {
            continue;
        };
        let body: Vec<&str> = lines[i + 1..]
            .iter()
            .take_while(|l| !(l.starts_with(".LBB") && l.ends_with(':')))
            .map(|l| l.trim())
            .filter(|l| !l.is_empty() && !l.starts_with('.') && !l.starts_with('#'))
            .collect();
        let Some(end) = body
            .iter()
            .position(|l| l.starts_with('j') && l.ends_with(label))
        else {
            continue;
        };
        let body = &body[..=end];
        let fmas = body.iter().filter(|l| l.starts_with("vfmadd")).count();
        if fmas == 0 || best.as_ref().is_some_and(|b| b.fmas >= fmas) {
            continue;
        }
        // A store's source register comes first in AT&T syntax: `vmovups %zmm0, (%rax)`.
        let vector_stores = body
            .iter()
            .filter(|l| {
                l.starts_with("vmov") && l.rsplit(',').next().is_some_and(|d| d.contains('('))
            })
            .count();
        best = Some(HotLoop {
            fmas,
            vector_stores,
            memory_operands: body.iter().filter(|l| l.contains('(')).count(),
            instructions: body.len(),
            text: body.iter().map(|l| format!("{l}\n")).collect(),
        });
    }
    best
}

/// Where `llvm-mca`'s input is written, this process's own.
fn mca_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("hot_loops.{}", std::process::id()))
}

/// `llvm-mca`'s cycles per iteration (over 100 iterations) and block reciprocal throughput.
fn run_mca(tool: &str, cpu: &str, text: &str) -> Option<(f64, f64)> {
    let dir = mca_dir();
    std::fs::create_dir_all(&dir).ok()?;
    let file = dir.join("block.s");
    std::fs::write(&file, text).ok()?;
    let out = Command::new(tool)
        .arg(format!("-mcpu={cpu}"))
        .arg("-iterations=100")
        .arg(&file)
        .output()
        .ok()?;
    let report = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| -> Option<f64> {
        report
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
    };
    Some((
        field("Total Cycles:")? / 100.0,
        field("Block RThroughput:")?,
    ))
}

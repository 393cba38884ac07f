// Shared by examples/jit_vs_build.rs and tests/build_parallel.rs: one schedule of a workload
// built by `tensortune::build` into a program of its own, compiled by `rustc` alone, so that
// the JIT and what a build ships can be run side by side on the same inputs.

use std::path::{Path, PathBuf};
use std::process::Command;
use tensortune::build::{Build, Source};
use tensortune::records::{Database, NewRecord, Timing, Workload};
use tensortune::schedules::ops::WorkloadSpec;
use tensortune::schedules::schedule::State;
use tensortune::Target;

/// A matmul schedule with a parallel outer loop: rows in blocks of 4 (unrolled) across the
/// threads, columns in vectors of 16, the reduction between them.
#[allow(dead_code)]
pub fn parallel_matmul(spec: &WorkloadSpec) -> Result<State, String> {
    let dag = spec.build().map_err(|e| e.to_string())?;
    let mut s = State::new(&dag);
    let out = (s.stages().len() - 1) as u32;
    // [i, j, k] -> [io, ii, j, k] -> [io, ii, jo, ji, k] -> [io, jo, k, ii, ji]
    let mut steps = || -> Result<(), tensortune::schedules::schedule::ScheduleError> {
        s.split(out, 0, &[4])?;
        s.split(out, 2, &[16])?;
        s.reorder(out, &[0, 2, 4, 1, 3])?;
        s.vectorize(out, 4)?;
        s.unroll(out, 3)?;
        s.parallel(out, 0)
    };
    steps().map_err(|e| e.to_string())?;
    Ok(s)
}

/// A program built around the kernel of `state`: the record goes into a fresh database in
/// `dir` under the host target with `threads` threads, `tensortune::build` writes the library
/// and module into `dir`, and `rustc` compiles `main_rs` (which includes `tuned.rs` and may
/// name the kernel `KERNEL`) against them. The path of the program.
#[allow(dead_code)]
pub fn build_program(
    dir: &Path,
    spec: &WorkloadSpec,
    state: &State,
    threads: usize,
    main_rs: &str,
) -> Result<PathBuf, String> {
    let text = |e: &dyn std::fmt::Display| e.to_string();
    std::fs::create_dir_all(dir).map_err(|e| text(&e))?;
    let db_path = dir.join("records.db");
    let mut db = Database::open(&db_path).map_err(|e| text(&e))?;
    let timing = Timing {
        median_s: 1e-3,
        min_s: 1e-3,
        max_s: 1e-3,
        repeats: 1,
    };
    let record = NewRecord::measured(
        Workload::new(spec.canonical(), spec.flops()),
        Target::host(threads).key(),
        state.trace().to_json(),
        timing,
    );
    db.insert_batch(None, &[record]).map_err(|e| text(&e))?;
    drop(db);
    let built = Build::new(&db_path)
        .workload(spec.canonical())
        .threads(threads)
        .out_dir(dir)
        .write()
        .map_err(|e| text(&e))?;
    let Some((name, _, Source::Record { .. })) = built.kernels.first() else {
        return Err(format!(
            "the build did not use the record: {:?}",
            built.kernels
        ));
    };
    let main = dir.join("main.rs");
    std::fs::write(&main, main_rs.replace("KERNEL", name)).map_err(|e| text(&e))?;
    compile_main(dir, &main, &built.lib_name)
}

/// Compiles the program `main` (which includes `tuned.rs` from `dir`) with `rustc` alone
/// against the static library `lib_name` in `dir`; the path of the program, `dir/prog`.
#[allow(dead_code)]
pub fn compile_main(dir: &Path, main: &Path, lib_name: &str) -> Result<PathBuf, String> {
    // `include!` resolves a relative OUT_DIR against the source file's folder.
    let dir = &dir
        .canonicalize()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let exe = dir.join("prog");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(rustc)
        .args(["--edition", "2021", "-O", "-o"])
        .arg(&exe)
        .arg(main)
        .arg("-L")
        .arg(dir)
        .args(["-l", &format!("static={lib_name}"), "-l", "m"])
        .env("OUT_DIR", dir)
        .output()
        .map_err(|e| format!("rustc: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(exe)
}

/// Symbols of the LLVM libraries in `nm` output: its C API (`LLVM...`) and its C++ namespace
/// (`_ZN4llvm...`). Rust's own local symbols carry `.llvm.NNN` suffixes from ThinLTO; those
/// are not LLVM code.
#[allow(dead_code)]
pub fn llvm_symbols(nm: &str) -> Vec<String> {
    nm.lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter(|s| {
            s.starts_with("LLVM") || s.starts_with("_ZN4llvm") || s.starts_with("_ZNK4llvm")
        })
        .take(5)
        .map(str::to_string)
        .collect()
}

/// Checks that the program `exe` links no LLVM: it is a tenth of the size of the running
/// binary (which, as a test or example of tensortune, links LLVM), has no LLVM symbol, and
/// has `symbol` (where `nm` is installed). What it found, for a person.
#[allow(dead_code)]
pub fn check_no_llvm(exe: &Path, symbol: &str) -> Result<String, String> {
    let size = std::fs::metadata(exe).map_err(|e| e.to_string())?.len();
    let with_llvm = std::env::current_exe()
        .and_then(std::fs::metadata)
        .map_err(|e| e.to_string())?
        .len();
    let said = format!("program: {size} bytes; a binary linking LLVM: {with_llvm} bytes");
    if size * 10 >= with_llvm {
        return Err(said);
    }
    match Command::new("nm").arg(exe).output() {
        Ok(nm) if nm.status.success() => {
            let syms = String::from_utf8_lossy(&nm.stdout);
            let llvm = llvm_symbols(&syms);
            if !llvm.is_empty() {
                return Err(format!("LLVM symbols in the program: {llvm:?}"));
            }
            if !syms.contains(symbol) {
                return Err(format!("no symbol `{symbol}` in the program"));
            }
            Ok(said)
        }
        _ => Ok(format!("{said} (nm not available: symbols not checked)")),
    }
}

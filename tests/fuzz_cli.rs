//! The command line on a sample of mutated arguments and files: bad specs and targets,
//! damaged databases (random bytes, truncated or flipped SQLite), JSON-lines files with
//! mutated lines, damaged `.npy` inputs. Every invocation ends with status 0 or 2, never a
//! panic, an abort or a signal, and never hangs. Status 1 (an internal error of one line) is
//! let through but listed on stderr: each is a defect to fix, not a pass.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ndarray::{ArrayD, IxDyn};
use ndarray_npy::WriteNpyExt;
use tensortune::records::{Database, ErrorKind, NewRecord, Timing, Workload};
use tensortune_fuzzkit::{escape, Mutator};

/// Longer than any command here takes on tiny workloads, on a loaded machine.
const TIMEOUT: Duration = Duration::from_secs(60);

/// One finished invocation.
struct Outcome {
    status: Option<i32>,
    stderr: String,
}

/// Runs the binary with `args`, killing it past [`TIMEOUT`]. Stderr is drained by a thread
/// as it comes: an error quoting a long argument fills the pipe before the child exits.
fn invoke(args: &[String]) -> Result<Outcome, String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tensortune"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    let mut pipe = child.stderr.take().ok_or("no stderr pipe")?;
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = pipe.read_to_end(&mut text);
        text
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait().map_err(|e| format!("wait: {e}"))? {
            Some(status) => break status,
            None if start.elapsed() > TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("still running after {TIMEOUT:?}"));
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    let stderr = reader.join().map_err(|_| "the stderr reader panicked")?;
    Ok(Outcome {
        status: status.code(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    })
}

/// What an invocation must satisfy; `listed` names the prefix of the lines that may come
/// besides the one `tensortune:` error line (import lists its bad lines, each starting with
/// the file's name, before the error or, for `--strict`, indented after it).
fn judge(outcome: &Outcome, listed: Option<&str>) -> Result<Option<String>, String> {
    let err = &outcome.stderr;
    if ["panicked", "backtrace", "RUST_BACKTRACE"]
        .iter()
        .any(|w| err.contains(w))
    {
        return Err(format!("a panic: {err}"));
    }
    let (errors, others): (Vec<&str>, Vec<&str>) =
        err.lines().partition(|l| l.starts_with("tensortune: "));
    let stray = others
        .iter()
        .any(|l| listed.is_none_or(|prefix| !l.trim_start().starts_with(prefix)));
    match outcome.status {
        Some(0) if errors.is_empty() => Ok(None),
        Some(0..=2) if errors.len() != 1 || stray => {
            Err(format!("not one `tensortune:` error line: {err}"))
        }
        Some(0 | 2) => Ok(None),
        Some(1) if errors[0].starts_with("tensortune: internal error") => {
            Ok(Some(errors[0].to_string()))
        }
        Some(code) => Err(format!("exit status {code}: {err}")),
        None => Err(format!("killed by a signal: {err}")),
    }
}

/// Runs every case and fails with all the failures together; internal errors are listed on
/// stderr (see the module doc).
fn run_cases(cases: &[(Vec<String>, Option<String>)]) {
    let mut failures = Vec::new();
    let mut internal = Vec::new();
    for (args, listed) in cases {
        let shown = args
            .iter()
            .map(|a| escape(a.as_bytes()))
            .collect::<Vec<_>>()
            .join(" ");
        match invoke(args).and_then(|o| judge(&o, listed.as_deref())) {
            Ok(None) => {}
            Ok(Some(line)) => internal.push(format!("tensortune {shown}\n    {line}")),
            Err(why) => failures.push(format!("tensortune {shown}\n    {why}")),
        }
    }
    if !internal.is_empty() {
        eprintln!(
            "internal errors (defects, exit 1):\n{}",
            internal.join("\n")
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {} invocations failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// Mutated bytes as one argument: text, without the NUL an OS argument cannot hold.
fn arg_text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).replace('\0', "")
}

fn args(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

fn path_arg(flag: &str, path: &Path) -> String {
    format!("{flag}={}", path.display())
}

const WORKLOAD: &str = "matmul:K=4,M=2,N=3,dtype=f32";

/// A small database as a tuning run leaves it: a few timed records and a failure.
/// A timing of median `s`, its spread 10% either way, three repeats.
fn timing(s: f64) -> Timing {
    Timing {
        median_s: s,
        min_s: s * 0.9,
        max_s: s * 1.1,
        repeats: 3,
    }
}

fn sample_db(path: &Path) {
    let mut db = Database::open(path).expect("open");
    let w = Workload::new(WORKLOAD, 48.0);
    let traces = [
        r#"{"steps":[]}"#,
        r#"{"steps":[{"op":"split","stage":2,"iter":0,"factors":[2]}]}"#,
        r#"{"steps":[{"op":"annotate","stage":2,"iter":1,"annotation":"unroll"}]}"#,
    ];
    let mut batch: Vec<NewRecord> = traces
        .iter()
        .enumerate()
        .map(|(i, t)| {
            NewRecord::measured(
                w.clone(),
                "llvm -threads=1",
                *t,
                timing(1e-6 * (i + 1) as f64),
            )
        })
        .collect();
    batch.push(NewRecord::failed(
        w,
        "llvm -threads=1",
        r#"{"steps":[{"op":"compute_inline","stage":2}]}"#,
        ErrorKind::Compile,
        "does not inline",
    ));
    db.insert_batch(None, &batch).expect("insert");
}

fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

#[test]
fn mutated_specs_and_targets_never_crash_the_cli() {
    let dir = temp_dir();
    let db = dir.path().join("good.db");
    sample_db(&db);
    let mut specs = Mutator::new(
        1,
        &[
            b"matmul:M=2,N=3,K=4",
            b"reduce_sum:M=2,N=5",
            b"conv2d:N=1,C=2,H=4,W=4,K=2,R=3,S=3,pad=1",
            b"softmax:M=2,N=3,dtype=f64",
        ],
    )
    .tokens(&["dtype", "=f16", "stride=", "pad=", ",M=16777216"]);
    let mut targets = Mutator::new(
        2,
        &[b"llvm", b"llvm -threads=2", b"llvm -mcpu=znver4 -threads=1"],
    )
    .tokens(&["-threads=", "-mcpu=", "cuda"]);
    let mut cases = Vec::new();
    for _ in 0..20 {
        let spec = arg_text(&specs.next_input());
        cases.push((
            args(&["codegen", "--emit", "loop", &format!("--workload={spec}")]),
            None,
        ));
    }
    let best = |workload: String, target: Option<String>| {
        let mut command = vec![
            "best".to_string(),
            path_arg("--db", &db),
            format!("--workload={workload}"),
        ];
        command.extend(target.map(|t| format!("--target={t}")));
        (command, None)
    };
    for _ in 0..6 {
        cases.push(best(arg_text(&specs.next_input()), None));
        cases.push(best(
            WORKLOAD.to_string(),
            Some(arg_text(&targets.next_input())),
        ));
    }
    run_cases(&cases);
}

/// Records whose traces are well-formed and replay step by step but describe absurd programs:
/// a split into 5000 loops (lowering recursed once per loop, and every command that read the
/// database overflowed its stack: `show`, `codegen`, `run`, and `tune`, whose cost model
/// starts from every record of the target) and a chain of 126 rounded-up splits under an
/// unroll pragma (the nest's step count overflowed to zero, so 70 loops were unrolled and
/// LLVM compiled for minutes). Each command must end within the timeout, without a panic.
#[test]
fn hostile_traces_never_crash_or_hang_the_cli() {
    let dir = temp_dir();
    let path = dir.path().join("hostile.db");
    let target = tensortune::Target::host(1).key();
    let chain_workload = "matmul:K=8,M=128,N=8,dtype=f32";
    let deep = format!(
        r#"{{"steps":[{{"op":"split","stage":2,"iter":0,"factors":[{}]}}]}}"#,
        vec!["1"; 5000].join(",")
    );
    let mut steps: Vec<String> = (0..126)
        .map(|k| {
            format!(
                r#"{{"op":"split","stage":2,"iter":{k},"factors":[{}]}}"#,
                127 - k
            )
        })
        .collect();
    steps.push(r#"{"op":"auto_unroll","stage":2,"iter":0,"max_step":1}"#.to_string());
    let chain = format!(r#"{{"steps":[{}]}}"#, steps.join(","));
    {
        let mut db = Database::open(&path).expect("open");
        let timing = timing(1e-6);
        let batch = vec![
            NewRecord::measured(Workload::new(WORKLOAD, 48.0), &target, &deep, timing),
            NewRecord::measured(
                Workload::new(chain_workload, 16384.0),
                &target,
                &chain,
                timing,
            ),
        ];
        db.insert_batch(None, &batch).expect("insert");
    }
    let mut cases = Vec::new();
    for workload in [WORKLOAD, chain_workload] {
        let w = format!("--workload={workload}");
        cases.push((args(&["show", &path_arg("--db", &path), &w]), None));
        cases.push((
            args(&["codegen", "--emit", "llvm", &path_arg("--db", &path), &w]),
            None,
        ));
        cases.push((
            args(&[
                "run",
                &path_arg("--db", &path),
                &w,
                "--repeat=1",
                "--min-repeat-ms=1",
            ]),
            None,
        ));
    }
    cases.push((
        args(&[
            "report",
            &path_arg("--db", &path),
            &path_arg("--out", &dir.path().join("r.html")),
        ]),
        None,
    ));
    let copy = dir.path().join("tune.db");
    std::fs::copy(&path, &copy).expect("copy the database");
    cases.push((
        args(&[
            "tune",
            &format!("--workload={chain_workload}"),
            &path_arg("--db", &copy),
            "--trials=2",
            "-q",
        ]),
        None,
    ));
    run_cases(&cases);
}

#[test]
fn damaged_databases_never_crash_the_cli() {
    let dir = temp_dir();
    let good = dir.path().join("good.db");
    sample_db(&good);
    let bytes = std::fs::read(&good).expect("read the database");
    // Damage of the kinds a disk or a person makes: truncation, flipped bits, spliced pages,
    // and files that are no database at all.
    let mut damage = Mutator::new(3, &[&bytes]);
    let mut files: Vec<Vec<u8>> = vec![
        Vec::new(),
        b"SQLite format 3\0".to_vec(),
        bytes[..bytes.len() / 2].to_vec(),
        bytes[..100].to_vec(),
        (0..4096u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect(),
    ];
    files.extend((0..20).map(|_| damage.next_input()));
    let mut cases = Vec::new();
    for (i, file) in files.iter().enumerate() {
        let path = dir.path().join(format!("bad{i}.db"));
        std::fs::write(&path, file).expect("write");
        let command = match i % 5 {
            0 => vec!["records".into(), path_arg("--db", &path)],
            1 => vec![
                "best".into(),
                path_arg("--db", &path),
                format!("--workload={WORKLOAD}"),
            ],
            2 => vec![
                "export".into(),
                path_arg("--db", &path),
                path_arg("--out", &dir.path().join(format!("out{i}.jsonl"))),
            ],
            3 => vec![
                "merge".into(),
                path_arg("--into", &dir.path().join(format!("into{i}.db"))),
                path.display().to_string(),
            ],
            _ => vec![
                "show".into(),
                path_arg("--db", &path),
                format!("--workload={WORKLOAD}"),
            ],
        };
        // Merge lists each record it leaves out, one line each, naming the source.
        let listed = (command[0] == "merge").then(|| path.display().to_string());
        cases.push((command, listed));
    }
    run_cases(&cases);
}

#[test]
fn mutated_jsonl_imports_never_crash_the_cli() {
    let dir = temp_dir();
    let good = dir.path().join("good.db");
    sample_db(&good);
    let exported = dir.path().join("good.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_tensortune"))
        .args([
            "export",
            &path_arg("--db", &good),
            &path_arg("--out", &exported),
        ])
        .output()
        .expect("export runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&exported).expect("read the export");
    let lines: Vec<&[u8]> = text.lines().map(str::as_bytes).collect();
    let mut lines_mutator = Mutator::new(4, &lines).json(true).tokens(&[
        "\"median_s\":",
        "\"workload\":",
        "\"trace\":",
    ]);
    let mut cases = Vec::new();
    for i in 0..8 {
        let mut file = Vec::new();
        for _ in 0..20 {
            file.extend_from_slice(&lines_mutator.next_input());
            file.push(b'\n');
        }
        let path = dir.path().join(format!("in{i}.jsonl"));
        std::fs::write(&path, &file).expect("write");
        let mut command = vec![
            "import".into(),
            path_arg("--db", &dir.path().join(format!("import{i}.db"))),
            path.display().to_string(),
        ];
        if i % 2 == 1 {
            command.push("--strict".into());
        }
        cases.push((command, Some(format!("{}:", path.display()))));
    }
    run_cases(&cases);
}

/// `file` (a version-1 `.npy` of shape (2, 4)) with a header that declares 10¹⁷ elements,
/// more bytes than an address space has: the case that aborts (with fewer, mimalloc may
/// reserve the memory untouched and the read then fails by name). The shape grows by 15
/// bytes, the padding shrinks by as many, so the header keeps its length.
fn declaring_10e17_elements(file: &[u8]) -> Vec<u8> {
    let header_end = file
        .iter()
        .position(|&b| b == b'\n')
        .expect("a header line");
    let header = String::from_utf8_lossy(&file[10..header_end]).into_owned();
    let grown = header.replace("(2, 4)", "(100000000000000000,)");
    let trimmed = grown[..grown.len() - 15].to_string();
    assert_eq!(trimmed.len(), header.len(), "{header}");
    assert!(
        trimmed.trim_end().ends_with('}'),
        "too little padding in {header}"
    );
    let mut out = file[..10].to_vec();
    out.extend_from_slice(trimmed.as_bytes());
    out.extend_from_slice(&file[header_end..]);
    out
}

#[test]
fn damaged_npy_inputs_never_crash_run() {
    let dir = temp_dir();
    let a = ArrayD::from_shape_fn(IxDyn(&[2, 4]), |i| i[0] as f32 + 0.25 * i[1] as f32);
    let b = ArrayD::from_shape_fn(IxDyn(&[4, 3]), |i| i[1] as f32 - i[0] as f32);
    let (mut a_bytes, mut b_bytes) = (Vec::new(), Vec::new());
    a.write_npy(&mut a_bytes).expect("write a");
    b.write_npy(&mut b_bytes).expect("write b");
    let b_path = dir.path().join("b.npy");
    std::fs::write(&b_path, &b_bytes).expect("write b");
    let mut damage = Mutator::new(5, &[&a_bytes, &b_bytes]).tokens(&[
        "'<f8'",
        "'>f4'",
        "1000000000000",
        "(",
        ")",
    ]);
    let mut files: Vec<Vec<u8>> = vec![declaring_10e17_elements(&a_bytes)];
    files.extend((0..11).map(|_| damage.next_input()));
    let mut cases = Vec::new();
    for (i, file) in files.iter().enumerate() {
        let a_path = dir.path().join(format!("a{i}.npy"));
        std::fs::write(&a_path, file).expect("write");
        let inputs = format!("--inputs={},{}", a_path.display(), b_path.display());
        cases.push((
            args(&[
                "run",
                "--workload=matmul:M=2,N=3,K=4",
                "--repeat=1",
                "--min-repeat-ms=1",
                &inputs,
            ]),
            None,
        ));
    }
    run_cases(&cases);
}

/// Strings of a database printed as text (here a workload key and a target; also a stored
/// trace and a plan id) have their control characters escaped: an escape sequence stored in a key must not
/// reach the terminal that `records` or `best` prints to.
#[test]
fn database_strings_cannot_drive_the_terminal() {
    let dir = temp_dir();
    let path = dir.path().join("escapes.db");
    let evil = "\u{1b}]0;title\u{7}\u{1b}[31m\r";
    {
        let mut db = Database::open(&path).expect("open");
        let timing = timing(1e-6);
        let record = NewRecord::measured(
            Workload::new(format!("{WORKLOAD}{evil}"), 48.0),
            format!("llvm -threads=1{evil}"),
            r#"{"steps":[]}"#,
            timing,
        );
        db.insert_batch(None, &[record]).expect("insert");
    }
    for command in [
        vec!["records".to_string(), path_arg("--db", &path)],
        vec![
            "best".to_string(),
            path_arg("--db", &path),
            format!("--workload={WORKLOAD}{evil}"),
        ],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_tensortune"))
            .args(&command)
            .output()
            .expect("run");
        for stream in [&out.stdout, &out.stderr] {
            assert!(
                !stream.iter().any(|&b| b == 0x1b || b == b'\r' || b == 0x07),
                "{command:?} printed a control character: {}",
                String::from_utf8_lossy(stream)
            );
        }
    }
}

//! The cost model's training rows as CSV, for trying other models on them (the Python replica
//! in `scripts/ranking_replica.py` reads them). Every record of one target in a database
//! becomes one row: the index of its workload, its throughput in flop/s (0 for a failed
//! program) and its program row (`ProgramFeatures::program_row`, the columns the trees train
//! on, in `FEATURE_NAMES` order: the costliest store's row, the sums over stores, the store
//! count). A second file holds, per workload, the rows of random programs of its search space
//! (sketches filled with random decisions, one fixed seed): what a reference row that depends
//! on the workload alone looks like, for features made relative to one.
//!
//! `cargo run --release --example feature_rows -- tuning.db PREFIX [RANDOM_PER_WORKLOAD]`
//! writes `PREFIX.rows.csv` and `PREFIX.random.csv` (64 random programs a workload unless
//! said; 0 writes none) and prints each workload's index and key. The rows are for the host
//! CPU's one-thread target; records of other targets are not read. Each file is written
//! beside its name and renamed into place.

use rand::SeedableRng;
use std::fmt::Write as _;
use tensortune::records::Database;
use tensortune::schedules::lower::lower;
use tensortune::tuner::search::SearchSpace;
use tensortune::{Target, TuneOptions, WorkloadSpec};
use tensortune_cost_model::dataset::samples_from_records;
use tensortune_cost_model::{CoreModel, ProgramFeatures};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (db, prefix, random) = match args.as_slice() {
        [db, prefix] => (db, prefix, 64),
        [db, prefix, n] => (db, prefix, n.parse::<usize>()?),
        _ => return Err("usage: feature_rows DB PREFIX [RANDOM_PER_WORKLOAD]".into()),
    };
    let key = Target::host(1).target_key().to_string();
    let db = Database::open_read_only(db)?;
    let (samples, report) = samples_from_records(&db, &key)?;
    if samples.is_empty() {
        return Err(format!("no records of {key} that replay").into());
    }
    let mut workloads: Vec<String> = Vec::new();
    let mut rows = String::new();
    for s in &samples {
        let index = match workloads.iter().position(|w| *w == s.workload) {
            Some(i) => i,
            None => {
                workloads.push(s.workload.clone());
                workloads.len() - 1
            }
        };
        write!(rows, "{index},{}", s.throughput)?;
        push_row(&mut rows, &s.features.program_row());
    }
    write_then_rename(&format!("{prefix}.rows.csv"), &rows)?;

    let core = CoreModel::for_key(&key);
    let opts = TuneOptions::default();
    let mut reference = String::new();
    for (index, workload) in workloads.iter().enumerate() {
        println!("{index} {workload}");
        let space = SearchSpace::new(WorkloadSpec::parse(workload)?.build()?, &opts);
        // One seed for every workload: the same workload always gets the same rows.
        let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(7);
        let mut made = 0;
        // A random program may fail to instantiate or lower; a few tries each.
        for _ in 0..random * 4 {
            if made == random {
                break;
            }
            let Some(c) = space.random(&mut rng, &opts) else {
                continue;
            };
            let Ok(func) = lower(&c.state) else {
                continue;
            };
            write!(reference, "{index}")?;
            push_row(
                &mut reference,
                &ProgramFeatures::extract_for(&func, &core).program_row(),
            );
            made += 1;
        }
    }
    if random > 0 {
        write_then_rename(&format!("{prefix}.random.csv"), &reference)?;
    }
    eprintln!(
        "{} rows ({} failed programs) of {} workloads; {} records skipped",
        samples.len(),
        report.failed,
        workloads.len(),
        report.skipped.len()
    );
    Ok(())
}

/// Appends `,v` for each value and ends the line.
fn push_row(out: &mut String, row: &[f32]) {
    for v in row {
        // Writing to a String cannot fail.
        let _ = write!(out, ",{v}");
    }
    out.push('\n');
}

/// Writes `text` to `path` through a temporary file beside it, so that a reader never sees a
/// half-written file.
fn write_then_rename(path: &str, text: &str) -> std::io::Result<()> {
    let tmp = format!("{path}.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

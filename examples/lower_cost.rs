//! What the search pays per program before any compile: replaying a measured trace, lowering
//! it to loop IR, and extracting its features, timed over the records of a database.
//!
//! `taskset -c 1 cargo run --release --example lower_cost -- DB WORKLOAD [REPEATS]`
//!
//! On the 256 records of a conv2d tuning run (ResNet-50 layer, one core of an AVX2 EPYC):
//! replay 22 us, lowering 208 us, features 36 us a program; matmul 1024³: 7, 101 and 29 us.
//! The search scores every new program of a generation this way, so lowering is its cost.

use std::time::Instant;
use tensortune_records::Database;
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::trace::Trace;
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut a = std::env::args().skip(1);
    let db = a.next().ok_or("db")?;
    let spec = a.next().ok_or("spec")?;
    let reps: usize = a.next().map(|s| s.parse()).transpose()?.unwrap_or(10);
    let w = WorkloadSpec::parse(&spec)?;
    let dag = w.build()?;
    let db = Database::open_read_only(&db)?;
    let target = db
        .targets_of(&w.canonical())?
        .into_iter()
        .next()
        .ok_or("t")?;
    let traces: Vec<Trace> = db
        .records(&w.canonical(), &target)?
        .iter()
        .filter_map(|r| Trace::from_json(&r.trace_json).ok())
        .collect();
    let t = Instant::now();
    let mut states = Vec::new();
    for _ in 0..reps {
        states.clear();
        for tr in &traces {
            if let Ok(s) = tr.replay(&dag) {
                states.push(s);
            }
        }
    }
    let tr = t.elapsed().as_secs_f64() / (reps * traces.len()) as f64;
    let t = Instant::now();
    let mut funcs = Vec::new();
    for _ in 0..reps {
        funcs.clear();
        for s in &states {
            funcs.push(tensortune_schedules::lower::lower(s)?);
        }
    }
    let tl = t.elapsed().as_secs_f64() / (reps * states.len()) as f64;
    let t = Instant::now();
    let mut n = 0;
    for _ in 0..reps {
        for f in &funcs {
            n += tensortune_cost_model::ProgramFeatures::extract(f).num_rows();
        }
    }
    let tf = t.elapsed().as_secs_f64() / (reps * states.len()) as f64;
    println!(
        "replay {:.1} us, lower {:.1} us, features {:.1} us per program ({} programs, {n})",
        tr * 1e6,
        tl * 1e6,
        tf * 1e6,
        states.len()
    );
    Ok(())
}

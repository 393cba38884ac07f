//! How far can a cost model rank a database's programs? Re-measures every timed record of a
//! workload once more, with the tuner's own measurement settings, and prints how often the
//! new timings order two programs the way the stored ones do: the pairwise accuracy of a
//! perfect model of the programs' true speeds, scored against noisy timings as `tensortune
//! model eval` scores its models. Pairs whose stored timings differ by little are coin flips
//! for any model; the table says how many there are and what the rest reach.
//!
//! `cargo run --release --example measurement_repeatability -- tuning.db conv2d:N=1,C=64,...
//! [timings.csv]` (the records of one thread on this CPU; pin it, e.g. `taskset -c 1`). With a
//! third argument it also writes every timed record's uid, stored and new median seconds
//! there (written beside it, then renamed into place), for scoring a model against both
//! timings.

use tensortune::backend::Purpose;
use tensortune::measure::CpuMeasurer;
use tensortune::records::Database;
use tensortune::schedules::trace::Trace;
use tensortune::tuner::measure::Measurer;
use tensortune::{Target, WorkloadSpec};
use tensortune_cost_model::metrics::{pairwise_accuracy_apart, spearman};

/// The `tensortune` binary's allocator: kernels take their large temporaries (packed
/// operands) from it, so under another allocator the same program can time differently
/// from how tuning timed it.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (db, spec, csv) = match args.as_slice() {
        [db, spec] => (db, spec, None),
        [db, spec, csv] => (db, spec, Some(csv)),
        _ => return Err("usage: measurement_repeatability DB WORKLOAD [OUT.csv]".into()),
    };
    let spec = WorkloadSpec::parse(spec)?;
    let dag = spec.build()?;
    let target = Target::host(1);
    let key = tensortune::backend::Backend::target_key(&target).to_string();
    let db = Database::open_read_only(db)?;
    let mut states = Vec::new();
    let mut uids = Vec::new();
    let mut stored = Vec::new();
    let mut once = Vec::new();
    for r in db.records(&spec.canonical(), &key)? {
        let Some(t) = r.outcome.timing() else {
            continue;
        };
        let Ok(state) = Trace::from_json(&r.trace_json).and_then(|tr| tr.replay(&dag)) else {
            continue;
        };
        states.push(state);
        uids.push(r.uid.clone());
        stored.push(t.median_s);
        // A cut-short record was timed once (the hopeless cutoff): its time is rough.
        once.push(t.repeats < 2);
    }
    if states.is_empty() {
        return Err(format!("no timed records of {} on {key}", spec.canonical()).into());
    }
    let mut m = CpuMeasurer::new(target.measure_options(Purpose::Tuning, 0));
    let t0 = std::time::Instant::now();
    let again: Vec<Option<f64>> = states
        .chunks(16)
        .flat_map(|batch| m.measure(&dag, batch))
        .map(|r| r.ok().map(|t| t.median_s))
        .collect();
    println!(
        "{} on {key}: {} timed records ({} cut short) re-measured in {:.0} s",
        spec.canonical(),
        states.len(),
        once.iter().filter(|o| **o).count(),
        t0.elapsed().as_secs_f64()
    );
    if let Some(path) = csv {
        let mut text = String::from("uid,stored_s,again_s\n");
        for ((uid, s), g) in uids.iter().zip(&stored).zip(&again) {
            let g = g.map_or(String::new(), |g| g.to_string());
            text.push_str(&format!("{uid},{s},{g}\n"));
        }
        let tmp = format!("{path}.tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, path)?;
    }
    println!("| pairs | share of pairs | pairwise accuracy | Spearman |");
    println!("| --- | ---: | ---: | ---: |");
    for (label, keep_once) in [("all timed records", true), ("timed in full", false)] {
        // Throughputs (higher is faster), as `model eval` ranks them.
        let (a, b): (Vec<f64>, Vec<f64>) = stored
            .iter()
            .zip(&again)
            .zip(&once)
            .filter(|(_, o)| keep_once || !**o)
            .filter_map(|((s, g), _)| Some((1.0 / s, 1.0 / (*g)?)))
            .unzip();
        let total = a.len() * a.len().saturating_sub(1) / 2;
        for apart in [0.0, 0.02, 0.05, 0.10] {
            // The pairs whose stored throughputs differ by more than `apart`, and how the
            // new timings order them (a tie there is half right).
            let n = (0..a.len())
                .flat_map(|i| (i + 1..a.len()).map(move |j| (i, j)))
                .filter(|&(i, j)| a[i].max(a[j]) > a[i].min(a[j]) * (1.0 + apart))
                .count();
            let acc = pairwise_accuracy_apart(&b, &a, 1.0 + apart);
            println!(
                "| {label}, stored timings > {:.0}% apart | {:.2} | {} | {} |",
                apart * 100.0,
                n as f64 / total.max(1) as f64,
                acc.map_or("-".into(), |x| format!("{x:.3}")),
                if apart == 0.0 {
                    spearman(&b, &a).map_or("-".into(), |x| format!("{x:.3}"))
                } else {
                    String::new()
                }
            );
        }
    }
    Ok(())
}

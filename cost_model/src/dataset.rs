//! Training samples from a records database: every record of one target, replayed.
//!
//! A record stores its workload key and its trace as text. Turning it into a [`Sample`]
//! parses the workload, builds its DAG (once per workload), replays the trace, lowers it and
//! extracts the features; the throughput is the workload's flops over the median time, or 0
//! for a failed measurement. Records that no longer replay (a trace from an older schedule
//! language, a workload the op library dropped) are skipped and reported, never fatal.

use tensortune_records::{Database, Outcome, Record};
use tensortune_schedules::{lower::lower, ops::WorkloadSpec, trace::Trace, ComputeDag};

use crate::error::ModelError;
use crate::features::{CoreModel, ProgramFeatures};
use crate::model::Sample;

/// What loading samples from a database did.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct DatasetReport {
    /// Records of the target read.
    pub records: usize,
    /// Samples produced (measured and failed programs).
    pub samples: usize,
    /// Of those, failed programs (throughput 0).
    pub failed: usize,
    /// Records skipped: `(workload key, record uid, why)`.
    pub skipped: Vec<(String, String, String)>,
    /// Of those, records of workloads whose key is no spec of the op library: a model's
    /// layers (`onnx_conv2d:...`), whose DAG only their model rebuilds, so that their
    /// programs cannot be lowered here. The rest of `skipped` no longer replay.
    pub not_library_ops: usize,
}

impl DatasetReport {
    /// Skipped records whose trace no longer replays or lowers (not counting
    /// [`DatasetReport::not_library_ops`]).
    pub fn no_longer_replay(&self) -> usize {
        self.skipped.len().saturating_sub(self.not_library_ops)
    }
}

/// The samples of every record of `target`, all workloads, in database order.
pub fn samples_from_records(
    db: &Database,
    target: &str,
) -> Result<(Vec<Sample>, DatasetReport), ModelError> {
    samples_from_some_records(db, target, |_| true, usize::MAX)
}

/// The samples of the records of `target` whose workload key `keep` accepts, at most
/// `per_workload` records of each (spread evenly over its records in database order, so that
/// a long run's early random programs and late refined ones are both represented).
pub fn samples_from_some_records(
    db: &Database,
    target: &str,
    keep: impl Fn(&str) -> bool,
    per_workload: usize,
) -> Result<(Vec<Sample>, DatasetReport), ModelError> {
    let mut samples = Vec::new();
    let mut report = DatasetReport::default();
    for info in db.workloads()? {
        if !keep(&info.workload.key) {
            continue;
        }
        let mut records = db.records(&info.workload.key, target)?;
        if records.is_empty() || per_workload == 0 {
            continue;
        }
        if records.len() > per_workload {
            let n = records.len();
            records = (0..per_workload)
                .filter_map(|i| records.get(i * n / per_workload).cloned())
                .collect();
        }
        report.records += records.len();
        let dag = WorkloadSpec::parse(&info.workload.key)
            .map_err(|e| e.to_string())
            .and_then(|spec| spec.build().map_err(|e| e.to_string()));
        let dag = match dag {
            Ok(d) => d,
            Err(why) => {
                report.not_library_ops += records.len();
                for r in &records {
                    report
                        .skipped
                        .push((r.workload.key.clone(), r.uid.clone(), why.clone()));
                }
                continue;
            }
        };
        for r in &records {
            match sample_from_record(r, &dag) {
                Ok(s) => {
                    report.failed += (s.throughput == 0.0) as usize;
                    samples.push(s);
                }
                Err(why) => report
                    .skipped
                    .push((r.workload.key.clone(), r.uid.clone(), why)),
            }
        }
    }
    report.samples = samples.len();
    Ok((samples, report))
}

/// One record as a sample, given its workload's DAG; the error says why it does not replay.
pub fn sample_from_record(record: &Record, dag: &ComputeDag) -> Result<Sample, String> {
    let trace = Trace::from_json(&record.trace_json).map_err(|e| e.to_string())?;
    let state = trace.replay(dag).map_err(|e| e.to_string())?;
    let func = lower(&state).map_err(|e| e.to_string())?;
    let throughput = match &record.outcome {
        Outcome::Measured(t) if t.median_s > 0.0 && t.median_s.is_finite() => {
            let flops = if record.workload.flops > 0.0 {
                record.workload.flops
            } else {
                dag.flops()
            };
            flops / t.median_s
        }
        _ => 0.0,
    };
    Ok(Sample {
        features: ProgramFeatures::extract_for(&func, &CoreModel::for_key(&record.target)),
        workload: record.workload.key.clone(),
        throughput: if throughput.is_finite() {
            throughput
        } else {
            0.0
        },
    })
}

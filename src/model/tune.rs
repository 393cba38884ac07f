//! [`tune_model`]: every task of a model tuned together under one budget.

use crate::backend::Backend;
use crate::tune::{tune_dags, TuneError, TuneReport};
use tensortune_model::Plan;
use tensortune_tuner::TuneOptions;

/// Tunes the tasks of `plan` on `backend` with the task scheduler, each weighted by how often
/// one inference runs it, so that trials go where they cut the model's latency most. Records
/// go to [`TuneOptions::db`] under each task's key, and a second run on the same database
/// resumes, as [`crate::tune()`] does. Reports come in the order of [`Plan::tasks`].
pub fn tune_model<B: Backend>(
    plan: &Plan,
    backend: &B,
    opts: &TuneOptions,
) -> Result<Vec<TuneReport>, TuneError> {
    let tasks = plan
        .tasks
        .iter()
        .map(|t| (t.key.clone(), t.dag.clone(), t.count as f64))
        .collect();
    tune_dags(tasks, backend, opts)
}

/// Tunes the tasks of several plans together (the buckets of a model with a dynamic batch,
/// [`super::buckets::bucket_plans`], or several models) under one budget. A task that
/// several plans share is tuned once, weighted by its count summed over them. Returns each
/// distinct task's key with its report, in the order the plans first name them.
pub fn tune_plans<B: Backend>(
    plans: &[&Plan],
    backend: &B,
    opts: &TuneOptions,
) -> Result<Vec<(String, TuneReport)>, TuneError> {
    let mut tasks: Vec<(String, tensortune_schedules::ComputeDag, f64)> = Vec::new();
    for t in plans.iter().flat_map(|p| &p.tasks) {
        match tasks.iter_mut().find(|(k, _, _)| *k == t.key) {
            Some(task) => task.2 += t.count as f64,
            None => tasks.push((t.key.clone(), t.dag.clone(), t.count as f64)),
        }
    }
    let keys: Vec<String> = tasks.iter().map(|(k, _, _)| k.clone()).collect();
    Ok(keys
        .into_iter()
        .zip(tune_dags(tasks, backend, opts)?)
        .collect())
}

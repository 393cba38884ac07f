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

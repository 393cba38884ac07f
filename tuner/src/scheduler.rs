//! The task scheduler: which workload gets the next round of trials.
//!
//! The goal is the total weighted latency `sum_i w_i * L_i`, where `L_i` is the best latency
//! of task `i` so far and `w_i` how often it runs in the user's program. After one
//! round-robin pass (every task needs a first measurement), each round goes to the task with
//! the largest expected reduction of that total per trial, a simplified form of Ansor's
//! gradient scheme:
//!
//! ```text
//! g_i = w_i * (alpha * backward_i + (1 - alpha) * forward_i)
//! backward_i = (L_i before its last round - L_i now) / trials of that round
//! forward_i  = L_i / t_i          (the gain if latency kept falling like 1/t)
//! ```
//!
//! with `alpha = 0.2` (Ansor's default weight of the observed gain). A task that is done (its
//! space exhausted, or stopped early) is never chosen.
//!
//! [`Policy::RoundRobin`] is the baseline it is measured against (`examples/task_scheduler.rs`
//! tunes the three layers of an MLP under both): every round to the live task with the fewest
//! trials.

use serde::{Deserialize, Serialize};

/// How rounds are given to tasks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// The largest expected reduction of total weighted latency per trial (see the module doc).
    #[default]
    Gradient,
    /// The live task with the fewest trials (the first such in input order).
    RoundRobin,
}

impl Policy {
    /// Every policy.
    pub const ALL: [Policy; 2] = [Policy::Gradient, Policy::RoundRobin];

    /// The name on the command line: `gradient` or `round-robin`.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Gradient => "gradient",
            Policy::RoundRobin => "round-robin",
        }
    }

    /// Parses [`Policy::name`].
    pub fn parse(s: &str) -> Option<Policy> {
        Policy::ALL.into_iter().find(|p| p.name() == s)
    }
}

/// What the scheduler knows of one task.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskStatus {
    /// Weight of the task in the total.
    pub weight: f64,
    /// Best latency after each of its rounds (seconds; infinite while nothing has run).
    pub history: Vec<f64>,
    /// Trials measured for it so far.
    pub trials: usize,
    /// Trials of its last round.
    pub last_round: usize,
    /// No more rounds for it.
    pub done: bool,
}

/// Weight of the observed gain against the optimistic forward estimate (Ansor: 0.2).
pub const ALPHA: f64 = 0.2;

/// The task to run next under `policy`, or `None` when every task is done.
pub fn next_task_by(tasks: &[TaskStatus], policy: Policy) -> Option<usize> {
    match policy {
        Policy::Gradient => next_task(tasks),
        Policy::RoundRobin => tasks
            .iter()
            .enumerate()
            .filter(|(_, t)| !t.done)
            .min_by_key(|&(i, t)| (t.trials, i))
            .map(|(i, _)| i),
    }
}

/// The task to run next by the gradient rule, or `None` when every task is done.
pub fn next_task(tasks: &[TaskStatus]) -> Option<usize> {
    // Round-robin first: any live task without a measurement.
    if let Some(i) = tasks.iter().position(|t| !t.done && t.history.is_empty()) {
        return Some(i);
    }
    let mut best: Option<(usize, f64)> = None;
    for (i, t) in tasks.iter().enumerate() {
        if t.done {
            continue;
        }
        let g = gradient(t);
        if best.map(|(_, b)| g > b).unwrap_or(true) {
            best = Some((i, g));
        }
    }
    best.map(|(i, _)| i)
}

/// The expected reduction of weighted latency per trial of a task.
pub fn gradient(t: &TaskStatus) -> f64 {
    let now = t.history.last().copied().unwrap_or(f64::INFINITY);
    if !now.is_finite() {
        // Nothing valid measured yet: give it every chance.
        return f64::MAX;
    }
    let before = if t.history.len() >= 2 {
        t.history[t.history.len() - 2]
    } else {
        now
    };
    let backward = if before.is_finite() {
        (before - now).max(0.0) / t.last_round.max(1) as f64
    } else {
        now / t.last_round.max(1) as f64
    };
    let forward = now / t.trials.max(1) as f64;
    t.weight * (ALPHA * backward + (1.0 - ALPHA) * forward)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(weight: f64, history: &[f64], trials: usize) -> TaskStatus {
        TaskStatus {
            weight,
            history: history.to_vec(),
            trials,
            last_round: 16,
            done: false,
        }
    }

    #[test]
    fn round_robin_first_then_largest_gain() {
        let ts = vec![task(1.0, &[1.0], 16), task(1.0, &[], 0)];
        assert_eq!(next_task(&ts), Some(1));
        // Equal trials: the slower (more to gain) task wins; weight scales it.
        let ts = vec![task(1.0, &[1.0, 1.0], 32), task(1.0, &[4.0, 4.0], 32)];
        assert_eq!(next_task(&ts), Some(1));
        let ts = vec![task(10.0, &[1.0, 1.0], 32), task(1.0, &[4.0, 4.0], 32)];
        assert_eq!(next_task(&ts), Some(0));
        // A task still improving fast beats one that stalled at the same latency.
        let ts = vec![task(1.0, &[2.0, 1.0], 32), task(1.0, &[1.0, 1.0], 32)];
        assert_eq!(next_task(&ts), Some(0));
        let mut done = vec![task(1.0, &[1.0], 16)];
        done[0].done = true;
        assert_eq!(next_task(&done), None);
    }

    #[test]
    fn round_robin_takes_the_task_with_fewest_trials() {
        // The gradient rule would pick task 1 (four times the latency); round-robin evens the
        // trials out first.
        let mut ts = vec![task(1.0, &[1.0], 16), task(1.0, &[4.0, 4.0], 32)];
        assert_eq!(next_task(&ts), Some(1));
        assert_eq!(next_task_by(&ts, Policy::RoundRobin), Some(0));
        ts[0].trials = 32;
        assert_eq!(next_task_by(&ts, Policy::RoundRobin), Some(0));
        ts[0].done = true;
        assert_eq!(next_task_by(&ts, Policy::RoundRobin), Some(1));
        ts[1].done = true;
        assert_eq!(next_task_by(&ts, Policy::RoundRobin), None);
        for p in Policy::ALL {
            assert_eq!(Policy::parse(p.name()), Some(p));
        }
        assert_eq!(Policy::parse("fastest"), None);
    }
}

//! Tuning plans: the tasks of a set of workloads with their weights and trial budgets, and
//! their split into shards that workers tune in parallel (`tensortune plan`, `tensortune
//! tune --plan FILE --shard I/N`).
//!
//! # The plan file (`tensortune.plan/1`)
//!
//! ```json
//! {"format":"tensortune.plan/1","id":"5f0c1d2e3a4b5c6d","target":"llvm","seed":0,
//!  "tasks":[{"workload":"matmul:K=512,M=512,N=512,dtype=f32","weight":2.0,"trials":64,
//!            "flops":268435456.0}]}
//! ```
//!
//! A plan of a whole model (`tensortune plan --model m.onnx`) also names the model, with the
//! SHA-256 of its bytes and the shapes and buckets it was planned with; its tasks are the
//! model's layers, keyed as `tune-model` keys them, and a worker re-imports the model (found
//! beside the plan file, or where the path says) to build them:
//!
//! ```json
//! {"format":"tensortune.plan/1","id":"...","target":"llvm","seed":0,
//!  "models":[{"path":"cls.onnx","sha256":"9c1e...","input_shapes":{"x":[1,3,48,192]}}],
//!  "tasks":[{"workload":"conv2d:...","weight":1.0,"trials":64,"flops":1.2e6}]}
//! ```
//!
//! `id` is the first 16 hex digits of the SHA-256 of the plan's content (everything but the
//! id, as compact JSON): the same tasks give the same id on every machine, so the shards of
//! one plan agree on it without talking, and a hand-edited plan (whose id no longer matches)
//! is refused rather than mixed with the records of the original.
//!
//! # The split
//!
//! [`Plan::shard`] gives each shard a list of tasks; the split depends only on the plan and
//! the shard count, so every worker computes the same one. Tasks go, largest expected work
//! first, to the shard with the least work so far (ties to the lower index): the greedy
//! "longest processing time first" rule, within 4/3 of the best split. The expected work of
//! a task is [`Plan::cost`].

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The `format` field of a plan file.
pub const FORMAT: &str = "tensortune.plan/1";

/// A tuning plan. See the module doc.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Always [`FORMAT`].
    pub format: String,
    /// The content id.
    pub id: String,
    /// The target every task is tuned for (`llvm`, `cuda -arch=sm_90`...).
    pub target: String,
    /// The seed of every task's run: a shard tunes its tasks as a single process would.
    pub seed: u64,
    /// The models whose layers are tasks of the plan (none for a plan of workloads).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<PlanModel>,
    /// The tasks, in the order given.
    pub tasks: Vec<PlanTask>,
}

/// A model a plan tunes the layers of.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanModel {
    /// The ONNX file as `tensortune plan` was given it; a relative path is looked for beside
    /// the plan file first, then from the working directory.
    pub path: String,
    /// SHA-256 of the file's bytes: a worker refuses a different model under the same path.
    pub sha256: String,
    /// The input shapes fixed at planning (`--input-shape`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub input_shapes: std::collections::BTreeMap<String, Vec<usize>>,
    /// The batch buckets planned (`--buckets`); empty for one fixed batch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub buckets: Vec<usize>,
}

/// One task of a plan: a workload and its budget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanTask {
    /// The canonical workload spec.
    pub workload: String,
    /// How often the workload runs in the model it belongs to (the `@WEIGHT` of `tune`).
    pub weight: f64,
    /// Candidates to measure for this task.
    pub trials: usize,
    /// Floating-point operations of one execution.
    pub flops: f64,
}

/// What is wrong with a plan file or a shard.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// The text is not a plan.
    #[error("not a tensortune plan: {0}")]
    Malformed(String),
    /// The file is a plan of another format version.
    #[error("plan format {found:?} is not {FORMAT:?}")]
    Format {
        /// The `format` field.
        found: String,
    },
    /// The id does not match the content: the file was edited after `tensortune plan`.
    #[error("plan id {found} does not match its tasks (expected {expected}): make a new plan with `tensortune plan` instead of editing one")]
    IdMismatch {
        /// The id in the file.
        found: String,
        /// The id of its content.
        expected: String,
    },
    /// A plan without tasks, or with one workload twice.
    #[error("{0}")]
    BadTasks(String),
    /// A shard that is not `I/N` with `0 <= I < N`.
    #[error("bad shard `{0}`: expected I/N with 0 <= I < N, e.g. 0/4")]
    BadShard(String),
}

/// The content a plan's id is the hash of: everything but the id.
#[derive(Serialize)]
struct Content<'a> {
    format: &'a str,
    target: &'a str,
    seed: u64,
    // Left out when empty: a plan of workloads keeps the id it had before plans had models.
    #[serde(skip_serializing_if = "<[PlanModel]>::is_empty")]
    models: &'a [PlanModel],
    tasks: &'a [PlanTask],
}

impl Plan {
    /// A plan of `tasks` for `target` with `seed`, its id computed.
    pub fn new(target: &str, seed: u64, tasks: Vec<PlanTask>) -> Result<Plan, PlanError> {
        Plan::with_models(target, seed, Vec::new(), tasks)
    }

    /// [`Plan::new`] for a plan whose tasks include the layers of `models`.
    pub fn with_models(
        target: &str,
        seed: u64,
        models: Vec<PlanModel>,
        tasks: Vec<PlanTask>,
    ) -> Result<Plan, PlanError> {
        let mut plan = Plan {
            format: FORMAT.to_string(),
            id: String::new(),
            target: target.to_string(),
            seed,
            models,
            tasks,
        };
        plan.check_tasks()?;
        plan.id = plan.content_id();
        Ok(plan)
    }

    /// Reads a plan file's text, checking its format, its tasks and its id.
    pub fn parse(text: &str) -> Result<Plan, PlanError> {
        let plan: Plan =
            serde_json::from_str(text).map_err(|e| PlanError::Malformed(e.to_string()))?;
        if plan.format != FORMAT {
            return Err(PlanError::Format { found: plan.format });
        }
        plan.check_tasks()?;
        let expected = plan.content_id();
        if plan.id != expected {
            return Err(PlanError::IdMismatch {
                found: plan.id,
                expected,
            });
        }
        Ok(plan)
    }

    /// The plan as its file holds it: pretty JSON, one field a line, ending in a newline.
    pub fn to_json(&self) -> String {
        // Plain strings, numbers and lists: serializing cannot fail.
        let mut text = serde_json::to_string_pretty(self).unwrap_or_default();
        text.push('\n');
        text
    }

    fn content_id(&self) -> String {
        let content = Content {
            format: &self.format,
            target: &self.target,
            seed: self.seed,
            models: &self.models,
            tasks: &self.tasks,
        };
        let text = serde_json::to_string(&content).unwrap_or_default();
        tensortune_records::sha256_hex(&text)[..16].to_string()
    }

    fn check_tasks(&self) -> Result<(), PlanError> {
        if self.tasks.is_empty() {
            return Err(PlanError::BadTasks("a plan needs at least one task".into()));
        }
        for (i, task) in self.tasks.iter().enumerate() {
            if self.tasks[..i].iter().any(|t| t.workload == task.workload) {
                return Err(PlanError::BadTasks(format!(
                    "workload {} is in the plan twice",
                    task.workload
                )));
            }
            let finite = task.weight.is_finite() && task.weight > 0.0 && task.flops >= 0.0;
            if !finite || !task.flops.is_finite() || task.trials == 0 {
                return Err(PlanError::BadTasks(format!(
                    "task {} needs a positive weight, trials and finite flops",
                    task.workload
                )));
            }
        }
        Ok(())
    }

    /// The expected work of a task, in units of one trial's fixed cost: each trial costs
    /// the search, a compile and the checks, about the same for any small kernel, plus its
    /// timed runs, which grow with the FLOPs. [`WORK_PER_TRIAL_FLOPS`] is where the two are
    /// equal. Only the ratio between tasks matters to the split.
    pub fn cost(task: &PlanTask) -> f64 {
        task.trials as f64 * (1.0 + task.flops / WORK_PER_TRIAL_FLOPS)
    }

    /// The indices of the tasks of shard `shard`, in plan order. See the module doc.
    pub fn shard(&self, shard: Shard) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.tasks.len()).collect();
        order.sort_by(|&a, &b| {
            let (ta, tb) = (&self.tasks[a], &self.tasks[b]);
            Plan::cost(tb)
                .total_cmp(&Plan::cost(ta))
                .then_with(|| ta.workload.cmp(&tb.workload))
        });
        // Shards past the number of tasks get none (each task goes to the first of the least
        // loaded, and an empty one is always among them), so only that many are weighed: a
        // `--shard I/N` with N in the billions costs no more than one with N = tasks.
        let used = (shard.count as usize).clamp(1, self.tasks.len().max(1));
        let mut load = vec![0.0f64; used];
        let mut owner = vec![0u32; self.tasks.len()];
        for task in order {
            // The first of the least loaded shards: deterministic on ties.
            let mut least = 0;
            for (i, l) in load.iter().enumerate() {
                if *l < load[least] {
                    least = i;
                }
            }
            load[least] += Plan::cost(&self.tasks[task]);
            owner[task] = least as u32;
        }
        (0..self.tasks.len())
            .filter(|&t| owner[t] == shard.index)
            .collect()
    }
}

/// FLOPs whose timed runs cost about as much as a trial's fixed part (search, compile,
/// checks: a few tenths of a second): ten timed runs of 5 GFLOP at some 100 GFLOP/s. A
/// rough figure; a better one moves tasks between shards, never changes what is tuned.
pub const WORK_PER_TRIAL_FLOPS: f64 = 5e9;

/// Shard `index` of `count`: `0 <= index < count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This shard, 0-based.
    pub index: u32,
    /// How many shards the plan is split into.
    pub count: u32,
}

impl Shard {
    /// The whole plan as one shard.
    pub const ALL: Shard = Shard { index: 0, count: 1 };

    /// Shard `index` of `count`, when `index < count`.
    pub fn new(index: u32, count: u32) -> Result<Shard, PlanError> {
        if index < count {
            Ok(Shard { index, count })
        } else {
            Err(PlanError::BadShard(format!("{index}/{count}")))
        }
    }
}

impl FromStr for Shard {
    type Err = PlanError;

    /// `I/N`, e.g. `0/4`.
    fn from_str(s: &str) -> Result<Shard, PlanError> {
        let bad = || PlanError::BadShard(s.to_string());
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let index = i.trim().parse().map_err(|_| bad())?;
        let count = n.trim().parse().map_err(|_| bad())?;
        Shard::new(index, count).map_err(|_| bad())
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(workload: &str, trials: usize, flops: f64) -> PlanTask {
        PlanTask {
            workload: workload.to_string(),
            weight: 1.0,
            trials,
            flops,
        }
    }

    #[test]
    fn the_split_balances_work_covers_every_task_once_and_is_deterministic() {
        // Costs 8, 8, 4, 4, 2, 2, 1, 1 (in trials of fixed cost): 15 each on two shards.
        let tasks = vec![
            task("a:x=1", 4, 0.0),
            task("b:x=1", 8, 0.0),
            task("c:x=1", 1, 0.0),
            task("d:x=1", 2, 0.0),
            task("e:x=1", 8, 0.0),
            task("f:x=1", 4, 0.0),
            task("g:x=1", 2, 0.0),
            task("h:x=1", 1, 0.0),
        ];
        let plan = Plan::new("llvm", 0, tasks).expect("plan");
        let shards: Vec<Vec<usize>> = (0..2)
            .map(|i| plan.shard(Shard::new(i, 2).expect("shard")))
            .collect();
        let work = |s: &[usize]| s.iter().map(|&t| Plan::cost(&plan.tasks[t])).sum::<f64>();
        assert_eq!((work(&shards[0]), work(&shards[1])), (15.0, 15.0));
        let mut all: Vec<usize> = shards.concat();
        all.sort();
        assert_eq!(all, (0..8).collect::<Vec<_>>());
        assert_eq!(shards[0], plan.shard(Shard::new(0, 2).expect("shard")));
        // Larger kernels weigh more: one 50 GFLOP task outweighs two small ones together.
        let big = Plan::new(
            "llvm",
            0,
            vec![
                task("big:x=1", 8, 5e10),
                task("s1:x=1", 8, 0.0),
                task("s2:x=1", 8, 0.0),
            ],
        )
        .expect("plan");
        assert_eq!(big.shard(Shard::new(0, 2).expect("shard")), vec![0]);
        assert_eq!(big.shard(Shard::new(1, 2).expect("shard")), vec![1, 2]);
        // More shards than tasks: one task each for the first, none for the rest, and a count
        // in the billions (it reserved a load per shard) splits as one equal to the tasks.
        for (count, index, want) in [(3, 2, vec![2]), (4, 3, vec![]), (u32::MAX, 0, vec![0])] {
            let s = Shard::new(index, count).expect("shard");
            assert_eq!(big.shard(s), want, "{index}/{count}");
        }
        let last = Shard::new(u32::MAX - 1, u32::MAX).expect("shard");
        assert!(big.shard(last).is_empty());
    }

    #[test]
    fn a_plan_round_trips_and_an_edited_one_is_refused() {
        let plan = Plan::new(
            "llvm",
            7,
            vec![task("matmul:K=8,M=8,N=8,dtype=f32", 8, 1024.0)],
        )
        .expect("plan");
        assert_eq!(plan.id.len(), 16);
        assert_eq!(Plan::parse(&plan.to_json()), Ok(plan.clone()));
        let edited = plan.to_json().replace("\"trials\": 8", "\"trials\": 9");
        assert!(matches!(
            Plan::parse(&edited),
            Err(PlanError::IdMismatch { .. })
        ));
        assert!(matches!(
            Plan::new(
                "llvm",
                0,
                vec![task("a:x=1", 1, 0.0), task("a:x=1", 2, 0.0)]
            ),
            Err(PlanError::BadTasks(_))
        ));
    }

    #[test]
    fn shards_parse_as_i_of_n() {
        assert_eq!("1/4".parse(), Ok(Shard { index: 1, count: 4 }));
        for bad in ["4/4", "1", "a/2", "-1/2", "0/0"] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
        assert_eq!(Shard::new(2, 3).expect("shard").to_string(), "2/3");
    }
}

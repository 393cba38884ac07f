//! Whole models: an ONNX file imported and cut into tasks by [`tensortune_model`], each task
//! compiled once from its best record (or its default schedule), and the network run with
//! those kernels ([`Model::run`]); [`tune_model`] tunes every task of a model under one
//! budget.
//!
//! ```
//! use tensortune::model::{LoadOptions, Model};
//! use tensortune::ndarray::Array2;
//! // y = relu(x · W) with W[k][j] = k - j, as tensortune_model::testing writes it.
//! let bytes = tensortune::model::testing::mlp_bytes();
//! let model = Model::from_bytes(&bytes, &LoadOptions::default())?;
//! let x = Array2::<f32>::from_elem((2, 3), 1.0);
//! let y = model.run(&[x.view().into_dyn()])?;
//! assert_eq!(y[0].as_slice().unwrap(), &[3.0, 0.0, 0.0, 0.0, 3.0, 0.0, 0.0, 0.0]);
//! # Ok::<(), tensortune::model::Error>(())
//! ```
//!
//! Weights are converted to aligned buffers once, at load, in the shape each kernel reads
//! them in; a run allocates only the values it computes and frees each after its last
//! reader.

pub mod buckets;
mod exec;
#[cfg(feature = "tuning")]
mod tune;

pub use buckets::BucketedModel;
pub use exec::StepTime;
pub use tensortune_model::{parse_input_shape, testing, ImportOptions, Plan};
#[cfg(feature = "tuning")]
pub use tune::{tune_model, tune_plans};

use crate::build::{choose_dag, default_choice_threads, Missing, ReuseError, Source};
use crate::kernel::Kernel;
use crate::runtime::Runtime;
use crate::Target;
use std::path::{Path, PathBuf};
use tensortune_records::Database;

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The model: unreadable, malformed, an unsupported node, shapes that do not fit.
    #[error(transparent)]
    Import(#[from] tensortune_model::ModelError),
    /// The records database, or choosing a task's program from it.
    #[error(transparent)]
    Reuse(#[from] ReuseError),
    /// A task's program did not compile.
    #[error("task `{task}`: {reason}")]
    Compile {
        /// The task's key.
        task: String,
        /// Why.
        reason: String,
    },
    /// The arrays given do not fit the model's inputs.
    #[error("{0}")]
    Inputs(String),
    /// The model's tensors need more memory than this machine has free.
    #[error("{0}")]
    Memory(String),
    /// A kernel or buffer failed while running.
    #[error("step `{step}`: {reason}")]
    Run {
        /// The step.
        step: String,
        /// Why.
        reason: String,
    },
}

impl Error {
    /// True for what a user can fix (the model, the shapes, the inputs, the database).
    pub fn is_user_error(&self) -> bool {
        match self {
            Error::Import(e) => e.is_user_error(),
            Error::Reuse(ReuseError::Records(r)) => r.is_user_error(),
            Error::Inputs(_) | Error::Memory(_) => true,
            _ => false,
        }
    }
}

/// How a model is loaded.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Input shapes fixed by the caller.
    pub import: ImportOptions,
    /// The records database to take each task's best program from; `None`: every task runs
    /// its default schedule.
    pub db: Option<PathBuf>,
    /// Threads of the kernels (and of the target key records are looked up under).
    pub threads: usize,
}

impl Default for LoadOptions {
    fn default() -> LoadOptions {
        LoadOptions {
            import: ImportOptions::default(),
            db: None,
            threads: 1,
        }
    }
}

/// Where a task's program came from.
#[derive(Clone, Debug)]
pub struct TaskInfo {
    /// The workload key.
    pub key: String,
    /// The ONNX ops it fuses.
    pub ops: String,
    /// How often one inference runs it.
    pub count: usize,
    /// Floating-point operations of one run.
    pub flops: f64,
    /// A record, or the default schedule.
    pub source: Source,
}

/// A model ready to run: its plan, one compiled kernel per task, its weights as buffers.
pub struct Model {
    plan: Plan,
    kernels: Vec<Kernel>,
    tasks: Vec<TaskInfo>,
    consts: exec::Constants,
    rt: Runtime,
    pool: exec::BufferPool,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("tasks", &self.tasks).finish()
    }
}

/// Imports and plans an ONNX file (no compilation): what tuning and listing need.
pub fn plan_file(path: &Path, opts: &ImportOptions) -> Result<Plan, Error> {
    let bytes = std::fs::read(path).map_err(|e| tensortune_model::ModelError::Io {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    plan_bytes(&bytes, opts)
}

/// Imports and plans an ONNX model held in memory.
pub fn plan_bytes(bytes: &[u8], opts: &ImportOptions) -> Result<Plan, Error> {
    Ok(tensortune_model::plan(tensortune_model::import(
        bytes, opts,
    )?)?)
}

/// The plans of a model's bytes: one, or with `buckets` one per bucket (see [`buckets`]).
pub fn model_plans(
    bytes: &[u8],
    opts: &ImportOptions,
    buckets: Option<&[usize]>,
) -> Result<Vec<Plan>, Error> {
    match buckets {
        None => Ok(vec![plan_bytes(bytes, opts)?]),
        Some(b) => Ok(buckets::bucket_plans(bytes, opts, b)?
            .into_iter()
            .map(|(_, p)| p)
            .collect()),
    }
}

impl Model {
    /// Loads an ONNX file: import, plan, and a kernel per task.
    pub fn load(path: impl AsRef<Path>, opts: &LoadOptions) -> Result<Model, Error> {
        Model::from_plan(plan_file(path.as_ref(), &opts.import)?, opts)
    }

    /// [`Model::load`] from the bytes of a model.
    pub fn from_bytes(bytes: &[u8], opts: &LoadOptions) -> Result<Model, Error> {
        Model::from_plan(plan_bytes(bytes, &opts.import)?, opts)
    }

    /// Compiles every task of `plan`: its best record in the database where it has one that
    /// replays, else its default schedule.
    pub fn from_plan(plan: Plan, opts: &LoadOptions) -> Result<Model, Error> {
        // Before compiling anything: a model whose tensors cannot fit (its shapes are each
        // within the importer's bounds, which are far above any machine's memory) fails here
        // with the sizes, not later in the allocator. The sum over every computed value is
        // what the executor holds at most (its pool keeps a run's buffers for the next).
        let g = &plan.graph;
        let bytes = g
            .values
            .iter()
            .filter(|v| v.constant.is_none())
            .map(|v| (v.shape.iter().product::<usize>() as u64).saturating_mul(4))
            .fold(0u64, u64::saturating_add);
        crate::runtime::memory::check_fits(bytes, "the model's inputs, outputs and intermediates")
            .map_err(|e| Error::Memory(e.to_string()))?;
        let target_key = Target::host(opts.threads).key();
        let db = match &opts.db {
            Some(p) => Some(Database::open_read_only(p).map_err(ReuseError::from)?),
            None => None,
        };
        let mut kernels = Vec::with_capacity(plan.tasks.len());
        let mut tasks = Vec::with_capacity(plan.tasks.len());
        for t in &plan.tasks {
            let choice = match &db {
                Some(db) => choose_dag(db, &t.key, &t.dag, &target_key, Missing::Fallback, None)?,
                None => default_choice_threads(&t.key, &t.dag, None, opts.threads.max(1))?,
            };
            let kernel = Kernel::compile_with(&choice.func, &Default::default()).map_err(|e| {
                Error::Compile {
                    task: t.key.clone(),
                    reason: e.to_string(),
                }
            })?;
            kernels.push(kernel);
            tasks.push(TaskInfo {
                key: t.key.clone(),
                ops: t.ops.clone(),
                count: t.count,
                flops: t.dag.flops(),
                source: choice.source,
            });
        }
        let consts = exec::Constants::new(&plan)?;
        let rt = Runtime::new(opts.threads).map_err(|e| Error::Run {
            step: "runtime".into(),
            reason: e.to_string(),
        })?;
        Ok(Model {
            plan,
            kernels,
            tasks,
            consts,
            rt,
            pool: exec::BufferPool::default(),
        })
    }

    /// The tasks, each with where its program came from.
    pub fn tasks(&self) -> &[TaskInfo] {
        &self.tasks
    }

    /// The plan: graph, tasks and steps.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The names and shapes of the inputs [`Model::run`] takes, in order.
    pub fn inputs(&self) -> Vec<(String, Vec<usize>)> {
        let g = &self.plan.graph;
        g.inputs
            .iter()
            .map(|&v| (g.value(v).name.clone(), g.value(v).shape.clone()))
            .collect()
    }

    /// Runs one inference on `inputs` (the model's inputs in order, any memory layout).
    pub fn run(
        &self,
        inputs: &[ndarray::ArrayViewD<'_, f32>],
    ) -> Result<Vec<ndarray::ArrayD<f32>>, Error> {
        Ok(exec::run(self, inputs, false)?.0)
    }

    /// [`Model::run`], with the time each step took.
    pub fn run_timed(
        &self,
        inputs: &[ndarray::ArrayViewD<'_, f32>],
    ) -> Result<(Vec<ndarray::ArrayD<f32>>, Vec<StepTime>), Error> {
        exec::run(self, inputs, true)
    }
}

//! Sketch rules: from a DAG and a target, the program structures worth searching.
//!
//! A rule is a value implementing [`SketchRule`], one per file of this folder; a backend
//! chooses the list for its target kind ([`cpu_rules`]). [`generate_for`] visits the stages
//! from the outputs back to the inputs, and for each asks the rules in order whether they
//! apply: every rule that applies contributes its variants (alternative structures of that
//! stage), until one that applies says the rest must not ([`Applies::AndSkipRest`]). A
//! stage's variants multiply the sketches built so far (softmax has four).
//!
//! The CPU list, in order:
//! - [`RowWise`]: in a row-wise DAG (softmax), every stage before the output computed at the
//!   output's row loop, reductions as vector partial results (one more variant per stage);
//! - [`AlwaysInline`]: an injective stage that is not an output (bias, relu, exp) is inlined;
//!   padding (a stage that selects) is inlined in one sketch and computed at the root in
//!   another;
//! - [`MultiLevelTiling`] `SSRSRS`: a reduction with data reuse (matmul, batch matmul, dense,
//!   conv2d, depthwise conv2d), with fusion of an elementwise consumer or a cache-write stage,
//!   and a second sketch that packs an input (see its file);
//! - [`Plain`]: the innermost spatial loop split for vector lanes, a compute location where
//!   the stage has one consumer;
//! - [`Rfactor`]: for a reduction over at least 8 elements, without reuse (the tiling rule
//!   skipped the rest) or streaming an input once ([`streams_an_input`]: the GEMV of a dense
//!   layer with one row), the innermost reduce loop as vector lanes of partial results, as an
//!   alternative to the plain and tiled structures.
//!
//! Every rule adds the annotation holes of its stages: parallel outer loops (when the target
//! has more than one thread), vectorization of the innermost loop, and an
//! `auto_unroll_max_step`. Vector lanes come from the [`TargetDesc`], per dtype.

mod builder;
mod cpu_default;
mod gpu;
mod gpu_reduce;
mod inline;
mod multi_level_tiling;
mod plain;
mod rfactor;
mod row_wise;

pub use builder::SketchBuilder;
pub use cpu_default::{cpu_default_schedule, CPU_DEFAULT_DRAWS};
pub use gpu::{
    default_schedule, AutoBind, DefaultGpuSchedule, DefaultScore, GpuInline, GpuTiling,
    DEFAULT_DRAWS, DEFAULT_LOCAL_BYTES, DEFAULT_THREADS, GPU_UNROLL_STEPS, MAX_THREADS,
};
pub use gpu_reduce::CrossThreadReduction;
pub use inline::AlwaysInline;
pub use multi_level_tiling::{MultiLevelTiling, StructureError, REGISTER_TILE_VECTORS};
pub use plain::Plain;
pub use rfactor::Rfactor;
pub use row_wise::RowWise;

use super::{ChoiceKind, Sketch, SketchStep};
use crate::options::TuneOptions;
use tensortune_schedules::schedule::ScheduleError;
use tensortune_schedules::target::TargetDesc;
use tensortune_schedules::te::OpKind;
use tensortune_schedules::{ComputeDag, Expr, TensorId};

/// Why a rule could not build its variant of a stage; the variant is then left out (another
/// rule or variant still covers the stage).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum RuleError {
    /// A schedule step refused.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// No stage computes the tensor.
    #[error("no stage computes tensor {}", .0 .0)]
    NoStageOf(TensorId),
    /// No stage at the position.
    #[error("no stage at position {0}")]
    NoStage(u32),
    /// The stage has no loop at the position.
    #[error("stage {stage} has no loop {iter}")]
    NoLoop {
        /// Stage position.
        stage: u32,
        /// Loop position.
        iter: u32,
    },
}

/// Whether a rule applies to a stage, and whether the rules after it may too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applies {
    /// It does not.
    No,
    /// It does; later rules are asked as well.
    Yes,
    /// It does, and the stage takes no other rule's variants.
    AndSkipRest,
}

/// What a rule may read about the workload and the machine.
pub struct RuleContext<'a> {
    /// The workload.
    pub dag: &'a ComputeDag,
    /// The search's options (unroll steps).
    pub opts: &'a TuneOptions,
    /// The machine.
    pub target: &'a TargetDesc,
    /// Reductions and the elementwise consumer each is fused with ([`fusion_pairs`]).
    pub fused: Vec<(TensorId, TensorId)>,
}

impl RuleContext<'_> {
    /// Vector lanes for the elements of tensor `t` of the DAG on the target (stages a rule
    /// adds, such as a cache, take the lanes of the tensor they hold).
    pub fn lanes(&self, t: TensorId) -> i64 {
        self.target.vector_lanes(self.dag.op(t).dtype)
    }

    /// The consumer `t` is fused with, if any.
    pub fn fused_consumer(&self, t: TensorId) -> Option<TensorId> {
        self.fused.iter().find(|&&(p, _)| p == t).map(|&(_, c)| c)
    }
}

/// One variant a rule makes of a stage: its name in the sketch's name, and the builder with
/// the stage's steps added (or why they could not be).
pub type Variant = (String, Result<SketchBuilder, RuleError>);

/// A sketch rule.
pub trait SketchRule: Send + Sync {
    /// A short name, for messages.
    fn name(&self) -> &str;

    /// Whether the rule applies to the stage computing `t`.
    fn applies(&self, cx: &RuleContext, t: TensorId) -> Applies;

    /// The variants of the stage computing `t`, each built on a copy of `b`.
    fn apply(&self, cx: &RuleContext, b: &SketchBuilder, t: TensorId) -> Vec<Variant>;
}

/// The schedule `dag` runs on `target` without a record: the GPU's default
/// ([`default_schedule`]) on a CUDA target, else the CPU's ([`cpu_default_schedule`]).
pub fn default_for_target(
    dag: &tensortune_schedules::ComputeDag,
    target: &TargetDesc,
) -> tensortune_schedules::schedule::State {
    match target {
        TargetDesc::Cuda(d) => default_schedule(dag, d).0,
        cpu => cpu_default_schedule(dag, cpu),
    }
}

/// The CPU's rules, in the order they are asked (see the module doc).
pub fn cpu_rules() -> Vec<Box<dyn SketchRule>> {
    vec![
        Box::new(RowWise),
        Box::new(AlwaysInline),
        Box::new(MultiLevelTiling::cpu()),
        Box::new(Plain),
        Box::new(Rfactor),
    ]
}

/// The GPU's rules, in the order they are asked (see [`GpuTiling`] and the others' docs).
/// [`CrossThreadReduction`] comes after the tiling (which takes reductions with reuse) and
/// before [`AutoBind`]: it takes softmax's stages alone, and adds its variant of an output
/// reduction beside AutoBind's.
pub fn gpu_rules() -> Vec<Box<dyn SketchRule>> {
    vec![
        Box::new(GpuInline),
        Box::new(GpuTiling),
        Box::new(CrossThreadReduction),
        Box::new(AutoBind),
    ]
}

/// The sketches of `dag` on the CPU the search assumes when given no target: 512-bit vectors
/// (16 f32 lanes, one AVX-512 register) and `opts.threads` threads.
pub fn generate(dag: &ComputeDag, opts: &TuneOptions) -> Vec<Sketch> {
    generate_for(dag, opts, &default_target(opts), &cpu_rules())
}

/// The target [`generate`] assumes.
pub fn default_target(opts: &TuneOptions) -> TargetDesc {
    TargetDesc::cpu(512, opts.threads)
}

/// The sketches `rules` make of `dag` on `target` (at least one where some rule applies to
/// every stage, as [`Plain`] does).
pub fn generate_for(
    dag: &ComputeDag,
    opts: &TuneOptions,
    target: &TargetDesc,
    rules: &[Box<dyn SketchRule>],
) -> Vec<Sketch> {
    let cx = RuleContext {
        dag,
        opts,
        target,
        fused: fusion_pairs(dag),
    };
    let mut builders = vec![SketchBuilder::new(dag)];
    for i in (0..dag.num_ops()).rev() {
        let t = TensorId(i as u32);
        // A fused consumer is tiled by its producer's rule.
        if matches!(dag.op(t).kind, OpKind::Placeholder) || cx.fused.iter().any(|&(_, c)| c == t) {
            continue;
        }
        let next = stage_variants(&cx, rules, &builders, t);
        if !next.is_empty() {
            builders = next;
        }
    }
    builders.into_iter().map(SketchBuilder::finish).collect()
}

/// Every builder extended by every variant the rules make of the stage computing `t`.
fn stage_variants(
    cx: &RuleContext,
    rules: &[Box<dyn SketchRule>],
    builders: &[SketchBuilder],
    t: TensorId,
) -> Vec<SketchBuilder> {
    let mut next = Vec::new();
    for b in builders {
        for rule in rules {
            let applies = rule.applies(cx, t);
            if applies == Applies::No {
                continue;
            }
            for (name, r) in rule.apply(cx, b, t) {
                if let Ok(mut nb) = r {
                    nb.name(&cx.dag.op(t).name, &name);
                    next.push(nb);
                }
            }
            if applies == Applies::AndSkipRest {
                break;
            }
        }
    }
    next
}

/// The annotation holes of the stage at `stage`: parallel outer loops (up to 4, when the
/// target has threads), the innermost loop vectorized within `lanes` (with `by_region`, by the
/// extent bound inference gives it, up to the lanes of a copy:
/// [`SketchStep::VectorizeRegion`]), and an unroll limit.
pub(crate) fn annotate(
    cx: &RuleContext,
    b: &mut SketchBuilder,
    stage: u32,
    lanes: i64,
    by_region: bool,
) -> Result<(), RuleError> {
    let tensor = b.tensor(stage)?;
    if cx.target.threads() > 1 {
        let n = b.stage_leaves(stage)? as i64;
        let hole = b.choice((1..=n.clamp(1, 4)).collect(), ChoiceKind::Parallel);
        b.defer(SketchStep::ParallelOuter { tensor, hole });
    }
    b.defer(if by_region {
        SketchStep::VectorizeRegion {
            tensor,
            max_lanes: lanes * 4,
        }
    } else {
        SketchStep::VectorizeInnermost {
            tensor,
            max_lanes: lanes,
        }
    });
    unroll_hole(cx, b, tensor);
    Ok(())
}

/// An `auto_unroll_max_step` hole on the stage of `tensor`, over the options' unroll steps.
pub(crate) fn unroll_hole(cx: &RuleContext, b: &mut SketchBuilder, tensor: TensorId) {
    let choices = cx.opts.unroll_steps.iter().map(|&u| u as i64).collect();
    let hole = b.choice(choices, ChoiceKind::Unroll);
    b.defer(SketchStep::AutoUnroll { tensor, hole });
}

/// True for a reduction that reads some input independently of one of its spatial axes,
/// so a tile of outputs reuses input elements.
pub fn has_data_reuse(dag: &ComputeDag, t: TensorId) -> bool {
    let op = dag.op(t);
    let OpKind::Compute {
        axes,
        body: Expr::Reduce { source, .. },
    } = &op.kind
    else {
        return false;
    };
    let mut reuse = false;
    source.visit(&mut |e| {
        if let Expr::Load { indices, .. } = e {
            let uses = |id: u32| indices.iter().any(|i| i.uses_var(id));
            reuse |= axes.iter().any(|a| !uses(a.var.id));
        }
    });
    reuse
}

/// True for a reduction that reads some input element by element once per evaluation: a load
/// whose indices are loop variables, among them every loop of the stage longer than one
/// (spatial and reduce), such as
/// the weights of a dense layer with one row (GEMV). Such a stage is bound by the bandwidth
/// of that stream, whatever the tiling of the others; the tiling rule then also lets
/// [`Rfactor`] offer vector lanes along the stream's reduce axis, so its loads are contiguous.
pub fn streams_an_input(dag: &ComputeDag, t: TensorId) -> bool {
    let op = dag.op(t);
    let OpKind::Compute {
        axes,
        body: Expr::Reduce {
            source,
            axes: reduce,
            ..
        },
    } = &op.kind
    else {
        return false;
    };
    let mut streams = false;
    source.visit(&mut |e| {
        if let Expr::Load { indices, .. } = e {
            // Each index one loop variable, every loop longer than one among them: each
            // element is read once (a window or a broadcast reads some elements again).
            let plain = |id: u32| {
                indices
                    .iter()
                    .any(|i| matches!(i, Expr::Var(v) if v.id == id))
            };
            streams |= indices
                .iter()
                .all(|i| matches!(i, Expr::Var(_) | Expr::Const(_)))
                && axes
                    .iter()
                    .chain(reduce)
                    .all(|a| a.extent <= 1 || plain(a.var.id));
        }
    });
    streams
}

/// True for a stage that some later stage reads and that is not an output, and whose body is
/// injective: it can be inlined into its readers.
pub fn inlinable(dag: &ComputeDag, t: TensorId) -> bool {
    let info = dag.info(t);
    info.injective && !dag.outputs().contains(&t) && !info.consumers.is_empty()
}

/// Pairs (reduction with reuse, its consumer) where the consumer is the reduction's only
/// reader once injective stages are inlined, an output of the same shape, and injective: an
/// epilogue (bias, relu) that can take the outer tile levels.
pub fn fusion_pairs(dag: &ComputeDag) -> Vec<(TensorId, TensorId)> {
    let mut pairs = Vec::new();
    for i in 0..dag.num_ops() {
        let t = TensorId(i as u32);
        if dag.info(t).combiner.is_none() || !has_data_reuse(dag, t) {
            continue;
        }
        let mut readers = Vec::new();
        let mut work = dag.info(t).consumers.clone();
        while let Some(c) = work.pop() {
            if inlinable(dag, c) {
                work.extend(dag.info(c).consumers.iter().copied());
            } else if !readers.contains(&c) {
                readers.push(c);
            }
        }
        if let [c] = readers.as_slice() {
            let ok = dag.outputs().contains(c)
                && dag.info(*c).injective
                && dag.op(*c).shape == dag.op(t).shape;
            if ok {
                pairs.push((t, *c));
            }
        }
    }
    pairs
}

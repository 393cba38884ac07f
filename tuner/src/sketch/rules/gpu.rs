//! The GPU's rules ([`gpu_rules`](super::gpu_rules)): every stage's loops end up bound to
//! blocks and threads, or computed inside a thread's loops.
//!
//! - [`GpuInline`]: an injective stage that is not an output is inlined (on a GPU a root
//!   padding copy would be a second loop nest that other blocks read: a race);
//! - [`GpuTiling`]: a reduction with data reuse (matmul, batch matmul, dense, conv2d) is
//!   tiled in four spatial levels and two reduce levels (Ansor's `SSSRRSRS`). The outer
//!   stage (the fused elementwise consumer, or a copy-out stage after a local cache write)
//!   takes the spatial levels: the outermost of every axis fused and bound to `blockIdx.x`;
//!   the next of every axis fused and bound to `vthread`, at most [`MAX_VTHREAD`] virtual
//!   threads in all (one [`ProductCap`](crate::sketch::ProductCap) over the axes' factors,
//!   so that no draw or mutation is spent on a loop the GPU verifier rejects); the next of
//!   every axis fused and bound to `threadIdx.x`; the last the tile of outputs one thread
//!   computes per virtual thread, at most [`MAX_THREAD_TILE`] outputs per thread in all and
//!   unrolled, so that its accumulators stay in registers. With virtual threads a thread's
//!   tiles lie `threads x inner` apart along each axis, so that neighbouring threads read
//!   neighbouring words of the shared copies (no bank conflicts) and store neighbouring
//!   outputs; lowering runs what the virtual threads share once
//!   (`tensortune_schedules::lower`). The
//!   accumulator is computed inside the thread loop, its reduction split into steps; each
//!   input it reads is staged through shared memory at the last outer reduce loop (one step
//!   of the reduction for the whole block), fetched by all the block's threads together: the
//!   copy's loops fused and split by the thread count and by 1, 2 or 4 vector lanes (a
//!   hole), so that a thread moves up to 16 consecutive bytes with one load and one store
//!   ([`SketchStep::CooperativeFetch`]); each copy's tile is drawn within its share of the
//!   block's shared memory. A second variant (`+kmajor`) stores the copies of operands
//!   indexed by the reduction last reduction-first (see [`reduction_major`]).
//! - [`AutoBind`]: any other stage: computed inside its single consumer's thread loop when it
//!   has one, else its spatial loops fused, split by a thread count and bound to
//!   `blockIdx.x` / `threadIdx.x`; its reduction (if any) runs serially in each thread.
//!
//! A stage read by several stages that is not an output (softmax's row maximum) is left to
//! `CrossThreadReduction` (`gpu_reduce.rs`), which computes it per row inside the block as a
//! cross-thread reduction; [`AutoBind`] does not bind it, since as a second root loop nest
//! its results would be read by other blocks in the same launch (see [`AutoBind::applies`]).

use super::{Applies, RuleContext, RuleError, SketchBuilder, SketchRule, Variant};
use crate::sketch::{ChoiceKind, SketchStep};
use tensortune_schedules::gpu::verify::{GpuUsage, MAX_VTHREAD};
use tensortune_schedules::ir::{Scope, ThreadAxis};
use tensortune_schedules::schedule::IterKind;
use tensortune_schedules::target::STATIC_SHARED_PER_BLOCK;
use tensortune_schedules::te::OpKind;
use tensortune_schedules::trace::{Annotation, Step};
use tensortune_schedules::TensorId;

/// `auto_unroll_max_step` values searched on the GPU (MetaSchedule's CUDA defaults).
pub const GPU_UNROLL_STEPS: [i64; 5] = [0, 16, 64, 512, 1024];

/// Most threads a rule puts in one block.
pub const MAX_THREADS: i64 = 1024;

/// Most outputs one thread accumulates (its virtual threads' tiles together). The
/// accumulator is a local array, in registers only where every loop over it is unrolled
/// and the registers suffice; otherwise it lives in local memory, loaded and stored around
/// each FMA, as most unbounded draws of large shapes did. With the loops unrolled, this
/// bound kept the draws checked in registers and twice it did not (docs/measurements.md,
/// "Per-thread tiles in registers").
pub const MAX_THREAD_TILE: i64 = 64;

/// Inlines injective stages that are not outputs.
pub struct GpuInline;

impl SketchRule for GpuInline {
    fn name(&self) -> &str {
        "gpu-inline"
    }

    fn applies(&self, cx: &RuleContext, t: TensorId) -> Applies {
        if super::inlinable(cx.dag, t) {
            Applies::AndSkipRest
        } else {
            Applies::No
        }
    }

    fn apply(&self, _cx: &RuleContext, b: &SketchBuilder, t: TensorId) -> Vec<Variant> {
        let mut nb = b.clone();
        let r = nb
            .pos(t)
            .and_then(|p| nb.fixed(Step::ComputeInline { stage: p }))
            .map(|()| nb);
        vec![("inline".to_string(), r)]
    }
}

/// Multi-level tiling for the GPU (see the module doc).
pub struct GpuTiling;

impl SketchRule for GpuTiling {
    fn name(&self) -> &str {
        "gpu-tiling"
    }

    fn applies(&self, cx: &RuleContext, t: TensorId) -> Applies {
        if cx.dag.info(t).combiner.is_some() && super::has_data_reuse(cx.dag, t) {
            Applies::AndSkipRest
        } else {
            Applies::No
        }
    }

    fn apply(&self, cx: &RuleContext, b: &SketchBuilder, t: TensorId) -> Vec<Variant> {
        let fused = cx.fused_consumer(t);
        let name = if fused.is_some() {
            "gpu-tile+fuse"
        } else {
            "gpu-tile"
        };
        let mut v = vec![(name.to_string(), gpu_tile(cx, b, t, fused, false))];
        if reads(cx, t)
            .iter()
            .any(|&x| reduction_major(cx, t, x).is_some())
        {
            v.push((format!("{name}+kmajor"), gpu_tile(cx, b, t, fused, true)));
        }
        v
    }
}

/// The tensors `t` reads, in first-use order.
fn reads(cx: &RuleContext, t: TensorId) -> Vec<TensorId> {
    let mut read: Vec<TensorId> = Vec::new();
    if let OpKind::Compute { body, .. } = &cx.dag.op(t).kind {
        body.visit(&mut |e| {
            if let tensortune_schedules::Expr::Load { tensor, .. } = e {
                if !read.contains(tensor) {
                    read.push(*tensor);
                }
            }
        });
    }
    read
}

/// For an input `x` of `t` indexed by plain variables, its last index a reduce axis and an
/// earlier one an output axis (A[i, k] of matmul, W[j, k] of dense): the storage order that
/// puts its reduce axes first. Stored so in shared memory, the values a thread's tile reads
/// at one reduction step (A[i..i+8, k]) are consecutive words, a few wide shared loads
/// rather than one per value; the fetch then stores across the copy (the trade the
/// `+kmajor` sketch lets the search weigh).
fn reduction_major(cx: &RuleContext, t: TensorId, x: TensorId) -> Option<Vec<u32>> {
    let OpKind::Compute { axes, body } = &cx.dag.op(t).kind else {
        return None;
    };
    let reduce: Vec<u32> = cx
        .dag
        .info(t)
        .reduce_axes
        .iter()
        .map(|a| a.var.id)
        .collect();
    let spatial: Vec<u32> = axes.iter().map(|a| a.var.id).collect();
    let mut found: Option<Vec<u32>> = None;
    body.visit(&mut |e| {
        if let tensortune_schedules::Expr::Load {
            tensor, indices, ..
        } = e
        {
            if *tensor != x || found.is_some() {
                return;
            }
            let vars: Option<Vec<u32>> = indices
                .iter()
                .map(|i| match i {
                    tensortune_schedules::Expr::Var(v) => Some(v.id),
                    _ => None,
                })
                .collect();
            let Some(vars) = vars else { return };
            let last_reduces = vars.last().is_some_and(|v| reduce.contains(v));
            let spatial_before = vars.iter().any(|v| spatial.contains(v));
            if last_reduces && spatial_before {
                let (r, o): (Vec<u32>, Vec<u32>) =
                    (0..vars.len() as u32).partition(|&d| reduce.contains(&vars[d as usize]));
                found = Some(r.into_iter().chain(o).collect());
            }
        }
    });
    found
}

fn gpu_tile(
    cx: &RuleContext,
    b: &SketchBuilder,
    t: TensorId,
    consumer: Option<TensorId>,
    k_major: bool,
) -> Result<SketchBuilder, RuleError> {
    let mut b = b.clone();
    let (ct, ot) = match consumer {
        Some(c) => (t, c),
        None => {
            let p = b.pos(t)?;
            b.fixed(Step::CacheWrite {
                stage: p,
                scope: Scope::Local,
            })?;
            (b.tensor(p)?, b.tensor(p + 1)?)
        }
    };
    // Inputs read by the accumulator, each through a shared copy where the schedule allows
    // one (a read through an inlined stage does not: the copy would need the inlined
    // stage's reader).
    let mut shared = Vec::new();
    for x in reads(cx, t) {
        let mut trial = b.clone();
        let order = reduction_major(cx, t, x).filter(|_| k_major);
        let step = trial.pos(x).and_then(|xp| {
            let readers = vec![trial.pos(ct)?];
            trial.fixed(Step::CacheRead {
                stage: xp,
                scope: Scope::Shared,
                readers,
            })?;
            if let Some(order) = order {
                trial.fixed(Step::ReorderStorage {
                    stage: xp + 1,
                    order,
                })?;
            }
            trial.tensor(xp + 1)
        });
        if let Ok(copy) = step {
            b = trial;
            shared.push((copy, cx.dag.op(x).dtype, x));
        }
    }
    // The outer stage: every axis split block, vthread, thread, inner (i j -> i.0 i.1 i.2
    // i.3 j.0 j.1 j.2 j.3), reordered by level (i.0 j.0 i.1 j.1 i.2 j.2 i.3 j.3); each level
    // but the inner one fused (and bound to blocks, virtual threads, threads). The virtual
    // threads of all axes share one bound, the verifier's limit on the fused loop.
    let outer = b.pos(ot)?;
    let ns = cx.dag.op(t).shape.len();
    let mut holes = vec![0; ns];
    for a in (0..ns).rev() {
        holes[a] = b.split_capped(outer, a as u32, 4, None, Some(MAX_VTHREAD))?;
    }
    b.cap_product(holes.iter().map(|&h| (h, 0)).collect(), MAX_VTHREAD);
    // A thread's accumulators: its virtual threads times its inner tile, over every axis.
    b.cap_product(
        holes.iter().flat_map(|&h| [(h, 0), (h, 2)]).collect(),
        MAX_THREAD_TILE,
    );
    b.cap_product(holes.iter().map(|&h| (h, 1)).collect(), MAX_THREADS);
    let order = (0..4)
        .flat_map(|l| (0..ns).map(move |a| (4 * a + l) as u32))
        .collect();
    b.fixed(Step::Reorder {
        stage: outer,
        order,
    })?;
    if ns > 1 {
        for level in 0..3u32 {
            b.fixed(Step::Fuse {
                stage: outer,
                iters: (level..level + ns as u32).collect(),
            })?;
        }
    }
    for (iter, axis) in [
        (0, ThreadAxis::BlockX),
        (1, ThreadAxis::VThread),
        (2, ThreadAxis::ThreadX),
    ] {
        b.fixed(Step::Annotate {
            stage: outer,
            iter,
            annotation: Annotation::Bind(axis),
        })?;
    }
    // A thread's own tile of the outer stage (the copy out of its accumulators, or the
    // fused consumer) is unrolled whole: a rolled loop reading the accumulator array with a
    // variable index keeps that array in local memory even where the accumulating loops are
    // unrolled (docs/measurements.md, "Per-thread tiles in registers").
    for iter in 3..3 + ns as u32 {
        b.fixed(Step::Annotate {
            stage: outer,
            iter,
            annotation: Annotation::Unroll,
        })?;
    }
    // The thread level: the second factor of each hole.
    let thread_factors: Vec<(usize, usize)> = holes.iter().map(|&h| (h, 1)).collect();
    let compute = b.pos(ct)?;
    b.fixed(Step::ComputeAt {
        stage: compute,
        target: outer,
        iter: 2,
    })?;
    // The accumulator: its region's ns loops, then the reduce axes, each split in two and
    // the outer halves first: r.0 ... r.1 ... spatial.
    let nr = cx.dag.info(t).reduce_axes.len();
    let mut reduce_holes = vec![0; nr];
    for r in (0..nr).rev() {
        reduce_holes[r] = b.split(compute, (ns + r) as u32, 2, None)?;
    }
    shared_caps(cx, &mut b, t, &shared, &holes, &reduce_holes);
    let order = (0..nr)
        .map(|r| (ns + 2 * r) as u32)
        .chain((0..nr).map(|r| (ns + 2 * r + 1) as u32))
        .chain(0..ns as u32)
        .collect();
    b.fixed(Step::Reorder {
        stage: compute,
        order,
    })?;
    // The accumulating loops over the thread's tile, unrolled whatever the unroll hole
    // draws, for the same reason as the outer stage's.
    for iter in 2 * nr..2 * nr + ns {
        b.fixed(Step::Annotate {
            stage: compute,
            iter: iter as u32,
            annotation: Annotation::Unroll,
        })?;
    }
    for (copy, dtype, _) in shared {
        let p = b.pos(copy)?;
        let target = b.pos(ct)?;
        b.fixed(Step::ComputeAt {
            stage: p,
            target,
            iter: nr.saturating_sub(1) as u32,
        })?;
        let lanes_hole = Some(b.choice(fetch_lanes(dtype), ChoiceKind::Lanes));
        b.defer(SketchStep::CooperativeFetch {
            tensor: copy,
            thread_holes: thread_factors.clone(),
            lanes_hole,
        });
    }
    unroll(&mut b, ct);
    Ok(b)
}

/// Bounds each shared copy's tile by its share of the block's shared memory: the product of
/// the block's extents (virtual threads x threads x inner) along the output axes its index
/// uses and of the reduction step along the reduce axes it uses, at most an equal share of
/// [`STATIC_SHARED_PER_BLOCK`] in elements. Drawn unbounded, most draws of large shapes were
/// over it and only the verifier caught them. A
/// window's halo (conv2d's `y + ry`) is not counted, so the verifier still has the last
/// word.
fn shared_caps(
    cx: &RuleContext,
    b: &mut SketchBuilder,
    t: TensorId,
    shared: &[(TensorId, tensortune_schedules::DType, TensorId)],
    holes: &[usize],
    reduce_holes: &[usize],
) {
    let OpKind::Compute { axes, body } = &cx.dag.op(t).kind else {
        return;
    };
    let reduce = &cx.dag.info(t).reduce_axes;
    let share = STATIC_SHARED_PER_BLOCK / shared.len().max(1) as u64;
    for &(_, dtype, input) in shared {
        let uses = |id: u32| {
            let mut found = false;
            body.visit(&mut |e| {
                if let tensortune_schedules::Expr::Load {
                    tensor, indices, ..
                } = e
                {
                    found |= *tensor == input && indices.iter().any(|i| i.uses_var(id));
                }
            });
            found
        };
        let mut factors = Vec::new();
        for (a, &h) in holes.iter().enumerate() {
            if axes.get(a).is_some_and(|ax| uses(ax.var.id)) {
                factors.extend([(h, 0), (h, 1), (h, 2)]);
            }
        }
        for (r, &h) in reduce_holes.iter().enumerate() {
            if reduce.get(r).is_some_and(|ax| uses(ax.var.id)) {
                factors.push((h, 0));
            }
        }
        if !factors.is_empty() {
            b.cap_product(factors, (share / dtype.bytes().max(1) as u64) as i64);
        }
    }
}

/// The lanes a thread's share of a cooperative fetch may have: 1, 2 and 4 elements, up to
/// the 16 bytes of the widest GPU load (`ld.global.v4.f32`); Ansor and MetaSchedule search
/// the same three for f32.
fn fetch_lanes(dtype: tensortune_schedules::DType) -> Vec<i64> {
    let widest =
        (tensortune_schedules::gpu::verify::MAX_VECTOR_BYTES / dtype.bytes().max(1) as u64) as i64;
    [1, 2, 4].into_iter().filter(|&l| l <= widest).collect()
}

/// An unroll hole over [`GPU_UNROLL_STEPS`] on the stage of `tensor`.
fn unroll(b: &mut SketchBuilder, tensor: TensorId) {
    let hole = b.choice(GPU_UNROLL_STEPS.to_vec(), ChoiceKind::Unroll);
    b.defer(SketchStep::AutoUnroll { tensor, hole });
}

/// Binds a stage's spatial loops to blocks and threads, or computes it in its consumer's
/// thread (see the module doc).
pub struct AutoBind;

impl SketchRule for AutoBind {
    fn name(&self) -> &str {
        "auto-bind"
    }

    /// Every stage that is an output or has one reader.
    fn applies(&self, cx: &RuleContext, t: TensorId) -> Applies {
        let info = cx.dag.info(t);
        if cx.dag.outputs().contains(&t) || info.consumers.len() == 1 {
            Applies::AndSkipRest
        } else {
            Applies::No
        }
    }

    fn apply(&self, _cx: &RuleContext, b: &SketchBuilder, t: TensorId) -> Vec<Variant> {
        vec![("bind".to_string(), auto_bind(b, t))]
    }
}

fn auto_bind(b: &SketchBuilder, t: TensorId) -> Result<SketchBuilder, RuleError> {
    let mut b = b.clone();
    let p = b.pos(t)?;
    // Inside the single consumer's thread loop, where it has one.
    if let [c] = b.state.effective_consumers(t).as_slice() {
        let cp = b.pos(*c)?;
        let cst = b.state.stage(cp as usize).ok_or(RuleError::NoStage(cp))?;
        let at = cst
            .leaves
            .iter()
            .position(|&l| cst.iter(l).annotation == Some(Annotation::Bind(ThreadAxis::ThreadX)));
        if let Some(at) = at {
            b.fixed(Step::ComputeAt {
                stage: p,
                target: cp,
                iter: at as u32,
            })?;
            unroll(&mut b, t);
            return Ok(b);
        }
        if !b.state.is_output(t) {
            return Err(RuleError::NoStage(cp));
        }
    } else if !b.state.is_output(t) {
        // Read by several stages (once inlined stages are seen through): as a root nest of
        // its own, other blocks of the same launch would read what it writes.
        return Err(RuleError::NoStage(p));
    }
    let st = b.state.stage(p as usize).ok_or(RuleError::NoStage(p))?;
    let spatial = st
        .leaves
        .iter()
        .take_while(|&&l| st.iter(l).kind == IterKind::Spatial)
        .count();
    if spatial == 0 {
        // A reduction to one value: spreading it needs a cross-thread reduction (not built
        // yet); unbound, it stays a one-thread kernel.
        return Err(RuleError::NoLoop { stage: p, iter: 0 });
    }
    if spatial > 1 {
        b.fixed(Step::Fuse {
            stage: p,
            iters: (0..spatial as u32).collect(),
        })?;
    }
    b.split(p, 0, 2, Some(MAX_THREADS))?;
    for (iter, axis) in [(0, ThreadAxis::BlockX), (1, ThreadAxis::ThreadX)] {
        b.fixed(Step::Annotate {
            stage: p,
            iter,
            annotation: Annotation::Bind(axis),
        })?;
    }
    unroll(&mut b, t);
    Ok(b)
}

/// What [`default_schedule`] settled on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DefaultGpuSchedule {
    /// A draw of the named GPU sketch that passed the GPU verifier: the best of the draws
    /// by [`DefaultScore`].
    Sketch(String),
    /// No GPU sketch verified (or none covers the DAG): the unbound schedule, a kernel of
    /// one thread. Correct, and slow.
    OneThread,
}

/// Draws [`default_schedule`] makes and ranks before it falls back to one thread. Lowering
/// and verifying one draw is cheap whatever the extents (lowering is symbolic in them):
/// 512 draws took 75 ms for a 4096³ matmul and 230 ms for a 3x3 conv2d of 16x64x56x56 (release
/// build, 2 cores of an AMD EPYC). Where 64 draws left a 512³ matmul at 4 blocks of 2
/// threads, 512 give a large matmul 256-thread blocks with 32 accumulators a thread (1024
/// found nothing better on those shapes).
pub const DEFAULT_DRAWS: usize = 512;

/// Bytes of `Local` temporaries one thread may hold and still keep them in registers: 64
/// floats, a quarter of the 255 registers a thread may have, the rest left for addresses,
/// loaded operands and the unrolled body. Past it `ptxas` spills to local memory (DRAM).
pub const DEFAULT_LOCAL_BYTES: u64 = 64 * 4;

/// Threads per block [`default_schedule`] aims for: 256 (8 warps) lets two or more blocks
/// share a multiprocessor and leaves each thread room in registers.
pub const DEFAULT_THREADS: u64 = 256;

/// The static score by which [`default_schedule`] ranks verified draws without running
/// them; lower is better and the fields compare in order (the derived `Ord`), so an earlier
/// criterion always outweighs a later one. It reads only the verifier's [`GpuUsage`]: no
/// cost model, no measurement, the same on every machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DefaultScore {
    /// 1 when the block is not a whole number of warps (lanes of its last warp idle).
    pub partial_warp: u8,
    /// 1 when a thread holds more than [`DEFAULT_LOCAL_BYTES`] of local temporaries
    /// (spills to local memory, which is DRAM, on every access of the accumulator).
    pub spills: u8,
    /// 1 when the threads per block are outside 128..=512: fewer leave a multiprocessor
    /// short of warps to hide latency with; more crowd out registers.
    pub off_band: u8,
    /// Blocks short of two per multiprocessor (0 once there are that many): a launch with
    /// fewer leaves multiprocessors idle. A shortfall rather than a flag, so that where no
    /// draw reaches the target (a small workload) the draw with the most blocks wins.
    pub blocks_short: u64,
    /// Distance of the threads per block from [`DEFAULT_THREADS`], in factors of two
    /// (|log2 threads - 8|, rounded down).
    pub thread_distance: u32,
    /// Free local bytes under [`DEFAULT_LOCAL_BYTES`]: among draws alike so far, the one
    /// whose threads each compute more outputs from registers (more reuse of each loaded
    /// operand) wins.
    pub local_room: u64,
}

impl DefaultScore {
    /// The score of a kernel with usage `u` on the GPU `desc`.
    pub fn of(u: &GpuUsage, desc: &tensortune_schedules::target::CudaDesc) -> Self {
        let threads = u.launch.threads_per_block().max(1);
        let blocks: u64 = u.launch.grid.iter().map(|&g| g as u64).product();
        let want_blocks = 2 * desc.multiprocessors as u64;
        let log2 = 63 - threads.leading_zeros();
        let want_log2 = 63 - DEFAULT_THREADS.leading_zeros();
        DefaultScore {
            partial_warp: u8::from(!u.whole_warps),
            spills: u8::from(u.local_bytes > DEFAULT_LOCAL_BYTES),
            off_band: u8::from(!(128..=512).contains(&threads)),
            blocks_short: want_blocks.saturating_sub(blocks),
            thread_distance: log2.abs_diff(want_log2),
            local_room: DEFAULT_LOCAL_BYTES.saturating_sub(u.local_bytes),
        }
    }
}

/// A sound schedule of `dag` on the GPU `desc` without tuning: of [`DEFAULT_DRAWS`] seeded
/// random instances of the GPU sketches (the same every run, the sketches taken in turn),
/// those that lower and pass the GPU verifier are ranked by [`DefaultScore`], ties going to
/// the earlier draw, so the choice is deterministic. Without any verified draw it is the
/// unbound schedule (one thread of one block).
pub fn default_schedule(
    dag: &tensortune_schedules::ComputeDag,
    desc: &tensortune_schedules::target::CudaDesc,
) -> (tensortune_schedules::schedule::State, DefaultGpuSchedule) {
    use rand::SeedableRng;
    let opts = crate::TuneOptions::default();
    let target = tensortune_schedules::target::TargetDesc::Cuda(desc.clone());
    let sketches = super::generate_for(dag, &opts, &target, &super::gpu_rules());
    let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(0);
    // The best so far: its score, state and sketch. A strictly lower score replaces it, so
    // a tie keeps the earlier draw.
    let mut best: Option<(DefaultScore, tensortune_schedules::schedule::State, usize)> = None;
    if !sketches.is_empty() {
        for n in 0..DEFAULT_DRAWS {
            let k = n % sketches.len();
            let dec = crate::sketch::sample::sample(&sketches[k], &mut rng, &opts);
            let Ok(s) = sketches[k].instantiate(dag, &dec) else {
                continue;
            };
            let Some(usage) = tensortune_schedules::lower::lower(&s)
                .ok()
                .and_then(|f| tensortune_schedules::gpu::verify::verify_gpu(&f, desc).ok())
            else {
                continue;
            };
            let score = DefaultScore::of(&usage, desc);
            if best.as_ref().is_none_or(|(b, _, _)| score < *b) {
                best = Some((score, s, k));
            }
        }
    }
    match best {
        Some((_, s, k)) => (s, DefaultGpuSchedule::Sketch(sketches[k].name.clone())),
        None => (
            tensortune_schedules::schedule::State::new(dag),
            DefaultGpuSchedule::OneThread,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensortune_schedules::gpu::LaunchDims;
    use tensortune_schedules::target::CudaDesc;

    fn usage(blocks: u32, threads: u32, local_bytes: u64) -> GpuUsage {
        GpuUsage {
            launch: LaunchDims {
                grid: [blocks, 1, 1],
                block: [threads, 1, 1],
            },
            shared_bytes: 0,
            local_bytes,
            whole_warps: threads.is_multiple_of(32),
        }
    }

    fn sm90() -> CudaDesc {
        CudaDesc::for_arch("sm_90").expect("sm_90 is known")
    }

    #[test]
    fn the_score_ranks_warps_then_registers_then_band_then_blocks_then_threads() {
        let d = sm90();
        let score = |b, t, l| DefaultScore::of(&usage(b, t, l), &d);
        let good = score(1024, 256, 64);
        // Each criterion outweighs every later one.
        assert!(good < score(1024, 250, 64), "a partial warp loses");
        assert!(
            score(4, 250, 64) > score(1024, 256, 1024),
            "warps before spills"
        );
        assert!(
            score(1024, 256, 512) > score(4, 32, 64),
            "spills before the band"
        );
        assert!(
            score(4, 256, 64) < score(1024, 64, 64),
            "the band before blocks"
        );
        assert!(
            score(100, 128, 64) > score(264, 512, 64),
            "blocks before threads"
        );
        // Past two blocks per multiprocessor blocks no longer count; 256 threads win.
        assert!(score(264, 256, 64) < score(4096, 512, 64));
        assert_eq!(score(264, 256, 64), score(9999, 256, 64));
        // Short of the target, more blocks win.
        assert!(score(200, 256, 64) < score(100, 256, 64));
        // Last, more work per thread within the register budget.
        assert!(score(1024, 256, 256) < score(1024, 256, 4));
    }

    #[test]
    fn an_empty_launch_scores_without_overflow() {
        let s = DefaultScore::of(&usage(0, 0, u64::MAX), &sm90());
        assert_eq!(s.spills, 1);
        assert_eq!(s.local_room, 0);
    }
}

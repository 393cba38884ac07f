//! Sketch rules for the CPU: from a DAG, the program structures worth searching.
//!
//! Stages are visited from the outputs back to the inputs, each taking one rule:
//! - **always inline** an injective stage that is not an output (bias, relu, exp); padding
//!   (a stage that selects) is inlined in one sketch and computed at the root in another;
//! - **multi-level tiling** (`SSRSRS`: four levels per spatial axis, two per reduce axis,
//!   interleaved) of a reduction with data reuse (an input read independently of some
//!   spatial axis: matmul, batch matmul, dense, conv2d, depthwise conv2d). When the stage's
//!   only consumer is an elementwise map of it (relu after dense), the consumer is tiled at the
//!   two outer levels and the stage computed inside its tile (**fusion**); otherwise a
//!   **cache-write** stage holds the accumulator tile and the stage itself copies it out. Where
//!   an input is indexed by the innermost spatial axis (B[k, j] of matmul, W[j, k] of dense),
//!   a second sketch also **packs** it: a cache-read copy of the tile's columns, computed
//!   inside the tile and stored with that axis last, so the register tile reads rows a vector
//!   apart rather than the input's width apart (or, for W, rather than gathering a row apart
//!   per lane);
//! - **rfactor** of a reduction without reuse (softmax's row reductions, reduce_sum), as an
//!   alternative to the plain structure: the innermost reduce loop becomes vector lanes of
//!   partial results;
//! - **plain**: the innermost spatial loop split for vector lanes, a compute location where
//!   the stage has one consumer.
//!
//! A stage with alternatives multiplies the sketches (softmax has four). Every rule adds the
//! annotation holes: parallel outer loops (when threads > 1), vectorization of the innermost
//! loop, and an `auto_unroll_max_step`.

use super::{ChoiceKind, Hole, Sketch, SketchStep};
use crate::options::TuneOptions;
use tensortune_schedules::ir::Scope;
use tensortune_schedules::schedule::{IterKind, ScheduleError, State};
use tensortune_schedules::te::OpKind;
use tensortune_schedules::trace::Step;
use tensortune_schedules::{ComputeDag, Expr, TensorId};

/// Builds a sketch while applying its structure to a scratch state, so the rules can read
/// loop and stage positions as they change.
#[derive(Clone)]
struct Builder {
    state: State,
    steps: Vec<SketchStep>,
    holes: Vec<Hole>,
    /// Annotation steps, applied after every structural step.
    deferred: Vec<SketchStep>,
    names: Vec<String>,
}

impl Builder {
    fn fixed(&mut self, step: Step) -> Result<(), ScheduleError> {
        self.state.apply(&step)?;
        self.steps.push(SketchStep::Fixed(step));
        Ok(())
    }
    fn hole(&mut self, h: Hole) -> usize {
        self.holes.push(h);
        self.holes.len() - 1
    }
    /// Split with a tile hole; the scratch state uses factors of 1 (same loop structure).
    fn split(
        &mut self,
        stage: u32,
        iter: u32,
        parts: usize,
        max_inner: Option<i64>,
    ) -> Result<usize, ScheduleError> {
        let extent = self
            .state
            .stage(stage as usize)
            .and_then(|s| s.leaf(iter as usize))
            .map(|l| l.extent)
            .unwrap_or(1);
        let hole = self.hole(Hole::Tile {
            extent,
            parts,
            max_inner,
        });
        self.state.split(stage, iter, &vec![1; parts - 1])?;
        self.steps.push(SketchStep::Split { stage, iter, hole });
        Ok(hole)
    }
    fn follow(
        &mut self,
        stage: u32,
        iter: u32,
        hole: usize,
        ranges: Vec<(usize, usize)>,
    ) -> Result<(), ScheduleError> {
        self.state.split(stage, iter, &vec![1; ranges.len()])?;
        self.steps.push(SketchStep::FollowSplit {
            stage,
            iter,
            hole,
            ranges,
        });
        Ok(())
    }
    fn pos(&self, t: TensorId) -> u32 {
        self.state.position_of(t).unwrap_or(0) as u32
    }
    fn tensor(&self, stage: u32) -> TensorId {
        self.state
            .stage(stage as usize)
            .map(|s| s.tensor)
            .unwrap_or(TensorId(0))
    }
    fn annotate(&mut self, stage: u32, opts: &TuneOptions) {
        self.annotate_with(stage, opts, false);
    }
    /// The annotation holes; with `by_region`, the innermost loop is vectorized by the extent
    /// bound inference gives it ([`SketchStep::VectorizeRegion`]), up to the lanes of a copy.
    fn annotate_with(&mut self, stage: u32, opts: &TuneOptions, by_region: bool) {
        let tensor = self.tensor(stage);
        if opts.threads > 1 {
            let n = self
                .state
                .stage(stage as usize)
                .map(|s| s.leaves.len())
                .unwrap_or(0) as i64;
            let hole = self.hole(Hole::Choice {
                choices: (1..=n.clamp(1, 4)).collect(),
                kind: ChoiceKind::Parallel,
            });
            self.deferred
                .push(SketchStep::ParallelOuter { tensor, hole });
        }
        self.deferred.push(if by_region {
            SketchStep::VectorizeRegion {
                tensor,
                max_lanes: opts.max_vector_lanes * 4,
            }
        } else {
            SketchStep::VectorizeInnermost {
                tensor,
                max_lanes: opts.max_vector_lanes,
            }
        });
        let hole = self.hole(Hole::Choice {
            choices: opts.unroll_steps.iter().map(|&u| u as i64).collect(),
            kind: ChoiceKind::Unroll,
        });
        self.deferred.push(SketchStep::AutoUnroll { tensor, hole });
    }
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

/// An input worth packing for a tiled reduction, and the position of its index that is the
/// stage's innermost spatial axis: a placeholder indexed by that axis (a plain variable) and
/// not varying with some other spatial axis. B[k, j] of matmul and batch matmul has it last:
/// the register tile reads B along it for successive reduction steps, a row of B apart, and
/// copied into a local buffer over the tile's columns those rows lie a vector apart instead
/// of B's whole width (with rows of 4 KiB, successive rows fall into one set of the L1 cache
/// and evict each other). W[j, k] of dense has it first: the tile's vector lanes would gather
/// W a row apart each, and its copy is stored transposed ([`Step::ReorderStorage`]).
fn packable_input(dag: &ComputeDag, t: TensorId) -> Option<(TensorId, usize)> {
    let OpKind::Compute {
        axes,
        body: Expr::Reduce { source, .. },
    } = &dag.op(t).kind
    else {
        return None;
    };
    let last = axes.last()?.var.id;
    let mut found = None;
    source.visit(&mut |e| {
        if let Expr::Load {
            tensor, indices, ..
        } = e
        {
            let at = indices
                .iter()
                .position(|i| matches!(i, Expr::Var(v) if v.id == last));
            let uses = |id: u32| indices.iter().any(|i| i.uses_var(id));
            let reuse = axes.iter().any(|a| !uses(a.var.id));
            let placeholder = matches!(dag.op(*tensor).kind, OpKind::Placeholder);
            if let (Some(at), true, true, None) = (at, reuse, placeholder, found) {
                found = Some((*tensor, at));
            }
        }
    });
    found
}

/// True if the stage's body chooses between values (zero padding does).
fn has_select(dag: &ComputeDag, t: TensorId) -> bool {
    let mut found = false;
    if let OpKind::Compute { body, .. } = &dag.op(t).kind {
        body.visit(&mut |e| found |= matches!(e, Expr::Select(..)));
    }
    found
}

/// The CPU sketches of a DAG (at least one).
pub fn generate(dag: &ComputeDag, opts: &TuneOptions) -> Vec<Sketch> {
    let mut builders = vec![Builder {
        state: State::new(dag),
        steps: Vec::new(),
        holes: Vec::new(),
        deferred: Vec::new(),
        names: Vec::new(),
    }];
    let pairs = fusion_pairs(dag);
    for i in (0..dag.num_ops()).rev() {
        let t = TensorId(i as u32);
        let op = dag.op(t);
        // A fused consumer is tiled by its producer's rule.
        if matches!(op.kind, OpKind::Placeholder) || pairs.iter().any(|&(_, c)| c == t) {
            continue;
        }
        let info = dag.info(t);
        let is_output = dag.outputs().contains(&t);
        let mut next = Vec::new();
        for b in &builders {
            let variants: Vec<(&str, Result<Builder, ScheduleError>)> =
                if info.injective && !is_output && !info.consumers.is_empty() {
                    if has_select(dag, t) {
                        // Padding: inlined, every read of it is a bounds check in the
                        // consumer's innermost loop; computed once at the root, reads are
                        // plain loads.
                        vec![("inline", inline(b, t)), ("root", plain(b, t, opts))]
                    } else {
                        vec![("inline", inline(b, t))]
                    }
                } else if info.combiner.is_some() && has_data_reuse(dag, t) {
                    let fused = pairs.iter().find(|&&(p, _)| p == t).map(|&(_, c)| c);
                    let name = if fused.is_some() { "tile+fuse" } else { "tile" };
                    let mut v = vec![(name, tile(b, dag, t, fused, None, opts))];
                    if let Some(x) = packable_input(dag, t) {
                        let name = if fused.is_some() {
                            "tile+fuse+pack"
                        } else {
                            "tile+pack"
                        };
                        v.push((name, tile(b, dag, t, fused, Some(x), opts)));
                    }
                    v
                } else if info.combiner.is_some() {
                    let mut v = vec![("plain", plain(b, t, opts))];
                    let red: i64 = info.reduce_axes.iter().map(|a| a.extent).product();
                    if red >= 8 {
                        v.push(("rfactor", rfactor(b, t, opts)));
                    }
                    v
                } else {
                    vec![("plain", plain(b, t, opts))]
                };
            for (name, r) in variants {
                if let Ok(mut nb) = r {
                    nb.names.push(format!("{}:{name}", op.name));
                    next.push(nb);
                }
            }
        }
        if !next.is_empty() {
            builders = next;
        }
    }
    builders
        .into_iter()
        .map(|b| {
            let mut names = b.names;
            names.reverse();
            let mut steps = b.steps;
            steps.extend(b.deferred);
            Sketch {
                name: names.join(","),
                steps,
                holes: b.holes,
            }
        })
        .collect()
}

fn inline(b: &Builder, t: TensorId) -> Result<Builder, ScheduleError> {
    let mut b = b.clone();
    let p = b.pos(t);
    b.fixed(Step::ComputeInline { stage: p })?;
    Ok(b)
}

/// Pairs (reduction with reuse, its consumer) where the consumer is the reduction's only
/// reader once injective stages are inlined, an output of the same shape, and injective: an
/// epilogue (bias, relu) that can take the outer tile levels.
fn fusion_pairs(dag: &ComputeDag) -> Vec<(TensorId, TensorId)> {
    let inlined = |t: TensorId| {
        let i = dag.info(t);
        i.injective && !dag.outputs().contains(&t) && !i.consumers.is_empty()
    };
    let mut pairs = Vec::new();
    for i in 0..dag.num_ops() {
        let t = TensorId(i as u32);
        if dag.info(t).combiner.is_none() || !has_data_reuse(dag, t) {
            continue;
        }
        let mut readers = Vec::new();
        let mut work = dag.info(t).consumers.clone();
        while let Some(c) = work.pop() {
            if inlined(c) {
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

/// Multi-level tiling SSRSRS of `t`, with the outer two levels in `consumer` (fusion) or in a
/// copy-out stage after a cache write; with `pack`, that input is read through a local copy
/// of the region the tile needs (see [`packable_input`]).
fn tile(
    b: &Builder,
    dag: &ComputeDag,
    t: TensorId,
    consumer: Option<TensorId>,
    pack: Option<(TensorId, usize)>,
    opts: &TuneOptions,
) -> Result<Builder, ScheduleError> {
    let mut b = b.clone();
    let (compute, outer) = match consumer {
        Some(c) => (b.pos(t), b.pos(c)),
        None => {
            let p = b.pos(t);
            b.fixed(Step::CacheWrite {
                stage: p,
                scope: Scope::Local,
            })?;
            (p, p + 1)
        }
    };
    let ns = dag.op(t).shape.len();
    let nr = dag.info(t).reduce_axes.len();
    // Split the compute stage: each spatial axis into 4, each reduce axis into 2. Loops are
    // split from the last so earlier positions stay put.
    let mut sp_holes = vec![0; ns];
    for r in (0..nr).rev() {
        b.split(compute, (ns + r) as u32, 2, None)?;
    }
    for a in (0..ns).rev() {
        let lanes = (a + 1 == ns).then_some(opts.max_vector_lanes);
        sp_holes[a] = b.split(compute, a as u32, 4, lanes)?;
    }
    // Loops now: per spatial axis a: 4a..4a+3; per reduce axis r: 4ns+2r, +1.
    let s = |a: usize, l: usize| (4 * a + l) as u32;
    let r = |k: usize, l: usize| (4 * ns + 2 * k + l) as u32;
    let mut order = Vec::new();
    order.extend((0..ns).map(|a| s(a, 0)));
    order.extend((0..ns).map(|a| s(a, 1)));
    order.extend((0..nr).map(|k| r(k, 0)));
    order.extend((0..ns).map(|a| s(a, 2)));
    order.extend((0..nr).map(|k| r(k, 1)));
    order.extend((0..ns).map(|a| s(a, 3)));
    b.fixed(Step::Reorder {
        stage: compute,
        order,
    })?;
    // The outer stage follows the two outer levels; the rest of each axis stays one loop.
    let outer_ns = b
        .state
        .stage(outer as usize)
        .map(|s| s.leaves.len())
        .unwrap_or(ns);
    for a in (0..outer_ns.min(ns)).rev() {
        b.follow(outer, a as u32, sp_holes[a], vec![(0, 1), (1, 3)])?;
    }
    let mut order = Vec::new();
    for l in 0..3 {
        order.extend((0..ns).map(|a| (3 * a + l) as u32));
    }
    b.fixed(Step::Reorder {
        stage: outer,
        order,
    })?;
    // Compute inside the outer stage's tile: after the first or the second level.
    let hole = b.hole(Hole::Choice {
        choices: vec![2 * ns as i64 - 1, ns as i64 - 1],
        kind: ChoiceKind::Location,
    });
    b.state.compute_at(compute, outer, 2 * ns as u32 - 1)?;
    b.steps.push(SketchStep::ComputeAt {
        stage: compute,
        target: outer,
        hole,
    });
    let (ct, ot) = (b.tensor(compute), b.tensor(outer));
    if let Some((x, at)) = pack {
        // The copy is computed inside the compute stage's tile, after its outer spatial
        // levels (region: every reduction step, the columns of levels 1..3 or 2..3) or at the
        // outer reduce loop (the reduction steps of one pass over the register tile). Its axis
        // along the tile's columns is stored last, split like the register tile's vector
        // lanes, and its inner part is the copy's innermost loop.
        let xp = b.pos(x);
        b.fixed(Step::CacheRead {
            stage: xp,
            scope: Scope::Local,
            readers: vec![b.pos(ct)],
        })?;
        let cache = xp + 1;
        let pt = b.tensor(cache);
        let nd = dag.op(x).shape.len();
        if at + 1 != nd {
            let mut order: Vec<u32> = (0..nd as u32).filter(|&d| d as usize != at).collect();
            order.push(at as u32);
            b.fixed(Step::ReorderStorage {
                stage: cache,
                order,
            })?;
        }
        b.follow(cache, at as u32, sp_holes[ns - 1], vec![(2, 3)])?;
        if at + 1 != nd {
            // Loops now: axes before `at`, at.0, at.1, axes after; at.1 goes innermost.
            let mut order: Vec<u32> = (0..=nd as u32).filter(|&l| l as usize != at + 1).collect();
            order.push(at as u32 + 1);
            b.fixed(Step::Reorder {
                stage: cache,
                order,
            })?;
        }
        let choices = vec![ns as i64 - 1, 2 * ns as i64 - 1, 2 * ns as i64];
        let hole = b.hole(Hole::Choice {
            choices: choices.clone(),
            kind: ChoiceKind::Location,
        });
        let target = b.pos(ct);
        b.state.compute_at(cache, target, choices[0] as u32)?;
        b.steps.push(SketchStep::ComputeAt {
            stage: cache,
            target,
            hole,
        });
        b.deferred.push(SketchStep::VectorizeInnermost {
            tensor: pt,
            max_lanes: opts.max_vector_lanes,
        });
    }
    // Annotations: the accumulator's register tile is unrolled and vectorized; the outer
    // stage's outer loops run in parallel and its innermost copy loop is vectorized.
    b.deferred.push(SketchStep::VectorizeInnermost {
        tensor: ct,
        max_lanes: opts.max_vector_lanes,
    });
    let hole = b.hole(Hole::Choice {
        choices: opts.unroll_steps.iter().map(|&u| u as i64).collect(),
        kind: ChoiceKind::Unroll,
    });
    b.deferred.push(SketchStep::AutoUnroll { tensor: ct, hole });
    if opts.threads > 1 {
        let hole = b.hole(Hole::Choice {
            choices: (1..=ns as i64).collect(),
            kind: ChoiceKind::Parallel,
        });
        b.deferred
            .push(SketchStep::ParallelOuter { tensor: ot, hole });
    }
    b.deferred.push(SketchStep::VectorizeInnermost {
        tensor: ot,
        max_lanes: opts.max_vector_lanes * 4,
    });
    Ok(b)
}

/// Where the stage has a single consumer, a compute location hole, and the innermost loop
/// vectorized by the extent it gets there ([`SketchStep::VectorizeRegion`]); otherwise the
/// innermost spatial loop split for vector lanes.
///
/// A stage computed inside its consumer's tile (a padding copy) covers only the region the tile
/// reads: the ResNet conv2d's padding is 58 columns wide, a tile reads 16 of them. Split by the
/// factors of 58 (1 or 2 lanes), its copy stayed scalar, and the search unrolled it (480
/// copies of a select: 12 of the 54 ms the best program of a run took to compile). On one
/// AVX-512 EPYC core that unrolling bought nothing (the 16 best programs of the run, run
/// without it: geometric mean 1.01x, compiled in 0.8x the time), and the best program with
/// its copy vectorized over the region instead ran as fast and compiled in 40 ms.
fn plain(b: &Builder, t: TensorId, opts: &TuneOptions) -> Result<Builder, ScheduleError> {
    let mut b = b.clone();
    let p = b.pos(t);
    let st = b
        .state
        .stage(p as usize)
        .ok_or(ScheduleError::NoSuchStage { index: p, count: 0 })?
        .clone();
    let located = locate(&mut b, t)?;
    if let Some(last) = st.leaves.last() {
        if !located && st.iter(*last).kind == IterKind::Spatial && st.iter(*last).extent > 1 {
            b.split(
                p,
                st.leaves.len() as u32 - 1,
                2,
                Some(opts.max_vector_lanes),
            )?;
        }
    }
    b.annotate_with(p, opts, located);
    Ok(b)
}

/// A compute location hole for a stage with a single consumer (true if it got one).
fn locate(b: &mut Builder, t: TensorId) -> Result<bool, ScheduleError> {
    let consumers = b.state.effective_consumers(t);
    if let [c] = consumers.as_slice() {
        let cp = b.pos(*c);
        let cst = b
            .state
            .stage(cp as usize)
            .ok_or(ScheduleError::NoSuchStage {
                index: cp,
                count: 0,
            })?;
        let spatial = cst
            .leaves
            .iter()
            .take_while(|&&l| cst.iter(l).kind == IterKind::Spatial)
            .count();
        if spatial > 0 {
            let mut choices = vec![-1];
            choices.extend((0..spatial.min(3) as i64).rev());
            let hole = b.hole(Hole::Choice {
                choices,
                kind: ChoiceKind::Location,
            });
            let p = b.pos(t);
            b.steps.push(SketchStep::ComputeAt {
                stage: p,
                target: cp,
                hole,
            });
            return Ok(true);
        }
    }
    Ok(false)
}

/// rfactor of the innermost reduce axis: partial results over vector lanes, then a final sum.
fn rfactor(b: &Builder, t: TensorId, opts: &TuneOptions) -> Result<Builder, ScheduleError> {
    let mut b = b.clone();
    let p = b.pos(t);
    let n = b
        .state
        .stage(p as usize)
        .map(|s| s.leaves.len())
        .unwrap_or(0) as u32;
    b.split(p, n - 1, 2, Some(opts.max_vector_lanes))?; // ..., k.0, k.1
    b.fixed(Step::Rfactor { stage: p, iter: n })?; // rf at p: spatial..., k.1v, k.0
    let m = b
        .state
        .stage(p as usize)
        .map(|s| s.leaves.len())
        .unwrap_or(0) as u32;
    let mut order: Vec<u32> = (0..m - 2).collect();
    order.extend([m - 1, m - 2]);
    b.fixed(Step::Reorder { stage: p, order })?;
    let rf = b.state.stage(p as usize).map(|s| s.tensor).unwrap_or(t);
    locate(&mut b, rf)?;
    b.annotate(p, opts);
    let fin = p + 1;
    locate(&mut b, t)?;
    b.annotate(fin, opts);
    Ok(b)
}

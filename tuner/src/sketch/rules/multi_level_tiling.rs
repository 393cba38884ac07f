//! [`MultiLevelTiling`]: a reduction with data reuse is tiled at several levels per axis, in
//! the order its structure string gives (`SSRSRS` on the CPU).
//!
//! Each spatial axis is split into one loop per `S` of the structure, each reduce axis into
//! one per `R`, and the loops are ordered level by level as the string reads: on the CPU, two
//! outer spatial levels (the parallel tiles and the cache tiles), the outer reduce level, a
//! spatial level, the inner reduce level, and the register tile. The spatial levels before the
//! first `R` are the *outer* levels: the stage's only consumer, when it is an elementwise map
//! of it (relu after dense), is tiled at those levels and the stage computed inside its tile
//! (**fusion**); otherwise a **cache-write** stage holds the accumulator tile and the stage
//! itself copies it out at the outer levels.
//!
//! Where an input is indexed by the innermost spatial axis (B[k, j] of matmul, W[j, k] of
//! dense), a second sketch also **packs** it: a cache-read copy of the tile's columns,
//! computed inside the tile and stored with that axis last, so the register tile reads rows a
//! vector apart rather than the input's width apart (or, for W, rather than gathering a row
//! apart per lane).
//!
//! Where the innermost spatial axis does not fill whole vectors (conv2d's output width: 28,
//! 14, 7 on ResNet-50's later layers) or reads an input strided (a convolution of stride 2)
//! and another spatial axis does fill them (its output channels), a third sketch makes that axis the **vector axis**: it goes innermost in every spatial
//! level, the accumulator tile is stored with it last, and the input it indexes (the weights)
//! is packed with it last, so the register tile broadcasts one input element across a vector
//! of output channels, as the channel-blocked (NCHWc) schedules of other compilers do. That
//! copy is a transpose and is made once, at the root; the sketch's inputs computed by other
//! stages (the padding) are kept in buffers rather than inlined.
//!
//! Where the last two spatial axes can be read as one (a 1x1 conv2d of stride 1: its pixels
//! are consecutive in the input as in the output), the **flat** sketch fuses them before
//! tiling, in place of the plain one: the layer is then tiled as the matmul it is, its
//! register tile running across rows rather than along one (see `flattenable`).

use super::{unroll_hole, Applies, RuleContext, RuleError, SketchBuilder, SketchRule, Variant};
use crate::sketch::{ChoiceKind, SketchStep};
use tensortune_schedules::ir::{row_padding, Scope};
use tensortune_schedules::simplify::Simplifier;
use tensortune_schedules::te::OpKind;
use tensortune_schedules::trace::Step;
use tensortune_schedules::{ComputeDag, Expr, TensorId};

/// Vectors the register tile may span along the innermost spatial axis. One vector makes
/// every broadcast of the other operand feed a single FMA, one load per FMA; two to four
/// share each broadcast, so a core with two FMA ports and two load ports can keep both FMA
/// ports busy (the micro-kernels of BLAS libraries are 6-8 rows by 2-4 vectors for this
/// reason). A matmul tuned with up to four vectors ran 1.28x the one-vector best on one core
/// (docs/measurements.md, "Register tiles of several vectors").
pub const REGISTER_TILE_VECTORS: i64 = 4;

/// Multi-level tiling with a structure of `S` (spatial) and `R` (reduce) levels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultiLevelTiling {
    structure: String,
    /// Number of `S` in the structure.
    spatial_levels: usize,
    /// Number of `S` before the first `R`.
    outer_levels: usize,
}

/// A tiling structure that is not one [`MultiLevelTiling`] can build.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("tiling structure `{0}`: expected `S` and `R` only, starting with `S`, with an `R` and at least one `S` after it")]
pub struct StructureError(pub String);

impl MultiLevelTiling {
    /// Tiling by `structure`, e.g. `SSRSRS`. It must start with a spatial level (the outer
    /// levels take the consumer) and have one after its first reduce level (the register tile,
    /// whose last level is vectorized).
    pub fn new(structure: &str) -> Result<MultiLevelTiling, StructureError> {
        let bad = || StructureError(structure.to_string());
        if !structure.chars().all(|c| c == 'S' || c == 'R') {
            return Err(bad());
        }
        let outer_levels = structure.chars().take_while(|&c| c == 'S').count();
        let first_r = structure.find('R').ok_or_else(bad)?;
        if outer_levels == 0
            || !structure[first_r..].contains('S')
            || structure.matches('S').count() < 2
        {
            return Err(bad());
        }
        Ok(MultiLevelTiling {
            structure: structure.to_string(),
            spatial_levels: structure.matches('S').count(),
            outer_levels,
        })
    }

    /// The CPU's `SSRSRS` (Ansor's).
    pub fn cpu() -> MultiLevelTiling {
        MultiLevelTiling {
            structure: "SSRSRS".to_string(),
            spatial_levels: 4,
            outer_levels: 2,
        }
    }

    /// The structure string.
    pub fn structure(&self) -> &str {
        &self.structure
    }
}

impl SketchRule for MultiLevelTiling {
    fn name(&self) -> &str {
        "multi-level-tiling"
    }

    fn applies(&self, cx: &RuleContext, t: TensorId) -> Applies {
        if cx.dag.info(t).combiner.is_some() && super::has_data_reuse(cx.dag, t) {
            // A stage streaming one input is bandwidth-bound: let the reduction rules offer
            // their structures beside the tiling.
            if super::streams_an_input(cx.dag, t) {
                Applies::Yes
            } else {
                Applies::AndSkipRest
            }
        } else {
            Applies::No
        }
    }

    fn apply(&self, cx: &RuleContext, b: &SketchBuilder, t: TensorId) -> Vec<Variant> {
        let fused = cx.fused_consumer(t);
        let suffix = if fused.is_some() { "+fuse" } else { "" };
        let ns = cx.dag.op(t).shape.len();
        let last = ns.saturating_sub(1);
        // A 1x1 layer's pixels fused: its tiling replaces the plain one (whose tiles are
        // whole rows, and whose vectors run along a row that need not be whole vectors), and
        // the output channels as the vector axis too where the fused pixels are whole vectors
        // (see [`flattenable`]).
        let flat = flattenable(cx, t, fused);
        let mut v = vec![if flat.is_some() {
            (
                format!("tile{suffix}+flat"),
                self.tile(cx, b, t, fused, None, last - 1, true),
            )
        } else {
            (
                format!("tile{suffix}"),
                self.tile(cx, b, t, fused, None, last, false),
            )
        }];
        if let Some(x) = packable_input(cx.dag, t, last) {
            v.push((
                format!("tile{suffix}+pack"),
                self.tile(cx, b, t, fused, Some(x), last, false),
            ));
        }
        if let Some((axis, x)) = channel_vector_axis(cx, t).filter(|_| flat != Some(true)) {
            // An input stored with the vector axis last already (conv2d_hwio's weights) is
            // read in place: its copy, made at the root, would be the same array again.
            let (xt, at) = x;
            let pack = (at + 1 != cx.dag.op(xt).shape.len()).then_some(x);
            v.push((
                format!("tile{suffix}+vec{axis}"),
                self.tile(cx, b, t, fused, pack, axis, false),
            ));
        }
        v
    }
}

/// Where the tiled stage's loops are: the compute stage, and the stage holding the outer
/// levels (the fused consumer or the copy-out stage).
struct Tiled {
    compute: u32,
    outer: u32,
    /// Number of spatial axes.
    ns: usize,
    /// The spatial axis whose register tile is vectorized (innermost in every level).
    vec_axis: usize,
    /// Per spatial axis, its tile hole.
    holes: Vec<usize>,
}

impl MultiLevelTiling {
    /// The tiling of `t`, with the outer levels in `consumer` (fusion) or in a copy-out stage
    /// after a cache write; with `pack`, that input is read through a local copy of the
    /// region the tile needs (see [`packable_input`]). `vec_axis` is the spatial axis the
    /// register tile vectorizes: the last one, or another (see the module doc), whose loops
    /// then go innermost in each level and last in the accumulator's storage. With `flat`,
    /// the last two spatial axes are first fused into one in both stages (see
    /// [`flattenable`]), and `vec_axis` counts the fused axis as one.
    #[allow(clippy::too_many_arguments)]
    fn tile(
        &self,
        cx: &RuleContext,
        b: &SketchBuilder,
        t: TensorId,
        consumer: Option<TensorId>,
        pack: Option<(TensorId, usize)>,
        vec_axis: usize,
        flat: bool,
    ) -> Result<SketchBuilder, RuleError> {
        let mut b = b.clone();
        let (compute, outer) = match consumer {
            Some(c) => (b.pos(t)?, b.pos(c)?),
            None => {
                let p = b.pos(t)?;
                b.fixed(Step::CacheWrite {
                    stage: p,
                    scope: Scope::Local,
                })?;
                (p, p + 1)
            }
        };
        let mut ns = cx.dag.op(t).shape.len();
        if flat {
            for stage in [compute, outer] {
                b.fixed(Step::Fuse {
                    stage,
                    iters: vec![ns as u32 - 2, ns as u32 - 1],
                })?;
            }
            ns -= 1;
        }
        let tiled = self.split_and_order(cx, &mut b, t, compute, outer, ns, vec_axis)?;
        if vec_axis + 1 != tiled.ns {
            // The accumulator tile with the vector axis last, so that the register tile's
            // lanes are consecutive elements (the copy-out reads it strided instead).
            let mut order: Vec<u32> = (0..tiled.ns as u32)
                .filter(|&a| a as usize != vec_axis)
                .collect();
            order.push(vec_axis as u32);
            b.fixed(Step::ReorderStorage {
                stage: compute,
                order,
            })?;
            // The register tile broadcasts one input element to a vector of output channels
            // per step: a producer inlined there (padding) puts a bounds check on every
            // broadcast, which made this sketch's worst conv2d 28x28 runs (docs/
            // measurements.md, "Output channels as the vector axis, again"). Its rule then
            // offers the buffer only.
            for p in computed_inputs(cx.dag, t) {
                b.keep_materialized(p);
            }
        }
        self.follow_outer(&mut b, &tiled)?;
        // By tensor: packing inserts a stage before both.
        let (ct, ot) = (b.tensor(compute)?, b.tensor(outer)?);
        if let Some(x) = pack {
            self.pack(cx, &mut b, &tiled, x)?;
        }
        // The accumulator's register tile is unrolled and vectorized; the outer stage's outer
        // loops run in parallel and its innermost copy loop is vectorized.
        let lanes = cx.lanes(t);
        b.defer(SketchStep::VectorizeInnermost {
            tensor: ct,
            max_lanes: lanes * REGISTER_TILE_VECTORS,
        });
        unroll_hole(cx, &mut b, ct);
        if cx.target.threads() > 1 {
            let hole = b.choice((1..=tiled.ns as i64).collect(), ChoiceKind::Parallel);
            b.defer(SketchStep::ParallelOuter { tensor: ot, hole });
        }
        b.defer(SketchStep::VectorizeInnermost {
            tensor: ot,
            max_lanes: lanes * 4,
        });
        Ok(b)
    }

    /// Splits the compute stage's spatial axes into the structure's `S` levels (the vector
    /// axis's innermost within [`REGISTER_TILE_VECTORS`] vectors) and its reduce axes into its
    /// `R` levels, and orders the loops as the structure reads, the vector axis last in each
    /// spatial level. `ns` is the number of spatial loops (fewer than the axes where two
    /// were fused).
    #[allow(clippy::too_many_arguments)]
    fn split_and_order(
        &self,
        cx: &RuleContext,
        b: &mut SketchBuilder,
        t: TensorId,
        compute: u32,
        outer: u32,
        ns: usize,
        vec_axis: usize,
    ) -> Result<Tiled, RuleError> {
        let nr = cx.dag.info(t).reduce_axes.len();
        let (sl, rl) = (
            self.spatial_levels,
            self.structure.len() - self.spatial_levels,
        );
        // Loops are split from the last so earlier positions stay put; one level is the
        // loop as it is. A spatial axis always gets a tile hole (the outer stage follows it).
        let mut holes = vec![0; ns];
        let extent = |b: &SketchBuilder, i: usize| {
            b.state
                .stage(compute as usize)
                .and_then(|s| s.leaf(i))
                .map(|l| l.extent)
        };
        let reduction: Option<i64> = (0..nr).map(|r| extent(b, ns + r)).product();
        for r in (0..nr).rev().filter(|_| rl > 1) {
            let i = (ns + r) as u32;
            match (reduction, extent(b, ns + r)) {
                // A reduction of a few taps (depthwise conv2d's 3x3 window) goes whole into
                // the innermost reduce level, just outside the register tile, so that the
                // accumulators stay in registers over every tap. Split at outer levels, the
                // accumulator tile is re-read from memory for each tap, which is what the slow
                // depthwise programs did (docs/measurements.md, "Depthwise conv2d: the window
                // whole in the inner reduce level").
                (Some(total), Some(e)) if total <= SMALL_REDUCTION => {
                    let mut factors = vec![1; rl - 2];
                    factors.push(e);
                    b.fixed(Step::Split {
                        stage: compute,
                        iter: i,
                        factors,
                    })?;
                }
                _ => {
                    b.split(compute, i, rl, None)?;
                }
            }
        }
        for a in (0..ns).rev() {
            let lanes = (a == vec_axis).then(|| cx.lanes(t) * REGISTER_TILE_VECTORS);
            holes[a] = b.split(compute, a as u32, sl.max(2), lanes)?;
        }
        // Loop `l` of spatial axis `a` is at sl*a + l; of reduce axis `k`, at sl*ns + rl*k + l.
        let axes: Vec<usize> = (0..ns)
            .filter(|&a| a != vec_axis)
            .chain([vec_axis])
            .collect();
        let mut order = Vec::new();
        let (mut s_level, mut r_level) = (0, 0);
        for c in self.structure.chars() {
            if c == 'S' {
                order.extend(axes.iter().map(|a| (sl * a + s_level) as u32));
                s_level += 1;
            } else {
                order.extend((0..nr).map(|k| (sl * ns + rl * k + r_level) as u32));
                r_level += 1;
            }
        }
        b.fixed(Step::Reorder {
            stage: compute,
            order,
        })?;
        Ok(Tiled {
            compute,
            outer,
            ns,
            vec_axis,
            holes,
        })
    }

    /// The outer stage follows the outer levels, the rest of each axis one loop, ordered level
    /// by level; the compute stage goes inside its tile, after one of the outer levels (the
    /// innermost first).
    fn follow_outer(&self, b: &mut SketchBuilder, tiled: &Tiled) -> Result<(), RuleError> {
        let (ns, outer, ol) = (tiled.ns, tiled.outer, self.outer_levels);
        // Level l (1 <= l < ol) takes factor l-1 of the tile's decision; the last loop, the
        // product of the inner levels' factors.
        let mut ranges: Vec<(usize, usize)> = (1..ol).map(|l| (l - 1, l)).collect();
        ranges.push((ol - 1, self.spatial_levels - 1));
        let outer_ns = b.stage_leaves(outer)?;
        for a in (0..outer_ns.min(ns)).rev() {
            b.follow(outer, a as u32, tiled.holes[a], ranges.clone())?;
        }
        let mut order = Vec::new();
        for l in 0..=ol {
            order.extend((0..ns).map(|a| ((ol + 1) * a + l) as u32));
        }
        b.fixed(Step::Reorder {
            stage: outer,
            order,
        })?;
        let choices = (0..ol).rev().map(|l| ((l + 1) * ns) as i64 - 1).collect();
        b.compute_at(tiled.compute, outer, choices)
    }

    /// Packs input `x`, indexed by the vector axis at its index `at`: a local copy
    /// read by the compute stage, with that axis stored last and split like the register
    /// tile's vector lanes (the last spatial level), its inner part the copy's innermost loop.
    /// The copy is computed inside the compute stage's tile after one of its outer spatial
    /// levels (region: every reduction step, the columns of the inner levels) or at the first
    /// loop after them, the outer reduce loop (the reduction steps of one pass over the
    /// register tile).
    fn pack(
        &self,
        cx: &RuleContext,
        b: &mut SketchBuilder,
        tiled: &Tiled,
        (x, at): (TensorId, usize),
    ) -> Result<(), RuleError> {
        let ct = b.tensor(tiled.compute)?;
        let xp = b.pos(x)?;
        b.fixed(Step::CacheRead {
            stage: xp,
            scope: Scope::Local,
            readers: vec![b.pos(ct)?],
        })?;
        let cache = xp + 1;
        let pt = b.tensor(cache)?;
        let nd = cx.dag.op(x).shape.len();
        if at + 1 != nd {
            let mut order: Vec<u32> = (0..nd as u32).filter(|&d| d as usize != at).collect();
            order.push(at as u32);
            b.fixed(Step::ReorderStorage {
                stage: cache,
                order,
            })?;
        }
        let last = self.spatial_levels - 1;
        b.follow(
            cache,
            at as u32,
            tiled.holes[tiled.vec_axis],
            vec![(last - 1, last)],
        )?;
        if at + 1 != nd {
            // Loops now: axes before `at`, at.0, at.1, axes after; at.1 goes innermost.
            let mut order: Vec<u32> = (0..=nd as u32).filter(|&l| l as usize != at + 1).collect();
            order.push(at as u32 + 1);
            b.fixed(Step::Reorder {
                stage: cache,
                order,
            })?;
        }
        let ns = tiled.ns as i64;
        let mut choices: Vec<i64> = (1..=self.outer_levels as i64).map(|l| l * ns - 1).collect();
        choices.push(self.outer_levels as i64 * ns);
        if tiled.vec_axis + 1 != tiled.ns {
            // Along a vector axis that is not the input's last (conv2d's weights, [K, C, R,
            // S], vectorized along K) the copy is a transpose whose reads gather. Inside the
            // tile it was redone for every outer tile, a large share of the run time; at the
            // root it is done once, and the layer's weights are small beside its work (each
            // is used at every output pixel).
            choices = vec![-1];
        }
        let at_root = choices == [-1];
        let target = b.pos(ct)?;
        b.compute_at(cache, target, choices)?;
        if at_root && cx.target.threads() > 1 {
            // At the root the copy is a stage of its own, outside the compute's parallel
            // loop: run serially, it would idle every core but one while it runs.
            let hole = b.choice(vec![1, 2], ChoiceKind::Parallel);
            b.defer(SketchStep::ParallelOuter { tensor: pt, hole });
        }
        b.defer(SketchStep::VectorizeInnermost {
            tensor: pt,
            max_lanes: cx.lanes(x),
        });
        Ok(())
    }
}

/// A reduction of at most this many steps in all is never split across reduce levels (see
/// `split_and_order`).
const SMALL_REDUCTION: i64 = 32;

/// An input worth packing for a tiled reduction, and the position of its index that is the
/// stage's spatial axis `axis` (the innermost, or the vector axis of [`channel_vector_axis`]):
/// a placeholder indexed by that axis (a plain variable) and not varying with some other
/// spatial axis. B[k, j] of matmul and batch matmul has it last:
/// the register tile reads B along it for successive reduction steps, a row of B apart, and
/// copied into a local buffer over the tile's columns those rows lie a vector apart instead
/// of B's whole width (with rows of 4 KiB, successive rows fall into one set of the L1 cache
/// and evict each other). W[j, k] of dense has it first: the tile's vector lanes would gather
/// W a row apart each, and its copy is stored transposed ([`Step::ReorderStorage`]).
fn packable_input(dag: &ComputeDag, t: TensorId, axis: usize) -> Option<(TensorId, usize)> {
    let OpKind::Compute {
        axes,
        body: Expr::Reduce { source, .. },
    } = &dag.op(t).kind
    else {
        return None;
    };
    let last = axes.get(axis)?.var.id;
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

/// A spatial axis other than the innermost for the register tile to vectorize, and the input
/// to pack along it: only where the innermost axis does not fill whole vectors of what one
/// FMA pipe takes ([`TargetDesc::vector_unit_lanes`]) or reads an input strided
/// ([`strided_broadcast`]), and this one fills whole registers (conv2d's output channels
/// where its width is 28, or 56 with 16 lanes, or where its stride is 2), and some input is
/// indexed by it alone (the weights). The innermost such axis.
///
/// Pipe vectors, because on Zen 4 (512-bit operations run as two 256-bit halves) a width of
/// 56 = 7 x 8 lanes runs near the FMA peak along the width, and offering this sketch there
/// too split the search's trials and lost badly on some seeds; on the 28 x 28 layer it wins
/// on every seed (docs/measurements.md, "Output channels as the vector axis, again"). On a
/// core with whole 512-bit pipes the half vector at the end of each row of 56 costs a whole
/// FMA slot, and the sketch is offered there (docs/measurements.md, "An Intel AVX-512 core:
/// the goal rows, and whole-vector FMA pipes").
///
/// [`TargetDesc::vector_unit_lanes`]: tensortune_schedules::target::TargetDesc::vector_unit_lanes
fn channel_vector_axis(cx: &RuleContext, t: TensorId) -> Option<(usize, (TensorId, usize))> {
    let shape = &cx.dag.op(t).shape;
    let lanes = cx.lanes(t);
    let unit = cx
        .target
        .vector_unit_lanes(cx.dag.op(t).dtype)
        .clamp(1, lanes.max(1));
    let (&last, rest) = shape.split_last()?;
    if lanes <= 1 {
        return None;
    }
    let whole = last % unit == 0;
    rest.iter()
        .enumerate()
        .rev()
        .filter(|&(_, &e)| e >= lanes && e % lanes == 0)
        .filter(|&(a, _)| !whole || strided_broadcast(cx.dag, t, a))
        .find_map(|(a, _)| Some((a, packable_input(cx.dag, t, a)?)))
}

/// Whether `t` reads some input with a step of more than one element along its innermost
/// spatial axis and not along axis `a`: a convolution of stride 2 reads its input two
/// pixels apart for successive output pixels. A register tile vectorized along the pixels
/// must then gather or shuffle each input vector; with `a` (the output channels) as the
/// vector axis that input is broadcast instead, one element a step, and its stride does not
/// matter. ResNet-50's first layer (7x7, stride 2, 112 output pixels a row: whole vectors)
/// runs far faster so (docs/measurements.md, "The first layer of ResNet-50: output channels
/// as the vector axis").
fn strided_broadcast(dag: &ComputeDag, t: TensorId, a: usize) -> bool {
    let OpKind::Compute { axes, body } = &dag.op(t).kind else {
        return false;
    };
    let (Some(x), Some(c)) = (axes.last(), axes.get(a)) else {
        return false;
    };
    let mut found = false;
    body.visit(&mut |e| {
        if let Expr::Load { indices, .. } = e {
            let strided = indices.iter().any(|i| {
                if !i.uses_var(x.var.id) {
                    return false;
                }
                step_along(i, x).is_some_and(|s| s.abs() > 1)
            });
            found |= strided && !indices.iter().any(|i| i.uses_var(c.var.id));
        }
    });
    found
}

/// Whether the last two spatial axes of `t` (and of the consumer it is `fused` with) can be
/// fused into one loop that reads every input linearly: each load indexes them, if at all,
/// as its last two positions, the last of the input's extent equal to the axis's, each with
/// coefficient 1 (a 1x1 conv2d of stride 1 reads `data[n, rc, y + ry, x + rx]` over a `W`
/// equal to the output's). Lowered, the fused loop `p` indexes the input at `W * (p / W) + p
/// % W`, which the simplifier folds back to `p`: the register tile vectorizes along `p`
/// across rows, as the matmul this layer is, instead of along rows whose width need not be
/// a whole number of vectors (56 on ResNet-50's 56x56 layers, 3.5 vectors of 16), and with
/// tiles of any number of rows rather than whole rows where they are (112 = 7 x 16). Tuned
/// as that matmul, the 56x56 layer ran faster than as a conv2d, and so did both layers with
/// this sketch in place of the plain one (docs/measurements.md, "conv2d 1x1 written as a
/// matmul", "A 1x1 conv2d's pixels fused into one axis").
///
/// Offered where the innermost axis is wider than a padded row of a local accumulator;
/// `Some(true)` where the fused axis is a whole number of the vectors one FMA pipe takes
/// (then the output channels are not offered as the vector axis either).
fn flattenable(cx: &RuleContext, t: TensorId, fused: Option<TensorId>) -> Option<bool> {
    let op = cx.dag.op(t);
    let lanes = cx.lanes(t);
    let unit = cx.target.vector_unit_lanes(op.dtype).clamp(1, lanes.max(1));
    let [.., h, w] = op.shape.as_slice() else {
        return None;
    };
    // A local accumulator with rows of `w` padded to a power of two (rows of 7 stored in 8)
    // is indexed `8 * (p / 7) + p % 7`, which does not fold: its vectors would gather.
    if lanes <= 1 || row_padding(Scope::Local, &[*w]) != 0 {
        return None;
    }
    [Some(t), fused]
        .into_iter()
        .flatten()
        .all(|s| reads_last_two_axes_linearly(cx.dag, s))
        .then_some((h * w) % unit == 0)
}

/// How far index `e` moves when axis `v` moves by one, where that is a constant.
fn step_along(e: &Expr, v: &tensortune_schedules::IterVar) -> Option<i64> {
    let shifted = e.substitute(&|w| (w.id == v.var.id).then(|| v.expr() + 1));
    Simplifier::default().expr(&(shifted - e.clone())).as_int()
}

/// The check of [`flattenable`] on one stage.
fn reads_last_two_axes_linearly(dag: &ComputeDag, t: TensorId) -> bool {
    let OpKind::Compute { axes, body } = &dag.op(t).kind else {
        return false;
    };
    let [.., y, x] = axes.as_slice() else {
        return false;
    };
    let spatial: Vec<u32> = axes.iter().map(|a| a.var.id).collect();
    // `e` uses axis `v` with coefficient 1 and no other spatial axis.
    let unit = |e: &Expr, v: &tensortune_schedules::IterVar| {
        let others = spatial.iter().any(|&id| id != v.var.id && e.uses_var(id));
        !others && step_along(e, v) == Some(1)
    };
    let mut ok = true;
    body.visit(&mut |e| {
        if let Expr::Load {
            tensor, indices, ..
        } = e
        {
            let uses = |i: &Expr| i.uses_var(y.var.id) || i.uses_var(x.var.id);
            let k = indices.len();
            let before_ok = indices.iter().take(k.saturating_sub(2)).all(|i| !uses(i));
            let shape = &dag.op(*tensor).shape;
            let fits = match (indices.as_slice(), shape.as_slice()) {
                ([.., iy, ix], [.., w]) => {
                    (!uses(iy) && !uses(ix)) || (unit(iy, y) && unit(ix, x) && *w == x.extent)
                }
                _ => indices.iter().all(|i| !uses(i)),
            };
            ok &= before_ok && fits;
        }
    });
    ok
}

/// The stages other than placeholders that `t` reads.
fn computed_inputs(dag: &ComputeDag, t: TensorId) -> Vec<TensorId> {
    let mut found = Vec::new();
    if let OpKind::Compute { body, .. } = &dag.op(t).kind {
        body.visit(&mut |e| {
            if let Expr::Load { tensor, .. } = e {
                if !matches!(dag.op(*tensor).kind, OpKind::Placeholder) && !found.contains(tensor) {
                    found.push(*tensor);
                }
            }
        });
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structures_parse_or_are_refused() {
        let cpu = MultiLevelTiling::new("SSRSRS").expect("the CPU's");
        assert_eq!(cpu, MultiLevelTiling::cpu());
        let gpu = MultiLevelTiling::new("SSSRRSRS").expect("the GPU's");
        assert_eq!((gpu.spatial_levels, gpu.outer_levels), (5, 3));
        for bad in ["", "SSS", "RSRS", "SSRR", "SSXS", "ssrsrs"] {
            assert_eq!(
                MultiLevelTiling::new(bad),
                Err(StructureError(bad.to_string())),
                "{bad}"
            );
        }
    }
}

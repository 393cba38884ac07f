//! The primitives: validation, then the change to the state, then the step recorded.
//!
//! Each `do_*` function checks everything before it mutates, so a failed step leaves the
//! state as it was even when applied in place (replay relies on that only for the error
//! message; [`State::apply`] also works on a copy).

use super::ScheduleError as E;
use super::{
    Iter, IterId, IterKind, Location, PrefetchHint, Relation, SplitBy, Stage, StageOp, State,
};
use crate::expr::{select, Expr, IterVar, TensorId, Var};
use crate::ir::{PrefetchLevel, Scope};
use crate::te::OpKind;
use crate::trace::{Annotation, Step, MAX_PREFETCH_OFFSET};
use std::sync::Arc;

/// Most lanes a vectorized loop may have.
pub const MAX_VECTOR_LANES: i64 = 64;

/// The most loops one stage may have. Schedules of the op library use under 40 (a GPU
/// conv2d: five levels of four spatial axes, three of three reduce axes); a record that asks
/// for more is damaged or hostile, and lowering such a nest recurses once per loop.
pub const MAX_STAGE_LOOPS: usize = 64;

/// How many times its domain (the product of its axes' extents) a stage's loop nest may
/// iterate: splits by factors that do not divide the loop round up, at most doubling it each.
/// A nest past this bound spends nearly all its iterations in guards.
pub const MAX_NEST_GROWTH: i64 = 1 << 12;

impl State {
    /// Applies a step directly (used by replay; on error the state may be left as it was or
    /// partly changed only for steps documented to check first, which is all of them).
    pub fn apply_in_place(&mut self, step: &Step) -> Result<(), E> {
        match step {
            Step::Split {
                stage,
                iter,
                factors,
            } => self.do_split(*stage, *iter, factors, false)?,
            Step::SplitNParts {
                stage,
                iter,
                nparts,
            } => self.do_split(*stage, *iter, &[*nparts], true)?,
            Step::Fuse { stage, iters } => self.do_fuse(*stage, iters)?,
            Step::Reorder { stage, order } => self.do_reorder(*stage, order)?,
            Step::ComputeAt {
                stage,
                target,
                iter,
            } => self.do_compute_at(*stage, *target, *iter)?,
            Step::ComputeInline { stage } => self.do_inline(*stage)?,
            Step::ComputeRoot { stage } => {
                self.compute_stage(*stage, "moved to the root")?;
                self.stages[*stage as usize].location = Location::Root;
            }
            Step::CacheWrite { stage, scope } => self.do_cache_write(*stage, *scope)?,
            Step::CacheRead {
                stage,
                scope,
                readers,
            } => self.do_cache_read(*stage, *scope, readers)?,
            Step::Annotate {
                stage,
                iter,
                annotation,
            } => self.do_annotate(*stage, *iter, *annotation)?,
            Step::Rfactor { stage, iter } => self.do_rfactor(*stage, *iter)?,
            Step::ReorderStorage { stage, order } => self.do_reorder_storage(*stage, order)?,
            Step::Prefetch {
                stage,
                tensor,
                axis,
                offset,
                level,
            } => self.do_prefetch(*stage, *tensor, *axis, *offset, *level)?,
            Step::AutoUnroll {
                stage,
                iter,
                max_step,
            } => {
                let (_, id) = self.leaf_at(*stage, *iter)?;
                self.stages[*stage as usize].auto_unroll = Some((id, *max_step));
            }
        }
        self.trace.steps.push(step.clone());
        Ok(())
    }

    fn stage_at(&self, stage: u32) -> Result<&Stage, E> {
        self.stages.get(stage as usize).ok_or(E::NoSuchStage {
            index: stage,
            count: self.stages.len(),
        })
    }

    fn compute_stage(&self, stage: u32, what: &'static str) -> Result<&Stage, E> {
        let s = self.stage_at(stage)?;
        if s.is_placeholder() {
            return Err(E::Placeholder {
                stage: s.name().to_string(),
                what,
            });
        }
        Ok(s)
    }

    fn leaf_at(&self, stage: u32, iter: u32) -> Result<(&Stage, IterId), E> {
        let s = self.compute_stage(stage, "scheduled")?;
        let id = s.leaves.get(iter as usize).copied().ok_or(E::NoSuchLoop {
            stage: s.name().to_string(),
            index: iter,
            count: s.leaves.len(),
        })?;
        Ok((s, id))
    }

    /// Stages attached at a loop of `tensor`.
    fn attached_to(&self, tensor: TensorId) -> impl Iterator<Item = usize> + '_ {
        self.stages
            .iter()
            .enumerate()
            .filter_map(move |(i, s)| match s.location {
                Location::At { tensor: t, .. } if t == tensor => Some(i),
                _ => None,
            })
    }

    fn reattach(&mut self, tensor: TensorId, from: &[IterId], to: IterId) {
        for s in &mut self.stages {
            if let Location::At { tensor: t, iter } = s.location {
                if t == tensor && from.contains(&iter) {
                    s.location = Location::At { tensor, iter: to };
                }
            }
        }
    }

    fn do_split(&mut self, stage: u32, iter: u32, factors: &[i64], nparts: bool) -> Result<(), E> {
        let (s, id) = self.leaf_at(stage, iter)?;
        let it = s.iter(id).clone();
        let bad = |what: String| E::BadSplit {
            stage: s.name().to_string(),
            iter: it.name.clone(),
            what,
        };
        if factors.is_empty() {
            return Err(bad("with no factors".into()));
        }
        if let Some(f) = factors.iter().find(|&&f| f < 1) {
            return Err(bad(format!("factor {f}: factors must be at least 1")));
        }
        let mut total: i64 = 1;
        for &f in factors {
            total = total
                .checked_mul(f)
                .filter(|&t| t <= 1 << 40)
                .ok_or_else(|| bad(format!("factors {factors:?}: product too large")))?;
        }
        if it.annotation.is_some() {
            return Err(bad("of an annotated loop; split before annotating".into()));
        }
        if s.leaves.len() + factors.len() > MAX_STAGE_LOOPS {
            return Err(bad(format!(
                "into {} more loops: the stage would have {} (at most {MAX_STAGE_LOOPS})",
                factors.len(),
                s.leaves.len() + factors.len()
            )));
        }
        // Each split of a loop that its factor does not divide rounds the outer extent up, so a
        // chain of them multiplies the loops' nominal iterations (up to twice a split) while
        // the work stays the same: a record of such a chain would lower to loops whose step
        // counts overflow and compile for minutes. Bound the nest's iterations against the
        // stage's domain.
        let mut new_extents = Vec::with_capacity(factors.len() + 1);
        let mut rest = it.extent;
        for k in 0..factors.len() {
            let by = if nparts {
                SplitBy::NParts(factors[0])
            } else {
                SplitBy::Factor(factors[k..].iter().product())
            };
            let (outer, inner) = split_extents(rest, by);
            new_extents.push(outer);
            rest = inner;
        }
        new_extents.push(rest);
        let nest: i64 = s
            .leaves
            .iter()
            .filter(|&&l| l != id)
            .map(|&l| s.iter(l).extent)
            .chain(new_extents)
            .fold(1i64, |a, e| a.saturating_mul(e.max(1)));
        let domain = s.iters[..s.root_count()]
            .iter()
            .fold(1i64, |a, r| a.saturating_mul(r.extent.max(1)));
        if nest > domain.saturating_mul(MAX_NEST_GROWTH) {
            return Err(bad(format!(
                "by {factors:?}: the stage's loops would run {nest} iterations for a domain of \
                 {domain} (at most {MAX_NEST_GROWTH} times it: too many rounded-up splits)"
            )));
        }
        let tensor = s.tensor;
        let s = &mut self.stages[stage as usize];
        let mut parent = id;
        let mut new_leaves = Vec::new();
        // Chain of binary splits: peel the outermost loop off each time.
        for (k, _) in factors.iter().enumerate() {
            let by = if nparts {
                SplitBy::NParts(factors[0])
            } else {
                SplitBy::Factor(factors[k..].iter().product())
            };
            let pext = s.iters[parent.0 as usize].extent;
            let (oext, iext) = split_extents(pext, by);
            let last = k + 1 == factors.len();
            let outer = push_iter(s, format!("{}.{k}", it.name), oext, it.kind);
            let inner_name = if last {
                format!("{}.{}", it.name, k + 1)
            } else {
                format!("{}.{}r", it.name, k + 1)
            };
            let inner = push_iter(s, inner_name, iext, it.kind);
            s.relations.push(Relation::Split {
                parent,
                outer,
                inner,
                by,
            });
            new_leaves.push(outer);
            if last {
                new_leaves.push(inner);
            }
            parent = inner;
        }
        let pos = iter as usize;
        s.leaves.splice(pos..pos + 1, new_leaves.iter().copied());
        if let Some((p, n)) = s.auto_unroll {
            if p == id {
                s.auto_unroll = Some((new_leaves[0], n));
            }
        }
        let innermost = *new_leaves.last().unwrap_or(&id);
        self.reattach(tensor, &[id], innermost);
        Ok(())
    }

    fn do_fuse(&mut self, stage: u32, iters: &[u32]) -> Result<(), E> {
        let s = self.compute_stage(stage, "scheduled")?;
        let bad = |why| E::BadFuse {
            stage: s.name().to_string(),
            iters: format!("{iters:?}"),
            why,
        };
        if iters.is_empty() {
            return Err(bad("no loops given"));
        }
        for &i in iters {
            if i as usize >= s.leaves.len() {
                return Err(E::NoSuchLoop {
                    stage: s.name().to_string(),
                    index: i,
                    count: s.leaves.len(),
                });
            }
        }
        if iters.windows(2).any(|w| w[1] != w[0] + 1) {
            return Err(bad("only adjacent loops, outer to inner, can be fused"));
        }
        let ids: Vec<IterId> = iters.iter().map(|&i| s.leaves[i as usize]).collect();
        let kind = s.iter(ids[0]).kind;
        if ids.iter().any(|&i| s.iter(i).kind != kind) {
            return Err(bad("spatial and reduce loops cannot be fused"));
        }
        if ids.iter().any(|&i| s.iter(i).annotation.is_some()) {
            return Err(bad("annotated loops cannot be fused"));
        }
        let mut ext: i64 = 1;
        for &i in &ids {
            ext = ext
                .checked_mul(s.iter(i).extent)
                .ok_or(bad("the fused extent overflows"))?;
        }
        if ids.len() == 1 {
            return Ok(());
        }
        let tensor = s.tensor;
        let s = &mut self.stages[stage as usize];
        let mut acc = ids[0];
        for &next in &ids[1..] {
            let name = format!(
                "{}@{}",
                s.iters[acc.0 as usize].name, s.iters[next.0 as usize].name
            );
            let e = s.iters[acc.0 as usize].extent * s.iters[next.0 as usize].extent;
            let fused = push_iter(s, name, e, kind);
            s.relations.push(Relation::Fuse {
                outer: acc,
                inner: next,
                fused,
            });
            acc = fused;
        }
        let p = iters[0] as usize;
        s.leaves.splice(p..p + ids.len(), [acc]);
        if let Some((u, n)) = s.auto_unroll {
            if ids.contains(&u) {
                s.auto_unroll = Some((acc, n));
            }
        }
        self.reattach(tensor, &ids, acc);
        Ok(())
    }

    fn do_reorder(&mut self, stage: u32, order: &[u32]) -> Result<(), E> {
        let s = self.compute_stage(stage, "scheduled")?;
        let n = s.leaves.len();
        let mut seen = vec![false; n];
        let ok = order.len() == n
            && order
                .iter()
                .all(|&o| (o as usize) < n && !std::mem::replace(&mut seen[o as usize], true));
        if !ok {
            return Err(E::BadReorder {
                stage: s.name().to_string(),
                order: order.to_vec(),
                count: n,
            });
        }
        let s = &mut self.stages[stage as usize];
        s.leaves = order.iter().map(|&o| s.leaves[o as usize]).collect();
        Ok(())
    }

    fn do_compute_at(&mut self, stage: u32, target: u32, iter: u32) -> Result<(), E> {
        let s = self.compute_stage(stage, "moved")?;
        let (t, id) = self.leaf_at(target, iter)?;
        let bad = |why: String| E::BadComputeAt {
            stage: s.name().to_string(),
            target: t.name().to_string(),
            why,
        };
        if stage == target {
            return Err(bad("a stage cannot be computed inside itself".into()));
        }
        if t.location == Location::Inlined {
            return Err(bad("the target is inlined".into()));
        }
        let consumers = self.effective_consumers(s.tensor);
        if consumers.is_empty() {
            return Err(bad(
                "it has no consumer (an output cannot be attached)".into()
            ));
        }
        // Every reader is the target, or a stage already computed at the same loop (it is
        // emitted after this one there, and the region covers what it reads: softmax's row
        // maximum beside the row sum that reads it; the partial sums of an rfactored row sum
        // beside the sum, with the target reading neither).
        let here = Location::At {
            tensor: t.tensor,
            iter: id,
        };
        let encloses = consumers.iter().all(|&c| {
            c == t.tensor
                || self
                    .position_of(c)
                    .is_some_and(|p| p > stage as usize && self.stages[p].location == here)
        });
        if !encloses {
            let names: Vec<String> = consumers
                .iter()
                .filter_map(|c| self.position_of(*c))
                .map(|p| self.stages[p].name().to_string())
                .collect();
            return Err(bad(format!(
                "loop `{}` does not enclose every use: it is read by {}",
                t.iter(id).name,
                names.join(", ")
            )));
        }
        // The target must not itself be computed inside the stage.
        let mut cur = t.location;
        while let Location::At { tensor, .. } = cur {
            if tensor == s.tensor {
                return Err(bad("the target is computed inside the stage".into()));
            }
            cur = self
                .position_of(tensor)
                .map(|p| self.stages[p].location)
                .unwrap_or(Location::Root);
        }
        let tensor = t.tensor;
        self.stages[stage as usize].location = Location::At { tensor, iter: id };
        Ok(())
    }

    fn do_inline(&mut self, stage: u32) -> Result<(), E> {
        let s = self.compute_stage(stage, "inlined")?;
        let bad = |why| E::BadInline {
            stage: s.name().to_string(),
            why,
        };
        if s.is_reduction() {
            return Err(bad(
                "it is a reduction; only injective stages can be inlined",
            ));
        }
        if self.is_output(s.tensor) {
            return Err(bad("it is an output"));
        }
        if self.direct_consumers(s.tensor).is_empty() {
            return Err(bad("it has no consumer"));
        }
        if self.attached_to(s.tensor).next().is_some() {
            return Err(bad("other stages are computed inside its loops"));
        }
        self.stages[stage as usize].location = Location::Inlined;
        Ok(())
    }

    fn untouched(s: &Stage) -> bool {
        s.relations.is_empty()
            && s.iters.iter().all(|i| i.annotation.is_none())
            && s.leaves.iter().enumerate().all(|(p, l)| l.0 as usize == p)
            && s.auto_unroll.is_none()
            && s.storage_order.is_none()
            && s.prefetch.is_empty()
    }

    fn fresh_var(&mut self, name: &str) -> Var {
        let v = Var::new(self.next_var, name);
        self.next_var += 1;
        v
    }

    fn fresh_tensor(&mut self) -> TensorId {
        let t = TensorId(self.next_tensor);
        self.next_tensor += 1;
        t
    }

    fn do_cache_write(&mut self, stage: u32, scope: Scope) -> Result<(), E> {
        let s = self.compute_stage(stage, "cached")?;
        let bad = |why: String| E::BadCache {
            stage: s.name().to_string(),
            why,
        };
        if !Self::untouched(s) {
            return Err(bad(
                "cache_write must come before the stage's loops are transformed".into(),
            ));
        }
        if s.location != Location::Root {
            return Err(bad("cache_write needs a stage at the root".into()));
        }
        if self.attached_to(s.tensor).next().is_some() {
            return Err(bad("stages are already computed inside its loops".into()));
        }
        let op = s.op.clone();
        let Some((axes, _)) = op.compute() else {
            return Err(bad("not a compute".into()));
        };
        let axes = axes.to_vec();
        let new_t = self.fresh_tensor();
        let local = StageOp {
            name: format!("{}.{}", op.name, scope.name()),
            ..(*op).clone()
        };
        let mut local_stage = Stage::new(new_t, Arc::new(local));
        local_stage.scope = scope;
        let copy = StageOp {
            name: op.name.clone(),
            shape: op.shape.clone(),
            dtype: op.dtype,
            kind: OpKind::Compute {
                body: Expr::Load {
                    tensor: new_t,
                    dtype: op.dtype,
                    indices: axes.iter().map(IterVar::expr).collect(),
                },
                axes,
            },
        };
        let old = &self.stages[stage as usize];
        let mut copy_stage = Stage::new(old.tensor, Arc::new(copy));
        copy_stage.scope = old.scope;
        self.stages[stage as usize] = copy_stage;
        self.stages.insert(stage as usize, local_stage);
        Ok(())
    }

    fn do_cache_read(&mut self, stage: u32, scope: Scope, readers: &[u32]) -> Result<(), E> {
        let s = self.stage_at(stage)?;
        let bad = |why: String| E::BadCache {
            stage: s.name().to_string(),
            why,
        };
        if readers.is_empty() {
            return Err(bad("cache_read needs at least one reader".into()));
        }
        let consumers = self.direct_consumers(s.tensor);
        let mut reader_tensors = Vec::new();
        for &r in readers {
            let rs = self.compute_stage(r, "a reader")?;
            if !consumers.contains(&rs.tensor) {
                return Err(bad(format!("`{}` does not read it", rs.name())));
            }
            if reader_tensors.contains(&rs.tensor) {
                return Err(bad(format!("reader `{}` given twice", rs.name())));
            }
            reader_tensors.push(rs.tensor);
        }
        if s.location == Location::Inlined {
            return Err(bad("it is inlined".into()));
        }
        let (name, shape, dtype, src) = (
            s.name().to_string(),
            s.op.shape.clone(),
            s.op.dtype,
            s.tensor,
        );
        let axes: Vec<IterVar> = shape
            .iter()
            .enumerate()
            .map(|(d, &extent)| IterVar {
                var: self.fresh_var(&format!("ax{d}")),
                extent,
            })
            .collect();
        let new_t = self.fresh_tensor();
        let op = StageOp {
            name: format!("{name}.{}", scope.name()),
            shape,
            dtype,
            kind: OpKind::Compute {
                body: Expr::Load {
                    tensor: src,
                    dtype,
                    indices: axes.iter().map(IterVar::expr).collect(),
                },
                axes,
            },
        };
        let mut st = Stage::new(new_t, Arc::new(op));
        st.scope = scope;
        for rt in &reader_tensors {
            let Some(p) = self.position_of(*rt) else {
                continue;
            };
            let rs = &mut self.stages[p];
            let mut op = (*rs.op).clone();
            if let OpKind::Compute { body, .. } = &mut op.kind {
                *body = body.rewrite(&mut |e| match e {
                    Expr::Load {
                        tensor,
                        dtype,
                        indices,
                    } if *tensor == src => Some(Expr::Load {
                        tensor: new_t,
                        dtype: *dtype,
                        indices: indices.clone(),
                    }),
                    _ => None,
                });
            }
            rs.op = Arc::new(op);
        }
        self.stages.insert(stage as usize + 1, st);
        Ok(())
    }

    fn do_reorder_storage(&mut self, stage: u32, order: &[u32]) -> Result<(), E> {
        let s = self.compute_stage(stage, "given a storage order")?;
        let bad = |why: &str| E::BadStorageOrder {
            stage: s.name().to_string(),
            why: why.to_string(),
        };
        if self.is_output(s.tensor) {
            return Err(bad("an output's layout is the caller's"));
        }
        if s.location == Location::Inlined {
            return Err(bad("it is inlined"));
        }
        let n = s.op.shape.len();
        let mut seen = vec![false; n];
        for &d in order {
            match seen.get_mut(d as usize) {
                Some(x) if !*x => *x = true,
                _ => return Err(bad(&format!("{order:?} is not a permutation of 0..{n}"))),
            }
        }
        if order.len() != n {
            return Err(bad(&format!("{order:?} is not a permutation of 0..{n}")));
        }
        let natural = order.iter().enumerate().all(|(q, &d)| q == d as usize);
        self.stages[stage as usize].storage_order =
            (!natural).then(|| order.iter().map(|&d| d as usize).collect());
        Ok(())
    }

    fn do_prefetch(
        &mut self,
        stage: u32,
        tensor: u32,
        axis: u32,
        offset: i64,
        level: PrefetchLevel,
    ) -> Result<(), E> {
        let s = self.compute_stage(stage, "given a prefetch")?;
        let bad = |why: String| E::BadPrefetch {
            stage: s.name().to_string(),
            why,
        };
        let fetched = self.stage_at(tensor)?;
        if fetched.tensor == s.tensor {
            return Err(bad("it would fetch its own output".into()));
        }
        let axes = s.op.compute().map_or(0, |(a, _)| a.len()) + s.op.reduce_axes().len();
        if axis as usize >= axes {
            return Err(bad(format!("it has no axis {axis} (it has {axes})")));
        }
        if offset == 0 || offset.unsigned_abs() > MAX_PREFETCH_OFFSET as u64 {
            return Err(bad(format!(
                "offset {offset} is 0 or beyond {MAX_PREFETCH_OFFSET} either way"
            )));
        }
        let hint = PrefetchHint {
            tensor: fetched.tensor,
            axis: axis as usize,
            offset,
            level,
        };
        let hints = &mut self.stages[stage as usize].prefetch;
        // One offset per tensor, axis and level: a later step replaces an earlier one.
        hints.retain(|h| (h.tensor, h.axis, h.level) != (hint.tensor, hint.axis, hint.level));
        hints.push(hint);
        Ok(())
    }

    fn do_annotate(&mut self, stage: u32, iter: u32, ann: Annotation) -> Result<(), E> {
        let (s, id) = self.leaf_at(stage, iter)?;
        let it = s.iter(id);
        let what = match ann {
            Annotation::Vectorize => "vectorize".to_string(),
            Annotation::VectorizeUpTo(n) => format!("vectorize up to {n} lanes"),
            Annotation::Unroll => "unroll".to_string(),
            Annotation::Parallel => "parallelize".to_string(),
            Annotation::Bind(t) => format!("bind to {}", t.name()),
        };
        let bad = |why| E::BadAnnotation {
            stage: s.name().to_string(),
            iter: it.name.clone(),
            what: what.clone(),
            why,
        };
        if it.annotation.is_some() {
            return Err(bad("the loop is already annotated"));
        }
        // A reduce loop bound to `threadIdx.x` is a cross-thread reduction: each thread
        // accumulates its share and lowering combines the partials through shared memory
        // (`lower::allreduce`), so its iterations need not be independent.
        let cross_thread = ann == Annotation::Bind(crate::ir::ThreadAxis::ThreadX);
        if it.kind == IterKind::Reduce && ann != Annotation::Unroll && !cross_thread {
            return Err(bad(
                "it is a reduce loop (its iterations are not independent)",
            ));
        }
        if let Annotation::VectorizeUpTo(n) = ann {
            if !(2..=MAX_VECTOR_LANES).contains(&(n as i64)) {
                return Err(bad("the lane limit must be 2 to 64"));
            }
        }
        if let Annotation::Bind(axis) = ann {
            // A block or thread index is one value per thread: two loops of one nest bound to
            // it would be forced equal. (A stage attached inside may bind it again: there it
            // means the same thread, see `gpu`.)
            if axis != crate::ir::ThreadAxis::VThread {
                if let Some(other) = s
                    .leaves
                    .iter()
                    .find(|&&l| l != id && s.iter(l).annotation == Some(Annotation::Bind(axis)))
                {
                    return Err(E::AxisBoundTwice {
                        stage: s.name().to_string(),
                        loops: format!(
                            "loop `{}` (bound already) and loop `{}`",
                            s.iter(*other).name,
                            it.name
                        ),
                        axis: axis.name(),
                    });
                }
            }
        }
        if matches!(ann, Annotation::Vectorize | Annotation::VectorizeUpTo(_)) {
            // The nominal extent only bounds a plain `vectorize`: a stage computed inside
            // another's loops takes its extents from bound inference, which the limit of
            // `VectorizeUpTo` is checked against when lowering.
            if ann == Annotation::Vectorize && it.extent > MAX_VECTOR_LANES {
                return Err(bad("more than 64 lanes"));
            }
            if iter as usize + 1 != s.leaves.len() {
                return Err(bad("only the innermost loop can be vectorized"));
            }
            let t = s.tensor;
            if self.stages.iter().any(|o| {
                o.location
                    == Location::At {
                        tensor: t,
                        iter: id,
                    }
            }) {
                return Err(bad("a stage is computed inside it"));
            }
        }
        self.stages[stage as usize].iters[id.0 as usize].annotation = Some(ann);
        Ok(())
    }

    fn do_rfactor(&mut self, stage: u32, iter: u32) -> Result<(), E> {
        let (s, id) = self.leaf_at(stage, iter)?;
        let bad = |why: String| E::BadRfactor {
            stage: s.name().to_string(),
            why,
        };
        if !s.is_reduction() {
            return Err(bad("it is not a reduction".into()));
        }
        if s.iter(id).kind != IterKind::Reduce {
            return Err(bad(format!(
                "loop `{}` is not a reduce loop",
                s.iter(id).name
            )));
        }
        if s.location != Location::Root || self.attached_to(s.tensor).next().is_some() {
            return Err(bad(
                "rfactor needs a root stage with nothing attached".into()
            ));
        }
        if s.iters.iter().any(|i| i.annotation.is_some())
            || s.auto_unroll.is_some()
            || !s.prefetch.is_empty()
        {
            return Err(bad("rfactor must come before loops are annotated".into()));
        }
        let nsp = s.op.compute().map(|(a, _)| a.len()).unwrap_or(0);
        let spatial_touched = s.relations.iter().any(|r| match r {
            Relation::Split { parent, .. } => (parent.0 as usize) < nsp,
            Relation::Fuse { outer, .. } => s.iter(*outer).kind == IterKind::Spatial,
        });
        if spatial_touched {
            return Err(bad(
                "rfactor must come before spatial loops are transformed".into(),
            ));
        }
        let Some((
            axes,
            Expr::Reduce {
                combiner,
                source,
                axes: raxes,
            },
        )) = s.op.compute()
        else {
            return Err(bad("it is not a reduction".into()));
        };
        let (axes, combiner, source, raxes) =
            (axes.to_vec(), *combiner, (**source).clone(), raxes.clone());
        let (name, shape, dtype, tensor) = (
            s.name().to_string(),
            s.op.shape.clone(),
            s.op.dtype,
            s.tensor,
        );
        // Reduce leaves other than the chosen one, in leaf order.
        let reduce_leaves: Vec<IterId> = s
            .leaves
            .iter()
            .copied()
            .filter(|&l| s.iter(l).kind == IterKind::Reduce && l != id)
            .collect();
        let leaf_info: Vec<(IterId, String, i64)> = std::iter::once(id)
            .chain(reduce_leaves.iter().copied())
            .map(|l| (l, s.iter(l).name.clone(), s.iter(l).extent))
            .collect();
        let relations = s.relations.clone();
        let iters = s.iters.clone();
        // New variables: the factored loop becomes a spatial axis, the rest stay reduce axes.
        let mut leaf_vars = Vec::new();
        for (l, n, ext) in &leaf_info {
            let v = self.fresh_var(n);
            leaf_vars.push((
                *l,
                IterVar {
                    var: v,
                    extent: *ext,
                },
            ));
        }
        let extents: Vec<i64> = iters.iter().map(|i| i.extent).collect();
        let (root_vals, preds) = root_values(&extents, &relations, &leaf_vars);
        let map = |v: &Var| -> Option<Expr> {
            raxes
                .iter()
                .position(|a| a.var.id == v.id)
                .and_then(|k| root_vals[nsp + k].clone())
        };
        let mut src = source.substitute(&map);
        if let Some(p) = preds.into_iter().reduce(Expr::and) {
            src = select(p, src, Expr::Const(combiner.identity(dtype)));
        }
        let rf_axis = leaf_vars[0].1.clone();
        let rest: Vec<IterVar> = leaf_vars[1..].iter().map(|(_, v)| v.clone()).collect();
        let mut rf_axes = axes.clone();
        rf_axes.push(rf_axis.clone());
        let rf_body = if rest.is_empty() {
            src
        } else {
            Expr::Reduce {
                combiner,
                source: Box::new(src),
                axes: rest,
            }
        };
        let mut rf_shape = shape.clone();
        rf_shape.push(rf_axis.extent);
        let rf_t = self.fresh_tensor();
        let rf = StageOp {
            name: format!("{name}.rf"),
            shape: rf_shape,
            dtype,
            kind: OpKind::Compute {
                axes: rf_axes,
                body: rf_body,
            },
        };
        let k = IterVar {
            var: self.fresh_var(&format!("{}.v", leaf_info[0].1)),
            extent: rf_axis.extent,
        };
        let mut idx: Vec<Expr> = axes.iter().map(IterVar::expr).collect();
        idx.push(k.expr());
        let fin = StageOp {
            name,
            shape,
            dtype,
            kind: OpKind::Compute {
                axes,
                body: Expr::Reduce {
                    combiner,
                    source: Box::new(Expr::Load {
                        tensor: rf_t,
                        dtype,
                        indices: idx,
                    }),
                    axes: vec![k],
                },
            },
        };
        let scope = self.stages[stage as usize].scope;
        let mut fin_stage = Stage::new(tensor, Arc::new(fin));
        fin_stage.scope = scope;
        self.stages[stage as usize] = fin_stage;
        self.stages
            .insert(stage as usize, Stage::new(rf_t, Arc::new(rf)));
        Ok(())
    }
}

fn push_iter(s: &mut Stage, name: String, extent: i64, kind: IterKind) -> IterId {
    s.iters.push(Iter {
        name,
        extent,
        kind,
        annotation: None,
    });
    IterId(s.iters.len() as u32 - 1)
}

/// Extents `(outer, inner)` of a split of a loop of extent `parent`.
pub fn split_extents(parent: i64, by: SplitBy) -> (i64, i64) {
    let inner = match by {
        SplitBy::Factor(f) => f.min(parent).max(1),
        SplitBy::NParts(n) => (parent + n - 1) / n.max(1),
    }
    .max(1);
    ((parent + inner - 1) / inner, inner)
}

/// The value of every iterator as an expression of the given leaves (those not given are
/// `None`), and the guards that non-divisible splits need. Extents are taken from `iters`.
pub fn root_values(
    extents: &[i64],
    relations: &[Relation],
    leaves: &[(IterId, IterVar)],
) -> (Vec<Option<Expr>>, Vec<Expr>) {
    let mut val: Vec<Option<Expr>> = vec![None; extents.len()];
    for (l, v) in leaves {
        val[l.0 as usize] = Some(v.expr());
    }
    let mut preds = Vec::new();
    for r in relations.iter().rev() {
        match *r {
            Relation::Split {
                parent,
                outer,
                inner,
                ..
            } => {
                let ie = extents[inner.0 as usize];
                let oe = extents[outer.0 as usize];
                if let (Some(o), Some(i)) = (&val[outer.0 as usize], &val[inner.0 as usize]) {
                    let p = o.clone() * ie + i.clone();
                    if oe * ie > extents[parent.0 as usize] {
                        preds.push(p.clone().lt(extents[parent.0 as usize]));
                    }
                    val[parent.0 as usize] = Some(p);
                }
            }
            Relation::Fuse {
                outer,
                inner,
                fused,
            } => {
                if let Some(f) = val[fused.0 as usize].clone() {
                    let ie = extents[inner.0 as usize];
                    val[outer.0 as usize] = Some(f.clone().floordiv(ie));
                    val[inner.0 as usize] = Some(f.floormod(ie));
                }
            }
        }
    }
    (val, preds)
}

/// Extents of every iterator when the roots have `roots` (spatial, then reduce): the nominal
/// extents when `roots` is the full domain, the tile extents inside a `compute_at`.
pub fn derive_extents(s: &Stage, roots: &[i64]) -> Vec<i64> {
    let mut ext: Vec<i64> = s.iters.iter().map(|i| i.extent).collect();
    ext[..roots.len()].copy_from_slice(roots);
    for r in &s.relations {
        match *r {
            Relation::Split {
                parent,
                outer,
                inner,
                by,
            } => {
                let (o, i) = split_extents(ext[parent.0 as usize], by);
                ext[outer.0 as usize] = o;
                ext[inner.0 as usize] = i;
            }
            Relation::Fuse {
                outer,
                inner,
                fused,
            } => ext[fused.0 as usize] = ext[outer.0 as usize] * ext[inner.0 as usize],
        }
    }
    ext
}

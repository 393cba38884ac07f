//! Lowering: a schedule [`State`] to a [`LoweredFunc`] of the loop IR.
//!
//! The pipeline, in order:
//! 1. `inline`: substitute inlined stages into their consumers (effective bodies);
//! 2. `buffers`: one buffer per materialized stage: inputs and outputs are parameters, root
//!    intermediates are global temporaries of their full shape, attached stages get a
//!    temporary of their region's shape allocated inside the loop they are attached to;
//! 3. `emit`: each root stage's loop nest, outer to inner, with attached stages emitted at the
//!    top of their loop's body after bound inference ([`bound`]) has sized their region; a
//!    reduction initializes its accumulator just outside its outermost reduce loop;
//! 4. `vthread`: each loop bound to a virtual thread pushed down to the statements that
//!    differ between its iterations, what they share (a shared-memory fetch, a barrier) left
//!    to run once, and the temporaries each iteration fills for itself given a block per
//!    iteration (see the `vthread` module);
//! 5. `simplify`: canonical index forms, provably true guards removed, unit loops removed
//!    (not those bound to a block or thread axis, which guard a wider launch);
//! 6. `partition` (when `LowerOptions::partition_tails` asks): a loop whose last iterations
//!    fail a guard (the tail of an imperfect split) becomes a guard-free main loop and a
//!    guarded tail ([`partition`]), simplified again;
//! 7. `verify` (see [`crate::verify`]).
//!
//! Set `LowerOptions::dump` to get the IR after each pass.

mod allreduce;
pub mod bound;
pub mod partition;
mod vthread;

use crate::expr::{BufId, Expr, IterVar, TensorId, Var};
use crate::ir::{BufKind, BufferDecl, ForKind, LoweredFunc, Scope, Stmt, ThreadAxis};
use crate::schedule::{derive_extents, root_values, IterId, IterKind, Location, State};
use crate::simplify::Simplifier;
use crate::te::OpKind;
use crate::trace::Annotation;
use bound::{infer_region, DimRegion};
use rustc_hash::FxHashMap as HashMap;

/// Why a state does not lower.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum LowerError {
    /// A vectorized loop that is not innermost in its nest.
    #[error("stage `{stage}`, loop `{iter}`: a vectorized loop must be innermost with nothing computed inside it")]
    VectorNotInnermost {
        /// The stage.
        stage: String,
        /// The loop.
        iter: String,
    },
    /// A stage attached somewhere that does not enclose all its uses.
    #[error("`{stage}` is computed inside `{target}` but read by `{reader}` too")]
    AttachedElsewhere {
        /// The attached stage.
        stage: String,
        /// Where it is attached.
        target: String,
        /// Another reader.
        reader: String,
    },
    /// A stage that is never emitted (attached to an inlined stage, or a dangling location).
    #[error("`{stage}` is never computed: {why}")]
    NotEmitted {
        /// The stage.
        stage: String,
        /// Why.
        why: String,
    },
    /// A reduce loop bound to `threadIdx.x` in a nest that a cross-thread reduction cannot
    /// take.
    #[error("stage `{stage}`: cross-thread reduction over `{iter}`: {why}")]
    CrossThread {
        /// The stage.
        stage: String,
        /// The reduce loop bound to `threadIdx.x`.
        iter: String,
        /// What stands in the way.
        why: String,
    },
    /// The lowered IR breaks an invariant (a bug in lowering).
    #[error("lowered IR is invalid: {0}")]
    Verify(String),
}

/// Options of [`lower_with`].
#[derive(Clone, Debug, Default)]
pub struct LowerOptions {
    /// Function name (default `kernel`).
    pub name: Option<String>,
    /// Receives `(pass name, IR text)` after each pass.
    pub dump: Option<fn(&str, &str)>,
    /// Give the guarded tails of imperfect splits loops of their own (the `partition` pass).
    /// Off by default: on conv2d tuning candidates it cost 1.2-1.3x the compile time (their
    /// imperfect splits copied whole vectorized loop nests) for no faster best program, while
    /// the matmul register tiles it speeds up (6 x 16 on 1024 rows: 2x) are not the ones the
    /// search settles on when perfect tiles exist.
    pub partition_tails: bool,
}

/// Lowers a state with default options.
pub fn lower(state: &State) -> Result<LoweredFunc, LowerError> {
    lower_with(state, &LowerOptions::default())
}

/// Lowers a state.
pub fn lower_with(state: &State, opts: &LowerOptions) -> Result<LoweredFunc, LowerError> {
    let mut l = Lowerer::new(state);
    l.inline();
    l.buffers();
    let body = l.emit()?;
    let body = vthread::inject(body, &mut l.bufs, &mut l.next_var);
    let mut func = LoweredFunc {
        name: opts.name.clone().unwrap_or_else(|| "kernel".into()),
        buffers: l.bufs,
        params: l.params,
        body,
        num_vars: l.next_var,
    };
    if let Some(d) = opts.dump {
        d("emit", &func.to_string());
    }
    func.body = Simplifier::default().stmt(&func.body);
    if let Some(d) = opts.dump {
        d("simplify", &func.to_string());
    }
    if opts.partition_tails {
        if let Some(b) = partition::partition(&func.body, &mut func.buffers, &mut func.num_vars) {
            func.body = Simplifier::default().stmt(&b);
            if let Some(d) = opts.dump {
                d("partition", &func.to_string());
            }
        }
    }
    crate::verify::verify(&func).map_err(LowerError::Verify)?;
    crate::bounds::mark_lowered(&func);
    Ok(func)
}

struct Lowerer<'a> {
    state: &'a State,
    pos: HashMap<TensorId, usize>,
    /// Effective body per stage position (inlined producers substituted).
    eff: Vec<Option<Expr>>,
    bufs: Vec<BufferDecl>,
    params: Vec<BufId>,
    buf_of: HashMap<TensorId, BufId>,
    regions: HashMap<TensorId, Vec<DimRegion>>,
    emitted: Vec<bool>,
    next_var: u32,
    /// Variables and extents of the loops bound to a thread axis (`threadIdx.*`) around the
    /// statement being emitted: a shared-memory stage attached inside them is computed by
    /// the whole block, so its region spans every value they take.
    thread_loops: Vec<(u32, i64)>,
    /// The same for loops bound to a virtual thread: a shared-memory stage is filled for
    /// every virtual thread too (lowering then runs it once, see `vthread`).
    vthread_loops: Vec<(u32, i64)>,
}

impl<'a> Lowerer<'a> {
    fn new(state: &'a State) -> Self {
        let pos = state
            .stages()
            .iter()
            .enumerate()
            .map(|(i, s)| (s.tensor, i))
            .collect();
        Lowerer {
            state,
            pos,
            eff: Vec::new(),
            bufs: Vec::new(),
            params: Vec::new(),
            buf_of: HashMap::default(),
            regions: HashMap::default(),
            emitted: vec![false; state.stages().len()],
            next_var: 0,
            thread_loops: Vec::new(),
            vthread_loops: Vec::new(),
        }
    }

    fn fresh(&mut self, name: &str) -> Var {
        let v = Var::new(self.next_var, name);
        self.next_var += 1;
        v
    }

    /// Pass 1: effective bodies, in topological order so producers are done first.
    fn inline(&mut self) {
        let stages = self.state.stages();
        let mut eff: Vec<Option<Expr>> = Vec::with_capacity(stages.len());
        for s in stages {
            let body = s.op.compute().map(|(_, b)| {
                b.rewrite(&mut |e| match e {
                    Expr::Load {
                        tensor, indices, ..
                    } => {
                        let p = *self.pos.get(tensor)?;
                        let prod = &stages[p];
                        if prod.location != Location::Inlined {
                            return None;
                        }
                        let (axes, _) = prod.op.compute()?;
                        let pbody = eff.get(p)?.as_ref()?;
                        let map: HashMap<u32, Expr> = axes
                            .iter()
                            .zip(indices)
                            .map(|(a, i)| (a.var.id, i.clone()))
                            .collect();
                        Some(pbody.substitute(&|v| map.get(&v.id).cloned()))
                    }
                    _ => None,
                })
            });
            eff.push(body);
        }
        self.eff = eff;
    }

    /// Pass 2: buffers (attached stages get their shapes when their region is known).
    fn buffers(&mut self) {
        let st = self.state;
        let add = |l: &mut Self, t: TensorId, kind: BufKind| {
            let s = &st.stages()[l.pos[&t]];
            let id = BufId(l.bufs.len() as u32);
            let scope = if matches!(kind, BufKind::Temp) {
                s.scope
            } else {
                Scope::Global
            };
            let mut b = BufferDecl {
                name: s.name().to_string(),
                dtype: s.op.dtype,
                shape: in_storage_order(&s.op.shape, s.storage_order.as_deref()),
                scope,
                kind,
                row_pad: 0,
            };
            pad_rows(&mut b);
            l.bufs.push(b);
            l.buf_of.insert(t, id);
            id
        };
        for (n, &t) in st.inputs().iter().enumerate() {
            let id = add(self, t, BufKind::Input(n));
            self.params.push(id);
        }
        for (n, &t) in st.outputs().iter().enumerate() {
            let id = add(self, t, BufKind::Output(n));
            self.params.push(id);
        }
        for s in st.stages() {
            if s.is_placeholder()
                || s.location == Location::Inlined
                || self.buf_of.contains_key(&s.tensor)
            {
                continue;
            }
            add(self, s.tensor, BufKind::Temp);
        }
    }

    /// Pass 3: the loop nests.
    fn emit(&mut self) -> Result<Stmt, LowerError> {
        let st = self.state;
        let mut nests = Vec::new();
        let mut global_temps = Vec::new();
        for (p, s) in st.stages().iter().enumerate() {
            if s.is_placeholder() || s.location != Location::Root {
                continue;
            }
            nests.push(self.emit_stage(p)?);
            if !st.is_output(s.tensor) {
                global_temps.push(self.buf_of[&s.tensor]);
            }
        }
        for (p, s) in st.stages().iter().enumerate() {
            if !s.is_placeholder() && s.location != Location::Inlined && !self.emitted[p] {
                let why = match s.location {
                    Location::At { tensor, .. } => match self.pos.get(&tensor) {
                        Some(&t) => format!(
                            "it is attached to `{}`, which is not emitted",
                            st.stages()[t].name()
                        ),
                        None => "it is attached to a stage that does not exist".into(),
                    },
                    _ => "unknown".into(),
                };
                return Err(LowerError::NotEmitted {
                    stage: s.name().to_string(),
                    why,
                });
            }
        }
        let mut body = Stmt::seq(nests);
        for b in global_temps.into_iter().rev() {
            body = Stmt::Allocate {
                buf: b,
                body: Box::new(body),
            };
        }
        Ok(body)
    }

    fn flat_index(&self, t: TensorId, indices: &[Expr]) -> Expr {
        // Offsets from the region's base; strides from the buffer's shape (the region's, in
        // storage order, rows padded).
        let region = self.regions.get(&t);
        let local: Vec<Expr> = indices
            .iter()
            .enumerate()
            .map(|(d, idx)| match region {
                Some(r) if !r[d].full => idx.clone() - r[d].base.clone(),
                _ => idx.clone(),
            })
            .collect();
        self.flatten(t, local)
    }

    /// Row-major offset of the element at `per_dim` (the tensor's dimensions in its own
    /// order) in `t`'s buffer, whose dimensions are in the stage's storage order.
    fn flatten(&self, t: TensorId, mut per_dim: Vec<Expr>) -> Expr {
        let stage = &self.state.stages()[self.pos[&t]];
        let shape = match self.buf_of.get(&t) {
            Some(b) => &self.bufs[b.0 as usize].shape,
            None => &stage.op.shape,
        };
        let mut flat: Option<Expr> = None;
        for q in 0..per_dim.len() {
            let d = stage.storage_order.as_ref().map_or(q, |o| o[q]);
            let i = std::mem::replace(&mut per_dim[d], Expr::int(0));
            flat = Some(match flat {
                None => i,
                Some(f) => f * shape[q] + i,
            });
        }
        flat.unwrap_or_else(|| Expr::int(0))
    }

    fn to_buf_loads(&self, e: &Expr) -> Expr {
        e.rewrite(&mut |x| match x {
            Expr::Load {
                tensor,
                dtype,
                indices,
            } => Some(Expr::BufLoad {
                buf: *self.buf_of.get(tensor)?,
                dtype: *dtype,
                index: Box::new(self.flat_index(*tensor, indices)),
            }),
            _ => None,
        })
    }

    fn emit_stage(&mut self, p: usize) -> Result<Stmt, LowerError> {
        let st = self.state;
        let s = &st.stages()[p];
        self.emitted[p] = true;
        let (axes, _) =
            s.op.compute()
                .ok_or_else(|| LowerError::Verify("placeholder emitted".into()))?;
        let raxes = s.op.reduce_axes();
        let nsp = axes.len();
        let region = self.regions.get(&s.tensor).cloned();
        // Root extents: the region inside a compute_at, else the whole domain.
        let mut roots: Vec<i64> = match &region {
            Some(r) => r.iter().map(|d| d.extent).collect(),
            None => s.op.shape.clone(),
        };
        roots.extend(raxes.iter().map(|a| a.extent));
        let ext = derive_extents(s, &roots);
        let leaf_vars: Vec<(IterId, IterVar)> = s
            .leaves
            .iter()
            .map(|&l| {
                let v = self.fresh(&s.iter(l).name);
                (
                    l,
                    IterVar {
                        var: v,
                        extent: ext[l.0 as usize],
                    },
                )
            })
            .collect();
        let (vals, mut preds) = root_values(&ext, &s.relations, &leaf_vars);
        let local: Vec<Expr> = (0..nsp + raxes.len())
            .map(|r| vals[r].clone().unwrap_or_else(|| Expr::int(0)))
            .collect();
        // Absolute axis values; a region's tile may stick out of the domain: guard it.
        let mut axis_val: Vec<Expr> = local.clone();
        if let Some(r) = &region {
            for d in 0..nsp {
                if !r[d].full {
                    let v = r[d].base.clone() + local[d].clone();
                    preds.push(v.clone().lt(s.op.shape[d]));
                    preds.push(v.clone().ge(0i64));
                    axis_val[d] = v;
                }
            }
        }
        let mut map: HashMap<u32, Expr> = HashMap::default();
        for (d, a) in axes.iter().enumerate() {
            map.insert(a.var.id, axis_val[d].clone());
        }
        for (r, a) in raxes.iter().enumerate() {
            map.insert(a.var.id, axis_val[nsp + r].clone());
        }
        let body = self.eff[p]
            .as_ref()
            .ok_or_else(|| LowerError::Verify(format!("no body for `{}`", s.name())))?
            .substitute(&|v| map.get(&v.id).cloned());

        // Stages attached to this one, per leaf position; size their regions now, before this
        // stage's loads are flattened against them.
        let attached = self.attach(p, &body, &leaf_vars)?;

        let store_index = self.flatten(
            s.tensor,
            match &region {
                Some(_) => local[..nsp].to_vec(),
                None => axis_val[..nsp].to_vec(),
            },
        );
        let reduce_vars: Vec<u32> = leaf_vars
            .iter()
            .filter(|(l, _)| s.iter(*l).kind == IterKind::Reduce)
            .map(|(_, v)| v.var.id)
            .collect();
        let kinds = loop_kinds(s, &leaf_vars, &attached)?;
        let mut first_reduce = leaf_vars
            .iter()
            .position(|(l, _)| s.iter(*l).kind == IterKind::Reduce);
        let mut stop = leaf_vars.len();
        let (init, update) = match cross_thread_loop(s) {
            Some(bound) => {
                let f = first_reduce.unwrap_or(0);
                let update = self.cross_thread(
                    p,
                    &body,
                    store_index,
                    preds,
                    &reduce_vars,
                    &leaf_vars,
                    &kinds,
                    &attached,
                    f,
                    bound,
                )?;
                // The whole reduction is one statement at the first reduce loop: no init
                // nest, and the loops from there on are the reduction's own.
                stop = f;
                first_reduce = None;
                (None, update)
            }
            None => {
                let (init, update) = self.stores(p, &body, store_index, preds, &reduce_vars);
                let mut items = self.prefetches(p, &axis_val);
                if items.is_empty() {
                    (init, update)
                } else {
                    items.push(update);
                    (init, Stmt::seq(items))
                }
            }
        };

        let mut nest = NestCtx {
            leaf_vars: &leaf_vars,
            kinds: &kinds,
            attached: &attached,
            first_reduce,
            stop,
            init,
            update: Some(update),
            is_reduce: &leaf_vars
                .iter()
                .map(|(l, _)| s.iter(*l).kind == IterKind::Reduce)
                .collect::<Vec<_>>(),
        };
        self.nest(&mut nest, 0, false)
    }

    /// Stage `p`'s [`Step::Prefetch`](crate::trace::Step::Prefetch)es, to run beside its
    /// innermost store: for each hint, one `Prefetch` per distinct element of its tensor that
    /// the body reads with the hint's axis `offset` further (`axis_val`: the axes' values,
    /// spatial then reduce). Tensors in a local temporary or a tile of one (a region) are
    /// left out: their next tile is not in the buffer yet.
    fn prefetches(&self, p: usize, axis_val: &[Expr]) -> Vec<Stmt> {
        let s = &self.state.stages()[p];
        let (Some((axes, _)), Some(eff)) = (s.op.compute(), self.eff[p].as_ref()) else {
            return Vec::new();
        };
        let mut out: Vec<Stmt> = Vec::new();
        for h in &s.prefetch {
            let Some(&buf) = self.buf_of.get(&h.tensor) else {
                continue;
            };
            if self.bufs[buf.0 as usize].scope != Scope::Global
                || self.regions.contains_key(&h.tensor)
            {
                continue;
            }
            let map: HashMap<u32, Expr> = axes
                .iter()
                .chain(s.op.reduce_axes())
                .zip(axis_val)
                .enumerate()
                .map(|(d, (a, v))| {
                    let v = if d == h.axis {
                        v.clone() + Expr::int(h.offset)
                    } else {
                        v.clone()
                    };
                    (a.var.id, v)
                })
                .collect();
            eff.substitute(&|v| map.get(&v.id).cloned())
                .visit(&mut |e| {
                    if let Expr::Load {
                        tensor, indices, ..
                    } = e
                    {
                        if *tensor == h.tensor {
                            let st = Stmt::Prefetch {
                                buf,
                                index: self.flat_index(*tensor, indices),
                                level: h.level,
                            };
                            if !out.contains(&st) {
                                out.push(st);
                            }
                        }
                    }
                });
        }
        out
    }

    /// The stages computed at each of stage `p`'s loops, per leaf position, with their
    /// buffers sized to the region its `body` reads inside that loop.
    fn attach(
        &mut self,
        p: usize,
        body: &Expr,
        leaf_vars: &[(IterId, IterVar)],
    ) -> Result<Vec<Vec<usize>>, LowerError> {
        let st = self.state;
        let s = &st.stages()[p];
        let mut attached: Vec<Vec<usize>> = vec![Vec::new(); s.leaves.len()];
        // Consumers first: a stage read by another stage attached at the same loop (softmax's
        // row maximum, read by the row sum beside it) takes that reader's region into its own.
        for (q, other) in st.stages().iter().enumerate().rev() {
            let Location::At { tensor, iter } = other.location else {
                continue;
            };
            if tensor != s.tensor {
                continue;
            }
            let Some(lp) = s.leaves.iter().position(|&l| l == iter) else {
                return Err(LowerError::NotEmitted {
                    stage: other.name().to_string(),
                    why: format!("its loop in `{}` is no longer a loop", s.name()),
                });
            };
            let mut accesses = Vec::new();
            let mut sibling_vars: Vec<(u32, i64)> = Vec::new();
            for c in st.effective_consumers(other.tensor) {
                let beside = self.pos.get(&c).is_some_and(|&cp| {
                    cp > q
                        && st.stages()[cp].location == other.location
                        && self.regions.contains_key(&c)
                });
                if beside {
                    self.sibling_accesses(c, other.tensor, &mut accesses, &mut sibling_vars);
                } else if c != s.tensor {
                    let reader = self.pos.get(&c).map(|&i| st.stages()[i].name().to_string());
                    return Err(LowerError::AttachedElsewhere {
                        stage: other.name().to_string(),
                        target: s.name().to_string(),
                        reader: reader.unwrap_or_default(),
                    });
                }
            }
            let mut inner: HashMap<u32, i64> = leaf_vars[lp + 1..]
                .iter()
                .map(|(_, v)| (v.var.id, v.extent))
                .collect();
            if other.scope == Scope::Shared {
                // One copy per block, filled by all its threads together: the region covers
                // what every thread of the block reads, so the thread loops around the attach
                // point (this stage's and the enclosing stages') range over their extents.
                // Virtual threads share it as well: it is what all of them read.
                let own = leaf_vars[..=lp]
                    .iter()
                    .filter(|(l, _)| {
                        let a = s.iter(*l).annotation;
                        is_thread_bound(a) || a == Some(Annotation::Bind(ThreadAxis::VThread))
                    })
                    .map(|(_, v)| (v.var.id, v.extent));
                inner.extend(
                    self.thread_loops
                        .iter()
                        .chain(&self.vthread_loops)
                        .copied()
                        .chain(own),
                );
            }
            inner.extend(sibling_vars);
            body.visit(&mut |e| {
                if let Expr::Load {
                    tensor, indices, ..
                } = e
                {
                    if *tensor == other.tensor {
                        accesses.push(indices.clone());
                    }
                }
            });
            let under_threads = !self.thread_loops.is_empty()
                || leaf_vars[..=lp]
                    .iter()
                    .any(|(l, _)| is_thread_bound(s.iter(*l).annotation));
            let reg = infer_region(&other.op.shape, &accesses, &inner);
            let b = &mut self.bufs[self.buf_of[&other.tensor].0 as usize];
            if under_threads && b.scope == Scope::Global {
                // A global temporary computed inside a thread's loops is that thread's own:
                // its storage is too (a kernel cannot allocate device memory per thread).
                b.scope = Scope::Local;
            } else if b.scope == Scope::Global && cross_thread_loop(other).is_some() {
                // A cross-thread reduction computed in a block's loops is the block's: every
                // thread of it reads the result, so it lives in shared memory.
                b.scope = Scope::Shared;
            }
            let extents: Vec<i64> = reg.iter().map(|r| r.extent).collect();
            b.shape = in_storage_order(&extents, other.storage_order.as_deref());
            pad_rows(b);
            self.regions.insert(other.tensor, reg);
            attached[lp].push(q);
        }
        // Emitted in stage order: producers before their readers.
        for a in &mut attached {
            a.reverse();
        }
        Ok(attached)
    }

    /// The loads of `producer` in the body of stage `c`, attached at the same loop and with
    /// its region already inferred, in terms of the loops around that attach point: each of
    /// `c`'s axes becomes its region's base plus a variable over the region's extent, each
    /// reduce axis a variable over its extent. The variables (ids from `u32::MAX` down, never
    /// a loop's) and their extents are added to `vars`.
    fn sibling_accesses(
        &self,
        c: TensorId,
        producer: TensorId,
        out: &mut Vec<Vec<Expr>>,
        vars: &mut Vec<(u32, i64)>,
    ) {
        let Some(&cp) = self.pos.get(&c) else { return };
        let cs = &self.state.stages()[cp];
        let (Some((axes, _)), Some(Some(body)), Some(region)) =
            (cs.op.compute(), self.eff.get(cp), self.regions.get(&c))
        else {
            return;
        };
        let mut map: HashMap<u32, Expr> = HashMap::default();
        let mut next = u32::MAX - vars.len() as u32;
        let mut range = |extent: i64, vars: &mut Vec<(u32, i64)>| {
            let v = Var::new(next, "region");
            next -= 1;
            vars.push((v.id, extent));
            Expr::Var(v)
        };
        for (d, a) in axes.iter().enumerate() {
            let r = &region[d];
            let v = range(r.extent, vars);
            map.insert(a.var.id, if r.full { v } else { r.base.clone() + v });
        }
        for a in cs.op.reduce_axes() {
            let v = range(a.extent, vars);
            map.insert(a.var.id, v);
        }
        body.substitute(&|v| map.get(&v.id).cloned())
            .visit(&mut |e| {
                if let Expr::Load {
                    tensor, indices, ..
                } = e
                {
                    if *tensor == producer {
                        out.push(indices.clone());
                    }
                }
            });
    }

    /// The statement of a cross-thread reduction ([`allreduce`]) for stage `p`, whose loop
    /// `bound` (a reduce loop bound to `threadIdx.x`) is at or after its first reduce loop
    /// `first`; an error where the nest has spatial loops or attached stages among its reduce
    /// loops.
    #[allow(clippy::too_many_arguments)]
    fn cross_thread(
        &mut self,
        p: usize,
        body: &Expr,
        store_index: Expr,
        preds: Vec<Expr>,
        reduce_vars: &[u32],
        leaf_vars: &[(IterId, IterVar)],
        kinds: &[ForKind],
        attached: &[Vec<usize>],
        first: usize,
        bound: usize,
    ) -> Result<Stmt, LowerError> {
        let s = &self.state.stages()[p];
        let bad = |why: &str| LowerError::CrossThread {
            stage: s.name().to_string(),
            iter: s.iter(leaf_vars[bound].0).name.clone(),
            why: why.to_string(),
        };
        if leaf_vars[first..]
            .iter()
            .any(|(l, _)| s.iter(*l).kind != IterKind::Reduce)
        {
            return Err(bad("a spatial loop is inside the reduce loops"));
        }
        if attached[first..].iter().any(|a| !a.is_empty()) {
            return Err(bad("a stage is computed inside the reduce loops"));
        }
        let Expr::Reduce {
            combiner, source, ..
        } = body
        else {
            return Err(bad("the stage is not a reduction"));
        };
        let out = self.buf_of[&s.tensor];
        let dtype = s.op.dtype;
        let spatial_preds = preds
            .iter()
            .filter(|e| !reduce_vars.iter().any(|&v| e.uses_var(v)))
            .cloned()
            .collect();
        let threads = leaf_vars[bound].1.extent;
        let temp = |l: &mut Self, suffix: &str, shape: i64, scope: Scope| {
            let id = BufId(l.bufs.len() as u32);
            l.bufs.push(BufferDecl {
                name: format!("{}.{suffix}", s.name()),
                dtype,
                shape: vec![shape],
                scope,
                kind: BufKind::Temp,
                row_pad: 0,
            });
            id
        };
        // Whole warps combine through shuffles, leaving one partial per warp for shared
        // memory; other thread counts combine every partial there.
        let shuffle = threads % allreduce::WARP == 0;
        let partials = if shuffle {
            threads / allreduce::WARP
        } else {
            threads
        };
        let red = temp(self, "red", partials, Scope::Shared);
        let acc = temp(self, "acc", 1, Scope::Local);
        let lane = shuffle.then(|| temp(self, "lane", 1, Scope::Local));
        let x = allreduce::CrossThread {
            combiner: *combiner,
            dtype,
            source: self.to_buf_loads(source),
            preds,
            spatial_preds,
            out,
            out_scope: self.bufs[out.0 as usize].scope,
            out_index: store_index,
            red,
            acc,
            lane,
        };
        let loops: Vec<(Var, i64, ForKind)> = leaf_vars[first..]
            .iter()
            .zip(&kinds[first..])
            .map(|((_, v), &k)| (v.var, v.extent, k))
            .collect();
        Ok(allreduce::emit(x, &loops, bound - first, &mut |n| {
            self.fresh(n)
        }))
    }

    /// The statements of stage `p`'s body: its initialization (a reduction's identity,
    /// guarded by the predicates that do not read reduce loops) and its update, guarded.
    fn stores(
        &self,
        p: usize,
        body: &Expr,
        store_index: Expr,
        preds: Vec<Expr>,
        reduce_vars: &[u32],
    ) -> (Option<Stmt>, Stmt) {
        let s = &self.state.stages()[p];
        let buf = self.buf_of[&s.tensor];
        let guard = |ps: Vec<Expr>, stmt: Stmt| match ps.into_iter().reduce(Expr::and) {
            Some(c) => Stmt::If {
                cond: c,
                then: Box::new(stmt),
                otherwise: None,
            },
            None => stmt,
        };
        match body {
            Expr::Reduce {
                combiner, source, ..
            } => {
                let acc = Expr::BufLoad {
                    buf,
                    dtype: s.op.dtype,
                    index: Box::new(store_index.clone()),
                };
                let value = Expr::bin(combiner.bin_op(), acc, self.to_buf_loads(source));
                let spatial_preds: Vec<Expr> = preds
                    .iter()
                    .filter(|e| !reduce_vars.iter().any(|&v| e.uses_var(v)))
                    .cloned()
                    .collect();
                let init = Stmt::Store {
                    buf,
                    index: store_index.clone(),
                    value: Expr::Const(combiner.identity(s.op.dtype)),
                };
                let update = Stmt::Store {
                    buf,
                    index: store_index,
                    value,
                };
                (Some(guard(spatial_preds, init)), guard(preds, update))
            }
            b => {
                let store = Stmt::Store {
                    buf,
                    index: store_index,
                    value: self.to_buf_loads(b),
                };
                (None, guard(preds, store))
            }
        }
    }

    /// The loop nest of a stage from leaf position `q` in: each position is reached once
    /// (the init nest branches off at the first reduce loop), so the init and update
    /// statements are moved out of `c`, not copied.
    fn nest(&mut self, c: &mut NestCtx, q: usize, main: bool) -> Result<Stmt, LowerError> {
        if Some(q) == c.first_reduce && !main {
            let init = match c.init.take() {
                Some(i) => {
                    // The init nest binds its own copies of the spatial loop variables,
                    // substituted in one pass.
                    let mut fresh: Vec<(usize, Var)> = Vec::new();
                    let mut map: HashMap<u32, Expr> = HashMap::default();
                    for r in (q..c.leaf_vars.len()).rev() {
                        if c.is_reduce[r] {
                            continue;
                        }
                        let old = &c.leaf_vars[r].1.var;
                        let v = self.fresh(old.name);
                        map.insert(old.id, Expr::Var(v));
                        fresh.push((r, v));
                    }
                    let mut s =
                        i.map_exprs(&|e| e.substitute(&|x| map.get(&x.id).cloned()), &|b| b);
                    for (r, v) in fresh {
                        s = Stmt::For {
                            var: v,
                            extent: c.leaf_vars[r].1.extent,
                            kind: c.kinds[r],
                            body: Box::new(s),
                        };
                    }
                    s
                }
                None => Stmt::Seq(Vec::new()),
            };
            let main_nest = self.nest(c, q, true)?;
            return Ok(Stmt::seq(vec![init, main_nest]));
        }
        if q == c.stop {
            return c
                .update
                .take()
                .ok_or_else(|| LowerError::Verify("a stage's body was emitted twice".into()));
        }
        let var = c.leaf_vars[q].1.var;
        let extent = c.leaf_vars[q].1.extent;
        let thread_bound = matches!(
            c.kinds[q],
            ForKind::ThreadBound(ThreadAxis::ThreadX | ThreadAxis::ThreadY | ThreadAxis::ThreadZ)
        );
        let virtual_thread = c.kinds[q] == ForKind::ThreadBound(ThreadAxis::VThread);
        if thread_bound {
            self.thread_loops.push((var.id, extent));
        }
        if virtual_thread {
            self.vthread_loops.push((var.id, extent));
        }
        let body = self.loop_body(c, q, main);
        if thread_bound {
            self.thread_loops.pop();
        }
        if virtual_thread {
            self.vthread_loops.pop();
        }
        Ok(Stmt::For {
            var,
            extent,
            kind: c.kinds[q],
            body: Box::new(body?),
        })
    }

    /// The body of loop `q` of a nest: the stages attached to it, then the loops inside. The
    /// block's threads fill a shared-memory stage together, so it is fenced by barriers: one
    /// before, so that no thread overwrites what another still reads from the previous
    /// iteration, and one after, so that every thread sees the whole of it.
    fn loop_body(&mut self, c: &mut NestCtx, q: usize, main: bool) -> Result<Stmt, LowerError> {
        let mut inner = vec![];
        let mut allocs = vec![];
        // By the buffer's scope: lowering puts an attached cross-thread reduction in shared
        // memory too (see `attach`).
        let shared = c.attached[q].iter().any(|&a| {
            self.bufs[self.buf_of[&self.state.stages()[a].tensor].0 as usize].scope == Scope::Shared
        });
        if shared {
            inner.push(Stmt::Sync);
        }
        for &a in &c.attached[q] {
            inner.push(self.emit_stage(a)?);
            allocs.push(self.buf_of[&self.state.stages()[a].tensor]);
        }
        if shared {
            inner.push(Stmt::Sync);
        }
        inner.push(self.nest(c, q + 1, main)?);
        let mut body = Stmt::seq(inner);
        for b in allocs.into_iter().rev() {
            body = Stmt::Allocate {
                buf: b,
                body: Box::new(body),
            };
        }
        Ok(body)
    }
}

/// The kind of each of the stage's loops: its annotation, with the auto-unroll pragma
/// resolved for loops without one.
fn loop_kinds(
    s: &crate::schedule::Stage,
    leaf_vars: &[(IterId, IterVar)],
    attached: &[Vec<usize>],
) -> Result<Vec<ForKind>, LowerError> {
    let n = s.leaves.len();
    let mut kinds = Vec::with_capacity(n);
    let pragma = s
        .auto_unroll
        .and_then(|(id, m)| s.leaves.iter().position(|&l| l == id).map(|q| (q, m)));
    // A loop without an annotation: unrolled if the pragma covers it and its nest fits.
    let by_pragma = |q: usize| match pragma {
        Some((q0, m)) if q >= q0 && m > 0 => {
            // Saturating: a product past i64 is far past any pragma's limit, not zero.
            let steps = leaf_vars[q..]
                .iter()
                .fold(1i64, |a, (_, v)| a.saturating_mul(v.extent.max(0)));
            if steps <= m as i64 {
                ForKind::Unrolled
            } else {
                ForKind::Serial
            }
        }
        _ => ForKind::Serial,
    };
    for (q, (l, v)) in leaf_vars.iter().enumerate() {
        let it = s.iter(*l);
        let innermost = q + 1 == n && attached[q].is_empty();
        let kind = match it.annotation {
            Some(Annotation::Vectorize) => {
                if !innermost {
                    return Err(LowerError::VectorNotInnermost {
                        stage: s.name().to_string(),
                        iter: it.name.clone(),
                    });
                }
                ForKind::Vectorized
            }
            Some(Annotation::VectorizeUpTo(m)) => {
                if innermost && (2..=m as i64).contains(&v.extent) {
                    ForKind::Vectorized
                } else {
                    by_pragma(q)
                }
            }
            Some(Annotation::Unroll) => ForKind::Unrolled,
            Some(Annotation::Parallel) => ForKind::Parallel,
            Some(Annotation::Bind(t)) => ForKind::ThreadBound(t),
            None => by_pragma(q),
        };
        kinds.push(kind);
    }
    Ok(kinds)
}

struct NestCtx<'a> {
    leaf_vars: &'a [(IterId, IterVar)],
    kinds: &'a [ForKind],
    attached: &'a [Vec<usize>],
    first_reduce: Option<usize>,
    /// Where the loops end and the update goes: every loop, or the first reduce loop of a
    /// cross-thread reduction (whose statement holds the reduce loops).
    stop: usize,
    init: Option<Stmt>,
    update: Option<Stmt>,
    is_reduce: &'a Vec<bool>,
}

/// The position among `s`'s loops of its reduce loop bound to `threadIdx.x` (a cross-thread
/// reduction), if it has one.
fn cross_thread_loop(s: &crate::schedule::Stage) -> Option<usize> {
    s.leaves.iter().position(|&l| {
        let it = s.iter(l);
        it.kind == IterKind::Reduce && it.annotation == Some(Annotation::Bind(ThreadAxis::ThreadX))
    })
}

/// True for a loop bound to a thread (not block, not virtual thread) axis.
fn is_thread_bound(a: Option<Annotation>) -> bool {
    matches!(
        a,
        Some(Annotation::Bind(
            ThreadAxis::ThreadX | ThreadAxis::ThreadY | ThreadAxis::ThreadZ
        ))
    )
}

/// `dims` (a tensor's extents, in its own order) in storage order `order`.
fn in_storage_order(dims: &[i64], order: Option<&[usize]>) -> Vec<i64> {
    match order {
        Some(o) => o.iter().map(|&d| dims[d]).collect(),
        None => dims.to_vec(),
    }
}

/// Gives a local temporary's rows their padding ([`crate::ir::row_padding`]).
fn pad_rows(b: &mut BufferDecl) {
    b.row_pad = crate::ir::row_padding(b.scope, &b.shape);
    if let Some(last) = b.shape.last_mut() {
        *last += b.row_pad;
    }
}

impl OpKind {
    /// True for a placeholder.
    pub fn is_placeholder(&self) -> bool {
        matches!(self, OpKind::Placeholder)
    }
}

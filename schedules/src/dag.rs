//! The validated compute DAG: the operations reachable from the outputs, in topological order.
//!
//! Invariants after [`ComputeDag::new`]:
//! - ops are numbered `0..n` in topological order (a compute only loads lower ids);
//! - every load names an op of the DAG with as many indices as its rank, and the right dtype;
//! - every variable in a body is one of the op's spatial axes, or a reduction axis used inside
//!   the reduction over it; a reduction is a body's top level and never nested;
//! - dtypes agree everywhere (no implicit promotion), and extents are at least 1;
//! - every tensor has at most [`MAX_ELEMENTS`](crate::ops::MAX_ELEMENTS) elements and every
//!   op's iteration domain (its axes and reduction axes together) a count that fits an `i64`;
//! - every load stays inside the tensor it reads, for every value of the axes (see
//!   [`crate::bounds`]): the code generators rely on it.

use crate::expr::{Combiner, DType, Expr, IterVar, TensorId, TypeError};
use crate::te::{Graph, OpKind, OpNode, Tensor};
use std::collections::HashSet;

/// Why a graph is not a valid DAG.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum DagError {
    /// No outputs were given.
    #[error("a compute DAG needs at least one output")]
    NoOutputs,
    /// A tensor id that is not in the graph (a handle from another graph?).
    #[error("`{user}` reads tensor #{id}, which is not in this graph")]
    UnknownTensor {
        /// The reading op.
        user: String,
        /// The bad id.
        id: u32,
    },
    /// A load of a later (or the same) op: a cycle.
    #[error("`{user}` reads `{used}`, which is not computed before it (a cycle)")]
    Cycle {
        /// The reading op.
        user: String,
        /// The op read.
        used: String,
    },
    /// Wrong number of indices.
    #[error("`{user}` indexes `{used}` (rank {rank}) with {given} indices")]
    RankMismatch {
        /// The reading op.
        user: String,
        /// The op read.
        used: String,
        /// Its rank.
        rank: usize,
        /// Indices given.
        given: usize,
    },
    /// An extent below 1.
    #[error("`{op}` has extent {extent} in dimension {dim}; extents must be at least 1")]
    BadExtent {
        /// The op.
        op: String,
        /// The dimension.
        dim: usize,
        /// The extent.
        extent: i64,
    },
    /// A variable used where it is not bound.
    #[error("`{op}` uses `{var}` outside the reduction or axes that bind it")]
    UnboundVar {
        /// The op.
        op: String,
        /// The variable.
        var: String,
    },
    /// A reduction inside another expression or reduction.
    #[error("`{op}`: {what}")]
    BadReduction {
        /// The op.
        op: String,
        /// What is wrong.
        what: String,
    },
    /// A tensor or iteration domain too large to address.
    #[error("`{op}`: {what}")]
    TooLarge {
        /// The op.
        op: String,
        /// What is too large.
        what: String,
    },
    /// A load that can fall outside the tensor it reads.
    #[error("`{user}` reads {detail}; clamp or guard the index")]
    IndexOutOfBounds {
        /// The reading op.
        user: String,
        /// The tensor read, at which index, its range (or why none was found) and the
        /// dimension's extent.
        detail: String,
    },
    /// A dtype error in a body.
    #[error("`{op}`: {source}")]
    Type {
        /// The op.
        op: String,
        /// The type error.
        source: TypeError,
    },
}

/// Per-op facts the sketch rules and the scheduler ask for.
#[derive(Clone, Debug, PartialEq)]
pub struct OpInfo {
    /// Ops that read this one.
    pub consumers: Vec<TensorId>,
    /// Ops this one reads, without repeats, in first-use order.
    pub producers: Vec<TensorId>,
    /// The reduction axes (empty for non-reductions).
    pub reduce_axes: Vec<IterVar>,
    /// The combiner of a reduction.
    pub combiner: Option<Combiner>,
    /// No reduction: each output element depends on input elements only through index maps
    /// (elementwise, broadcast, padding): such an op can be inlined.
    pub injective: bool,
    /// Injective, and every load uses exactly the op's axes in order (a pure elementwise map).
    pub elementwise: bool,
}

/// A validated DAG of operations.
#[derive(Clone, Debug, PartialEq)]
pub struct ComputeDag {
    ops: Vec<OpNode>,
    info: Vec<OpInfo>,
    inputs: Vec<TensorId>,
    outputs: Vec<TensorId>,
}

impl ComputeDag {
    /// Takes the ops of `graph` reachable from `outputs`, renumbers them densely in creation
    /// order, and validates them (see the module doc).
    pub fn new(graph: &Graph, outputs: &[Tensor]) -> Result<ComputeDag, DagError> {
        if outputs.is_empty() {
            return Err(DagError::NoOutputs);
        }
        let n = graph.ops.len();
        // Reachability, checking ids and order on the way.
        let mut reach = vec![false; n];
        let mut stack = Vec::new();
        for t in outputs {
            let id = t.id.0 as usize;
            if id >= n {
                return Err(DagError::UnknownTensor {
                    user: "<outputs>".into(),
                    id: t.id.0,
                });
            }
            stack.push(id);
        }
        while let Some(id) = stack.pop() {
            if std::mem::replace(&mut reach[id], true) {
                continue;
            }
            let op = &graph.ops[id];
            for used in loads_of(op) {
                let u = used.0 as usize;
                if u >= n {
                    return Err(DagError::UnknownTensor {
                        user: op.name.clone(),
                        id: used.0,
                    });
                }
                if u >= id {
                    return Err(DagError::Cycle {
                        user: op.name.clone(),
                        used: graph.ops[u].name.clone(),
                    });
                }
                stack.push(u);
            }
        }
        let mut remap = vec![u32::MAX; n];
        let mut ops = Vec::new();
        for (old, op) in graph.ops.iter().enumerate() {
            if reach[old] {
                remap[old] = ops.len() as u32;
                ops.push(op.clone());
            }
        }
        for op in &mut ops {
            if let OpKind::Compute { body, .. } = &mut op.kind {
                *body = body.rewrite(&mut |e| match e {
                    Expr::Load {
                        tensor,
                        dtype,
                        indices,
                    } => Some(Expr::Load {
                        tensor: TensorId(remap[tensor.0 as usize]),
                        dtype: *dtype,
                        indices: indices.clone(),
                    }),
                    _ => None,
                });
            }
        }
        let mut out_ids = Vec::new();
        for t in outputs {
            let id = TensorId(remap[t.id.0 as usize]);
            if !out_ids.contains(&id) {
                out_ids.push(id);
            }
        }
        let inputs = (0..ops.len())
            .filter(|&i| ops[i].kind == OpKind::Placeholder)
            .map(|i| TensorId(i as u32))
            .collect();
        for op in &ops {
            validate_op(op, &ops)?;
        }
        let info = op_infos(&ops);
        Ok(ComputeDag {
            ops,
            info,
            inputs,
            outputs: out_ids,
        })
    }

    /// Number of ops (placeholders included).
    pub fn num_ops(&self) -> usize {
        self.ops.len()
    }
    /// All ops in topological order.
    pub fn ops(&self) -> &[OpNode] {
        &self.ops
    }
    /// One op.
    pub fn op(&self, id: TensorId) -> &OpNode {
        &self.ops[id.0 as usize]
    }
    /// Facts about one op.
    pub fn info(&self, id: TensorId) -> &OpInfo {
        &self.info[id.0 as usize]
    }
    /// Placeholders in creation order: the op's input order.
    pub fn inputs(&self) -> &[TensorId] {
        &self.inputs
    }
    /// Outputs in the order given.
    pub fn outputs(&self) -> &[TensorId] {
        &self.outputs
    }

    /// Bytes one evaluation must move at the least: every input read once and every output
    /// written once (what a memory-bound op's bandwidth is counted in; intermediates that a
    /// schedule may keep in cache or registers are not counted).
    pub fn min_bytes(&self) -> f64 {
        self.min_read_bytes() + self.min_written_bytes()
    }

    /// The read part of [`ComputeDag::min_bytes`]: every input once.
    pub fn min_read_bytes(&self) -> f64 {
        self.inputs.iter().map(|&id| self.bytes_of(id)).sum()
    }

    /// The written part of [`ComputeDag::min_bytes`]: every output once.
    pub fn min_written_bytes(&self) -> f64 {
        self.outputs.iter().map(|&id| self.bytes_of(id)).sum()
    }

    fn bytes_of(&self, id: TensorId) -> f64 {
        let op = self.op(id);
        op.shape.iter().map(|&d| d as f64).product::<f64>() * op.dtype.bytes() as f64
    }

    /// Floating-point operations of one evaluation: per element of each compute, the float
    /// arithmetic nodes and intrinsic calls of its body, plus one for the combiner of a
    /// reduction (so matmul counts 2·M·N·K). Index arithmetic is not counted.
    pub fn flops(&self) -> f64 {
        let mut total = 0.0;
        for op in &self.ops {
            let OpKind::Compute { body, .. } = &op.kind else {
                continue;
            };
            let points: f64 = op.shape.iter().map(|&d| d as f64).product();
            let (source, red, extra) = match body {
                Expr::Reduce { source, axes, .. } => (
                    source.as_ref(),
                    axes.iter().map(|a| a.extent as f64).product::<f64>(),
                    1.0,
                ),
                b => (b, 1.0, 0.0),
            };
            let mut count = 0.0;
            source.visit(&mut |e| match e {
                Expr::Bin(..) | Expr::Call(..) if e.dtype().is_float() => count += 1.0,
                // Two products and their sum.
                Expr::Pair(crate::expr::PairOp::Dot, ..) => count += 3.0,
                _ => {}
            });
            total += points * red * (count + extra);
        }
        total
    }
}

fn loads_of(op: &OpNode) -> Vec<TensorId> {
    let mut v = Vec::new();
    if let OpKind::Compute { body, .. } = &op.kind {
        body.visit(&mut |e| {
            if let Expr::Load { tensor, .. } = e {
                if !v.contains(tensor) {
                    v.push(*tensor);
                }
            }
        });
    }
    v
}

fn validate_op(op: &OpNode, ops: &[OpNode]) -> Result<(), DagError> {
    for (dim, &extent) in op.shape.iter().enumerate() {
        if extent < 1 {
            return Err(DagError::BadExtent {
                op: op.name.clone(),
                dim,
                extent,
            });
        }
    }
    let too_large = |what: String| DagError::TooLarge {
        op: op.name.clone(),
        what,
    };
    let elements = op
        .shape
        .iter()
        .try_fold(1i64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= crate::ops::MAX_ELEMENTS);
    if elements.is_none() {
        return Err(too_large(format!(
            "a tensor of shape {:?} has more than {} elements",
            op.shape,
            crate::ops::MAX_ELEMENTS
        )));
    }
    let OpKind::Compute { axes, body } = &op.kind else {
        return Ok(());
    };
    let bad_red = |what: &str| DagError::BadReduction {
        op: op.name.clone(),
        what: what.to_string(),
    };
    let mut bound: HashSet<u32> = axes.iter().map(|a| a.var.id).collect();
    let source = match body {
        Expr::Reduce {
            source, axes: r, ..
        } => {
            if r.is_empty() {
                return Err(bad_red("a reduction needs at least one axis"));
            }
            for (dim, a) in r.iter().enumerate() {
                if a.extent < 1 {
                    return Err(DagError::BadExtent {
                        op: format!("{} (reduce axis {})", op.name, a.var.name),
                        dim,
                        extent: a.extent,
                    });
                }
                if !bound.insert(a.var.id) {
                    return Err(bad_red(&format!("axis `{}` is bound twice", a.var.name)));
                }
            }
            source.as_ref()
        }
        b => b,
    };
    let mut err = None;
    source.visit(&mut |e| {
        if err.is_some() {
            return;
        }
        match e {
            Expr::Reduce { .. } => {
                err = Some(bad_red(
                    "a reduction must be the whole body of a compute, not nested in an expression or another reduction",
                ))
            }
            Expr::Var(v) if !bound.contains(&v.id) => {
                err = Some(DagError::UnboundVar {
                    op: op.name.clone(),
                    var: v.name.to_string(),
                })
            }
            Expr::Load {
                tensor,
                dtype,
                indices,
            } => {
                let used = &ops[tensor.0 as usize];
                if used.shape.len() != indices.len() {
                    err = Some(DagError::RankMismatch {
                        user: op.name.clone(),
                        used: used.name.clone(),
                        rank: used.shape.len(),
                        given: indices.len(),
                    });
                } else if used.dtype != *dtype {
                    err = Some(DagError::Type {
                        op: op.name.clone(),
                        source: TypeError {
                            expr: e.to_string(),
                            message: format!("`{}` is {}, not {dtype}", used.name, used.dtype),
                        },
                    });
                }
            }
            Expr::BufLoad { .. } => {
                err = Some(bad_red("flat buffer loads belong to the loop IR"));
            }
            _ => {}
        }
    });
    if let Some(e) = err {
        return Err(e);
    }
    let mut extents: rustc_hash::FxHashMap<u32, i64> =
        axes.iter().map(|a| (a.var.id, a.extent)).collect();
    if let Expr::Reduce { axes: r, .. } = body {
        extents.extend(r.iter().map(|a| (a.var.id, a.extent)));
    }
    if extents
        .values()
        .try_fold(1i64, |acc, &d| acc.checked_mul(d))
        .is_none()
    {
        return Err(too_large(
            "its iteration domain (axes and reduction axes) has more points than an i64 counts"
                .to_string(),
        ));
    }
    let shape_of = |id: u32| ops.get(id as usize).map(|o| o.shape.clone());
    crate::bounds::check_loads(body, &extents, &shape_of).map_err(|b| {
        let used = ops.get(b.tensor as usize);
        let extent = used.and_then(|o| o.shape.get(b.dim)).copied().unwrap_or(0);
        let range = b.range.map_or("values it cannot bound".to_string(), |(lo, hi)| {
            format!("{lo}..={hi}")
        });
        let used = used.map_or_else(|| format!("#{}", b.tensor), |o| o.name.clone());
        DagError::IndexOutOfBounds {
            user: op.name.clone(),
            detail: format!(
                "`{used}` at index `{}` in dimension {}, which ranges over {range} outside 0..{extent}",
                b.index, b.dim
            ),
        }
    })?;
    let t = body.check().map_err(|source| DagError::Type {
        op: op.name.clone(),
        source,
    })?;
    if t == DType::Bool || t == DType::I64 {
        return Err(DagError::Type {
            op: op.name.clone(),
            source: TypeError {
                expr: body.to_string(),
                message: format!("a tensor cannot hold {t}; cast to f32, f64 or i32"),
            },
        });
    }
    Ok(())
}

fn op_infos(ops: &[OpNode]) -> Vec<OpInfo> {
    let mut infos: Vec<OpInfo> = ops
        .iter()
        .map(|op| {
            let (reduce_axes, combiner) = match &op.kind {
                OpKind::Compute {
                    body: Expr::Reduce { axes, combiner, .. },
                    ..
                } => (axes.clone(), Some(*combiner)),
                _ => (Vec::new(), None),
            };
            let injective = matches!(op.kind, OpKind::Compute { .. }) && combiner.is_none();
            let elementwise = injective && is_pure_elementwise(op);
            OpInfo {
                consumers: Vec::new(),
                producers: loads_of(op),
                reduce_axes,
                combiner,
                injective,
                elementwise,
            }
        })
        .collect();
    for i in 0..ops.len() {
        for p in infos[i].producers.clone() {
            infos[p.0 as usize].consumers.push(TensorId(i as u32));
        }
    }
    infos
}

fn is_pure_elementwise(op: &OpNode) -> bool {
    let OpKind::Compute { axes, body } = &op.kind else {
        return false;
    };
    let mut ok = true;
    body.visit(&mut |e| {
        if let Expr::Load { indices, .. } = e {
            ok &= indices.len() == axes.len()
                && indices
                    .iter()
                    .zip(axes)
                    .all(|(i, a)| matches!(i, Expr::Var(v) if v.id == a.var.id));
        }
    });
    ok
}

//! The direct evaluator: runs the tensor expressions of a DAG with no schedule at all.
//!
//! This is the truth every other path (the loop-IR interpreter, the JIT, the GPU) is checked
//! against, so it is kept as plain as possible: each op in topological order, every element of
//! its domain in row-major order, reductions folded in axis order from the combiner's identity.

use crate::dag::ComputeDag;
use crate::data::{Data, NdData};
use crate::expr::{Expr, TensorId};
use crate::scalar::{self, Env, EvalError, Value};
use crate::te::OpKind;

struct DagEnv<'a> {
    vars: Vec<i64>,
    tensors: &'a [Option<NdData>],
    names: &'a ComputeDag,
}

impl Env for DagEnv<'_> {
    fn var(&self, id: u32) -> Result<i64, EvalError> {
        self.vars
            .get(id as usize)
            .copied()
            .ok_or_else(|| EvalError::Unsupported(format!("unbound variable #{id}")))
    }
    fn load(&mut self, e: &Expr, indices: &[i64]) -> Result<Value, EvalError> {
        let Expr::Load { tensor, .. } = e else {
            return Err(EvalError::Unsupported(
                "flat load in a tensor expression".into(),
            ));
        };
        let name = &self.names.op(*tensor).name;
        let t = self.tensors[tensor.0 as usize]
            .as_ref()
            .ok_or_else(|| EvalError::Unsupported(format!("`{name}` read before computed")))?;
        let mut flat = 0i64;
        for (d, (&i, &n)) in indices.iter().zip(&t.shape).enumerate() {
            if i < 0 || i >= n {
                return Err(EvalError::OutOfBounds {
                    name: format!("{name} (dim {d})"),
                    index: i,
                    size: n,
                });
            }
            flat = flat * n + i;
        }
        Ok(Value::read(&t.data, flat as usize))
    }
}

/// Checks that `inputs` match the DAG's placeholders in number, shape and dtype.
pub fn check_inputs(dag: &ComputeDag, inputs: &[NdData]) -> Result<(), EvalError> {
    if inputs.len() != dag.inputs().len() {
        return Err(EvalError::BadInput(format!(
            "expected {} inputs, got {}",
            dag.inputs().len(),
            inputs.len()
        )));
    }
    for (id, x) in dag.inputs().iter().zip(inputs) {
        let op = dag.op(*id);
        if op.shape != x.shape || op.dtype != x.data.dtype() {
            return Err(EvalError::BadInput(format!(
                "`{}` wants {}{:?}, got {}{:?}",
                op.name,
                op.dtype,
                op.shape,
                x.data.dtype(),
                x.shape
            )));
        }
        if !x.is_consistent() {
            return Err(EvalError::BadInput(format!(
                "`{}`: {} values for the shape {:?}",
                op.name,
                x.data.len(),
                x.shape
            )));
        }
    }
    Ok(())
}

/// Evaluates every op; returns the outputs in the DAG's output order.
pub fn evaluate(dag: &ComputeDag, inputs: &[NdData]) -> Result<Vec<NdData>, EvalError> {
    check_inputs(dag, inputs)?;
    let all = evaluate_all(dag, inputs)?;
    dag.outputs()
        .iter()
        .map(|o| {
            all[o.0 as usize]
                .clone()
                .ok_or_else(|| EvalError::Unsupported("output not computed".into()))
        })
        .collect()
}

/// Evaluates every op; returns every tensor (inputs included), indexed by op id.
pub fn evaluate_all(dag: &ComputeDag, inputs: &[NdData]) -> Result<Vec<Option<NdData>>, EvalError> {
    check_inputs(dag, inputs)?;
    let mut tensors: Vec<Option<NdData>> = vec![None; dag.num_ops()];
    for (id, x) in dag.inputs().iter().zip(inputs) {
        tensors[id.0 as usize] = Some(x.clone());
    }
    let max_var = max_var_id(dag);
    for (i, op) in dag.ops().iter().enumerate() {
        let OpKind::Compute { axes, body } = &op.kind else {
            continue;
        };
        let n: i64 = op.shape.iter().product();
        let mut out = Data::zeros(op.dtype, n as usize)
            .map_err(|e| EvalError::Unsupported(format!("`{}`: {e}", op.name)))?;
        let mut env = DagEnv {
            vars: vec![0; max_var + 1],
            tensors: &tensors,
            names: dag,
        };
        let mut point = vec![0i64; axes.len()];
        for flat in 0..n {
            let mut rem = flat;
            for d in (0..axes.len()).rev() {
                point[d] = rem % op.shape[d];
                rem /= op.shape[d];
            }
            for (a, &p) in axes.iter().zip(&point) {
                env.vars[a.var.id as usize] = p;
            }
            let v = match body {
                Expr::Reduce {
                    combiner,
                    source,
                    axes: raxes,
                } => {
                    let mut acc = Value::from_const(combiner.identity(op.dtype));
                    let total: i64 = raxes.iter().map(|a| a.extent).product();
                    for r in 0..total {
                        let mut rem = r;
                        for a in raxes.iter().rev() {
                            env.vars[a.var.id as usize] = rem % a.extent;
                            rem /= a.extent;
                        }
                        let x = scalar::eval(source, &mut env)?;
                        acc = scalar::binary(combiner.bin_op(), acc, x, body)?;
                    }
                    acc
                }
                b => scalar::eval(b, &mut env)?,
            };
            v.write(&mut out, flat as usize);
        }
        tensors[i] = Some(NdData {
            shape: op.shape.clone(),
            data: out,
        });
    }
    Ok(tensors)
}

fn max_var_id(dag: &ComputeDag) -> usize {
    let mut m = 0u32;
    for op in dag.ops() {
        if let OpKind::Compute { axes, body } = &op.kind {
            for a in axes {
                m = m.max(a.var.id);
            }
            if let Expr::Reduce { axes, .. } = body {
                for a in axes {
                    m = m.max(a.var.id);
                }
            }
        }
    }
    m as usize
}

/// The tensor of one op after evaluation (for tests of intermediates).
pub fn tensor(all: &[Option<NdData>], id: TensorId) -> Option<&NdData> {
    all.get(id.0 as usize).and_then(|t| t.as_ref())
}

/// Evaluates single output elements on demand: each element needed (of the output, and
/// transitively of intermediates) is computed once, memoized, from the tensor expressions.
/// For checking large kernels at sampled points when evaluating every element is too slow.
/// `points` are flat row-major indices into output `output`; returns their values as f64.
pub fn evaluate_points(
    dag: &ComputeDag,
    inputs: &[NdData],
    output: usize,
    points: &[i64],
) -> Result<Vec<f64>, EvalError> {
    check_inputs(dag, inputs)?;
    let out = *dag
        .outputs()
        .get(output)
        .ok_or_else(|| EvalError::BadInput(format!("no output {output}")))?;
    let mut tensors: Vec<Option<&NdData>> = vec![None; dag.num_ops()];
    for (id, x) in dag.inputs().iter().zip(inputs) {
        tensors[id.0 as usize] = Some(x);
    }
    let mut ev = PointEval {
        dag,
        inputs: tensors,
        memo: vec![PointMemo::default(); dag.num_ops()],
        depth: 0,
    };
    let shape = &dag.op(out).shape;
    let n: i64 = shape.iter().product();
    points
        .iter()
        .map(|&p| {
            if p < 0 || p >= n {
                return Err(EvalError::OutOfBounds {
                    name: dag.op(out).name.clone(),
                    index: p,
                    size: n,
                });
            }
            let mut idx = vec![0i64; shape.len()];
            let mut rem = p;
            for d in (0..shape.len()).rev() {
                idx[d] = rem % shape[d];
                rem /= shape[d];
            }
            let v = ev.element(out, &idx)?;
            Ok(Value::cast(v, crate::DType::F64).as_f64())
        })
        .collect()
}

struct PointEval<'a> {
    dag: &'a ComputeDag,
    inputs: Vec<Option<&'a NdData>>,
    /// Computed elements of each intermediate tensor, by flat index.
    memo: Vec<PointMemo>,
    depth: usize,
}

/// Elements of one tensor computed so far, keyed by flat index. Sampled points of a large
/// workload touch hundreds of thousands of intermediate elements (conv2d's padded input), so
/// the key is one integer with Fx's cheap hash rather than an index vector through SipHash.
type PointMemo = rustc_hash::FxHashMap<i64, Value>;

/// Variables bound while computing one element: its axes and reduce axes, a handful, so a
/// linear scan beats any map.
struct PointEnv<'e, 'a> {
    vars: Vec<(u32, i64)>,
    ev: &'e mut PointEval<'a>,
}

impl Env for PointEnv<'_, '_> {
    fn var(&self, id: u32) -> Result<i64, EvalError> {
        self.vars
            .iter()
            .find(|(v, _)| *v == id)
            .map(|&(_, x)| x)
            .ok_or_else(|| EvalError::Unsupported(format!("unbound variable #{id}")))
    }
    fn load(&mut self, e: &Expr, indices: &[i64]) -> Result<Value, EvalError> {
        let Expr::Load { tensor, .. } = e else {
            return Err(EvalError::Unsupported(
                "flat load in a tensor expression".into(),
            ));
        };
        self.ev.element(*tensor, indices)
    }
}

impl PointEval<'_> {
    fn element(&mut self, t: TensorId, idx: &[i64]) -> Result<Value, EvalError> {
        let op = self.dag.op(t);
        for (d, (&i, &n)) in idx.iter().zip(&op.shape).enumerate() {
            if i < 0 || i >= n {
                return Err(EvalError::OutOfBounds {
                    name: format!("{} (dim {d})", op.name),
                    index: i,
                    size: n,
                });
            }
        }
        let flat = idx
            .iter()
            .zip(&op.shape)
            .fold(0i64, |f, (&i, &n)| f * n + i);
        if let Some(x) = self.inputs[t.0 as usize] {
            return Ok(Value::read(&x.data, flat as usize));
        }
        if let Some(v) = self.memo[t.0 as usize].get(&flat) {
            return Ok(*v);
        }
        let OpKind::Compute { axes, body } = &op.kind else {
            return Err(EvalError::BadInput(format!("no data for `{}`", op.name)));
        };
        self.depth += 1;
        if self.depth > 64 {
            return Err(EvalError::Unsupported(
                "DAG too deep for point evaluation".into(),
            ));
        }
        let vars: Vec<(u32, i64)> = axes.iter().zip(idx).map(|(a, &i)| (a.var.id, i)).collect();
        let dtype = op.dtype;
        let mut env = PointEnv { vars, ev: self };
        let v = match body {
            Expr::Reduce {
                combiner,
                source,
                axes: raxes,
            } => {
                let mut acc = Value::from_const(combiner.identity(dtype));
                let total: i64 = raxes.iter().map(|a| a.extent).product();
                // Reduce variables go after the axes, in `raxes` order.
                let first = env.vars.len();
                env.vars.extend(raxes.iter().map(|a| (a.var.id, 0)));
                for r in 0..total {
                    let mut rem = r;
                    for (k, a) in raxes.iter().enumerate().rev() {
                        env.vars[first + k].1 = rem % a.extent;
                        rem /= a.extent;
                    }
                    let x = scalar::eval(source, &mut env)?;
                    acc = scalar::binary(combiner.bin_op(), acc, x, body)?;
                }
                acc
            }
            b => scalar::eval(b, &mut env)?,
        };
        // Stored values are rounded to the tensor's dtype, as a buffer would hold them.
        let v = v.cast(dtype);
        self.depth -= 1;
        self.memo[t.0 as usize].insert(flat, v);
        Ok(v)
    }
}

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
        let mut out = Data::zeros(op.dtype, n as usize).ok_or_else(|| {
            EvalError::Unsupported(format!("dtype {} of `{}`", op.dtype, op.name))
        })?;
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

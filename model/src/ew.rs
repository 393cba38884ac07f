//! Elementwise functions ([`Ew`]): what a chain of elementwise ONNX nodes computes, as one
//! expression over the tensor that enters the chain ([`Ew::Acc`]: a convolution's or matrix
//! product's result, or the first input of a chain that stands alone) and other tensors
//! ([`Ew::Arg`], broadcast to the chain's shape as numpy does).
//!
//! Scalar constants (`Clip`'s bounds, `HardSwish`'s `1/6`, a `Div` by 6) are folded into the
//! expression, so that two layers that differ only in their tensors' contents print the
//! same and become one task. Every op is written with the DSL's arithmetic and `max`/`min`,
//! never a `select`, so the fused stage stays a plain elementwise map for the sketch rules.

use crate::graph::{Graph, Node};
use crate::ModelError;
use std::fmt;
use tensortune_schedules::expr::{self, Expr};

/// A unary function.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Un {
    /// `e^x`.
    Exp,
    /// `sqrt(x)`.
    Sqrt,
    /// `tanh(x)`.
    Tanh,
    /// `|x|`.
    Abs,
    /// `ln(x)`.
    Log,
}

/// A binary function.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bin {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
    /// `max(a, b)`.
    Max,
    /// `min(a, b)`.
    Min,
}

/// An elementwise expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Ew {
    /// The tensor entering the chain, at the output's index.
    Acc,
    /// The `i`-th extra tensor, broadcast.
    Arg(usize),
    /// A constant.
    Const(f32),
    /// A unary function.
    Un(Un, Box<Ew>),
    /// A binary function.
    Bin(Bin, Box<Ew>, Box<Ew>),
}

impl Ew {
    fn bin(op: Bin, a: Ew, b: Ew) -> Ew {
        Ew::Bin(op, Box::new(a), Box::new(b))
    }

    fn un(op: Un, a: Ew) -> Ew {
        Ew::Un(op, Box::new(a))
    }

    /// `1 / (1 + e^-x)`.
    fn sigmoid(x: Ew) -> Ew {
        let e = Ew::un(Un::Exp, Ew::bin(Bin::Sub, Ew::Const(0.0), x));
        Ew::bin(
            Bin::Div,
            Ew::Const(1.0),
            Ew::bin(Bin::Add, Ew::Const(1.0), e),
        )
    }

    /// `max(0, min(1, alpha x + beta))`.
    fn hard_sigmoid(x: Ew, alpha: f32, beta: f32) -> Ew {
        let lin = Ew::bin(
            Bin::Add,
            Ew::bin(Bin::Mul, x, Ew::Const(alpha)),
            Ew::Const(beta),
        );
        Ew::bin(
            Bin::Max,
            Ew::Const(0.0),
            Ew::bin(Bin::Min, Ew::Const(1.0), lin),
        )
    }

    /// `x` with every [`Ew::Acc`] replaced by `acc`.
    pub fn substitute_acc(&self, acc: &Ew) -> Ew {
        match self {
            Ew::Acc => acc.clone(),
            Ew::Un(op, a) => Ew::un(*op, a.substitute_acc(acc)),
            Ew::Bin(op, a, b) => Ew::bin(*op, a.substitute_acc(acc), b.substitute_acc(acc)),
            other => other.clone(),
        }
    }

    /// `x` with `Arg(i)` renumbered `Arg(i + by)`.
    pub fn shift_args(&self, by: usize) -> Ew {
        match self {
            Ew::Arg(i) => Ew::Arg(i + by),
            Ew::Un(op, a) => Ew::un(*op, a.shift_args(by)),
            Ew::Bin(op, a, b) => Ew::bin(*op, a.shift_args(by), b.shift_args(by)),
            other => other.clone(),
        }
    }

    /// The DSL expression: `acc` for [`Ew::Acc`] and `arg(i)` for each [`Ew::Arg`].
    pub fn to_expr(&self, acc: &dyn Fn() -> Expr, arg: &dyn Fn(usize) -> Expr) -> Expr {
        match self {
            Ew::Acc => acc(),
            Ew::Arg(i) => arg(*i),
            Ew::Const(c) => Expr::f32(*c),
            Ew::Un(op, a) => {
                let a = a.to_expr(acc, arg);
                match op {
                    Un::Exp => expr::exp(a),
                    Un::Sqrt => expr::sqrt(a),
                    Un::Tanh => expr::tanh(a),
                    Un::Abs => expr::abs(a),
                    Un::Log => expr::log(a),
                }
            }
            Ew::Bin(op, a, b) => {
                let (a, b) = (a.to_expr(acc, arg), b.to_expr(acc, arg));
                match op {
                    Bin::Add => a + b,
                    Bin::Sub => a - b,
                    Bin::Mul => a * b,
                    Bin::Div => a / b,
                    Bin::Max => expr::max(a, b),
                    Bin::Min => expr::min(a, b),
                }
            }
        }
    }
}

impl fmt::Display for Ew {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ew::Acc => f.write_str("acc"),
            Ew::Arg(i) => write!(f, "x{i}"),
            // `{:?}` prints the shortest text that reads back as the same f32.
            Ew::Const(c) => write!(f, "{c:?}"),
            Ew::Un(op, a) => write!(f, "{}({a})", format!("{op:?}").to_lowercase()),
            Ew::Bin(op, a, b) => write!(f, "{}({a};{b})", format!("{op:?}").to_lowercase()),
        }
    }
}

/// The op types [`from_node`] turns into an expression.
pub const ELEMENTWISE_OPS: &[&str] = &[
    "Relu",
    "Clip",
    "Sigmoid",
    "HardSigmoid",
    "HardSwish",
    "LeakyRelu",
    "PRelu",
    "Tanh",
    "Exp",
    "Log",
    "Sqrt",
    "Abs",
    "Neg",
    "Reciprocal",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Max",
    "Min",
    "BatchNormalization",
];

/// Whether `op` is an elementwise op [`from_node`] handles.
pub fn is_elementwise(op: &str) -> bool {
    ELEMENTWISE_OPS.contains(&op)
}

/// What the caller makes of the node's `i`-th input: the chain's [`Ew::Acc`], a folded
/// scalar, or a new [`Ew::Arg`].
pub type InputFn<'a> = dyn FnMut(usize) -> Result<Ew, ModelError> + 'a;

/// The expression of one elementwise node, its inputs given by `input`.
pub fn from_node(node: &Node, graph: &Graph, input: &mut InputFn<'_>) -> Result<Ew, ModelError> {
    let zero = Ew::Const(0.0);
    Ok(match node.op.as_str() {
        "Relu" => Ew::bin(Bin::Max, input(0)?, zero),
        "Clip" => clip(node, graph, input)?,
        "Sigmoid" => Ew::sigmoid(input(0)?),
        "HardSigmoid" => Ew::hard_sigmoid(
            input(0)?,
            node.float("alpha", 0.2)?,
            node.float("beta", 0.5)?,
        ),
        "HardSwish" => {
            let a = input(0)?;
            Ew::bin(Bin::Mul, a.clone(), Ew::hard_sigmoid(a, 1.0 / 6.0, 0.5))
        }
        "LeakyRelu" | "PRelu" => {
            let a = input(0)?;
            let slope = match node.op.as_str() {
                "PRelu" => input(1)?,
                _ => Ew::Const(node.float("alpha", 0.01)?),
            };
            let neg = Ew::bin(Bin::Mul, slope, Ew::bin(Bin::Min, a.clone(), zero.clone()));
            Ew::bin(Bin::Add, Ew::bin(Bin::Max, a, zero), neg)
        }
        "Tanh" => Ew::un(Un::Tanh, input(0)?),
        "Exp" => Ew::un(Un::Exp, input(0)?),
        "Log" => Ew::un(Un::Log, input(0)?),
        "Sqrt" => Ew::un(Un::Sqrt, input(0)?),
        "Abs" => Ew::un(Un::Abs, input(0)?),
        "Neg" => Ew::bin(Bin::Sub, zero, input(0)?),
        "Reciprocal" => Ew::bin(Bin::Div, Ew::Const(1.0), input(0)?),
        "Add" | "Sub" | "Mul" | "Div" | "Max" | "Min" => binary(node, input)?,
        "BatchNormalization" => batchnorm(node, input)?,
        _ => return Err(ModelError::unsupported(node, "not an elementwise op")),
    })
}

fn binary(node: &Node, input: &mut InputFn<'_>) -> Result<Ew, ModelError> {
    let op = match node.op.as_str() {
        "Add" => Bin::Add,
        "Sub" => Bin::Sub,
        "Mul" => Bin::Mul,
        "Div" => Bin::Div,
        "Max" => Bin::Max,
        _ => Bin::Min,
    };
    let n = node.inputs.len();
    // `Max` and `Min` take any number of inputs; the arithmetic ops exactly two.
    if n == 0 || (n != 2 && !matches!(op, Bin::Max | Bin::Min)) {
        return Err(ModelError::invalid(node, format!("{n} inputs")));
    }
    let mut e = input(0)?;
    for i in 1..n {
        e = Ew::bin(op, e, input(i)?);
    }
    Ok(e)
}

/// `min(max(x, lo), hi)`: bounds from attributes before opset 11, from inputs after; an
/// absent bound does not clamp.
fn clip(node: &Node, graph: &Graph, input: &mut InputFn<'_>) -> Result<Ew, ModelError> {
    let mut e = input(0)?;
    let (lo, hi) = if graph.opset < 11 {
        let lo = node
            .attrs
            .contains_key("min")
            .then(|| node.float("min", 0.0));
        let hi = node
            .attrs
            .contains_key("max")
            .then(|| node.float("max", 0.0));
        (
            lo.transpose()?.map(Ew::Const),
            hi.transpose()?.map(Ew::Const),
        )
    } else {
        let mut bound = |i: usize| node.opt_input(i).map(|_| input(i)).transpose();
        (bound(1)?, bound(2)?)
    };
    if let Some(lo) = lo {
        e = Ew::bin(Bin::Max, e, lo);
    }
    if let Some(hi) = hi {
        e = Ew::bin(Bin::Min, e, hi);
    }
    Ok(e)
}

/// Inference-mode batch normalization, `(x - mean) / sqrt(var + eps) * scale + bias`, with
/// its per-channel tensors broadcast over axis 1 (their shape `[C]` is read as `[C, 1, 1]`
/// by the caller, see [`channel_shape`]).
fn batchnorm(node: &Node, input: &mut InputFn<'_>) -> Result<Ew, ModelError> {
    if node.int("training_mode", 0)? != 0 || node.outputs.len() > 1 {
        return Err(ModelError::unsupported(node, "training mode"));
    }
    let eps = node.float("epsilon", 1e-5)?;
    let x = input(0)?;
    let scale = input(1)?;
    let bias = input(2)?;
    let mean = input(3)?;
    let var = input(4)?;
    let inv = Ew::bin(
        Bin::Div,
        scale,
        Ew::un(Un::Sqrt, Ew::bin(Bin::Add, var, Ew::Const(eps))),
    );
    Ok(Ew::bin(
        Bin::Add,
        Ew::bin(Bin::Mul, Ew::bin(Bin::Sub, x, mean), inv),
        bias,
    ))
}

/// The shape a per-channel tensor of `BatchNormalization` broadcasts as against an input of
/// rank `rank`: `[C]` becomes `[C, 1, ..., 1]` (channels on axis 1).
pub fn channel_shape(shape: &[usize], rank: usize) -> Vec<usize> {
    let mut s = shape.to_vec();
    s.resize(rank.saturating_sub(1).max(s.len()), 1);
    s
}

/// The shape numpy broadcasting gives `a` and `b`, or `None` where they do not broadcast.
pub fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let dim = |s: &[usize], i: usize| {
        let off = n - s.len();
        if i < off {
            1
        } else {
            s[i - off]
        }
    };
    (0..n)
        .map(|i| match (dim(a, i), dim(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// The index into a tensor of shape `shape` that broadcasting reads for output index `out`
/// (aligned on the right; a dimension of 1 is read at 0). A rank-0 tensor is read as `[1]`.
pub fn broadcast_index(shape: &[usize], out: &[Expr]) -> Vec<Expr> {
    if shape.is_empty() {
        return vec![Expr::int(0)];
    }
    let off = out.len().saturating_sub(shape.len());
    shape
        .iter()
        .enumerate()
        .map(|(d, &n)| match out.get(off + d) {
            Some(e) if n != 1 => e.clone(),
            _ => Expr::int(0),
        })
        .collect()
}

/// The shape a kernel's parameter has for a tensor of `shape`: rank 0 is passed as `[1]`.
pub fn param_shape(shape: &[usize]) -> Vec<i64> {
    if shape.is_empty() {
        vec![1]
    } else {
        shape.iter().map(|&d| d as i64).collect()
    }
}

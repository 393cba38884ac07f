//! Scalar evaluation shared by the two references (the direct evaluator and the loop-IR
//! interpreter): typed values and the arithmetic of [`crate::expr`]'s semantics.
//!
//! f32 arithmetic is done in f32 (so results round as compiled code rounds, up to FMA
//! contraction), i32 arithmetic wraps, index arithmetic is i64 floor division and modulo.

use crate::data::{bf16_to_f32, f32_to_bf16, Data};
use crate::expr::{BinOp, CmpOp, Const, DType, Expr, Intrinsic, PairOp};

/// A typed scalar.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    /// Boolean.
    B(bool),
    /// 32-bit integer.
    I32(i32),
    /// Index.
    I64(i64),
    /// Single precision.
    F32(f32),
    /// Double precision.
    F64(f64),
    /// bfloat16, as its bits.
    BF16(u16),
}

/// A failure while evaluating.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum EvalError {
    /// Integer division or modulo by zero.
    #[error("integer division by zero in `{0}`")]
    DivByZero(String),
    /// An index outside a buffer or tensor.
    #[error("index {index} out of bounds of `{name}` (size {size})")]
    OutOfBounds {
        /// The buffer or tensor.
        name: String,
        /// The flat index.
        index: i64,
        /// Its size.
        size: i64,
    },
    /// A read of an element never written.
    #[error("read of uninitialized element {index} of `{name}`")]
    Uninitialized {
        /// The buffer.
        name: String,
        /// The flat index.
        index: i64,
    },
    /// Something the evaluator cannot run (a malformed program).
    #[error("cannot evaluate: {0}")]
    Unsupported(String),
    /// Inputs that do not fit the program.
    #[error("bad input: {0}")]
    BadInput(String),
}

impl Value {
    /// From a constant.
    pub fn from_const(c: Const) -> Value {
        match c {
            Const::Bool(b) => Value::B(b),
            Const::I32(v) => Value::I32(v),
            Const::I64(v) => Value::I64(v),
            Const::F32(v) => Value::F32(v),
            Const::F64(v) => Value::F64(v),
        }
    }
    /// The index value, if integer.
    pub fn as_i64(self) -> Option<i64> {
        match self {
            Value::I64(v) => Some(v),
            Value::I32(v) => Some(v as i64),
            _ => None,
        }
    }
    /// Truthiness of a bool.
    pub fn as_bool(self) -> Option<bool> {
        match self {
            Value::B(b) => Some(b),
            _ => None,
        }
    }
    /// Element `i` of `data`.
    pub fn read(data: &Data, i: usize) -> Value {
        match data {
            Data::F32(v) => Value::F32(v[i]),
            Data::F64(v) => Value::F64(v[i]),
            Data::I32(v) => Value::I32(v[i]),
            Data::BF16(v) => Value::BF16(v[i]),
        }
    }
    /// Writes into element `i` of `data`, converting to its dtype.
    pub fn write(self, data: &mut Data, i: usize) {
        match data {
            Data::F32(v) => v[i] = self.to_f64() as f32,
            Data::F64(v) => v[i] = self.to_f64(),
            Data::I32(v) => v[i] = self.as_i64().unwrap_or(0) as i32,
            Data::BF16(v) => {
                v[i] = match self {
                    Value::BF16(b) => b,
                    x => f32_to_bf16(x.to_f64() as f32),
                }
            }
        }
    }
    /// The value as f64.
    pub fn as_f64(self) -> f64 {
        self.to_f64()
    }
    fn to_f64(self) -> f64 {
        match self {
            Value::B(b) => b as i64 as f64,
            Value::I32(v) => v as f64,
            Value::I64(v) => v as f64,
            Value::F32(v) => v as f64,
            Value::F64(v) => v,
            Value::BF16(b) => bf16_to_f32(b) as f64,
        }
    }

    /// Converts to `dtype` (float to int truncates toward zero, saturating).
    pub fn cast(self, dtype: DType) -> Value {
        match dtype {
            DType::Bool => Value::B(self.to_f64() != 0.0),
            DType::I32 => match self {
                Value::I64(v) => Value::I32(v as i32),
                Value::I32(v) => Value::I32(v),
                v => Value::I32(v.to_f64() as i32),
            },
            DType::I64 => match self {
                Value::I64(v) => Value::I64(v),
                Value::I32(v) => Value::I64(v as i64),
                v => Value::I64(v.to_f64() as i64),
            },
            DType::F32 => match self {
                Value::F64(v) => Value::F32(v as f32),
                v => Value::F32(v.to_f64() as f32),
            },
            DType::F64 => Value::F64(self.to_f64()),
            DType::BF16 => Value::BF16(match self {
                Value::BF16(b) => b,
                Value::F64(v) => f32_to_bf16(v as f32),
                v => f32_to_bf16(v.to_f64() as f32),
            }),
        }
    }
}

fn floor_div(a: i64, b: i64) -> i64 {
    let q = a / b;
    if (a % b != 0) && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    }
}

fn floor_mod(a: i64, b: i64) -> i64 {
    a - floor_div(a, b) * b
}

/// `op(a, b)` on values of one type.
pub fn binary(op: BinOp, a: Value, b: Value, e: &Expr) -> Result<Value, EvalError> {
    use Value::*;
    let mismatch = || EvalError::Unsupported(format!("operand types differ in `{e}`"));
    Ok(match (a, b) {
        (F32(x), F32(y)) => F32(match op {
            BinOp::Add => x + y,
            BinOp::Sub => x - y,
            BinOp::Mul => x * y,
            BinOp::Div => x / y,
            BinOp::Min => x.min(y),
            BinOp::Max => x.max(y),
            BinOp::Mod => return Err(mismatch()),
        }),
        (F64(x), F64(y)) => F64(match op {
            BinOp::Add => x + y,
            BinOp::Sub => x - y,
            BinOp::Mul => x * y,
            BinOp::Div => x / y,
            BinOp::Min => x.min(y),
            BinOp::Max => x.max(y),
            BinOp::Mod => return Err(mismatch()),
        }),
        (I32(x), I32(y)) => {
            if matches!(op, BinOp::Div | BinOp::Mod) && y == 0 {
                return Err(EvalError::DivByZero(e.to_string()));
            }
            I32(match op {
                BinOp::Add => x.wrapping_add(y),
                BinOp::Sub => x.wrapping_sub(y),
                BinOp::Mul => x.wrapping_mul(y),
                BinOp::Div => floor_div(x as i64, y as i64) as i32,
                BinOp::Mod => floor_mod(x as i64, y as i64) as i32,
                BinOp::Min => x.min(y),
                BinOp::Max => x.max(y),
            })
        }
        (I64(x), I64(y)) => {
            if matches!(op, BinOp::Div | BinOp::Mod) && y == 0 {
                return Err(EvalError::DivByZero(e.to_string()));
            }
            I64(match op {
                BinOp::Add => x.wrapping_add(y),
                BinOp::Sub => x.wrapping_sub(y),
                BinOp::Mul => x.wrapping_mul(y),
                BinOp::Div => floor_div(x, y),
                BinOp::Mod => floor_mod(x, y),
                BinOp::Min => x.min(y),
                BinOp::Max => x.max(y),
            })
        }
        _ => return Err(mismatch()),
    })
}

/// `op(a, b)` for a comparison.
pub fn compare(op: CmpOp, a: Value, b: Value, e: &Expr) -> Result<Value, EvalError> {
    let ord = match (a, b) {
        (Value::F32(x), Value::F32(y)) => x.partial_cmp(&y),
        (Value::F64(x), Value::F64(y)) => x.partial_cmp(&y),
        (Value::I32(x), Value::I32(y)) => Some(x.cmp(&y)),
        (Value::I64(x), Value::I64(y)) => Some(x.cmp(&y)),
        (Value::B(x), Value::B(y)) => Some(x.cmp(&y)),
        _ => {
            return Err(EvalError::Unsupported(format!(
                "operand types differ in `{e}`"
            )))
        }
    };
    use std::cmp::Ordering::*;
    Ok(Value::B(match (op, ord) {
        (_, None) => op == CmpOp::Ne, // NaN: only != holds
        (CmpOp::Eq, Some(o)) => o == Equal,
        (CmpOp::Ne, Some(o)) => o != Equal,
        (CmpOp::Lt, Some(o)) => o == Less,
        (CmpOp::Le, Some(o)) => o != Greater,
        (CmpOp::Gt, Some(o)) => o == Greater,
        (CmpOp::Ge, Some(o)) => o != Less,
    }))
}

/// A math intrinsic.
pub fn intrinsic(f: Intrinsic, a: Value, e: &Expr) -> Result<Value, EvalError> {
    Ok(match a {
        Value::F32(x) => Value::F32(match f {
            Intrinsic::Exp => x.exp(),
            Intrinsic::Log => x.ln(),
            Intrinsic::Sqrt => x.sqrt(),
            Intrinsic::Tanh => x.tanh(),
            Intrinsic::Abs => x.abs(),
        }),
        Value::F64(x) => Value::F64(match f {
            Intrinsic::Exp => x.exp(),
            Intrinsic::Log => x.ln(),
            Intrinsic::Sqrt => x.sqrt(),
            Intrinsic::Tanh => x.tanh(),
            Intrinsic::Abs => x.abs(),
        }),
        Value::I32(x) if f == Intrinsic::Abs => Value::I32(x.wrapping_abs()),
        Value::I64(x) if f == Intrinsic::Abs => Value::I64(x.wrapping_abs()),
        _ => return Err(EvalError::Unsupported(format!("`{e}` on a non-float"))),
    })
}

/// A bf16 pair operation ([`PairOp`]).
pub fn pair(op: PairOp, a: Value, b: Value, e: &Expr) -> Result<Value, EvalError> {
    let half = |w: i32, hi: bool| {
        bf16_to_f32(if hi {
            (w as u32 >> 16) as u16
        } else {
            w as u16
        })
    };
    Ok(match (op, a, b) {
        (PairOp::Pack, Value::BF16(lo), Value::BF16(hi)) => {
            Value::I32(((hi as u32) << 16 | lo as u32) as i32)
        }
        (PairOp::Dot, Value::I32(x), Value::I32(y)) => {
            // Each product of two bf16 is exact in f32 (8 by 8 significant bits).
            Value::F32(half(x, false) * half(y, false) + half(x, true) * half(y, true))
        }
        _ => {
            return Err(EvalError::Unsupported(format!(
                "operand types of `{e}` are not {}",
                op.operand()
            )))
        }
    })
}

/// Where an evaluation reads variables and memory from.
pub trait Env {
    /// The value of variable `id`.
    fn var(&self, id: u32) -> Result<i64, EvalError>;
    /// A tensor or buffer element, for a `Load` or `BufLoad` node.
    fn load(&mut self, e: &Expr, indices: &[i64]) -> Result<Value, EvalError>;
}

/// Evaluates a scalar expression (no `Reduce`).
pub fn eval(e: &Expr, env: &mut impl Env) -> Result<Value, EvalError> {
    Ok(match e {
        Expr::Const(c) => Value::from_const(*c),
        Expr::Var(v) => Value::I64(env.var(v.id)?),
        Expr::Bin(op, a, b) => {
            let (x, y) = (eval(a, env)?, eval(b, env)?);
            binary(*op, x, y, e)?
        }
        Expr::Cmp(op, a, b) => {
            let (x, y) = (eval(a, env)?, eval(b, env)?);
            compare(*op, x, y, e)?
        }
        Expr::And(a, b) => Value::B(truth(eval(a, env)?, e)? && truth(eval(b, env)?, e)?),
        Expr::Or(a, b) => Value::B(truth(eval(a, env)?, e)? || truth(eval(b, env)?, e)?),
        Expr::Not(a) => Value::B(!truth(eval(a, env)?, e)?),
        Expr::Select(c, t, f) => {
            if truth(eval(c, env)?, e)? {
                eval(t, env)?
            } else {
                eval(f, env)?
            }
        }
        Expr::Cast(d, a) => eval(a, env)?.cast(*d),
        Expr::Call(f, a) => {
            let x = eval(a, env)?;
            intrinsic(*f, x, e)?
        }
        Expr::Pair(op, a, b) => {
            let (x, y) = (eval(a, env)?, eval(b, env)?);
            pair(*op, x, y, e)?
        }
        Expr::Load { indices, .. } => {
            let mut idx = Vec::with_capacity(indices.len());
            for i in indices {
                idx.push(index(eval(i, env)?, e)?);
            }
            env.load(e, &idx)?
        }
        Expr::BufLoad { index: i, .. } => {
            let x = index(eval(i, env)?, e)?;
            env.load(e, &[x])?
        }
        Expr::Reduce { .. } => {
            return Err(EvalError::Unsupported(format!(
                "a nested reduction in `{e}`"
            )))
        }
    })
}

fn truth(v: Value, e: &Expr) -> Result<bool, EvalError> {
    v.as_bool()
        .ok_or_else(|| EvalError::Unsupported(format!("non-bool condition in `{e}`")))
}

fn index(v: Value, e: &Expr) -> Result<i64, EvalError> {
    v.as_i64()
        .ok_or_else(|| EvalError::Unsupported(format!("non-integer index in `{e}`")))
}

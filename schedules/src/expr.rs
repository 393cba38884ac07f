//! Scalar expressions, shared by the tensor-expression layer and the loop IR.
//!
//! Semantics:
//! - Every expression has one [`DType`], computed locally from its node (loads carry their
//!   element type). Operands of a binary operator must have the same dtype: there is no
//!   implicit promotion, and [`Expr::check`] reports a mismatch as [`TypeError`].
//! - Loop and axis variables ([`Var`]) have the index type [`DType::I64`].
//! - Integer `Div` and `Mod` are *floor* division and floor modulo (the divisor is positive in
//!   every index expression lowering produces); float `Div` is IEEE division; `Mod` on floats
//!   is a type error.
//! - `Select` evaluates only the chosen branch: the other branch may hold a load that would be
//!   out of bounds (zero padding is written this way), so a backend must not evaluate both
//!   branches' loads unguarded.
//! - `Load` (a multi-dimensional tensor access) and `Reduce` only appear in tensor
//!   expressions; `BufLoad` (a flat buffer access) only in lowered loop IR.

use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::fmt;
use std::sync::{Mutex, OnceLock};

/// Element and scalar types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    /// Result of comparisons and logical operators.
    Bool,
    /// 32-bit signed integer data.
    I32,
    /// 64-bit signed integer: the index type of loop and axis variables.
    I64,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
    /// bfloat16: the upper half of an f32 (8 exponent bits, 7 fraction bits). A storage
    /// type: values are converted to f32 ([`Expr::Cast`]) or paired for a dot product
    /// ([`PairOp`]); arithmetic on them is a type error.
    BF16,
}

impl DType {
    /// True for `F32` and `F64`.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64)
    }
    /// True for `I32` and `I64`.
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }
    /// Size of one element in bytes (`Bool` counts as 1).
    pub fn bytes(self) -> usize {
        match self {
            DType::Bool => 1,
            DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }
    /// Parses `f32`, `f64`, `i32`, `i64`, `bool`, `bf16`.
    pub fn parse(s: &str) -> Option<DType> {
        Some(match s {
            "f32" | "float32" => DType::F32,
            "f64" | "float64" => DType::F64,
            "i32" | "int32" => DType::I32,
            "i64" | "int64" => DType::I64,
            "bool" => DType::Bool,
            "bf16" | "bfloat16" => DType::BF16,
            _ => return None,
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::Bool => "bool",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::BF16 => "bf16",
        })
    }
}

/// A typed constant.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Const {
    /// Boolean.
    Bool(bool),
    /// 32-bit integer.
    I32(i32),
    /// Index-typed integer.
    I64(i64),
    /// Single precision.
    F32(f32),
    /// Double precision.
    F64(f64),
}

impl Const {
    /// The constant's dtype.
    pub fn dtype(self) -> DType {
        match self {
            Const::Bool(_) => DType::Bool,
            Const::I32(_) => DType::I32,
            Const::I64(_) => DType::I64,
            Const::F32(_) => DType::F32,
            Const::F64(_) => DType::F64,
        }
    }
    /// The value as f64 (integers and bools converted).
    pub fn as_f64(self) -> f64 {
        match self {
            Const::Bool(b) => b as i64 as f64,
            Const::I32(v) => v as f64,
            Const::I64(v) => v as f64,
            Const::F32(v) => v as f64,
            Const::F64(v) => v,
        }
    }
    /// The zero of a dtype.
    pub fn zero(dtype: DType) -> Const {
        match dtype {
            DType::Bool => Const::Bool(false),
            DType::I32 => Const::I32(0),
            DType::I64 => Const::I64(0),
            DType::F32 => Const::F32(0.0),
            DType::F64 => Const::F64(0.0),
            // bf16 has no constants (it is a storage type); its zero has the same bits as
            // an i32 zero's low half, and nothing folds into a bf16 accumulator.
            DType::BF16 => Const::I32(0),
        }
    }
}

/// A loop or axis variable of index type. Identity is the `id`; the name is for people.
///
/// The name is interned (see [`intern`]), so a `Var` is `Copy`: expressions are cloned and
/// dropped by the million in a search, and a reference-counted name made each of those an
/// atomic update.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Var {
    /// Unique within one graph (tensor expressions) or one lowered function (loop IR).
    pub id: u32,
    /// Display name; not necessarily unique.
    pub name: &'static str,
}

/// What a serialized [`Var`] holds (the same fields; the name is interned when read).
#[derive(Deserialize)]
struct VarRepr {
    id: u32,
    name: String,
}

impl<'de> Deserialize<'de> for Var {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Var, D::Error> {
        let r = VarRepr::deserialize(d)?;
        Ok(Var {
            id: r.id,
            name: intern(&r.name),
        })
    }
}

/// The one process-wide copy of `name`. Every distinct name is kept for the life of the
/// process (names are few: a workload's axis names with split suffixes).
pub fn intern(name: &str) -> &'static str {
    static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let names = NAMES.get_or_init(|| Mutex::new(HashSet::new()));
    // A poisoned lock only means another thread panicked while inserting; the set is still
    // a valid set of leaked names.
    let mut set = names.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&s) = set.get(name) {
        return s;
    }
    let s: &'static str = Box::leak(name.to_owned().into_boxed_str());
    set.insert(s);
    s
}

impl PartialEq for Var {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}
impl Eq for Var {}
impl std::hash::Hash for Var {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id.hash(state)
    }
}

impl Var {
    /// A variable with the given id and name.
    pub fn new(id: u32, name: &str) -> Var {
        Var {
            id,
            name: intern(name),
        }
    }
}

/// A reduction axis: a variable with its extent `[0, extent)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IterVar {
    /// The axis variable.
    pub var: Var,
    /// Number of iterations, at least 1.
    pub extent: i64,
}

impl IterVar {
    /// The variable as an expression.
    pub fn expr(&self) -> Expr {
        Expr::Var(self.var)
    }
}

/// Binary arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BinOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// Float division, or integer floor division.
    Div,
    /// Integer floor modulo.
    Mod,
    /// `min(a, b)`
    Min,
    /// `max(a, b)`
    Max,
}

/// Comparisons; the result is `Bool`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CmpOp {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

/// Unary math intrinsics (floating point only, except `Abs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Intrinsic {
    /// e^x
    Exp,
    /// natural logarithm
    Log,
    /// square root
    Sqrt,
    /// hyperbolic tangent
    Tanh,
    /// absolute value (floats and integers)
    Abs,
}

impl Intrinsic {
    /// Lower-case name, as printed.
    pub fn name(self) -> &'static str {
        match self {
            Intrinsic::Exp => "exp",
            Intrinsic::Log => "log",
            Intrinsic::Sqrt => "sqrt",
            Intrinsic::Tanh => "tanh",
            Intrinsic::Abs => "abs",
        }
    }
}

/// Operations on pairs of bf16 values packed into one 32-bit word (the low half first), the
/// operand shape of the bf16 dot-product instructions (AVX-512 BF16's `vdpbf16ps`): a
/// reduction over pairs of steps of `k` runs one instruction per pair and vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PairOp {
    /// `pack_bf16(lo, hi)`: two `BF16` values into one `I32` word, `lo` in bits 0-15.
    Pack,
    /// `dot_bf16(a, b)`: of two packed `I32` words, `lo(a)·lo(b) + hi(a)·hi(b)` in f32 (the
    /// products are exact in f32; the sum rounds once).
    Dot,
}

impl PairOp {
    /// Lower-case name, as printed.
    pub fn name(self) -> &'static str {
        match self {
            PairOp::Pack => "pack_bf16",
            PairOp::Dot => "dot_bf16",
        }
    }
    /// The dtype of the operands.
    pub fn operand(self) -> DType {
        match self {
            PairOp::Pack => DType::BF16,
            PairOp::Dot => DType::I32,
        }
    }
    /// The dtype of the result.
    pub fn result(self) -> DType {
        match self {
            PairOp::Pack => DType::I32,
            PairOp::Dot => DType::F32,
        }
    }
}

/// Combiner of a reduction; its identity is the initial value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Combiner {
    /// Sum, identity 0.
    Sum,
    /// Maximum, identity -inf (or the type's minimum for integers).
    Max,
    /// Minimum, identity +inf (or the type's maximum for integers).
    Min,
}

impl Combiner {
    /// The identity element for `dtype`.
    pub fn identity(self, dtype: DType) -> Const {
        match (self, dtype) {
            (Combiner::Sum, d) => Const::zero(d),
            (Combiner::Max, DType::F32) => Const::F32(f32::NEG_INFINITY),
            (Combiner::Max, DType::F64) => Const::F64(f64::NEG_INFINITY),
            (Combiner::Max, DType::I32) => Const::I32(i32::MIN),
            (Combiner::Max, _) => Const::I64(i64::MIN),
            (Combiner::Min, DType::F32) => Const::F32(f32::INFINITY),
            (Combiner::Min, DType::F64) => Const::F64(f64::INFINITY),
            (Combiner::Min, DType::I32) => Const::I32(i32::MAX),
            (Combiner::Min, _) => Const::I64(i64::MAX),
        }
    }
    /// The binary operator that folds one value into the accumulator.
    pub fn bin_op(self) -> BinOp {
        match self {
            Combiner::Sum => BinOp::Add,
            Combiner::Max => BinOp::Max,
            Combiner::Min => BinOp::Min,
        }
    }
    /// Lower-case name, as printed.
    pub fn name(self) -> &'static str {
        match self {
            Combiner::Sum => "sum",
            Combiner::Max => "max",
            Combiner::Min => "min",
        }
    }
}

/// Id of a tensor (one per stage) in a [`crate::te::Graph`] or [`crate::ComputeDag`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TensorId(pub u32);

/// Id of a buffer in a [`crate::ir::LoweredFunc`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BufId(pub u32);

/// A scalar expression.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Expr {
    /// A constant.
    Const(Const),
    /// An index variable.
    Var(Var),
    /// Binary arithmetic on operands of one dtype.
    Bin(BinOp, Box<Expr>, Box<Expr>),
    /// Comparison of operands of one dtype.
    Cmp(CmpOp, Box<Expr>, Box<Expr>),
    /// Logical and of two `Bool`s.
    And(Box<Expr>, Box<Expr>),
    /// Logical or of two `Bool`s.
    Or(Box<Expr>, Box<Expr>),
    /// Logical negation.
    Not(Box<Expr>),
    /// `cond ? then : else`; both branches of one dtype.
    Select(Box<Expr>, Box<Expr>, Box<Expr>),
    /// Conversion to a dtype (float to int truncates toward zero).
    Cast(DType, Box<Expr>),
    /// Unary math intrinsic.
    Call(Intrinsic, Box<Expr>),
    /// An operation on bf16 pairs ([`PairOp`]).
    Pair(PairOp, Box<Expr>, Box<Expr>),
    /// Tensor element access (tensor expressions only).
    Load {
        /// The tensor read.
        tensor: TensorId,
        /// Its element type.
        dtype: DType,
        /// One index per dimension.
        indices: Vec<Expr>,
    },
    /// Flat buffer access (loop IR only).
    BufLoad {
        /// The buffer read.
        buf: BufId,
        /// Its element type.
        dtype: DType,
        /// Element offset.
        index: Box<Expr>,
    },
    /// Reduction over axes (tensor expressions only; must be a stage's whole body).
    Reduce {
        /// How values are combined.
        combiner: Combiner,
        /// The value reduced, a function of the axes.
        source: Box<Expr>,
        /// The reduction axes.
        axes: Vec<IterVar>,
    },
}

/// A dtype mismatch or misuse found by [`Expr::check`].
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("type error in `{expr}`: {message}")]
pub struct TypeError {
    /// The offending sub-expression, printed.
    pub expr: String,
    /// What is wrong.
    pub message: String,
}

impl Expr {
    /// An index (i64) constant.
    pub fn int(v: i64) -> Expr {
        Expr::Const(Const::I64(v))
    }
    /// An f32 constant.
    pub fn f32(v: f32) -> Expr {
        Expr::Const(Const::F32(v))
    }
    /// An f64 constant.
    pub fn f64(v: f64) -> Expr {
        Expr::Const(Const::F64(v))
    }
    /// An i32 constant.
    pub fn i32(v: i32) -> Expr {
        Expr::Const(Const::I32(v))
    }
    /// A variable reference.
    pub fn var(v: &Var) -> Expr {
        Expr::Var(*v)
    }
    /// The constant integer value, if this is an integer constant.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Expr::Const(Const::I64(v)) => Some(*v),
            Expr::Const(Const::I32(v)) => Some(*v as i64),
            _ => None,
        }
    }
    /// Builds `op(a, b)`.
    pub fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
        Expr::Bin(op, Box::new(a), Box::new(b))
    }
    /// Builds `op(a, b)` for a comparison.
    pub fn cmp(op: CmpOp, a: Expr, b: Expr) -> Expr {
        Expr::Cmp(op, Box::new(a), Box::new(b))
    }
    /// `self < other`
    pub fn lt(self, other: impl Into<Expr>) -> Expr {
        Expr::cmp(CmpOp::Lt, self, other.into())
    }
    /// `self <= other`
    pub fn le(self, other: impl Into<Expr>) -> Expr {
        Expr::cmp(CmpOp::Le, self, other.into())
    }
    /// `self > other`
    pub fn gt(self, other: impl Into<Expr>) -> Expr {
        Expr::cmp(CmpOp::Gt, self, other.into())
    }
    /// `self >= other`
    pub fn ge(self, other: impl Into<Expr>) -> Expr {
        Expr::cmp(CmpOp::Ge, self, other.into())
    }
    /// `self == other`
    pub fn eq_(self, other: impl Into<Expr>) -> Expr {
        Expr::cmp(CmpOp::Eq, self, other.into())
    }
    /// `self != other`
    pub fn ne_(self, other: impl Into<Expr>) -> Expr {
        Expr::cmp(CmpOp::Ne, self, other.into())
    }
    /// Logical and.
    pub fn and(self, other: Expr) -> Expr {
        Expr::And(Box::new(self), Box::new(other))
    }
    /// Logical or.
    pub fn or(self, other: Expr) -> Expr {
        Expr::Or(Box::new(self), Box::new(other))
    }
    /// Conversion to `dtype`.
    pub fn cast(self, dtype: DType) -> Expr {
        Expr::Cast(dtype, Box::new(self))
    }
    /// Floor division.
    pub fn floordiv(self, other: impl Into<Expr>) -> Expr {
        Expr::bin(BinOp::Div, self, other.into())
    }
    /// Floor modulo.
    pub fn floormod(self, other: impl Into<Expr>) -> Expr {
        Expr::bin(BinOp::Mod, self, other.into())
    }

    /// The dtype of the expression, computed from its node without checking operands.
    pub fn dtype(&self) -> DType {
        match self {
            Expr::Const(c) => c.dtype(),
            Expr::Var(_) => DType::I64,
            Expr::Bin(_, a, _) => a.dtype(),
            Expr::Cmp(..) | Expr::And(..) | Expr::Or(..) | Expr::Not(_) => DType::Bool,
            Expr::Select(_, t, _) => t.dtype(),
            Expr::Cast(d, _) => *d,
            Expr::Call(_, a) => a.dtype(),
            Expr::Pair(op, ..) => op.result(),
            Expr::Load { dtype, .. } | Expr::BufLoad { dtype, .. } => *dtype,
            Expr::Reduce { source, .. } => source.dtype(),
        }
    }

    /// Checks dtypes throughout: operands agree, conditions are `Bool`, indices are integers,
    /// `Mod` is integer-only, math intrinsics other than `abs` take floats.
    pub fn check(&self) -> Result<DType, TypeError> {
        let err = |e: &Expr, m: String| TypeError {
            expr: e.to_string(),
            message: m,
        };
        match self {
            Expr::Const(c) => Ok(c.dtype()),
            Expr::Var(_) => Ok(DType::I64),
            Expr::Bin(op, a, b) => {
                let (ta, tb) = (a.check()?, b.check()?);
                if ta != tb {
                    return Err(err(self, format!("operands are {ta} and {tb}; cast one")));
                }
                if ta == DType::Bool {
                    return Err(err(self, "arithmetic on bool".into()));
                }
                if *op == BinOp::Mod && ta.is_float() {
                    return Err(err(self, "modulo of floats".into()));
                }
                if ta == DType::BF16 {
                    return Err(err(self, "arithmetic on bf16; cast to f32".into()));
                }
                Ok(ta)
            }
            Expr::Cmp(_, a, b) => {
                let (ta, tb) = (a.check()?, b.check()?);
                if ta != tb {
                    return Err(err(self, format!("compared values are {ta} and {tb}")));
                }
                Ok(DType::Bool)
            }
            Expr::And(a, b) | Expr::Or(a, b) => {
                for x in [a, b] {
                    if x.check()? != DType::Bool {
                        return Err(err(self, "logical operand is not bool".into()));
                    }
                }
                Ok(DType::Bool)
            }
            Expr::Not(a) => {
                if a.check()? != DType::Bool {
                    return Err(err(self, "negated value is not bool".into()));
                }
                Ok(DType::Bool)
            }
            Expr::Select(c, t, f) => {
                if c.check()? != DType::Bool {
                    return Err(err(self, "select condition is not bool".into()));
                }
                let (tt, tf) = (t.check()?, f.check()?);
                if tt != tf {
                    return Err(err(self, format!("select branches are {tt} and {tf}")));
                }
                Ok(tt)
            }
            Expr::Cast(d, a) => {
                a.check()?;
                Ok(*d)
            }
            Expr::Call(f, a) => {
                let t = a.check()?;
                if *f != Intrinsic::Abs && !t.is_float() {
                    return Err(err(self, format!("{} of {t}", f.name())));
                }
                if t == DType::Bool {
                    return Err(err(self, "abs of bool".into()));
                }
                Ok(t)
            }
            Expr::Pair(op, a, b) => {
                let (ta, tb) = (a.check()?, b.check()?);
                if ta != op.operand() || tb != op.operand() {
                    return Err(err(
                        self,
                        format!(
                            "{} takes {} operands, not {ta} and {tb}",
                            op.name(),
                            op.operand()
                        ),
                    ));
                }
                Ok(op.result())
            }
            Expr::Load { dtype, indices, .. } => {
                for i in indices {
                    if !i.check()?.is_int() {
                        return Err(err(self, "tensor index is not an integer".into()));
                    }
                }
                Ok(*dtype)
            }
            Expr::BufLoad { dtype, index, .. } => {
                if !index.check()?.is_int() {
                    return Err(err(self, "buffer index is not an integer".into()));
                }
                Ok(*dtype)
            }
            Expr::Reduce { source, .. } => source.check(),
        }
    }

    /// Calls `f` on every sub-expression, parents before children.
    pub fn visit(&self, f: &mut impl FnMut(&Expr)) {
        f(self);
        match self {
            Expr::Const(_) | Expr::Var(_) => {}
            Expr::Bin(_, a, b)
            | Expr::Cmp(_, a, b)
            | Expr::And(a, b)
            | Expr::Or(a, b)
            | Expr::Pair(_, a, b) => {
                a.visit(f);
                b.visit(f);
            }
            Expr::Not(a) | Expr::Cast(_, a) | Expr::Call(_, a) => a.visit(f),
            Expr::Select(c, t, e) => {
                c.visit(f);
                t.visit(f);
                e.visit(f);
            }
            Expr::Load { indices, .. } => indices.iter().for_each(|i| i.visit(f)),
            Expr::BufLoad { index, .. } => index.visit(f),
            Expr::Reduce { source, .. } => source.visit(f),
        }
    }

    /// Rebuilds the expression bottom-up: `f` sees each node after its children were rebuilt
    /// and returns `Some(replacement)` or `None` to keep the node.
    pub fn rewrite(&self, f: &mut dyn FnMut(&Expr) -> Option<Expr>) -> Expr {
        self.rewrite_changed(f).unwrap_or_else(|| self.clone())
    }

    /// [`Expr::rewrite`] that copies only what changes: `None` when `f` kept every node, so
    /// that a subtree `f` leaves alone is neither rebuilt nor copied (lowering rewrites big
    /// expressions in which most subtrees do not use the variables being replaced).
    pub fn rewrite_changed(&self, f: &mut dyn FnMut(&Expr) -> Option<Expr>) -> Option<Expr> {
        fn kid(old: &Expr, new: Option<Expr>) -> Box<Expr> {
            Box::new(new.unwrap_or_else(|| old.clone()))
        }
        let rebuilt = match self {
            Expr::Const(_) | Expr::Var(_) => None,
            Expr::Bin(op, x, y) => match (x.rewrite_changed(f), y.rewrite_changed(f)) {
                (None, None) => None,
                (a, b) => Some(Expr::Bin(*op, kid(x, a), kid(y, b))),
            },
            Expr::Cmp(op, x, y) => match (x.rewrite_changed(f), y.rewrite_changed(f)) {
                (None, None) => None,
                (a, b) => Some(Expr::Cmp(*op, kid(x, a), kid(y, b))),
            },
            Expr::And(x, y) => match (x.rewrite_changed(f), y.rewrite_changed(f)) {
                (None, None) => None,
                (a, b) => Some(Expr::And(kid(x, a), kid(y, b))),
            },
            Expr::Or(x, y) => match (x.rewrite_changed(f), y.rewrite_changed(f)) {
                (None, None) => None,
                (a, b) => Some(Expr::Or(kid(x, a), kid(y, b))),
            },
            Expr::Pair(op, x, y) => match (x.rewrite_changed(f), y.rewrite_changed(f)) {
                (None, None) => None,
                (a, b) => Some(Expr::Pair(*op, kid(x, a), kid(y, b))),
            },
            Expr::Not(x) => x.rewrite_changed(f).map(|a| Expr::Not(Box::new(a))),
            Expr::Cast(d, x) => x.rewrite_changed(f).map(|a| Expr::Cast(*d, Box::new(a))),
            Expr::Call(c, x) => x.rewrite_changed(f).map(|a| Expr::Call(*c, Box::new(a))),
            Expr::Select(c, t, e) => match (
                c.rewrite_changed(f),
                t.rewrite_changed(f),
                e.rewrite_changed(f),
            ) {
                (None, None, None) => None,
                (a, b, d) => Some(Expr::Select(kid(c, a), kid(t, b), kid(e, d))),
            },
            Expr::Load {
                tensor,
                dtype,
                indices,
            } => {
                let mut out: Option<Vec<Expr>> = None;
                for (k, i) in indices.iter().enumerate() {
                    match (i.rewrite_changed(f), &mut out) {
                        (Some(n), Some(v)) => v.push(n),
                        (Some(n), None) => {
                            let mut v = Vec::with_capacity(indices.len());
                            v.extend_from_slice(&indices[..k]);
                            v.push(n);
                            out = Some(v);
                        }
                        (None, Some(v)) => v.push(i.clone()),
                        (None, None) => {}
                    }
                }
                out.map(|indices| Expr::Load {
                    tensor: *tensor,
                    dtype: *dtype,
                    indices,
                })
            }
            Expr::BufLoad { buf, dtype, index } => {
                index.rewrite_changed(f).map(|i| Expr::BufLoad {
                    buf: *buf,
                    dtype: *dtype,
                    index: Box::new(i),
                })
            }
            Expr::Reduce {
                combiner,
                source,
                axes,
            } => source.rewrite_changed(f).map(|s| Expr::Reduce {
                combiner: *combiner,
                source: Box::new(s),
                axes: axes.clone(),
            }),
        };
        match rebuilt {
            Some(r) => Some(f(&r).unwrap_or(r)),
            None => f(self),
        }
    }

    /// Replaces variables by expressions (`map` gives the replacement of a var id).
    pub fn substitute(&self, map: &impl Fn(&Var) -> Option<Expr>) -> Expr {
        self.rewrite(&mut |e| match e {
            Expr::Var(v) => map(v),
            _ => None,
        })
    }

    /// The constant stride of this (index) expression in variable `v`: `Some(s)` if it is
    /// `base + s * v` with `base` free of `v` (`Some(0)` if `v` does not occur), `None` if it
    /// is not affine in `v` with a constant coefficient.
    pub fn stride_in(&self, v: u32) -> Option<i64> {
        if !self.uses_var(v) {
            return Some(0);
        }
        match self {
            Expr::Var(x) => Some(if x.id == v { 1 } else { 0 }),
            Expr::Bin(BinOp::Add, a, b) => a.stride_in(v)?.checked_add(b.stride_in(v)?),
            Expr::Bin(BinOp::Sub, a, b) => a.stride_in(v)?.checked_sub(b.stride_in(v)?),
            Expr::Bin(BinOp::Mul, a, b) => match (a.as_int(), b.as_int()) {
                (Some(c), _) => b.stride_in(v)?.checked_mul(c),
                (_, Some(c)) => a.stride_in(v)?.checked_mul(c),
                _ => None,
            },
            Expr::Cast(d, a)
                if d.is_int() && a.dtype().is_int() && d.bytes() >= a.dtype().bytes() =>
            {
                a.stride_in(v)
            }
            _ => None,
        }
    }

    /// True if the variable occurs in the expression.
    pub fn uses_var(&self, id: u32) -> bool {
        let mut found = false;
        self.visit(&mut |e| {
            if let Expr::Var(v) = e {
                found |= v.id == id;
            }
        });
        found
    }
}

impl From<i64> for Expr {
    fn from(v: i64) -> Expr {
        Expr::int(v)
    }
}
/// Rust integer literals default to `i32`, and in tensor expressions they are almost always
/// index arithmetic (`i + 1`, `h - pad`), so an `i32` converts to an *index* (i64) constant.
/// Write `Expr::i32(v)` for a constant of the i32 data type.
impl From<i32> for Expr {
    fn from(v: i32) -> Expr {
        Expr::int(v as i64)
    }
}
impl From<f32> for Expr {
    fn from(v: f32) -> Expr {
        Expr::f32(v)
    }
}
impl From<f64> for Expr {
    fn from(v: f64) -> Expr {
        Expr::f64(v)
    }
}
impl From<&Var> for Expr {
    fn from(v: &Var) -> Expr {
        Expr::Var(*v)
    }
}
impl From<&Expr> for Expr {
    fn from(v: &Expr) -> Expr {
        v.clone()
    }
}
impl From<&IterVar> for Expr {
    fn from(v: &IterVar) -> Expr {
        v.expr()
    }
}

macro_rules! impl_bin {
    ($tr:ident, $m:ident, $op:expr) => {
        impl<T: Into<Expr>> std::ops::$tr<T> for Expr {
            type Output = Expr;
            fn $m(self, rhs: T) -> Expr {
                Expr::bin($op, self, rhs.into())
            }
        }
        impl<T: Into<Expr>> std::ops::$tr<T> for &Expr {
            type Output = Expr;
            fn $m(self, rhs: T) -> Expr {
                Expr::bin($op, self.clone(), rhs.into())
            }
        }
    };
}
impl_bin!(Add, add, BinOp::Add);
impl_bin!(Sub, sub, BinOp::Sub);
impl_bin!(Mul, mul, BinOp::Mul);
impl_bin!(Div, div, BinOp::Div);

impl std::ops::Neg for Expr {
    type Output = Expr;
    fn neg(self) -> Expr {
        let zero = Expr::Const(Const::zero(self.dtype()));
        Expr::bin(BinOp::Sub, zero, self)
    }
}

/// `cond ? t : f`
pub fn select(cond: Expr, t: impl Into<Expr>, f: impl Into<Expr>) -> Expr {
    Expr::Select(Box::new(cond), Box::new(t.into()), Box::new(f.into()))
}
/// Elementwise maximum of two values of one dtype.
pub fn max(a: impl Into<Expr>, b: impl Into<Expr>) -> Expr {
    Expr::bin(BinOp::Max, a.into(), b.into())
}
/// Elementwise minimum of two values of one dtype.
pub fn min(a: impl Into<Expr>, b: impl Into<Expr>) -> Expr {
    Expr::bin(BinOp::Min, a.into(), b.into())
}
/// e^x
pub fn exp(x: impl Into<Expr>) -> Expr {
    Expr::Call(Intrinsic::Exp, Box::new(x.into()))
}
/// Natural logarithm.
pub fn log(x: impl Into<Expr>) -> Expr {
    Expr::Call(Intrinsic::Log, Box::new(x.into()))
}
/// Square root.
pub fn sqrt(x: impl Into<Expr>) -> Expr {
    Expr::Call(Intrinsic::Sqrt, Box::new(x.into()))
}
/// Hyperbolic tangent.
pub fn tanh(x: impl Into<Expr>) -> Expr {
    Expr::Call(Intrinsic::Tanh, Box::new(x.into()))
}
/// Absolute value.
pub fn abs(x: impl Into<Expr>) -> Expr {
    Expr::Call(Intrinsic::Abs, Box::new(x.into()))
}

/// Two bf16 values packed into one 32-bit word, `lo` in the low half ([`PairOp::Pack`]).
pub fn pack_bf16(lo: impl Into<Expr>, hi: impl Into<Expr>) -> Expr {
    Expr::Pair(PairOp::Pack, Box::new(lo.into()), Box::new(hi.into()))
}
/// The f32 dot product of two packed bf16 pairs ([`PairOp::Dot`]).
pub fn dot_bf16(a: impl Into<Expr>, b: impl Into<Expr>) -> Expr {
    Expr::Pair(PairOp::Dot, Box::new(a.into()), Box::new(b.into()))
}

fn reduce<'a>(
    combiner: Combiner,
    source: Expr,
    axes: impl IntoIterator<Item = &'a IterVar>,
) -> Expr {
    Expr::Reduce {
        combiner,
        source: Box::new(source),
        axes: axes.into_iter().cloned().collect(),
    }
}
/// Sum of `source` over `axes` (`[&k]`, or a slice of axes), starting from 0.
pub fn sum<'a>(source: impl Into<Expr>, axes: impl IntoIterator<Item = &'a IterVar>) -> Expr {
    reduce(Combiner::Sum, source.into(), axes)
}
/// Maximum of `source` over `axes`, starting from -inf.
pub fn max_reduce<'a>(
    source: impl Into<Expr>,
    axes: impl IntoIterator<Item = &'a IterVar>,
) -> Expr {
    reduce(Combiner::Max, source.into(), axes)
}
/// Minimum of `source` over `axes`, starting from +inf.
pub fn min_reduce<'a>(
    source: impl Into<Expr>,
    axes: impl IntoIterator<Item = &'a IterVar>,
) -> Expr {
    reduce(Combiner::Min, source.into(), axes)
}

fn prec(e: &Expr) -> u8 {
    match e {
        Expr::Or(..) => 1,
        Expr::And(..) => 2,
        Expr::Cmp(..) => 3,
        Expr::Bin(BinOp::Add | BinOp::Sub, ..) => 4,
        Expr::Bin(BinOp::Mul | BinOp::Div | BinOp::Mod, ..) => 5,
        _ => 9,
    }
}

fn fmt_operand(f: &mut fmt::Formatter<'_>, e: ExprDisplay<'_>, min_prec: u8) -> fmt::Result {
    if prec(e.e) < min_prec {
        write!(f, "({e})")
    } else {
        write!(f, "{e}")
    }
}

/// Writes the name of a buffer (for [`Expr::display_with`]).
pub type BufNamer<'a> = &'a dyn Fn(BufId, &mut fmt::Formatter<'_>) -> fmt::Result;

/// An expression printed with its buffer loads named by a [`BufNamer`] (`b<id>` without).
#[derive(Clone, Copy)]
pub struct ExprDisplay<'a> {
    e: &'a Expr,
    buf_name: Option<BufNamer<'a>>,
}

impl<'a> ExprDisplay<'a> {
    fn sub(&self, e: &'a Expr) -> ExprDisplay<'a> {
        ExprDisplay {
            e,
            buf_name: self.buf_name,
        }
    }
}

impl Expr {
    /// The expression printed with buffer loads named by `buf_name` (e.g. `A[i * 16 + k]`).
    pub fn display_with<'a>(&'a self, buf_name: BufNamer<'a>) -> ExprDisplay<'a> {
        ExprDisplay {
            e: self,
            buf_name: Some(buf_name),
        }
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        ExprDisplay {
            e: self,
            buf_name: None,
        }
        .fmt(f)
    }
}

impl fmt::Display for Const {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Const::Bool(b) => write!(f, "{b}"),
            Const::I32(v) => write!(f, "{v}i32"),
            Const::I64(v) => write!(f, "{v}"),
            Const::F32(v) => write!(f, "{v:?}f"),
            Const::F64(v) => write!(f, "{v:?}"),
        }
    }
}

impl fmt::Display for ExprDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.e {
            Expr::Const(c) => write!(f, "{c}"),
            Expr::Var(v) => write!(f, "{}", v.name),
            Expr::Bin(op @ (BinOp::Min | BinOp::Max), a, b) => {
                let n = if *op == BinOp::Min { "min" } else { "max" };
                write!(f, "{n}({}, {})", self.sub(a), self.sub(b))
            }
            Expr::Bin(op, a, b) => {
                let p = prec(self.e);
                let s = match op {
                    BinOp::Add => "+",
                    BinOp::Sub => "-",
                    BinOp::Mul => "*",
                    BinOp::Div => "/",
                    BinOp::Mod => "%",
                    BinOp::Min | BinOp::Max => unreachable!("handled above"),
                };
                fmt_operand(f, self.sub(a), p)?;
                write!(f, " {s} ")?;
                // Right operands of non-commutative ops need parentheses at equal precedence.
                fmt_operand(f, self.sub(b), p + 1)
            }
            Expr::Cmp(op, a, b) => {
                let s = match op {
                    CmpOp::Eq => "==",
                    CmpOp::Ne => "!=",
                    CmpOp::Lt => "<",
                    CmpOp::Le => "<=",
                    CmpOp::Gt => ">",
                    CmpOp::Ge => ">=",
                };
                fmt_operand(f, self.sub(a), 4)?;
                write!(f, " {s} ")?;
                fmt_operand(f, self.sub(b), 4)
            }
            Expr::And(a, b) => {
                fmt_operand(f, self.sub(a), 2)?;
                write!(f, " && ")?;
                fmt_operand(f, self.sub(b), 3)
            }
            Expr::Or(a, b) => {
                fmt_operand(f, self.sub(a), 1)?;
                write!(f, " || ")?;
                fmt_operand(f, self.sub(b), 2)
            }
            Expr::Not(a) => {
                write!(f, "!")?;
                fmt_operand(f, self.sub(a), 9)
            }
            Expr::Select(c, t, e) => write!(
                f,
                "select({}, {}, {})",
                self.sub(c),
                self.sub(t),
                self.sub(e)
            ),
            Expr::Cast(d, a) => write!(f, "{d}({})", self.sub(a)),
            Expr::Call(c, a) => write!(f, "{}({})", c.name(), self.sub(a)),
            Expr::Pair(op, a, b) => write!(f, "{}({}, {})", op.name(), self.sub(a), self.sub(b)),
            Expr::Load {
                tensor, indices, ..
            } => {
                write!(f, "T{}[", tensor.0)?;
                for (i, x) in indices.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{}", self.sub(x))?;
                }
                write!(f, "]")
            }
            Expr::BufLoad { buf, index, .. } => {
                match self.buf_name {
                    Some(name) => name(*buf, f)?,
                    None => write!(f, "b{}", buf.0)?,
                }
                write!(f, "[{}]", self.sub(index))
            }
            Expr::Reduce {
                combiner,
                source,
                axes,
            } => {
                write!(f, "{}({}, axes=[", combiner.name(), self.sub(source))?;
                for (i, a) in axes.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{}:{}", a.var.name, a.extent)?;
                }
                write!(f, "])")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (Var, Var, Expr) {
        let (i, j) = (Var::new(0, "i"), Var::new(1, "j"));
        let e = select(
            (Expr::Var(i) * 4i64 + 1i64).lt(10i64),
            Expr::Var(j) * 2i64 + Expr::Var(i),
            Expr::int(7),
        );
        (i, j, e)
    }

    #[test]
    fn rewrite_changed_is_none_when_nothing_changes() {
        let (_, _, e) = sample();
        let mut seen = 0;
        let r = e.rewrite_changed(&mut |_| {
            seen += 1;
            None
        });
        assert!(r.is_none());
        // Every node was offered to `f` (the select, its 3 operands and their subtrees).
        let mut nodes = 0;
        e.visit(&mut |_| nodes += 1);
        assert_eq!(seen, nodes);
        assert_eq!(e.substitute(&|_| None), e);
    }

    #[test]
    fn rewrite_replaces_only_what_f_changes() {
        let (i, j, e) = sample();
        let by_hand = select(
            (Expr::int(3) * 4i64 + 1i64).lt(10i64),
            Expr::Var(j) * 2i64 + Expr::int(3),
            Expr::int(7),
        );
        assert_eq!(
            e.substitute(&|v| (v.id == i.id).then(|| Expr::int(3))),
            by_hand
        );
        // Bottom-up: `f` sees a parent after its children were replaced.
        let folded = e.rewrite(&mut |n| match n {
            Expr::Bin(BinOp::Mul, a, b) => match (&**a, &**b) {
                (Expr::Const(Const::I64(x)), Expr::Const(Const::I64(y))) => Some(Expr::int(x * y)),
                _ => None,
            },
            Expr::Var(v) if v.id == i.id => Some(Expr::int(3)),
            _ => None,
        });
        let want = select(
            (Expr::int(12) + 1i64).lt(10i64),
            Expr::Var(j) * 2i64 + Expr::int(3),
            Expr::int(7),
        );
        assert_eq!(folded, want);
    }
}

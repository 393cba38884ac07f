//! Expressions, for scalars and (inside a vectorized loop) `<lanes x T>` vectors alike.
//!
//! A value is a scalar until an operand varies across lanes; mixing a scalar with a vector
//! broadcasts the scalar. Semantics follow `tensortune_schedules::expr`: integer `Div`/`Mod`
//! are floor division and modulo (with a divisor of 0 giving 0 instead of a trap), float
//! `min`/`max` ignore a NaN operand (`minnum`/`maxnum`, like `f32::min`), float-to-int casts
//! saturate (like Rust's `as`), and a `Select` whose branches load memory evaluates only the
//! chosen branch, since the other one's index may be out of bounds.

use super::gen::{Gen, Res};
use super::vector::stride_of;
use crate::codegen::CodegenError;
use inkwell::intrinsics::Intrinsic;
use inkwell::types::{BasicType, BasicTypeEnum, VectorType};
use inkwell::values::FastMathFlags;
use inkwell::values::{BasicMetadataValueEnum, BasicValue, BasicValueEnum, VectorValue};
use inkwell::{FloatPredicate, IntPredicate};
use tensortune_schedules::expr::{BinOp, CmpOp, Intrinsic as Intr, PairOp};
use tensortune_schedules::{Const, DType, Expr};

type V<'ctx> = BasicValueEnum<'ctx>;

/// True if evaluating `e` reads memory.
pub(super) fn has_load(e: &Expr) -> bool {
    let mut found = false;
    e.visit(&mut |x| found |= matches!(x, Expr::BufLoad { .. } | Expr::Load { .. }));
    found
}

/// `(acc, x, y)` if `a + b` is `acc + dot_bf16(x, y)` in either order.
fn dot_operand<'e>(a: &'e Expr, b: &'e Expr) -> Option<(&'e Expr, &'e Expr, &'e Expr)> {
    match (a, b) {
        (acc, Expr::Pair(PairOp::Dot, x, y)) | (Expr::Pair(PairOp::Dot, x, y), acc) => {
            Some((acc, x, y))
        }
        _ => None,
    }
}

/// `(buf, i)` if `lo` and `hi` load `buf[i]` and `buf[i + 1]` of a bf16 buffer on a
/// little-endian host: the pair is then the 32-bit word at `buf[i]`.
fn adjacent_halves<'e>(
    lo: &'e Expr,
    hi: &'e Expr,
) -> Option<(tensortune_schedules::BufId, &'e Expr)> {
    let (
        Expr::BufLoad {
            buf: b0,
            dtype: DType::BF16,
            index: i0,
        },
        Expr::BufLoad {
            buf: b1,
            dtype: DType::BF16,
            index: i1,
        },
    ) = (lo, hi)
    else {
        return None;
    };
    if b0 != b1 || !cfg!(target_endian = "little") {
        return None;
    }
    // Affine with the same stride in every variable, and one more where all are zero.
    let mut vars = Vec::new();
    for e in [i0, i1] {
        e.visit(&mut |x| {
            if let Expr::Var(v) = x {
                vars.push(v.id);
            }
        });
    }
    let same = vars
        .iter()
        .all(|&v| matches!((i0.stride_in(v), i1.stride_in(v)), (Some(p), Some(q)) if p == q));
    let at_zero = |e: &Expr| affine_at_zero(e);
    (same && at_zero(i1)? - at_zero(i0)? == 1).then_some((*b0, i0.as_ref()))
}

/// An affine index expression's value with every variable at 0 (`None` if not affine).
fn affine_at_zero(e: &Expr) -> Option<i64> {
    match e {
        Expr::Const(_) => e.as_int(),
        Expr::Var(_) => Some(0),
        Expr::Bin(BinOp::Add, a, b) => affine_at_zero(a)?.checked_add(affine_at_zero(b)?),
        Expr::Bin(BinOp::Sub, a, b) => affine_at_zero(a)?.checked_sub(affine_at_zero(b)?),
        Expr::Bin(BinOp::Mul, a, b) => affine_at_zero(a)?.checked_mul(affine_at_zero(b)?),
        Expr::Cast(d, a) if d.is_int() => affine_at_zero(a),
        _ => None,
    }
}

fn invalid(msg: String) -> CodegenError {
    CodegenError::InvalidIr(msg)
}

impl<'ctx> Gen<'ctx, '_> {
    pub(super) fn expr(&mut self, e: &Expr) -> Res<V<'ctx>> {
        match e {
            Expr::Const(c) => Ok(self.constant(*c)),
            Expr::Var(v) => self
                .vars
                .get(v.id as usize)
                .copied()
                .flatten()
                .ok_or_else(|| invalid(format!("variable `{}` used outside its loop", v.name))),
            Expr::Bin(op, a, b) => {
                let d = a.dtype();
                if b.dtype() != d {
                    return Err(invalid(format!("operands of `{e}` have different dtypes")));
                }
                if let (BinOp::Add, Some((acc, p, q))) = (op, dot_operand(a, b)) {
                    // acc + dot_bf16(p, q): the dot instruction accumulates.
                    let acc = self.expr(acc)?;
                    let (p, q) = (self.expr(p)?, self.expr(q)?);
                    return self.dot_bf16(Some(acc), p, q);
                }
                let (x, y) = (self.expr(a)?, self.expr(b)?);
                let (x, y) = self.unify(x, y)?;
                self.binop(*op, d, x, y)
            }
            Expr::Cmp(op, a, b) => {
                let d = a.dtype();
                if b.dtype() != d {
                    return Err(invalid(format!("operands of `{e}` have different dtypes")));
                }
                if let Some(m) = self.lane_cmp(*op, d, a, b)? {
                    return Ok(m);
                }
                let (x, y) = (self.expr(a)?, self.expr(b)?);
                let (x, y) = self.unify(x, y)?;
                self.cmp(*op, d, x, y)
            }
            Expr::And(a, b) | Expr::Or(a, b) => {
                let (x, y) = (self.expr(a)?, self.expr(b)?);
                let (x, y) = self.unify(x, y)?;
                let op = if matches!(e, Expr::And(..)) {
                    inkwell::values::InstructionOpcode::And
                } else {
                    inkwell::values::InstructionOpcode::Or
                };
                Ok(self.b.build_binop(op, x, y, "logic")?)
            }
            Expr::Not(a) => {
                let x = self.expr(a)?;
                let t = self.constant(Const::Bool(true));
                let (x, t) = self.unify(x, t)?;
                Ok(self
                    .b
                    .build_binop(inkwell::values::InstructionOpcode::Xor, x, t, "not")?)
            }
            Expr::Select(c, t, f) => {
                if has_load(t) || has_load(f) {
                    self.lazy_select(c, t, f)
                } else {
                    let cv = self.expr(c)?;
                    let (tv, fv) = (self.expr(t)?, self.expr(f)?);
                    self.select(cv, tv, fv)
                }
            }
            Expr::Cast(to, a) => {
                let x = self.expr(a)?;
                self.cast(x, a.dtype(), *to)
            }
            Expr::Call(f, a) => {
                let x = self.expr(a)?;
                self.call(*f, a.dtype(), x)
            }
            Expr::Pair(op, a, b) => {
                if a.dtype() != op.operand() || b.dtype() != op.operand() {
                    return Err(invalid(format!(
                        "operands of `{e}` are not {}",
                        op.operand()
                    )));
                }
                if let (PairOp::Pack, Some((buf, i0))) = (op, adjacent_halves(a, b)) {
                    if let Some(v) = self.pair_gather(buf, i0)? {
                        return Ok(v);
                    }
                }
                let (x, y) = (self.expr(a)?, self.expr(b)?);
                match op {
                    PairOp::Pack => self.pack_bf16(x, y),
                    PairOp::Dot => self.dot_bf16(None, x, y),
                }
            }
            Expr::BufLoad { buf, dtype, index } => {
                if self.decl(*buf)?.dtype != *dtype {
                    return Err(invalid(format!(
                        "load of {dtype} from a buffer of another dtype"
                    )));
                }
                if self.vec.is_some() {
                    self.vload(*buf, *dtype, index)
                } else {
                    self.load(*buf, *dtype, index)
                }
            }
            Expr::Load { .. } | Expr::Reduce { .. } => {
                Err(invalid(format!("tensor expression `{e}` in loop IR")))
            }
        }
    }

    /// The value `buf[index] = value` stores. A float maximum or minimum of the element the
    /// store overwrites and another value (a reduction's update, `acc = max(acc, x)`) becomes
    /// `x > acc ? x : acc`, one `vmaxps` on x86, where `llvm.maxnum` costs a compare and a
    /// blend more per vector to return `x` when `acc` is NaN, inside the loop-carried chain
    /// (docs/measurements.md, "Reductions without NaN checks"). The two agree whenever `acc`
    /// is not NaN, and it never is: every accumulator starts at the combiner's identity
    /// (±inf) and the select only ever replaces it by an `x` that compared greater, so never
    /// by a NaN. A NaN `x` is skipped, as `f32::max` in the reference skips it.
    pub(super) fn store_value(
        &mut self,
        buf: tensortune_schedules::BufId,
        index: &Expr,
        value: &Expr,
    ) -> Res<V<'ctx>> {
        if let Expr::Bin(op @ (BinOp::Max | BinOp::Min), a, b) = value {
            let d = a.dtype();
            let is_acc = |e: &Expr| matches!(e, Expr::BufLoad { buf: lb, index: li, .. } if *lb == buf && **li == *index);
            let acc_x = if is_acc(a) {
                Some((a, b))
            } else if is_acc(b) {
                Some((b, a))
            } else {
                None
            };
            if let (true, true, Some((acc, x))) = (d.is_float(), b.dtype() == d, acc_x) {
                let (accv, xv) = (self.expr(acc)?, self.expr(x)?);
                let (accv, xv) = self.unify(accv, xv)?;
                let pred = if *op == BinOp::Max {
                    CmpOp::Gt
                } else {
                    CmpOp::Lt
                };
                let c = self.cmp(pred, d, xv, accv)?;
                return self.select(c, xv, accv);
            }
        }
        self.expr(value)
    }

    fn load(
        &mut self,
        buf: tensortune_schedules::BufId,
        dtype: DType,
        index: &Expr,
    ) -> Res<V<'ctx>> {
        let ptr = self.elem_ptr(buf, index)?;
        let v = self.b.build_load(self.mem_ty(dtype), ptr, "ld")?;
        if let Some(i) = v.as_instruction_value() {
            i.set_alignment(self.mem_bytes(dtype) as u32)
                .map_err(|e| CodegenError::Llvm(e.to_string()))?;
        }
        self.loaded_value(v, dtype)
    }

    /// A loaded value of `d` as a register value (bytes narrow to bools).
    pub(super) fn loaded_value(&mut self, v: V<'ctx>, d: DType) -> Res<V<'ctx>> {
        if d != DType::Bool {
            return Ok(v);
        }
        let zero = self.splat_like(v, self.cx.i8_type().const_zero().into())?;
        self.icmp(IntPredicate::NE, v, zero)
    }

    pub(super) fn constant(&self, c: Const) -> V<'ctx> {
        match c {
            Const::Bool(b) => self.cx.bool_type().const_int(b as u64, false).into(),
            Const::I32(v) => self.cx.i32_type().const_int(v as i64 as u64, true).into(),
            Const::I64(v) => self.cx.i64_type().const_int(v as u64, true).into(),
            Const::F32(v) => self.cx.f32_type().const_float(v as f64).into(),
            Const::F64(v) => self.cx.f64_type().const_float(v).into(),
        }
    }

    /// `<lanes x T>` with every lane `v`.
    pub(super) fn broadcast(&mut self, v: V<'ctx>, lanes: u32) -> Res<VectorValue<'ctx>> {
        if let V::VectorValue(x) = v {
            return Ok(x);
        }
        let vt = v.get_type().vec_type_of(lanes)?;
        let undef = vt.get_undef();
        let i32t = self.cx.i32_type();
        let one = self
            .b
            .build_insert_element(undef, v, i32t.const_zero(), "bc")?;
        let zeros = i32t.vec_type(lanes).const_zero();
        Ok(self.b.build_shuffle_vector(one, undef, zeros, "splat")?)
    }

    /// `v` broadcast to the shape of `like` (itself if `like` is a scalar).
    fn splat_like(&mut self, like: V<'ctx>, v: V<'ctx>) -> Res<V<'ctx>> {
        match like {
            V::VectorValue(x) => Ok(self.broadcast(v, x.get_type().get_size())?.into()),
            _ => Ok(v),
        }
    }

    /// Broadcasts one operand if the other is a vector.
    pub(super) fn unify(&mut self, x: V<'ctx>, y: V<'ctx>) -> Res<(V<'ctx>, V<'ctx>)> {
        match (x, y) {
            (V::VectorValue(a), V::VectorValue(b)) => {
                if a.get_type().get_size() != b.get_type().get_size() {
                    return Err(invalid("vectors of different lane counts".into()));
                }
                Ok((x, y))
            }
            (V::VectorValue(a), _) => Ok((x, self.broadcast(y, a.get_type().get_size())?.into())),
            (_, V::VectorValue(b)) => Ok((self.broadcast(x, b.get_type().get_size())?.into(), y)),
            _ => Ok((x, y)),
        }
    }

    /// Sets fast-math `flags` on the float instruction `v` (a constant-folded value has
    /// none to set). Only fails on instructions that take no flags, which these are not.
    fn with_flags(v: V<'ctx>, flags: FastMathFlags) -> V<'ctx> {
        if let Some(i) = v.as_instruction_value() {
            let _ = i.set_fast_math_flags(flags);
        }
        v
    }

    /// `contract`: an add of a multiply may become one FMA.
    fn contract(&self, v: V<'ctx>) -> V<'ctx> {
        Self::with_flags(v, FastMathFlags::AllowContract)
    }

    /// `arcp`: LLVM may compute `x / y` as `x * (1 / y)`, and so divides once outside a loop
    /// whose divisor does not change in it (softmax's row sum). A vector division takes
    /// several multiplies' time on every x86 core, and a large share of softmax's on Intel's
    /// (docs/measurements.md, "Softmax's division"). The result may differ from the
    /// correctly rounded quotient in the last place or two, well within the tolerance of the
    /// check against the reference.
    fn reciprocal(&self, v: V<'ctx>) -> V<'ctx> {
        Self::with_flags(v, FastMathFlags::AllowReciprocal)
    }

    pub(super) fn binop(&mut self, op: BinOp, d: DType, x: V<'ctx>, y: V<'ctx>) -> Res<V<'ctx>> {
        use inkwell::values::InstructionOpcode as O;
        if d.is_float() {
            let r = match op {
                BinOp::Add => self.contract(self.b.build_binop(O::FAdd, x, y, "fadd")?),
                BinOp::Sub => self.contract(self.b.build_binop(O::FSub, x, y, "fsub")?),
                BinOp::Mul => self.contract(self.b.build_binop(O::FMul, x, y, "fmul")?),
                BinOp::Div => self.reciprocal(self.b.build_binop(O::FDiv, x, y, "fdiv")?),
                BinOp::Min => self.intrinsic("llvm.minnum", &[x.get_type()], &[x, y])?,
                BinOp::Max => self.intrinsic("llvm.maxnum", &[x.get_type()], &[x, y])?,
                BinOp::Mod => return Err(invalid("modulo of floats".into())),
            };
            return Ok(r);
        }
        if !d.is_int() {
            return Err(invalid(format!("arithmetic on {d}")));
        }
        Ok(match op {
            BinOp::Add => self.b.build_binop(O::Add, x, y, "add")?,
            BinOp::Sub => self.b.build_binop(O::Sub, x, y, "sub")?,
            BinOp::Mul => self.b.build_binop(O::Mul, x, y, "mul")?,
            BinOp::Min => self.intrinsic("llvm.smin", &[x.get_type()], &[x, y])?,
            BinOp::Max => self.intrinsic("llvm.smax", &[x.get_type()], &[x, y])?,
            BinOp::Div | BinOp::Mod => self.floor_div_mod(op == BinOp::Div, x, y)?,
        })
    }

    /// Floor division or modulo. A constant positive divisor (every index expression) needs
    /// one fix-up for negative remainders; otherwise a divisor of 0 gives 0 and `MIN / -1`
    /// wraps instead of trapping.
    fn floor_div_mod(&mut self, div: bool, x: V<'ctx>, y: V<'ctx>) -> Res<V<'ctx>> {
        use inkwell::values::InstructionOpcode as O;
        let zero = self.splat_like(x, x.get_type().const_zero())?;
        let const_pos = match y {
            V::IntValue(c) => c.get_sign_extended_constant().is_some_and(|c| c > 0),
            _ => false,
        };
        let (ys, guard) = if const_pos {
            (y, None)
        } else {
            // y' = (y == 0 || y == -1) ? 1 : y; the two cases are patched below.
            let one = self.splat_like(x, self.int_const_of(x, 1)?)?;
            let m1 = self.splat_like(x, self.int_const_of(x, -1)?)?;
            let is0 = self.icmp(IntPredicate::EQ, y, zero)?;
            let ism1 = self.icmp(IntPredicate::EQ, y, m1)?;
            let bad = self.b.build_binop(O::Or, is0, ism1, "bad")?;
            (self.select(bad, one, y)?, Some((is0, ism1)))
        };
        let q = self.b.build_binop(O::SDiv, x, ys, "q")?;
        let r = self.b.build_binop(O::SRem, x, ys, "r")?;
        // Adjust when r != 0 and r, y have opposite signs.
        let rnz = self.icmp(IntPredicate::NE, r, zero)?;
        let sx = self.b.build_binop(O::Xor, r, ys, "sx")?;
        let neg = self.icmp(IntPredicate::SLT, sx, zero)?;
        let adj = self.b.build_binop(O::And, rnz, neg, "adj")?;
        let mut out = if div {
            let adj_i = self.b.build_cast(O::ZExt, adj, x.get_type(), "adj.i")?;
            self.b.build_binop(O::Sub, q, adj_i, "floordiv")?
        } else {
            let plus = self.b.build_binop(O::Add, r, ys, "r.adj")?;
            self.select(adj, plus, r)?
        };
        if let Some((is0, ism1)) = guard {
            let neg_x = self.b.build_binop(O::Sub, zero, x, "negx")?;
            let m1_val = if div { neg_x } else { zero };
            out = self.select(ism1, m1_val, out)?;
            out = self.select(is0, zero, out)?;
        }
        Ok(out)
    }

    fn int_const_of(&self, like: V<'ctx>, v: i64) -> Res<V<'ctx>> {
        let t = match like.get_type() {
            BasicTypeEnum::VectorType(vt) => vt.get_element_type(),
            t => t,
        };
        match t {
            BasicTypeEnum::IntType(it) => Ok(it.const_int(v as u64, true).into()),
            _ => Err(invalid("integer operation on a non-integer".into())),
        }
    }

    pub(super) fn icmp(&mut self, p: IntPredicate, x: V<'ctx>, y: V<'ctx>) -> Res<V<'ctx>> {
        Ok(match (x, y) {
            (V::IntValue(a), V::IntValue(b)) => self.b.build_int_compare(p, a, b, "icmp")?.into(),
            (V::VectorValue(a), V::VectorValue(b)) => {
                self.b.build_int_compare(p, a, b, "icmp")?.into()
            }
            _ => return Err(invalid("integer comparison of mismatched values".into())),
        })
    }

    fn fcmp(&mut self, p: FloatPredicate, x: V<'ctx>, y: V<'ctx>) -> Res<V<'ctx>> {
        Ok(match (x, y) {
            (V::FloatValue(a), V::FloatValue(b)) => {
                self.b.build_float_compare(p, a, b, "fcmp")?.into()
            }
            (V::VectorValue(a), V::VectorValue(b)) => {
                self.b.build_float_compare(p, a, b, "fcmp")?.into()
            }
            _ => return Err(invalid("float comparison of mismatched values".into())),
        })
    }

    /// In a vectorized loop of more 64-bit lanes than a register holds, an index comparison
    /// whose sides differ by one per lane (`x + rx >= 1`, an inlined zero padding's bound)
    /// as the lane numbers against one scalar: `a0 + l OP b0` is `l OP b0 - a0`. Computed as
    /// written it is an add and a compare of 64-bit lanes, eight a 512-bit register, for
    /// every vector of the body (a tap loop left rolled around a 56-lane row: 7 adds and 7
    /// compares for 4 loads); so it is one compare of 32-bit lane numbers, sixteen a
    /// register, against the scalar clamped to `-1..=lanes` (which decides every lane
    /// `0..lanes` as the scalar does, and fits 32 bits). The scalar difference saturates,
    /// so the comparison agrees with the direct one for every value the sides can take
    /// without overflowing. Within one register the direct form stays: LLVM hoists its
    /// compares into mask registers, where the scalar clamps and broadcasts took vector
    /// registers a rolled 8-lane tile needed (measured: docs/measurements.md, "Padding
    /// bounds as lane numbers"). `None` where the form does not apply.
    fn lane_cmp(&mut self, op: CmpOp, d: DType, a: &Expr, b: &Expr) -> Res<Option<V<'ctx>>> {
        let Some(ctx) = self.vec else {
            return Ok(None);
        };
        let register_bytes = self.opts.vector_bits.unwrap_or(self.host.vector_bits) / 8;
        if d != DType::I64 || has_load(a) || has_load(b) || ctx.lanes * 8 <= register_bytes {
            return Ok(None);
        }
        let (Some(sa), Some(sb)) = (stride_of(a, ctx.var), stride_of(b, ctx.var)) else {
            return Ok(None);
        };
        // a(l) = a0 + sa·l and b(l) = b0 + sb·l, so `a OP b` is `(sa - sb)·l OP b0 - a0`.
        let (op, lhs, rhs) = match sa.checked_sub(sb) {
            Some(1) => (op, b, a),
            // `-l OP b0 - a0` is `l OP' a0 - b0`, OP' the mirrored comparison.
            Some(-1) => {
                let mirrored = match op {
                    CmpOp::Lt => CmpOp::Gt,
                    CmpOp::Le => CmpOp::Ge,
                    CmpOp::Gt => CmpOp::Lt,
                    CmpOp::Ge => CmpOp::Le,
                    o => o,
                };
                (mirrored, a, b)
            }
            _ => return Ok(None),
        };
        let (x0, y0) = (self.at_lane0(lhs)?, self.at_lane0(rhs)?);
        let i64t = self.cx.i64_type();
        let t = self
            .intrinsic("llvm.ssub.sat", &[i64t.into()], &[x0.into(), y0.into()])?
            .into_int_value();
        let lo = i64t.const_int((-1i64) as u64, true);
        let hi = i64t.const_int(u64::from(ctx.lanes), false);
        let t = self
            .intrinsic("llvm.smax", &[i64t.into()], &[t.into(), lo.into()])?
            .into_int_value();
        let t = self
            .intrinsic("llvm.smin", &[i64t.into()], &[t.into(), hi.into()])?
            .into_int_value();
        let i32t = self.cx.i32_type();
        let t = self.b.build_int_truncate(t, i32t, "lanebound")?;
        let t = self.broadcast(t.into(), ctx.lanes)?;
        let ramp: Vec<_> = (0..u64::from(ctx.lanes))
            .map(|l| i32t.const_int(l, false))
            .collect();
        let ramp = inkwell::types::VectorType::const_vector(&ramp);
        self.cmp(op, d, ramp.into(), t.into()).map(Some)
    }

    fn cmp(&mut self, op: CmpOp, d: DType, x: V<'ctx>, y: V<'ctx>) -> Res<V<'ctx>> {
        if d.is_float() {
            // Ordered predicates, except `!=`, which is true on NaN as in Rust.
            let p = match op {
                CmpOp::Eq => FloatPredicate::OEQ,
                CmpOp::Ne => FloatPredicate::UNE,
                CmpOp::Lt => FloatPredicate::OLT,
                CmpOp::Le => FloatPredicate::OLE,
                CmpOp::Gt => FloatPredicate::OGT,
                CmpOp::Ge => FloatPredicate::OGE,
            };
            return self.fcmp(p, x, y);
        }
        let unsigned = d == DType::Bool;
        let p = match op {
            CmpOp::Eq => IntPredicate::EQ,
            CmpOp::Ne => IntPredicate::NE,
            CmpOp::Lt if unsigned => IntPredicate::ULT,
            CmpOp::Le if unsigned => IntPredicate::ULE,
            CmpOp::Gt if unsigned => IntPredicate::UGT,
            CmpOp::Ge if unsigned => IntPredicate::UGE,
            CmpOp::Lt => IntPredicate::SLT,
            CmpOp::Le => IntPredicate::SLE,
            CmpOp::Gt => IntPredicate::SGT,
            CmpOp::Ge => IntPredicate::SGE,
        };
        self.icmp(p, x, y)
    }

    /// `c ? t : f`, broadcasting as needed (a scalar condition may pick between vectors).
    pub(super) fn select(&mut self, c: V<'ctx>, t: V<'ctx>, f: V<'ctx>) -> Res<V<'ctx>> {
        let (t, f) = self.unify(t, f)?;
        let (t, f, c) = match (c, t) {
            (V::VectorValue(cv), V::VectorValue(_)) | (V::VectorValue(cv), _) => {
                let n = cv.get_type().get_size();
                let t = self.broadcast(t, n)?.into();
                let f = self.broadcast(f, n)?.into();
                (t, f, c)
            }
            _ => (t, f, c),
        };
        Ok(match c {
            V::IntValue(ci) => self.b.build_select(ci, t, f, "sel")?,
            V::VectorValue(cv) => self.b.build_select(cv, t, f, "sel")?,
            _ => return Err(invalid("select condition is not a bool".into())),
        })
    }

    /// A select whose branches load memory: only the taken branch's loads run.
    fn lazy_select(&mut self, c: &Expr, t: &Expr, f: &Expr) -> Res<V<'ctx>> {
        let cv = self.expr(c)?;
        if let (V::VectorValue(cm), Some(ctx)) = (cv, self.vec) {
            // Varying condition: each branch under its own lane mask.
            let not_c = self.not_mask(cm)?;
            let m_then = self.and_mask(ctx.mask, cm)?;
            let m_else = self.and_mask(ctx.mask, not_c)?;
            self.set_mask(Some(m_then));
            let tv = self.expr(t);
            self.set_mask(Some(m_else));
            let fv = tv.and_then(|tv| Ok((tv, self.expr(f)?)));
            self.set_mask(ctx.mask);
            let (tv, fv) = fv?;
            return self.select(cv, tv, fv);
        }
        let V::IntValue(ci) = cv else {
            return Err(invalid("select condition is not a bool".into()));
        };
        let then_bb = self.new_block("sel.t");
        let else_bb = self.new_block("sel.f");
        let merge = self.new_block("sel.end");
        self.b.build_conditional_branch(ci, then_bb, else_bb)?;
        self.b.position_at_end(then_bb);
        let mut tv = self.expr(t)?;
        let mut t_end = self.current_block()?;
        self.b.position_at_end(else_bb);
        let mut fv = self.expr(f)?;
        let mut f_end = self.current_block()?;
        // Branches of different shapes: broadcast the scalar one in its own block.
        let lanes = match (tv, fv) {
            (V::VectorValue(v), _) | (_, V::VectorValue(v)) => Some(v.get_type().get_size()),
            _ => None,
        };
        if let Some(n) = lanes {
            self.b.position_at_end(t_end);
            tv = self.broadcast(tv, n)?.into();
            t_end = self.current_block()?;
            self.b.position_at_end(f_end);
            fv = self.broadcast(fv, n)?.into();
            f_end = self.current_block()?;
        }
        self.b.position_at_end(t_end);
        self.b.build_unconditional_branch(merge)?;
        self.b.position_at_end(f_end);
        self.b.build_unconditional_branch(merge)?;
        self.b.position_at_end(merge);
        let phi = self.b.build_phi(tv.get_type(), "sel")?;
        phi.add_incoming(&[(&tv, t_end), (&fv, f_end)]);
        Ok(phi.as_basic_value())
    }

    fn cast(&mut self, x: V<'ctx>, from: DType, to: DType) -> Res<V<'ctx>> {
        use inkwell::values::InstructionOpcode as O;
        if from == to {
            return Ok(x);
        }
        if from == DType::BF16 {
            let f = self.bf16_to_f32(x)?;
            return self.cast(f, DType::F32, to);
        }
        if to == DType::BF16 {
            let f = self.cast(x, from, DType::F32)?;
            return self.f32_to_bf16(f);
        }
        let lanes = match x {
            V::VectorValue(v) => Some(v.get_type().get_size()),
            _ => None,
        };
        let ty = |g: &Self, d: DType| -> Res<BasicTypeEnum<'ctx>> {
            let s = g.scalar_ty(d);
            Ok(match lanes {
                Some(n) => s.vec_type_of(n)?.into(),
                None => s,
            })
        };
        let to_ty = ty(self, to)?;
        if to == DType::Bool {
            let zero = self.splat_like(x, self.scalar_ty(from).const_zero())?;
            return if from.is_float() {
                self.fcmp(FloatPredicate::UNE, x, zero)
            } else {
                self.icmp(IntPredicate::NE, x, zero)
            };
        }
        let op = match (from, to) {
            (DType::Bool, t) if t.is_int() => O::ZExt,
            (DType::Bool, _) => O::UIToFP,
            (f, t) if f.is_int() && t.is_int() => {
                if f.bytes() < t.bytes() {
                    O::SExt
                } else {
                    O::Trunc
                }
            }
            (f, t) if f.is_int() && t.is_float() => O::SIToFP,
            (f, t) if f.is_float() && t.is_float() => {
                if f.bytes() < t.bytes() {
                    O::FPExt
                } else {
                    O::FPTrunc
                }
            }
            (f, t) if f.is_float() && t.is_int() => {
                let from_ty = x.get_type();
                return self.intrinsic("llvm.fptosi.sat", &[to_ty, from_ty], &[x]);
            }
            _ => return Err(invalid(format!("cast from {from} to {to}"))),
        };
        Ok(self.b.build_cast(op, x, to_ty, "cast")?)
    }

    fn call(&mut self, f: Intr, d: DType, x: V<'ctx>) -> Res<V<'ctx>> {
        let t = x.get_type();
        match f {
            Intr::Abs if d.is_int() => {
                let no_poison = self.cx.bool_type().const_zero().into();
                self.intrinsic("llvm.abs", &[t], &[x, no_poison])
            }
            _ if !d.is_float() => Err(invalid(format!("{} of {d}", f.name()))),
            Intr::Abs => self.intrinsic("llvm.fabs", &[t], &[x]),
            Intr::Exp => match x {
                // LLVM would scalarize `llvm.exp` on vectors into libm calls.
                V::VectorValue(v) if d == DType::F32 => self.vexp_f32(v),
                _ => self.intrinsic("llvm.exp", &[t], &[x]),
            },
            Intr::Log => self.intrinsic("llvm.log", &[t], &[x]),
            Intr::Sqrt => self.intrinsic("llvm.sqrt", &[t], &[x]),
            Intr::Tanh => {
                let name = if d == DType::F32 { "tanhf" } else { "tanh" };
                self.libm_call(name, self.scalar_ty(d), x)
            }
        }
    }

    /// `exp` of an f32 vector without libm: `2^k * p(r)` with `k = round(x / ln 2)`,
    /// `r = x - k ln 2` (ln 2 split in two for exactness) and a degree-6 polynomial for
    /// `e^r` on `|r| <= ln2 / 2` (about 1 ulp in the normal range).
    ///
    /// It is written for few instructions, because softmax and the activations spend most of
    /// their time here (docs/measurements.md, "Softmax one row at a time"), and needs no
    /// select for its special values:
    /// - `x` is clamped to `[-104, 89]` by compare-and-select in the order that returns `x`
    ///   itself when it is NaN (one `vmaxps`/`vminps` each on x86), and NaN then flows
    ///   through the arithmetic to the result.
    /// - At 89 the computed `p * 2^128` rounds to `+inf`, as `e^x` does above `ln(FLT_MAX)`;
    ///   at -104 it is below half the least denormal and rounds to 0.
    /// - On whole 512-bit vectors with AVX-512, `p * 2^k` is one `vscalefps`
    ///   ([`Self::scalef_f32`]), which rounds denormal results and overflows to infinity
    ///   itself.
    /// - Elsewhere `k` is rounded by adding and subtracting `1.5 * 2^23`, whose bits then hold
    ///   `k` as an integer (no float-to-int conversion, which is poison for NaN in LLVM IR),
    ///   and `2^k` is `2^k1 * 2^k2` with `k1 = k >> 1`, `k2 = k - k1`, so that each factor is
    ///   a normal float over the whole clamped range (`k` in `[-150, 128]`) and denormal
    ///   results are rounded once.
    fn vexp_f32(&mut self, x: VectorValue<'ctx>) -> Res<V<'ctx>> {
        use inkwell::values::InstructionOpcode as O;
        let n = x.get_type().get_size();
        let f = |g: &mut Self, c: f32| -> Res<V<'ctx>> {
            Ok(
                g.broadcast(g.cx.f32_type().const_float(c as f64).into(), n)?
                    .into(),
            )
        };
        let i = |g: &mut Self, c: u32| -> Res<V<'ctx>> {
            Ok(
                g.broadcast(g.cx.i32_type().const_int(c as u64, false).into(), n)?
                    .into(),
            )
        };
        let xv: V<'ctx> = x.into();
        let lo = f(self, -104.0)?;
        let hi = f(self, 89.0)?;
        // lo > x ? lo : x, then hi < x ? hi : x: a NaN compares false and is kept.
        let below = self.fcmp(FloatPredicate::OGT, lo, xv)?;
        let xc = self.select(below, lo, xv)?;
        let above = self.fcmp(FloatPredicate::OLT, hi, xc)?;
        let xc = self.select(above, hi, xc)?;
        let log2e = f(self, std::f32::consts::LOG2_E)?;
        let t = self.b.build_binop(O::FMul, xc, log2e, "t")?;
        // `vscalefps` is one instruction for the nine of the integer construction below
        // (softmax 4096 x 4096: docs/measurements.md, "The memory-bound rows after the
        // cheaper exp").
        let scalef = self.host.has_feature("avx512f")
            && self.opts.vector_bits.unwrap_or(self.host.vector_bits) >= 512
            && n.is_multiple_of(16);
        let (km, k) = if scalef {
            let k = self.intrinsic("llvm.roundeven", &[t.get_type()], &[t])?;
            (k, k)
        } else {
            let magic = f(self, 12_582_912.0)?; // 1.5 * 2^23
            let km = self.b.build_binop(O::FAdd, t, magic, "km")?;
            (km, self.b.build_binop(O::FSub, km, magic, "k")?)
        };
        let ln2_hi = f(self, 0.693_359_4)?;
        let ln2_lo = f(self, -2.121_944_4e-4)?;
        // k * ln2_hi is exact: ln2_hi has 9 significant bits and |k| <= 150 at most 8. So
        // an FMA of it gives the same `r` as a multiply and a subtract, in one instruction
        // (both steps are contracted: two FMAs where there were two multiplies and two
        // subtracts; the second rounds once where it rounded twice).
        let r = self.contract(self.b.build_binop(O::FMul, k, ln2_hi, "kh")?);
        let r = self.contract(self.b.build_binop(O::FSub, xc, r, "r")?);
        let kl = self.contract(self.b.build_binop(O::FMul, k, ln2_lo, "kl")?);
        let r = self.contract(self.b.build_binop(O::FSub, r, kl, "r")?);
        // e^r by Horner's rule on a degree-6 polynomial fitted here to the relative error of
        // e^r on |r| <= ln2 / 2 (iteratively reweighted least squares, then rounded to f32):
        // under 0.9 ulp in f32 with FMAs, six FMAs where Cephes' degree-7 form
        // (1 + r + r^2 p5(r)) took eight operations, seven of them on the multiply ports
        // that bound this loop (docs/measurements.md, "A cheaper exp polynomial").
        const C: [f32; 6] = [
            1.384_730_3e-3,
            8.375_050_5e-3,
            4.166_798_3e-2,
            1.666_642e-1,
            4.999_999_4e-1,
            1.0,
        ];
        let mut p = f(self, C[0])?;
        for &c in C[1..].iter().chain(&[1.0]) {
            let m = self.contract(self.b.build_binop(O::FMul, p, r, "p")?);
            let cv = f(self, c)?;
            p = self.contract(self.b.build_binop(O::FAdd, m, cv, "p")?);
        }
        if scalef {
            return self.scalef_f32(p.into_vector_value(), k.into_vector_value());
        }
        let i32v = self.cx.i32_type().vec_type(n);
        let km_bits = self.b.build_bit_cast(km, i32v, "km.bits")?;
        let magic_bits = i(self, 12_582_912f32.to_bits())?;
        // Wrapping integer arithmetic: for a NaN `x` these bits are garbage, but no poison,
        // and the NaN in `p` makes the product NaN whatever the scale.
        let ki = self.b.build_binop(O::Sub, km_bits, magic_bits, "k.i")?;
        let one_i = i(self, 1)?;
        let k1 = self.b.build_binop(O::AShr, ki, one_i, "k1")?;
        let k2 = self.b.build_binop(O::Sub, ki, k1, "k2")?;
        let bias = i(self, 127)?;
        let sh = i(self, 23)?;
        let mut y = p;
        for kk in [k1, k2] {
            let e = self.b.build_binop(O::Add, kk, bias, "e")?;
            let e = self.b.build_binop(O::Shl, e, sh, "e")?;
            let scale = self.b.build_bit_cast(e, x.get_type(), "2^k")?;
            y = self.b.build_binop(O::FMul, y, scale, "exp")?;
        }
        Ok(y)
    }

    /// The type `d` where `x` is a scalar, a vector of `d` with `x`'s lanes where it is one.
    fn same_lanes(&self, x: V<'ctx>, d: BasicTypeEnum<'ctx>) -> Res<BasicTypeEnum<'ctx>> {
        Ok(match x {
            V::VectorValue(v) => d.vec_type_of(v.get_type().get_size())?.into(),
            _ => d,
        })
    }

    /// `c` as a scalar or splat like `x`.
    fn int_like(&mut self, x: V<'ctx>, c: u64) -> Res<V<'ctx>> {
        let c = self.cx.i32_type().const_int(c, false).into();
        self.splat_like(x, c)
    }

    /// The f32 of a bf16 (bits in an i16): its bits shifted into the upper half.
    fn bf16_to_f32(&mut self, x: V<'ctx>) -> Res<V<'ctx>> {
        use inkwell::values::InstructionOpcode as O;
        let i32t = self.same_lanes(x, self.cx.i32_type().into())?;
        let w = self.b.build_cast(O::ZExt, x, i32t, "bfw")?;
        let sixteen = self.int_like(w, 16)?;
        let hi = self.b.build_binop(O::Shl, w, sixteen, "bfhi")?;
        let f32t = self.same_lanes(x, self.cx.f32_type().into())?;
        Ok(self.b.build_cast(O::BitCast, hi, f32t, "bff")?)
    }

    /// The bf16 nearest an f32, ties to even, as `tensortune_schedules::data::f32_to_bf16`
    /// rounds (a NaN becomes a quiet NaN).
    fn f32_to_bf16(&mut self, x: V<'ctx>) -> Res<V<'ctx>> {
        use inkwell::values::InstructionOpcode as O;
        let i32t = self.same_lanes(x, self.cx.i32_type().into())?;
        let bits = self.b.build_cast(O::BitCast, x, i32t, "fbits")?;
        let sixteen = self.int_like(bits, 16)?;
        let one = self.int_like(bits, 1)?;
        let half = self.int_like(bits, 0x7fff)?;
        let kept = self.b.build_binop(O::LShr, bits, sixteen, "kept")?;
        let odd = self.b.build_binop(O::And, kept, one, "odd")?;
        let round = self.b.build_binop(O::Add, half, odd, "round")?;
        let sum = self.b.build_binop(O::Add, bits, round, "rsum")?;
        let rounded = self.b.build_binop(O::LShr, sum, sixteen, "rnd")?;
        let quiet = self.int_like(bits, 0x40)?;
        let nan = self.b.build_binop(O::Or, kept, quiet, "qnan")?;
        let is_nan = self.fcmp(FloatPredicate::UNO, x, x)?;
        let r = self.select(is_nan, nan, rounded)?;
        let i16t = self.same_lanes(x, self.cx.i16_type().into())?;
        Ok(self.b.build_cast(O::Trunc, r, i16t, "bf16")?)
    }

    /// Two bf16 (i16 bits) packed into one i32 word, `lo` in the low half.
    fn pack_bf16(&mut self, lo: V<'ctx>, hi: V<'ctx>) -> Res<V<'ctx>> {
        use inkwell::values::InstructionOpcode as O;
        let (lo, hi) = self.unify(lo, hi)?;
        let i32t = self.same_lanes(lo, self.cx.i32_type().into())?;
        let l = self.b.build_cast(O::ZExt, lo, i32t, "plo")?;
        let h = self.b.build_cast(O::ZExt, hi, i32t, "phi")?;
        let sixteen = self.int_like(h, 16)?;
        let h = self.b.build_binop(O::Shl, h, sixteen, "phis")?;
        Ok(self.b.build_binop(O::Or, l, h, "pair")?)
    }

    /// `acc + lo(x)·lo(y) + hi(x)·hi(y)` of packed bf16 pairs (`acc` 0 when `None`). Whole
    /// vectors of 16, 8 or 4 lanes run AVX-512 BF16's `vdpbf16ps` where the host has it:
    /// one instruction for what takes two FMAs and four unpacking operations otherwise.
    pub(super) fn dot_bf16(
        &mut self,
        acc: Option<V<'ctx>>,
        x: V<'ctx>,
        y: V<'ctx>,
    ) -> Res<V<'ctx>> {
        let (x, y) = self.unify(x, y)?;
        let (x, y, acc) = match acc {
            Some(a) => {
                let (x, a) = self.unify(x, a)?;
                let (y, a) = self.unify(y, a)?;
                let (x, y) = self.unify(x, y)?;
                (x, y, Some(a))
            }
            None => (x, y, None),
        };
        if let (V::VectorValue(xv), V::VectorValue(yv)) = (x, y) {
            let n = xv.get_type().get_size();
            let vl = self.host.has_feature("avx512vl");
            let width = match n {
                _ if !self.host.has_feature("avx512bf16") => None,
                n if n % 16 == 0 => Some(16),
                8 | 4 if vl => Some(n),
                _ => None,
            };
            if let Some(w) = width {
                let acc = match acc {
                    Some(a) => a.into_vector_value(),
                    None => self.cx.f32_type().vec_type(n).const_zero(),
                };
                return self.vdpbf16ps(acc, xv, yv, w);
            }
        }
        // Unpacked: the low half shifted up, the high half masked, two multiply-adds.
        use inkwell::values::InstructionOpcode as O;
        let f32t = self.same_lanes(x, self.cx.f32_type().into())?;
        let sixteen = self.int_like(x, 16)?;
        let mask = self.int_like(x, 0xffff_0000)?;
        let mut halves = Vec::new();
        for w in [x, y] {
            let lo = self.b.build_binop(O::Shl, w, sixteen, "lo")?;
            let hi = self.b.build_binop(O::And, w, mask, "hi")?;
            halves.push(self.b.build_cast(O::BitCast, lo, f32t, "lof")?);
            halves.push(self.b.build_cast(O::BitCast, hi, f32t, "hif")?);
        }
        let lo = self.binop(BinOp::Mul, DType::F32, halves[0], halves[2])?;
        let hi = self.binop(BinOp::Mul, DType::F32, halves[1], halves[3])?;
        let first = match acc {
            Some(a) => self.binop(BinOp::Add, DType::F32, a, lo)?,
            None => lo,
        };
        self.binop(BinOp::Add, DType::F32, first, hi)
    }

    /// `vdpbf16ps` over `acc`'s lanes, `w` (16, 8 or 4) at a time.
    fn vdpbf16ps(
        &mut self,
        acc: VectorValue<'ctx>,
        x: VectorValue<'ctx>,
        y: VectorValue<'ctx>,
        w: u32,
    ) -> Res<V<'ctx>> {
        use inkwell::values::InstructionOpcode as O;
        let n = acc.get_type().get_size();
        let name = match w {
            16 => "llvm.x86.avx512bf16.dpbf16ps.512",
            8 => "llvm.x86.avx512bf16.dpbf16ps.256",
            _ => "llvm.x86.avx512bf16.dpbf16ps.128",
        };
        let pairs = self.cx.bf16_type().vec_type(2 * w);
        let mut parts = Vec::new();
        for at in (0..n).step_by(w as usize) {
            let a = self.lane_chunk(acc, at, w)?;
            let (xc, yc) = (self.lane_chunk(x, at, w)?, self.lane_chunk(y, at, w)?);
            let p = self.b.build_cast(O::BitCast, xc, pairs, "bfp")?;
            let q = self.b.build_cast(O::BitCast, yc, pairs, "bfq")?;
            let r = self.intrinsic(name, &[], &[a.into(), p, q])?;
            parts.push(r.into_vector_value());
        }
        Ok(self.concat_all(parts, "a dot product")?.into())
    }

    /// Lanes `at..at + w` of `v` (`v` itself where it has `w` lanes).
    fn lane_chunk(&mut self, v: VectorValue<'ctx>, at: u32, w: u32) -> Res<VectorValue<'ctx>> {
        if v.get_type().get_size() == w {
            return Ok(v);
        }
        let i32t = self.cx.i32_type();
        let idx: Vec<_> = (at..at + w)
            .map(|l| i32t.const_int(l as u64, false))
            .collect();
        let mask = VectorType::const_vector(&idx);
        Ok(self
            .b
            .build_shuffle_vector(v, v.get_type().get_undef(), mask, "chunk")?)
    }

    /// The lanes of `parts`, one after another (`what` names the value for the error of
    /// no parts at all).
    fn concat_all(&mut self, parts: Vec<VectorValue<'ctx>>, what: &str) -> Res<VectorValue<'ctx>> {
        let mut parts = parts.into_iter();
        let mut r = parts
            .next()
            .ok_or_else(|| invalid(format!("{what} of an empty vector")))?;
        for part in parts {
            r = self.concat(r, part)?;
        }
        Ok(r)
    }

    /// `p * 2^floor(k)` lane by lane with AVX-512's `vscalefps`, 16 lanes at a time (`p` and
    /// `k` have a multiple of 16 lanes; `k` holds integers).
    fn scalef_f32(&mut self, p: VectorValue<'ctx>, k: VectorValue<'ctx>) -> Res<V<'ctx>> {
        let n = p.get_type().get_size();
        let i32t = self.cx.i32_type();
        let all = self.cx.i16_type().const_all_ones().into();
        // _MM_FROUND_CUR_DIRECTION: the rounding mode of MXCSR (to nearest).
        let rounding = i32t.const_int(4, false).into();
        let mut parts = Vec::new();
        for at in (0..n).step_by(16) {
            let (pc, kc) = (self.lane_chunk(p, at, 16)?, self.lane_chunk(k, at, 16)?);
            let y = self.intrinsic(
                "llvm.x86.avx512.mask.scalef.ps.512",
                &[],
                &[pc.into(), kc.into(), pc.into(), all, rounding],
            )?;
            parts.push(y.into_vector_value());
        }
        Ok(self.concat_all(parts, "exp")?.into())
    }

    /// The lanes of `a` followed by those of `b` (`b` no wider than `a`).
    fn concat(&mut self, a: VectorValue<'ctx>, b: VectorValue<'ctx>) -> Res<VectorValue<'ctx>> {
        let i32t = self.cx.i32_type();
        let (m, k) = (a.get_type().get_size(), b.get_type().get_size());
        let consts = |r: std::ops::Range<u32>| -> Vec<_> {
            r.map(|l| i32t.const_int(l as u64, false)).collect()
        };
        // Shuffles take operands of one type: b widened to a's lanes (the rest undefined).
        let b = if k == m {
            b
        } else {
            let mut idx = consts(0..k);
            idx.extend((k..m).map(|_| i32t.get_undef()));
            let mask = VectorType::const_vector(&idx);
            self.b
                .build_shuffle_vector(b, b.get_type().get_undef(), mask, "widen")?
        };
        let mask = VectorType::const_vector(&consts(0..m + k));
        Ok(self.b.build_shuffle_vector(a, b, mask, "concat")?)
    }

    /// Calls a one-argument C math function, lane by lane for vectors.
    fn libm_call(&mut self, name: &str, ty: BasicTypeEnum<'ctx>, x: V<'ctx>) -> Res<V<'ctx>> {
        let f = match self.module.get_function(name) {
            Some(f) => f,
            None => {
                let fn_ty = ty.fn_type(&[ty.into()], false);
                self.module
                    .add_function(name, fn_ty, Some(inkwell::module::Linkage::External))
            }
        };
        match x {
            V::VectorValue(v) => {
                let n = v.get_type().get_size();
                let mut out = v.get_type().get_undef();
                for l in 0..n {
                    let li = self.cx.i32_type().const_int(l as u64, false);
                    let e = self.b.build_extract_element(v, li, "lane")?;
                    let r = self.b.build_call(f, &[e.into()], name)?;
                    let r = self.basic(r)?;
                    out = self.b.build_insert_element(out, r, li, "lanes")?;
                }
                Ok(out.into())
            }
            _ => {
                let r = self.b.build_call(f, &[x.into()], name)?;
                self.basic(r)
            }
        }
    }

    /// Calls an overloaded LLVM intrinsic.
    pub(super) fn intrinsic(
        &mut self,
        name: &str,
        overloads: &[BasicTypeEnum<'ctx>],
        args: &[V<'ctx>],
    ) -> Res<V<'ctx>> {
        let i = Intrinsic::find(name)
            .ok_or_else(|| CodegenError::Llvm(format!("no intrinsic {name}")))?;
        let f = i
            .get_declaration(self.module, overloads)
            .ok_or_else(|| CodegenError::Llvm(format!("cannot declare {name}")))?;
        let args: Vec<BasicMetadataValueEnum> = args.iter().map(|a| (*a).into()).collect();
        let c = self.b.build_call(f, &args, "call")?;
        match c.try_as_basic_value() {
            inkwell::values::ValueKind::Basic(v) => Ok(v),
            // Void intrinsics (masked stores) return a placeholder the caller ignores.
            _ => Ok(self.cx.bool_type().const_zero().into()),
        }
    }
}

/// Small conversions inkwell leaves out.
pub(super) trait TypeExt<'ctx> {
    /// `<n x self>`.
    fn vec_type_of(self, n: u32) -> Res<inkwell::types::VectorType<'ctx>>;
}

impl<'ctx> TypeExt<'ctx> for BasicTypeEnum<'ctx> {
    fn vec_type_of(self, n: u32) -> Res<inkwell::types::VectorType<'ctx>> {
        Ok(match self {
            BasicTypeEnum::IntType(t) => t.vec_type(n),
            BasicTypeEnum::FloatType(t) => t.vec_type(n),
            BasicTypeEnum::PointerType(t) => t.vec_type(n),
            _ => return Err(invalid("vector of a non-scalar type".into())),
        })
    }
}

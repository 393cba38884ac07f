//! Vectorized loops: which bodies may run as SIMD lanes, and their memory accesses.
//!
//! A `Vectorized` loop of `N` iterations runs its body once on `<N x T>` values, the loop
//! variable being the vector `<0, 1, ..., N-1>`. That equals the serial loop when no lane reads
//! what another lane writes. [`can_vectorize`] accepts a body when every store index is affine
//! in the variable with a non-zero constant stride (lanes write distinct elements), all stores
//! to one buffer use one index, and every load of a stored buffer uses that same index (a lane
//! reads only its own element). A reduction over the vectorized axis (`C[i] = C[i] + A[i, v]`)
//! fails the test and is compiled as a serial loop.
//!
//! Accesses, by the stride `s` of their index in the variable ([`stride_of`]):
//! - `s = 1`: one vector load or store at the lane-0 address (masked under a varying `If`);
//! - `s = 0`: one scalar load, broadcast where mixed with vectors;
//! - otherwise, or not affine: a gather (loads) or scatter (stores) of lane addresses.
//!
//! Under a condition that varies across lanes the active lanes form a mask: vector loads and
//! stores are masked (inactive lanes' addresses may be out of bounds), and scalar loads run
//! only if some lane is active.
//!
//! **Register-wide chunks.** A loop of more lanes than a register holds whose count is not a
//! power of two (48 f32 lanes on AVX-512) and that is not widened runs as chunks of one
//! register each, then one of the rest: the body once per chunk, lane 0 of chunk `c` being
//! iteration `c * R`. Lanes touch only their own elements of what the body stores (the test
//! above), so chunk after chunk computes what all lanes at once do. LLVM otherwise keeps
//! `<48 x float>` values, and where one becomes a loop-carried accumulator (an update whose
//! load and store GVN turns into a phi) instruction selection takes it apart element by
//! element through the stack (docs/measurements.md, "Vectors wider than a register").
//!
//! **Widened loops.** On AVX-512 a loop of a non-power-of-two lane count `N` (a register tile
//! of 14 columns) runs on `W = N.next_power_of_two()` lanes with the first `N` active
//! ([`Gen::can_widen`]): accesses to main memory, gathers and scatters are masked, and an
//! access to a local temporary covering one whole row, which lowering padded to `W` elements
//! ([`tensortune_schedules::ir::BufferDecl::row_pad`]), is a plain `W`-lane load or store, so
//! LLVM still keeps the tile in registers. Exact `<14 x float>` values, which LLVM takes apart
//! into pieces of 8, 4 and 2 lanes, then never appear: on a conv2d program with a 4x4 tile of
//! 14 columns (one AVX-512 EPYC core) instruction selection went from 6.2 to 3.8 ms and the
//! whole compile from 49.5 to 44 ms.

use super::expr::TypeExt;
use super::gen::{Gen, Res};
use crate::codegen::CodegenError;
use inkwell::llvm_sys;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{
    AsValueRef, BasicValue, BasicValueEnum, IntValue, PointerValue, VectorValue,
};
use inkwell::AddressSpace;
use std::collections::HashMap;
use tensortune_schedules::expr::BinOp;
use tensortune_schedules::ir::Stmt;
use tensortune_schedules::{BufId, DType, Expr};

type V<'ctx> = BasicValueEnum<'ctx>;

/// The constant stride of `e` in variable `v` ([`Expr::stride_in`]).
pub(super) fn stride_of(e: &Expr, v: u32) -> Option<i64> {
    e.stride_in(v)
}

/// True if `body` of a vectorized loop over `v` may run as SIMD lanes (see the module doc).
pub(super) fn can_vectorize(body: &Stmt, v: u32) -> bool {
    let mut ok = true;
    let mut stores: HashMap<BufId, Expr> = HashMap::new();
    body.visit(&mut |s| match s {
        Stmt::For { .. } | Stmt::Allocate { .. } | Stmt::Sync | Stmt::Shuffle { .. } => ok = false,
        Stmt::Store { buf, index, .. } => {
            if !matches!(stride_of(index, v), Some(s) if s != 0) {
                ok = false;
            }
            if let Some(prev) = stores.insert(*buf, index.clone()) {
                ok &= &prev == index;
            }
        }
        _ => {}
    });
    if !ok {
        return false;
    }
    let mut check = |e: &Expr| {
        e.visit(&mut |x| {
            if let Expr::BufLoad { buf, index, .. } = x {
                if let Some(st) = stores.get(buf) {
                    ok &= st == &**index;
                }
            }
        })
    };
    body.visit(&mut |s| match s {
        Stmt::Store { index, value, .. } => {
            check(index);
            check(value);
        }
        Stmt::If { cond, .. } => check(cond),
        _ => {}
    });
    ok
}

impl<'ctx> Gen<'ctx, '_> {
    /// True if a vectorized loop of `lanes` iterations over `v` with this body runs widened (see
    /// the module doc): `lanes` is not a power of two, the host has AVX-512 masks for every
    /// width, every buffer accessed has elements of 4 or 8 bytes, no integer division has a
    /// divisor other than a constant (an inactive lane could divide by zero), and every
    /// contiguous access to a local temporary is a [whole padded row](Self::whole_row).
    pub(super) fn can_widen(&self, body: &Stmt, v: u32, lanes: u32) -> Res<bool> {
        let width = lanes.next_power_of_two();
        if !self.opts.padded_vectors
            || !self.opts.widen_lanes
            || lanes.is_power_of_two()
            || width as i64 > self.opts.max_vector_lanes
            || !self.host.has_feature("avx512f")
            || !self.host.has_feature("avx512vl")
        {
            return Ok(false);
        }
        let mut accesses: Vec<(BufId, Expr)> = Vec::new();
        let mut divides = false;
        let mut scan = |e: &Expr, accesses: &mut Vec<(BufId, Expr)>| {
            e.visit(&mut |x| match x {
                Expr::BufLoad { buf, index, .. } => accesses.push((*buf, (**index).clone())),
                Expr::Bin(BinOp::Div | BinOp::Mod, a, b)
                    if a.dtype().is_int() && b.as_int().is_none() =>
                {
                    divides = true
                }
                _ => {}
            })
        };
        body.visit(&mut |st| match st {
            Stmt::Store { buf, index, value } => {
                accesses.push((*buf, index.clone()));
                scan(index, &mut accesses);
                scan(value, &mut accesses);
            }
            Stmt::If { cond, .. } => scan(cond, &mut accesses),
            _ => {}
        });
        if divides {
            return Ok(false);
        }
        for (buf, index) in &accesses {
            let d = self.decl(*buf)?;
            if !matches!(self.mem_bytes(d.dtype), 4 | 8) {
                return Ok(false);
            }
            let local = d.scope != tensortune_schedules::ir::Scope::Global;
            if local && stride_of(index, v) == Some(1) && !self.whole_row(*buf, index, v, lanes)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// True if the contiguous access `buf[index]` over the `lanes` iterations of `v` is exactly
    /// one row of a padded local temporary: rows of `lanes` elements padded to the next power
    /// of two, and `index` at `v = 0` a multiple of that row length. A full-width access then
    /// only touches the row's padding beyond its `lanes` elements.
    fn whole_row(&self, buf: BufId, index: &Expr, v: u32, lanes: u32) -> Res<bool> {
        let d = self.decl(buf)?;
        let width = lanes.next_power_of_two() as i64;
        Ok(d.row_pad > 0
            && d.shape.last() == Some(&width)
            && d.row_len() == lanes as i64
            && stride_of(index, v) == Some(1)
            && tensortune_schedules::lanes::divisor(index, v) % width == 0)
    }

    /// [`Self::whole_row`] for an access in the current loop, if it is widened.
    fn whole_row_here(
        &self,
        buf: BufId,
        index: &Expr,
        ctx: &super::gen::VecCtx<'ctx>,
    ) -> Res<bool> {
        Ok(ctx.tail.is_some() && self.whole_row(buf, index, ctx.var, ctx.active)?)
    }

    /// The mask accesses need: none where the only inactive lanes are a widened loop's padding
    /// lanes and the access is [`Self::whole_row`] (or loads one uniform value).
    fn row_mask(&self, ctx: &super::gen::VecCtx<'ctx>) -> Option<VectorValue<'ctx>> {
        if ctx.tail.is_some() && ctx.mask == ctx.tail {
            None
        } else {
            ctx.mask
        }
    }

    fn vctx(&self) -> Res<super::gen::VecCtx<'ctx>> {
        self.vec
            .ok_or_else(|| CodegenError::Llvm("vector access outside a vectorized loop".into()))
    }

    pub(super) fn set_mask(&mut self, m: Option<VectorValue<'ctx>>) {
        if let Some(v) = self.vec.as_mut() {
            v.mask = m;
        }
    }

    /// `outer & m` (just `m` when all lanes were active).
    pub(super) fn and_mask(
        &mut self,
        outer: Option<VectorValue<'ctx>>,
        m: VectorValue<'ctx>,
    ) -> Res<VectorValue<'ctx>> {
        match outer {
            None => Ok(m),
            Some(o) => Ok(self.b.build_and(o, m, "mask")?),
        }
    }

    pub(super) fn not_mask(&mut self, m: VectorValue<'ctx>) -> Res<VectorValue<'ctx>> {
        let n = m.get_type().get_size();
        let ones = self.broadcast(self.cx.bool_type().const_all_ones().into(), n)?;
        Ok(self.b.build_xor(m, ones, "not")?)
    }

    fn any_lane(&mut self, m: VectorValue<'ctx>) -> Res<IntValue<'ctx>> {
        let r = self.intrinsic("llvm.vector.reduce.or", &[m.get_type().into()], &[m.into()])?;
        Ok(r.into_int_value())
    }

    /// Evaluates `e` as a scalar with the vectorized variable at lane 0's iteration.
    pub(super) fn at_lane0(&mut self, e: &Expr) -> Res<IntValue<'ctx>> {
        let ctx = self.vctx()?;
        let i = ctx.var as usize;
        let saved = self.vars[i];
        self.vars[i] = Some(self.cx.i64_type().const_int(ctx.lane0 as u64, true).into());
        self.vec = None;
        let r = self.index(e);
        self.vec = Some(ctx);
        self.vars[i] = saved;
        r
    }

    /// Lane addresses `&buf[index[l]]` as `<lanes x ptr>`.
    fn lane_ptrs(&mut self, buf: BufId, index: &Expr) -> Res<VectorValue<'ctx>> {
        let ctx = self.vctx()?;
        let base = self.buf_ptr(buf)?;
        let elem = self.mem_ty(self.decl(buf)?.dtype);
        let idx = self.expr(index)?;
        let idx = match idx {
            BasicValueEnum::IntValue(i) if i.get_type().get_bit_width() != 64 => self
                .b
                .build_int_s_extend(i, self.cx.i64_type(), "idx")?
                .into(),
            BasicValueEnum::VectorValue(v)
                if v.get_type()
                    .get_element_type()
                    .into_int_type()
                    .get_bit_width()
                    != 64 =>
            {
                let t = self.cx.i64_type().vec_type(ctx.lanes);
                self.b.build_int_s_extend(v, t, "idx")?.into()
            }
            x => x,
        };
        let idx = self.broadcast(idx, ctx.lanes)?;
        // inkwell's GEP takes scalar indices only; a vector index gives a vector of pointers.
        let name = c"lanes.p";
        // SAFETY: valid builder, element type, base pointer and index values of this context.
        let raw = unsafe {
            let mut ix = [idx.as_value_ref()];
            llvm_sys::core::LLVMBuildInBoundsGEP2(
                self.b.as_mut_ptr(),
                inkwell::types::AsTypeRef::as_type_ref(&elem),
                base.as_value_ref(),
                ix.as_mut_ptr(),
                1,
                name.as_ptr(),
            )
        };
        // SAFETY: a GEP with a vector index has a vector-of-pointers type.
        Ok(unsafe { VectorValue::new(raw) })
    }

    fn all_true(&mut self, lanes: u32) -> Res<VectorValue<'ctx>> {
        self.broadcast(self.cx.bool_type().const_all_ones().into(), lanes)
    }

    pub(super) fn vload(&mut self, buf: BufId, dtype: DType, index: &Expr) -> Res<V<'ctx>> {
        let ctx = self.vctx()?;
        let elem = self.mem_ty(dtype);
        let align = self.cx.i32_type().const_int(self.mem_bytes(dtype), false);
        let vty = elem.vec_type_of(ctx.lanes)?;
        let v = match stride_of(index, ctx.var) {
            // Lane 0 is always an iteration, so a widened loop's padding lanes do not make a
            // uniform load conditional.
            Some(0) => return self.uniform_load(buf, dtype, index, self.row_mask(&ctx)),
            Some(1) => {
                let base = self.at_lane0(index)?;
                let p = self.gep(buf, elem, base)?;
                let mask = if self.whole_row_here(buf, index, &ctx)? {
                    self.row_mask(&ctx)
                } else {
                    ctx.mask
                };
                match mask {
                    None if self.pads_lanes(buf, dtype, ctx.lanes)? => {
                        self.padded_load(p, elem, dtype, ctx.lanes)?
                    }
                    None => {
                        let v = self.b.build_load(vty, p, "vld")?;
                        if let Some(i) = v.as_instruction_value() {
                            i.set_alignment(self.mem_bytes(dtype) as u32)
                                .map_err(|e| CodegenError::Llvm(e.to_string()))?;
                        }
                        v
                    }
                    Some(m) => self.masked_load(vty, p, dtype, m)?.into(),
                }
            }
            _ => {
                let ptrs = self.lane_ptrs(buf, index)?;
                let m = match ctx.mask {
                    Some(m) => m,
                    None => self.all_true(ctx.lanes)?,
                };
                let zero = vty.const_zero().into();
                self.intrinsic(
                    "llvm.masked.gather",
                    &[vty.into(), ptrs.get_type().into()],
                    &[ptrs.into(), align.into(), m.into(), zero],
                )?
            }
        };
        self.loaded_value(v, dtype)
    }

    /// `buf[i0]` and `buf[i0 + 1]`, two adjacent bf16 that a vectorized loop gathers (`i0`
    /// moves by other than 0 or 2 a lane), as one gather of the 32-bit words they are in
    /// memory (the first in the low half on a little-endian host, as `pack_bf16` puts it).
    /// Gathered as halves (a dense layer's `W[j, 2k]` along `j`), they are two gathers of
    /// 16-bit elements, which AVX-512 lacks and LLVM splits into a load per lane.
    /// `None` elsewhere: scalar and contiguous halves LLVM already combines, and a word
    /// loaded there instead changed its unrolling and cost a matmul's register tile its
    /// accumulators (docs/measurements.md, "bf16 inputs with f32 accumulation").
    pub(super) fn pair_gather(&mut self, buf: BufId, i0: &Expr) -> Res<Option<V<'ctx>>> {
        let Some(ctx) = self.vec else {
            return Ok(None);
        };
        if matches!(stride_of(i0, ctx.var), Some(0) | Some(2)) {
            return Ok(None);
        }
        let i32t = self.cx.i32_type();
        let vty = i32t.vec_type(ctx.lanes);
        let ptrs = self.lane_ptrs(buf, i0)?;
        let m = match ctx.mask {
            Some(m) => m,
            None => self.all_true(ctx.lanes)?,
        };
        // Two-byte aligned: a pair starts at any bf16.
        let align = i32t.const_int(2, false);
        Ok(Some(self.intrinsic(
            "llvm.masked.gather",
            &[vty.into(), ptrs.get_type().into()],
            &[ptrs.into(), align.into(), m.into(), vty.const_zero().into()],
        )?))
    }

    /// True if an unmasked contiguous access of `lanes` elements of `buf` should be one masked
    /// access of `W = lanes.next_power_of_two()` lanes instead of an exact one: `lanes` is not
    /// a power of two, the host has AVX-512 masks, the elements are 4 or 8
    /// bytes, and `buf` is in main memory. LLVM splits an exact `<14 x float>` load into three
    /// loads and two inserts (and instruction selection spends its time doing so), where one
    /// masked load does. Stack temporaries keep exact accesses: LLVM keeps those in
    /// registers across loops (register tiles), which it cannot do for masked accesses.
    fn pads_lanes(&self, buf: BufId, dtype: DType, lanes: u32) -> Res<bool> {
        Ok(self.opts.padded_vectors
            && !lanes.is_power_of_two()
            && matches!(self.mem_bytes(dtype), 4 | 8)
            && self.decl(buf)?.scope == tensortune_schedules::ir::Scope::Global
            && self.host.has_feature("avx512f")
            && self.host.has_feature("avx512vl"))
    }

    /// Whether a contiguous unmasked store of `lanes` to `buf` is non-temporal: the buffer
    /// streams ([`super::gen::Gen::streaming`]) and the vector is whole 64-byte lines, or
    /// a half or a quarter of one (SSE's and AVX's non-temporal stores: consecutive ones
    /// fill a line in the core's write-combining buffer, as one whole-line store does).
    /// (docs/measurements.md, "Softmax's next row prefetched": what they gain.)
    fn streams(&self, buf: BufId, dtype: DType, lanes: u32) -> bool {
        let bytes = lanes as u64 * self.mem_bytes(dtype);
        self.streaming.get(buf.0 as usize).copied().unwrap_or(false)
            && (bytes.is_multiple_of(64) || bytes == 16 || bytes == 32)
    }

    /// Stores `v` at `p` non-temporally when `p` is aligned to the vector's size, at most 64
    /// bytes (the instruction faults otherwise), else as an ordinary store. The branch goes
    /// the same way at every store of a row of aligned lines, so it is predicted.
    fn streaming_store(
        &mut self,
        p: PointerValue<'ctx>,
        v: VectorValue<'ctx>,
        dtype: DType,
    ) -> Res<()> {
        let align = (v.get_type().get_size() as u64 * self.mem_bytes(dtype)).clamp(1, 64);
        let i64t = self.cx.i64_type();
        let addr = self.b.build_ptr_to_int(p, i64t, "addr")?;
        let low = self
            .b
            .build_and(addr, i64t.const_int(align - 1, false), "addr.low")?;
        let aligned = self.b.build_int_compare(
            inkwell::IntPredicate::EQ,
            low,
            i64t.const_zero(),
            "aligned",
        )?;
        let nt = self.new_block("store.nt");
        let plain = self.new_block("store.plain");
        let done = self.new_block("store.done");
        self.b.build_conditional_branch(aligned, nt, plain)?;
        self.b.position_at_end(nt);
        let st = self.b.build_store(p, v)?;
        st.set_alignment(align as u32)
            .map_err(|e| CodegenError::Llvm(e.to_string()))?;
        let one = self.cx.i32_type().const_int(1, false);
        let node = self.cx.metadata_node(&[one.into()]);
        let kind = self.cx.get_kind_id("nontemporal");
        st.set_metadata(node, kind)
            .map_err(|e| CodegenError::Llvm(e.to_string()))?;
        self.b.build_unconditional_branch(done)?;
        self.b.position_at_end(plain);
        let st = self.b.build_store(p, v)?;
        st.set_alignment(self.mem_bytes(dtype) as u32)
            .map_err(|e| CodegenError::Llvm(e.to_string()))?;
        self.b.build_unconditional_branch(done)?;
        self.b.position_at_end(done);
        Ok(())
    }

    /// `llvm.masked.load` of a `vty` at `p` under `mask` (inactive lanes zero).
    fn masked_load(
        &mut self,
        vty: inkwell::types::VectorType<'ctx>,
        p: PointerValue<'ctx>,
        dtype: DType,
        mask: VectorValue<'ctx>,
    ) -> Res<VectorValue<'ctx>> {
        let align = self.cx.i32_type().const_int(self.mem_bytes(dtype), false);
        let ptr_ty = self.cx.ptr_type(AddressSpace::default()).into();
        let zero = vty.const_zero().into();
        Ok(self
            .intrinsic(
                "llvm.masked.load",
                &[vty.into(), ptr_ty],
                &[p.into(), align.into(), mask.into(), zero],
            )?
            .into_vector_value())
    }

    /// `llvm.masked.store` of `v` at `p` under `mask`.
    fn masked_store(
        &mut self,
        v: VectorValue<'ctx>,
        p: PointerValue<'ctx>,
        dtype: DType,
        mask: VectorValue<'ctx>,
    ) -> Res<()> {
        let align = self.cx.i32_type().const_int(self.mem_bytes(dtype), false);
        let ptr_ty = self.cx.ptr_type(AddressSpace::default()).into();
        self.intrinsic(
            "llvm.masked.store",
            &[v.get_type().into(), ptr_ty],
            &[v.into(), p.into(), align.into(), mask.into()],
        )?;
        Ok(())
    }

    /// `<W x i1>` with the first `lanes` lanes set.
    pub(super) fn lane_prefix_mask(&self, lanes: u32, w: u32) -> VectorValue<'ctx> {
        let b = self.cx.bool_type();
        let bits: Vec<IntValue> = (0..w)
            .map(|l| b.const_int((l < lanes) as u64, false))
            .collect();
        inkwell::types::VectorType::const_vector(&bits)
    }

    /// Shuffle indices `0..lanes`, padded with undefined lanes to `to` lanes.
    fn prefix_indices(&self, lanes: u32, to: u32) -> VectorValue<'ctx> {
        let i32t = self.cx.i32_type();
        let ix: Vec<IntValue> = (0..to)
            .map(|l| {
                if l < lanes {
                    i32t.const_int(l as u64, false)
                } else {
                    i32t.get_undef()
                }
            })
            .collect();
        inkwell::types::VectorType::const_vector(&ix)
    }

    /// `<lanes x T>` from `p` as one masked `<W x T>` load (see [`Self::pads_lanes`]).
    fn padded_load(
        &mut self,
        p: PointerValue<'ctx>,
        elem: BasicTypeEnum<'ctx>,
        dtype: DType,
        lanes: u32,
    ) -> Res<V<'ctx>> {
        let w = lanes.next_power_of_two();
        let wty = elem.vec_type_of(w)?;
        let mask = self.lane_prefix_mask(lanes, w);
        let wide = self.masked_load(wty, p, dtype, mask)?;
        let ix = self.prefix_indices(lanes, lanes);
        Ok(self
            .b
            .build_shuffle_vector(wide, wty.get_undef(), ix, "vld")?
            .into())
    }

    /// Stores `<lanes x T>` at `p` as one masked `<W x T>` store (see [`Self::pads_lanes`]).
    fn padded_store(
        &mut self,
        p: PointerValue<'ctx>,
        v: VectorValue<'ctx>,
        dtype: DType,
    ) -> Res<()> {
        let lanes = v.get_type().get_size();
        let w = lanes.next_power_of_two();
        let ix = self.prefix_indices(lanes, w);
        let wide = self
            .b
            .build_shuffle_vector(v, v.get_type().get_undef(), ix, "vst")?;
        let mask = self.lane_prefix_mask(lanes, w);
        self.masked_store(wide, p, dtype, mask)
    }

    fn gep(
        &mut self,
        buf: BufId,
        elem: BasicTypeEnum<'ctx>,
        idx: IntValue<'ctx>,
    ) -> Res<PointerValue<'ctx>> {
        let base = self.buf_ptr(buf)?;
        // SAFETY: (for LLVM) in bounds for the active lanes by the IR's invariant.
        Ok(unsafe { self.b.build_in_bounds_gep(elem, base, &[idx], "vp")? })
    }

    /// A loop-invariant load; under a mask, only when some lane is active (else zero).
    fn uniform_load(
        &mut self,
        buf: BufId,
        dtype: DType,
        index: &Expr,
        mask: Option<VectorValue<'ctx>>,
    ) -> Res<V<'ctx>> {
        let elem = self.mem_ty(dtype);
        let load = |g: &mut Self| -> Res<V<'ctx>> {
            let i = g.at_lane0(index)?;
            let p = g.gep(buf, elem, i)?;
            let v = g.b.build_load(elem, p, "uld")?;
            if let Some(i) = v.as_instruction_value() {
                i.set_alignment(g.mem_bytes(dtype) as u32)
                    .map_err(|e| CodegenError::Llvm(e.to_string()))?;
            }
            g.loaded_value(v, dtype)
        };
        let Some(m) = mask else {
            return load(self);
        };
        let any = self.any_lane(m)?;
        let pre = self.current_block()?;
        let ld = self.new_block("uld");
        let merge = self.new_block("uld.end");
        self.b.build_conditional_branch(any, ld, merge)?;
        self.b.position_at_end(ld);
        let v = load(self)?;
        let ld_end = self.current_block()?;
        self.b.build_unconditional_branch(merge)?;
        self.b.position_at_end(merge);
        let phi = self.b.build_phi(v.get_type(), "uld")?;
        phi.add_incoming(&[(&v, ld_end), (&v.get_type().const_zero(), pre)]);
        Ok(phi.as_basic_value())
    }

    pub(super) fn vstore(&mut self, buf: BufId, index: &Expr, value: &Expr) -> Res<()> {
        let ctx = self.vctx()?;
        let dtype = self.decl(buf)?.dtype;
        if value.dtype() != dtype {
            return Err(CodegenError::InvalidIr(format!(
                "store of {} into a {dtype} buffer",
                value.dtype()
            )));
        }
        let v = self.store_value(buf, index, value)?;
        let v = self.broadcast(v, ctx.lanes)?;
        let v = self.storable_value(v.into(), dtype)?.into_vector_value();
        let elem = self.mem_ty(dtype);
        let align = self.cx.i32_type().const_int(self.mem_bytes(dtype), false);
        match stride_of(index, ctx.var) {
            Some(1) => {
                let base = self.at_lane0(index)?;
                let p = self.gep(buf, elem, base)?;
                let mask = if self.whole_row_here(buf, index, &ctx)? {
                    self.row_mask(&ctx)
                } else {
                    ctx.mask
                };
                match mask {
                    None if self.pads_lanes(buf, dtype, ctx.lanes)? => {
                        self.padded_store(p, v, dtype)?;
                    }
                    None if self.streams(buf, dtype, ctx.lanes) => {
                        self.streaming_store(p, v, dtype)?;
                    }
                    None => {
                        let st = self.b.build_store(p, v)?;
                        st.set_alignment(self.mem_bytes(dtype) as u32)
                            .map_err(|e| CodegenError::Llvm(e.to_string()))?;
                    }
                    Some(m) => self.masked_store(v, p, dtype, m)?,
                }
                Ok(())
            }
            Some(s) if s != 0 => {
                let ptrs = self.lane_ptrs(buf, index)?;
                let m = match ctx.mask {
                    Some(m) => m,
                    None => self.all_true(ctx.lanes)?,
                };
                self.intrinsic(
                    "llvm.masked.scatter",
                    &[v.get_type().into(), ptrs.get_type().into()],
                    &[v.into(), ptrs.into(), align.into(), m.into()],
                )?;
                Ok(())
            }
            _ => Err(CodegenError::InvalidIr(format!(
                "store index `{index}` in a vectorized loop does not give each lane its own element"
            ))),
        }
    }

    /// `If` inside a vectorized loop: a branch when the condition is the same for all lanes,
    /// otherwise both sides under masks (each skipped when no lane takes it).
    pub(super) fn vif(&mut self, cond: &Expr, then: &Stmt, otherwise: Option<&Stmt>) -> Res<()> {
        let ctx = self.vctx()?;
        let c = self.expr(cond)?;
        let cm = match c {
            BasicValueEnum::IntValue(ci) => {
                let then_bb = self.new_block("vthen");
                let merge = self.new_block("vendif");
                let else_bb = if otherwise.is_some() {
                    self.new_block("velse")
                } else {
                    merge
                };
                self.b.build_conditional_branch(ci, then_bb, else_bb)?;
                self.b.position_at_end(then_bb);
                self.stmt(then)?;
                self.b.build_unconditional_branch(merge)?;
                if let Some(o) = otherwise {
                    self.b.position_at_end(else_bb);
                    self.stmt(o)?;
                    self.b.build_unconditional_branch(merge)?;
                }
                self.b.position_at_end(merge);
                return Ok(());
            }
            BasicValueEnum::VectorValue(v) => v,
            _ => {
                return Err(CodegenError::InvalidIr(format!(
                    "condition `{cond}` is not a bool"
                )))
            }
        };
        let mut sides = vec![(self.and_mask(ctx.mask, cm)?, then)];
        if let Some(o) = otherwise {
            let nc = self.not_mask(cm)?;
            sides.push((self.and_mask(ctx.mask, nc)?, o));
        }
        for (m, body) in sides {
            let any = self.any_lane(m)?;
            let run = self.new_block("vmasked");
            let done = self.new_block("vmasked.end");
            self.b.build_conditional_branch(any, run, done)?;
            self.b.position_at_end(run);
            self.set_mask(Some(m));
            let r = self.stmt(body);
            self.set_mask(ctx.mask);
            r?;
            self.b.build_unconditional_branch(done)?;
            self.b.position_at_end(done);
        }
        Ok(())
    }
}

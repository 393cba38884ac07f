//! Statements: the kernel's entry points, loops (serial, unrolled, parallel, vectorized),
//! allocations, conditionals and scalar stores.
//!
//! Parallel loops are outlined in two functions: a *body* that takes every buffer pointer it
//! uses as a `noalias align 64` parameter (so alias analysis inside it is as good as in the
//! kernel), every enclosing loop variable, the runtime table and an iteration range; and a
//! *trampoline* of the ABI's `body(closure, begin, end)` type that unpacks a closure struct
//! the caller filled on its stack and calls the body (O3 inlines the one into the other,
//! turning `noalias` into scoped alias metadata).

use super::super::{CodegenError, CodegenOptions, HostTarget};
use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::basic_block::BasicBlock;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::types::{BasicMetadataTypeEnum, BasicType, BasicTypeEnum, StructType};
use inkwell::values::{
    BasicMetadataValueEnum, BasicValueEnum, FunctionValue, IntValue, PointerValue, VectorValue,
};
use inkwell::AddressSpace;
use inkwell::IntPredicate;
use tensortune_schedules::expr::BinOp;
use tensortune_schedules::ir::{BufKind, Fold, ForKind, LoweredFunc, PrefetchLevel, Stmt};
use tensortune_schedules::{BufId, DType, Expr, Var};

pub(super) type Res<T> = Result<T, CodegenError>;

/// The function being emitted (the kernel or an outlined body).
#[derive(Clone, Copy)]
pub(super) struct FnState<'ctx> {
    pub function: FunctionValue<'ctx>,
    /// Entry block; stack temporaries are allocated before its terminator.
    pub entry: BasicBlock<'ctx>,
    /// The runtime table argument.
    pub rt: PointerValue<'ctx>,
    /// Bytes of stack temporaries so far.
    pub stack_bytes: u64,
}

/// Inside a vectorized loop.
#[derive(Clone, Copy)]
pub(super) struct VecCtx<'ctx> {
    /// Id of the vectorized loop variable.
    pub var: u32,
    /// Lanes of the vectors: the loop's extent, or in a widened loop the next power of two.
    pub lanes: u32,
    /// The loop's iterations: the first `active` lanes (all of them unless widened).
    pub active: u32,
    /// Active lanes under the enclosing varying conditions; `None` means all.
    pub mask: Option<VectorValue<'ctx>>,
    /// In a widened loop (see [`super::vector`]), the mask of the lanes that are iterations of
    /// the loop; `mask` starts as it and only ever narrows.
    pub tail: Option<VectorValue<'ctx>>,
    /// The iteration lane 0 runs: 0, or in a loop run in register-wide chunks (see
    /// [`super::vector`]) the first iteration of the chunk.
    pub lane0: i64,
}

/// Emitter state for one module.
pub(super) struct Gen<'ctx, 'f> {
    pub cx: &'ctx Context,
    pub module: &'f Module<'ctx>,
    pub b: Builder<'ctx>,
    pub func: &'f LoweredFunc,
    pub opts: &'f CodegenOptions,
    pub host: &'f HostTarget,
    pub cur: FnState<'ctx>,
    /// Pointer of each live buffer, by `BufId`.
    pub bufs: Vec<Option<PointerValue<'ctx>>>,
    /// Value of each bound loop variable, by var id: an i64, or `<lanes x i64>` for the
    /// vectorized variable.
    pub vars: Vec<Option<BasicValueEnum<'ctx>>>,
    /// Per var id, when it was last bound (a count of bindings): loops entered later, deeper
    /// in the nest, have larger numbers (see [`Gen::index`]).
    pub var_bound_at: Vec<u64>,
    /// Bindings so far.
    bindings: u64,
    pub vec: Option<VecCtx<'ctx>>,
    /// Emitting an outlined parallel body: nested parallel loops run serially.
    pub in_parallel: bool,
    outlined: u32,
    /// Per buffer, whether its vector stores of whole lines are non-temporal (see
    /// [`CodegenOptions::nontemporal_past_bytes`]).
    pub streaming: Vec<bool>,
}

/// Per buffer of `func`, whether its whole-line vector stores are non-temporal: an output
/// parameter in main memory, larger than the threshold of
/// [`CodegenOptions::nontemporal_past_bytes`], that the kernel never loads, on x86.
fn streaming_outputs(
    func: &LoweredFunc,
    opts: &CodegenOptions,
    host: &HostTarget,
    bytes: impl Fn(BufId) -> Res<u64>,
) -> Res<Vec<bool>> {
    let mut out = vec![false; func.buffers.len()];
    let past = match opts.nontemporal_past_bytes {
        Some(b) => Some(b),
        None => crate::runtime::cache::usable_last_level_cache_bytes().map(|b| b as u64),
    };
    let Some(past) = past else {
        return Ok(out);
    };
    if !host.triple.starts_with("x86_64") || !host.has_feature("sse2") {
        return Ok(out);
    }
    let mut loaded = vec![false; func.buffers.len()];
    let mut mark = |e: &Expr| {
        e.visit(&mut |x| {
            if let Expr::BufLoad { buf, .. } = x {
                if let Some(l) = loaded.get_mut(buf.0 as usize) {
                    *l = true;
                }
            }
        })
    };
    func.body.visit(&mut |s| match s {
        Stmt::Store { index, value, .. } => {
            mark(index);
            mark(value);
        }
        Stmt::If { cond, .. } => mark(cond),
        _ => {}
    });
    for &p in &func.params {
        let decl = func.buffer(p);
        let i = p.0 as usize;
        out[i] = matches!(decl.kind, BufKind::Output(_))
            && decl.scope == tensortune_schedules::ir::Scope::Global
            && !loaded[i]
            && bytes(p)? > past;
    }
    Ok(out)
}

/// Emits `NAME` and `NAME_packed` for `func` into `module`.
pub(super) fn emit_kernel<'ctx>(
    cx: &'ctx Context,
    module: &Module<'ctx>,
    func: &LoweredFunc,
    opts: &CodegenOptions,
    host: &HostTarget,
) -> Res<()> {
    for &p in &func.params {
        let decl = func.buffers.get(p.0 as usize).ok_or_else(|| {
            CodegenError::InvalidIr(format!("parameter buffer {} undeclared", p.0))
        })?;
        if matches!(decl.kind, BufKind::Temp) {
            return Err(CodegenError::InvalidIr(format!(
                "temporary `{}` is a parameter",
                decl.name
            )));
        }
    }
    let ptr = cx.ptr_type(AddressSpace::default());
    let i32t = cx.i32_type();
    let mut params: Vec<BasicMetadataTypeEnum> = func.params.iter().map(|_| ptr.into()).collect();
    params.push(ptr.into());
    let kernel = module.add_function(
        &func.name,
        i32t.fn_type(&params, false),
        Some(Linkage::External),
    );
    let entry = cx.append_basic_block(kernel, "entry");
    let body = cx.append_basic_block(kernel, "body");
    let b = cx.create_builder();
    b.position_at_end(entry);
    b.build_unconditional_branch(body)?;
    b.position_at_end(body);
    let rt = kernel
        .get_nth_param(func.params.len() as u32)
        .ok_or_else(|| CodegenError::Llvm("missing runtime parameter".into()))?
        .into_pointer_value();
    let mut g = Gen {
        cx,
        module,
        b,
        func,
        opts,
        host,
        cur: FnState {
            function: kernel,
            entry,
            rt,
            stack_bytes: 0,
        },
        bufs: vec![None; func.buffers.len()],
        vars: vec![None; func.num_vars as usize],
        var_bound_at: vec![0; func.num_vars as usize],
        bindings: 0,
        vec: None,
        in_parallel: false,
        outlined: 0,
        streaming: vec![false; func.buffers.len()],
    };
    g.streaming = streaming_outputs(func, opts, host, |p| g.buffer_bytes(p))?;
    g.set_fn_attrs(kernel);
    // The packed entry point calls the kernel rather than taking a copy of it: inlined, the
    // whole loop nest would be optimized and compiled twice.
    kernel.add_attribute(AttributeLoc::Function, g.enum_attr("noinline", 0));
    for (i, &p) in func.params.iter().enumerate() {
        let bytes = g.buffer_bytes(p)?;
        g.set_buffer_param_attrs(kernel, i as u32, Some(bytes));
        let v = kernel
            .get_nth_param(i as u32)
            .ok_or_else(|| CodegenError::Llvm("missing parameter".into()))?;
        g.bufs[p.0 as usize] = Some(v.into_pointer_value());
    }
    g.stmt(&func.body)?;
    g.fence_streaming_stores()?;
    g.b.build_return(Some(&i32t.const_zero()))?;

    // NAME_packed(void *const *args, const tt_runtime *rt)
    let packed = module.add_function(
        &format!("{}_packed", func.name),
        i32t.fn_type(&[ptr.into(), ptr.into()], false),
        Some(Linkage::External),
    );
    g.set_fn_attrs(packed);
    let e = cx.append_basic_block(packed, "entry");
    g.b.position_at_end(e);
    let args = packed
        .get_nth_param(0)
        .ok_or_else(|| CodegenError::Llvm("missing parameter".into()))?
        .into_pointer_value();
    let rtp = packed
        .get_nth_param(1)
        .ok_or_else(|| CodegenError::Llvm("missing parameter".into()))?;
    let mut call_args: Vec<BasicMetadataValueEnum> = Vec::new();
    for i in 0..func.params.len() {
        // SAFETY: (for LLVM) the packed ABI passes one pointer per parameter.
        let slot = unsafe {
            g.b.build_in_bounds_gep(
                ptr,
                args,
                &[cx.i64_type().const_int(i as u64, false)],
                "arg.slot",
            )?
        };
        call_args.push(g.b.build_load(ptr, slot, "arg")?.into());
    }
    call_args.push(rtp.into());
    let r = g.b.build_call(kernel, &call_args, "r")?;
    let r = g.basic(r)?;
    g.b.build_return(Some(&r))?;
    Ok(())
}

impl<'ctx> Gen<'ctx, '_> {
    /// Target and vector-width attributes, on every function we emit.
    pub(super) fn set_fn_attrs(&self, f: FunctionValue<'ctx>) {
        let s = |k: &str, v: &str| self.cx.create_string_attribute(k, v);
        f.add_attribute(AttributeLoc::Function, s("target-cpu", &self.host.cpu));
        f.add_attribute(
            AttributeLoc::Function,
            s("target-features", &self.host.features),
        );
        let width = self
            .opts
            .vector_bits
            .unwrap_or(self.host.vector_bits)
            .to_string();
        f.add_attribute(AttributeLoc::Function, s("prefer-vector-width", &width));
        f.add_attribute(AttributeLoc::Function, s("min-legal-vector-width", &width));
        f.add_attribute(AttributeLoc::Function, self.enum_attr("nounwind", 0));
    }

    fn enum_attr(&self, name: &str, val: u64) -> Attribute {
        let kind = Attribute::get_named_enum_kind_id(name);
        self.cx.create_enum_attribute(kind, val)
    }

    fn set_buffer_param_attrs(&self, f: FunctionValue<'ctx>, i: u32, bytes: Option<u64>) {
        let loc = AttributeLoc::Param(i);
        f.add_attribute(loc, self.enum_attr("noalias", 0));
        f.add_attribute(loc, self.enum_attr("nocapture", 0));
        f.add_attribute(loc, self.enum_attr("align", 64));
        if let Some(n) = bytes.filter(|&n| n > 0) {
            f.add_attribute(loc, self.enum_attr("dereferenceable", n));
        }
    }

    /// Size in bytes of a buffer as laid out in memory.
    pub(super) fn buffer_bytes(&self, id: BufId) -> Res<u64> {
        let d = self.decl(id)?;
        let n = d.size();
        if n < 0 {
            return Err(CodegenError::InvalidIr(format!(
                "buffer `{}` has a negative size",
                d.name
            )));
        }
        (n as u64)
            .checked_mul(self.mem_bytes(d.dtype))
            .ok_or_else(|| CodegenError::Unsupported(format!("buffer `{}` is too large", d.name)))
    }

    pub(super) fn decl(&self, id: BufId) -> Res<&tensortune_schedules::ir::BufferDecl> {
        self.func
            .buffers
            .get(id.0 as usize)
            .ok_or_else(|| CodegenError::InvalidIr(format!("buffer {} undeclared", id.0)))
    }

    /// The pointer of a live buffer.
    pub(super) fn buf_ptr(&self, id: BufId) -> Res<PointerValue<'ctx>> {
        self.bufs
            .get(id.0 as usize)
            .copied()
            .flatten()
            .ok_or_else(|| {
                let name = self
                    .func
                    .buffers
                    .get(id.0 as usize)
                    .map(|b| b.name.as_str())
                    .unwrap_or("?");
                CodegenError::InvalidIr(format!("buffer `{name}` used outside its allocation"))
            })
    }

    /// A call's result as a value.
    pub(super) fn basic(
        &self,
        c: inkwell::values::CallSiteValue<'ctx>,
    ) -> Res<BasicValueEnum<'ctx>> {
        match c.try_as_basic_value() {
            inkwell::values::ValueKind::Basic(v) => Ok(v),
            _ => Err(CodegenError::Llvm("call returns no value".into())),
        }
    }

    pub(super) fn bind_var(&mut self, v: &Var, val: Option<BasicValueEnum<'ctx>>) {
        let i = v.id as usize;
        if i >= self.vars.len() {
            self.vars.resize(i + 1, None);
        }
        if i >= self.var_bound_at.len() {
            self.var_bound_at.resize(i + 1, 0);
        }
        self.vars[i] = val;
        if val.is_some() {
            self.bindings += 1;
            self.var_bound_at[i] = self.bindings;
        }
    }

    pub(super) fn new_block(&self, name: &str) -> BasicBlock<'ctx> {
        self.cx.append_basic_block(self.cur.function, name)
    }

    pub(super) fn stmt(&mut self, s: &Stmt) -> Res<()> {
        match s {
            Stmt::Seq(v) => v.iter().try_for_each(|s| self.stmt(s)),
            Stmt::Store { buf, index, value } => {
                if self.vec.is_some() {
                    self.vstore(*buf, index, value)
                } else {
                    self.store(*buf, index, value)
                }
            }
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => self.for_loop(var, *extent, *kind, body),
            Stmt::Allocate { buf, body } => self.allocate(*buf, body),
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                if self.vec.is_some() {
                    self.vif(cond, then, otherwise.as_deref())
                } else {
                    self.sif(cond, then, otherwise.as_deref())
                }
            }
            Stmt::Sync => Ok(()),
            Stmt::Prefetch { buf, index, level } => self.prefetch(*buf, index, *level),
            Stmt::Shuffle { .. } => Err(CodegenError::Unsupported(
                "a warp shuffle on the CPU (it exchanges registers among GPU threads)".into(),
            )),
        }
    }

    fn store(&mut self, buf: BufId, index: &Expr, value: &Expr) -> Res<()> {
        let dtype = self.decl(buf)?.dtype;
        let v = self.store_value(buf, index, value)?;
        if value.dtype() != dtype {
            return Err(CodegenError::InvalidIr(format!(
                "store of {} into a {dtype} buffer",
                value.dtype()
            )));
        }
        let v = self.storable_value(v, dtype)?;
        let ptr = self.elem_ptr(buf, index)?;
        let st = self.b.build_store(ptr, v)?;
        st.set_alignment(self.mem_bytes(dtype) as u32)
            .map_err(|e| CodegenError::Llvm(e.to_string()))?;
        Ok(())
    }

    /// `llvm.prefetch` of `buf[index]`'s line for reading into `level` (x86's `prefetcht0`,
    /// `prefetcht1` or `prefetcht2`). In a vectorized loop, every line the lanes' elements
    /// lie on: one per 64 bytes from lane 0's for contiguous lanes (a loop of 64 floats
    /// emitted as one vector spans four), one per lane (at most 16) for strided ones.
    fn prefetch(&mut self, buf: BufId, index: &Expr, level: PrefetchLevel) -> Res<()> {
        let elem = self.mem_bytes(self.decl(buf)?.dtype).max(1) as i64;
        let (first, offsets): (IntValue<'ctx>, Vec<i64>) = match &self.vec {
            None => (self.index(index)?, vec![0]),
            Some(ctx) => {
                let (var, active) = (ctx.var, ctx.active as i64);
                let offsets = match super::vector::stride_of(index, var) {
                    Some(s) if s.abs() == 1 => {
                        let per_line = (64 / elem).max(1);
                        (0..(active + per_line - 1) / per_line)
                            .map(|k| k * per_line * s)
                            .collect()
                    }
                    Some(s) if s != 0 => (0..active.min(16)).map(|l| l * s).collect(),
                    _ => vec![0],
                };
                (self.at_lane0(index)?, offsets)
            }
        };
        let base = self.buf_ptr(buf)?;
        let ty = self.mem_ty(self.decl(buf)?.dtype);
        let i64t = self.cx.i64_type();
        let i32t = self.cx.i32_type();
        // LLVM's locality: 3 keeps the line in every level, 2 from L2 out, 1 from the
        // last level out.
        let locality = match level {
            PrefetchLevel::L1 => 3,
            PrefetchLevel::L2 => 2,
            PrefetchLevel::L3 => 1,
        };
        for off in offsets {
            let idx = if off == 0 {
                first
            } else {
                self.b
                    .build_int_add(first, i64t.const_int(off as u64, true), "pfi")?
            };
            // SAFETY: (for LLVM) a plain GEP, not `inbounds`: the index may lie past the
            // buffer (the row after the last one), which only a prefetch, never a load,
            // reaches.
            let p = unsafe { self.b.build_gep(ty, base, &[idx], "pf")? };
            // Operands: a read (0), the locality, the data cache (1).
            self.intrinsic(
                "llvm.prefetch",
                &[p.get_type().into()],
                &[
                    p.into(),
                    i32t.const_zero().into(),
                    i32t.const_int(locality, false).into(),
                    i32t.const_int(1, false).into(),
                ],
            )?;
        }
        Ok(())
    }

    /// Address of `buf[index]` for a scalar index.
    pub(super) fn elem_ptr(&mut self, buf: BufId, index: &Expr) -> Res<PointerValue<'ctx>> {
        let base = self.buf_ptr(buf)?;
        let ty = self.mem_ty(self.decl(buf)?.dtype);
        let idx = self.index(index)?;
        // SAFETY: (for LLVM) indices are in bounds by the IR's invariant.
        Ok(unsafe { self.b.build_in_bounds_gep(ty, base, &[idx], "p")? })
    }

    /// A scalar index as i64.
    ///
    /// A sum is emitted with its constant terms added last: `(x.2*896 + k.2*64) + 128`
    /// rather than `(x.2*896 + 128) + k.2*64`. The terms of an unrolled loop become constants
    /// here, and LLVM's alias analysis can tell two addresses apart only when they differ by
    /// a constant it can see; in the second form it cannot, so the accumulators of a register
    /// tile with a reduction loop outside it (conv2d's `ry`, `rx`) stayed in memory, loaded
    /// and stored around every FMA, instead of being kept in registers.
    ///
    /// The other terms are added in the order their loops were entered, the outermost first,
    /// for the same reason: a rolled loop that LLVM's unroller copies out becomes a constant
    /// only after this, and in `((i.1*8192 + i.2*1024) + j.0*64) + j.1*32` an unrolled `i.2`
    /// leaves its constant in the middle of the sum again, where
    /// `((j.0*64 + j.1*32 + i.1*8192) + i.2*1024)` leaves it last.
    pub(super) fn index(&mut self, index: &Expr) -> Res<IntValue<'ctx>> {
        let not_int =
            || CodegenError::InvalidIr(format!("index `{index}` is not a scalar integer"));
        let mut terms = Vec::new();
        sum_terms(index, &mut terms);
        // A stable sort: terms of the same loops keep the order lowering gave them.
        terms.sort_by_key(|t| self.innermost_binding(t));
        let mut variable: Option<IntValue<'ctx>> = None;
        let mut constant: Option<IntValue<'ctx>> = None;
        for t in terms {
            let BasicValueEnum::IntValue(v) = self.expr(t)? else {
                return Err(not_int());
            };
            let slot = if v.is_const() {
                &mut constant
            } else {
                &mut variable
            };
            *slot = Some(match *slot {
                None => v,
                Some(acc) if acc.get_type() == v.get_type() => {
                    self.b.build_int_add(acc, v, "add")?
                }
                Some(_) => return Err(not_int()),
            });
        }
        let i = match (variable, constant) {
            (Some(v), Some(c)) if v.get_type() == c.get_type() => {
                self.b.build_int_add(v, c, "add")?
            }
            (Some(_), Some(_)) => return Err(not_int()),
            (Some(v), None) | (None, Some(v)) => v,
            (None, None) => return Err(not_int()),
        };
        if i.get_type().get_bit_width() == 64 {
            Ok(i)
        } else {
            Ok(self.b.build_int_s_extend(i, self.cx.i64_type(), "idx")?)
        }
    }

    /// When the innermost loop variable `e` uses was bound (0: it uses none).
    fn innermost_binding(&self, e: &Expr) -> u64 {
        let mut at = 0;
        e.visit(&mut |x| {
            if let Expr::Var(v) = x {
                at = at.max(self.var_bound_at.get(v.id as usize).copied().unwrap_or(0));
            }
        });
        at
    }

    fn for_loop(&mut self, var: &Var, extent: i64, kind: ForKind, body: &Stmt) -> Res<()> {
        if extent < 1 {
            return Err(CodegenError::InvalidIr(format!(
                "loop `{}` has extent {extent}",
                var.name
            )));
        }
        if self.vec.is_some() {
            return Err(CodegenError::InvalidIr(format!(
                "loop `{}` inside a vectorized loop",
                var.name
            )));
        }
        if kind != ForKind::Parallel && self.tree_reduction(var, extent, body)? {
            return Ok(());
        }
        match kind {
            ForKind::Unrolled
                if extent.saturating_mul(body.unrolled_copies()) <= self.opts.max_unroll =>
            {
                for i in 0..extent {
                    let c = self.cx.i64_type().const_int(i as u64, true);
                    self.bind_var(var, Some(c.into()));
                    self.stmt(body)?;
                }
                self.bind_var(var, None);
                Ok(())
            }
            ForKind::Parallel if !self.in_parallel && extent > 1 => {
                self.parallel_loop(var, extent, body)
            }
            ForKind::Vectorized
                // 1024 lanes at most whatever the options say: a vector's lane count is a u32
                // rounded up to a power of two below.
                if extent <= self.opts.max_vector_lanes.min(1024)
                    && super::vector::can_vectorize(body, var.id) =>
            {
                self.vector_loop(var, extent as u32, body)
            }
            _ => self.serial_loop(var, extent, body),
        }
    }

    /// A loop whose body only folds a value per iteration into one element, `acc[c] =
    /// acc[c] + x(k)` over the loop's `k` with `x` reading memory contiguously or uniformly in
    /// `k` (the last step of a reduction split by `rfactor`, which combines its partial
    /// results; a dot product; an untuned schedule's row sum), runs `x` on register-wide
    /// vectors: up to four accumulator registers (a loop over groups of four when the row is
    /// longer than that), folded pairwise, then by halves of a register, then the iterations
    /// left over one at a time, then the old `acc[c]`. A chain of `extent` dependent scalar
    /// operations becomes a few vector ones (docs/measurements.md, "Reductions without NaN
    /// checks"). Other loops, and rows shorter than a register, are left to the caller
    /// (false). A sum's rounding differs from the chain's as any reassociation's does,
    /// within the check against the reference; a maximum or minimum (`maxnum`/`minnum`,
    /// which are associative) is the same value.
    fn tree_reduction(&mut self, var: &Var, extent: i64, body: &Stmt) -> Res<bool> {
        let Some(Fold {
            buf,
            index,
            acc,
            op,
            x,
        }) = body.as_fold(var.id)
        else {
            return Ok(false);
        };
        let (buf, op) = (&buf, &op);
        let d = self.decl(*buf)?.dtype;
        if x.dtype() != d {
            return Ok(false);
        }
        let bits = self.opts.vector_bits.unwrap_or(self.host.vector_bits) as u64;
        let lanes = (bits / (8 * self.mem_bytes(d))) as i64;
        // Halving a register down to one lane needs a power of two (`vector_bits` is one).
        if lanes < 2 || !(lanes as u64).is_power_of_two() || extent < lanes {
            return Ok(false);
        }
        let chunks = extent / lanes;
        let regs = chunks.min(4);
        let (trips, extra) = (chunks / regs, chunks % regs);
        let i64t = self.cx.i64_type();
        // `x` at iteration `base + lane`: `k` replaced by a scalar variable for the base and
        // a vector one for the lanes, vectorized over the latter as a loop of `lanes` is.
        let (base_var, lane_var) = (
            Var::new(self.func.num_vars, "fold.base"),
            Var::new(self.func.num_vars + 1, "fold.lane"),
        );
        let xs = x.substitute(&|v: &Var| {
            (v.id == var.id)
                .then(|| Expr::bin(BinOp::Add, Expr::var(&base_var), Expr::var(&lane_var)))
        });
        let ramp: Vec<IntValue> = (0..lanes as u64)
            .map(|l| i64t.const_int(l, false))
            .collect();
        let ramp = inkwell::types::VectorType::const_vector(&ramp);
        let chunk = |g: &mut Self, base: IntValue<'ctx>| -> Res<BasicValueEnum<'ctx>> {
            g.bind_var(&base_var, Some(base.into()));
            g.bind_var(&lane_var, Some(ramp.into()));
            g.vec = Some(VecCtx {
                var: lane_var.id,
                lanes: lanes as u32,
                active: lanes as u32,
                mask: None,
                tail: None,
                lane0: 0,
            });
            let v = g.expr(&xs);
            g.vec = None;
            g.bind_var(&lane_var, None);
            g.bind_var(&base_var, None);
            let v = g.broadcast(v?, lanes as u32)?;
            Ok(v.into())
        };
        let konst = |k: i64| i64t.const_int(k as u64, false);
        let mut accs: Vec<BasicValueEnum<'ctx>> = Vec::with_capacity(regs as usize);
        if trips == 1 {
            for j in 0..regs {
                accs.push(chunk(self, konst(j * lanes))?);
            }
        } else {
            // A loop over groups of `regs` registers, the accumulators its phis.
            let identity = match op {
                // -0 + x is x for every x, -0 included.
                BinOp::Add => Expr::Const(if d == DType::F32 {
                    tensortune_schedules::Const::F32(-0.0)
                } else {
                    tensortune_schedules::Const::F64(-0.0)
                }),
                BinOp::Max => Expr::Const(tensortune_schedules::expr::Combiner::Max.identity(d)),
                _ => Expr::Const(tensortune_schedules::expr::Combiner::Min.identity(d)),
            };
            let id = self.expr(&identity)?;
            let id: BasicValueEnum<'ctx> = self.broadcast(id, lanes as u32)?.into();
            let pre = self.current_block()?;
            let header = self.new_block("fold.loop");
            let exit = self.new_block("fold.end");
            self.b.build_unconditional_branch(header)?;
            self.b.position_at_end(header);
            let q = self.b.build_phi(i64t, "fold.q")?;
            q.add_incoming(&[(&i64t.const_zero(), pre)]);
            let mut phis = Vec::with_capacity(regs as usize);
            for _ in 0..regs {
                let p = self.b.build_phi(id.get_type(), "fold.acc")?;
                p.add_incoming(&[(&id, pre)]);
                phis.push(p);
            }
            let qv = q.as_basic_value().into_int_value();
            let group = self
                .b
                .build_int_mul(qv, konst(regs * lanes), "fold.group")?;
            let mut next = Vec::with_capacity(regs as usize);
            for (j, p) in phis.iter().enumerate() {
                let base = self
                    .b
                    .build_int_add(group, konst(j as i64 * lanes), "fold.at")?;
                let v = chunk(self, base)?;
                next.push(self.binop(*op, d, p.as_basic_value(), v)?);
            }
            let q1 = self.b.build_int_add(qv, konst(1), "fold.next")?;
            let latch = self.current_block()?;
            q.add_incoming(&[(&q1, latch)]);
            for (p, v) in phis.iter().zip(&next) {
                p.add_incoming(&[(v, latch)]);
            }
            let more =
                self.b
                    .build_int_compare(IntPredicate::SLT, q1, konst(trips), "fold.more")?;
            self.b.build_conditional_branch(more, header, exit)?;
            self.b.position_at_end(exit);
            accs = next;
        }
        for j in 0..extra {
            let v = chunk(self, konst((trips * regs + j) * lanes))?;
            let slot = j as usize % accs.len();
            accs[slot] = self.binop(*op, d, accs[slot], v)?;
        }
        while accs.len() > 1 {
            let mut next = Vec::with_capacity(accs.len().div_ceil(2));
            for pair in accs.chunks(2) {
                next.push(match *pair {
                    [l, r] => self.binop(*op, d, l, r)?,
                    // The odd one out waits for the next level.
                    _ => pair[0],
                });
            }
            accs = next;
        }
        let as_vector = |x: BasicValueEnum<'ctx>| match x {
            BasicValueEnum::VectorValue(v) => Ok(v),
            _ => Err(CodegenError::InvalidIr(
                "a fold of registers gave a scalar".into(),
            )),
        };
        let mut v = as_vector(accs[0])?;
        let i32t = self.cx.i32_type();
        let mut n = lanes as u64;
        while n > 1 {
            let h = n / 2;
            let half = |from: u64| {
                let idx: Vec<_> = (from..from + h).map(|i| i32t.const_int(i, false)).collect();
                inkwell::types::VectorType::const_vector(&idx)
            };
            let lo = self.b.build_shuffle_vector(v, v, half(0), "lo")?;
            let hi = self.b.build_shuffle_vector(v, v, half(h), "hi")?;
            v = as_vector(self.binop(*op, d, lo.into(), hi.into())?)?;
            n = h;
        }
        let mut r = self
            .b
            .build_extract_element(v, i64t.const_zero(), "folded")?;
        for k in chunks * lanes..extent {
            self.bind_var(var, Some(konst(k).into()));
            let xv = self.expr(x)?;
            r = self.binop(*op, d, r, xv)?;
        }
        self.bind_var(var, None);
        let old = self.expr(acc)?;
        let folded = self.binop(*op, d, old, r)?;
        let ptr = self.elem_ptr(*buf, index)?;
        let st = self.b.build_store(ptr, folded)?;
        st.set_alignment(self.mem_bytes(d) as u32)
            .map_err(|e| CodegenError::Llvm(e.to_string()))?;
        Ok(true)
    }

    /// `for var in 0..extent` as a bottom-tested loop (extent >= 1).
    fn serial_loop(&mut self, var: &Var, extent: i64, body: &Stmt) -> Res<()> {
        let i64t = self.cx.i64_type();
        let pre = self.current_block()?;
        let header = self.new_block(&format!("{}.loop", var.name));
        let exit = self.new_block(&format!("{}.end", var.name));
        self.b.build_unconditional_branch(header)?;
        self.b.position_at_end(header);
        let phi = self.b.build_phi(i64t, var.name)?;
        phi.add_incoming(&[(&i64t.const_zero(), pre)]);
        self.bind_var(var, Some(phi.as_basic_value()));
        self.stmt(body)?;
        let i = phi.as_basic_value().into_int_value();
        let next = self.b.build_int_add(i, i64t.const_int(1, false), "next")?;
        let latch = self.current_block()?;
        phi.add_incoming(&[(&next, latch)]);
        let more = self.b.build_int_compare(
            IntPredicate::SLT,
            next,
            i64t.const_int(extent as u64, true),
            "more",
        )?;
        let br = self.b.build_conditional_branch(more, header, exit)?;
        if self.llvm_may_not_unroll(body) {
            self.disable_unroll(br);
        }
        self.b.position_at_end(exit);
        self.bind_var(var, None);
        Ok(())
    }

    /// True if LLVM's unroller is to leave a rolled loop with this body alone (see
    /// [`CodegenOptions::llvm_unroll_max_inner`] and
    /// [`CodegenOptions::llvm_unroll_updates_only`]).
    fn llvm_may_not_unroll(&self, body: &Stmt) -> bool {
        contains_rolled_loop(body, self.opts.llvm_unroll_max_inner)
            || (self.opts.llvm_unroll_updates_only && !updates(body))
    }

    /// Marks the loop whose latch branch is `br` with `llvm.loop.unroll.disable`.
    fn disable_unroll(&mut self, br: inkwell::values::InstructionValue<'ctx>) {
        use inkwell::llvm_sys::core::{
            LLVMGetMDKindIDInContext, LLVMMDNodeInContext2, LLVMMDStringInContext2,
            LLVMMetadataAsValue, LLVMSetMetadata,
        };
        use inkwell::llvm_sys::debuginfo::{LLVMMetadataReplaceAllUsesWith, LLVMTemporaryMDNode};
        use inkwell::values::AsValueRef;
        let cx = self.cx.raw();
        const DISABLE: &str = "llvm.loop.unroll.disable";
        const LOOP: &str = "llvm.loop";
        // SAFETY: every reference comes from this context; the temporary node is replaced
        // (and so freed) before the metadata is attached.
        unsafe {
            let s = LLVMMDStringInContext2(cx, DISABLE.as_ptr().cast(), DISABLE.len());
            let mut one = [s];
            let opt = LLVMMDNodeInContext2(cx, one.as_mut_ptr(), 1);
            let tmp = LLVMTemporaryMDNode(cx, std::ptr::null_mut(), 0);
            let mut ops = [tmp, opt];
            let id = LLVMMDNodeInContext2(cx, ops.as_mut_ptr(), 2);
            LLVMMetadataReplaceAllUsesWith(tmp, id);
            let kind = LLVMGetMDKindIDInContext(cx, LOOP.as_ptr().cast(), LOOP.len() as u32);
            LLVMSetMetadata(br.as_value_ref(), kind, LLVMMetadataAsValue(cx, id));
        }
    }

    fn vector_loop(&mut self, var: &Var, lanes: u32, body: &Stmt) -> Res<()> {
        let widened = self.can_widen(body, var.id, lanes)?;
        if widened {
            let width = lanes.next_power_of_two();
            let tail = Some(self.lane_prefix_mask(lanes, width));
            return self.vector_chunk(var, 0, width, lanes, tail, body);
        }
        let native = (self.opts.vector_bits.unwrap_or(self.host.vector_bits) / 32).max(1);
        if lanes.is_power_of_two() || lanes <= native {
            return self.vector_chunk(var, 0, lanes, lanes, None, body);
        }
        // Register-wide chunks, then the rest (see the module doc of `vector`).
        let mut first = 0;
        while first < lanes {
            let n = native.min(lanes - first);
            self.vector_chunk(var, first as i64, n, n, None, body)?;
            first += n;
        }
        Ok(())
    }

    /// The body once on `width` lanes running iterations `lane0..lane0 + active` of `var`.
    fn vector_chunk(
        &mut self,
        var: &Var,
        lane0: i64,
        width: u32,
        active: u32,
        tail: Option<VectorValue<'ctx>>,
        body: &Stmt,
    ) -> Res<()> {
        let i64t = self.cx.i64_type();
        let ramp: Vec<IntValue> = (0..width as i64)
            .map(|l| i64t.const_int((lane0 + l) as u64, false))
            .collect();
        self.bind_var(
            var,
            Some(inkwell::types::VectorType::const_vector(&ramp).into()),
        );
        self.vec = Some(VecCtx {
            var: var.id,
            lanes: width,
            active,
            mask: tail,
            tail,
            lane0,
        });
        let r = self.stmt(body);
        self.vec = None;
        self.bind_var(var, None);
        r
    }

    pub(super) fn current_block(&self) -> Res<BasicBlock<'ctx>> {
        self.b
            .get_insert_block()
            .ok_or_else(|| CodegenError::Llvm("builder is not positioned".into()))
    }

    fn sif(&mut self, cond: &Expr, then: &Stmt, otherwise: Option<&Stmt>) -> Res<()> {
        let c = self.expr(cond)?;
        let BasicValueEnum::IntValue(c) = c else {
            return Err(CodegenError::InvalidIr(format!(
                "condition `{cond}` is not a scalar bool"
            )));
        };
        let then_bb = self.new_block("then");
        let merge = self.new_block("endif");
        let else_bb = if otherwise.is_some() {
            self.new_block("else")
        } else {
            merge
        };
        self.b.build_conditional_branch(c, then_bb, else_bb)?;
        self.b.position_at_end(then_bb);
        self.stmt(then)?;
        self.b.build_unconditional_branch(merge)?;
        if let Some(o) = otherwise {
            self.b.position_at_end(else_bb);
            self.stmt(o)?;
            self.b.build_unconditional_branch(merge)?;
        }
        self.b.position_at_end(merge);
        Ok(())
    }

    /// Returns `code` from the current function unless it is 0.
    fn return_on_error(&mut self, code: IntValue<'ctx>) -> Res<()> {
        let ok = self.b.build_int_compare(
            IntPredicate::EQ,
            code,
            self.cx.i32_type().const_zero(),
            "ok",
        )?;
        let fail = self.new_block("fail");
        let cont = self.new_block("cont");
        self.b.build_conditional_branch(ok, cont, fail)?;
        self.b.position_at_end(fail);
        self.b.build_return(Some(&code))?;
        self.b.position_at_end(cont);
        Ok(())
    }

    fn rt_type(&self) -> StructType<'ctx> {
        let ptr = self.cx.ptr_type(AddressSpace::default());
        self.cx
            .struct_type(&[ptr.into(), ptr.into(), ptr.into(), ptr.into()], false)
    }

    /// Loads field `i` of the runtime table (see `TtRuntime`).
    fn rt_field(&mut self, i: u32) -> Res<PointerValue<'ctx>> {
        let ty = self.rt_type();
        let p = self.b.build_struct_gep(ty, self.cur.rt, i, "rt.field")?;
        let ptr = self.cx.ptr_type(AddressSpace::default());
        Ok(self.b.build_load(ptr, p, "rt.fn")?.into_pointer_value())
    }

    fn allocate(&mut self, buf: BufId, body: &Stmt) -> Res<()> {
        let decl = self.decl(buf)?.clone();
        if !matches!(decl.kind, BufKind::Temp) {
            return Err(CodegenError::InvalidIr(format!(
                "allocate of parameter `{}`",
                decl.name
            )));
        }
        let bytes = self.buffer_bytes(buf)?;
        // A stack array's length is a u32 and the stack is megabytes: 1 GiB is past any
        // option that makes sense, and keeps the sums and the casts below exact.
        const STACK_CAP: u64 = 1 << 30;
        let on_stack = bytes <= self.opts.max_stack_alloc_bytes.min(STACK_CAP)
            && self.cur.stack_bytes.saturating_add(bytes)
                <= self.opts.max_stack_bytes.min(STACK_CAP);
        let i = buf.0 as usize;
        if self.bufs[i].is_some() {
            return Err(CodegenError::InvalidIr(format!(
                "`{}` allocated twice",
                decl.name
            )));
        }
        if on_stack {
            let ty = self.mem_ty(decl.dtype);
            let n = decl.size().max(1) as u32;
            let at = self.cx.create_builder();
            match self.cur.entry.get_terminator() {
                Some(t) => at.position_before(&t),
                None => at.position_at_end(self.cur.entry),
            }
            let arr = ty.array_type(n);
            let p = at.build_alloca(arr, &decl.name)?;
            if let Some(inst) = p.as_instruction() {
                inst.set_alignment(64)
                    .map_err(|e| CodegenError::Llvm(e.to_string()))?;
            }
            self.cur.stack_bytes += bytes;
            self.bufs[i] = Some(p);
            self.stmt(body)?;
            self.bufs[i] = None;
            return Ok(());
        }
        let ptr = self.cx.ptr_type(AddressSpace::default());
        let i64t = self.cx.i64_type();
        let alloc_fn = self.rt_field(1)?;
        let alloc_ty = ptr.fn_type(&[ptr.into(), i64t.into()], false);
        let rt = self.cur.rt;
        let call = self.b.build_indirect_call(
            alloc_ty,
            alloc_fn,
            &[rt.into(), i64t.const_int(bytes, false).into()],
            &decl.name,
        )?;
        // A fresh block, as from malloc (the ABI's promise): `noalias` lets LLVM tell it apart
        // from every other buffer, so that an accumulator tile in it is kept in registers
        // across a reduction loop that also reads another temporary (conv2d's packed
        // weights) instead of being stored on every iteration.
        call.add_attribute(AttributeLoc::Return, self.enum_attr("noalias", 0));
        call.add_attribute(AttributeLoc::Return, self.enum_attr("align", 64));
        let p = self.basic(call)?.into_pointer_value();
        let is_null = self.b.build_is_null(p, "oom")?;
        let code = self
            .b
            .build_select(
                is_null,
                self.cx.i32_type().const_int(1, false),
                self.cx.i32_type().const_zero(),
                "code",
            )?
            .into_int_value();
        self.return_on_error(code)?;
        self.bufs[i] = Some(p);
        self.stmt(body)?;
        self.bufs[i] = None;
        let free_fn = self.rt_field(2)?;
        let free_ty = self
            .cx
            .void_type()
            .fn_type(&[ptr.into(), ptr.into()], false);
        self.b
            .build_indirect_call(free_ty, free_fn, &[rt.into(), p.into()], "")?;
        Ok(())
    }

    /// Outlines `for var in 0..extent: body` and runs it through `rt->parallel_for`.
    fn parallel_loop(&mut self, var: &Var, extent: i64, body: &Stmt) -> Res<()> {
        let cx = self.cx;
        let ptr = cx.ptr_type(AddressSpace::default());
        let i64t = cx.i64_type();
        let i32t = cx.i32_type();
        let cap_bufs: Vec<(usize, PointerValue<'ctx>)> = self
            .bufs
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.map(|p| (i, p)))
            .collect();
        let mut cap_vars: Vec<(usize, IntValue<'ctx>)> = Vec::new();
        for (i, v) in self.vars.iter().enumerate() {
            match v {
                Some(BasicValueEnum::IntValue(x)) => cap_vars.push((i, *x)),
                Some(_) => return Err(CodegenError::InvalidIr("vector variable captured".into())),
                None => {}
            }
        }
        let k = self.outlined;
        self.outlined += 1;
        let name = format!("{}_par{k}", self.func.name);

        // body(bufs..., vars..., rt, begin, end)
        let mut body_params: Vec<BasicMetadataTypeEnum> =
            cap_bufs.iter().map(|_| ptr.into()).collect();
        body_params.extend(cap_vars.iter().map(|_| BasicMetadataTypeEnum::from(i64t)));
        body_params.extend([BasicMetadataTypeEnum::from(ptr), i64t.into(), i64t.into()]);
        let body_fn = self.module.add_function(
            &format!("{name}_body"),
            i32t.fn_type(&body_params, false),
            Some(Linkage::Internal),
        );
        self.set_fn_attrs(body_fn);
        for (j, (bi, _)) in cap_bufs.iter().enumerate() {
            let bytes = self.buffer_bytes(BufId(*bi as u32)).ok();
            self.set_buffer_param_attrs(body_fn, j as u32, bytes);
        }

        // The closure: { ptr x nbufs, i64 x nvars, ptr rt }.
        let mut fields: Vec<BasicTypeEnum> = cap_bufs.iter().map(|_| ptr.into()).collect();
        fields.extend(cap_vars.iter().map(|_| BasicTypeEnum::from(i64t)));
        fields.push(ptr.into());
        let closure_ty = cx.struct_type(&fields, false);

        // Trampoline of the ABI type.
        let tramp = self.module.add_function(
            &name,
            i32t.fn_type(&[ptr.into(), i64t.into(), i64t.into()], false),
            Some(Linkage::Internal),
        );
        self.set_fn_attrs(tramp);
        {
            let tb = cx.create_builder();
            let e = cx.append_basic_block(tramp, "entry");
            tb.position_at_end(e);
            let param = |i: u32| {
                tramp
                    .get_nth_param(i)
                    .ok_or_else(|| CodegenError::Llvm("missing parameter".into()))
            };
            let clo = param(0)?.into_pointer_value();
            let mut args: Vec<BasicMetadataValueEnum> = Vec::new();
            for (j, f) in fields.iter().enumerate() {
                let p = tb.build_struct_gep(closure_ty, clo, j as u32, "cap")?;
                args.push(tb.build_load(*f, p, "cap")?.into());
            }
            args.push(param(1)?.into());
            args.push(param(2)?.into());
            let r = tb.build_call(body_fn, &args, "r")?;
            let r = self.basic(r)?;
            tb.build_return(Some(&r))?;
        }

        // Caller side: fill the closure, call parallel_for, propagate its status.
        let at = cx.create_builder();
        match self.cur.entry.get_terminator() {
            Some(t) => at.position_before(&t),
            None => at.position_at_end(self.cur.entry),
        }
        let clo = at.build_alloca(closure_ty, "closure")?;
        let mut values: Vec<BasicValueEnum> = cap_bufs.iter().map(|(_, p)| (*p).into()).collect();
        values.extend(cap_vars.iter().map(|(_, v)| BasicValueEnum::from(*v)));
        values.push(self.cur.rt.into());
        for (j, v) in values.iter().enumerate() {
            let p = self.b.build_struct_gep(closure_ty, clo, j as u32, "cap")?;
            self.b.build_store(p, *v)?;
        }
        let pf = self.rt_field(0)?;
        let pf_ty = i32t.fn_type(&[ptr.into(), i64t.into(), ptr.into(), ptr.into()], false);
        let tramp_ptr = tramp.as_global_value().as_pointer_value();
        let rt = self.cur.rt;
        let code = self.b.build_indirect_call(
            pf_ty,
            pf,
            &[
                rt.into(),
                i64t.const_int(extent as u64, true).into(),
                tramp_ptr.into(),
                clo.into(),
            ],
            "par",
        )?;
        let code = self.basic(code)?.into_int_value();
        let resume = self.current_block()?;

        // Emit the body function with its own environment.
        let saved = (
            self.cur,
            self.bufs.clone(),
            self.vars.clone(),
            self.in_parallel,
        );
        let entry = cx.append_basic_block(body_fn, "entry");
        let start = cx.append_basic_block(body_fn, "start");
        self.b.position_at_end(entry);
        self.b.build_unconditional_branch(start)?;
        self.b.position_at_end(start);
        let param = |i: usize| {
            body_fn
                .get_nth_param(i as u32)
                .ok_or_else(|| CodegenError::Llvm("missing parameter".into()))
        };
        self.bufs = vec![None; self.bufs.len()];
        for (j, (bi, _)) in cap_bufs.iter().enumerate() {
            self.bufs[*bi] = Some(param(j)?.into_pointer_value());
        }
        self.vars = vec![None; self.vars.len()];
        for (j, (vi, _)) in cap_vars.iter().enumerate() {
            self.vars[*vi] = Some(param(cap_bufs.len() + j)?);
        }
        let base = cap_bufs.len() + cap_vars.len();
        self.cur = FnState {
            function: body_fn,
            entry,
            rt: param(base)?.into_pointer_value(),
            stack_bytes: 0,
        };
        self.in_parallel = true;
        let begin = param(base + 1)?.into_int_value();
        let end = param(base + 2)?.into_int_value();
        let r = self.range_loop(var, begin, end, body);
        // Each thread's non-temporal stores are ordered before the runtime reports its part
        // done.
        let r = r.and_then(|()| self.fence_streaming_stores());
        let r = r.and_then(|()| Ok(self.b.build_return(Some(&i32t.const_zero())).map(|_| ())?));
        (self.cur, self.bufs, self.vars, self.in_parallel) = saved;
        r?;

        self.b.position_at_end(resume);
        self.return_on_error(code)
    }

    /// An `sfence` where this kernel may have made non-temporal stores: they are weakly
    /// ordered, and whoever reads the output next (another thread, the caller) must see them.
    fn fence_streaming_stores(&mut self) -> Res<()> {
        if self.streaming.iter().any(|&s| s) {
            self.intrinsic("llvm.x86.sse.sfence", &[], &[])?;
        }
        Ok(())
    }

    /// `for var in begin..end` as a top-tested loop.
    fn range_loop(
        &mut self,
        var: &Var,
        begin: IntValue<'ctx>,
        end: IntValue<'ctx>,
        body: &Stmt,
    ) -> Res<()> {
        let i64t = self.cx.i64_type();
        let pre = self.current_block()?;
        let header = self.new_block(&format!("{}.loop", var.name));
        let exit = self.new_block(&format!("{}.end", var.name));
        let any = self
            .b
            .build_int_compare(IntPredicate::SLT, begin, end, "any")?;
        self.b.build_conditional_branch(any, header, exit)?;
        self.b.position_at_end(header);
        let phi = self.b.build_phi(i64t, var.name)?;
        phi.add_incoming(&[(&begin, pre)]);
        self.bind_var(var, Some(phi.as_basic_value()));
        self.stmt(body)?;
        let i = phi.as_basic_value().into_int_value();
        let next = self.b.build_int_add(i, i64t.const_int(1, false), "next")?;
        phi.add_incoming(&[(&next, self.current_block()?)]);
        let more = self
            .b
            .build_int_compare(IntPredicate::SLT, next, end, "more")?;
        let br = self.b.build_conditional_branch(more, header, exit)?;
        if self.llvm_may_not_unroll(body) {
            self.disable_unroll(br);
        }
        self.b.position_at_end(exit);
        self.bind_var(var, None);
        Ok(())
    }

    /// LLVM type of a value of `d` (bool is `i1`).
    pub(super) fn scalar_ty(&self, d: DType) -> BasicTypeEnum<'ctx> {
        match d {
            DType::Bool => self.cx.bool_type().into(),
            DType::I32 => self.cx.i32_type().into(),
            DType::I64 => self.cx.i64_type().into(),
            DType::F32 => self.cx.f32_type().into(),
            DType::F64 => self.cx.f64_type().into(),
            // Bits only: arithmetic converts to f32 first.
            DType::BF16 => self.cx.i16_type().into(),
        }
    }

    /// LLVM type of an element of a `d` buffer in memory (bool is a byte).
    pub(super) fn mem_ty(&self, d: DType) -> BasicTypeEnum<'ctx> {
        match d {
            DType::Bool => self.cx.i8_type().into(),
            d => self.scalar_ty(d),
        }
    }

    pub(super) fn mem_bytes(&self, d: DType) -> u64 {
        d.bytes() as u64
    }

    /// A value of `d` as stored in memory (bools widen to a byte).
    pub(super) fn storable_value(
        &mut self,
        v: BasicValueEnum<'ctx>,
        d: DType,
    ) -> Res<BasicValueEnum<'ctx>> {
        if d != DType::Bool {
            return Ok(v);
        }
        Ok(match v {
            BasicValueEnum::IntValue(i) => self
                .b
                .build_int_z_extend(i, self.cx.i8_type(), "b8")?
                .into(),
            BasicValueEnum::VectorValue(x) => {
                let t = self.cx.i8_type().vec_type(x.get_type().get_size());
                self.b.build_int_z_extend(x, t, "b8")?.into()
            }
            _ => {
                return Err(CodegenError::InvalidIr(
                    "bool value is not an integer".into(),
                ))
            }
        })
    }
}

/// True if `body` holds a loop of more than `limit` iterations that the schedule marked
/// neither unrolled nor vectorized (so that it stays a loop in the emitted code).
fn contains_rolled_loop(body: &Stmt, limit: i64) -> bool {
    let mut found = false;
    body.visit(&mut |s| {
        if let Stmt::For { extent, kind, .. } = s {
            if !matches!(kind, ForKind::Unrolled | ForKind::Vectorized) && *extent > limit {
                found = true;
            }
        }
    });
    found
}

/// True if `body` stores into a buffer a value that reads that buffer (an update, such as
/// the accumulation of a reduction).
fn updates(body: &Stmt) -> bool {
    let mut found = false;
    body.visit(&mut |s| {
        if let Stmt::Store { buf, value, .. } = s {
            value.visit(&mut |e| {
                if let Expr::BufLoad { buf: b, .. } = e {
                    found |= b == buf;
                }
            });
        }
    });
    found
}

/// The terms of an integer sum (`a + b + c` in any nesting), in order; anything else is one
/// term.
fn sum_terms<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
    match e {
        Expr::Bin(BinOp::Add, a, b) if a.dtype().is_int() => {
            sum_terms(a, out);
            sum_terms(b, out);
        }
        _ => out.push(e),
    }
}

//! PTX for NVIDIA GPUs: loop IR to LLVM IR for the `nvptx64-nvidia-cuda` target, then PTX
//! assembly text from LLVM's NVPTX back end (the first step of the CUDA backend).
//!
//! The kernel takes one `ptr addrspace(1)` (global memory) parameter per buffer of
//! [`LoweredFunc::params`], in order, and returns nothing. A loop bound to a block or thread
//! axis ([`ForKind::ThreadBound`]) is not a loop on the GPU: its variable is the matching
//! special register (`%ctaid.x`, `%tid.y`, ...), and the launch ([`launch_dims`]) provides one
//! block or thread per iteration. Where two sibling loop nests bind the same axis with
//! different extents, the launch covers the larger one and the smaller loop's body runs under
//! `if idx < extent`. Every other loop (serial, parallel, vectorized, virtual thread) is an
//! ordinary loop in each thread; unrolled and virtual-thread loops (which lowering has
//! pushed down to the statements that differ between virtual threads) are unrolled here up
//! to a budget, and a
//! vectorized loop that copies 2 or 4 provably contiguous, aligned elements (a cooperative
//! fetch's share) is one wide load and store (`Gen::vector_copy`).
//!
//! This is a separate, scalar generator rather than the CPU one of [`super::llvm`]: that one
//! is built around the CPU runtime table (parallel loops outlined through it, heap
//! temporaries allocated through it), its vectorized loops and libm calls, none of which a
//! GPU kernel has. Its expression semantics are kept: integer `Div`/`Mod` are floor division
//! and modulo with a divisor of 0 giving 0, float `min`/`max` ignore NaN, float-to-int casts
//! saturate, and a `Select` whose branches load memory evaluates only the chosen branch.
//!
//! What the GPU changes:
//! - `exp`, `log` and `tanh` of f32 use the PTX approximate instructions (`ex2.approx`,
//!   `lg2.approx`: the accuracy of CUDA's `__expf`/`__logf`, a few ulp). The NVPTX back end
//!   has no lowering of `llvm.exp`/`llvm.log` without libdevice, so those of f64 are written
//!   out here in plain FMAs and bit operations (range reduction and a polynomial; within a
//!   few ulp, see `exp_f64`, `log_f64`, `tanh_f64`): the PTX needs no library at all.
//! - `Local` temporaries are per-thread (`alloca`, which NVPTX places in local memory),
//!   `Shared` ones are `addrspace(3)` arrays (one per block), and `Global` ones outside every
//!   bound loop are static `addrspace(1)` arrays of the module (one per launch; two launches
//!   of one loaded module at once would share them). A `Global` temporary inside a bound loop
//!   is unsupported: it would be one per block or thread, and a kernel cannot allocate device
//!   memory.
//! - `Sync` is `bar.sync 0`. The buffer parameters are `noalias` (as the CPU kernel's are),
//!   which tells LLVM that no other pointer in *this thread* reaches them: threads that pass
//!   data to each other through a barrier should do it in shared memory, as GPU sketches do,
//!   not through a parameter buffer.
//! - Statements outside every thread-bound loop run in every thread of the launch: the IR is
//!   expected to put each store under the thread loops (as GPU sketches do).

use super::CodegenError;
use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::basic_block::BasicBlock;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::{Linkage, Module};
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine, TargetTriple,
};
use inkwell::types::{BasicMetadataTypeEnum, BasicType, BasicTypeEnum};
use inkwell::values::{
    BasicMetadataValueEnum, BasicValue, BasicValueEnum, FloatValue, FunctionValue, IntValue,
    PointerValue,
};
use inkwell::{AddressSpace, FloatPredicate, IntPredicate, OptimizationLevel};
use std::sync::Once;
use tensortune_schedules::expr::{BinOp, CmpOp, Intrinsic as Intr, PairOp};
use tensortune_schedules::ir::{BufKind, ForKind, LoweredFunc, Scope, Stmt, ThreadAxis};
use tensortune_schedules::verify::verify;
use tensortune_schedules::{BufId, Const, DType, Expr, Var};

type Res<T> = Result<T, CodegenError>;
type V<'ctx> = BasicValueEnum<'ctx>;

/// The LLVM target triple of 64-bit CUDA.
pub const TRIPLE: &str = "nvptx64-nvidia-cuda";

/// The PTX ISA version asked of LLVM: 8.0 is the first with `sm_90`, and LLVM 19 knows it.
pub const PTX_FEATURES: &str = "+ptx80";

use tensortune_schedules::gpu::slot;
pub use tensortune_schedules::gpu::{launch_dims, LaunchDims, LaunchError, MAX_BLOCK_THREADS};

impl From<LaunchError> for CodegenError {
    fn from(e: LaunchError) -> Self {
        match e {
            LaunchError::RebindWider { .. } => CodegenError::InvalidIr(e.to_string()),
            _ => CodegenError::Unsupported(e.to_string()),
        }
    }
}

/// `ln 2` rounded to a double, and the part of it that rounding lost (`ln 2 - LN2_HI`,
/// rounded): Cody and Waite's two-part constant.
const LN2_HI: f64 = std::f64::consts::LN_2;
const LN2_LO: f64 = 2.319_046_813_846_299_6e-17;

/// An unrolled loop whose copies of statements would pass this many stays a loop (the same
/// budget as the CPU generator's default).
const MAX_UNROLL: i64 = 256;

/// The PTX text of `func` as one kernel named `func.name`, for the GPU architecture `arch`
/// (an LLVM NVPTX CPU name such as `sm_80` or `sm_90`), optimized by LLVM's O3 pipeline.
pub fn emit_ptx(func: &LoweredFunc, arch: &str) -> Result<String, CodegenError> {
    with_optimized_module(func, arch, |module, tm| {
        let buf = tm
            .write_to_memory_buffer(module, FileType::Assembly)
            .map_err(|e| CodegenError::Llvm(e.to_string()))?;
        String::from_utf8(buf.as_slice().to_vec())
            .map(|s| s.trim_end_matches('\0').to_string())
            .map_err(|e| CodegenError::Llvm(format!("PTX is not UTF-8: {e}")))
    })
}

/// The LLVM IR text of the NVPTX module [`emit_ptx`] assembles: the same kernel, optimized
/// the same way, before the NVPTX back end turns it into PTX.
pub fn emit_nvptx_llvm_ir(func: &LoweredFunc, arch: &str) -> Result<String, CodegenError> {
    with_optimized_module(func, arch, |module, _| {
        Ok(module.print_to_string().to_string())
    })
}

/// Builds the module of `func` for `arch`, verifies and optimizes it, and hands it to `then`
/// (the module lives in a context local to this call, hence the callback).
fn with_optimized_module<R>(
    func: &LoweredFunc,
    arch: &str,
    then: impl FnOnce(&Module<'_>, &TargetMachine) -> Res<R>,
) -> Res<R> {
    // The kernel name must be a PTX identifier; a C identifier is one.
    super::llvm::check_name(&func.name)?;
    // The loop IR's invariants (parameters are inputs and outputs, variables bound, dtypes
    // consistent) up front, so that what is left to fail here is the GPU's own limits.
    verify(func).map_err(CodegenError::InvalidIr)?;
    let dims = launch_dims(func)?;
    let tm = target_machine(arch)?;
    let cx = Context::create();
    let module = cx.create_module(&func.name);
    module.set_triple(&tm.get_triple());
    module.set_data_layout(&tm.get_target_data().get_data_layout());
    emit_kernel(&cx, &module, func, dims)?;
    module
        .verify()
        .map_err(|e| CodegenError::Llvm(format!("module does not verify: {e}")))?;
    module
        .run_passes("default<O3>", &tm, PassBuilderOptions::create())
        .map_err(|e| CodegenError::Llvm(format!("pipeline: {e}")))?;
    then(&module, &tm)
}

/// An NVPTX target machine for `arch`. An unknown architecture is an error here rather than
/// LLVM's warning and a generic target.
fn target_machine(arch: &str) -> Res<TargetMachine> {
    static INIT: Once = Once::new();
    INIT.call_once(|| Target::initialize_nvptx(&InitializationConfig::default()));
    let digits = arch.strip_prefix("sm_").unwrap_or("");
    let digits = digits.strip_suffix('a').unwrap_or(digits);
    if digits.len() < 2 || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return Err(CodegenError::Target(format!(
            "`{arch}` is no GPU architecture (expected e.g. sm_90)"
        )));
    }
    let triple = TargetTriple::create(TRIPLE);
    let target = Target::from_triple(&triple).map_err(|e| CodegenError::Target(e.to_string()))?;
    target
        .create_target_machine(
            &triple,
            arch,
            PTX_FEATURES,
            OptimizationLevel::Aggressive,
            RelocMode::Default,
            CodeModel::Default,
        )
        .ok_or_else(|| CodegenError::Target(format!("no NVPTX target machine for {arch}")))
}

/// Buffers some statement stores to.
fn stored_buffers(func: &LoweredFunc) -> Vec<bool> {
    let mut stored = vec![false; func.buffers.len()];
    func.body.visit(&mut |s| {
        if let Stmt::Store { buf, .. } = s {
            if let Some(x) = stored.get_mut(buf.0 as usize) {
                *x = true;
            }
        }
    });
    stored
}

/// Emitter state for the one kernel.
struct PtxGen<'ctx, 'f> {
    cx: &'ctx Context,
    module: &'f Module<'ctx>,
    b: Builder<'ctx>,
    func: &'f LoweredFunc,
    kernel: FunctionValue<'ctx>,
    /// Entry block, where per-thread temporaries are allocated (at its top).
    entry: BasicBlock<'ctx>,
    dims: LaunchDims,
    /// Pointer of each live buffer, by `BufId`.
    bufs: Vec<Option<PointerValue<'ctx>>>,
    /// Value (i64) of each bound loop variable, by var id.
    vars: Vec<Option<IntValue<'ctx>>>,
    /// Block and thread loops around the statement being emitted.
    bound_depth: u32,
    /// The module-level array of each shared or global temporary, by `BufId`, made at its
    /// first `Allocate`: a loop unrolled here emits that `Allocate` once per copy, and each
    /// copy must be the same memory (the IR has one such buffer, not one per iteration).
    statics: Vec<Option<PointerValue<'ctx>>>,
}

fn emit_kernel<'ctx>(
    cx: &'ctx Context,
    module: &Module<'ctx>,
    func: &LoweredFunc,
    dims: LaunchDims,
) -> Res<()> {
    let global = cx.ptr_type(AddressSpace::from(1u16));
    let params: Vec<BasicMetadataTypeEnum> = func.params.iter().map(|_| global.into()).collect();
    let kernel = module.add_function(
        &func.name,
        cx.void_type().fn_type(&params, false),
        Some(Linkage::External),
    );
    // LLVM 19 finds kernels by the `nvvm.annotations` metadata; later versions by the
    // `ptx_kernel` calling convention (71), which 19 also accepts. Both, for either.
    kernel.set_call_conventions(71);
    let kernel_ptr = kernel.as_global_value().as_pointer_value();
    let md = cx.metadata_node(&[
        kernel_ptr.into(),
        cx.metadata_string("kernel").into(),
        cx.i32_type().const_int(1, false).into(),
    ]);
    module
        .add_global_metadata("nvvm.annotations", &md)
        .map_err(|e| CodegenError::Llvm(e.to_string()))?;
    let attr = |name: &str| cx.create_enum_attribute(Attribute::get_named_enum_kind_id(name), 0);
    kernel.add_attribute(AttributeLoc::Function, attr("nounwind"));
    let stored = stored_buffers(func);
    let mut bufs = vec![None; func.buffers.len()];
    for (i, &p) in func.params.iter().enumerate() {
        let loc = AttributeLoc::Param(i as u32);
        // Distinct buffers never overlap; a buffer only read lets NVPTX use the read-only
        // data cache (`ld.global.nc`).
        kernel.add_attribute(loc, attr("noalias"));
        kernel.add_attribute(loc, attr("nocapture"));
        if !stored[p.0 as usize] {
            kernel.add_attribute(loc, attr("readonly"));
        }
        let v = kernel
            .get_nth_param(i as u32)
            .ok_or_else(|| CodegenError::Llvm("missing parameter".into()))?;
        *bufs
            .get_mut(p.0 as usize)
            .ok_or_else(|| CodegenError::InvalidIr("buffer id out of range".into()))? =
            Some(v.into_pointer_value());
    }
    let entry = cx.append_basic_block(kernel, "entry");
    let b = cx.create_builder();
    b.position_at_end(entry);
    let mut g = PtxGen {
        cx,
        module,
        b,
        func,
        kernel,
        entry,
        dims,
        bufs,
        vars: vec![None; func.num_vars as usize],
        bound_depth: 0,
        statics: vec![None; func.buffers.len()],
    };
    g.stmt(&func.body)?;
    g.b.build_return(None)?;
    Ok(())
}

fn invalid(msg: impl Into<String>) -> CodegenError {
    CodegenError::InvalidIr(msg.into())
}

impl<'ctx> PtxGen<'ctx, '_> {
    fn block(&self, name: &str) -> BasicBlock<'ctx> {
        self.cx.append_basic_block(self.kernel, name)
    }

    fn here(&self) -> Res<BasicBlock<'ctx>> {
        self.b
            .get_insert_block()
            .ok_or_else(|| CodegenError::Llvm("builder is not positioned".into()))
    }

    fn decl(&self, id: BufId) -> Res<&tensortune_schedules::ir::BufferDecl> {
        self.func
            .buffers
            .get(id.0 as usize)
            .ok_or_else(|| invalid(format!("buffer {} undeclared", id.0)))
    }

    fn set_var(&mut self, v: &Var, val: Option<IntValue<'ctx>>) {
        let i = v.id as usize;
        if i >= self.vars.len() {
            self.vars.resize(i + 1, None);
        }
        self.vars[i] = val;
    }

    fn stmt(&mut self, s: &Stmt) -> Res<()> {
        match s {
            Stmt::Seq(items) => items.iter().try_for_each(|x| self.stmt(x)),
            Stmt::Store { buf, index, value } => self.store(*buf, index, value, None),
            Stmt::Shuffle {
                buf,
                index,
                value,
                lane_xor,
            } => self.store(*buf, index, value, Some(*lane_xor)),
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => {
                if *extent < 1 {
                    return Err(invalid(format!("loop `{}` has extent {extent}", var.name)));
                }
                match kind {
                    ForKind::ThreadBound(axis) if slot(*axis).is_some() => {
                        self.bound_loop(var, *extent, *axis, body)
                    }
                    ForKind::Vectorized if self.vector_copy(var, *extent, body)? => Ok(()),
                    // A virtual thread's copies are what it is for: independent work for the
                    // scheduler to interleave, each with its own registers.
                    ForKind::Unrolled | ForKind::ThreadBound(ThreadAxis::VThread)
                        if extent.saturating_mul(body.unrolled_copies()) <= MAX_UNROLL =>
                    {
                        for i in 0..*extent {
                            let c = self.cx.i64_type().const_int(i as u64, true);
                            self.set_var(var, Some(c));
                            self.stmt(body)?;
                        }
                        self.set_var(var, None);
                        Ok(())
                    }
                    _ => self.counted_loop(var, *extent, body),
                }
            }
            Stmt::Allocate { buf, body } => self.allocate(*buf, body),
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                let c = self.bool_value(cond)?;
                self.branch(c, then, otherwise.as_deref())
            }
            Stmt::Sync => {
                self.call_intrinsic("llvm.nvvm.barrier0", &[], &[])?;
                Ok(())
            }
            // A CPU cache hint; a GPU thread's next loads are another warp's latency to hide.
            Stmt::Prefetch { .. } => Ok(()),
        }
    }

    /// `buf[index] = value`; with `lane_xor`, the value is the one the warp lane at this
    /// lane XOR `lane_xor` computed (a [`Stmt::Shuffle`]).
    fn store(&mut self, buf: BufId, index: &Expr, value: &Expr, lane_xor: Option<u32>) -> Res<()> {
        let dtype = self.decl(buf)?.dtype;
        if value.dtype() != dtype {
            return Err(invalid(format!(
                "store of {} into a {dtype} buffer",
                value.dtype()
            )));
        }
        let mut v = self.expr(value)?;
        if let Some(m) = lane_xor {
            v = self.shuffle_xor(v, dtype, m)?;
        }
        let v = match (dtype, v) {
            (DType::Bool, V::IntValue(i)) => self
                .b
                .build_int_z_extend(i, self.cx.i8_type(), "b8")?
                .into(),
            _ => v,
        };
        let p = self.address(buf, index)?;
        self.b
            .build_store(p, v)?
            .set_alignment(dtype.bytes() as u32)
            .map_err(|e| CodegenError::Llvm(e.to_string()))?;
        Ok(())
    }

    /// `v` of the warp lane at this lane XOR `m`: `shfl.sync.bfly` over the full warp (mask
    /// all ones, clamp 31). The instruction moves 32 bits: a 64-bit value goes in two halves,
    /// a bool widened to 32 bits.
    fn shuffle_xor(&mut self, v: V<'ctx>, dtype: DType, m: u32) -> Res<V<'ctx>> {
        if m >= 32 {
            return Err(invalid(format!("warp shuffle with lane mask {m}")));
        }
        let i32t = self.cx.i32_type();
        let i64t = self.cx.i64_type();
        let all = i32t.const_all_ones();
        let lane = i32t.const_int(m as u64, false);
        let clamp = i32t.const_int(31, false);
        let word = |g: &mut Self, x: IntValue<'ctx>| -> Res<IntValue<'ctx>> {
            let r = g
                .call_intrinsic(
                    "llvm.nvvm.shfl.sync.bfly.i32",
                    &[],
                    &[all.into(), x.into(), lane.into(), clamp.into()],
                )?
                .ok_or_else(|| CodegenError::Llvm("shfl.sync.bfly returned nothing".into()))?;
            int(r)
        };
        Ok(match dtype {
            DType::F32 => self
                .call_intrinsic(
                    "llvm.nvvm.shfl.sync.bfly.f32",
                    &[],
                    &[all.into(), v, lane.into(), clamp.into()],
                )?
                .ok_or_else(|| CodegenError::Llvm("shfl.sync.bfly returned nothing".into()))?,
            DType::I32 => word(self, int(v)?)?.into(),
            DType::BF16 => {
                return Err(CodegenError::Unsupported(
                    "a cross-thread reduction of bf16".into(),
                ))
            }
            DType::Bool => {
                let w = self.b.build_int_z_extend(int(v)?, i32t, "w")?;
                let r = word(self, w)?;
                self.b
                    .build_int_compare(IntPredicate::NE, r, i32t.const_zero(), "b")?
                    .into()
            }
            DType::I64 | DType::F64 => {
                let bits = match v {
                    V::FloatValue(f) => self.b.build_bit_cast(f, i64t, "bits")?.into_int_value(),
                    _ => int(v)?,
                };
                let lo = self.b.build_int_truncate(bits, i32t, "lo")?;
                let hi = self
                    .b
                    .build_right_shift(bits, i64t.const_int(32, false), false, "hi")?;
                let hi = self.b.build_int_truncate(hi, i32t, "hi")?;
                let lo = word(self, lo)?;
                let hi = word(self, hi)?;
                let lo = self.b.build_int_z_extend(lo, i64t, "lo")?;
                let hi = self.b.build_int_z_extend(hi, i64t, "hi")?;
                let hi = self
                    .b
                    .build_left_shift(hi, i64t.const_int(32, false), "hi")?;
                let bits = self.b.build_or(hi, lo, "bits")?;
                if dtype == DType::F64 {
                    self.b.build_bit_cast(bits, self.cx.f64_type(), "f")?
                } else {
                    bits.into()
                }
            }
        })
    }

    /// `if c { then } else { otherwise }`: one block per arm, each ending at `endif`.
    fn branch(&mut self, c: IntValue<'ctx>, then: &Stmt, otherwise: Option<&Stmt>) -> Res<()> {
        let done = self.block("endif");
        let arms: Vec<(BasicBlock<'ctx>, &Stmt)> = std::iter::once(then)
            .chain(otherwise)
            .map(|s| (self.block("arm"), s))
            .collect();
        let on_true = arms.first().map_or(done, |a| a.0);
        let on_false = arms.get(1).map_or(done, |a| a.0);
        self.b.build_conditional_branch(c, on_true, on_false)?;
        for (bb, s) in arms {
            self.b.position_at_end(bb);
            self.stmt(s)?;
            self.b.build_unconditional_branch(done)?;
        }
        self.b.position_at_end(done);
        Ok(())
    }

    /// A loop bound to a block or thread axis: its variable is the axis's special register,
    /// guarded when the launch is larger than this loop.
    fn bound_loop(&mut self, var: &Var, extent: i64, axis: ThreadAxis, body: &Stmt) -> Res<()> {
        let (grid, d) = slot(axis).ok_or_else(|| invalid("virtual thread has no register"))?;
        let reg = format!(
            "llvm.nvvm.read.ptx.sreg.{}.{}",
            if grid { "ctaid" } else { "tid" },
            ["x", "y", "z"][d]
        );
        let idx = self
            .call_intrinsic(&reg, &[], &[])?
            .ok_or_else(|| CodegenError::Llvm(format!("{reg} returned nothing")))?;
        let idx = int(idx)?;
        // The register is below the launch's extent on this axis: said to LLVM, a block of
        // one thread's `tid.x` folds to 0, so an accumulator indexed by it stays an array of
        // registers (a variable index keeps it in local memory).
        let launch = self.dims.extent(axis) as u64;
        if let Some(call) = idx.as_instruction() {
            let i32t = self.cx.i32_type();
            let range = self.cx.metadata_node(&[
                i32t.const_zero().into(),
                i32t.const_int(launch.max(1), false).into(),
            ]);
            call.set_metadata(range, self.cx.get_kind_id("range"))
                .map_err(|e| CodegenError::Llvm(e.to_string()))?;
        }
        // The registers are below 2^31 and non-negative.
        let idx = self
            .b
            .build_int_z_extend(idx, self.cx.i64_type(), var.name)?;
        self.set_var(var, Some(idx));
        self.bound_depth += 1;
        let r = if (self.dims.extent(axis) as i64) > extent {
            let lim = self.cx.i64_type().const_int(extent as u64, false);
            let c = self
                .b
                .build_int_compare(IntPredicate::ULT, idx, lim, "in")?;
            self.branch(c, body, None)
        } else {
            self.stmt(body)
        };
        self.bound_depth -= 1;
        self.set_var(var, None);
        r
    }

    /// A vectorized loop of `lanes` iterations whose body copies consecutive elements, as a
    /// cooperative fetch into shared memory does: `dst[i(v)] = src[j(v)]` with both indices
    /// contiguous in the loop variable and their first element a multiple of `lanes`
    /// ([`tensortune_schedules::lanes`]), 2 or 4 elements of 4 or 8 bytes, at most 16 bytes,
    /// between shared and global memory. It becomes one `ld.v2`/`ld.v4` and one
    /// `st.v2`/`st.v4`, aligned to their width: shared arrays are declared 16-byte aligned and
    /// device allocations start on 256-byte boundaries. Anything else (a guard, arithmetic,
    /// a local temporary, an index the analysis cannot prove) returns `false` having emitted
    /// nothing, and the loop runs as an ordinary one.
    fn vector_copy(&mut self, var: &Var, lanes: i64, body: &Stmt) -> Res<bool> {
        let Stmt::Store {
            buf: dst,
            index: dst_index,
            value:
                Expr::BufLoad {
                    buf: src,
                    dtype,
                    index: src_index,
                },
        } = body
        else {
            return Ok(false);
        };
        let bytes = dtype.bytes() as i64;
        let fits = matches!(lanes, 2 | 4)
            && matches!(dtype, DType::F32 | DType::I32 | DType::F64 | DType::I64)
            && lanes * bytes <= 16;
        if !fits || self.decl(*dst)?.dtype != *dtype || self.decl(*src)?.dtype != *dtype {
            return Ok(false);
        }
        for (buf, index) in [(dst, dst_index), (src, src_index)] {
            let d = self.decl(*buf)?;
            let wide_memory = match d.kind {
                BufKind::Temp => matches!(d.scope, Scope::Shared | Scope::Global),
                BufKind::Input(_) | BufKind::Output(_) => true,
            };
            if !wide_memory
                || tensortune_schedules::lanes::lane_stride(index, var.id, lanes) != Some(1)
                || tensortune_schedules::lanes::divisor(index, var.id) % lanes != 0
            {
                return Ok(false);
            }
        }
        self.set_var(var, Some(self.cx.i64_type().const_zero()));
        let from = self.address(*src, src_index)?;
        let to = self.address(*dst, dst_index)?;
        let vt: BasicTypeEnum = match mem_ty(self.cx, *dtype) {
            BasicTypeEnum::FloatType(f) => f.vec_type(lanes as u32).into(),
            BasicTypeEnum::IntType(i) => i.vec_type(lanes as u32).into(),
            other => return Err(invalid(format!("vector of {other:?}"))),
        };
        let align = (lanes * bytes) as u32;
        let v = self.b.build_load(vt, from, "vld")?;
        if let Some(i) = v.as_instruction_value() {
            i.set_alignment(align)
                .map_err(|e| CodegenError::Llvm(e.to_string()))?;
        }
        self.b
            .build_store(to, v)?
            .set_alignment(align)
            .map_err(|e| CodegenError::Llvm(e.to_string()))?;
        self.set_var(var, None);
        Ok(true)
    }

    /// `for var in 0..extent` in each thread, tested at the top (LLVM rotates it: the
    /// extent is a constant of at least 1).
    fn counted_loop(&mut self, var: &Var, extent: i64, body: &Stmt) -> Res<()> {
        let i64t = self.cx.i64_type();
        let from = self.here()?;
        let [test, run, exit] =
            ["test", "body", "end"].map(|n| self.block(&format!("{}.{n}", var.name)));
        self.b.build_unconditional_branch(test)?;
        self.b.position_at_end(test);
        let phi = self.b.build_phi(i64t, var.name)?;
        let i = phi.as_basic_value().into_int_value();
        let lim = i64t.const_int(extent as u64, false);
        let go = self.b.build_int_compare(IntPredicate::SLT, i, lim, "go")?;
        self.b.build_conditional_branch(go, run, exit)?;
        self.b.position_at_end(run);
        self.set_var(var, Some(i));
        self.stmt(body)?;
        let step = self
            .b
            .build_int_nsw_add(i, i64t.const_int(1, false), "step")?;
        phi.add_incoming(&[(&i64t.const_zero(), from), (&step, self.here()?)]);
        self.b.build_unconditional_branch(test)?;
        self.b.position_at_end(exit);
        self.set_var(var, None);
        Ok(())
    }

    fn allocate(&mut self, buf: BufId, body: &Stmt) -> Res<()> {
        let decl = self.decl(buf)?.clone();
        if !matches!(decl.kind, BufKind::Temp) {
            return Err(invalid(format!("allocate of parameter `{}`", decl.name)));
        }
        let n = u32::try_from(decl.size().max(1)).map_err(|_| {
            CodegenError::Unsupported(format!("temporary `{}` is too large", decl.name))
        })?;
        let arr = mem_ty(self.cx, decl.dtype).array_type(n);
        let p = match decl.scope {
            Scope::Local => {
                let at = self.cx.create_builder();
                // At the top of the entry block, where LLVM's passes look for allocas.
                match self.entry.get_first_instruction() {
                    Some(first) => at.position_before(&first),
                    None => at.position_at_end(self.entry),
                }
                at.build_alloca(arr, &decl.name)?
            }
            Scope::Shared => {
                self.static_array(buf, arr, 3, &format!("{}_shared{}", decl.name, buf.0))
            }
            // One buffer for the whole launch, as the IR means it: static device memory.
            Scope::Global if self.bound_depth == 0 => {
                self.static_array(buf, arr, 1, &format!("{}_global{}", decl.name, buf.0))
            }
            Scope::Global => {
                return Err(CodegenError::Unsupported(format!(
                    "GPU: global temporary `{}` inside a bound loop (one per thread or block; \
                     a kernel cannot allocate device memory)",
                    decl.name
                )))
            }
            other => {
                return Err(CodegenError::Unsupported(format!(
                    "temporary `{}` in {} memory",
                    decl.name,
                    other.name()
                )))
            }
        };
        let i = buf.0 as usize;
        if self.bufs.get(i).copied().flatten().is_some() {
            return Err(invalid(format!("`{}` allocated twice", decl.name)));
        }
        self.bufs[i] = Some(p);
        let r = self.stmt(body);
        self.bufs[i] = None;
        r
    }

    /// A module-level array in address space `space` (1: global, 3: shared), uninitialized
    /// as temporaries are. External, not internal: LLVM's global optimizer splits an
    /// internal array whose every access has a constant index into scalars, each aligned
    /// on its own (a 12-float shared array took 84 bytes more than its size), and the GPU
    /// verifier's shared-memory figure would no longer be what the kernel uses. The module
    /// holds one kernel, so the names cannot clash.
    fn static_array(
        &mut self,
        buf: BufId,
        arr: inkwell::types::ArrayType<'ctx>,
        space: u16,
        name: &str,
    ) -> PointerValue<'ctx> {
        if let Some(p) = self.statics.get(buf.0 as usize).copied().flatten() {
            return p;
        }
        // A PTX identifier: LLVM rewrites other characters of internal names only.
        let name: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let g = self
            .module
            .add_global(arr, Some(AddressSpace::from(space)), &name);
        g.set_linkage(Linkage::External);
        g.set_initializer(&arr.get_undef());
        g.set_alignment(16);
        let p = g.as_pointer_value();
        if let Some(slot) = self.statics.get_mut(buf.0 as usize) {
            *slot = Some(p);
        }
        p
    }

    /// `&buf[index]`.
    fn address(&mut self, buf: BufId, index: &Expr) -> Res<PointerValue<'ctx>> {
        let base = self
            .bufs
            .get(buf.0 as usize)
            .copied()
            .flatten()
            .ok_or_else(|| invalid(format!("buffer {} used outside its allocation", buf.0)))?;
        let ty = mem_ty(self.cx, self.decl(buf)?.dtype);
        let idx = match self.expr(index)? {
            V::IntValue(i) if i.get_type().get_bit_width() == 64 => i,
            V::IntValue(i) => self.b.build_int_s_extend(i, self.cx.i64_type(), "idx")?,
            _ => return Err(invalid(format!("index `{index}` is not an integer"))),
        };
        // SAFETY: (for LLVM) every index is in bounds by the loop IR's invariant.
        Ok(unsafe { self.b.build_in_bounds_gep(ty, base, &[idx], "p")? })
    }

    fn bool_value(&mut self, e: &Expr) -> Res<IntValue<'ctx>> {
        match self.expr(e)? {
            V::IntValue(i) if i.get_type().get_bit_width() == 1 => Ok(i),
            _ => Err(invalid(format!("condition `{e}` is not a bool"))),
        }
    }

    /// Calls an LLVM intrinsic; `None` for one that returns nothing.
    fn call_intrinsic(
        &mut self,
        name: &str,
        overloads: &[BasicTypeEnum<'ctx>],
        args: &[V<'ctx>],
    ) -> Res<Option<V<'ctx>>> {
        let f = Intrinsic::find(name)
            .and_then(|i| i.get_declaration(self.module, overloads))
            .ok_or_else(|| CodegenError::Llvm(format!("no intrinsic {name}")))?;
        let args: Vec<BasicMetadataValueEnum> = args.iter().map(|&a| a.into()).collect();
        let c = self.b.build_call(f, &args, "")?;
        Ok(match c.try_as_basic_value() {
            inkwell::values::ValueKind::Basic(v) => Some(v),
            _ => None,
        })
    }

    /// An intrinsic overloaded on its operand's type, returning that type.
    fn math(&mut self, name: &str, args: &[V<'ctx>]) -> Res<V<'ctx>> {
        let ty = args
            .first()
            .map(|a| a.get_type())
            .ok_or_else(|| CodegenError::Llvm(format!("{name} without operands")))?;
        let over: &[BasicTypeEnum] = if name.starts_with("llvm.nvvm.") {
            &[]
        } else {
            &[ty]
        };
        self.call_intrinsic(name, over, args)?
            .ok_or_else(|| CodegenError::Llvm(format!("{name} returned nothing")))
    }

    fn expr(&mut self, e: &Expr) -> Res<V<'ctx>> {
        Ok(match e {
            Expr::Pair(op, a, b) => {
                if a.dtype() != op.operand() || b.dtype() != op.operand() {
                    return Err(invalid(format!(
                        "operands of `{e}` are not {}",
                        op.operand()
                    )));
                }
                let (x, y) = (int(self.expr(a)?)?, int(self.expr(b)?)?);
                match op {
                    PairOp::Pack => self.pack_bf16(x, y)?,
                    PairOp::Dot => self.dot_bf16(None, x, y)?,
                }
            }
            // `acc + dot_bf16(x, y)` (either order): the products added to the accumulator one
            // at a time, as the CPU's unpacked form does.
            Expr::Bin(BinOp::Add, a, b) if dot_operand(a, b).is_some() => {
                let Some((acc, x, y)) = dot_operand(a, b) else {
                    return Err(invalid(format!("`{e}` is not an accumulated dot product")));
                };
                if acc.dtype() != DType::F32 || x.dtype() != DType::I32 || y.dtype() != DType::I32 {
                    return Err(invalid(format!(
                        "operands of `{e}` are not f32 and i32 pairs"
                    )));
                }
                let acc = float(self.expr(acc)?)?;
                let (x, y) = (int(self.expr(x)?)?, int(self.expr(y)?)?);
                self.dot_bf16(Some(acc), x, y)?
            }
            Expr::Const(c) => constant(self.cx, *c),
            Expr::Var(v) => self
                .vars
                .get(v.id as usize)
                .copied()
                .flatten()
                .ok_or_else(|| invalid(format!("variable `{}` used outside its loop", v.name)))?
                .into(),
            Expr::Bin(_, a, b) | Expr::Cmp(_, a, b) | Expr::Select(_, a, b)
                if a.dtype() != b.dtype() =>
            {
                return Err(invalid(format!("operands of `{e}` have different dtypes")));
            }
            Expr::Bin(op, a, b) => {
                let (x, y) = (self.expr(a)?, self.expr(b)?);
                self.arith(*op, a.dtype(), x, y)?
            }
            Expr::Cmp(op, a, b) => {
                let (x, y) = (self.expr(a)?, self.expr(b)?);
                self.compare(*op, a.dtype(), x, y)?
            }
            Expr::And(a, b) => {
                let (x, y) = (self.bool_value(a)?, self.bool_value(b)?);
                self.b.build_and(x, y, "and")?.into()
            }
            Expr::Or(a, b) => {
                let (x, y) = (self.bool_value(a)?, self.bool_value(b)?);
                self.b.build_or(x, y, "or")?.into()
            }
            Expr::Not(a) => {
                let x = self.bool_value(a)?;
                self.b.build_not(x, "not")?.into()
            }
            Expr::Select(c, t, f) => {
                let c = self.bool_value(c)?;
                if reads_memory(t) || reads_memory(f) {
                    self.branchy_select(c, t, f)?
                } else {
                    let (t, f) = (self.expr(t)?, self.expr(f)?);
                    self.b.build_select(c, t, f, "sel")?
                }
            }
            Expr::Cast(to, a) => {
                let x = self.expr(a)?;
                self.convert(x, a.dtype(), *to)?
            }
            Expr::Call(f, a) => {
                let x = self.expr(a)?;
                self.intrinsic_call(*f, a.dtype(), x)?
            }
            Expr::BufLoad { buf, dtype, index } => {
                if self.decl(*buf)?.dtype != *dtype {
                    return Err(invalid(format!(
                        "load of {dtype} from a buffer of another dtype"
                    )));
                }
                let p = self.address(*buf, index)?;
                let v = self.b.build_load(mem_ty(self.cx, *dtype), p, "ld")?;
                if let Some(i) = v.as_instruction_value() {
                    i.set_alignment(dtype.bytes() as u32)
                        .map_err(|e| CodegenError::Llvm(e.to_string()))?;
                }
                match (dtype, v) {
                    (DType::Bool, V::IntValue(byte)) => {
                        let zero = self.cx.i8_type().const_zero();
                        self.b
                            .build_int_compare(IntPredicate::NE, byte, zero, "b")?
                            .into()
                    }
                    _ => v,
                }
            }
            Expr::Load { .. } | Expr::Reduce { .. } => {
                return Err(invalid(format!("tensor expression `{e}` in loop IR")))
            }
        })
    }

    /// `c ? t : f` evaluating only the chosen side (the other's loads may be out of bounds).
    fn branchy_select(&mut self, c: IntValue<'ctx>, t: &Expr, f: &Expr) -> Res<V<'ctx>> {
        let (tb, fb, done) = (self.block("sel.t"), self.block("sel.f"), self.block("sel"));
        self.b.build_conditional_branch(c, tb, fb)?;
        let mut arms = Vec::with_capacity(2);
        for (bb, e) in [(tb, t), (fb, f)] {
            self.b.position_at_end(bb);
            let v = self.expr(e)?;
            arms.push((v, self.here()?));
            self.b.build_unconditional_branch(done)?;
        }
        self.b.position_at_end(done);
        let phi = self.b.build_phi(arms[0].0.get_type(), "sel")?;
        for (v, bb) in &arms {
            phi.add_incoming(&[(v, *bb)]);
        }
        Ok(phi.as_basic_value())
    }

    fn arith(&mut self, op: BinOp, d: DType, x: V<'ctx>, y: V<'ctx>) -> Res<V<'ctx>> {
        use inkwell::values::InstructionOpcode as O;
        let opcode = match (op, d.is_float()) {
            (BinOp::Add, true) => O::FAdd,
            (BinOp::Sub, true) => O::FSub,
            (BinOp::Mul, true) => O::FMul,
            (BinOp::Div, true) => O::FDiv,
            (BinOp::Min, true) => return self.math("llvm.minnum", &[x, y]),
            (BinOp::Max, true) => return self.math("llvm.maxnum", &[x, y]),
            (BinOp::Mod, true) => return Err(invalid("modulo of floats")),
            _ if !d.is_int() => return Err(invalid(format!("arithmetic on {d}"))),
            (BinOp::Add, false) => O::Add,
            (BinOp::Sub, false) => O::Sub,
            (BinOp::Mul, false) => O::Mul,
            (BinOp::Min, false) => return self.math("llvm.smin", &[x, y]),
            (BinOp::Max, false) => return self.math("llvm.smax", &[x, y]),
            (BinOp::Div | BinOp::Mod, false) => {
                return self.floor_op(op == BinOp::Div, int(x)?, int(y)?)
            }
        };
        let v = self.b.build_binop(opcode, x, y, "arith")?;
        if d.is_float() && opcode != O::FDiv {
            if let Some(i) = v.as_instruction_value() {
                // As on the CPU: a multiply and an add may fuse (FMA), nothing else relaxed.
                let _ = i.set_fast_math_flags(inkwell::values::FastMathFlags::AllowContract);
            }
        }
        Ok(v)
    }

    /// Floor division (`div`) or floor modulo of integers; a divisor of 0 gives 0, and one
    /// of -1 gives `-x` (wrapping) and 0 instead of LLVM's undefined overflow. With a constant
    /// divisor LLVM folds the guards away.
    fn floor_op(&mut self, div: bool, x: IntValue<'ctx>, y: IntValue<'ctx>) -> Res<V<'ctx>> {
        let b = &self.b;
        let t = x.get_type();
        let (zero, one) = (t.const_zero(), t.const_int(1, false));
        let y_zero = b.build_int_compare(IntPredicate::EQ, y, zero, "y0")?;
        let y_m1 = b.build_int_compare(IntPredicate::EQ, y, t.const_all_ones(), "ym1")?;
        let trap = b.build_or(y_zero, y_m1, "trap")?;
        let ys = b.build_select(trap, one, y, "ys")?.into_int_value();
        let q = b.build_int_signed_div(x, ys, "q")?;
        let r = b.build_int_signed_rem(x, ys, "r")?;
        // Truncating division rounds toward 0; floor differs when the remainder is nonzero
        // and its sign is not the divisor's.
        let r_neg = b.build_int_compare(IntPredicate::SLT, r, zero, "rneg")?;
        let y_neg = b.build_int_compare(IntPredicate::SLT, ys, zero, "yneg")?;
        let r_nz = b.build_int_compare(IntPredicate::NE, r, zero, "rnz")?;
        let signs = b.build_xor(r_neg, y_neg, "signs")?;
        let fix = b.build_and(r_nz, signs, "fix")?;
        let (v, at_m1) = if div {
            let fixed = b.build_int_sub(q, b.build_int_z_extend(fix, t, "fixi")?, "fdiv")?;
            (fixed, b.build_int_neg(x, "negx")?)
        } else {
            let up = b.build_int_add(r, ys, "rup")?;
            let fixed = b.build_select(fix, up, r, "fmod")?.into_int_value();
            (fixed, zero)
        };
        let v = b.build_select(y_m1, at_m1, v, "m1")?.into_int_value();
        Ok(b.build_select(y_zero, zero, v, "d0")?)
    }

    fn compare(&mut self, op: CmpOp, d: DType, x: V<'ctx>, y: V<'ctx>) -> Res<V<'ctx>> {
        use CmpOp::*;
        if d.is_float() {
            // Ordered, except `!=`, which holds on NaN as in Rust.
            let p = [
                (Eq, FloatPredicate::OEQ),
                (Ne, FloatPredicate::UNE),
                (Lt, FloatPredicate::OLT),
                (Le, FloatPredicate::OLE),
                (Gt, FloatPredicate::OGT),
                (Ge, FloatPredicate::OGE),
            ]
            .iter()
            .find(|(o, _)| *o == op)
            .map_or(FloatPredicate::OEQ, |&(_, p)| p);
            let (a, b) = (float(x)?, float(y)?);
            return Ok(self.b.build_float_compare(p, a, b, "fcmp")?.into());
        }
        // Bools compare as unsigned 0/1, integers as signed.
        let (lt, le, gt, ge) = if d == DType::Bool {
            use IntPredicate::{UGE, UGT, ULE, ULT};
            (ULT, ULE, UGT, UGE)
        } else {
            use IntPredicate::{SGE, SGT, SLE, SLT};
            (SLT, SLE, SGT, SGE)
        };
        let p = match op {
            Eq => IntPredicate::EQ,
            Ne => IntPredicate::NE,
            Lt => lt,
            Le => le,
            Gt => gt,
            Ge => ge,
        };
        let (a, b) = (int(x)?, int(y)?);
        Ok(self.b.build_int_compare(p, a, b, "icmp")?.into())
    }

    fn convert(&mut self, x: V<'ctx>, from: DType, to: DType) -> Res<V<'ctx>> {
        use inkwell::values::InstructionOpcode as O;
        if from == to {
            return Ok(x);
        }
        // bf16 is a storage type (its bits in an i16): it converts through f32.
        if from == DType::BF16 {
            let f = self.bf16_to_f32(int(x)?)?;
            return self.convert(f.into(), DType::F32, to);
        }
        if to == DType::BF16 {
            let f = self.convert(x, from, DType::F32)?;
            return Ok(self.f32_to_bf16(float(f)?)?.into());
        }
        let to_ty = reg_ty(self.cx, to);
        if to == DType::Bool {
            return Ok(match x {
                V::FloatValue(f) => {
                    let z = f.get_type().const_zero();
                    self.b
                        .build_float_compare(FloatPredicate::UNE, f, z, "tobool")?
                        .into()
                }
                V::IntValue(i) => {
                    let z = i.get_type().const_zero();
                    self.b
                        .build_int_compare(IntPredicate::NE, i, z, "tobool")?
                        .into()
                }
                _ => return Err(invalid(format!("cast from {from} to bool"))),
            });
        }
        let wider = to.bytes() > from.bytes();
        let op = match (from, from.is_float(), to.is_float()) {
            (DType::Bool, _, false) => O::ZExt,
            (DType::Bool, _, true) => O::UIToFP,
            (_, false, false) if wider => O::SExt,
            (_, false, false) => O::Trunc,
            (_, false, true) => O::SIToFP,
            (_, true, true) if wider => O::FPExt,
            (_, true, true) => O::FPTrunc,
            // Saturating, like Rust's `as` (NaN to 0).
            (_, true, false) => {
                return self
                    .call_intrinsic("llvm.fptosi.sat", &[to_ty, x.get_type()], &[x])?
                    .ok_or_else(|| CodegenError::Llvm("fptosi.sat returned nothing".into()))
            }
        };
        Ok(self.b.build_cast(op, x, to_ty, "cast")?)
    }

    /// The f32 of a bf16 (its bits in an i16): the bits shifted into the upper half.
    fn bf16_to_f32(&mut self, x: IntValue<'ctx>) -> Res<FloatValue<'ctx>> {
        let i32t = self.cx.i32_type();
        let w = self.b.build_int_z_extend(x, i32t, "bfw")?;
        let hi = self
            .b
            .build_left_shift(w, i32t.const_int(16, false), "bfhi")?;
        Ok(self
            .b
            .build_bit_cast(hi, self.cx.f32_type(), "bff")?
            .into_float_value())
    }

    /// The bf16 nearest an f32, ties to even, as `tensortune_schedules::data::f32_to_bf16`
    /// rounds and the CPU code generator converts (a NaN becomes a quiet NaN of its sign and
    /// upper payload).
    fn f32_to_bf16(&mut self, x: FloatValue<'ctx>) -> Res<IntValue<'ctx>> {
        let i32t = self.cx.i32_type();
        let c = |v: u64| i32t.const_int(v, false);
        let bits = self.b.build_bit_cast(x, i32t, "fbits")?.into_int_value();
        let kept = self.b.build_right_shift(bits, c(16), false, "kept")?;
        let odd = self.b.build_and(kept, c(1), "odd")?;
        let round = self.b.build_int_add(c(0x7fff), odd, "round")?;
        let sum = self.b.build_int_add(bits, round, "rsum")?;
        let rounded = self.b.build_right_shift(sum, c(16), false, "rnd")?;
        let nan = self.b.build_or(kept, c(0x40), "qnan")?;
        let is_nan = self
            .b
            .build_float_compare(FloatPredicate::UNO, x, x, "isnan")?;
        let r = self
            .b
            .build_select(is_nan, nan, rounded, "bfr")?
            .into_int_value();
        Ok(self.b.build_int_truncate(r, self.cx.i16_type(), "bf16")?)
    }

    /// Two bf16 (i16 bits) packed into one i32 word, `lo` in the low half.
    fn pack_bf16(&mut self, lo: IntValue<'ctx>, hi: IntValue<'ctx>) -> Res<V<'ctx>> {
        let i32t = self.cx.i32_type();
        let l = self.b.build_int_z_extend(lo, i32t, "plo")?;
        let h = self.b.build_int_z_extend(hi, i32t, "phi")?;
        let h = self
            .b
            .build_left_shift(h, i32t.const_int(16, false), "phis")?;
        Ok(self.b.build_or(l, h, "pair")?.into())
    }

    /// `acc + lo(x)·lo(y) + hi(x)·hi(y)` of two packed bf16 words (`acc` 0 when `None`): each
    /// half widened to f32 (the low one shifted up, the high one masked), the products (exact
    /// in f32) added in that order, a multiply and an add free to fuse as elsewhere.
    fn dot_bf16(
        &mut self,
        acc: Option<FloatValue<'ctx>>,
        x: IntValue<'ctx>,
        y: IntValue<'ctx>,
    ) -> Res<V<'ctx>> {
        let i32t = self.cx.i32_type();
        let mut halves = Vec::with_capacity(4);
        for w in [x, y] {
            let lo = self
                .b
                .build_left_shift(w, i32t.const_int(16, false), "lo")?;
            let hi = self
                .b
                .build_and(w, i32t.const_int(0xffff_0000, false), "hi")?;
            for h in [lo, hi] {
                halves.push(V::from(
                    self.b
                        .build_bit_cast(h, self.cx.f32_type(), "half")?
                        .into_float_value(),
                ));
            }
        }
        let lo = self.arith(BinOp::Mul, DType::F32, halves[0], halves[2])?;
        let hi = self.arith(BinOp::Mul, DType::F32, halves[1], halves[3])?;
        let first = match acc {
            Some(a) => self.arith(BinOp::Add, DType::F32, a.into(), lo)?,
            None => lo,
        };
        self.arith(BinOp::Add, DType::F32, first, hi)
    }

    fn intrinsic_call(&mut self, f: Intr, d: DType, x: V<'ctx>) -> Res<V<'ctx>> {
        match (f, d) {
            (Intr::Abs, DType::I32 | DType::I64) => {
                let poison_on_min = self.cx.bool_type().const_zero().into();
                self.math("llvm.abs", &[x, poison_on_min])
            }
            (_, DType::Bool | DType::I32 | DType::I64) => {
                Err(invalid(format!("{} of {d}", f.name())))
            }
            (Intr::Abs, _) => self.math("llvm.fabs", &[x]),
            (Intr::Sqrt, _) => self.math("llvm.sqrt", &[x]),
            (Intr::Exp, DType::F32) => self.exp_f32(x),
            (Intr::Log, DType::F32) => {
                let l2 = self.math("llvm.nvvm.lg2.approx.f", &[x])?;
                self.fmul_const(l2, std::f64::consts::LN_2)
            }
            (Intr::Tanh, DType::F32) => self.tanh_f32(x),
            (Intr::Exp, _) => self.exp_f64(x),
            (Intr::Log, _) => self.log_f64(x),
            (Intr::Tanh, _) => self.tanh_f64(x),
        }
    }

    fn f64c(&self, c: f64) -> V<'ctx> {
        self.cx.f64_type().const_float(c).into()
    }

    fn fma(&mut self, a: V<'ctx>, b: V<'ctx>, c: V<'ctx>) -> Res<V<'ctx>> {
        self.math("llvm.fma", &[a, b, c])
    }

    /// An f64 from its bits.
    fn f64_of_bits(&mut self, bits: IntValue<'ctx>) -> Res<V<'ctx>> {
        Ok(self.b.build_bit_cast(bits, self.cx.f64_type(), "f")?)
    }

    /// `e^x` in f64, within 1 ulp on a dense sample of [-745, 709] (the NVPTX back end has
    /// no `llvm.exp.f64`, and this needs no libdevice). `x = k ln 2 + r` with `k` the nearest
    /// integer to `x log2 e` and `r` in `[-ln2/2, ln2/2]` (Cody and Waite: `ln 2` in two parts,
    /// subtracted with FMAs, so that `r` keeps its digits); `e^r` by its Taylor polynomial to
    /// degree 13 (the first term left out is under 2e-16 relative); times `2^k` in two
    /// factors built from exponent bits, each a normal number even where `2^k` itself is not,
    /// so results in the subnormal range round once, and past the range become 0 or inf.
    fn exp_f64(&mut self, x: V<'ctx>) -> Res<V<'ctx>> {
        let i64t = self.cx.i64_type();
        // Clamp first, so that `k` fits its integer (NaN, which the clamp turns into a
        // number, is put back at the end): below -746 the result is 0, above 710 inf.
        let lo = self.f64c(-746.0);
        let hi = self.f64c(710.0);
        let xc = self.math("llvm.maxnum", &[x, lo])?;
        let xc = self.math("llvm.minnum", &[xc, hi])?;
        let t =
            self.b
                .build_float_mul(float(xc)?, float(self.f64c(std::f64::consts::LOG2_E))?, "t")?;
        let k = self.math("llvm.rint", &[t.into()])?;
        let nk = self.b.build_float_neg(float(k)?, "nk")?.into();
        let (ln2_hi, ln2_lo) = (self.f64c(LN2_HI), self.f64c(LN2_LO));
        let r = self.fma(nk, ln2_hi, xc)?;
        let r = self.fma(nk, ln2_lo, r)?;
        // Horner from 1/13! down to 1/0! (each factorial exact in f64, divided once).
        let inv_fact = |i: u32| 1.0 / (1..=i).map(f64::from).product::<f64>();
        let mut p = self.f64c(inv_fact(13));
        for i in (0..13).rev() {
            let c = self.f64c(inv_fact(i));
            p = self.fma(p, r, c)?;
        }
        let ki = self.b.build_float_to_signed_int(float(k)?, i64t, "k")?;
        let k1 = self
            .b
            .build_right_shift(ki, i64t.const_int(1, false), true, "k1")?;
        let k2 = self.b.build_int_sub(ki, k1, "k2")?;
        let mut y = float(p)?;
        for kk in [k1, k2] {
            let biased = self.b.build_int_add(kk, i64t.const_int(1023, false), "e")?;
            let bits = self
                .b
                .build_left_shift(biased, i64t.const_int(52, false), "eb")?;
            let scale = float(self.f64_of_bits(bits)?)?;
            y = self.b.build_float_mul(y, scale, "scaled")?;
        }
        let is_nan =
            self.b
                .build_float_compare(FloatPredicate::UNO, float(x)?, float(x)?, "nan")?;
        Ok(self.b.build_select(is_nan, float(x)?, y, "exp")?)
    }

    /// The natural logarithm in f64, within 2 ulp on a dense sample of positive doubles.
    /// `x = m 2^e` with `m` in `[sqrt(1/2), sqrt 2]` (subnormals scaled by `2^54` first);
    /// `ln m = 2 atanh s` with `s = (m - 1) / (m + 1)`, `|s| <= 0.172`, by its odd series to
    /// `s^21` (the first term left out is under 1e-17 relative); plus `e ln 2` in two parts.
    /// Negative `x` and NaN give NaN, 0 gives -inf, inf gives inf.
    fn log_f64(&mut self, x: V<'ctx>) -> Res<V<'ctx>> {
        let (i64t, f64t) = (self.cx.i64_type(), self.cx.f64_type());
        let xf = float(x)?;
        let min_normal = f64t.const_float(f64::MIN_POSITIVE);
        let sub = self
            .b
            .build_float_compare(FloatPredicate::OLT, xf, min_normal, "sub")?;
        let up = self
            .b
            .build_float_mul(xf, f64t.const_float(2f64.powi(54)), "up")?;
        let xs = self.b.build_select(sub, up, xf, "xs")?;
        let adj = self.b.build_select(
            sub,
            i64t.const_int((-54i64) as u64, true),
            i64t.const_zero(),
            "adj",
        )?;
        let bits = self.b.build_bit_cast(xs, i64t, "bits")?.into_int_value();
        let biased = self
            .b
            .build_right_shift(bits, i64t.const_int(52, false), false, "be")?;
        let biased = self
            .b
            .build_and(biased, i64t.const_int(0x7ff, false), "be")?;
        let e = self
            .b
            .build_int_sub(biased, i64t.const_int(1023, false), "e")?;
        let e = self.b.build_int_add(e, adj.into_int_value(), "e")?;
        let mant = self
            .b
            .build_and(bits, i64t.const_int(0x000f_ffff_ffff_ffff, false), "mant")?;
        let mant = self
            .b
            .build_or(mant, i64t.const_int(0x3ff0_0000_0000_0000, false), "mant")?;
        let m = float(self.f64_of_bits(mant)?)?;
        let big = self.b.build_float_compare(
            FloatPredicate::OGT,
            m,
            f64t.const_float(std::f64::consts::SQRT_2),
            "big",
        )?;
        let half = self.b.build_float_mul(m, f64t.const_float(0.5), "half")?;
        let m = self.b.build_select(big, half, m, "m")?.into_float_value();
        let e = self
            .b
            .build_int_add(e, self.b.build_int_z_extend(big, i64t, "inc")?, "e")?;
        let one = f64t.const_float(1.0);
        let f = self.b.build_float_sub(m, one, "f")?;
        let den = self.b.build_float_add(f, f64t.const_float(2.0), "den")?;
        let s = self.b.build_float_div(f, den, "s")?;
        let z = self.b.build_float_mul(s, s, "z")?;
        let t = self.b.build_float_mul(s, f64t.const_float(2.0), "t")?;
        // 1/3 + z/5 + ... + z^9/21, Horner in z; ln m = t + t z (that).
        let mut p: V = f64t.const_float(1.0 / 21.0).into();
        for n in (3..=19).rev().step_by(2) {
            let c = self.f64c(1.0 / n as f64);
            p = self.fma(p, z.into(), c)?;
        }
        let tz = self.b.build_float_mul(t, z, "tz")?;
        let lm = self.fma(tz.into(), p, t.into())?;
        let ef = self.b.build_signed_int_to_float(e, f64t, "ef")?.into();
        let (ln2_hi, ln2_lo) = (self.f64c(LN2_HI), self.f64c(LN2_LO));
        let lo = self.fma(ef, ln2_lo, lm)?;
        let y = float(self.fma(ef, ln2_hi, lo)?)?;
        // Special values last, outermost first in what they override.
        let inf = f64t.const_float(f64::INFINITY);
        let is_inf = self
            .b
            .build_float_compare(FloatPredicate::OEQ, xf, inf, "inf")?;
        let y = self.b.build_select(is_inf, inf, y, "y")?.into_float_value();
        let zero = f64t.const_zero();
        let is_zero = self
            .b
            .build_float_compare(FloatPredicate::OEQ, xf, zero, "zero")?;
        let ninf = f64t.const_float(f64::NEG_INFINITY);
        let y = self
            .b
            .build_select(is_zero, ninf, y, "y")?
            .into_float_value();
        let bad = self
            .b
            .build_float_compare(FloatPredicate::ULT, xf, zero, "neg")?;
        let nan = f64t.const_float(f64::NAN);
        Ok(self.b.build_select(bad, nan, y, "log")?)
    }

    /// `tanh x` in f64, within 4 ulp on a dense sample of [-20, 20]: as [`Self::tanh_f32`],
    /// the odd Taylor polynomial below |x| = 1/8 (to `x^17`; the first term left out is under
    /// 1e-17 relative there), else `sign(x) (1 - e) / (1 + e)` with `e = e^(-2|x|)`.
    fn tanh_f64(&mut self, x: V<'ctx>) -> Res<V<'ctx>> {
        let f64t = self.cx.f64_type();
        let xf = float(x)?;
        let ax = self.math("llvm.fabs", &[x])?;
        let m2ax = self
            .b
            .build_float_mul(float(ax)?, f64t.const_float(-2.0), "m2ax")?;
        let e = float(self.exp_f64(m2ax.into())?)?;
        let one = f64t.const_float(1.0);
        let num = self.b.build_float_sub(one, e, "num")?;
        let den = self.b.build_float_add(one, e, "den")?;
        let big = self.b.build_float_div(num, den, "tanh.big")?;
        let big = self.math("llvm.copysign", &[big.into(), x])?;
        // The series' coefficients (2^2n (2^2n - 1) B_2n / (2n)!), Horner in x^2.
        const C: [f64; 9] = [
            1.0,
            -1.0 / 3.0,
            2.0 / 15.0,
            -17.0 / 315.0,
            62.0 / 2835.0,
            -1382.0 / 155925.0,
            21844.0 / 6081075.0,
            -929569.0 / 638512875.0,
            6404582.0 / 10854718875.0,
        ];
        let x2 = self.b.build_float_mul(xf, xf, "x2")?.into();
        let mut p = self.f64c(C[8]);
        for &c in C[..8].iter().rev() {
            let c = self.f64c(c);
            p = self.fma(p, x2, c)?;
        }
        let small = self.b.build_float_mul(xf, float(p)?, "tanh.small")?;
        let is_small = self.b.build_float_compare(
            FloatPredicate::OLT,
            float(ax)?,
            f64t.const_float(0.125),
            "small",
        )?;
        Ok(self.b.build_select(is_small, small, float(big)?, "tanh")?)
    }

    fn fmul_const(&mut self, x: V<'ctx>, c: f64) -> Res<V<'ctx>> {
        let k = self.cx.f32_type().const_float(c);
        Ok(self.b.build_float_mul(float(x)?, k, "scaled")?.into())
    }

    /// `e^x` as `2^(x log2 e)` (CUDA's `__expf`).
    fn exp_f32(&mut self, x: V<'ctx>) -> Res<V<'ctx>> {
        let t = self.fmul_const(x, std::f64::consts::LOG2_E)?;
        self.math("llvm.nvvm.ex2.approx.f", &[t])
    }

    /// `tanh x`: an odd Taylor polynomial below |x| = 1/8 (where `1 - e^-2|x|` would lose
    /// digits to cancellation; the first term left out is under 2e-9 relative there), else
    /// `sign(x) (1 - e) / (1 + e)` with `e = e^(-2|x|)`, which tends to ±1 without overflow.
    fn tanh_f32(&mut self, x: V<'ctx>) -> Res<V<'ctx>> {
        let f32t = self.cx.f32_type();
        let xf = float(x)?;
        let ax = self.math("llvm.fabs", &[x])?;
        let m2ax = self.fmul_const(ax, -2.0)?;
        let e = float(self.exp_f32(m2ax)?)?;
        let one = f32t.const_float(1.0);
        let num = self.b.build_float_sub(one, e, "num")?;
        let den = self.b.build_float_add(one, e, "den")?;
        let big = self.b.build_float_div(num, den, "tanh.big")?;
        let big = self.math("llvm.copysign", &[big.into(), x])?;
        // x (1 + x^2 (c1 + x^2 (c2 + x^2 c3))), Horner in x^2.
        let x2 = self.b.build_float_mul(xf, xf, "x2")?;
        let mut p = f32t.const_float(-17.0 / 315.0);
        for c in [2.0 / 15.0, -1.0 / 3.0, 1.0] {
            let m = self.b.build_float_mul(p, x2, "p")?;
            p = self.b.build_float_add(m, f32t.const_float(c), "p")?;
        }
        let small = self.b.build_float_mul(xf, p, "tanh.small")?;
        let eighth = f32t.const_float(0.125);
        let ax = float(ax)?;
        let is_small = self
            .b
            .build_float_compare(FloatPredicate::OLT, ax, eighth, "small")?;
        // NaN is not small, and the big branch keeps it NaN.
        Ok(self.b.build_select(is_small, small, float(big)?, "tanh")?)
    }
}

/// `v` as an integer; a mismatch is the IR's (a dtype that does not fit its operator).
fn int(v: V<'_>) -> Res<IntValue<'_>> {
    match v {
        V::IntValue(i) => Ok(i),
        _ => Err(invalid("integer operation on a non-integer")),
    }
}

/// `v` as a float.
fn float(v: V<'_>) -> Res<inkwell::values::FloatValue<'_>> {
    match v {
        V::FloatValue(f) => Ok(f),
        _ => Err(invalid("float operation on a non-float")),
    }
}

/// True if evaluating `e` reads a buffer.
fn reads_memory(e: &Expr) -> bool {
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

/// LLVM type of a value of `d` in a register (bool is `i1`).
fn reg_ty(cx: &Context, d: DType) -> BasicTypeEnum<'_> {
    match d {
        DType::Bool => cx.bool_type().into(),
        DType::I32 => cx.i32_type().into(),
        DType::I64 => cx.i64_type().into(),
        DType::F32 => cx.f32_type().into(),
        DType::F64 => cx.f64_type().into(),
        DType::BF16 => cx.i16_type().into(),
    }
}

/// LLVM type of a `d` element in memory (bool is a byte).
fn mem_ty(cx: &Context, d: DType) -> BasicTypeEnum<'_> {
    match d {
        DType::Bool => cx.i8_type().into(),
        d => reg_ty(cx, d),
    }
}

fn constant(cx: &Context, c: Const) -> V<'_> {
    match c {
        Const::Bool(b) => cx.bool_type().const_int(b as u64, false).into(),
        Const::I32(v) => cx.i32_type().const_int(v as i64 as u64, true).into(),
        Const::I64(v) => cx.i64_type().const_int(v as u64, true).into(),
        Const::F32(v) => cx.f32_type().const_float(v as f64).into(),
        Const::F64(v) => cx.f64_type().const_float(v).into(),
    }
}

/// What `ptxas -v` says of one kernel's resources.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PtxasResources {
    /// Registers per thread ("Used 40 registers").
    pub registers: u32,
    /// Static shared memory, bytes ("4096 bytes smem"; 0 when the line has none).
    pub shared_bytes: u64,
    /// A thread's stack frame, bytes ("0 bytes stack frame").
    pub stack_bytes: u64,
    /// Register spills to local memory, bytes stored ("0 bytes spill stores").
    pub spill_store_bytes: u64,
}

impl PtxasResources {
    /// Reads the resource lines of `ptxas -v`'s log (of one kernel); what the log lacks
    /// stays 0.
    pub fn parse(log: &str) -> PtxasResources {
        let mut r = PtxasResources::default();
        for line in log.lines() {
            if let Some(n) = number_before(line, " bytes stack frame") {
                r.stack_bytes = n;
            }
            if let Some(n) = number_before(line, " bytes spill stores") {
                r.spill_store_bytes = n;
            }
            if line.contains("Used ") {
                if let Some(n) = number_before(line, " registers") {
                    r.registers = u32::try_from(n).unwrap_or(u32::MAX);
                }
                r.shared_bytes = number_before(line, " bytes smem").unwrap_or(0);
            }
        }
        r
    }

    /// Whether the kernel keeps anything in local memory: a stack frame or spills.
    pub fn uses_local_memory(&self) -> bool {
        self.stack_bytes > 0 || self.spill_store_bytes > 0
    }
}

/// The number just before `unit` in `line` ("Used 12 registers": 12).
fn number_before(line: &str, unit: &str) -> Option<u64> {
    let head = &line[..line.find(unit)?];
    head.split(|c: char| !c.is_ascii_digit())
        .rfind(|w| !w.is_empty())?
        .parse()
        .ok()
}

/// A `ptxas` to assemble PTX with (checks and the dry run; code generation does not need one):
/// `PTXAS`, else one on the PATH, else the one of the nvidia-cuda-nvcc-cu12 wheel of `python3`.
pub fn find_ptxas() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("PTXAS") {
        return Some(std::path::PathBuf::from(p));
    }
    let runs = |p: &std::path::Path| {
        std::process::Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if runs(std::path::Path::new("ptxas")) {
        return Some(std::path::PathBuf::from("ptxas"));
    }
    // The wheel is a namespace package: its folder is `__path__[0]`, there is no __file__.
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import nvidia.cuda_nvcc as m; print(list(m.__path__)[0])",
        ])
        .output()
        .ok()?;
    let dir = String::from_utf8(out.stdout).ok()?;
    let p = std::path::PathBuf::from(dir.trim())
        .join("bin")
        .join("ptxas");
    (out.status.success() && runs(&p)).then_some(p)
}

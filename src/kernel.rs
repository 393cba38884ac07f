//! [`Kernel`]: a lowered function compiled into this process (LLVM's ORC JIT, see
//! `codegen::llvm::jit`), with checked calls.
//!
//! A kernel owns its machine code in the JIT (freed when the kernel is dropped) and remembers
//! the dtype and shape of every parameter, so that
//! [`Kernel::run`] can refuse arguments of the wrong count, dtype or shape with a
//! [`RunError`] instead of letting generated code read out of bounds. Inputs are passed by
//! shared reference and outputs by exclusive reference, and compilation rejects IR that
//! stores into an input, which together make the `noalias` promise of the ABI true.

use crate::codegen::llvm::jit::Loaded;
use crate::codegen::{CodegenError, CodegenOptions};
use crate::runtime::abi::{Status, TtRuntime};
use crate::runtime::buffer::Element;
use crate::runtime::{AlignedBuffer, BufferError, Runtime};
use ndarray::{ArrayD, ArrayViewD, IxDyn};
use tensortune_schedules::data::NdData;
use tensortune_schedules::ir::{BufKind, LoweredFunc, Stmt};
use tensortune_schedules::lower::{lower, LowerError};
use tensortune_schedules::schedule::State;
use tensortune_schedules::DType;

/// `NAME_packed(args, rt)` of the ABI.
type PackedFn = unsafe extern "C" fn(args: *const *mut u8, rt: *const TtRuntime) -> i32;

/// One parameter of a kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    /// The buffer's name in the IR.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Row-major shape.
    pub shape: Vec<i64>,
    /// True for outputs (written), false for inputs (read only).
    pub output: bool,
}

/// Why a kernel call was refused or failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// Wrong number of inputs or outputs.
    #[error("kernel `{kernel}` takes {expected} {what}, got {got}")]
    ArgCount {
        /// The kernel.
        kernel: String,
        /// `inputs` or `outputs`.
        what: &'static str,
        /// Parameters of that kind.
        expected: usize,
        /// Arguments given.
        got: usize,
    },
    /// An argument of the wrong dtype.
    #[error("argument `{param}` must be {expected}, got {got}")]
    DType {
        /// The parameter.
        param: String,
        /// Its dtype.
        expected: DType,
        /// The argument's dtype.
        got: DType,
    },
    /// An argument of the wrong shape.
    #[error("argument `{param}` must have shape {expected:?}, got {got:?}")]
    Shape {
        /// The parameter.
        param: String,
        /// Its shape.
        expected: Vec<i64>,
        /// The argument's shape.
        got: Vec<i64>,
    },
    /// The kernel returned a failure status.
    #[error("kernel `{kernel}` failed: {status}")]
    Kernel {
        /// The kernel.
        kernel: String,
        /// What the status code means.
        status: String,
    },
    /// A host buffer could not be made.
    #[error(transparent)]
    Buffer(#[from] BufferError),
}

/// A compiled, callable kernel.
pub struct Kernel {
    /// The machine code; `entry` points into it.
    _code: Loaded,
    entry: PackedFn,
    name: String,
    params: Vec<ParamSpec>,
}

// SAFETY: the machine code is immutable once linked and is freed only when the kernel is
// dropped (`Loaded`); calling it concurrently is safe: it only reads its code and the buffers
// it is given.
unsafe impl Send for Kernel {}
// SAFETY: as above; `&Kernel` gives access to nothing but the immutable code and metadata.
unsafe impl Sync for Kernel {}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("name", &self.name)
            .field("params", &self.params)
            .finish()
    }
}

/// Symbols generated code may call that are not in the module: the C math functions LLVM
/// lowers `llvm.exp`/`llvm.log` to, `tanh`, and the memory functions loop-idiom recognition
/// forms. They are mapped explicitly so the JIT does not depend on what the host binary
/// happens to export.
mod libsyms {
    extern "C" {
        pub fn expf(x: f32) -> f32;
        pub fn exp(x: f64) -> f64;
        pub fn logf(x: f32) -> f32;
        pub fn log(x: f64) -> f64;
        pub fn tanhf(x: f32) -> f32;
        pub fn tanh(x: f64) -> f64;
        pub fn sqrtf(x: f32) -> f32;
        pub fn sqrt(x: f64) -> f64;
    }

    pub fn table() -> [(&'static str, usize); 11] {
        [
            ("expf", expf as *const () as usize),
            ("exp", exp as *const () as usize),
            ("logf", logf as *const () as usize),
            ("log", log as *const () as usize),
            ("tanhf", tanhf as *const () as usize),
            ("tanh", tanh as *const () as usize),
            ("sqrtf", sqrtf as *const () as usize),
            ("sqrt", sqrt as *const () as usize),
            ("memset", libc::memset as *const () as usize),
            ("memcpy", libc::memcpy as *const () as usize),
            ("memmove", libc::memmove as *const () as usize),
        ]
    }
}

/// Fails if the IR stores into an input buffer (the ABI passes inputs as read-only).
fn check_no_input_stores(func: &LoweredFunc) -> Result<(), CodegenError> {
    let mut bad = None;
    func.body.visit(&mut |s| {
        if let Stmt::Store { buf, .. } = s {
            if let Some(d) = func.buffers.get(buf.0 as usize) {
                if matches!(d.kind, BufKind::Input(_)) {
                    bad = Some(d.name.clone());
                }
            }
        }
    });
    match bad {
        Some(n) => Err(CodegenError::InvalidIr(format!("store into input `{n}`"))),
        None => Ok(()),
    }
}

/// The parameters of `func` in ABI order (inputs, then outputs), refusing what the ABI cannot
/// pass: an undeclared buffer, an input after an output, or an unsupported dtype.
pub(crate) fn param_specs(func: &LoweredFunc) -> Result<Vec<ParamSpec>, CodegenError> {
    let mut params = Vec::with_capacity(func.params.len());
    let mut seen_output = false;
    for p in &func.params {
        let d = func.buffers.get(p.0 as usize).ok_or_else(|| {
            CodegenError::InvalidIr(format!("parameter buffer {} undeclared", p.0))
        })?;
        let output = matches!(d.kind, BufKind::Output(_));
        if seen_output && !output {
            return Err(CodegenError::InvalidIr(
                "an input parameter after an output".into(),
            ));
        }
        seen_output |= output;
        if !matches!(
            d.dtype,
            DType::F32 | DType::F64 | DType::I32 | DType::I64 | DType::BF16
        ) {
            return Err(CodegenError::Unsupported(format!(
                "parameter `{}` of dtype {}",
                d.name, d.dtype
            )));
        }
        params.push(ParamSpec {
            name: d.name.clone(),
            dtype: d.dtype,
            shape: d.shape.clone(),
            output,
        });
    }
    Ok(params)
}

/// Why a schedule state could not be built into a kernel.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// Lowering refused the state.
    #[error("lowering: {0}")]
    Lower(#[from] LowerError),
    /// The backend refused the loop IR.
    #[error("codegen: {0}")]
    Codegen(#[from] CodegenError),
}

impl Kernel {
    /// Lowers a schedule state and compiles it.
    pub fn from_state(state: &State, opts: &CodegenOptions) -> Result<Kernel, BuildError> {
        let func = lower(state)?;
        Ok(Kernel::compile_with(&func, opts)?)
    }

    /// Compiles the best record of `workload` for `target` in `db`, without tuning.
    ///
    /// A record whose trace no longer replays on the workload (written by an older version,
    /// say) is skipped for the next best; where no record is usable the default schedule is
    /// compiled. Each of those prints a warning on stderr; [`Kernel::from_records_with`]
    /// returns the warnings instead and can make a missing record an error.
    pub fn from_records(
        db: &tensortune_records::Database,
        workload: &tensortune_schedules::ops::WorkloadSpec,
        target: &crate::Target,
    ) -> Result<Kernel, crate::build::ReuseError> {
        let (kernel, choice) = Kernel::from_records_with(
            db,
            workload,
            target,
            &crate::build::ReuseOptions::default(),
        )?;
        for w in &choice.warnings {
            log::warn!("{w}");
        }
        Ok(kernel)
    }

    /// [`Kernel::from_records`] with options: what a missing record does, and the codegen
    /// options. Returns the kernel and which schedule it was compiled from, with the warnings.
    pub fn from_records_with(
        db: &tensortune_records::Database,
        workload: &tensortune_schedules::ops::WorkloadSpec,
        target: &crate::Target,
        opts: &crate::build::ReuseOptions,
    ) -> Result<(Kernel, crate::build::Choice), crate::build::ReuseError> {
        let choice = crate::build::choose(db, workload, &target.key(), opts.missing)?;
        let kernel = Kernel::compile_with(&choice.func, &opts.codegen)?;
        Ok((kernel, choice))
    }

    /// Compiles `func` with the default options.
    ///
    /// Generated code does not check its indices, so a function that lowering did not make
    /// in this process (built by hand, deserialized, or changed after lowering) is compiled
    /// only where every access is shown to stay inside its buffer
    /// ([`crate::codegen::llvm::check_bounds`]); else this is a
    /// [`CodegenError::InvalidIr`] naming the access.
    pub fn compile(func: &LoweredFunc) -> Result<Kernel, CodegenError> {
        Kernel::compile_with(func, &CodegenOptions::default())
    }

    /// Compiles `func` (see [`Kernel::compile`]).
    pub fn compile_with(func: &LoweredFunc, opts: &CodegenOptions) -> Result<Kernel, CodegenError> {
        crate::codegen::llvm::check_bounds(func)?;
        // SAFETY: checked just above.
        unsafe { Kernel::compile_unchecked(func, opts) }
    }

    /// Compiles `func` without showing that its accesses stay inside its buffers, for a
    /// function whose indices are in range for reasons the interval proof does not see.
    ///
    /// # Safety
    ///
    /// Every load and store of `func`, for every iteration of its loops, must address an
    /// element of its buffer; running the kernel otherwise reads or writes memory it does
    /// not own.
    pub unsafe fn compile_unchecked(
        func: &LoweredFunc,
        opts: &CodegenOptions,
    ) -> Result<Kernel, CodegenError> {
        check_no_input_stores(func)?;
        let params = param_specs(func)?;
        let code = crate::codegen::llvm::jit_compile(func, opts, &libsyms::table())?;
        // SAFETY: `NAME_packed` is emitted with exactly the `PackedFn` signature, and the code
        // stays loaded as long as `code`, which the kernel owns.
        let entry: PackedFn =
            unsafe { std::mem::transmute::<usize, PackedFn>(code.address as usize) };
        Ok(Kernel {
            _code: code,
            entry,
            name: func.name.clone(),
            params,
        })
    }

    /// The function's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Every parameter, inputs first.
    pub fn params(&self) -> &[ParamSpec] {
        &self.params
    }

    /// The input parameters.
    pub fn inputs(&self) -> impl Iterator<Item = &ParamSpec> {
        self.params.iter().filter(|p| !p.output)
    }

    /// The output parameters.
    pub fn outputs(&self) -> impl Iterator<Item = &ParamSpec> {
        self.params.iter().filter(|p| p.output)
    }

    fn check(
        &self,
        what: &'static str,
        specs: &[&ParamSpec],
        bufs: &[(&[i64], DType)],
    ) -> Result<(), RunError> {
        let specs: Vec<(&str, DType, &[i64])> = specs
            .iter()
            .map(|p| (p.name.as_str(), p.dtype, p.shape.as_slice()))
            .collect();
        check_args(&self.name, what, &specs, bufs)
    }

    /// Runs the kernel on `inputs` (in the op's input order), writing `outputs`.
    pub fn run(
        &self,
        rt: &Runtime,
        inputs: &[&AlignedBuffer],
        outputs: &mut [&mut AlignedBuffer],
    ) -> Result<(), RunError> {
        let ptrs = self.prepare(inputs, outputs)?;
        // SAFETY: `prepare` checked count, dtype and shape of every argument, and Rust's
        // borrows keep outputs from aliasing each other or the inputs.
        let code = unsafe { self.call_raw(&ptrs, rt) };
        self.status(code)
    }

    /// Checks the arguments and returns their pointers in parameter order.
    pub(crate) fn prepare(
        &self,
        inputs: &[&AlignedBuffer],
        outputs: &mut [&mut AlignedBuffer],
    ) -> Result<Vec<*mut u8>, RunError> {
        let ins: Vec<&ParamSpec> = self.inputs().collect();
        let outs: Vec<&ParamSpec> = self.outputs().collect();
        let in_meta: Vec<(&[i64], DType)> = inputs.iter().map(|b| (b.shape(), b.dtype())).collect();
        self.check("inputs", &ins, &in_meta)?;
        let out_meta: Vec<(&[i64], DType)> =
            outputs.iter().map(|b| (b.shape(), b.dtype())).collect();
        self.check("outputs", &outs, &out_meta)?;
        let mut ptrs: Vec<*mut u8> = inputs.iter().map(|b| b.as_ptr() as *mut u8).collect();
        ptrs.extend(outputs.iter_mut().map(|b| b.as_mut_ptr()));
        Ok(ptrs)
    }

    /// Turns a kernel return code into a result.
    pub(crate) fn status(&self, code: i32) -> Result<(), RunError> {
        match Status::from_code(code) {
            Some(Status::Ok) => Ok(()),
            s => Err(RunError::Kernel {
                kernel: self.name.clone(),
                status: match s {
                    Some(Status::AllocFailed) => "out of memory for a temporary".into(),
                    Some(Status::ParallelFailed) => "the parallel runtime failed".into(),
                    _ => format!("unknown status {code}"),
                },
            }),
        }
    }

    /// Calls the machine code.
    ///
    /// # Safety
    /// `ptrs` must hold one pointer per parameter, each to a 64-byte aligned buffer of the
    /// parameter's dtype and size, outputs not aliasing any other argument (as
    /// [`Kernel::prepare`] ensures).
    pub(crate) unsafe fn call_raw(&self, ptrs: &[*mut u8], rt: &Runtime) -> i32 {
        // SAFETY: forwarded to the caller.
        unsafe { (self.entry)(ptrs.as_ptr(), rt.table()) }
    }

    /// Runs on host data: copies `inputs` into aligned buffers, runs, returns the outputs.
    pub fn run_nd(&self, rt: &Runtime, inputs: &[NdData]) -> Result<Vec<NdData>, RunError> {
        let ins = inputs
            .iter()
            .map(AlignedBuffer::from_nd)
            .collect::<Result<Vec<_>, _>>()?;
        let mut outs = self
            .outputs()
            .map(|p| AlignedBuffer::zeros(&p.shape, p.dtype))
            .collect::<Result<Vec<_>, _>>()?;
        let in_refs: Vec<&AlignedBuffer> = ins.iter().collect();
        let mut out_refs: Vec<&mut AlignedBuffer> = outs.iter_mut().collect();
        self.run(rt, &in_refs, &mut out_refs)?;
        outs.iter()
            .map(|b| b.to_nd().map_err(RunError::from))
            .collect()
    }

    /// Runs on ndarray arrays of one element type: copies `inputs` (any layout) into aligned
    /// buffers and returns the outputs as new arrays.
    pub fn run_arrays<T: Element>(
        &self,
        rt: &Runtime,
        inputs: &[ArrayViewD<'_, T>],
    ) -> Result<Vec<ArrayD<T>>, RunError> {
        let mut ins = Vec::with_capacity(inputs.len());
        for a in inputs {
            let shape: Vec<i64> = a.shape().iter().map(|&d| d as i64).collect();
            let mut b = AlignedBuffer::zeros(&shape, T::DTYPE)?;
            let dst = b.as_mut_slice::<T>()?;
            for (d, s) in dst.iter_mut().zip(a.iter()) {
                *d = *s;
            }
            ins.push(b);
        }
        let mut outs = self
            .outputs()
            .map(|p| AlignedBuffer::zeros(&p.shape, p.dtype))
            .collect::<Result<Vec<_>, _>>()?;
        let in_refs: Vec<&AlignedBuffer> = ins.iter().collect();
        let mut out_refs: Vec<&mut AlignedBuffer> = outs.iter_mut().collect();
        self.run(rt, &in_refs, &mut out_refs)?;
        let mut result = Vec::with_capacity(outs.len());
        for b in &outs {
            let shape: Vec<usize> = b.shape().iter().map(|&d| d as usize).collect();
            let data = b.as_slice::<T>()?.to_vec();
            let arr = ArrayD::from_shape_vec(IxDyn(&shape), data).map_err(|_| RunError::Shape {
                param: "output".into(),
                expected: b.shape().to_vec(),
                got: vec![],
            })?;
            result.push(arr);
        }
        Ok(result)
    }
}

/// Checks arguments `bufs` (shape and dtype each) against parameters `specs` (name, dtype,
/// shape) of `kernel`'s `what` (`inputs` or `outputs`): count, then dtype and shape in order.
/// Shared by the CPU kernel and the GPU's ([`crate::gpu::device::LoadedKernel`]).
pub(crate) fn check_args(
    kernel: &str,
    what: &'static str,
    specs: &[(&str, DType, &[i64])],
    bufs: &[(&[i64], DType)],
) -> Result<(), RunError> {
    if specs.len() != bufs.len() {
        return Err(RunError::ArgCount {
            kernel: kernel.to_string(),
            what,
            expected: specs.len(),
            got: bufs.len(),
        });
    }
    for ((name, want_dtype, want_shape), (shape, dtype)) in specs.iter().zip(bufs) {
        if want_dtype != dtype {
            return Err(RunError::DType {
                param: name.to_string(),
                expected: *want_dtype,
                got: *dtype,
            });
        }
        if want_shape != shape {
            return Err(RunError::Shape {
                param: name.to_string(),
                expected: want_shape.to_vec(),
                got: shape.to_vec(),
            });
        }
    }
    Ok(())
}

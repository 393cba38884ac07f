//! Kernels and arrays on an NVIDIA GPU in this process: what a program that uses tuned GPU
//! kernels runs them with.
//!
//! Tuning runs its candidates in a worker process (see [`crate::gpu`]), because a candidate
//! that faults or hangs must not take the tuner with it. A kernel chosen from records is
//! another matter: its schedule passed the GPU verifier, its outputs were checked against
//! the reference when it was measured, and the program using it wants its arrays to stay on
//! the device from one call to the next. So here a [`GpuContext`] holds a device's primary
//! context in this process, [`DeviceArray`]s live in it, and a [`LoadedKernel`] (a
//! [`CudaKernel`] loaded into it) is launched on device arrays, or on host arrays that it
//! copies in and out.
//!
//! Every call checks what it is given first: arguments of the wrong count, dtype or shape
//! are a [`RunError`] (the CPU kernel's error), an array of another context is refused, and
//! a kernel built for a newer architecture than the device's is refused before the driver
//! sees it. A kernel that faults poisons its context, as in any CUDA program: the launch
//! returns [`DeviceError::Kernel`], and every later call on that context, its arrays and
//! its kernels returns [`DeviceError::Poisoned`]; the program may open the context again
//! only after everything of the old one is dropped.
//!
//! Without the `cuda` feature or a driver, [`GpuContext::open`] returns the
//! [`GpuError`] that says which, and nothing else can be reached.

use super::driver::{self, Ctx, CtxBuf, CtxModule, GpuError};
use crate::backend::cuda::CudaKernel;
use crate::kernel::{check_args, RunError};
use std::sync::Arc;
use tensortune_schedules::data::{Data, NdData};
use tensortune_schedules::target::CudaDesc;
use tensortune_schedules::DType;

use super::{GpuProgram, GpuProgramError, ParamSpec};

/// Why a GPU call in this process was refused or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// No driver, no device, not built with CUDA, or a driver call failed.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// Arguments of the wrong count, dtype or shape.
    #[error(transparent)]
    Args(#[from] RunError),
    /// An array of a dtype the device arrays do not hold (f32, f64 and i32 only).
    #[error("{0} arrays cannot be made on the device (f32, f64 and i32 only)")]
    DType(DType),
    /// A shape with a negative extent, or too many bytes to address.
    #[error("shape {0:?} is not a valid array shape")]
    Shape(Vec<i64>),
    /// Host data whose element count is not its shape's.
    #[error("host data of {got} elements for shape {shape:?}")]
    HostData {
        /// The shape given.
        shape: Vec<i64>,
        /// Elements in the data.
        got: usize,
    },
    /// An array or kernel of another context.
    #[error("`{0}` belongs to another GPU context")]
    OtherContext(String),
    /// The kernel was generated for an architecture this device cannot run.
    #[error("kernel `{kernel}` was generated for {kernel_arch}; this device is {device_arch}")]
    Arch {
        /// The kernel.
        kernel: String,
        /// The PTX's `.target`.
        kernel_arch: String,
        /// The device's architecture.
        device_arch: String,
    },
    /// The kernel has no valid launch or parameter list (a damaged record).
    #[error(transparent)]
    Program(#[from] GpuProgramError),
    /// The kernel failed while it ran (a fault, a trap): the context is poisoned.
    #[error("kernel `{kernel}` failed on the device: {error}; the GPU context is now unusable")]
    Kernel {
        /// The kernel.
        kernel: String,
        /// The driver's error.
        error: GpuError,
    },
    /// An earlier kernel failed in this context, which the driver then refuses to use.
    #[error("the GPU context was poisoned by an earlier kernel failure; open a new one")]
    Poisoned,
}

/// A device's primary context, held by this process. Cheap to clone (the clones share it);
/// the context is released when the last clone and the last array and kernel of it go.
#[derive(Clone)]
pub struct GpuContext {
    ctx: Arc<Ctx>,
    desc: CudaDesc,
    name: String,
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuContext")
            .field("name", &self.name)
            .field("arch", &self.desc.arch)
            .finish()
    }
}

/// Bytes of one element of a device array's `dtype`.
fn element_bytes(dtype: DType) -> Result<usize, DeviceError> {
    match dtype {
        DType::F32 | DType::I32 => Ok(4),
        DType::F64 => Ok(8),
        DType::BF16 => Ok(2),
        DType::Bool | DType::I64 => Err(DeviceError::DType(dtype)),
    }
}

/// Elements and bytes of an array of `shape` and `dtype`, checked.
fn array_size(dtype: DType, shape: &[i64]) -> Result<(usize, usize), DeviceError> {
    let size = element_bytes(dtype)?;
    let elems = shape
        .iter()
        .try_fold(1usize, |n, &d| {
            usize::try_from(d).ok().and_then(|d| n.checked_mul(d))
        })
        .ok_or_else(|| DeviceError::Shape(shape.to_vec()))?;
    let bytes = elems
        .checked_mul(size)
        .filter(|&b| isize::try_from(b).is_ok())
        .ok_or_else(|| DeviceError::Shape(shape.to_vec()))?;
    Ok((elems, bytes))
}

/// The architecture in a PTX text's `.target` line (`sm_90`), if it has one.
pub fn ptx_target(ptx: &str) -> Option<&str> {
    ptx.lines().find_map(|l| {
        let rest = l.trim().strip_prefix(".target")?;
        let first = rest.split([',', ' ', '\t']).find(|s| !s.is_empty())?;
        first.starts_with("sm_").then_some(first)
    })
}

/// True if PTX generated for `kernel` (`sm_XY`, maybe with an `a` suffix) can be loaded on a
/// device of `device`: the driver compiles PTX for the same or a newer architecture, but an
/// `a` target (architecture-specific features) only for that very architecture.
pub fn arch_runs_on(kernel: &str, device: &str) -> bool {
    let parse = |s: &str| -> Option<(u32, bool)> {
        let digits = s.strip_prefix("sm_")?;
        let (digits, specific) = match digits.strip_suffix('a') {
            Some(d) => (d, true),
            None => (digits, false),
        };
        Some((digits.parse().ok()?, specific))
    };
    match (parse(kernel), parse(device)) {
        (Some((k, true)), Some((d, _))) => k == d,
        (Some((k, false)), Some((d, _))) => k <= d,
        _ => false,
    }
}

impl GpuContext {
    /// Device `ordinal`'s primary context. An error without the `cuda` feature, without a
    /// driver or without that device; never a panic.
    pub fn open(ordinal: u32) -> Result<GpuContext, DeviceError> {
        // These look for the driver library before cudarc is touched (see `driver`).
        let desc = driver::device_desc(ordinal)?;
        let name = driver::device_name(ordinal)?;
        let ctx = Arc::new(Ctx::open(ordinal)?);
        Ok(GpuContext { ctx, desc, name })
    }

    /// What the driver says about the device.
    pub fn desc(&self) -> &CudaDesc {
        &self.desc
    }

    /// The device's name (e.g. `NVIDIA H200`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True once a kernel failed in this context: every call on it now fails.
    pub fn is_poisoned(&self) -> bool {
        self.ctx.is_poisoned()
    }

    fn live(&self) -> Result<(), DeviceError> {
        if self.ctx.is_poisoned() {
            Err(DeviceError::Poisoned)
        } else {
            Ok(())
        }
    }

    /// A device array of `dtype` and `shape`, zeroed.
    pub fn zeros(&self, dtype: DType, shape: &[i64]) -> Result<DeviceArray, DeviceError> {
        let (_, bytes) = array_size(dtype, shape)?;
        self.live()?;
        let buf = self.ctx.alloc(bytes)?;
        Ok(DeviceArray {
            buf,
            dtype,
            shape: shape.to_vec(),
        })
    }

    /// A device array holding a copy of `x`.
    pub fn upload(&self, x: &NdData) -> Result<DeviceArray, DeviceError> {
        let mut a = self.zeros(x.data.dtype(), &x.shape)?;
        a.copy_from(x)?;
        Ok(a)
    }

    /// `kernel` loaded into this context. Refused if it was generated for an architecture
    /// the device cannot run, or if its launch or parameters are not sound.
    pub fn load(&self, kernel: &CudaKernel) -> Result<LoadedKernel, DeviceError> {
        let program = GpuProgram::from_lowered(&kernel.artifact.func, kernel.artifact.ptx.clone())?;
        let kernel_arch = ptx_target(&program.ptx).unwrap_or("no .target").to_string();
        if !arch_runs_on(&kernel_arch, &self.desc.arch) {
            return Err(DeviceError::Arch {
                kernel: program.entry.clone(),
                kernel_arch,
                device_arch: self.desc.arch.clone(),
            });
        }
        self.live()?;
        let module = self.ctx.load(&program.ptx, &program.entry)?;
        Ok(LoadedKernel {
            module,
            name: program.entry,
            grid: program.grid,
            block: program.block,
            params: program.params,
            context: self.clone(),
        })
    }
}

/// An array in a GPU context's memory. Freed when dropped.
pub struct DeviceArray {
    buf: CtxBuf,
    dtype: DType,
    shape: Vec<i64>,
}

impl std::fmt::Debug for DeviceArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceArray")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .finish()
    }
}

impl DeviceArray {
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Row-major shape.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    fn live(&self) -> Result<(), DeviceError> {
        if self.buf.ctx().is_poisoned() {
            Err(DeviceError::Poisoned)
        } else {
            Ok(())
        }
    }

    /// Overwrites the array with `x`, which must have its dtype and shape.
    pub fn copy_from(&mut self, x: &NdData) -> Result<(), DeviceError> {
        check_args(
            "copy_from",
            "arrays",
            &[("array", self.dtype, &self.shape)],
            &[(&x.shape, x.data.dtype())],
        )?;
        let (elems, bytes) = array_size(self.dtype, &self.shape)?;
        if x.data.len() != elems || bytes != self.buf.bytes() {
            return Err(DeviceError::HostData {
                shape: x.shape.clone(),
                got: x.data.len(),
            });
        }
        self.live()?;
        self.buf.upload(&x.data)?;
        Ok(())
    }

    /// A host copy of the array.
    pub fn download(&self) -> Result<NdData, DeviceError> {
        let (elems, _) = array_size(self.dtype, &self.shape)?;
        self.live()?;
        let mut data =
            Data::zeros(self.dtype, elems).map_err(|_| DeviceError::DType(self.dtype))?;
        self.buf.download(&mut data)?;
        NdData::new(self.shape.clone(), data).ok_or_else(|| DeviceError::Shape(self.shape.clone()))
    }
}

/// A [`CudaKernel`] loaded into a [`GpuContext`]: launched on device arrays with
/// [`LoadedKernel::launch`], or on host arrays with [`LoadedKernel::run`].
pub struct LoadedKernel {
    module: CtxModule,
    name: String,
    grid: [u32; 3],
    block: [u32; 3],
    params: Vec<ParamSpec>,
    context: GpuContext,
}

impl std::fmt::Debug for LoadedKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedKernel")
            .field("name", &self.name)
            .field("grid", &self.grid)
            .field("block", &self.block)
            .field("params", &self.params)
            .finish()
    }
}

impl LoadedKernel {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Every parameter, in the kernel's order (inputs, then outputs).
    pub fn params(&self) -> &[ParamSpec] {
        &self.params
    }

    /// Blocks and threads per block of each launch.
    pub fn launch_dims(&self) -> ([u32; 3], [u32; 3]) {
        (self.grid, self.block)
    }

    /// The context it runs in.
    pub fn context(&self) -> &GpuContext {
        &self.context
    }

    fn specs(&self, output: bool) -> Vec<(&str, DType, &[i64])> {
        self.params
            .iter()
            .filter(|p| p.output == output)
            .map(|p| (p.name.as_str(), p.dtype, p.shape.as_slice()))
            .collect()
    }

    /// Runs the kernel once on device arrays: `inputs` in the op's input order, `outputs`
    /// written; returns when it has finished. Arguments are checked against the parameters
    /// first; Rust's borrows keep an output from being an input or another output.
    pub fn launch(
        &self,
        inputs: &[&DeviceArray],
        outputs: &mut [&mut DeviceArray],
    ) -> Result<(), DeviceError> {
        let in_meta: Vec<(&[i64], DType)> = inputs
            .iter()
            .map(|a| (a.shape.as_slice(), a.dtype))
            .collect();
        let out_meta: Vec<(&[i64], DType)> = outputs
            .iter()
            .map(|a| (a.shape.as_slice(), a.dtype))
            .collect();
        check_args(&self.name, "inputs", &self.specs(false), &in_meta)?;
        check_args(&self.name, "outputs", &self.specs(true), &out_meta)?;
        let mine = self.module.ctx();
        // One buffer per parameter in the kernel's order, taking inputs and outputs in
        // theirs (the counts matched above).
        let (mut next_in, mut next_out) = (inputs.iter(), outputs.iter());
        let mut args: Vec<&CtxBuf> = Vec::with_capacity(self.params.len());
        for p in &self.params {
            let buf = if p.output {
                next_out.next().map(|a| &a.buf)
            } else {
                next_in.next().map(|a| &a.buf)
            };
            let Some(buf) = buf else {
                return Err(RunError::ArgCount {
                    kernel: self.name.clone(),
                    what: if p.output { "outputs" } else { "inputs" },
                    expected: self.params.iter().filter(|q| q.output == p.output).count(),
                    got: if p.output {
                        outputs.len()
                    } else {
                        inputs.len()
                    },
                }
                .into());
            };
            if !Arc::ptr_eq(buf.ctx(), mine) {
                return Err(DeviceError::OtherContext(p.name.clone()));
            }
            args.push(buf);
        }
        if mine.is_poisoned() {
            return Err(DeviceError::Poisoned);
        }
        // SAFETY: `check_args` matched every argument's dtype and shape to its parameter,
        // so each buffer is exactly as large as the kernel indexes it (the verifier's and
        // lowering's bounds); all are of this context (checked above); inputs are only read
        // (lowering refuses stores into inputs) and outputs are exclusively borrowed.
        unsafe { self.module.launch(self.grid, self.block, &args) }.map_err(|error| {
            if mine.is_poisoned() {
                DeviceError::Kernel {
                    kernel: self.name.clone(),
                    error,
                }
            } else {
                DeviceError::Gpu(error)
            }
        })
    }

    /// Runs the kernel once on host arrays: uploads `inputs`, launches, and returns the
    /// outputs copied back.
    pub fn run(&self, inputs: &[NdData]) -> Result<Vec<NdData>, DeviceError> {
        let in_meta: Vec<(&[i64], DType)> = inputs
            .iter()
            .map(|x| (x.shape.as_slice(), x.data.dtype()))
            .collect();
        check_args(&self.name, "inputs", &self.specs(false), &in_meta)?;
        let ins = inputs
            .iter()
            .map(|x| self.context.upload(x))
            .collect::<Result<Vec<_>, _>>()?;
        let mut outs = self
            .params
            .iter()
            .filter(|p| p.output)
            .map(|p| self.context.zeros(p.dtype, &p.shape))
            .collect::<Result<Vec<_>, _>>()?;
        let in_refs: Vec<&DeviceArray> = ins.iter().collect();
        let mut out_refs: Vec<&mut DeviceArray> = outs.iter_mut().collect();
        self.launch(&in_refs, &mut out_refs)?;
        outs.iter().map(DeviceArray::download).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_targets_are_read_from_the_target_line() {
        let ptx = "//\n.version 8.5\n.target sm_90, debug\n.address_size 64\n";
        assert_eq!(ptx_target(ptx), Some("sm_90"));
        assert_eq!(ptx_target(".target sm_80a\n"), Some("sm_80a"));
        assert_eq!(ptx_target(".version 8.5\n"), None);
        assert_eq!(ptx_target(".target compute_90\n"), None);
    }

    #[test]
    fn ptx_loads_on_the_same_or_a_newer_architecture_only() {
        assert!(arch_runs_on("sm_80", "sm_90"));
        assert!(arch_runs_on("sm_90", "sm_90"));
        assert!(arch_runs_on("sm_86", "sm_89"));
        assert!(!arch_runs_on("sm_90", "sm_89"));
        assert!(!arch_runs_on("sm_90", "sm_80"));
        // An architecture-specific target runs only on that architecture.
        assert!(arch_runs_on("sm_90a", "sm_90"));
        assert!(!arch_runs_on("sm_90a", "sm_100"));
        assert!(!arch_runs_on("no .target", "sm_90"));
        assert!(!arch_runs_on("sm_9x", "sm_90"));
    }

    #[test]
    fn array_sizes_are_checked() {
        assert_eq!(array_size(DType::F32, &[3, 5]).ok(), Some((15, 60)));
        assert_eq!(array_size(DType::F64, &[]).ok(), Some((1, 8)));
        assert!(matches!(
            array_size(DType::F32, &[2, -1]),
            Err(DeviceError::Shape(_))
        ));
        assert!(matches!(
            array_size(DType::F32, &[i64::MAX, 4]),
            Err(DeviceError::Shape(_))
        ));
        assert!(matches!(
            array_size(DType::Bool, &[4]),
            Err(DeviceError::DType(DType::Bool))
        ));
    }

    #[test]
    fn opening_a_context_without_a_driver_is_an_error_not_a_panic() {
        // On a machine with a GPU this opens it; without one (or without the `cuda`
        // feature) the error says why.
        match GpuContext::open(0) {
            Ok(ctx) => assert!(ctx.desc().arch.starts_with("sm_")),
            Err(DeviceError::Gpu(
                GpuError::NoDriver(_) | GpuError::NotBuilt | GpuError::NoDevice { .. },
            )) => {}
            Err(e) => panic!("unexpected error: {e}"),
        }
        match GpuContext::open(u32::MAX) {
            Ok(_) => panic!("device u32::MAX opened"),
            Err(DeviceError::Gpu(
                GpuError::NoDriver(_) | GpuError::NotBuilt | GpuError::NoDevice { .. },
            )) => {}
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
}

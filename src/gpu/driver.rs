//! The CUDA driver: whether it is there, what the device is, and (in the worker) running a
//! program on it.
//!
//! The driver library is loaded when first used (cudarc's `dynamic-loading`), so a machine
//! without one builds and runs everything else. cudarc panics when the library or one of its
//! symbols is missing (a driver older than the CUDA 13.0 bindings lacks some), so
//! [`driver_available`] looks for the library with `dlopen` before cudarc is touched, and
//! every cudarc call here runs under `catch_unwind` as well: a missing symbol is an error,
//! not a crash.

use std::ffi::{CStr, CString};
use tensortune_schedules::target::CudaDesc;

/// The names the driver library is looked up under: the versioned name the driver
/// installs, then the development symlink.
const LIBCUDA: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

/// No CUDA driver library on this machine.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no CUDA driver found ({} could not be loaded: {reason})", LIBCUDA[0])]
pub struct NoDriver {
    /// What the dynamic loader said (one line).
    pub reason: String,
}

/// Why the device could not be asked or used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GpuError {
    /// No driver library.
    #[error(transparent)]
    NoDriver(#[from] NoDriver),
    /// Built without the `cuda` feature.
    #[error("built without CUDA support (the `cuda` feature)")]
    NotBuilt,
    /// No device of that ordinal.
    #[error("no CUDA device {ordinal} (the driver sees {count})")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: u32,
        /// Devices the driver reports.
        count: u32,
    },
    /// A driver call failed.
    #[error("{call} failed: {message}")]
    Driver {
        /// The driver function.
        call: &'static str,
        /// The driver's error name and text.
        message: String,
    },
    /// The bindings panicked in a call (a symbol missing from an older driver).
    #[error("{call} could not be called: {message}")]
    Panicked {
        /// The driver function.
        call: &'static str,
        /// The panic's message.
        message: String,
    },
}

/// `Ok` if the CUDA driver library can be loaded. Touches nothing of cudarc; call it before
/// anything that does.
pub fn driver_available() -> Result<(), NoDriver> {
    let mut first: Option<String> = None;
    for name in LIBCUDA {
        let Ok(cname) = CString::new(name) else {
            continue;
        };
        // SAFETY: dlopen with a NUL-terminated name; RTLD_LOCAL keeps the library's symbols
        // out of the global namespace and RTLD_LAZY resolves nothing yet, so loading runs
        // only the library's initializers.
        let handle = unsafe { libc::dlopen(cname.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
        if !handle.is_null() {
            // SAFETY: a handle dlopen just returned, closed once. The library stays loaded
            // while cudarc holds its own handle; this one was only a probe.
            unsafe { libc::dlclose(handle) };
            return Ok(());
        }
        if first.is_none() {
            first = Some(dl_error());
        }
    }
    Err(NoDriver {
        reason: first.unwrap_or_else(|| "not found".into()),
    })
}

/// The dynamic loader's last error, as one line.
fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl call
    // on this thread; it is copied at once.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        return "unknown error".into();
    }
    // SAFETY: non-null, NUL-terminated (see above).
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    tensortune_schedules::text::single_line(&s).into_owned()
}

/// The description of device `ordinal` as the driver reports it: warp size, threads and
/// shared memory per block, registers, multiprocessors, L2 and the compute capability (as
/// `sm_XY`). Registers per thread are 255 (the most an instruction can name) unless the
/// block's register file is smaller.
pub fn device_desc(ordinal: u32) -> Result<CudaDesc, GpuError> {
    imp::device_desc(ordinal)
}

/// The name of device `ordinal` (e.g. `NVIDIA H200`).
pub fn device_name(ordinal: u32) -> Result<String, GpuError> {
    imp::device_name(ordinal)
}

pub(crate) use imp::{Ctx, CtxBuf, CtxModule, Device};

#[cfg(not(feature = "cuda"))]
mod imp {
    use super::GpuError;
    use crate::gpu::worker::WorkerError;
    use crate::gpu::{GpuProgram, GpuRunResult, RunOptions};
    use std::sync::Arc;
    use tensortune_schedules::data::{Data, NdData};
    use tensortune_schedules::target::CudaDesc;

    pub fn device_desc(_ordinal: u32) -> Result<CudaDesc, GpuError> {
        Err(GpuError::NotBuilt)
    }

    pub fn device_name(_ordinal: u32) -> Result<String, GpuError> {
        Err(GpuError::NotBuilt)
    }

    /// No device without the `cuda` feature.
    pub(crate) struct Device;

    /// No context without the `cuda` feature: none can be made.
    pub(crate) struct Ctx(std::convert::Infallible);

    /// No device memory without the `cuda` feature.
    pub(crate) struct CtxBuf(std::convert::Infallible);

    /// No module without the `cuda` feature.
    pub(crate) struct CtxModule(std::convert::Infallible);

    impl Ctx {
        pub(crate) fn open(_ordinal: u32) -> Result<Ctx, GpuError> {
            Err(GpuError::NotBuilt)
        }

        pub(crate) fn is_poisoned(&self) -> bool {
            match self.0 {}
        }

        pub(crate) fn alloc(self: &Arc<Ctx>, _bytes: usize) -> Result<CtxBuf, GpuError> {
            match self.0 {}
        }

        pub(crate) fn load(
            self: &Arc<Ctx>,
            _ptx: &str,
            _entry: &str,
        ) -> Result<CtxModule, GpuError> {
            match self.0 {}
        }
    }

    impl CtxBuf {
        pub(crate) fn ctx(&self) -> &Arc<Ctx> {
            match self.0 {}
        }

        pub(crate) fn bytes(&self) -> usize {
            match self.0 {}
        }

        pub(crate) fn upload(&mut self, _data: &Data) -> Result<(), GpuError> {
            match self.0 {}
        }

        pub(crate) fn download(&self, _data: &mut Data) -> Result<(), GpuError> {
            match self.0 {}
        }
    }

    impl CtxModule {
        pub(crate) fn ctx(&self) -> &Arc<Ctx> {
            match self.0 {}
        }

        /// # Safety
        ///
        /// Never callable: no module exists without the `cuda` feature.
        pub(crate) unsafe fn launch(
            &self,
            _grid: [u32; 3],
            _block: [u32; 3],
            _args: &[&CtxBuf],
        ) -> Result<(), GpuError> {
            match self.0 {}
        }
    }

    impl Device {
        pub(crate) fn open(_ordinal: u32) -> Result<Device, GpuError> {
            Err(GpuError::NotBuilt)
        }

        pub(crate) fn run(
            &mut self,
            _program: &GpuProgram,
            _inputs: &[NdData],
            _opts: &RunOptions,
        ) -> Result<GpuRunResult, WorkerError> {
            Err(WorkerError::unavailable(GpuError::NotBuilt.to_string()))
        }
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::{driver_available, GpuError};
    use crate::gpu::wire::ErrorKind;
    use crate::gpu::worker::WorkerError;
    use crate::gpu::{GpuProgram, GpuRunResult, RunOptions};
    use cudarc::driver::result::{self, DriverError};
    use cudarc::driver::sys;
    use std::ffi::{c_void, CString};
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use tensortune_schedules::data::{Data, NdData};
    use tensortune_schedules::target::CudaDesc;

    /// The driver's name and text of an error, and its number.
    fn describe(e: &DriverError) -> String {
        let name = e
            .error_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("{:?}", e.0));
        match e.error_string() {
            Ok(s) => format!("{name} ({})", s.to_string_lossy()),
            Err(_) => name,
        }
    }

    /// A panic's message.
    fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
        let s = if let Some(s) = p.downcast_ref::<&str>() {
            s.to_string()
        } else if let Some(s) = p.downcast_ref::<String>() {
            s.clone()
        } else {
            "a panic".into()
        };
        tensortune_schedules::text::single_line(&s).into_owned()
    }

    /// Runs a cudarc call, its error described inside the same guard (describing calls the
    /// driver too), and a panic in it caught.
    fn call<T>(
        name: &'static str,
        f: impl FnOnce() -> Result<T, DriverError>,
    ) -> Result<T, GpuError> {
        match catch_unwind(AssertUnwindSafe(|| f().map_err(|e| describe(&e)))) {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(message)) => Err(GpuError::Driver {
                call: name,
                message,
            }),
            Err(p) => Err(GpuError::Panicked {
                call: name,
                message: panic_text(p),
            }),
        }
    }

    /// The driver initialized and device `ordinal`'s handle.
    fn device(ordinal: u32) -> Result<sys::CUdevice, GpuError> {
        driver_available()?;
        call("cuInit", result::init)?;
        let count = call("cuDeviceGetCount", result::device::get_count)?;
        let count = u32::try_from(count).unwrap_or(0);
        if ordinal >= count {
            return Err(GpuError::NoDevice { ordinal, count });
        }
        // `ordinal < count`, which is an i32.
        call("cuDeviceGet", || result::device::get(ordinal as i32))
    }

    fn attribute(dev: sys::CUdevice, a: sys::CUdevice_attribute) -> Result<i64, GpuError> {
        // SAFETY: `dev` came from cuDeviceGet.
        call("cuDeviceGetAttribute", || unsafe {
            result::device::get_attribute(dev, a)
        })
        .map(i64::from)
    }

    pub fn device_desc(ordinal: u32) -> Result<CudaDesc, GpuError> {
        use sys::CUdevice_attribute as A;
        let dev = device(ordinal)?;
        let get = |a| attribute(dev, a);
        let u32_of = |v: i64| u32::try_from(v.max(0)).unwrap_or(u32::MAX);
        let major = get(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = get(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let regs_per_block = get(A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK)?;
        Ok(CudaDesc {
            arch: format!("sm_{major}{minor}"),
            warp_size: u32_of(get(A::CU_DEVICE_ATTRIBUTE_WARP_SIZE)?),
            max_threads_per_block: u32_of(get(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?),
            // The static limit (48 KiB), which is what the kernels here declare; the opt-in
            // dynamic maximum is another attribute.
            shared_memory_per_block: get(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)?.max(0)
                as u64,
            registers_per_thread: u32_of(regs_per_block.min(255)),
            multiprocessors: u32_of(get(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?),
            l2_bytes: get(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?.max(0) as u64,
        })
    }

    pub fn device_name(ordinal: u32) -> Result<String, GpuError> {
        let dev = device(ordinal)?;
        call("cuDeviceGetName", || result::device::get_name(dev))
    }

    /// Device memory, freed when dropped.
    struct DevBuf {
        ptr: sys::CUdeviceptr,
        bytes: usize,
    }

    impl DevBuf {
        fn new(bytes: usize) -> Result<DevBuf, GpuError> {
            // cuMemAlloc refuses 0 bytes; an empty buffer still needs a pointer to pass.
            let bytes = bytes.max(1);
            // SAFETY: a plain allocation in the current context.
            let ptr = call("cuMemAlloc", || unsafe { result::malloc_sync(bytes) })?;
            Ok(DevBuf { ptr, bytes })
        }
    }

    impl Drop for DevBuf {
        fn drop(&mut self) {
            let ptr = self.ptr;
            // SAFETY: freeing our own allocation once; nothing uses it after the drop (the
            // context is synchronized before buffers go). A failure (a dead context) only
            // leaks it.
            let _ = call("cuMemFree", || unsafe { result::free_sync(ptr) });
        }
    }

    /// A loaded module, unloaded when dropped.
    struct Module(sys::CUmodule);

    impl Drop for Module {
        fn drop(&mut self) {
            let m = self.0;
            // SAFETY: our own module, unloaded once, after its launches finished.
            let _ = call("cuModuleUnload", || unsafe { result::module::unload(m) });
        }
    }

    /// An event, destroyed when dropped.
    struct Event(sys::CUevent);

    impl Event {
        fn new() -> Result<Event, GpuError> {
            call("cuEventCreate", || {
                result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            })
            .map(Event)
        }
    }

    impl Drop for Event {
        fn drop(&mut self) {
            let e = self.0;
            // SAFETY: our own event, destroyed once.
            let _ = call("cuEventDestroy", || unsafe { result::event::destroy(e) });
        }
    }

    /// `cuEventElapsedTime`'s signature, shared by its `_v2`.
    type ElapsedFn = unsafe extern "C" fn(*mut f32, sys::CUevent, sys::CUevent) -> sys::CUresult;

    /// The driver's event timer, looked up here rather than through cudarc: its CUDA 13.0
    /// bindings call `cuEventElapsedTime_v2`, which drivers before 12.8 lack (cudarc would
    /// panic on every timing), while the first version, with the same signature, is in
    /// every driver before 13.0. The newer one is taken where both are.
    fn elapsed_fn() -> Option<ElapsedFn> {
        for lib in super::LIBCUDA {
            let Ok(name) = CString::new(lib) else {
                continue;
            };
            // SAFETY: dlopen of a NUL-terminated name. The handle is kept open for the life
            // of the process (cudarc holds the library loaded anyway), so the symbol stays
            // valid.
            let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
            if handle.is_null() {
                continue;
            }
            for sym in [c"cuEventElapsedTime_v2", c"cuEventElapsedTime"] {
                // SAFETY: a live handle and a NUL-terminated symbol name.
                let p = unsafe { libc::dlsym(handle, sym.as_ptr()) };
                if !p.is_null() {
                    // SAFETY: both symbols are `CUresult (float *, CUevent, CUevent)` in the
                    // driver API, which is `ElapsedFn`.
                    return Some(unsafe { std::mem::transmute::<*mut c_void, ElapsedFn>(p) });
                }
            }
        }
        None
    }

    /// Why PTX did not load.
    #[derive(Debug)]
    enum LoadFailure {
        /// The text holds a NUL byte (the driver reads it as a C string).
        Nul,
        /// The driver refused it: its error and the JIT's log, on one line.
        Driver(String),
    }

    impl std::fmt::Display for LoadFailure {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                LoadFailure::Nul => f.write_str("the PTX text contains a NUL byte"),
                LoadFailure::Driver(m) => f.write_str(m),
            }
        }
    }

    /// Loads `ptx` into the current context, with the JIT's error log in the error.
    fn load_module(ptx: &str) -> Result<sys::CUmodule, LoadFailure> {
        let image = CString::new(ptx).map_err(|_| LoadFailure::Nul)?;
        let mut log = vec![0u8; 16 << 10];
        let mut options = [
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        // The driver reads a size option's value from the pointer's bits.
        let mut values = [log.as_mut_ptr() as *mut c_void, log.len() as *mut c_void];
        let mut module: sys::CUmodule = std::ptr::null_mut();
        let r = call("cuModuleLoadDataEx", || {
            // SAFETY: `image` is NUL-terminated PTX text; the two options point at a log
            // buffer of the size given, which outlives the call; `module` is written on
            // success.
            unsafe {
                sys::cuModuleLoadDataEx(
                    &mut module,
                    image.as_ptr() as *const c_void,
                    options.len() as u32,
                    options.as_mut_ptr(),
                    values.as_mut_ptr(),
                )
                .result()
            }
        });
        match r {
            Ok(()) => Ok(module),
            Err(e) => {
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                let text = String::from_utf8_lossy(&log[..end]);
                let text = tensortune_schedules::text::single_line(text.trim());
                Err(LoadFailure::Driver(if text.is_empty() {
                    e.to_string()
                } else {
                    format!("{e}: {text}")
                }))
            }
        }
    }

    /// The worker's device: a device's primary context, current on the worker's thread.
    pub(crate) struct Device {
        /// The L2 flush buffer, kept between runs and grown when asked for more.
        flush: Option<DevBuf>,
        /// The event timer (see [`elapsed_fn`]).
        elapsed: ElapsedFn,
    }

    fn dev_err(e: GpuError) -> WorkerError {
        WorkerError {
            kind: ErrorKind::Device,
            message: e.to_string(),
            sticky: false,
        }
    }

    /// A failure while a kernel ran or after: the context may be poisoned, so the worker
    /// ends after reporting it.
    fn kernel_err(e: GpuError) -> WorkerError {
        WorkerError {
            kind: ErrorKind::Kernel,
            message: e.to_string(),
            sticky: true,
        }
    }

    impl Device {
        /// Device `ordinal`'s primary context, made current on this thread.
        pub(crate) fn open(ordinal: u32) -> Result<Device, GpuError> {
            let dev = device(ordinal)?;
            // SAFETY: `dev` came from cuDeviceGet; the context is retained for the life of
            // the worker process.
            let ctx = call("cuDevicePrimaryCtxRetain", || unsafe {
                result::primary_ctx::retain(dev)
            })?;
            // SAFETY: a context retained just above.
            call("cuCtxSetCurrent", || unsafe {
                result::ctx::set_current(ctx)
            })?;
            let elapsed = elapsed_fn().ok_or(GpuError::Driver {
                call: "cuEventElapsedTime",
                message: "the driver library has no event timer".into(),
            })?;
            Ok(Device {
                flush: None,
                elapsed,
            })
        }

        fn load(&self, ptx: &str) -> Result<Module, WorkerError> {
            load_module(ptx).map(Module).map_err(|e| WorkerError {
                kind: match e {
                    LoadFailure::Nul => ErrorKind::Invalid,
                    LoadFailure::Driver(_) => ErrorKind::Load,
                },
                message: e.to_string(),
                sticky: false,
            })
        }

        /// Runs `program` on `inputs` (already checked against its parameters): loaded,
        /// launched once on its uploaded inputs and poisoned or zeroed outputs, the outputs
        /// copied back, then timed launch by launch with CUDA events.
        pub(crate) fn run(
            &mut self,
            program: &GpuProgram,
            inputs: &[NdData],
            opts: &RunOptions,
        ) -> Result<GpuRunResult, WorkerError> {
            let module = self.load(&program.ptx)?;
            let entry = CString::new(program.entry.as_str()).map_err(|_| WorkerError {
                kind: ErrorKind::Invalid,
                message: "the entry name contains a NUL byte".into(),
                sticky: false,
            })?;
            let m = module.0;
            // SAFETY: `m` is a loaded module, alive until `module` drops at the end.
            let func = call("cuModuleGetFunction", || unsafe {
                result::module::get_function(m, entry)
            })
            .map_err(|e| WorkerError {
                kind: ErrorKind::Load,
                message: format!("no kernel `{}`: {e}", program.entry),
                sticky: false,
            })?;
            let attr = |a: sys::CUfunction_attribute| {
                // SAFETY: `func` belongs to the loaded module.
                call("cuFuncGetAttribute", || unsafe {
                    result::function::get_function_attribute(func, a)
                })
                .ok()
                .and_then(|v| u32::try_from(v).ok())
            };
            use sys::CUfunction_attribute as F;
            let registers = attr(F::CU_FUNC_ATTRIBUTE_NUM_REGS);
            let shared_bytes = attr(F::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES);
            let local_bytes = attr(F::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES);

            // One device buffer per parameter: inputs uploaded, outputs filled.
            let mut bufs = Vec::with_capacity(program.params.len());
            let mut next_input = inputs.iter();
            for p in &program.params {
                let elems = p.elements().ok_or_else(|| WorkerError {
                    kind: ErrorKind::Invalid,
                    message: format!("parameter `{}` has a bad shape {:?}", p.name, p.shape),
                    sticky: false,
                })?;
                let size = match p.dtype {
                    tensortune_schedules::DType::F64 => 8,
                    _ => 4,
                };
                let bytes = elems.checked_mul(size).ok_or_else(|| WorkerError {
                    kind: ErrorKind::Invalid,
                    message: format!("parameter `{}` is too large", p.name),
                    sticky: false,
                })?;
                let b = DevBuf::new(bytes).map_err(dev_err)?;
                if p.output {
                    let fill = if opts.poison_outputs { 0xff } else { 0 };
                    let ptr = b.ptr;
                    // SAFETY: `bytes` bytes of our allocation (at least that large).
                    call("cuMemsetD8", || unsafe {
                        result::memset_d8_sync(ptr, fill, bytes)
                    })
                    .map_err(dev_err)?;
                } else if let Some(x) = next_input.next() {
                    let ptr = b.ptr;
                    // SAFETY: the input has the parameter's shape and dtype (checked), so its
                    // bytes are exactly the allocation's.
                    call("cuMemcpyHtoD", || unsafe {
                        match &x.data {
                            Data::F32(v) => result::memcpy_htod_sync(ptr, v),
                            Data::F64(v) => result::memcpy_htod_sync(ptr, v),
                            Data::I32(v) => result::memcpy_htod_sync(ptr, v),
                            Data::BF16(v) => result::memcpy_htod_sync(ptr, v),
                        }
                    })
                    .map_err(dev_err)?;
                }
                bufs.push(b);
            }
            let mut ptrs: Vec<sys::CUdeviceptr> = bufs.iter().map(|b| b.ptr).collect();
            // The kernel's parameters are the device pointers, passed by address.
            let mut args: Vec<*mut c_void> = ptrs
                .iter_mut()
                .map(|p| p as *mut sys::CUdeviceptr as *mut c_void)
                .collect();
            let [gx, gy, gz] = program.grid;
            let [bx, by, bz] = program.block;
            let mut launch = || {
                // SAFETY: `func` is a kernel of the loaded module whose parameters are one
                // global pointer per buffer (how the PTX generator declares them), and `args`
                // holds the address of one live device pointer per parameter.
                call("cuLaunchKernel", || unsafe {
                    result::launch_kernel(
                        func,
                        (gx, gy, gz),
                        (bx, by, bz),
                        0,
                        std::ptr::null_mut(),
                        &mut args,
                    )
                })
            };
            launch().map_err(|e| WorkerError {
                kind: ErrorKind::Launch,
                message: e.to_string(),
                sticky: false,
            })?;
            call("cuCtxSynchronize", result::ctx::synchronize).map_err(kernel_err)?;

            let mut outputs = Vec::new();
            for (p, b) in program.params.iter().zip(&bufs).filter(|(p, _)| p.output) {
                let elems = p.elements().unwrap_or(0);
                let mut data = Data::zeros(p.dtype, elems).map_err(|e| WorkerError {
                    kind: ErrorKind::Device,
                    message: e.to_string(),
                    sticky: false,
                })?;
                let ptr = b.ptr;
                // SAFETY: the host vector has the parameter's element count, as the device
                // buffer does; the kernel finished (synchronized above).
                call("cuMemcpyDtoH", || unsafe {
                    match &mut data {
                        Data::F32(v) => result::memcpy_dtoh_sync(v, ptr),
                        Data::F64(v) => result::memcpy_dtoh_sync(v, ptr),
                        Data::I32(v) => result::memcpy_dtoh_sync(v, ptr),
                        Data::BF16(v) => result::memcpy_dtoh_sync(v, ptr),
                    }
                })
                .map_err(kernel_err)?;
                outputs.push(
                    NdData::new(p.shape.clone(), data).ok_or_else(|| WorkerError {
                        kind: ErrorKind::Invalid,
                        message: format!("parameter `{}` has a bad shape", p.name),
                        sticky: false,
                    })?,
                );
            }

            // The flush buffer, grown to what is asked.
            let flush_bytes = usize::try_from(opts.l2_flush_bytes).unwrap_or(usize::MAX);
            if flush_bytes > 0 && self.flush.as_ref().is_none_or(|f| f.bytes < flush_bytes) {
                self.flush = None;
                self.flush = Some(DevBuf::new(flush_bytes).map_err(dev_err)?);
            }
            let flush = if flush_bytes > 0 {
                self.flush.as_ref().map(|f| f.ptr)
            } else {
                None
            };
            let (start, end) = (
                Event::new().map_err(dev_err)?,
                Event::new().map_err(dev_err)?,
            );
            let mut times_s = Vec::new();
            let mut total_ms = 0.0f64;
            let max = opts.max_samples.max(opts.repeat) as usize;
            while times_s.len() < max
                && (times_s.len() < opts.repeat as usize || total_ms < opts.min_repeat_ms)
            {
                if let Some(ptr) = flush {
                    // A different byte each time, so that no cache can keep the old line.
                    let byte = (times_s.len() % 251) as u8;
                    // SAFETY: `flush_bytes` bytes of the flush buffer (at least that large),
                    // on the default stream, ordered before the launch.
                    call("cuMemsetD8Async", || unsafe {
                        result::memset_d8_async(ptr, byte, flush_bytes, std::ptr::null_mut())
                    })
                    .map_err(kernel_err)?;
                }
                let (s, e) = (start.0, end.0);
                // SAFETY: events of this context, recorded on the default stream.
                call("cuEventRecord", || unsafe {
                    result::event::record(s, std::ptr::null_mut())
                })
                .map_err(kernel_err)?;
                launch().map_err(kernel_err)?;
                // SAFETY: as above.
                call("cuEventRecord", || unsafe {
                    result::event::record(e, std::ptr::null_mut())
                })
                .map_err(kernel_err)?;
                // SAFETY: a recorded event of this context.
                call("cuEventSynchronize", || unsafe {
                    result::event::synchronize(e)
                })
                .map_err(kernel_err)?;
                let timer = self.elapsed;
                let mut ms = 0f32;
                // SAFETY: both events were recorded on the same stream and have completed;
                // `ms` is written by the call.
                call("cuEventElapsedTime", || unsafe {
                    timer(&mut ms, s, e).result()
                })
                .map_err(kernel_err)?;
                let ms = f64::from(ms);
                total_ms += ms;
                times_s.push(ms / 1e3);
            }
            // Everything is finished before the buffers and module are released.
            call("cuCtxSynchronize", result::ctx::synchronize).map_err(kernel_err)?;
            drop(bufs);
            drop(module);
            Ok(GpuRunResult {
                outputs,
                times_s,
                registers,
                shared_bytes,
                local_bytes,
            })
        }
    }

    /// A device's primary context held by a program in this process
    /// ([`crate::gpu::device::GpuContext`]): retained while any array or module of it lives,
    /// made current on the calling thread by every call, and marked poisoned once a kernel
    /// failed in it (the driver fails every later call of such a context).
    pub(crate) struct Ctx {
        dev: sys::CUdevice,
        ctx: sys::CUcontext,
        poisoned: AtomicBool,
    }

    // SAFETY: the driver API may be called from any thread; every method makes the context
    // current on the calling thread before it touches it, and the handle itself is only
    // read.
    unsafe impl Send for Ctx {}
    // SAFETY: as above; the only mutable state is the atomic flag.
    unsafe impl Sync for Ctx {}

    impl Ctx {
        pub(crate) fn open(ordinal: u32) -> Result<Ctx, GpuError> {
            let dev = device(ordinal)?;
            // SAFETY: `dev` came from cuDeviceGet; released once, when the `Ctx` drops.
            let ctx = call("cuDevicePrimaryCtxRetain", || unsafe {
                result::primary_ctx::retain(dev)
            })?;
            let c = Ctx {
                dev,
                ctx,
                poisoned: AtomicBool::new(false),
            };
            c.enter()?;
            Ok(c)
        }

        /// Makes the context current on this thread.
        fn enter(&self) -> Result<(), GpuError> {
            let ctx = self.ctx;
            // SAFETY: a context retained by this `Ctx` and not yet released.
            call("cuCtxSetCurrent", || unsafe {
                result::ctx::set_current(ctx)
            })
        }

        pub(crate) fn is_poisoned(&self) -> bool {
            self.poisoned.load(Ordering::Acquire)
        }

        fn poison(&self) {
            self.poisoned.store(true, Ordering::Release);
        }

        /// `bytes` of device memory, zeroed.
        pub(crate) fn alloc(self: &Arc<Ctx>, bytes: usize) -> Result<CtxBuf, GpuError> {
            self.enter()?;
            // cuMemAlloc refuses 0 bytes; an empty array still needs a pointer to pass.
            let size = bytes.max(1);
            // SAFETY: a plain allocation in the current context.
            let ptr = call("cuMemAlloc", || unsafe { result::malloc_sync(size) })?;
            let buf = CtxBuf {
                ctx: Arc::clone(self),
                ptr,
                bytes,
            };
            // SAFETY: `size` bytes of the allocation just made.
            call("cuMemsetD8", || unsafe {
                result::memset_d8_sync(ptr, 0, size)
            })?;
            Ok(buf)
        }

        /// Loads `ptx` and finds its kernel `entry`.
        pub(crate) fn load(self: &Arc<Ctx>, ptx: &str, entry: &str) -> Result<CtxModule, GpuError> {
            self.enter()?;
            let module = load_module(ptx).map_err(|e| GpuError::Driver {
                call: "cuModuleLoadDataEx",
                message: e.to_string(),
            })?;
            // Owned from here, so that an error below unloads it.
            let mut m = CtxModule {
                ctx: Arc::clone(self),
                module,
                func: std::ptr::null_mut(),
            };
            let name = CString::new(entry).map_err(|_| GpuError::Driver {
                call: "cuModuleGetFunction",
                message: "the entry name contains a NUL byte".into(),
            })?;
            // SAFETY: `module` was loaded just above and lives as long as `m`.
            m.func = call("cuModuleGetFunction", || unsafe {
                result::module::get_function(module, name)
            })?;
            Ok(m)
        }
    }

    impl Drop for Ctx {
        fn drop(&mut self) {
            let dev = self.dev;
            // SAFETY: the retain of `open`, released once; every array and module of the
            // context held an `Arc` of it, so they are gone.
            let _ = call("cuDevicePrimaryCtxRelease", || unsafe {
                result::primary_ctx::release(dev)
            });
        }
    }

    /// Device memory of a [`Ctx`], freed when dropped.
    pub(crate) struct CtxBuf {
        ctx: Arc<Ctx>,
        ptr: sys::CUdeviceptr,
        bytes: usize,
    }

    impl CtxBuf {
        /// The context it belongs to.
        pub(crate) fn ctx(&self) -> &Arc<Ctx> {
            &self.ctx
        }

        /// Its size in bytes.
        pub(crate) fn bytes(&self) -> usize {
            self.bytes
        }

        /// Copies `data` in; the caller checked that it has exactly [`CtxBuf::bytes`].
        pub(crate) fn upload(&mut self, data: &Data) -> Result<(), GpuError> {
            self.ctx.enter()?;
            let ptr = self.ptr;
            // SAFETY: the caller checked that `data` holds `bytes` bytes, the size of the
            // allocation; synchronous, so `data` may go after the call.
            call("cuMemcpyHtoD", || unsafe {
                match data {
                    Data::F32(v) => result::memcpy_htod_sync(ptr, v),
                    Data::F64(v) => result::memcpy_htod_sync(ptr, v),
                    Data::I32(v) => result::memcpy_htod_sync(ptr, v),
                    Data::BF16(v) => result::memcpy_htod_sync(ptr, v),
                }
            })
        }

        /// Copies the memory out into `data`; the caller checked that it has exactly
        /// [`CtxBuf::bytes`].
        pub(crate) fn download(&self, data: &mut Data) -> Result<(), GpuError> {
            self.ctx.enter()?;
            let ptr = self.ptr;
            // SAFETY: as in `upload`, the other way.
            call("cuMemcpyDtoH", || unsafe {
                match data {
                    Data::F32(v) => result::memcpy_dtoh_sync(v, ptr),
                    Data::F64(v) => result::memcpy_dtoh_sync(v, ptr),
                    Data::I32(v) => result::memcpy_dtoh_sync(v, ptr),
                    Data::BF16(v) => result::memcpy_dtoh_sync(v, ptr),
                }
            })
        }
    }

    impl Drop for CtxBuf {
        fn drop(&mut self) {
            let ptr = self.ptr;
            if self.ctx.enter().is_ok() {
                // SAFETY: our own allocation, freed once; launches are synchronous, so no
                // kernel still uses it. A failure (a poisoned context) only leaks it.
                let _ = call("cuMemFree", || unsafe { result::free_sync(ptr) });
            }
        }
    }

    // SAFETY: a device address and the context's `Arc`; the memory is only reached through
    // driver calls, each under the borrow rules of the owning `DeviceArray`.
    unsafe impl Send for CtxBuf {}
    // SAFETY: `&CtxBuf` only downloads (reads) the memory.
    unsafe impl Sync for CtxBuf {}

    /// A loaded module of a [`Ctx`] and its kernel, unloaded when dropped.
    pub(crate) struct CtxModule {
        ctx: Arc<Ctx>,
        module: sys::CUmodule,
        func: sys::CUfunction,
    }

    // SAFETY: module and function handles may be used from any thread of the process once
    // their context is current, which every use makes it.
    unsafe impl Send for CtxModule {}
    // SAFETY: launching only reads the handles.
    unsafe impl Sync for CtxModule {}

    impl CtxModule {
        /// The context it was loaded into.
        pub(crate) fn ctx(&self) -> &Arc<Ctx> {
            &self.ctx
        }

        /// Launches the kernel with one device pointer per parameter, in order, and waits
        /// for it. A failure of the kernel itself poisons the context.
        ///
        /// # Safety
        ///
        /// `args` must be the kernel's parameters, in order: one buffer of this context per
        /// parameter, each as large as the kernel indexes it; inputs not written.
        pub(crate) unsafe fn launch(
            &self,
            grid: [u32; 3],
            block: [u32; 3],
            args: &[&CtxBuf],
        ) -> Result<(), GpuError> {
            self.ctx.enter()?;
            let mut ptrs: Vec<sys::CUdeviceptr> = args.iter().map(|b| b.ptr).collect();
            let mut params: Vec<*mut c_void> = ptrs
                .iter_mut()
                .map(|p| p as *mut sys::CUdeviceptr as *mut c_void)
                .collect();
            let func = self.func;
            // SAFETY: the caller's promise on `args`; `params` holds the address of one live
            // device pointer per parameter for the length of the call.
            call("cuLaunchKernel", || unsafe {
                result::launch_kernel(
                    func,
                    (grid[0], grid[1], grid[2]),
                    (block[0], block[1], block[2]),
                    0,
                    std::ptr::null_mut(),
                    &mut params,
                )
            })?;
            call("cuCtxSynchronize", result::ctx::synchronize).inspect_err(|_| self.ctx.poison())
        }
    }

    impl Drop for CtxModule {
        fn drop(&mut self) {
            let m = self.module;
            if self.ctx.enter().is_ok() {
                // SAFETY: our own module, unloaded once; launches are synchronous, so none of
                // its kernels still runs.
                let _ = call("cuModuleUnload", || unsafe { result::module::unload(m) });
            }
        }
    }
}

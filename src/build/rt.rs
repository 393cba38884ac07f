// The module-specific part of the runtime of a generated kernel module: its runtime table
// over one process-wide pool, 64-byte aligned staging of arguments, and the error type of the
// wrappers. `tensortune::build` copies src/runtime/shared_pool.rs (the pool and aligned
// allocation, the same text the JIT's `Runtime` is made of) and then this file verbatim into
// the module it generates, after a line defining `DEFAULT_THREADS`; it needs nothing but
// `std`. Plain `//` comments only: the module is pulled in by `include!`. The pool's text
// names its paths in full, so the imports here are this file's alone.
//
// The table layout is the ABI of `tensortune::runtime::abi`: parallel_for, alloc, free, ctx,
// in that order. `parallel_for` must call `body` on disjoint ranges that cover `[0, n)` and
// return the first non-zero code a call returned, or 0.

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

type ParallelBody = unsafe extern "C" fn(closure: *mut c_void, begin: i64, end: i64) -> i32;

/// The runtime table every kernel receives as its last argument.
#[repr(C)]
pub struct TtRuntime {
    parallel_for: unsafe extern "C" fn(
        rt: *const TtRuntime,
        n: i64,
        body: ParallelBody,
        closure: *mut c_void,
    ) -> i32,
    alloc: unsafe extern "C" fn(rt: *const TtRuntime, bytes: i64) -> *mut c_void,
    free: unsafe extern "C" fn(rt: *const TtRuntime, ptr: *mut c_void),
    ctx: *const c_void,
}

struct Table(TtRuntime);
// SAFETY: the table holds function pointers and a null context; nothing in it is mutable.
unsafe impl Sync for Table {}

static TABLE: Table = Table(TtRuntime {
    parallel_for: rt_parallel_for,
    alloc: tt_alloc,
    free: tt_free,
    ctx: std::ptr::null(),
});

fn runtime() -> *const TtRuntime {
    &TABLE.0
}

static THREADS: AtomicUsize = AtomicUsize::new(0);

/// Sets the number of threads parallel kernels use, before the first call of a kernel
/// (default: the thread count of the target the records were tuned for). Returns false,
/// changing nothing, once the pool has started.
pub fn set_threads(threads: usize) -> bool {
    if POOL.get().is_some() {
        return false;
    }
    THREADS.store(threads.max(1), Ordering::SeqCst);
    true
}

/// The number of threads parallel kernels use.
pub fn threads() -> usize {
    match THREADS.load(Ordering::SeqCst) {
        0 => DEFAULT_THREADS.max(1),
        n => n,
    }
}

/// The process's pool, started by the first parallel loop; it lives as long as the process.
static POOL: OnceLock<Pool> = OnceLock::new();

fn pool() -> &'static Pool {
    // A worker that cannot start only means the calling thread runs more chunks itself.
    POOL.get_or_init(|| Pool::start(threads()).0)
}

unsafe extern "C" fn rt_parallel_for(
    _rt: *const TtRuntime,
    n: i64,
    body: ParallelBody,
    closure: *mut c_void,
) -> i32 {
    pool().parallel_for(n, body, closure)
}

/// The element types kernels take; for all of them the all-zero bit pattern is zero.
pub trait Element: Copy + Send + Sync + 'static + private::Sealed {}
impl Element for f32 {}
impl Element for f64 {}
impl Element for i32 {}
impl Element for i64 {}
mod private {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
}

/// A zero-initialized, 64-byte aligned vector of fixed length. Kernels read and write these
/// in place; other slices are copied into one first (and outputs back).
pub struct AlignedVec<T: Element> {
    ptr: std::ptr::NonNull<T>,
    len: usize,
}

// SAFETY: an AlignedVec owns its elements like a Vec does.
unsafe impl<T: Element> Send for AlignedVec<T> {}
// SAFETY: as above.
unsafe impl<T: Element> Sync for AlignedVec<T> {}

impl<T: Element> AlignedVec<T> {
    fn layout(len: usize) -> std::alloc::Layout {
        let bytes = len.saturating_mul(std::mem::size_of::<T>()).max(ALIGN);
        std::alloc::Layout::from_size_align(bytes, ALIGN)
            .unwrap_or_else(|_| panic!("AlignedVec of {len} elements is too large"))
    }

    /// `len` zeros. Panics, like `vec!`, where memory runs out.
    pub fn zeros(len: usize) -> AlignedVec<T> {
        let layout = Self::layout(len);
        // SAFETY: the layout's size is at least ALIGN, not zero.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) } as *mut T;
        match std::ptr::NonNull::new(raw) {
            Some(ptr) => AlignedVec { ptr, len },
            None => std::alloc::handle_alloc_error(layout),
        }
    }

    /// A copy of `data`.
    pub fn from_slice(data: &[T]) -> AlignedVec<T> {
        let mut v = AlignedVec::zeros(data.len());
        v.copy_from_slice(data);
        v
    }
}

impl<T: Element> Drop for AlignedVec<T> {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeros` with the same layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr() as *mut u8, Self::layout(self.len)) }
    }
}

impl<T: Element> std::ops::Deref for AlignedVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `len` initialized elements (zeroed is a valid value of every Element).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Element> std::ops::DerefMut for AlignedVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Element + std::fmt::Debug> std::fmt::Debug for AlignedVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

fn is_aligned<T>(p: *const T) -> bool {
    (p as usize).is_multiple_of(ALIGN)
}

/// An input as the kernel sees it: the caller's slice where it is aligned, else a copy.
enum Staged<'a, T: Element> {
    Direct(&'a [T]),
    Copied(AlignedVec<T>),
}

impl<'a, T: Element> Staged<'a, T> {
    fn new(data: &'a [T]) -> Staged<'a, T> {
        if is_aligned(data.as_ptr()) {
            Staged::Direct(data)
        } else {
            Staged::Copied(AlignedVec::from_slice(data))
        }
    }

    fn ptr(&self) -> *const T {
        match self {
            Staged::Direct(d) => d.as_ptr(),
            Staged::Copied(v) => v.as_ptr(),
        }
    }
}

/// An output as the kernel sees it: the caller's slice where it is aligned, else a scratch
/// buffer copied back by `finish`.
struct StagedOut<'a, T: Element> {
    dst: &'a mut [T],
    tmp: Option<AlignedVec<T>>,
}

impl<'a, T: Element> StagedOut<'a, T> {
    fn new(dst: &'a mut [T]) -> StagedOut<'a, T> {
        let tmp = (!is_aligned(dst.as_ptr())).then(|| AlignedVec::zeros(dst.len()));
        StagedOut { dst, tmp }
    }

    fn ptr(&mut self) -> *mut T {
        match &mut self.tmp {
            Some(v) => v.as_mut_ptr(),
            None => self.dst.as_mut_ptr(),
        }
    }

    fn finish(self) {
        if let Some(v) = self.tmp {
            self.dst.copy_from_slice(&v);
        }
    }
}

/// Why a kernel call was refused or failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// A slice of the wrong length.
    Length {
        /// The kernel.
        kernel: &'static str,
        /// The parameter.
        param: &'static str,
        /// Elements it must have.
        expected: usize,
        /// Elements it has.
        got: usize,
    },
    /// An array of the wrong shape.
    Shape {
        /// The kernel.
        kernel: &'static str,
        /// The parameter.
        param: &'static str,
        /// The shape it must have.
        expected: Vec<usize>,
        /// The shape it has.
        got: Vec<usize>,
    },
    /// A model was given the wrong number of inputs.
    Inputs {
        /// The model.
        model: &'static str,
        /// Inputs it takes.
        expected: usize,
        /// Inputs it was given.
        got: usize,
    },
    /// A model's tables do not fit its buffers (a corrupted or hand-edited module).
    Model {
        /// The model.
        model: &'static str,
        /// What does not fit.
        reason: String,
    },
    /// The kernel returned a failure status (1: out of memory for a temporary, 2: the
    /// parallel runtime failed).
    Kernel {
        /// The kernel.
        kernel: &'static str,
        /// The status code.
        status: i32,
    },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Length {
                kernel,
                param,
                expected,
                got,
            } => write!(
                f,
                "{kernel}: `{param}` must have {expected} elements, got {got}"
            ),
            Error::Shape {
                kernel,
                param,
                expected,
                got,
            } => write!(
                f,
                "{kernel}: `{param}` must have shape {expected:?}, got {got:?}"
            ),
            Error::Inputs {
                model,
                expected,
                got,
            } => write!(f, "{model}: takes {expected} inputs, got {got}"),
            Error::Model { model, reason } => write!(f, "{model}: {reason}"),
            Error::Kernel { kernel, status: 1 } => {
                write!(f, "{kernel}: out of memory for a temporary")
            }
            Error::Kernel { kernel, status } => write!(f, "{kernel}: failed with status {status}"),
        }
    }
}

impl std::error::Error for Error {}

fn check_len(
    kernel: &'static str,
    param: &'static str,
    got: usize,
    expected: usize,
) -> Result<(), Error> {
    if got == expected {
        Ok(())
    } else {
        Err(Error::Length {
            kernel,
            param,
            expected,
            got,
        })
    }
}

fn check_shape(
    kernel: &'static str,
    param: &'static str,
    got: &[usize],
    expected: &[usize],
) -> Result<(), Error> {
    if got == expected {
        Ok(())
    } else {
        Err(Error::Shape {
            kernel,
            param,
            expected: expected.to_vec(),
            got: got.to_vec(),
        })
    }
}

fn status(kernel: &'static str, code: i32) -> Result<(), Error> {
    match code {
        0 => Ok(()),
        status => Err(Error::Kernel { kernel, status }),
    }
}

// The runtime of a generated kernel module: the C runtime table kernels call into (a thread
// pool for parallel loops, aligned allocation for large temporaries), 64-byte aligned
// staging of arguments, and the error type of the wrappers. `tensortune::build` copies this
// file verbatim into the module it generates, after a line defining `DEFAULT_THREADS`; it
// needs nothing but `std`. Plain `//` comments only: the module is pulled in by `include!`.
//
// The table layout is the ABI of `tensortune::runtime::abi`: parallel_for, alloc, free, ctx,
// in that order. `parallel_for` must call `body` on disjoint ranges that cover `[0, n)` and
// return the first non-zero code a call returned, or 0.

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};

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
    alloc: rt_alloc,
    free: rt_free,
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

/// One chunk of a parallel loop, waiting for a thread.
struct Job {
    body: ParallelBody,
    closure: *mut c_void,
    begin: i64,
    end: i64,
    latch: *const Latch,
}
// SAFETY: the closure is built by the kernel for exactly this use (read-only while its
// parallel-for runs) and the latch outlives every job that points at it: `rt_parallel_for`
// returns only when all its jobs have counted down.
unsafe impl Send for Job {}

/// Counts the unfinished chunks of one parallel-for and keeps the first failure code.
struct Latch {
    state: Mutex<(usize, i32)>,
    done: Condvar,
}

impl Latch {
    fn count_down(&self, code: i32) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.0 -= 1;
        if s.1 == 0 {
            s.1 = code;
        }
        if s.0 == 0 {
            self.done.notify_all();
        }
    }
}

fn run(job: Job) {
    // SAFETY: see `Job`: the body runs its own disjoint range, as the ABI allows.
    let code = unsafe { (job.body)(job.closure, job.begin, job.end) };
    // SAFETY: the latch lives until its count reaches zero, which this call may cause.
    unsafe { (*job.latch).count_down(code) };
}

/// Worker threads started on first use; they live as long as the process.
struct Pool {
    queue: Mutex<std::collections::VecDeque<Job>>,
    ready: Condvar,
}

static POOL: OnceLock<Pool> = OnceLock::new();

fn pool() -> &'static Pool {
    POOL.get_or_init(|| {
        let threads = threads();
        let pool = Pool {
            queue: Mutex::new(std::collections::VecDeque::new()),
            ready: Condvar::new(),
        };
        for i in 1..threads {
            // Kernels keep register tiles on the stack (at most 512 KiB per function).
            let started = std::thread::Builder::new()
                .name(format!("tt-kernel-{i}"))
                .stack_size(8 << 20)
                .spawn(worker);
            if started.is_err() {
                // Fewer workers only means the calling thread runs more chunks itself.
                break;
            }
        }
        pool
    })
}

fn worker() {
    let pool = pool();
    loop {
        let job = {
            let mut q = pool.queue.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(j) = q.pop_front() {
                    break j;
                }
                q = pool.ready.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        run(job);
    }
}

/// Static schedule: `[0, n)` in `min(n, threads)` contiguous chunks whose sizes differ by at
/// most one. The calling thread runs the first chunk, then any queued chunk until its own are
/// done, so a call never waits on a pool that is busy elsewhere.
unsafe extern "C" fn rt_parallel_for(
    _rt: *const TtRuntime,
    n: i64,
    body: ParallelBody,
    closure: *mut c_void,
) -> i32 {
    if n <= 0 {
        return 0;
    }
    let chunks = (threads() as i64).min(n);
    if chunks <= 1 {
        // SAFETY: the kernel's own body over the whole range.
        return unsafe { body(closure, 0, n) };
    }
    let pool = pool();
    let latch = Latch {
        state: Mutex::new((chunks as usize, 0)),
        done: Condvar::new(),
    };
    let chunk = |c: i64| Job {
        body,
        closure,
        begin: n * c / chunks,
        end: n * (c + 1) / chunks,
        latch: &latch,
    };
    {
        let mut q = pool.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.extend((1..chunks).map(chunk));
    }
    pool.ready.notify_all();
    run(chunk(0));
    loop {
        let job = pool
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front();
        match job {
            Some(j) => run(j),
            None => break,
        }
    }
    let mut s = latch.state.lock().unwrap_or_else(|e| e.into_inner());
    while s.0 > 0 {
        s = latch.done.wait(s).unwrap_or_else(|e| e.into_inner());
    }
    s.1
}

/// Alignment of every buffer a kernel sees: one cache line, one AVX-512 vector.
const ALIGN: usize = 64;

unsafe extern "C" fn rt_alloc(_rt: *const TtRuntime, bytes: i64) -> *mut c_void {
    // One alignment unit before the block remembers its size.
    let Some(total) = usize::try_from(bytes)
        .ok()
        .and_then(|b| b.checked_add(ALIGN))
    else {
        return std::ptr::null_mut();
    };
    let Ok(layout) = std::alloc::Layout::from_size_align(total, ALIGN) else {
        return std::ptr::null_mut();
    };
    // SAFETY: the layout's size is at least ALIGN, not zero.
    let base = unsafe { std::alloc::alloc(layout) };
    if base.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: the header lies inside the block and is aligned for usize.
    unsafe {
        (base as *mut usize).write(total);
        base.add(ALIGN) as *mut c_void
    }
}

unsafe extern "C" fn rt_free(_rt: *const TtRuntime, ptr: *mut c_void) {
    if ptr.is_null() {
        return;
    }
    // SAFETY: `ptr` came from `rt_alloc`, whose header holds the size of the block.
    unsafe {
        let base = (ptr as *mut u8).sub(ALIGN);
        let total = (base as *const usize).read();
        std::alloc::dealloc(
            base,
            std::alloc::Layout::from_size_align_unchecked(total, ALIGN),
        );
    }
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

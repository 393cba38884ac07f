//! [`Runtime`]: the host implementation of the kernel runtime table over a thread pool.

use super::abi::{ParallelBody, Status, TtRuntime};
use std::alloc::Layout;
use std::ffi::c_void;
use std::sync::atomic::{AtomicI32, Ordering};

/// Stack size of the worker threads. Kernels keep small tiles on the stack (the codegen caps
/// one function's stack temporaries at [`crate::codegen::CodegenOptions::max_stack_bytes`]),
/// so 8 MiB leaves a wide margin.
const WORKER_STACK_BYTES: usize = 8 << 20;

/// Thread pool and runtime table for running kernels. With one thread every parallel loop
/// runs inline on the calling thread.
pub struct Runtime {
    /// Boxed so that its address, which kernels receive, is stable while `Runtime` moves.
    table: Box<TtRuntime>,
    /// Boxed for the same reason: `table.ctx` points at it.
    state: Box<PoolState>,
}

struct PoolState {
    threads: usize,
    pool: Option<rayon::ThreadPool>,
}

/// Failure to start the worker threads.
#[derive(Debug, thiserror::Error)]
#[error("cannot start a pool of {threads} threads: {message}")]
pub struct PoolError {
    /// Threads requested.
    pub threads: usize,
    /// What the thread library said.
    pub message: String,
}

// SAFETY: the table holds function pointers and a pointer to `PoolState`, which is owned by
// the same `Runtime`; `PoolState` itself is a thread pool, usable from any thread.
unsafe impl Send for Runtime {}
// SAFETY: as above; the callbacks only read the pool state.
unsafe impl Sync for Runtime {}

impl Runtime {
    /// A runtime with `threads` workers (0 is taken as 1; 1 means serial, no pool).
    pub fn new(threads: usize) -> Result<Runtime, PoolError> {
        let threads = threads.max(1);
        let pool = if threads > 1 {
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .stack_size(WORKER_STACK_BYTES)
                    .thread_name(|i| format!("tt-worker-{i}"))
                    .build()
                    .map_err(|e| PoolError {
                        threads,
                        message: e.to_string(),
                    })?,
            )
        } else {
            None
        };
        let state = Box::new(PoolState { threads, pool });
        let table = Box::new(TtRuntime {
            parallel_for: tt_parallel_for,
            alloc: tt_alloc,
            free: tt_free,
            ctx: &*state as *const PoolState as *const c_void,
        });
        Ok(Runtime { table, state })
    }

    /// The serial runtime (one thread, no pool).
    pub fn serial() -> Runtime {
        let state = Box::new(PoolState {
            threads: 1,
            pool: None,
        });
        let table = Box::new(TtRuntime {
            parallel_for: tt_parallel_for,
            alloc: tt_alloc,
            free: tt_free,
            ctx: &*state as *const PoolState as *const c_void,
        });
        Runtime { table, state }
    }

    /// Number of threads parallel loops are spread over.
    pub fn threads(&self) -> usize {
        self.state.threads
    }

    /// The table to pass to a kernel; valid while `self` lives.
    pub fn table(&self) -> *const TtRuntime {
        &*self.table
    }
}

/// A pointer that may cross threads: the closure of an outlined body, which the generated
/// code built for exactly this purpose (it is only read, and outlives the parallel-for).
#[derive(Clone, Copy)]
struct SendPtr(*mut c_void);
// SAFETY: see the type's doc; the pointee is read-only while the parallel-for runs.
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

/// Static schedule: `[0, n)` in `min(n, threads)` contiguous chunks whose sizes differ by at
/// most one, like TVM's default CPU parallel launch.
unsafe extern "C" fn tt_parallel_for(
    rt: *const TtRuntime,
    n: i64,
    body: ParallelBody,
    closure: *mut c_void,
) -> i32 {
    if n <= 0 {
        return Status::Ok as i32;
    }
    // SAFETY: kernels receive `rt` from `Runtime::table`, whose ctx points at the state.
    let state = unsafe { &*((*rt).ctx as *const PoolState) };
    let pool = match &state.pool {
        Some(p) if n > 1 => p,
        // SAFETY: calling the kernel's own body on the whole range, as the ABI promises.
        _ => return unsafe { body(closure, 0, n) },
    };
    let chunks = (state.threads as i64).min(n);
    let status = AtomicI32::new(0);
    let closure = SendPtr(closure);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pool.scope(|s| {
            for c in 0..chunks {
                let begin = n * c / chunks;
                let end = n * (c + 1) / chunks;
                let status = &status;
                s.spawn(move |_| {
                    let closure = closure;
                    // SAFETY: disjoint ranges of the same body and closure, as the ABI allows.
                    let code = unsafe { body(closure.0, begin, end) };
                    if code != 0 {
                        let _ =
                            status.compare_exchange(0, code, Ordering::SeqCst, Ordering::SeqCst);
                    }
                });
            }
        })
    }));
    match result {
        Ok(()) => status.load(Ordering::SeqCst),
        Err(_) => Status::ParallelFailed as i32,
    }
}

/// Alignment of every runtime allocation: one cache line, and one AVX-512 vector.
const ALIGN: usize = 64;
/// Bytes before each allocation that remember its size (one alignment unit, so the user
/// pointer stays aligned).
const HEADER: usize = ALIGN;

unsafe extern "C" fn tt_alloc(_rt: *const TtRuntime, bytes: i64) -> *mut c_void {
    let Ok(bytes) = usize::try_from(bytes) else {
        return std::ptr::null_mut();
    };
    let Some(total) = bytes.checked_add(HEADER) else {
        return std::ptr::null_mut();
    };
    let Ok(layout) = Layout::from_size_align(total, ALIGN) else {
        return std::ptr::null_mut();
    };
    // SAFETY: the layout has a non-zero size (HEADER > 0).
    let base = unsafe { std::alloc::alloc(layout) };
    if base.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: the header lies inside the allocation and is aligned for usize.
    unsafe {
        (base as *mut usize).write(total);
        base.add(HEADER) as *mut c_void
    }
}

unsafe extern "C" fn tt_free(_rt: *const TtRuntime, ptr: *mut c_void) {
    if ptr.is_null() {
        return;
    }
    // SAFETY: `ptr` came from `tt_alloc`, so its header holds the total size it allocated
    // with the same alignment.
    unsafe {
        let base = (ptr as *mut u8).sub(HEADER);
        let total = (base as *const usize).read();
        std::alloc::dealloc(base, Layout::from_size_align_unchecked(total, ALIGN));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicI64;

    unsafe extern "C" fn count(closure: *mut c_void, begin: i64, end: i64) -> i32 {
        // SAFETY: every caller below passes a pointer to an AtomicI64 that outlives the call.
        let sum = unsafe { &*(closure as *const AtomicI64) };
        for i in begin..end {
            sum.fetch_add(i, Ordering::SeqCst);
        }
        0
    }

    #[test]
    fn parallel_for_covers_the_range_once() {
        for threads in [1, 2, 3] {
            let rt = Runtime::new(threads).expect("pool");
            for n in [1i64, 2, 5, 100] {
                let sum = AtomicI64::new(0);
                let t = rt.table();
                // SAFETY: the table of a live runtime, a callback of the expected signature,
                // and a closure that outlives the call.
                let code = unsafe {
                    ((*t).parallel_for)(t, n, count, &sum as *const AtomicI64 as *mut c_void)
                };
                assert_eq!(code, 0);
                assert_eq!(sum.load(Ordering::SeqCst), n * (n - 1) / 2);
            }
        }
    }

    unsafe extern "C" fn calls(closure: *mut c_void, _begin: i64, _end: i64) -> i32 {
        // SAFETY: the caller below passes a pointer to an AtomicI64 that outlives the call.
        let n = unsafe { &*(closure as *const AtomicI64) };
        n.fetch_add(1, Ordering::SeqCst);
        0
    }

    unsafe extern "C" fn fail_on_second_half(_closure: *mut c_void, begin: i64, _end: i64) -> i32 {
        if begin > 0 {
            7
        } else {
            0
        }
    }

    #[test]
    fn parallel_for_splits_into_thread_chunks_and_reports_failure() {
        let rt = Runtime::new(2).expect("pool");
        let t = rt.table();
        let n = AtomicI64::new(0);
        // SAFETY: the table of a live runtime, a callback of the expected signature, and a
        // closure that outlives the call.
        let code =
            unsafe { ((*t).parallel_for)(t, 10, calls, &n as *const AtomicI64 as *mut c_void) };
        assert_eq!((code, n.load(Ordering::SeqCst)), (0, 2));
        // SAFETY: as above; this callback never reads its closure, which may be null.
        let code = unsafe { ((*t).parallel_for)(t, 10, fail_on_second_half, std::ptr::null_mut()) };
        assert_eq!(code, 7);
    }

    #[test]
    fn alloc_is_aligned_and_frees() {
        let rt = Runtime::serial();
        let t = rt.table();
        // SAFETY: the table of a live runtime; the block is freed once, by the same table.
        unsafe {
            let p = ((*t).alloc)(t, 1000);
            assert!(!p.is_null());
            assert_eq!(p as usize % 64, 0);
            ((*t).free)(t, p);
            assert!(((*t).alloc)(t, -1).is_null());
        }
    }
}

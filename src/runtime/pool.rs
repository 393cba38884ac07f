//! [`Runtime`]: the host implementation of the kernel runtime table over a thread pool.
//!
//! The pool and the allocator are the text of `shared_pool.rs`, which every module generated
//! by [`crate::build`] carries verbatim too: tuning measures kernels on the runtime that
//! builds ship.

use super::abi::{ParallelBody, TtRuntime};
use std::ffi::c_void;

include!("shared_pool.rs");

/// Thread pool and runtime table for running kernels. With one thread every parallel loop
/// runs inline on the calling thread.
///
/// The workers are started by [`Runtime::new`] in the process that calls it (a forked child
/// makes its own), and stopped when the runtime is dropped.
pub struct Runtime {
    /// Boxed so that its address, which kernels receive, is stable while `Runtime` moves.
    table: Box<TtRuntime>,
    /// Boxed for the same reason: `table.ctx` points at it.
    pool: Box<Pool>,
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

// SAFETY: the table holds function pointers and a pointer to the `Pool` owned by the same
// `Runtime`; the pool itself is usable from any thread.
unsafe impl Send for Runtime {}
// SAFETY: as above; the callbacks only share the pool, whose queue is behind a lock.
unsafe impl Sync for Runtime {}

impl Runtime {
    /// A runtime with `threads` threads: the caller and `threads - 1` workers (0 is taken as
    /// 1; 1 means serial, no worker).
    pub fn new(threads: usize) -> Result<Runtime, PoolError> {
        let (pool, error) = Pool::start(threads);
        if let Some(e) = error {
            return Err(PoolError {
                threads: pool.threads,
                message: e.to_string(),
            });
        }
        Ok(Runtime::with_pool(pool))
    }

    /// The serial runtime (one thread, no worker).
    pub fn serial() -> Runtime {
        Runtime::with_pool(Pool::start(1).0)
    }

    fn with_pool(pool: Pool) -> Runtime {
        let pool = Box::new(pool);
        let table = Box::new(TtRuntime {
            parallel_for: tt_parallel_for,
            alloc: tt_alloc,
            free: tt_free,
            ctx: &*pool as *const Pool as *const c_void,
        });
        Runtime { table, pool }
    }

    /// Number of threads parallel loops are spread over.
    pub fn threads(&self) -> usize {
        self.pool.threads
    }

    /// The table to pass to a kernel; valid while `self` lives.
    pub fn table(&self) -> *const TtRuntime {
        &*self.table
    }
}

/// `rt->parallel_for` of the pool in `rt->ctx`.
unsafe extern "C" fn tt_parallel_for(
    rt: *const TtRuntime,
    n: i64,
    body: ParallelBody,
    closure: *mut c_void,
) -> i32 {
    // SAFETY: kernels receive `rt` from `Runtime::table`, whose ctx points at its live pool.
    let pool = unsafe { &*((*rt).ctx as *const Pool) };
    pool.parallel_for(n, body, closure)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicI64, Ordering};

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
    fn concurrent_callers_and_nested_loops_share_the_pool() {
        let rt = Runtime::new(3).expect("pool");
        let t = rt.table() as usize;
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(move || {
                    let t = t as *const TtRuntime;
                    for _ in 0..50 {
                        let sum = AtomicI64::new(0);
                        // SAFETY: as above; the runtime outlives the scope.
                        let code = unsafe {
                            ((*t).parallel_for)(
                                t,
                                64,
                                count,
                                &sum as *const AtomicI64 as *mut c_void,
                            )
                        };
                        assert_eq!((code, sum.load(Ordering::SeqCst)), (0, 64 * 63 / 2));
                    }
                });
            }
        });
        // A body that runs a parallel-for of its own on the same pool.
        struct Nested {
            rt: *const TtRuntime,
            sum: AtomicI64,
        }
        unsafe extern "C" fn outer(closure: *mut c_void, begin: i64, end: i64) -> i32 {
            // SAFETY: the closure is the `Nested` below, alive for the whole call.
            let nested = unsafe { &*(closure as *const Nested) };
            let mut code = 0;
            for _ in begin..end {
                let sum = &nested.sum as *const AtomicI64 as *mut c_void;
                // SAFETY: the live runtime's table and a closure that outlives the call.
                code |= unsafe { ((*nested.rt).parallel_for)(nested.rt, 10, count, sum) };
            }
            code
        }
        let nested = Nested {
            rt: rt.table(),
            sum: AtomicI64::new(0),
        };
        let t = rt.table();
        // SAFETY: as above.
        let code =
            unsafe { ((*t).parallel_for)(t, 6, outer, &nested as *const Nested as *mut c_void) };
        assert_eq!((code, nested.sum.load(Ordering::SeqCst)), (0, 6 * 45));
    }

    #[test]
    fn runtimes_start_and_stop_their_workers() {
        for threads in [2, 4] {
            for _ in 0..20 {
                let rt = Runtime::new(threads).expect("pool");
                assert_eq!(rt.threads(), threads);
            }
        }
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

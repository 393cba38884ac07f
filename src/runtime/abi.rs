//! The C ABI between generated kernels and the runtime.
//!
//! Every kernel `NAME` is emitted as two external functions:
//!
//! ```c
//! // Positional: one pointer per buffer parameter (inputs, then outputs), each 64-byte
//! // aligned, not aliasing any other written buffer, followed by the runtime table.
//! int32_t NAME(float *A, float *B, float *C, const tt_runtime *rt);
//! // Packed: the same pointers in an array; what the JIT calls.
//! int32_t NAME_packed(void *const *args, const tt_runtime *rt);
//! ```
//!
//! The return value is a [`Status`] code (0 = success). Parallel loops are outlined into
//! `int32_t body(void *closure, int64_t begin, int64_t end)` functions that run iterations
//! `[begin, end)` and are handed to `rt->parallel_for`, which must call `body` on disjoint
//! ranges covering `[0, n)` (in any order, on any threads) and return the first non-zero code
//! a call returned, or 0. Large temporaries come from `rt->alloc` (64-byte aligned, NULL on
//! failure) and go back through `rt->free`.

use std::ffi::c_void;

/// Outlined body of a parallel loop: runs iterations `[begin, end)`; returns a [`Status`] code.
pub type ParallelBody = unsafe extern "C" fn(closure: *mut c_void, begin: i64, end: i64) -> i32;

/// `rt->parallel_for(rt, n, body, closure)`.
pub type ParallelFor = unsafe extern "C" fn(
    rt: *const TtRuntime,
    n: i64,
    body: ParallelBody,
    closure: *mut c_void,
) -> i32;

/// `rt->alloc(rt, bytes)`: 64-byte aligned memory, or NULL. The block must be fresh, as
/// malloc's is (no other live pointer reaches it): kernels are compiled assuming so.
pub type AllocFn = unsafe extern "C" fn(rt: *const TtRuntime, bytes: i64) -> *mut c_void;

/// `rt->free(rt, ptr)`: releases memory from `alloc` (NULL is ignored).
pub type FreeFn = unsafe extern "C" fn(rt: *const TtRuntime, ptr: *mut c_void);

/// The runtime table a kernel receives. Field order is ABI: the codegen loads the fields by
/// position (0: parallel_for, 1: alloc, 2: free, 3: ctx).
#[repr(C)]
pub struct TtRuntime {
    /// Runs an outlined parallel body over `[0, n)`.
    pub parallel_for: ParallelFor,
    /// Aligned allocation for large temporaries.
    pub alloc: AllocFn,
    /// Releases what `alloc` returned.
    pub free: FreeFn,
    /// The implementation's own state (a thread pool), opaque to kernels.
    pub ctx: *const c_void,
}

/// Kernel return codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum Status {
    /// The kernel ran to completion.
    Ok = 0,
    /// `rt->alloc` returned NULL for a temporary.
    AllocFailed = 1,
    /// A parallel-for failed to run its body (the runtime itself failed).
    ParallelFailed = 2,
}

impl Status {
    /// The status for a code returned by a kernel, `None` if the code is unknown.
    pub fn from_code(code: i32) -> Option<Status> {
        Some(match code {
            0 => Status::Ok,
            1 => Status::AllocFailed,
            2 => Status::ParallelFailed,
            _ => return None,
        })
    }
}

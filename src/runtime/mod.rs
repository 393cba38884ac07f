//! The CPU runtime that compiled kernels call into and that callers run kernels with.
//!
//! It owns three things:
//! - [`abi`]: the C ABI between generated code and its host: the [`abi::TtRuntime`] table of
//!   callbacks (parallel-for, aligned allocation) that every kernel receives as its last
//!   argument. The ABI is plain C so that an object file emitted by the codegen links into a
//!   user binary with any small runtime that fills the same table.
//! - [`Runtime`]: the host's implementation of that table over a thread pool whose size is a
//!   run-time setting (1 thread runs every parallel loop inline, serially).
//! - [`buffer`]: 64-byte aligned host buffers with a dtype and a shape, which is what kernels
//!   read and write (their buffer arguments are declared `noalias align 64`).
//! - [`memory`]: whether a workload's buffers fit in what the machine has left.
//!
//! [`flush_cache`] evicts a set of buffers from the CPU caches between runs; [`cache`] says
//! when a timing does.

pub mod abi;
pub mod buffer;
pub mod cache;
mod fenced;
pub mod memory;
mod pool;

pub use buffer::{AlignedBuffer, BufferError};
pub use cache::CacheFlush;
pub use pool::Runtime;

/// Evicts the cache lines of `bufs` from every cache level.
pub fn flush_cache(bufs: &[&AlignedBuffer]) {
    let ranges: Vec<(*const u8, usize)> = bufs.iter().map(|b| (b.as_ptr(), b.byte_len())).collect();
    flush_ranges(&ranges);
}

/// Evicts `(start, bytes)` ranges of live allocations from the caches (x86-64: `clflush` on
/// each line; elsewhere, a write over a scratch area larger than a typical last-level cache).
pub(crate) fn flush_ranges(ranges: &[(*const u8, usize)]) {
    #[cfg(target_arch = "x86_64")]
    {
        for &(ptr, bytes) in ranges {
            let mut off = 0;
            while off < bytes {
                // SAFETY: `ptr + off` lies inside a live allocation (the caller's promise);
                // clflush only evicts the line and neither reads nor writes memory visibly.
                unsafe { core::arch::x86_64::_mm_clflush(ptr.add(off)) };
                off += 64;
            }
        }
        // SAFETY: a fence has no memory-safety preconditions.
        unsafe { core::arch::x86_64::_mm_mfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ranges;
        let mut scratch = vec![0u8; 64 << 20];
        for (i, x) in scratch.iter_mut().enumerate().step_by(64) {
            *x = i as u8;
        }
        std::hint::black_box(&scratch);
    }
}

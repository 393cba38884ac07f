//! The GPU execution model of the loop IR, shared by the CUDA code generator, the lockstep
//! interpreter and the GPU verifier.
//!
//! A kernel's body is run by every thread of the launch. A loop bound to a block or thread
//! axis ([`ForKind::ThreadBound`]) is not a loop: its variable is the thread's index along
//! that axis, and its body runs only where that index is below the loop's extent. The launch
//! ([`launch_dims`]) is, along each axis, the largest extent of a loop bound to it.
//!
//! A loop bound to an axis inside another loop bound to the same axis reads the same index:
//! that is how the threads of a block cooperate on a stage attached inside their loop (a
//! fetch into shared memory split by the thread count and bound to `threadIdx.x` again). Its
//! extent must not pass the enclosing one's, or the threads past that never reach it.

pub mod interp;
pub mod verify;

use crate::ir::{ForKind, LoweredFunc, Stmt, ThreadAxis};

/// Most threads in one block on every CUDA GPU since compute capability 2.0.
pub const MAX_BLOCK_THREADS: u64 = 1024;

/// Largest extent of each block dimension (x, y, z) and each grid dimension.
const MAX_BLOCK_DIM: [i64; 3] = [1024, 1024, 64];
const MAX_GRID_DIM: [i64; 3] = [(1 << 31) - 1, 65535, 65535];

/// Grid and block sizes of a kernel launch: `grid[0]` is `gridDim.x`, `block[2]` is
/// `blockDim.z`. Axes no loop is bound to are 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchDims {
    /// Blocks along x, y, z.
    pub grid: [u32; 3],
    /// Threads of a block along x, y, z.
    pub block: [u32; 3],
}

impl LaunchDims {
    /// Threads in one block.
    pub fn threads_per_block(&self) -> u64 {
        self.block.iter().map(|&d| d as u64).product()
    }

    /// The launch size along `axis` (1 for a virtual thread, which is a loop).
    pub fn extent(&self, axis: ThreadAxis) -> u32 {
        match slot(axis) {
            Some((true, d)) => self.grid[d],
            Some((false, d)) => self.block[d],
            None => 1,
        }
    }
}

/// Why a function has no valid launch.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// A loop bound to `axis` inside another loop bound to the same axis with a smaller
    /// extent: the threads past the outer extent never reach the inner loop, so its
    /// iterations past that extent never run.
    #[error("loop `{inner}` bound to `{axis}` has extent {inner_extent}, more than the {outer_extent} of loop `{outer}` around it bound to the same axis")]
    RebindWider {
        /// The CUDA name of the axis, e.g. `threadIdx.x`.
        axis: &'static str,
        /// The enclosing loop bound to it.
        outer: String,
        /// Its extent.
        outer_extent: i64,
        /// The nested loop bound to it again.
        inner: String,
        /// Its extent.
        inner_extent: i64,
    },
    /// A block of more threads than a GPU runs.
    #[error("{threads} threads per block (block {block:?}); at most {MAX_BLOCK_THREADS}")]
    TooManyThreads {
        /// The product of the block's dimensions.
        threads: u64,
        /// The block's dimensions.
        block: [i64; 3],
    },
    /// One launch dimension over CUDA's limit for it.
    #[error("`{axis}` has extent {extent}, over the limit {limit}")]
    DimTooLarge {
        /// The CUDA name of the axis.
        axis: &'static str,
        /// The extent asked for.
        extent: i64,
        /// The largest allowed.
        limit: i64,
    },
}

/// Whether `axis` is a grid (true) or block (false) dimension, and which one; `None` for a
/// virtual thread.
pub fn slot(axis: ThreadAxis) -> Option<(bool, usize)> {
    Some(match axis {
        ThreadAxis::BlockX => (true, 0),
        ThreadAxis::BlockY => (true, 1),
        ThreadAxis::BlockZ => (true, 2),
        ThreadAxis::ThreadX => (false, 0),
        ThreadAxis::ThreadY => (false, 1),
        ThreadAxis::ThreadZ => (false, 2),
        ThreadAxis::VThread => return None,
    })
}

/// The launch of `func`: along each axis, the largest extent of a loop bound to it.
pub fn launch_dims(func: &LoweredFunc) -> Result<LaunchDims, LaunchError> {
    // grid then block, x y z; the path holds the loops bound to each of the six on the way.
    let mut dims = [1i64; 6];
    let mut path: [Option<(&str, i64)>; 6] = [None; 6];
    walk_bound(&func.body, &mut path, &mut dims)?;
    for (i, &n) in dims.iter().enumerate() {
        let (limit, axis) = if i < 3 {
            (MAX_GRID_DIM[i], ["gridDim.x", "gridDim.y", "gridDim.z"][i])
        } else {
            (
                MAX_BLOCK_DIM[i - 3],
                ["blockDim.x", "blockDim.y", "blockDim.z"][i - 3],
            )
        };
        if n > limit {
            return Err(LaunchError::DimTooLarge {
                axis,
                extent: n,
                limit,
            });
        }
    }
    let block = [dims[3], dims[4], dims[5]];
    let threads = block.iter().map(|&d| d as u64).product::<u64>();
    if threads > MAX_BLOCK_THREADS {
        return Err(LaunchError::TooManyThreads { threads, block });
    }
    // Every dimension is now within [1, 2^31 - 1].
    let u = |i: usize| dims[i] as u32;
    Ok(LaunchDims {
        grid: [u(0), u(1), u(2)],
        block: [u(3), u(4), u(5)],
    })
}

fn walk_bound<'f>(
    s: &'f Stmt,
    path: &mut [Option<(&'f str, i64)>; 6],
    dims: &mut [i64; 6],
) -> Result<(), LaunchError> {
    match s {
        Stmt::For {
            var,
            extent,
            kind: ForKind::ThreadBound(axis),
            body,
        } => {
            let Some((grid, d)) = slot(*axis) else {
                return walk_bound(body, path, dims);
            };
            let i = if grid { d } else { 3 + d };
            let outer = path[i];
            if let Some((name, n)) = outer {
                if *extent > n {
                    return Err(LaunchError::RebindWider {
                        axis: axis.name(),
                        outer: name.to_string(),
                        outer_extent: n,
                        inner: var.name.to_string(),
                        inner_extent: *extent,
                    });
                }
            }
            dims[i] = dims[i].max(*extent);
            path[i] = Some((var.name, *extent));
            let r = walk_bound(body, path, dims);
            path[i] = outer;
            r
        }
        Stmt::For { body, .. } | Stmt::Allocate { body, .. } => walk_bound(body, path, dims),
        Stmt::If {
            then, otherwise, ..
        } => {
            walk_bound(then, path, dims)?;
            match otherwise {
                Some(o) => walk_bound(o, path, dims),
                None => Ok(()),
            }
        }
        Stmt::Seq(items) => items.iter().try_for_each(|x| walk_bound(x, path, dims)),
        Stmt::Store { .. } | Stmt::Shuffle { .. } | Stmt::Sync | Stmt::Prefetch { .. } => Ok(()),
    }
}

//! The GPU verifier: what a kernel asks of the GPU it runs on, checked against a
//! [`CudaDesc`] before any code is generated, so that the search drops a candidate that
//! cannot launch (or that would compute garbage) without compiling it.
//!
//! [`verify_gpu`] checks, for a [`LoweredFunc`] under the execution model of [`super`]:
//! 1. the function has a launch ([`launch_dims`]; its error is wrapped);
//! 2. the threads of a block are at most `desc.max_threads_per_block`;
//! 3. the static shared memory is at most `desc.shared_memory_per_block`: the bytes of every
//!    `Shared` temporary (each buffer counted once, however many `Allocate`s name it), laid
//!    out in the order first allocated, each from a [`SHARED_ALIGN`]-byte boundary, as the
//!    code generator declares them (so that this is what `ptxas` reports, not less);
//! 4. every virtual-thread loop has an extent of at most [`MAX_VTHREAD`];
//! 5. a `Vectorized` loop's extent times the widest element its body loads or stores is at
//!    most [`MAX_VECTOR_BYTES`];
//! 6. a store into a `Global` buffer lies inside a loop bound to every launch axis (grid or
//!    block) of extent above 1, and one into a `Shared` buffer inside a loop bound to every
//!    block axis of extent above 1: otherwise every thread along the missing axis runs the
//!    same store (a race, and a wrong result when it reads what it writes, as an
//!    accumulation does). The innermost such loop's variable must also reach the store,
//!    through its index or the condition of an `If` around it: a store inside a thread loop
//!    that neither reads is the same store in each of its threads (a shared-memory copy
//!    nested in the consumer's thread loop without a thread loop of its own). A store into a
//!    `Local` buffer is per thread and always fine;
//! 7. a `Sync` is not inside a `Vectorized` loop, not inside a loop bound to a block axis
//!    whose extent is below the launch's along that axis (the threads past the extent skip
//!    the barrier the others wait at), and not inside an `If` whose condition reads the
//!    variable of a loop bound to a block axis (a divergent barrier). A `Sync` outside every
//!    bound loop is fine: every thread of the block reaches it;
//! 8. a `Global` temporary is not allocated inside a bound loop (one per block or thread;
//!    a kernel cannot allocate device memory);
//! 9. every buffer named by a store or an allocation is in the function's table;
//! 10. a warp shuffle ([`Stmt::Shuffle`]) is run by whole warps: it lies inside a loop bound
//!     to `threadIdx.x` whose extent is a multiple of the warp size, the block is one row of
//!     threads or its x extent is a multiple of the warp size too (so that each warp is 32
//!     threads of one row, all inside that loop or all outside it), no `If` on a thread index
//!     and no vectorized loop lies around it, and its buffer passes the store checks of 6.
//!
//! Not checked: registers (only `ptxas` knows them), local memory (its limit is far above
//! what a schedule asks), conditions that diverge through a loaded value rather than a thread
//! index (lowering writes none), and the IR's own invariants ([`crate::verify`]).
//!
//! Whether the block is a whole number of warps is reported ([`GpuUsage::whole_warps`]), not
//! checked: a partial warp only idles lanes, so it is for the sketch rules that promise whole
//! warps to reject.

use super::{launch_dims, slot, LaunchDims, LaunchError};
use crate::expr::{BufId, Expr};
use crate::ir::{BufferDecl, ForKind, LoweredFunc, Scope, Stmt, ThreadAxis};
use crate::target::CudaDesc;
use rustc_hash::FxHashSet as HashSet;

/// The widest vectorized loop, in bytes: 128 bits is the widest load or store a GPU thread
/// issues (`ld.global.v4.f32`), so a wider vector is split into several anyway.
pub const MAX_VECTOR_BYTES: u64 = 16;

/// The longest virtual-thread loop: its iterations are interleaved copies of the body, so
/// each one multiplies the registers the body holds (TVM's limit as well).
pub const MAX_VTHREAD: i64 = 8;

/// The alignment of each shared array the PTX generator declares (`tensortune::codegen::
/// nvptx` aligns them for 128-bit loads): a buffer whose bytes are no multiple of it leaves
/// a gap before the next, and that gap counts against the block's shared memory.
pub const SHARED_ALIGN: u64 = 16;

/// What a kernel that passed [`verify_gpu`] uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuUsage {
    /// Its launch.
    pub launch: LaunchDims,
    /// Static shared memory of one block, in bytes: its `Shared` temporaries end to end,
    /// each from a [`SHARED_ALIGN`] boundary (their plain sum where every one is a multiple
    /// of it).
    pub shared_bytes: u64,
    /// Bytes of `Local` temporaries of one thread (registers or local memory).
    pub local_bytes: u64,
    /// True if the threads of a block are a whole number of warps of the description.
    pub whole_warps: bool,
}

/// Why a kernel does not fit the GPU described; every variant names the loop or buffer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GpuVerifyError {
    /// The function has no valid launch.
    #[error("no valid launch: {0}")]
    Launch(#[from] LaunchError),
    /// More threads in a block than the GPU allows.
    #[error("{threads} threads per block (block {block:?}) over the {limit} of {arch}")]
    TooManyThreads {
        /// Threads of one block.
        threads: u64,
        /// The block's dimensions.
        block: [u32; 3],
        /// The description's limit.
        limit: u32,
        /// The architecture described.
        arch: String,
    },
    /// More static shared memory than a block may declare.
    #[error(
        "shared memory {} of {} over the {} per block of {arch}",
        show_bytes(*.bytes),
        quoted(.buffers),
        show_bytes(*.limit)
    )]
    SharedMemory {
        /// Bytes asked for.
        bytes: u64,
        /// The `Shared` temporaries, in the order first allocated.
        buffers: Vec<String>,
        /// The description's limit in bytes.
        limit: u64,
        /// The architecture described.
        arch: String,
    },
    /// A virtual-thread loop over [`MAX_VTHREAD`].
    #[error("virtual-thread loop `{var}` has extent {extent}, over the {MAX_VTHREAD} allowed")]
    VThreadTooLong {
        /// The loop's variable.
        var: String,
        /// Its extent.
        extent: i64,
    },
    /// A vectorized loop wider than the widest GPU load.
    #[error(
        "vectorized loop `{var}` of {extent} lanes of {elem_bytes} bytes is {} bytes, over \
         the {MAX_VECTOR_BYTES} of the widest GPU load",
        (*.extent as u64).saturating_mul(*.elem_bytes)
    )]
    VectorTooWide {
        /// The loop's variable.
        var: String,
        /// Its extent (lanes).
        extent: i64,
        /// The widest element its body loads or stores.
        elem_bytes: u64,
    },
    /// A store that several threads run alike.
    #[error(
        "store to {scope} buffer `{buffer}` is outside every loop bound to `{axis}`: all \
         {threads} along it would run it (a race)"
    )]
    RacyStore {
        /// The buffer stored to.
        buffer: String,
        /// Its scope (`global` or `shared`).
        scope: &'static str,
        /// The launch axis no loop around the store is bound to, e.g. `threadIdx.y`.
        axis: &'static str,
        /// The launch's extent along it.
        threads: u32,
    },
    /// A store that the threads of a bound loop around it all run alike: neither its index
    /// nor a condition around it reads the loop's variable.
    #[error(
        "store to {scope} buffer `{buffer}` does not depend on `{var}` (bound to `{axis}`, \
         {extent} of them): they all write the same element (a race)"
    )]
    UniformStore {
        /// The buffer stored to.
        buffer: String,
        /// Its scope (`global` or `shared`).
        scope: &'static str,
        /// The innermost loop bound to the axis.
        var: String,
        /// The axis, e.g. `threadIdx.x`.
        axis: &'static str,
        /// The loop's extent.
        extent: i64,
    },
    /// A barrier inside a vectorized loop.
    #[error("barrier inside vectorized loop `{var}`")]
    SyncInVectorized {
        /// The loop's variable.
        var: String,
    },
    /// A barrier some threads of the block never reach because a bound loop around it is
    /// narrower than the block.
    #[error(
        "barrier inside loop `{var}` bound to `{axis}` with extent {extent}, below the \
         block's {launch}: the threads past it never reach the barrier"
    )]
    SyncInPartialLoop {
        /// The loop's variable.
        var: String,
        /// Its axis.
        axis: &'static str,
        /// Its extent.
        extent: i64,
        /// The launch's extent along the axis.
        launch: u32,
    },
    /// A barrier under a condition that differs between the threads of a block.
    #[error("barrier inside a condition on thread index `{var}` (a divergent barrier)")]
    DivergentSync {
        /// The thread-bound variable the condition reads.
        var: String,
    },
    /// A warp shuffle that some lanes of a warp may not run together (check 10).
    #[error("warp shuffle into `{buffer}` {reason}: all the lanes of a warp must run it together")]
    PartialWarpShuffle {
        /// The buffer the shuffle writes.
        buffer: String,
        /// What breaks the warp, e.g. "inside a condition on thread index `t`".
        reason: String,
    },
    /// A global temporary inside a bound loop.
    #[error(
        "global temporary `{buffer}` allocated inside bound loop `{var}`: one per block or \
         thread, and a kernel cannot allocate device memory"
    )]
    GlobalInBoundLoop {
        /// The temporary.
        buffer: String,
        /// The innermost bound loop around its allocation.
        var: String,
    },
    /// A buffer id past the function's table.
    #[error("buffer #{id} is not in the function's table of {len} buffers")]
    UnknownBuffer {
        /// The id.
        id: u32,
        /// Buffers in the table.
        len: usize,
    },
}

/// `n` bytes for people: whole KiB as KiB, else bytes.
fn show_bytes(n: u64) -> String {
    if n >= 1024 && n.is_multiple_of(1024) {
        format!("{} KiB", n / 1024)
    } else {
        format!("{n} bytes")
    }
}

/// `` `a`, `b` ``.
fn quoted(names: &[String]) -> String {
    let q: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    q.join(", ")
}

/// Bytes of a buffer: its elements (padding included) times its element's. Saturating, so
/// that an absurd shape from a corrupt record reads as too large rather than wrapping.
fn buffer_bytes(b: &BufferDecl) -> u64 {
    b.shape
        .iter()
        .fold(1u64, |n, &d| n.saturating_mul(d.max(0) as u64))
        .saturating_mul(b.dtype.bytes() as u64)
}

/// The launch axes in [`slot`]'s order: grid x y z, then block x y z.
const AXES: [ThreadAxis; 6] = [
    ThreadAxis::BlockX,
    ThreadAxis::BlockY,
    ThreadAxis::BlockZ,
    ThreadAxis::ThreadX,
    ThreadAxis::ThreadY,
    ThreadAxis::ThreadZ,
];

/// Checks `f` against `desc` (the checks of the module documentation) and says what it uses.
pub fn verify_gpu(f: &LoweredFunc, desc: &CudaDesc) -> Result<GpuUsage, GpuVerifyError> {
    let launch = launch_dims(f)?;
    let threads = launch.threads_per_block();
    if threads > desc.max_threads_per_block as u64 {
        return Err(GpuVerifyError::TooManyThreads {
            threads,
            block: launch.block,
            limit: desc.max_threads_per_block,
            arch: desc.arch.clone(),
        });
    }
    let mut w = Walk {
        f,
        launch,
        bound: [None; 6],
        bound_ids: [None; 6],
        conds: Vec::new(),
        any_bound: None,
        thread_vars: Vec::new(),
        vector: None,
        divergent: None,
        counted: HashSet::default(),
        shared: Vec::new(),
        shared_bytes: 0,
        local_bytes: 0,
        warp_size: desc.warp_size.max(1),
    };
    w.stmt(&f.body)?;
    if w.shared_bytes > desc.shared_memory_per_block {
        return Err(GpuVerifyError::SharedMemory {
            bytes: w.shared_bytes,
            buffers: w.shared,
            limit: desc.shared_memory_per_block,
            arch: desc.arch.clone(),
        });
    }
    let whole_warps = threads
        .checked_rem(desc.warp_size as u64)
        .is_some_and(|r| r == 0);
    Ok(GpuUsage {
        launch,
        shared_bytes: w.shared_bytes,
        local_bytes: w.local_bytes,
        whole_warps,
    })
}

/// The walk's view of where it is in the function.
struct Walk<'f> {
    f: &'f LoweredFunc,
    launch: LaunchDims,
    /// The innermost loop around the statement bound to each launch axis (name, extent).
    bound: [Option<(&'f str, i64)>; 6],
    /// The variable of the loop of `bound`, by axis.
    bound_ids: [Option<u32>; 6],
    /// The conditions of the `If`s around the statement.
    conds: Vec<&'f Expr>,
    /// The innermost loop bound to any launch axis.
    any_bound: Option<&'f str>,
    /// Variables of the loops around bound to block axes: what makes a condition differ
    /// between the threads of one block.
    thread_vars: Vec<(u32, &'f str)>,
    /// The vectorized loop around, if any.
    vector: Option<&'f str>,
    /// The thread variable read by the condition of an `If` around, if any.
    divergent: Option<&'f str>,
    /// Temporaries already counted, so that each is counted once.
    counted: HashSet<BufId>,
    /// Names of the `Shared` temporaries counted.
    shared: Vec<String>,
    shared_bytes: u64,
    local_bytes: u64,
    /// Threads of a warp on the GPU described.
    warp_size: u32,
}

impl<'f> Walk<'f> {
    fn decl(&self, id: BufId) -> Result<&'f BufferDecl, GpuVerifyError> {
        self.f
            .buffers
            .get(id.0 as usize)
            .ok_or(GpuVerifyError::UnknownBuffer {
                id: id.0,
                len: self.f.buffers.len(),
            })
    }

    fn stmt(&mut self, s: &'f Stmt) -> Result<(), GpuVerifyError> {
        match s {
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => self.for_loop(var.id, var.name, *extent, *kind, body),
            Stmt::Store { buf, index, .. } => self.store(*buf, index),
            Stmt::Allocate { buf, body } => {
                self.allocate(*buf)?;
                self.stmt(body)
            }
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                let outer = self.divergent;
                if outer.is_none() {
                    self.divergent = self
                        .thread_vars
                        .iter()
                        .find(|(id, _)| cond.uses_var(*id))
                        .map(|&(_, name)| name);
                }
                self.conds.push(cond);
                let r = self.stmt(then).and_then(|()| match otherwise {
                    Some(o) => self.stmt(o),
                    None => Ok(()),
                });
                self.conds.pop();
                self.divergent = outer;
                r
            }
            Stmt::Seq(items) => items.iter().try_for_each(|x| self.stmt(x)),
            Stmt::Sync => self.sync(),
            // A hint that accesses nothing (the GPU code generator emits none).
            Stmt::Prefetch { .. } => Ok(()),
            Stmt::Shuffle { buf, index, .. } => {
                self.shuffle(*buf)?;
                self.store(*buf, index)
            }
        }
    }

    fn for_loop(
        &mut self,
        id: u32,
        name: &'f str,
        extent: i64,
        kind: ForKind,
        body: &'f Stmt,
    ) -> Result<(), GpuVerifyError> {
        match kind {
            ForKind::ThreadBound(ThreadAxis::VThread) if extent > MAX_VTHREAD => {
                Err(GpuVerifyError::VThreadTooLong {
                    var: name.to_string(),
                    extent,
                })
            }
            ForKind::ThreadBound(axis) => {
                let Some((grid, d)) = slot(axis) else {
                    // A virtual thread is a loop in each thread: nothing of the launch.
                    return self.stmt(body);
                };
                let i = if grid { d } else { 3 + d };
                let (outer, outer_any, outer_id) =
                    (self.bound[i], self.any_bound, self.bound_ids[i]);
                self.bound[i] = Some((name, extent));
                self.bound_ids[i] = Some(id);
                self.any_bound = Some(name);
                if !grid {
                    self.thread_vars.push((id, name));
                }
                let r = self.stmt(body);
                if !grid {
                    self.thread_vars.pop();
                }
                self.bound[i] = outer;
                self.bound_ids[i] = outer_id;
                self.any_bound = outer_any;
                r
            }
            ForKind::Vectorized => {
                let elem_bytes = self.widest_element(body);
                if (extent.max(0) as u64).saturating_mul(elem_bytes) > MAX_VECTOR_BYTES {
                    return Err(GpuVerifyError::VectorTooWide {
                        var: name.to_string(),
                        extent,
                        elem_bytes,
                    });
                }
                let outer = self.vector.replace(name);
                let r = self.stmt(body);
                self.vector = outer;
                r
            }
            ForKind::Serial | ForKind::Parallel | ForKind::Unrolled => self.stmt(body),
        }
    }

    /// The widest element `body` loads or stores, in bytes (0 if it touches no buffer). A
    /// buffer id past the table is left to the walk, which reports it at the store.
    fn widest_element(&self, body: &Stmt) -> u64 {
        let mut widest = 0u64;
        let mut exprs = |e: &Expr| {
            e.visit(&mut |x| {
                if let Expr::BufLoad { dtype, .. } = x {
                    widest = widest.max(dtype.bytes() as u64);
                }
            })
        };
        let mut stored = 0u64;
        body.visit(&mut |s| match s {
            Stmt::Store { buf, index, value } => {
                if let Some(b) = self.f.buffers.get(buf.0 as usize) {
                    stored = stored.max(b.dtype.bytes() as u64);
                }
                exprs(index);
                exprs(value);
            }
            Stmt::If { cond, .. } => exprs(cond),
            _ => {}
        });
        widest.max(stored)
    }

    fn store(&self, buf: BufId, index: &Expr) -> Result<(), GpuVerifyError> {
        let b = self.decl(buf)?;
        // Shared memory is one copy per block, so blocks never race on it: only the block
        // axes must be bound. Global memory is one copy for the launch: every axis must be.
        let axes = match b.scope {
            Scope::Local => return Ok(()),
            Scope::Shared => 3..6,
            Scope::Global => 0..6,
        };
        for i in axes {
            let axis = AXES[i];
            let threads = self.launch.extent(axis);
            if threads <= 1 {
                continue;
            }
            let (Some((var, extent)), Some(id)) = (self.bound[i], self.bound_ids[i]) else {
                return Err(GpuVerifyError::RacyStore {
                    buffer: b.name.clone(),
                    scope: b.scope.name(),
                    axis: axis.name(),
                    threads,
                });
            };
            if extent > 1 && !index.uses_var(id) && !self.conds.iter().any(|c| c.uses_var(id)) {
                return Err(GpuVerifyError::UniformStore {
                    buffer: b.name.clone(),
                    scope: b.scope.name(),
                    var: var.to_string(),
                    axis: axis.name(),
                    extent,
                });
            }
        }
        Ok(())
    }

    fn allocate(&mut self, buf: BufId) -> Result<(), GpuVerifyError> {
        let b = self.decl(buf)?;
        if b.scope == Scope::Global {
            if let Some(var) = self.any_bound {
                return Err(GpuVerifyError::GlobalInBoundLoop {
                    buffer: b.name.clone(),
                    var: var.to_string(),
                });
            }
        }
        if !self.counted.insert(buf) {
            return Ok(());
        }
        match b.scope {
            Scope::Shared => {
                // Where the code generator's array starts: the next aligned offset.
                let start = self
                    .shared_bytes
                    .div_ceil(SHARED_ALIGN)
                    .saturating_mul(SHARED_ALIGN);
                self.shared_bytes = start.saturating_add(buffer_bytes(b));
                self.shared.push(b.name.clone());
            }
            Scope::Local => self.local_bytes = self.local_bytes.saturating_add(buffer_bytes(b)),
            Scope::Global => {}
        }
        Ok(())
    }

    fn shuffle(&self, buf: BufId) -> Result<(), GpuVerifyError> {
        let warp = self.warp_size as i64;
        let reason = if let Some(var) = self.vector {
            Some(format!("inside vectorized loop `{var}`"))
        } else if let Some(var) = self.divergent {
            Some(format!("inside a condition on thread index `{var}`"))
        } else {
            let block_x = self.launch.extent(ThreadAxis::ThreadX) as i64;
            // With one row of threads the warps are runs of 32 along x whatever the width;
            // with several, a width of whole warps keeps each warp in one row.
            let rows = self.launch.extent(ThreadAxis::ThreadY) as i64
                * self.launch.extent(ThreadAxis::ThreadZ) as i64;
            match self.bound[3] {
                None => Some("outside every loop bound to `threadIdx.x`".to_string()),
                Some((var, extent)) if extent % warp != 0 => Some(format!(
                    "inside loop `{var}` bound to `threadIdx.x` with extent {extent}, not a \
                     multiple of the {warp}-thread warp"
                )),
                Some(_) if rows > 1 && block_x % warp != 0 => Some(format!(
                    "in a block {block_x} threads wide and {rows} rows deep, the width not a \
                     multiple of the {warp}-thread warp"
                )),
                Some(_) => None,
            }
        };
        match reason {
            Some(reason) => Err(GpuVerifyError::PartialWarpShuffle {
                buffer: self.decl(buf)?.name.clone(),
                reason,
            }),
            None => Ok(()),
        }
    }

    fn sync(&self) -> Result<(), GpuVerifyError> {
        if let Some(var) = self.vector {
            return Err(GpuVerifyError::SyncInVectorized {
                var: var.to_string(),
            });
        }
        for (i, &axis) in AXES.iter().enumerate().skip(3) {
            let launch = self.launch.extent(axis);
            if let Some((var, extent)) = self.bound[i] {
                if extent < launch as i64 {
                    return Err(GpuVerifyError::SyncInPartialLoop {
                        var: var.to_string(),
                        axis: axis.name(),
                        extent,
                        launch,
                    });
                }
            }
        }
        match self.divergent {
            Some(var) => Err(GpuVerifyError::DivergentSync {
                var: var.to_string(),
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::{BufId, DType, Expr, Var};
    use crate::ir::BufKind;

    fn sm90() -> CudaDesc {
        CudaDesc::for_arch("sm_90").expect("sm_90 is known")
    }

    fn buffer(name: &str, dtype: DType, len: i64, kind: BufKind, scope: Scope) -> BufferDecl {
        BufferDecl {
            name: name.into(),
            dtype,
            shape: vec![len],
            scope,
            kind,
            row_pad: 0,
        }
    }

    /// A temporary of `len` elements.
    fn temp(name: &str, dtype: DType, len: i64, scope: Scope) -> BufferDecl {
        buffer(name, dtype, len, BufKind::Temp, scope)
    }

    /// A kernel of an f32 input `A` (buffer 0) and output `B` (buffer 1) of 4096 elements,
    /// then `temps` (buffers 2, 3, ...).
    fn func(temps: Vec<BufferDecl>, body: Stmt) -> LoweredFunc {
        let mut buffers = vec![
            buffer("A", DType::F32, 4096, BufKind::Input(0), Scope::Global),
            buffer("B", DType::F32, 4096, BufKind::Output(0), Scope::Global),
        ];
        buffers.extend(temps);
        LoweredFunc {
            name: "k".into(),
            buffers,
            params: vec![BufId(0), BufId(1)],
            body,
            num_vars: 16,
        }
    }

    fn v(id: u32, name: &str) -> Var {
        Var::new(id, name)
    }

    fn looped(var: Var, extent: i64, kind: ForKind, body: Stmt) -> Stmt {
        Stmt::For {
            var,
            extent,
            kind,
            body: Box::new(body),
        }
    }

    fn bound(var: Var, extent: i64, axis: ThreadAxis, body: Stmt) -> Stmt {
        looped(var, extent, ForKind::ThreadBound(axis), body)
    }

    fn tx(var: Var, extent: i64, body: Stmt) -> Stmt {
        bound(var, extent, ThreadAxis::ThreadX, body)
    }

    fn load(buf: u32, dtype: DType, index: Expr) -> Expr {
        Expr::BufLoad {
            buf: BufId(buf),
            dtype,
            index: Box::new(index),
        }
    }

    /// `buf[index] = A[index]` (the value's dtype does not matter to these checks).
    fn store(buf: u32, index: Expr) -> Stmt {
        Stmt::Store {
            buf: BufId(buf),
            value: load(0, DType::F32, index.clone()),
            index,
        }
    }

    fn alloc(buf: u32, body: Stmt) -> Stmt {
        Stmt::Allocate {
            buf: BufId(buf),
            body: Box::new(body),
        }
    }

    /// `threadIdx.x for i in 0..n: B[i] = A[i]`: a kernel every check passes.
    fn copy(n: i64) -> Stmt {
        let i = v(0, "i");
        tx(i, n, store(1, Expr::var(&i)))
    }

    fn check(f: &LoweredFunc) -> Result<GpuUsage, GpuVerifyError> {
        verify_gpu(f, &sm90())
    }

    #[test]
    fn a_plain_kernel_passes_and_reports_its_launch() {
        let u = check(&func(vec![], copy(64))).expect("passes");
        assert_eq!(u.launch.block, [64, 1, 1]);
        assert_eq!((u.shared_bytes, u.local_bytes, u.whole_warps), (0, 0, true));
    }

    #[test]
    fn launch_errors_are_wrapped() {
        let (i, j) = (v(0, "i"), v(1, "j"));
        let wider = tx(i, 4, tx(j, 8, store(1, Expr::var(&j))));
        match check(&func(vec![], wider)) {
            Err(GpuVerifyError::Launch(LaunchError::RebindWider { .. })) => {}
            r => panic!("{r:?}"),
        }
        let narrower = tx(i, 8, tx(j, 4, store(1, Expr::var(&j))));
        assert!(check(&func(vec![], narrower)).is_ok());
    }

    #[test]
    fn threads_per_block_are_held_to_the_description() {
        let mut small = sm90();
        small.max_threads_per_block = 256;
        assert!(verify_gpu(&func(vec![], copy(256)), &small).is_ok());
        match verify_gpu(&func(vec![], copy(512)), &small) {
            Err(e @ GpuVerifyError::TooManyThreads { threads: 512, .. }) => {
                assert_eq!(
                    e.to_string(),
                    "512 threads per block (block [512, 1, 1]) over the 256 of sm_90"
                )
            }
            r => panic!("{r:?}"),
        }
        // Past CUDA's own 1024 the launch itself fails.
        let (i, j) = (v(0, "i"), v(1, "j"));
        let body = tx(
            i,
            64,
            bound(j, 32, ThreadAxis::ThreadY, store(1, Expr::var(&i))),
        );
        assert!(matches!(
            check(&func(vec![], body)),
            Err(GpuVerifyError::Launch(LaunchError::TooManyThreads { .. }))
        ));
    }

    /// `A.shared` and `B.shared` of `a` and `b` f32 elements, both written by 64 threads and
    /// the first read back into `B`.
    fn two_shared(a: i64, b: i64) -> LoweredFunc {
        let (i, j, k) = (v(0, "i"), v(1, "j"), v(2, "k"));
        let body = alloc(
            2,
            alloc(
                3,
                Stmt::seq(vec![
                    tx(i, 64, store(2, Expr::var(&i))),
                    tx(j, 64, store(3, Expr::var(&j))),
                    Stmt::Sync,
                    tx(k, 64, store(1, Expr::var(&k))),
                ]),
            ),
        );
        func(
            vec![
                temp("A.shared", DType::F32, a, Scope::Shared),
                temp("B.shared", DType::F32, b, Scope::Shared),
            ],
            body,
        )
    }

    #[test]
    fn shared_memory_is_summed_and_held_to_the_static_limit() {
        // 32 KiB + 16 KiB: exactly the limit.
        let u = check(&two_shared(8192, 4096)).expect("48 KiB fits");
        assert_eq!(u.shared_bytes, 48 * 1024);
        // 32 KiB + 20 KiB.
        match check(&two_shared(8192, 5120)) {
            Err(e @ GpuVerifyError::SharedMemory { bytes: 53248, .. }) => assert_eq!(
                e.to_string(),
                "shared memory 52 KiB of `A.shared`, `B.shared` over the 48 KiB per block of \
                 sm_90"
            ),
            r => panic!("{r:?}"),
        }
        // A larger opt-in limit is the caller's to give.
        let mut big = sm90();
        big.shared_memory_per_block = 227 * 1024;
        assert!(verify_gpu(&two_shared(8192, 5120), &big).is_ok());
        // One buffer allocated in two places counts once; local temporaries are not shared.
        let (i, j) = (v(0, "i"), v(1, "j"));
        let twice = Stmt::seq(vec![
            alloc(2, tx(i, 32, store(2, Expr::var(&i)))),
            alloc(2, tx(j, 32, store(2, Expr::var(&j)))),
            alloc(3, Stmt::seq(vec![])),
        ]);
        let f = func(
            vec![
                temp("S", DType::F64, 100, Scope::Shared),
                temp("L", DType::F32, 10, Scope::Local),
            ],
            twice,
        );
        let u = check(&f).expect("passes");
        assert_eq!((u.shared_bytes, u.local_bytes), (800, 40));
        // 33 f32 (132 bytes) leave a gap of 12 before the next array, which starts at 144.
        assert_eq!(check(&two_shared(33, 5)).map(|u| u.shared_bytes), Ok(164));
        assert_eq!(check(&two_shared(32, 5)).map(|u| u.shared_bytes), Ok(148));
    }

    #[test]
    fn virtual_threads_are_at_most_eight() {
        let vt = |n| {
            let (t, i) = (v(0, "t"), v(1, "i"));
            let idx = Expr::bin(
                crate::expr::BinOp::Add,
                Expr::bin(crate::expr::BinOp::Mul, Expr::var(&t), Expr::int(32)),
                Expr::var(&i),
            );
            func(
                vec![],
                tx(i, 32, bound(t, n, ThreadAxis::VThread, store(1, idx))),
            )
        };
        let u = check(&vt(8)).expect("8 virtual threads");
        assert_eq!(
            u.launch.block,
            [32, 1, 1],
            "a virtual thread is no launch axis"
        );
        match check(&vt(9)) {
            Err(e @ GpuVerifyError::VThreadTooLong { extent: 9, .. }) => assert_eq!(
                e.to_string(),
                "virtual-thread loop `t` has extent 9, over the 8 allowed"
            ),
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn vectors_are_at_most_sixteen_bytes() {
        let vec_loop = |lanes, dtype| {
            let (i, l) = (v(0, "i"), v(1, "l"));
            let out = temp("V", dtype, 64, Scope::Local);
            let body = Stmt::Store {
                buf: BufId(2),
                index: Expr::var(&l),
                value: Expr::Const(crate::expr::Const::zero(dtype)),
            };
            func(
                vec![out],
                tx(i, 32, alloc(2, looped(l, lanes, ForKind::Vectorized, body))),
            )
        };
        assert!(check(&vec_loop(4, DType::F32)).is_ok());
        assert!(check(&vec_loop(2, DType::F64)).is_ok());
        match check(&vec_loop(8, DType::F32)) {
            Err(e @ GpuVerifyError::VectorTooWide { elem_bytes: 4, .. }) => assert_eq!(
                e.to_string(),
                "vectorized loop `l` of 8 lanes of 4 bytes is 32 bytes, over the 16 of the \
                 widest GPU load"
            ),
            r => panic!("{r:?}"),
        }
        assert!(matches!(
            check(&vec_loop(4, DType::F64)),
            Err(GpuVerifyError::VectorTooWide { elem_bytes: 8, .. })
        ));
        // The widest element loaded counts too: 4 lanes storing i32 but loading f64.
        let (i, l) = (v(0, "i"), v(1, "l"));
        let body = Stmt::Store {
            buf: BufId(2),
            index: Expr::var(&l),
            value: load(3, DType::F64, Expr::var(&l)).cast(DType::I32),
        };
        let f = func(
            vec![
                temp("V", DType::I32, 64, Scope::Local),
                temp("W", DType::F64, 64, Scope::Local),
            ],
            tx(
                i,
                32,
                alloc(2, alloc(3, looped(l, 4, ForKind::Vectorized, body))),
            ),
        );
        assert!(matches!(
            check(&f),
            Err(GpuVerifyError::VectorTooWide { elem_bytes: 8, .. })
        ));
    }

    #[test]
    fn stores_every_thread_would_run_are_races_unless_local() {
        let (i, j) = (v(0, "i"), v(1, "j"));
        // B[0] = A[0] beside a 32-thread nest: all 32 threads store it.
        let unbound_global = func(vec![], Stmt::seq(vec![copy(32), store(1, Expr::int(0))]));
        match check(&unbound_global) {
            Err(e @ GpuVerifyError::RacyStore { threads: 32, .. }) => assert_eq!(
                e.to_string(),
                "store to global buffer `B` is outside every loop bound to `threadIdx.x`: all \
                 32 along it would run it (a race)"
            ),
            r => panic!("{r:?}"),
        }
        // The same in a single-thread kernel is its only thread's store.
        assert!(check(&func(vec![], store(1, Expr::int(0)))).is_ok());
        // Into a local temporary, outside the bound loops: one copy per thread, fine.
        let local = func(
            vec![temp("L", DType::F32, 4, Scope::Local)],
            alloc(2, Stmt::seq(vec![store(2, Expr::int(0)), copy(32)])),
        );
        assert!(check(&local).is_ok());
        // Into shared memory outside the thread loops: a race among the block's threads.
        let shared = func(
            vec![temp("S", DType::F32, 4, Scope::Shared)],
            alloc(2, Stmt::seq(vec![store(2, Expr::int(0)), copy(32)])),
        );
        assert!(matches!(
            check(&shared),
            Err(GpuVerifyError::RacyStore {
                scope: "shared",
                axis: "threadIdx.x",
                ..
            })
        ));
        // Inside a block loop only: every thread of the block stores it.
        let k = v(3, "k");
        let per_block = tx(i, 32, store(1, Expr::var(&k) * 32i64 + Expr::var(&i)));
        let block_only = func(
            vec![],
            Stmt::seq(vec![
                bound(k, 2, ThreadAxis::BlockX, per_block),
                bound(j, 2, ThreadAxis::BlockX, store(1, Expr::var(&j))),
            ]),
        );
        assert!(matches!(
            check(&block_only),
            Err(GpuVerifyError::RacyStore {
                axis: "threadIdx.x",
                ..
            })
        ));
        // Under threadIdx.x but not blockIdx.x of a two-block launch: global memory is one
        // copy for both blocks (a race), shared memory one per block (fine).
        let t = v(2, "t");
        let two_blocks = |buf: u32| {
            Stmt::seq(vec![
                bound(
                    j,
                    2,
                    ThreadAxis::BlockX,
                    tx(t, 32, store(1, Expr::var(&j) * 32i64 + Expr::var(&t))),
                ),
                tx(i, 32, store(buf, Expr::var(&i))),
            ])
        };
        match check(&func(vec![], two_blocks(1))) {
            Err(GpuVerifyError::RacyStore {
                axis: "blockIdx.x",
                threads: 2,
                ..
            }) => {}
            r => panic!("{r:?}"),
        }
        let s = func(
            vec![temp("S", DType::F32, 32, Scope::Shared)],
            alloc(2, two_blocks(2)),
        );
        assert!(check(&s).is_ok());
    }

    #[test]
    fn barriers_every_thread_of_the_block_reaches() {
        let (i, j, l) = (v(0, "i"), v(1, "j"), v(2, "l"));
        // Outside every bound loop, and inside a full-width thread loop: fine.
        let outside = func(vec![], Stmt::seq(vec![copy(32), Stmt::Sync, copy(32)]));
        assert!(check(&outside).is_ok());
        let full = func(
            vec![],
            tx(i, 32, Stmt::seq(vec![Stmt::Sync, store(1, Expr::var(&i))])),
        );
        assert!(check(&full).is_ok());
        // Inside a thread loop narrower than the block: threads 16..32 skip it.
        let partial = func(
            vec![],
            Stmt::seq(vec![
                copy(32),
                tx(j, 16, Stmt::seq(vec![Stmt::Sync, store(1, Expr::var(&j))])),
            ]),
        );
        match check(&partial) {
            Err(
                e @ GpuVerifyError::SyncInPartialLoop {
                    extent: 16,
                    launch: 32,
                    ..
                },
            ) => {
                assert_eq!(
                    e.to_string(),
                    "barrier inside loop `j` bound to `threadIdx.x` with extent 16, below the \
                     block's 32: the threads past it never reach the barrier"
                )
            }
            r => panic!("{r:?}"),
        }
        // Inside a vectorized loop.
        let vectorized = func(
            vec![],
            tx(
                i,
                32,
                looped(l, 4, ForKind::Vectorized, Stmt::seq(vec![Stmt::Sync])),
            ),
        );
        assert!(matches!(
            check(&vectorized),
            Err(GpuVerifyError::SyncInVectorized { .. })
        ));
        // Under a condition on the thread index: divergent.
        let cond_on = |var: &Var| Stmt::If {
            cond: Expr::var(var).lt(Expr::int(1)),
            then: Box::new(Stmt::Sync),
            otherwise: None,
        };
        let divergent = func(
            vec![],
            tx(i, 32, Stmt::seq(vec![cond_on(&i), store(1, Expr::var(&i))])),
        );
        match check(&divergent) {
            Err(e @ GpuVerifyError::DivergentSync { .. }) => assert_eq!(
                e.to_string(),
                "barrier inside a condition on thread index `i` (a divergent barrier)"
            ),
            r => panic!("{r:?}"),
        }
        // A condition on the block index is the same in every thread of a block: fine.
        let per_block = store(1, Expr::var(&j) * 32i64 + Expr::var(&i));
        let uniform = func(
            vec![],
            bound(
                j,
                2,
                ThreadAxis::BlockX,
                tx(i, 32, Stmt::seq(vec![cond_on(&j), per_block])),
            ),
        );
        assert!(check(&uniform).is_ok());
    }

    #[test]
    fn global_temporaries_only_outside_bound_loops() {
        let (i, j) = (v(0, "i"), v(1, "j"));
        let g = || vec![temp("G", DType::F32, 32, Scope::Global)];
        let outside = alloc(
            2,
            Stmt::seq(vec![
                tx(i, 32, store(2, Expr::var(&i))),
                tx(j, 32, store(1, Expr::var(&j))),
            ]),
        );
        assert!(check(&func(g(), outside)).is_ok());
        let inside = tx(
            i,
            32,
            alloc(
                2,
                Stmt::seq(vec![store(2, Expr::var(&i)), store(1, Expr::var(&i))]),
            ),
        );
        match check(&func(g(), inside)) {
            Err(e @ GpuVerifyError::GlobalInBoundLoop { .. }) => assert_eq!(
                e.to_string(),
                "global temporary `G` allocated inside bound loop `i`: one per block or \
                 thread, and a kernel cannot allocate device memory"
            ),
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn whole_warps_are_reported_not_required() {
        let u = check(&func(vec![], copy(48))).expect("48 threads launch");
        assert!(!u.whole_warps);
        assert!(check(&func(vec![], copy(96))).is_ok_and(|u| u.whole_warps));
    }

    #[test]
    fn an_unknown_buffer_is_an_error_not_a_panic() {
        let f = func(vec![], alloc(7, Stmt::seq(vec![])));
        assert_eq!(
            check(&f),
            Err(GpuVerifyError::UnknownBuffer { id: 7, len: 2 })
        );
        let f = func(vec![], copy(4));
        let mut g = f.clone();
        g.body = store(9, Expr::int(0));
        assert!(matches!(
            check(&g),
            Err(GpuVerifyError::UnknownBuffer { id: 9, .. })
        ));
    }

    /// `buf[0] = shuffle_xor(A[0], 1)` into local temporary 2.
    fn shuffle() -> Stmt {
        Stmt::Shuffle {
            buf: BufId(2),
            index: Expr::int(0),
            value: load(0, DType::F32, Expr::int(0)),
            lane_xor: 1,
        }
    }

    /// `tx` loops of `n` threads (and of `wide` beside it, to widen the block) around a
    /// shuffle, with `wrap` between the loop and the shuffle.
    fn shuffling(n: i64, wide: i64, wrap: impl Fn(Stmt) -> Stmt) -> LoweredFunc {
        let (i, j) = (v(0, "i"), v(1, "j"));
        let body = Stmt::seq(vec![
            tx(i, n, alloc(2, wrap(shuffle()))),
            tx(j, wide, store(1, Expr::var(&j))),
        ]);
        func(vec![temp("lane", DType::F32, 1, Scope::Local)], body)
    }

    #[test]
    fn a_shuffle_must_run_on_whole_warps() {
        let reason = |f: &LoweredFunc| match check(f) {
            Err(GpuVerifyError::PartialWarpShuffle { buffer, reason }) => {
                assert_eq!(buffer, "lane");
                reason
            }
            r => panic!("{r:?}\n{f}"),
        };
        assert!(check(&shuffling(64, 64, |s| s)).is_ok());
        // A serial loop between keeps the warp together.
        let k = v(3, "k");
        assert!(check(&shuffling(32, 64, |s| looped(k, 4, ForKind::Serial, s))).is_ok());
        assert!(reason(&shuffling(48, 48, |s| s)).contains("extent 48, not a multiple"));
        // One row of 48 threads: the second warp's lanes 16.. do not exist, and it runs no
        // shuffle.
        assert!(check(&shuffling(32, 48, |s| s)).is_ok());
        // Two rows of 48: the second warp is 16 threads of each row.
        let mut two_rows = shuffling(32, 48, |s| s);
        let y = v(4, "y");
        two_rows.body = bound(y, 2, ThreadAxis::ThreadY, two_rows.body);
        assert!(reason(&two_rows).contains("48 threads wide and 2 rows deep"));
        let cond = |s| Stmt::If {
            cond: Expr::var(&v(0, "i")).lt(16i64),
            then: Box::new(s),
            otherwise: None,
        };
        assert!(reason(&shuffling(64, 64, cond)).contains("condition on thread index `i`"));
        let vec = |s| looped(v(3, "k"), 4, ForKind::Vectorized, s);
        assert!(reason(&shuffling(64, 64, vec)).contains("vectorized loop `k`"));
        // Outside every thread loop.
        let f = func(
            vec![temp("lane", DType::F32, 1, Scope::Local)],
            Stmt::seq(vec![alloc(2, shuffle()), copy(64)]),
        );
        assert!(reason(&f).contains("outside every loop bound to `threadIdx.x`"));
    }

    #[test]
    fn a_store_every_thread_of_its_loop_runs_alike_is_a_race() {
        let (i, j, k) = (v(0, "i"), v(1, "j"), v(3, "k"));
        let shared = |inner: Stmt| {
            func(
                vec![temp("S", DType::F32, 64, Scope::Shared)],
                tx(
                    i,
                    64,
                    alloc(2, Stmt::seq(vec![inner, store(1, Expr::var(&i))])),
                ),
            )
        };
        // A copy nested in a 64-thread loop with no thread loop of its own: all 64 write
        // each element.
        let nested = shared(looped(k, 64, ForKind::Serial, store(2, Expr::var(&k))));
        match check(&nested) {
            Err(e @ GpuVerifyError::UniformStore { extent: 64, .. }) => assert_eq!(
                e.to_string(),
                "store to shared buffer `S` does not depend on `i` (bound to `threadIdx.x`, 64 \
                 of them): they all write the same element (a race)"
            ),
            r => panic!("{r:?}"),
        }
        // Its own thread loop (a rebinding of the axis) spreads it.
        assert!(check(&shared(tx(j, 64, store(2, Expr::var(&j))))).is_ok());
        // One thread of it, by a condition or by a loop of one iteration.
        let first = Stmt::If {
            cond: Expr::var(&i).eq_(0i64),
            then: Box::new(store(2, Expr::int(0))),
            otherwise: None,
        };
        assert!(check(&shared(first)).is_ok());
        assert!(check(&shared(tx(j, 1, store(2, Expr::int(0))))).is_ok());
    }
}

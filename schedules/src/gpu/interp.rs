//! The lockstep interpreter: runs a [`LoweredFunc`] as a GPU kernel, on host data, and checks
//! that the schedule of its threads cannot change its result.
//!
//! The model is that of [`crate::gpu`]: every thread of the launch runs the body; a loop
//! bound to a block or thread axis gives its variable the block's or thread's index and runs
//! its body only where that index is below its extent; every other loop (virtual threads
//! included) is an ordinary loop each thread runs. Blocks run one after another, which is one
//! valid order since nothing orders them; the threads of a block run in lockstep, SIMT style:
//! each statement runs for every active thread before the next one starts, with one variable
//! environment per thread and an active set that `If`s and thread-bound loops narrow.
//!
//! Lockstep is one schedule of the threads among many the hardware may pick. It computes what
//! every schedule computes when the kernel is free of data races, and that is what it checks:
//! - between two barriers (one *phase*) of a block, an element of a shared or global buffer
//!   written by one thread and read or written by another is a [`GpuEvalError::Race`];
//! - an element of a global buffer written by one block and read or written by another is a
//!   race whatever the barriers, since a barrier orders only the threads of one block;
//! - a barrier ([`Stmt::Sync`]) reached by some but not all threads of a block is a
//!   [`GpuEvalError::DivergentBarrier`] (a hang or undefined behaviour on a GPU).
//!
//! Within one statement the active threads run one after another; in a race-free kernel no
//! two of them touch the same shared or global element in it, so that order is invisible.
//!
//! Storage follows the buffers' scopes: a `Local` temporary is one copy per thread, made at
//! each execution of its `Allocate`; a `Shared` one is one per block, fresh (uninitialized) at
//! each execution of its `Allocate`; a `Global` temporary is one per launch, uninitialized at
//! each execution of its `Allocate` as the IR says. The record of who touched an element is
//! kept across re-executions of an `Allocate` (per block for shared memory, per launch for
//! global memory), because on the GPU they are the same memory: a loop that refills a shared
//! tile without a barrier between one iteration's reads and the next one's writes races.
//! Parameters (inputs and outputs) are global memory whatever their declared scope.
//!
//! The conventions of [`crate::interp::run`] hold: inputs in parameter order, outputs
//! returned, every index checked against its buffer, every load of an element never written an
//! error, and every output element must be written.

use crate::data::NdData;
use crate::expr::{BufId, Expr};
use crate::gpu::{launch_dims, slot, LaunchDims, LaunchError};
use crate::interp::{bind_params, collect_output, eval_cond, eval_index, load_buf, Buf};
use crate::ir::{BufKind, ForKind, LoweredFunc, Scope, Stmt};
use crate::scalar::{self, Env, EvalError, Value};
use std::fmt;

/// Most interpreted work in one run: each execution of a statement (loops and sequences
/// included) by one thread counts one, each thread of each block one more, and each element
/// of a temporary made at an `Allocate` (per copy) one. 2^26 keeps a run to
/// seconds and its temporaries to hundreds of megabytes; a kernel past it is
/// [`GpuEvalError::TooLarge`] rather than hours of interpretation.
pub const MAX_WORK: u64 = 1 << 26;

/// Most threads in one launch (grid times block). Past it the launch is refused before it
/// runs: every thread costs work even when it does nothing, so such a launch would only end
/// at [`MAX_WORK`] after a long wait.
pub const MAX_LAUNCH_THREADS: u64 = 1 << 22;

/// Whether an access read or wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessKind {
    /// A load.
    Read,
    /// A store.
    Write,
}

/// One access to a buffer element by one thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// `blockIdx` (x, y, z) of the thread.
    pub block: [u32; 3],
    /// `threadIdx` (x, y, z) of the thread.
    pub thread: [u32; 3],
    /// Whether it read or wrote.
    pub kind: AccessKind,
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [tx, ty, tz] = self.thread;
        let [bx, by, bz] = self.block;
        let verb = match self.kind {
            AccessKind::Read => "read",
            AccessKind::Write => "wrote",
        };
        write!(
            f,
            "thread ({tx}, {ty}, {tz}) of block ({bx}, {by}, {bz}) {verb}"
        )
    }
}

/// What orders (or fails to order) the two accesses of a race, for its message.
fn race_context(first: &Access, second: &Access) -> &'static str {
    if first.block == second.block {
        "with no barrier between"
    } else {
        "in different blocks, which no barrier orders"
    }
}

/// Why a lockstep run failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum GpuEvalError {
    /// Two threads touched one element, at least one of them writing, with nothing ordering
    /// them: the kernel's result depends on how the GPU schedules its threads.
    #[error("data race on element {index} of `{buffer}`: {first} it, then {second} it, {}", race_context(.first, .second))]
    Race {
        /// The buffer.
        buffer: String,
        /// The flat index of the element.
        index: i64,
        /// The earlier access (in the interpreter's order).
        first: Access,
        /// The later access, which conflicts with it.
        second: Access,
    },
    /// A barrier that some threads of a block reach and others do not.
    #[error("barrier reached by {reached} of the {threads} threads of block ({}, {}, {}); thread ({}, {}, {}) does not reach it (on a GPU, a hang or undefined behaviour)", .block[0], .block[1], .block[2], .missing[0], .missing[1], .missing[2])]
    DivergentBarrier {
        /// `blockIdx` of the block.
        block: [u32; 3],
        /// How many of its threads reach the barrier.
        reached: u64,
        /// Threads in the block.
        threads: u64,
        /// `threadIdx` of one thread that does not reach it.
        missing: [u32; 3],
    },
    /// A warp shuffle run by some but not all lanes of a warp (on a GPU, undefined values
    /// from the missing lanes, or a hang).
    #[error("warp shuffle run by thread ({}, {}, {}) of block ({}, {}, {}) without lane {lane} of its warp ({} threads per warp)", .thread[0], .thread[1], .thread[2], .block[0], .block[1], .block[2], WARP)]
    PartialWarpShuffle {
        /// `blockIdx` of the block.
        block: [u32; 3],
        /// `threadIdx` of a thread that runs it.
        thread: [u32; 3],
        /// A lane of its warp that does not (or does not exist).
        lane: u32,
    },
    /// A launch past [`MAX_LAUNCH_THREADS`] or a run past [`MAX_WORK`].
    #[error("too large to interpret: {size} {what}, over the cap of {limit}")]
    TooLarge {
        /// What is counted.
        what: &'static str,
        /// How much of it (where the run stopped, for work).
        size: u64,
        /// The cap.
        limit: u64,
    },
    /// A failure of evaluation: an index out of bounds, a read of an element never written, an
    /// output not fully written, inputs that do not fit, a malformed program.
    #[error(transparent)]
    Eval(#[from] EvalError),
    /// The function has no valid launch.
    #[error(transparent)]
    Launch(#[from] LaunchError),
}

/// Threads of a warp: consecutive linear thread indices, as on every NVIDIA GPU.
pub const WARP: u32 = 32;

/// No thread or block, in an [`ElemLog`] slot.
const NOBODY: u32 = u32::MAX;

/// A thread of the launch: its block's linear index and its linear index in the block.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Who {
    block: u32,
    thread: u32,
}

const NO_ONE: Who = Who {
    block: NOBODY,
    thread: NOBODY,
};

/// Who touched one element. Two readers are enough: a writer conflicts with a reader other
/// than itself, and of two distinct readers at least one is not the writer.
#[derive(Clone, Copy)]
struct ElemLog {
    /// The phase the `phase_*` fields are about; older ones are stale, i.e. empty.
    phase: u64,
    /// The thread (of the running block) that wrote it in this phase.
    phase_writer: u32,
    /// Two distinct threads that read it in this phase.
    phase_readers: [u32; 2],
    /// The first thread of the launch to write it (global memory only).
    writer: Who,
    /// The first readers of two distinct blocks (global memory only).
    readers: [Who; 2],
}

const EMPTY_LOG: ElemLog = ElemLog {
    phase: 0,
    phase_writer: NOBODY,
    phase_readers: [NOBODY; 2],
    writer: NO_ONE,
    readers: [NO_ONE; 2],
};

/// A conflict found in a log: the earlier access (who, kind); the later one is the access
/// being logged.
type Conflict = (Who, AccessKind);

impl ElemLog {
    /// Logs an access by `who` in `phase`; `across` says the element is global memory,
    /// shared by the blocks.
    fn access(
        &mut self,
        who: Who,
        kind: AccessKind,
        phase: u64,
        across: bool,
    ) -> Result<(), Conflict> {
        if self.phase != phase {
            self.phase = phase;
            self.phase_writer = NOBODY;
            self.phase_readers = [NOBODY; 2];
        }
        let t = who.thread;
        let in_block = |thread| Who {
            block: who.block,
            thread,
        };
        if self.phase_writer != NOBODY && self.phase_writer != t {
            return Err((in_block(self.phase_writer), AccessKind::Write));
        }
        if across && self.writer.block != NOBODY && self.writer.block != who.block {
            return Err((self.writer, AccessKind::Write));
        }
        match kind {
            AccessKind::Read => {
                let r = &mut self.phase_readers;
                if r[0] == NOBODY {
                    r[0] = t;
                } else if r[0] != t && r[1] == NOBODY {
                    r[1] = t;
                }
                let r = &mut self.readers;
                if across {
                    if r[0].block == NOBODY {
                        r[0] = who;
                    } else if r[0].block != who.block && r[1].block == NOBODY {
                        r[1] = who;
                    }
                }
            }
            AccessKind::Write => {
                if let Some(&r) = self.phase_readers.iter().find(|&&r| r != NOBODY && r != t) {
                    return Err((in_block(r), AccessKind::Read));
                }
                if across {
                    let other = self
                        .readers
                        .iter()
                        .find(|r| r.block != NOBODY && r.block != who.block);
                    if let Some(&r) = other {
                        return Err((r, AccessKind::Read));
                    }
                    if self.writer.block == NOBODY {
                        self.writer = who;
                    }
                }
                self.phase_writer = t;
            }
        }
        Ok(())
    }
}

/// The live instance(s) of one buffer.
enum Mem {
    /// Not live.
    Dead,
    /// One instance for every thread that can see it (the block's or the launch's).
    One(Buf),
    /// One instance per thread of the block, by linear thread index (`None` for threads that
    /// did not run the `Allocate`).
    PerThread(Vec<Option<Buf>>),
}

/// How the interpreter tracks a buffer's accesses.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Track {
    /// Not at all: per-thread memory, or memory nothing writes (which cannot race).
    No,
    /// Within a block: shared memory.
    Block,
    /// Within a block and across blocks: global memory.
    Launch,
}

struct Lockstep<'a> {
    f: &'a LoweredFunc,
    dims: LaunchDims,
    /// Threads per block.
    threads: u32,
    /// Linear index and coordinates of the running block.
    block: u32,
    block_xyz: [u32; 3],
    /// Variables of each thread: thread `t`'s are `vars[t * nv..(t + 1) * nv]`.
    vars: Vec<i64>,
    nv: usize,
    mem: Vec<Mem>,
    track: Vec<Track>,
    /// The access logs of tracked buffers, once made.
    logs: Vec<Option<Vec<ElemLog>>>,
    /// The phase number: one more at each block's start and at each barrier, so that a log
    /// stamped with an older one is empty.
    phase: u64,
    work: u64,
    /// A race found while evaluating an expression, which the scalar evaluator's error type
    /// cannot carry: the evaluation is stopped with a placeholder error and this replaces it.
    pending: Option<GpuEvalError>,
}

/// The coordinates of linear index `i` in a box of `dims`, x fastest.
fn coords(i: u32, dims: [u32; 3]) -> [u32; 3] {
    let [x, y, _] = dims.map(|d| d.max(1));
    [i % x, (i / x) % y, i / (x * y)]
}

/// A log of `n` empty entries, in memory reserved fallibly (an output of billions of elements
/// is an error, not an abort).
fn new_log(n: usize) -> Result<Vec<ElemLog>, GpuEvalError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        EvalError::Unsupported(format!("out of memory for the access log of {n} elements"))
    })?;
    v.resize(n, EMPTY_LOG);
    Ok(v)
}

/// A thread's view of the machine, for the scalar evaluator.
struct ThreadEnv<'m, 'a> {
    m: &'m mut Lockstep<'a>,
    t: u32,
}

impl Env for ThreadEnv<'_, '_> {
    fn var(&self, id: u32) -> Result<i64, EvalError> {
        let id = id as usize;
        if id >= self.m.nv {
            return Err(EvalError::Unsupported(format!(
                "variable #{id} out of range"
            )));
        }
        Ok(self.m.vars[self.t as usize * self.m.nv + id])
    }

    fn load(&mut self, e: &Expr, indices: &[i64]) -> Result<Value, EvalError> {
        let buf = load_buf(e)?;
        let i = indices.first().copied().unwrap_or(0);
        let k = self.m.log(buf, self.t, i, AccessKind::Read)?;
        let f = self.m.f;
        self.m.live(buf, self.t)?.get(k, &f.buffer(buf).name)
    }
}

impl Lockstep<'_> {
    /// Counts `n` units of work; an error past [`MAX_WORK`].
    fn charge(&mut self, n: u64) -> Result<(), GpuEvalError> {
        self.work = self.work.saturating_add(n);
        if self.work > MAX_WORK {
            return Err(GpuEvalError::TooLarge {
                what: "units of work (thread-statements and temporary elements)",
                size: self.work,
                limit: MAX_WORK,
            });
        }
        Ok(())
    }

    /// The instance of `buf` thread `t` sees.
    fn live(&mut self, buf: BufId, t: u32) -> Result<&mut Buf, EvalError> {
        let f = self.f;
        let b = match self.mem.get_mut(buf.0 as usize) {
            Some(Mem::One(b)) => Some(b),
            Some(Mem::PerThread(v)) => v.get_mut(t as usize).and_then(|b| b.as_mut()),
            Some(Mem::Dead) | None => None,
        };
        b.ok_or_else(|| {
            EvalError::Unsupported(format!("access to `{}`, not live", f.buffer(buf).name))
        })
    }

    /// Checks index `i` of `buf` for thread `t` and logs the access; returns the element's
    /// offset. A race is left in `pending` behind a placeholder error.
    fn log(&mut self, buf: BufId, t: u32, i: i64, kind: AccessKind) -> Result<usize, EvalError> {
        let f = self.f;
        let name = &f.buffer(buf).name;
        let k = self.live(buf, t)?.offset(i, name)?;
        let track = self.track[buf.0 as usize];
        let Some(Some(log)) = self.logs.get_mut(buf.0 as usize) else {
            return Ok(k);
        };
        let who = Who {
            block: self.block,
            thread: t,
        };
        let Err((first, first_kind)) = log[k].access(who, kind, self.phase, track == Track::Launch)
        else {
            return Ok(k);
        };
        let access = |w: Who, kind| Access {
            block: coords(w.block, self.dims.grid),
            thread: coords(w.thread, self.dims.block),
            kind,
        };
        self.pending = Some(GpuEvalError::Race {
            buffer: name.clone(),
            index: i,
            first: access(first, first_kind),
            second: access(who, kind),
        });
        Err(EvalError::Unsupported("data race".into()))
    }

    /// An evaluation error as the run's error: the race behind it, if one is pending.
    fn lift(&mut self, e: EvalError) -> GpuEvalError {
        self.pending.take().unwrap_or(GpuEvalError::Eval(e))
    }

    fn store(&mut self, t: u32, buf: BufId, index: &Expr, value: &Expr) -> Result<(), EvalError> {
        let mut env = ThreadEnv { m: self, t };
        let i = eval_index(index, &mut env)?;
        let v = scalar::eval(value, &mut env)?;
        let k = self.log(buf, t, i, AccessKind::Write)?;
        self.live(buf, t)?.set(k, v);
        Ok(())
    }

    /// Runs `s` for the threads in `active` (linear indices, ascending, not empty).
    fn exec(&mut self, s: &Stmt, active: &[u32]) -> Result<(), GpuEvalError> {
        self.charge(active.len() as u64)?;
        match s {
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => {
                let v = var.id as usize;
                let bound = match kind {
                    ForKind::ThreadBound(axis) => slot(*axis),
                    _ => None,
                };
                let Some((grid, d)) = bound else {
                    // An ordinary loop (a virtual thread's too): every active thread runs
                    // every iteration, in step.
                    for i in 0..*extent {
                        for &t in active {
                            self.set_var(t, v, i)?;
                        }
                        self.exec(body, active)?;
                    }
                    return Ok(());
                };
                // Not a loop: each thread's index along the axis, and a guard.
                let mut inside = Vec::with_capacity(active.len());
                for &t in active {
                    let index = if grid {
                        self.block_xyz[d]
                    } else {
                        coords(t, self.dims.block)[d]
                    };
                    self.set_var(t, v, index as i64)?;
                    if (index as i64) < *extent {
                        inside.push(t);
                    }
                }
                if inside.is_empty() {
                    return Ok(());
                }
                self.exec(body, &inside)
            }
            Stmt::Store { buf, index, value } => {
                for &t in active {
                    self.store(t, *buf, index, value)
                        .map_err(|e| self.lift(e))?;
                }
                Ok(())
            }
            Stmt::Allocate { buf, body } => self.allocate(*buf, body, active),
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                let (mut yes, mut no) = (Vec::new(), Vec::new());
                for &t in active {
                    let c = eval_cond(cond, &mut ThreadEnv { m: self, t });
                    if c.map_err(|e| self.lift(e))? {
                        yes.push(t);
                    } else {
                        no.push(t);
                    }
                }
                if !yes.is_empty() {
                    self.exec(then, &yes)?;
                }
                match otherwise {
                    Some(o) if !no.is_empty() => self.exec(o, &no),
                    _ => Ok(()),
                }
            }
            Stmt::Seq(v) => v.iter().try_for_each(|x| self.exec(x, active)),
            Stmt::Shuffle {
                buf,
                index,
                value,
                lane_xor,
            } => self.shuffle(*buf, index, value, *lane_xor, active),
            // A hint: it reads and writes nothing.
            Stmt::Prefetch { .. } => Ok(()),
            Stmt::Sync => {
                if active.len() as u64 != self.threads as u64 {
                    // `active` is ascending: the first index it skips is a missing thread.
                    let missing = (0..self.threads)
                        .zip(active.iter().copied().chain(std::iter::repeat(NOBODY)))
                        .find(|(want, got)| want != got)
                        .map_or(0, |(want, _)| want);
                    return Err(GpuEvalError::DivergentBarrier {
                        block: self.block_xyz,
                        reached: active.len() as u64,
                        threads: self.threads as u64,
                        missing: coords(missing, self.dims.block),
                    });
                }
                self.phase += 1;
                Ok(())
            }
        }
    }

    /// A butterfly exchange among the lanes of each warp with an active thread: every lane
    /// must be active. All values are evaluated (each by its own thread) before any is
    /// stored, as the warp's lanes exchange registers at once.
    fn shuffle(
        &mut self,
        buf: BufId,
        index: &Expr,
        value: &Expr,
        lane_xor: u32,
        active: &[u32],
    ) -> Result<(), GpuEvalError> {
        if lane_xor >= WARP {
            return Err(EvalError::Unsupported(format!(
                "warp shuffle with lane mask {lane_xor}, past the {WARP} lanes of a warp"
            ))
            .into());
        }
        // `active` is ascending: each warp's lanes, where all present, are a run of 32
        // consecutive entries starting at a multiple of 32.
        let mut k = 0;
        while k < active.len() {
            let first = active[k] / WARP * WARP;
            for lane in 0..WARP {
                if active.get(k + lane as usize) != Some(&(first + lane)) {
                    return Err(GpuEvalError::PartialWarpShuffle {
                        block: self.block_xyz,
                        thread: coords(active[k], self.dims.block),
                        lane,
                    });
                }
            }
            k += WARP as usize;
        }
        let mut values = Vec::with_capacity(active.len());
        for &t in active {
            let v = scalar::eval(value, &mut ThreadEnv { m: self, t }).map_err(|e| self.lift(e))?;
            values.push(v);
        }
        for (k, &t) in active.iter().enumerate() {
            // The partner is in the same run of 32: flipping bits below 32 keeps the warp.
            let partner = k ^ lane_xor as usize;
            let v = values[partner];
            let r = (|| {
                let i = eval_index(index, &mut ThreadEnv { m: self, t })?;
                let e = self.log(buf, t, i, AccessKind::Write)?;
                self.live(buf, t)?.set(e, v);
                Ok(())
            })();
            r.map_err(|e| self.lift(e))?;
        }
        Ok(())
    }

    fn set_var(&mut self, t: u32, v: usize, value: i64) -> Result<(), GpuEvalError> {
        if v >= self.nv {
            return Err(EvalError::Unsupported(format!("variable #{v} out of range")).into());
        }
        self.vars[t as usize * self.nv + v] = value;
        Ok(())
    }

    /// Makes `buf` live for `body`: a copy per active thread for local memory, one instance
    /// otherwise (the block's for shared memory, the launch's for global memory).
    fn allocate(&mut self, buf: BufId, body: &Stmt, active: &[u32]) -> Result<(), GpuEvalError> {
        let decl = self.f.buffer(buf);
        let size = decl.size().max(0) as u64;
        let fresh = match decl.scope {
            Scope::Local => {
                self.charge(size.saturating_mul(active.len() as u64))?;
                let mut copies: Vec<Option<Buf>> = (0..self.threads).map(|_| None).collect();
                for &t in active {
                    copies[t as usize] = Some(Buf::fresh(self.f, buf)?);
                }
                Mem::PerThread(copies)
            }
            Scope::Shared | Scope::Global => {
                self.charge(size)?;
                let i = buf.0 as usize;
                if self.track[i] != Track::No && self.logs[i].is_none() {
                    self.logs[i] = Some(new_log(size as usize)?);
                }
                Mem::One(Buf::fresh(self.f, buf)?)
            }
        };
        let saved = std::mem::replace(&mut self.mem[buf.0 as usize], fresh);
        let r = self.exec(body, active);
        self.mem[buf.0 as usize] = saved;
        r
    }
}

/// How each buffer of `f` is tracked: buffers no `Store` writes cannot race and are not;
/// parameters are global memory, temporaries per their scope.
fn tracking(f: &LoweredFunc) -> Vec<Track> {
    let mut stored = vec![false; f.buffers.len()];
    f.body.visit(&mut |s| {
        if let Stmt::Store { buf, .. } = s {
            if let Some(w) = stored.get_mut(buf.0 as usize) {
                *w = true;
            }
        }
    });
    f.buffers
        .iter()
        .zip(stored)
        .map(|(d, stored)| match (stored, d.kind, d.scope) {
            (false, ..) => Track::No,
            (true, BufKind::Input(_) | BufKind::Output(_), _) => Track::Launch,
            (true, BufKind::Temp, Scope::Global) => Track::Launch,
            (true, BufKind::Temp, Scope::Shared) => Track::Block,
            (true, BufKind::Temp, Scope::Local) => Track::No,
        })
        .collect()
}

/// Runs `f` as a GPU kernel on `inputs` (in parameter order), the threads of each block in
/// lockstep, and returns the outputs; an error for a data race, a divergent barrier, a launch
/// past the caps ([`MAX_LAUNCH_THREADS`], [`MAX_WORK`]), or what [`crate::interp::run`]
/// rejects.
pub fn run_lockstep(f: &LoweredFunc, inputs: &[NdData]) -> Result<Vec<NdData>, GpuEvalError> {
    let dims = launch_dims(f)?;
    let blocks = dims.grid.iter().map(|&d| d as u64).product::<u64>();
    let threads = dims.threads_per_block();
    let launch = blocks.saturating_mul(threads);
    if launch > MAX_LAUNCH_THREADS {
        return Err(GpuEvalError::TooLarge {
            what: "threads in the launch",
            size: launch,
            limit: MAX_LAUNCH_THREADS,
        });
    }
    // Both now fit a u32: at most MAX_LAUNCH_THREADS.
    let (blocks, threads) = (blocks as u32, threads as u32);
    let (params, outs) = bind_params(f, inputs)?;
    let nv = f.num_vars as usize;
    let mut m = Lockstep {
        f,
        dims,
        threads,
        block: 0,
        block_xyz: [0; 3],
        vars: vec![0; nv * threads as usize],
        nv,
        mem: (0..f.buffers.len()).map(|_| Mem::Dead).collect(),
        track: tracking(f),
        logs: (0..f.buffers.len()).map(|_| None).collect(),
        phase: 0,
        work: 0,
        pending: None,
    };
    for (id, b) in params {
        let i = id.0 as usize;
        if m.track[i] != Track::No {
            m.logs[i] = Some(new_log(f.buffer(id).size().max(0) as usize)?);
        }
        m.mem[i] = Mem::One(b);
    }
    let everyone: Vec<u32> = (0..threads).collect();
    for b in 0..blocks {
        m.block = b;
        m.block_xyz = coords(b, dims.grid);
        m.phase += 1;
        // Shared memory is the block's: the next block starts with no record of it.
        for (log, t) in m.logs.iter_mut().zip(&m.track) {
            if *t == Track::Block {
                *log = None;
            }
        }
        m.charge(threads as u64)?;
        m.exec(&f.body, &everyone)?;
    }
    let mut outputs = Vec::with_capacity(outs.len());
    for o in outs {
        let b = match std::mem::replace(&mut m.mem[o.0 as usize], Mem::Dead) {
            Mem::One(b) => Some(b),
            Mem::Dead | Mem::PerThread(_) => None,
        };
        outputs.push(collect_output(f, o, b)?);
    }
    Ok(outputs)
}

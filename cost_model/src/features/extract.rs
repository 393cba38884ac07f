//! The walk over a lowered function that writes one feature row per `Store`.
//!
//! One pass keeps the stack of loops, guards and allocations around the current statement;
//! at each `Store` it counts the arithmetic of the store (value, index and guards), analyzes
//! every buffer access with [`super::index`], and fills the groups laid out in
//! [`super::names`]. Nothing here allocates per expression node, so a program of a few
//! stores takes microseconds (measured: `cost_model/benches/cost_model_features.rs`).

use super::index::{AccessPattern, Env, LoopDim};
use super::names::*;
use super::CoreModel;
use tensortune_schedules::expr::{BinOp, BufId, DType, Expr, PairOp};
use tensortune_schedules::ir::{BufKind, ForKind, LoweredFunc, Scope, Stmt, ThreadAxis};

/// Cache line size assumed for the `lines` features (bytes): x86 and NVIDIA L1 sectors are
/// both handled well by 64.
const CACHE_LINE: f64 = 64.0;

// The model core of the kernel group (AMD Zen 4's ports, latencies and caches; see `names`
// for how they are used), with the vector widths of the target (`CoreModel`). Other cores
// shift these figures; the model is trained per target, so the trees learn their own
// thresholds.
const FMA_PORTS: f64 = 2.0;
const FMA_LATENCY: f64 = 4.0;
const LOAD_PORTS: f64 = 2.0;
const STORE_PORTS: f64 = 1.0;
/// Cycles of the loop control around each execution of the body.
const LOOP_OVERHEAD: f64 = 1.0;
/// Registers accumulators may take (of 32) before they spill: the rest hold the operands.
const ACC_REGISTERS: f64 = 28.0;
/// Copies of the body up to which an update's rolled inner loops count as unrolled:
/// `CodegenOptions::llvm_unroll_max_inner` lets LLVM unroll such loops.
const LLVM_UNROLLED_COPIES: f64 = 16.0;
const L1_BYTES: f64 = 32768.0;
/// An x86 L1 has 64 sets: addresses 4 KiB apart share one, and more lines of one set than
/// its ways (`CoreModel::l1_ways`, 8 on Zen 4, 12 on Intel's recent cores) evict each other.
const L1_SETS: i64 = 64;
/// The model core's L2 as sets: 2048 (lines 128 KiB apart share one, as on Zen 4's 1 MiB of
/// 8 ways and the 2 MiB of 16 of Intel's server cores), of 16 ways. The two cores differ,
/// and the ways are not in a target key; 16 ranked the records of matmul 2048³ on an Intel
/// core a little better than 8 (docs/measurements.md).
const L2_SETS: i64 = 2048;
const L2_WAYS: u32 = 16;
/// Offsets (bytes, or lines once the loops left move by whole lines) enumerated at most per
/// access when counting the lines of a set: twice the lines of the model's L2; a larger
/// count is a level that does not fit anyway.
const SET_ENUMERATION_CAP: usize = 1 << 15;
const L2_BYTES: f64 = 1048576.0;
const L3_BYTES: f64 = 33554432.0;
/// Bytes a cycle each cache takes in from the level below, sustained.
const L2_BYTES_PER_CYCLE: f64 = 16.0;
const L3_BYTES_PER_CYCLE: f64 = 8.0;
const DRAM_BYTES_PER_CYCLE: f64 = 8.0;

/// Arithmetic counts of one execution of a store, in the order of the computation group.
#[derive(Clone, Copy, Default)]
struct Ops([f64; 17]);

// Indices into `Ops` (float kinds first; the int kind of each is `+ INT`).
const MAD: usize = 0;
const ADDSUB: usize = 1;
const MUL: usize = 2;
const DIVMOD: usize = 3;
const CMP: usize = 4;
const MATH: usize = 5;
const MINMAX: usize = 6;
const INT: usize = 7;
const BOOL_OP: usize = 14;
const SELECT: usize = 15;
const CAST: usize = 16;

impl Ops {
    fn add(&mut self, kind: usize, float: bool) {
        // The int block lists min/max before math functions (FEATURE_NAMES: int_minmax,
        // int_math_func), the float block the other way round.
        let slot = if float {
            kind
        } else {
            match kind {
                MATH => INT + 6,
                MINMAX => INT + 5,
                k => INT + k,
            }
        };
        self.0[slot] += 1.0;
    }

    fn sub_mul(&mut self, float: bool) {
        let slot = if float { MUL } else { INT + MUL };
        self.0[slot] -= 1.0;
    }

    /// Floating-point operations (a mad counts two).
    fn float_ops(&self) -> f64 {
        2.0 * self.0[MAD] + self.0[ADDSUB..=MINMAX].iter().sum::<f64>()
    }

    /// Counts the operations of `e`, returning its dtype.
    fn count(&mut self, e: &Expr) -> DType {
        match e {
            Expr::Const(c) => c.dtype(),
            Expr::Var(_) => DType::I64,
            Expr::Bin(op, a, b) => {
                let da = self.count(a);
                self.count(b);
                let float = da.is_float();
                match op {
                    BinOp::Add | BinOp::Sub => {
                        let is_mul = |x: &Expr| matches!(x, Expr::Bin(BinOp::Mul, ..));
                        let is_dot = |x: &Expr| matches!(x, Expr::Pair(PairOp::Dot, ..));
                        if is_dot(a) || is_dot(b) {
                            // acc + dot_bf16(a, b): the dot instruction accumulates.
                        } else if is_mul(a) || is_mul(b) {
                            // a + b * c: one multiply-add instead of an add and a multiply.
                            self.sub_mul(float);
                            self.add(MAD, float);
                        } else {
                            self.add(ADDSUB, float);
                        }
                    }
                    BinOp::Mul => self.add(MUL, float),
                    BinOp::Div | BinOp::Mod => self.add(DIVMOD, float),
                    BinOp::Min | BinOp::Max => self.add(MINMAX, float),
                }
                da
            }
            Expr::Cmp(_, a, b) => {
                let da = self.count(a);
                self.count(b);
                self.add(CMP, da.is_float());
                DType::Bool
            }
            Expr::And(a, b) | Expr::Or(a, b) => {
                self.count(a);
                self.count(b);
                self.0[BOOL_OP] += 1.0;
                DType::Bool
            }
            Expr::Not(a) => {
                self.count(a);
                self.0[BOOL_OP] += 1.0;
                DType::Bool
            }
            Expr::Select(c, t, f) => {
                self.count(c);
                let dt = self.count(t);
                self.count(f);
                self.0[SELECT] += 1.0;
                dt
            }
            Expr::Cast(d, a) => {
                self.count(a);
                self.0[CAST] += 1.0;
                *d
            }
            Expr::Call(_, a) => {
                let da = self.count(a);
                self.add(MATH, da.is_float());
                da
            }
            Expr::Pair(op, a, b) => {
                self.count(a);
                self.count(b);
                match op {
                    // One instruction of two multiply-adds per lane (four flops with the
                    // accumulation it takes over).
                    PairOp::Dot => {
                        self.add(MAD, true);
                        self.add(MAD, true);
                    }
                    PairOp::Pack => self.add(ADDSUB, false),
                }
                op.result()
            }
            Expr::BufLoad { dtype, index, .. } => {
                self.count(index);
                *dtype
            }
            Expr::Load { dtype, indices, .. } => {
                indices.iter().for_each(|i| {
                    self.count(i);
                });
                *dtype
            }
            Expr::Reduce { source, .. } => self.count(source),
        }
    }
}

/// A loop on the stack.
#[derive(Clone, Copy)]
struct LoopCtx {
    dim: LoopDim,
    kind: ForKind,
}

/// One access of a store: the buffer, its index, and whether it is the write.
struct Access<'f> {
    buf: BufId,
    index: &'f Expr,
    write: bool,
}

/// The accesses of one buffer in one store, analyzed.
struct BufferUse {
    buf: BufId,
    read: bool,
    write: bool,
    /// Bytes accessed over the whole nest.
    bytes: f64,
    /// The first access's pattern (the write, for the written buffer).
    pattern: AccessPattern,
    /// Largest footprint of the accesses per level `0..=n` (level n: one element), elements.
    footprint: Vec<f64>,
    lines: f64,
}

struct Walker<'f> {
    func: &'f LoweredFunc,
    env: Env,
    loops: Vec<LoopCtx>,
    guards: Vec<&'f Expr>,
    /// Temporaries live here: the buffer, the number of times its `Allocate` runs and the
    /// number of loops around the `Allocate`.
    allocs: Vec<(BufId, f64, usize)>,
    /// Per buffer: how many stores of the function touch it.
    store_users: Vec<u32>,
    out: Vec<f32>,
    /// Floating-point operations of the whole program.
    program_flops: f64,
    /// Estimated cycles of the rows so far.
    program_cycles: f64,
    /// Vector widths of the micro-kernel's cost.
    core: CoreModel,
    /// Prefetch statements seen since the last store: lowering puts a stage's prefetches
    /// just before its store, so the next store is theirs.
    prefetches: f64,
}

/// The walk behind the features: every store's row, and the program's estimated cycles.
/// Returns the walker and the number of stores.
fn walk<'f>(func: &'f LoweredFunc, core: &CoreModel) -> (Walker<'f>, usize) {
    let mut store_users = vec![0u32; func.buffers.len()];
    let mut stores = 0usize;
    func.body.visit(&mut |s| {
        if let Stmt::Store { buf, index, value }
        | Stmt::Shuffle {
            buf, index, value, ..
        } = s
        {
            stores += 1;
            let mut seen: Vec<BufId> = vec![*buf];
            let mut note = |e: &Expr| {
                if let Expr::BufLoad { buf, .. } = e {
                    if !seen.contains(buf) {
                        seen.push(*buf);
                    }
                }
            };
            index.visit(&mut note);
            value.visit(&mut note);
            for b in seen {
                if let Some(n) = store_users.get_mut(b.0 as usize) {
                    *n += 1;
                }
            }
        }
    });
    let mut w = Walker {
        func,
        env: Env::new(func.num_vars),
        loops: Vec::new(),
        guards: Vec::new(),
        allocs: Vec::new(),
        store_users,
        out: Vec::with_capacity(stores * N_FEATURES),
        program_flops: program_flops(&func.body),
        program_cycles: 0.0,
        core: *core,
        prefetches: 0.0,
    };
    w.stmt(&func.body);
    (w, stores)
}

/// The analytic estimate of the cycles `func` takes on `core`: the sum over its stores of
/// their micro-kernel estimate (what `program_cycles_per_flop` divides by the program's
/// float operations; undivided, a program that computes something many times over is
/// charged for every time).
pub(crate) fn estimated_cycles(func: &LoweredFunc, core: &CoreModel) -> f64 {
    walk(func, core).0.program_cycles
}

/// Appends one row per store of `func` to a fresh vector; returns it with the program's
/// estimated cycles ([`estimated_cycles`]).
pub(crate) fn extract_rows(func: &LoweredFunc, core: &CoreModel) -> (Vec<f32>, f64) {
    let (mut w, _) = walk(func, core);
    let rows = w.out.len() / N_FEATURES;
    let per_flop = slog(w.program_cycles / w.program_flops.max(1.0));
    for r in 0..rows {
        w.out[r * N_FEATURES + PROGRAM_CYCLES_PER_FLOP] = per_flop;
    }
    (w.out, w.program_cycles)
}

impl<'f> Walker<'f> {
    fn stmt(&mut self, s: &'f Stmt) {
        match s {
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => {
                self.loops.push(LoopCtx {
                    dim: LoopDim {
                        var: var.id,
                        extent: (*extent).max(1),
                    },
                    kind: *kind,
                });
                self.stmt(body);
                self.loops.pop();
            }
            Stmt::Store { buf, index, value } => self.store(*buf, index, value),
            Stmt::Allocate { buf, body } => {
                let runs = self.loops.iter().map(|l| l.dim.extent as f64).product();
                self.allocs.push((*buf, runs, self.loops.len()));
                self.stmt(body);
                self.allocs.pop();
            }
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                self.guards.push(cond);
                self.stmt(then);
                if let Some(o) = otherwise {
                    self.stmt(o);
                }
                self.guards.pop();
            }
            Stmt::Seq(v) => v.iter().for_each(|s| self.stmt(s)),
            // A register exchange within a warp: a row like a store's (its value's
            // arithmetic and loads count where they happen, in the partner thread).
            Stmt::Shuffle {
                buf, index, value, ..
            } => self.store(*buf, index, value),
            Stmt::Prefetch { .. } => self.prefetches += 1.0,
            Stmt::Sync => {}
        }
    }

    fn decl_bytes(&self, buf: BufId) -> (f64, f64) {
        match self.func.buffers.get(buf.0 as usize) {
            Some(d) => (d.dtype.bytes() as f64, d.size().max(1) as f64),
            None => (4.0, 1.0),
        }
    }

    fn store(&mut self, buf: BufId, index: &'f Expr, value: &'f Expr) {
        let dims: Vec<LoopDim> = self.loops.iter().map(|l| l.dim).collect();
        let n = dims.len();
        let execs: f64 = dims.iter().map(|d| d.extent as f64).product();
        let mut row = [0f64; N_FEATURES];

        // Computation: per execution, then over the nest.
        let mut ops = Ops::default();
        ops.count(index);
        ops.count(value);
        for g in &self.guards {
            ops.count(g);
        }
        for (k, v) in ops.0.iter().enumerate() {
            row[COMPUTATION + k] = v * execs;
        }

        // Accesses, grouped per buffer.
        let mut accesses = vec![Access {
            buf,
            index,
            write: true,
        }];
        let mut collect = |e: &'f Expr| {
            if let Expr::BufLoad { buf, index, .. } = e {
                accesses.push(Access {
                    buf: *buf,
                    index,
                    write: false,
                });
            }
        };
        visit_ref(index, &mut collect);
        visit_ref(value, &mut collect);
        let mut uses: Vec<BufferUse> = Vec::new();
        for a in &accesses {
            let pattern = AccessPattern::of(a.index, &dims, &mut self.env);
            let (elem, size) = self.decl_bytes(a.buf);
            let footprint: Vec<f64> = (0..=n)
                .map(|l| pattern.footprint(&dims, l).min(size))
                .collect();
            let lines = lines_of(&pattern, &dims, execs, elem);
            match uses.iter_mut().find(|u| u.buf == a.buf) {
                Some(u) => {
                    u.read |= !a.write;
                    u.write |= a.write;
                    u.bytes += execs * elem;
                    u.lines += lines;
                    for (f, g) in u.footprint.iter_mut().zip(&footprint) {
                        *f = f.max(*g);
                    }
                }
                None => uses.push(BufferUse {
                    buf: a.buf,
                    read: !a.write,
                    write: a.write,
                    bytes: execs * elem,
                    pattern,
                    footprint,
                    lines,
                }),
            }
        }
        uses.sort_by(|a, b| b.bytes.total_cmp(&a.bytes).then(a.buf.cmp(&b.buf)));
        for (slot, u) in uses.iter().take(MAX_BUFFERS).enumerate() {
            self.buffer_features(u, &dims, execs, &mut row[BUFFERS + slot * BUFFER_STRIDE..]);
        }

        // Annotations and GPU binding. A loop is a reduce loop of an update store (one that
        // reads the element it writes) when the written index ignores it; loops outside the
        // allocation of a temporary are not (each of their iterations has a fresh buffer).
        let is_update = accesses
            .iter()
            .any(|a| !a.write && a.buf == buf && a.index == index);
        let live_from = self
            .allocs
            .iter()
            .rev()
            .find(|(b, ..)| *b == buf)
            .map_or(0, |(_, _, depth)| *depth);
        let write_pattern = uses
            .iter()
            .find(|u| u.buf == buf)
            .map(|u| &u.pattern)
            .filter(|_| is_update);
        let kinds = [ForKind::Vectorized, ForKind::Unrolled, ForKind::Parallel];
        for (k, kind) in kinds.iter().enumerate() {
            let base = ANNOTATION + k * ANNOTATION_STRIDE;
            let mut num = 0.0;
            let mut prod = 1.0;
            let mut len = 0.0;
            let mut pos: Option<usize> = None;
            let mut mixed = false;
            for (j, l) in self.loops.iter().enumerate() {
                if l.kind != *kind {
                    continue;
                }
                num += 1.0;
                prod *= l.dim.extent as f64;
                len = l.dim.extent as f64;
                let level = if j + 1 == n {
                    0
                } else if j == 0 {
                    2
                } else {
                    1
                };
                let reduce = j >= live_from && write_pattern.is_some_and(|p| !p.moves(j));
                let p = 1 + level + if reduce { 3 } else { 0 };
                if pos.is_some_and(|q| q != p) {
                    mixed = true;
                }
                pos = Some(p);
            }
            row[base] = num;
            row[base + 1] = if num > 0.0 { prod } else { 0.0 };
            row[base + 2] = len;
            let onehot = match (pos, mixed) {
                (None, _) => 0,
                (Some(_), true) => 7,
                (Some(p), false) => p,
            };
            row[base + 3 + onehot] = 1.0;
        }
        for l in &self.loops {
            if let ForKind::ThreadBound(axis) = l.kind {
                row[GPU] = 1.0;
                let slot = GPU
                    + 1
                    + match axis {
                        ThreadAxis::BlockX => 0,
                        ThreadAxis::BlockY => 1,
                        ThreadAxis::BlockZ => 2,
                        ThreadAxis::ThreadX => 3,
                        ThreadAxis::ThreadY => 4,
                        ThreadAxis::ThreadZ => 5,
                        ThreadAxis::VThread => 6,
                    };
                row[slot] = row[slot].max(1.0) * l.dim.extent as f64;
            }
        }

        // Arithmetic-intensity curve over t = 0..=n loops included from the innermost.
        let float_ops = ops.float_ops();
        let mut curve = Vec::with_capacity(n + 1);
        let mut inner_prod = 1.0;
        for t in 0..=n {
            if t > 0 {
                inner_prod *= dims[n - t].extent as f64;
            }
            let level = n - t;
            let bytes: f64 = uses
                .iter()
                .map(|u| u.footprint[level] * self.decl_bytes(u.buf).0)
                .sum();
            curve.push(float_ops * inner_prod / bytes.max(1.0));
        }
        for i in 0..INTENSITY_SAMPLES {
            let x = i as f64 * n as f64 / (INTENSITY_SAMPLES - 1) as f64;
            let lo = x.floor() as usize;
            let hi = (lo + 1).min(n);
            let frac = x - lo as f64;
            row[INTENSITY + i] = curve[lo] * (1.0 - frac) + curve[hi] * frac;
        }

        // Allocation of the written buffer.
        let decl = self.func.buffers.get(buf.0 as usize);
        if let Some((_, runs, _)) = self.allocs.iter().rev().find(|(b, ..)| *b == buf) {
            let (elem, size) = self.decl_bytes(buf);
            row[ALLOCATION] = elem * size;
            row[ALLOCATION + 1] = *runs;
            row[ALLOCATION + 2] = execs / runs.max(1.0);
            row[ALLOCATION + 3] = decl.is_some_and(|d| d.scope == Scope::Local) as u8 as f64;
            row[ALLOCATION + 4] = decl.is_some_and(|d| d.scope == Scope::Shared) as u8 as f64;
        }

        row[OUTER] = execs;
        row[OUTER + 1] = n as f64;
        row[OUTER + 2] = self.guards.len() as f64;
        row[OUTER + 3] = decl.is_some_and(|d| matches!(d.kind, BufKind::Output(_))) as u8 as f64;
        row[OUTER + 4] = std::mem::take(&mut self.prefetches);

        let cycles = self.kernel_features(
            &accesses,
            &uses,
            &dims,
            is_update,
            float_ops,
            &mut row[KERNEL..],
        );
        self.program_cycles += cycles;

        self.out.extend(row.iter().map(|&x| slog(x)));
    }

    /// The micro-kernel group: the straight-line body that unrolling and vectorizing make of
    /// the innermost loops, costed on a model core, and the bytes each cache level must serve.
    /// Returns the row's estimated cycles.
    fn kernel_features(
        &mut self,
        accesses: &[Access<'f>],
        uses: &[BufferUse],
        dims: &[LoopDim],
        is_update: bool,
        float_ops: f64,
        out: &mut [f64],
    ) -> f64 {
        let n = dims.len();
        // LLVM may unroll the rolled loops of an update around the body too (the code
        // generator lets it where the inner rolled loops are short, 16 by default); take
        // those whose copies stay few.
        let limit = if is_update { LLVM_UNROLLED_COPIES } else { 1.0 };
        let mut b = n;
        let mut size = 1.0f64;
        while b > 0 {
            let l = &self.loops[b - 1];
            let e = l.dim.extent as f64;
            if matches!(l.kind, ForKind::Unrolled | ForKind::Vectorized) || l.dim.extent <= 1 {
                b -= 1;
                size *= if l.kind == ForKind::Vectorized {
                    1.0
                } else {
                    e
                };
            } else if l.kind == ForKind::Serial && size * e <= limit {
                b -= 1;
                size *= e;
            } else {
                break;
            }
        }
        let Some(write) = accesses.first() else {
            return 0.0;
        };
        let execs: f64 = dims.iter().map(|d| d.extent as f64).product();
        let body_iters: f64 = dims[b..].iter().map(|d| d.extent as f64).product();
        let body_execs = execs / body_iters.max(1.0);
        let (out_elem, _) = self.decl_bytes(write.buf);
        // Vector instructions of the body, in pipe units (on Zen 4 a 64-byte op is two).
        let (unit_bytes, vector_bytes) = (self.core.unit_bytes, self.core.vector_bytes);
        let units = |e: f64, elem: f64| (e * elem / unit_bytes).ceil();
        let mut vec_ops = 1.0f64;
        for l in &self.loops[b..] {
            vec_ops *= match l.kind {
                ForKind::Vectorized => units(l.dim.extent as f64, out_elem),
                _ => l.dim.extent as f64,
            };
        }
        // One access per execution of the body: its distinct loads or stores (pipe
        // units; an element the vectorized loop does not move is one broadcast), the vector
        // registers its values take, and whether the vectorized loop gathers it.
        let distinct = |w: &mut Self, index: &Expr, elem: f64| -> (f64, f64, bool) {
            let p = AccessPattern::of(index, dims, &mut w.env);
            let mut regs = 1.0f64;
            let mut count = 1.0f64;
            let mut gather = false;
            for (j, l) in w.loops.iter().enumerate().skip(b) {
                if !p.moves(j) {
                    continue;
                }
                let e = l.dim.extent as f64;
                match l.kind {
                    ForKind::Vectorized if p.stride.get(j).is_some_and(|s| s.abs() == 1) => {
                        count *= units(e, elem);
                        regs *= (e * elem / vector_bytes).ceil();
                        count *= split_share(w, index, &p, j, elem, e * elem);
                    }
                    ForKind::Vectorized => {
                        gather = true;
                        count *= e;
                        regs *= (e * elem / vector_bytes).ceil();
                    }
                    _ => {
                        count *= e;
                        regs *= e;
                    }
                }
            }
            (count, regs, gather)
        };
        let (writes, acc_regs, _) = distinct(self, write.index, out_elem);
        let mut loads = 0.0;
        let mut gathers = 0.0;
        for (i, a) in accesses.iter().enumerate().skip(1) {
            let self_read = a.buf == write.buf && a.index == write.index;
            let repeated = accesses[1..i]
                .iter()
                .any(|o| o.buf == a.buf && o.index == a.index);
            if self_read || repeated {
                continue;
            }
            let (elem, _) = self.decl_bytes(a.buf);
            let (c, _, g) = distinct(self, a.index, elem);
            loads += c;
            gathers += g as u8 as f64;
        }
        let wp = AccessPattern::of(write.index, dims, &mut self.env);
        let mut around = 1.0f64;
        let mut j = b;
        while j > 0 && is_update {
            let l = &self.loops[j - 1];
            if l.kind != ForKind::Serial || wp.moves(j - 1) {
                break;
            }
            around *= l.dim.extent as f64;
            j -= 1;
        }
        // More accumulators than registers spill: every update then loads and stores.
        let spills = acc_regs > ACC_REGISTERS;
        let around = if spills { 1.0 } else { around };
        let in_regs = is_update && around > 1.0;
        let stores = writes / around;
        if is_update {
            loads += writes / around;
        }
        let tp = (vec_ops / FMA_PORTS)
            .max(loads / LOAD_PORTS)
            .max(stores / STORE_PORTS)
            .max(1.0);
        // Accumulators kept in registers chain their updates: each of the `acc_regs` chains
        // takes `vec_ops / acc_regs` dependent ops per body.
        let lat = if in_regs {
            vec_ops / (vector_bytes / unit_bytes) / acc_regs.max(1.0) * FMA_LATENCY
        } else {
            0.0
        };
        let body_cycles = tp.max(lat) + LOOP_OVERHEAD;
        let compute = body_cycles * body_execs;
        // Bytes each cache takes in from the level below.
        let mut miss = [0.0f64; 3];
        for (slot, cap) in [L1_BYTES, L2_BYTES, L3_BYTES].into_iter().enumerate() {
            let total = |l: usize| -> f64 {
                uses.iter()
                    .map(|u| u.footprint[l] * self.decl_bytes(u.buf).0)
                    .sum()
            };
            let mut fit = (0..=n).find(|&l| total(l) <= cap).unwrap_or(n);
            // A level that fits a cache by size may not by sets: rows a multiple of 4 KiB
            // apart (a matrix of 1024 or 2048 floats a row) all land in one L1 set, rows
            // 128 KiB apart in one L2 set, and more of them than a set has ways evict each
            // other between two uses. Such a level does not fit; the cache then takes in
            // whole lines at the first level inward (at most the body) whose lines do, where
            // counting bytes assumed each line's other elements were used before it left.
            let caches = [(L1_SETS, self.core.l1_ways), (L2_SETS, L2_WAYS)];
            let mut lines: Option<Vec<f64>> = None;
            if let Some(&(sets, ways)) = caches.get(slot).filter(|_| fit <= b) {
                let mut l = fit;
                // Accumulators kept in registers are not in the cache while the body runs.
                let skip = in_regs.then_some(write.buf);
                let mut crowded = self.crowds(uses, dims, l, b, skip, (sets, ways));
                while crowded && l < b {
                    l += 1;
                    crowded = self.crowds(uses, dims, l, b, skip, (sets, ways));
                }
                if l != fit || crowded {
                    lines = Some(self.lines_at(uses, dims, l));
                    fit = l;
                }
            }
            for (i, u) in uses.iter().enumerate() {
                let mut k = fit;
                while k > 0 && !u.pattern.moves(k - 1) {
                    k -= 1;
                }
                let outer: f64 = dims[..k].iter().map(|d| d.extent as f64).product();
                let bytes = u.footprint[fit] * self.decl_bytes(u.buf).0;
                let bytes = match &lines {
                    Some(v) => bytes.max(v[i] * CACHE_LINE),
                    None => bytes,
                };
                miss[slot] += bytes * outer;
            }
        }
        let memory = (miss[0] / L2_BYTES_PER_CYCLE)
            .max(miss[1] / L3_BYTES_PER_CYCLE)
            .max(miss[2] / DRAM_BYTES_PER_CYCLE);
        let cycles = compute.max(memory);
        let flops = (float_ops * execs).max(1.0);
        let total = self.program_flops.max(1.0);
        out[0] = (n - b) as f64;
        out[1] = vec_ops;
        out[2] = loads;
        out[3] = stores;
        out[4] = if is_update { acc_regs } else { 0.0 };
        out[5] = in_regs as u8 as f64;
        out[6] = body_cycles;
        out[7] = float_ops * body_iters / body_cycles;
        out[8] = gathers;
        out[9] = miss[0] / flops;
        out[10] = miss[1] / flops;
        out[11] = miss[2] / flops;
        out[12] = cycles / total;
        // out[13] (`PROGRAM_CYCLES_PER_FLOP`): filled in once every row is known.
        cycles
    }

    /// Whether the lines the uses touch in one run of the loops from `level` inward crowd a
    /// set of a cache of `sets` sets beyond its `ways`. Buffers are taken to start on the
    /// same set (the runtime's large buffers start on a huge page). Temporaries in local
    /// scope (registers and the stack), the buffer `skip`, uses that stream past the level
    /// (each line read by one execution of the body, which starts at loop `body`) and
    /// accesses that do not enumerate (not affine in some loop, or too many offsets) are
    /// left out.
    fn crowds(
        &self,
        uses: &[BufferUse],
        dims: &[LoopDim],
        level: usize,
        body: usize,
        skip: Option<BufId>,
        (sets, ways): (i64, u32),
    ) -> bool {
        // A use that every loop from `level` to the body (`body`), and the first loop
        // outside `level`, move by a line or more streams: each of its lines serves one
        // execution of the body, is not read again in this run of the level, and the next
        // run (whose lines the estimate charges again) reads other lines. It passes through
        // a set without having to stay; only the lines read again share the ways. (Eight
        // rows of weights 4 KiB apart fill an 8-way set exactly; the input's lines streaming
        // past them had the fastest programs of a 1×1 conv2d marked as crowded:
        // docs/measurements.md, "Lines read once in the cache-set count".)
        let streams = |u: &BufferUse| -> bool {
            let elem = self.decl_bytes(u.buf).0;
            let far = |j: usize| {
                dims[j].extent <= 1
                    || u.pattern
                        .stride
                        .get(j)
                        .is_some_and(|s| s.unsigned_abs() as f64 * elem >= CACHE_LINE)
            };
            let outside = (0..level).rev().find(|&j| dims[j].extent > 1);
            (level..body).all(far) && outside.is_none_or(far)
        };
        let counted: Vec<&BufferUse> = uses
            .iter()
            .filter(|u| !self.is_local(u.buf) && skip != Some(u.buf) && !streams(u))
            .collect();
        // A range of bytes meets each set at most once per period of the cache's sets and
        // once more for its ends: ranges that cannot crowd a set need no enumeration, which
        // is most of them (and saves the search the cost).
        let period = (sets as f64) * CACHE_LINE;
        let bound: f64 = counted
            .iter()
            .map(|u| {
                let span: f64 = (level..dims.len())
                    .map(|j| u.pattern.span.get(j).map_or(0.0, |s| *s as f64))
                    .sum();
                ((span + 1.0) * self.decl_bytes(u.buf).0 / period).ceil() + 1.0
            })
            .sum();
        if bound <= f64::from(ways) {
            return false;
        }
        let mut per_set = vec![0u32; sets as usize];
        for u in counted {
            let Some(touched) = lines_touched(&u.pattern, dims, level, self.decl_bytes(u.buf).0)
            else {
                continue;
            };
            for line in &touched {
                let set = &mut per_set[line.rem_euclid(sets) as usize];
                *set += 1;
                if *set > ways {
                    return true;
                }
            }
        }
        false
    }

    /// Whether `buf` is a temporary in local scope (registers or the stack).
    fn is_local(&self, buf: BufId) -> bool {
        self.func
            .buffers
            .get(buf.0 as usize)
            .is_some_and(|d| d.scope == Scope::Local)
    }

    /// The lines each use touches in one run of the loops from `level` inward (0 for local
    /// temporaries and where they do not enumerate).
    fn lines_at(&self, uses: &[BufferUse], dims: &[LoopDim], level: usize) -> Vec<f64> {
        uses.iter()
            .map(|u| {
                if self.is_local(u.buf) {
                    return 0.0;
                }
                lines_touched(&u.pattern, dims, level, self.decl_bytes(u.buf).0)
                    .map_or(0.0, |v| v.len() as f64)
            })
            .collect()
    }

    fn buffer_features(&self, u: &BufferUse, dims: &[LoopDim], execs: f64, out: &mut [f64]) {
        let n = dims.len();
        let (elem, _) = self.decl_bytes(u.buf);
        let p = &u.pattern;
        let access = match (u.read, u.write) {
            (true, true) => 2,
            (false, true) => 1,
            _ => 0,
        };
        out[access] = 1.0;
        out[3] = u.bytes;
        let unique = u.footprint[0];
        out[4] = unique * elem;
        out[5] = u.lines;
        let step = step_elems(p, dims) * elem;
        out[6] = if step >= CACHE_LINE {
            unique
        } else {
            (unique * step.max(elem) / CACHE_LINE).clamp(1.0, unique)
        };
        // Reuse: the innermost loop of extent > 1 that does not move this index.
        let reuse_loop = (0..n).rev().find(|&j| dims[j].extent > 1 && !p.moves(j));
        let users = self.store_users.get(u.buf.0 as usize).copied().unwrap_or(0);
        let (kind, dis_iter, dis_bytes, ct) = match reuse_loop {
            Some(j) => {
                let inner: f64 = dims[j + 1..].iter().map(|d| d.extent as f64).product();
                (0, inner, u.footprint[j + 1] * elem, dims[j].extent as f64)
            }
            None if users > 1 => (1, execs, unique * elem, users as f64),
            None => (2, 0.0, 0.0, 0.0),
        };
        out[7 + kind] = 1.0;
        out[10] = dis_iter;
        out[11] = dis_bytes;
        out[12] = ct;
        let div = ct.max(1.0);
        out[13] = u.bytes / div;
        out[14] = unique * elem / div;
        out[15] = u.lines / div;
        out[16] = p
            .innermost_moving()
            .and_then(|j| p.stride.get(j))
            .copied()
            .unwrap_or(0) as f64;
        out[17] = p.stride.last().copied().unwrap_or(0) as f64;
        out[18] = self
            .func
            .buffers
            .get(u.buf.0 as usize)
            .is_some_and(|d| d.kind == BufKind::Temp) as u8 as f64;
    }
}

/// How many times over the pipe units of a contiguous vector access are executed, counting
/// those that cross a cache line twice (the core reads both lines; on Zen 4 and Intel's
/// cores a load or store split over two lines takes two passes through its pipe). The
/// vector starts wherever the access's first element and the strides of its other loops put
/// it: where all are multiples of the unit (a matrix row of 16 floats and more) no unit
/// splits; a window's column shifted by one float (`x + rx`) starts 4 bytes into a line
/// at some taps, and of the units that start at the multiples of 4 bytes in a line, those
/// starting in its last `unit - 4` bytes cross it.
fn split_share(
    w: &Walker<'_>,
    index: &Expr,
    pattern: &AccessPattern,
    vector_loop: usize,
    elem: f64,
    bytes: f64,
) -> f64 {
    // A vector narrower than a pipe unit is one access of its own size.
    let unit = w.core.unit_bytes.min(bytes);
    let elem_i = elem as i64;
    // Loops start at 0 in the walker's environment: `eval` gives the first element.
    let first = super::index::eval(index, &w.env).unwrap_or(1);
    let mut step = first.wrapping_mul(elem_i);
    for (k, s) in pattern.stride.iter().enumerate() {
        if k != vector_loop {
            step = gcd(step, s.wrapping_mul(elem_i));
        }
    }
    // The offsets in a line a unit can start at are the multiples of `align`.
    let align = gcd(step, CACHE_LINE as i64) as f64;
    if align >= unit || align == 0.0 {
        1.0
    } else {
        1.0 + (unit - align) / CACHE_LINE
    }
}

/// Greatest common divisor of two byte offsets (0 with 0 is 0; signs ignored).
fn gcd(a: i64, b: i64) -> i64 {
    let (mut a, mut b) = (a.unsigned_abs(), b.unsigned_abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.min(i64::MAX as u64) as i64
}

/// Floating-point operations of a statement over all its executions.
fn program_flops(s: &Stmt) -> f64 {
    match s {
        Stmt::For { extent, body, .. } => (*extent).max(1) as f64 * program_flops(body),
        Stmt::Store { value, .. } | Stmt::Shuffle { value, .. } => {
            let mut ops = Ops::default();
            ops.count(value);
            ops.float_ops()
        }
        Stmt::Allocate { body, .. } => program_flops(body),
        Stmt::If {
            then, otherwise, ..
        } => program_flops(then).max(otherwise.as_ref().map_or(0.0, |o| program_flops(o))),
        Stmt::Seq(v) => v.iter().map(program_flops).sum(),
        Stmt::Sync | Stmt::Prefetch { .. } => 0.0,
    }
}

/// Elements between consecutive accesses of the innermost loop that moves the index (the
/// average step over the loop when its first step is 0, as for `floor(v / c)`).
fn step_elems(p: &AccessPattern, dims: &[LoopDim]) -> f64 {
    match p.innermost_moving() {
        Some(j) => {
            let s = p.stride[j].unsigned_abs() as f64;
            if s > 0.0 {
                s
            } else {
                p.span[j] as f64 / (dims[j].extent - 1).max(1) as f64
            }
        }
        None => 0.0,
    }
}

/// Cache lines fetched by one access over the nest: iterations of the loops inside the
/// innermost moving loop hit the same element; consecutive elements closer than a line
/// share it.
fn lines_of(p: &AccessPattern, dims: &[LoopDim], execs: f64, elem: f64) -> f64 {
    match p.innermost_moving() {
        Some(j) => {
            let repeat: f64 = dims[j + 1..].iter().map(|d| d.extent as f64).product();
            let step = step_elems(p, dims) * elem;
            (execs / repeat * (step / CACHE_LINE).min(1.0)).max(1.0)
        }
        None => 1.0,
    }
}

/// The distinct 64-byte lines (numbered from the buffer's start) that one run of the loops
/// from `level` inward touches, or `None` when the index is not affine in one of them (its
/// span is not its stride times its extent less one: a fused loop's floor-div or mod) or
/// there are more than [`SET_ENUMERATION_CAP`] offsets to hold.
///
/// The loops are taken innermost first, offsets in bytes until every loop left moves by
/// whole lines, then in lines: a level as large as an L2 holds its lines, not its bytes.
fn lines_touched(p: &AccessPattern, dims: &[LoopDim], level: usize, elem: f64) -> Option<Vec<i64>> {
    let line = CACHE_LINE as i64;
    let mut steps: Vec<(i64, i64)> = Vec::new();
    for (j, d) in dims.iter().enumerate().skip(level) {
        let stride = p.stride.get(j).copied().unwrap_or(0);
        let span = p.span.get(j).copied().unwrap_or(0);
        if stride == 0 && span == 0 {
            continue;
        }
        if stride.checked_mul(d.extent - 1)?.checked_abs()? != span {
            return None;
        }
        steps.push((stride.checked_mul(elem as i64)?, d.extent));
    }
    let mut offsets = vec![0i64];
    let mut in_lines = false;
    for k in (0..steps.len()).rev() {
        if !in_lines && steps[..=k].iter().all(|(s, _)| s % line == 0) {
            offsets = to_lines(&offsets);
            in_lines = true;
        }
        let (step, extent) = steps[k];
        let step = if in_lines { step / line } else { step };
        let n = usize::try_from(extent).ok()?;
        if offsets.len().checked_mul(n)? > SET_ENUMERATION_CAP {
            return None;
        }
        let mut next = Vec::with_capacity(offsets.len() * n);
        for &o in &offsets {
            next.extend((0..extent).map(|i| o.wrapping_add(i.wrapping_mul(step))));
        }
        next.sort_unstable();
        next.dedup();
        offsets = next;
    }
    Some(if in_lines {
        offsets
    } else {
        to_lines(&offsets)
    })
}

/// Sorted byte offsets to the distinct lines they fall in.
fn to_lines(offsets: &[i64]) -> Vec<i64> {
    let mut lines: Vec<i64> = offsets
        .iter()
        .map(|o| o.div_euclid(CACHE_LINE as i64))
        .collect();
    lines.dedup();
    lines
}

/// Calls `f` on every sub-expression with the borrow of the tree (so the caller may keep
/// references), parents first.
fn visit_ref<'e>(e: &'e Expr, f: &mut impl FnMut(&'e Expr)) {
    f(e);
    match e {
        Expr::Const(_) | Expr::Var(_) => {}
        Expr::Bin(_, a, b)
        | Expr::Cmp(_, a, b)
        | Expr::And(a, b)
        | Expr::Or(a, b)
        | Expr::Pair(_, a, b) => {
            visit_ref(a, f);
            visit_ref(b, f);
        }
        Expr::Not(a) | Expr::Cast(_, a) | Expr::Call(_, a) => visit_ref(a, f),
        Expr::Select(c, t, x) => {
            visit_ref(c, f);
            visit_ref(t, f);
            visit_ref(x, f);
        }
        Expr::Load { indices, .. } => indices.iter().for_each(|i| visit_ref(i, f)),
        Expr::BufLoad { index, .. } => visit_ref(index, f),
        Expr::Reduce { source, .. } => visit_ref(source, f),
    }
}

/// `sign(x) * log2(1 + |x|)`: Ansor's transform of every feature.
pub(super) fn slog(x: f64) -> f32 {
    let y = (1.0 + x.abs()).log2();
    (if x < 0.0 { -y } else { y }) as f32
}

//! The loop IR that lowering produces and every backend consumes.
//!
//! Semantics and invariants (checked by [`crate::verify`]):
//! - A [`Stmt::For`] runs its variable over `[0, extent)` with a constant `extent >= 1`; its
//!   [`ForKind`] says how a backend may run the iterations. `Parallel` and `ThreadBound`
//!   iterations are independent; `Vectorized` loops are innermost in their nest (their body
//!   holds no `For`, `Allocate` or `Sync`), and `extent` is the lane count.
//! - Buffers are flat arrays of one dtype, declared once in [`LoweredFunc::buffers`]. Inputs
//!   and outputs are the function's parameters in [`LoweredFunc::params`] order; every other
//!   buffer is introduced by exactly one [`Stmt::Allocate`], is live only inside its body, and
//!   starts uninitialized.
//! - Every index of a `Store` or `BufLoad` lies in `[0, size)` of its buffer for every
//!   iteration that reaches it (guards make this so for non-divisible splits). A
//!   [`Stmt::Prefetch`]'s index may lie outside: it accesses nothing.
//! - Loop variables are numbered densely `0..num_vars` within one function, and each is bound
//!   by exactly one `For`.

use crate::expr::{BinOp, BufId, DType, Expr, Var};
use serde::{Deserialize, Serialize};
use std::fmt;

/// GPU thread axes a loop can be bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ThreadAxis {
    /// blockIdx.x
    BlockX,
    /// blockIdx.y
    BlockY,
    /// blockIdx.z
    BlockZ,
    /// threadIdx.x
    ThreadX,
    /// threadIdx.y
    ThreadY,
    /// threadIdx.z
    ThreadZ,
    /// A virtual thread: a serial loop that the GPU backend interleaves.
    VThread,
}

impl ThreadAxis {
    /// CUDA spelling, e.g. `blockIdx.x`.
    pub fn name(self) -> &'static str {
        match self {
            ThreadAxis::BlockX => "blockIdx.x",
            ThreadAxis::BlockY => "blockIdx.y",
            ThreadAxis::BlockZ => "blockIdx.z",
            ThreadAxis::ThreadX => "threadIdx.x",
            ThreadAxis::ThreadY => "threadIdx.y",
            ThreadAxis::ThreadZ => "threadIdx.z",
            ThreadAxis::VThread => "vthread",
        }
    }
    /// Parses the CUDA spelling.
    pub fn parse(s: &str) -> Option<ThreadAxis> {
        Some(match s {
            "blockIdx.x" => ThreadAxis::BlockX,
            "blockIdx.y" => ThreadAxis::BlockY,
            "blockIdx.z" => ThreadAxis::BlockZ,
            "threadIdx.x" => ThreadAxis::ThreadX,
            "threadIdx.y" => ThreadAxis::ThreadY,
            "threadIdx.z" => ThreadAxis::ThreadZ,
            "vthread" => ThreadAxis::VThread,
            _ => return None,
        })
    }
}

/// How a loop's iterations are run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ForKind {
    /// In order, one at a time.
    Serial,
    /// Spread over the runtime's worker threads.
    Parallel,
    /// As SIMD lanes.
    Vectorized,
    /// Fully unrolled into copies of the body.
    Unrolled,
    /// Bound to a GPU thread axis.
    ThreadBound(ThreadAxis),
}

/// The cache level a prefetch brings its line into ([`Stmt::Prefetch`],
/// [`Step::Prefetch`](crate::trace::Step::Prefetch)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrefetchLevel {
    /// The L1 data cache and every level above it (x86 `prefetcht0`).
    #[default]
    L1,
    /// The L2 cache, not L1 (`prefetcht1`): a line wanted later than the next one, brought
    /// near without taking L1's few lines or line-fill buffers from what is read sooner.
    L2,
    /// The last-level cache (`prefetcht2`).
    L3,
}

impl PrefetchLevel {
    /// Whether this is the default, [`PrefetchLevel::L1`] (left out of a trace's JSON, so
    /// that traces written before levels existed keep their text and hash).
    pub fn is_l1(&self) -> bool {
        *self == PrefetchLevel::L1
    }

    /// Its name in printed traces and loop nests (`l1`, `l2`, `l3`).
    pub fn name(self) -> &'static str {
        match self {
            PrefetchLevel::L1 => "l1",
            PrefetchLevel::L2 => "l2",
            PrefetchLevel::L3 => "l3",
        }
    }
}

/// Memory scope of a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Scope {
    /// Main memory (CPU heap, GPU global memory).
    Global,
    /// Per-thread storage (CPU stack or registers, GPU registers).
    Local,
    /// GPU shared memory (CPU: like local).
    Shared,
}

impl Scope {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Scope::Global => "global",
            Scope::Local => "local",
            Scope::Shared => "shared",
        }
    }
}

/// What a buffer is to the function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BufKind {
    /// The n-th input (placeholder), in the op's input order.
    Input(usize),
    /// The n-th output.
    Output(usize),
    /// An intermediate introduced by an `Allocate`.
    Temp,
}

/// A buffer of the function.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BufferDecl {
    /// The tensor's name (for intermediates attached under a loop, the stage's name).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape of the region held, row-major; the flat size is the product. The innermost
    /// dimension includes `row_pad` elements of padding.
    pub shape: Vec<i64>,
    /// Memory scope.
    pub scope: Scope,
    /// Parameter or temporary.
    pub kind: BufKind,
    /// Elements at the end of each innermost row that hold nothing: a local temporary whose
    /// rows are a non-power-of-two number of elements gets rows of the next power of two, so
    /// that a vector over a whole row can be loaded and stored at full width (see
    /// `tensortune::codegen`). Never read or written as data.
    #[serde(default)]
    pub row_pad: i64,
}

impl BufferDecl {
    /// Number of elements, padding included.
    pub fn size(&self) -> i64 {
        self.shape.iter().product()
    }

    /// Elements of an innermost row that hold data (`shape`'s last dimension less `row_pad`).
    pub fn row_len(&self) -> i64 {
        self.shape.last().copied().unwrap_or(1) - self.row_pad
    }
}

/// Rows of a local temporary up to this many elements are padded to a power of two (16: one
/// AVX-512 vector of f32; a register tile's row is at most a vector).
pub const MAX_PADDED_ROW: i64 = 16;

/// The row padding [`BufferDecl::row_pad`] a temporary of `scope` and `shape` gets: rows of
/// 3 to [`MAX_PADDED_ROW`] elements that are not a power of two grow to the next one (a
/// register tile of 14 columns becomes rows of 16). Only local (stack) temporaries are padded:
/// they are what LLVM keeps in registers, which masked accesses would prevent.
pub fn row_padding(scope: Scope, shape: &[i64]) -> i64 {
    match (scope, shape.last()) {
        (Scope::Local, Some(&n)) if (3..=MAX_PADDED_ROW).contains(&n) && n.count_ones() > 1 => {
            (n as u64).next_power_of_two() as i64 - n
        }
        _ => 0,
    }
}

/// A statement of the loop IR.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Stmt {
    /// `for var in 0..extent`.
    For {
        /// The loop variable, bound by this loop.
        var: Var,
        /// Constant trip count, at least 1.
        extent: i64,
        /// How iterations run.
        kind: ForKind,
        /// The loop body.
        body: Box<Stmt>,
    },
    /// `buf[index] = value`.
    Store {
        /// Buffer written.
        buf: BufId,
        /// Element offset.
        index: Expr,
        /// Value stored, of the buffer's dtype.
        value: Expr,
    },
    /// Makes a temporary buffer live for the body.
    Allocate {
        /// The buffer (declared in the function's table with its size and scope).
        buf: BufId,
        /// Where it is live.
        body: Box<Stmt>,
    },
    /// Conditional.
    If {
        /// A `Bool` expression.
        cond: Expr,
        /// Run when true.
        then: Box<Stmt>,
        /// Run when false.
        otherwise: Option<Box<Stmt>>,
    },
    /// Statements in order.
    Seq(Vec<Stmt>),
    /// A barrier among the threads of a GPU block (`__syncthreads`); a no-op on the CPU.
    Sync,
    /// `buf[index] = value`, with `value` as the thread of the same GPU warp whose lane is
    /// this thread's lane XOR `lane_xor` evaluates it (a butterfly exchange, PTX's
    /// `shfl.sync.bfly` over the whole warp). A warp is 32 threads of consecutive linear
    /// index; all 32 must run the statement together, which the GPU verifier checks
    /// statically (directly inside a `threadIdx.x` loop of a whole number of warps, no
    /// branch between) and the lockstep interpreter dynamically. There is no CPU meaning:
    /// the CPU code generator and interpreter refuse it.
    Shuffle {
        /// Buffer written (the thread's own element).
        buf: BufId,
        /// Element offset, evaluated by the writing thread.
        index: Expr,
        /// Value exchanged, evaluated by the partner thread; of the buffer's dtype.
        value: Expr,
        /// The partner's lane is this lane XOR `lane_xor`, below 32.
        lane_xor: u32,
    },
    /// A hint to bring the cache line of `buf[index]` into the cache `level` ahead of its use
    /// (`Step::Prefetch`). It reads and writes nothing, so `index` may lie outside the
    /// buffer (the row after the last): the CPU instruction never faults. Inside a
    /// vectorized loop it fetches every line the lanes' elements lie on. The interpreters
    /// and the GPU code generator skip it.
    Prefetch {
        /// Buffer whose line is fetched.
        buf: BufId,
        /// Element offset (in or out of the buffer).
        index: Expr,
        /// Where the line goes.
        #[serde(default, skip_serializing_if = "PrefetchLevel::is_l1")]
        level: PrefetchLevel,
    },
}

/// One lowered kernel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoweredFunc {
    /// Function name (a C identifier).
    pub name: String,
    /// Every buffer, indexed by [`BufId`].
    pub buffers: Vec<BufferDecl>,
    /// Parameters: the inputs in the op's order, then the outputs.
    pub params: Vec<BufId>,
    /// The body.
    pub body: Stmt,
    /// Loop variables have ids `0..num_vars`.
    pub num_vars: u32,
}

impl Stmt {
    /// Statements this emits per run, counting each unrolled loop's body `extent` times:
    /// the copies that unrolled loops multiply (a vectorized or serial loop's body counts
    /// once). What code generation and compile time grow with.
    pub fn unrolled_copies(&self) -> i64 {
        match self {
            Stmt::Seq(items) => items
                .iter()
                .map(Stmt::unrolled_copies)
                .fold(0, |a: i64, b| a.saturating_add(b)),
            Stmt::For {
                extent, kind, body, ..
            } => match kind {
                ForKind::Unrolled => extent.saturating_mul(body.unrolled_copies()),
                _ => body.unrolled_copies(),
            },
            Stmt::If {
                then, otherwise, ..
            } => then
                .unrolled_copies()
                .saturating_add(otherwise.as_deref().map_or(0, Stmt::unrolled_copies)),
            Stmt::Allocate { body, .. } => body.unrolled_copies(),
            Stmt::Store { .. } | Stmt::Shuffle { .. } | Stmt::Sync | Stmt::Prefetch { .. } => 1,
        }
    }
}

/// A loop body that only folds one value per iteration into one element,
/// `acc = acc op x(k)` ([`Stmt::as_fold`]).
#[derive(Clone, Copy, Debug)]
pub struct Fold<'a> {
    /// The accumulator's buffer.
    pub buf: BufId,
    /// The accumulator's index (free of `k`).
    pub index: &'a Expr,
    /// The accumulator's load, `acc` of `acc op x`.
    pub acc: &'a Expr,
    /// `Add`, `Max` or `Min`.
    pub op: BinOp,
    /// The value folded in at iteration `k`.
    pub x: &'a Expr,
}

impl Stmt {
    /// `Some` if this statement, the body of a loop over the variable `k`, is a fold the
    /// CPU code generator runs on vector registers: one store `acc = acc op x(k)` (or
    /// `x(k) op acc`) with `op` a float `Add`, `Max` or `Min`, the index free of `k`, and
    /// `x` a function of `k` whose every load reads memory contiguously or uniformly in
    /// `k` (stride 0 or 1), none of them the accumulator's buffer: a row sum, a row
    /// maximum, a dot product. The one definition that both the code generator (which
    /// folds) and the default schedule (which counts on it) use.
    pub fn as_fold(&self, k: u32) -> Option<Fold<'_>> {
        let body = match self {
            Stmt::Seq(v) if v.len() == 1 => &v[0],
            b => b,
        };
        let Stmt::Store { buf, index, value } = body else {
            return None;
        };
        let Expr::Bin(op, a, b) = value else {
            return None;
        };
        let d = value.dtype();
        if !matches!(op, BinOp::Add | BinOp::Max | BinOp::Min)
            || !d.is_float()
            || a.dtype() != d
            || b.dtype() != d
            || index.uses_var(k)
        {
            return None;
        }
        let is_acc = |e: &Expr| matches!(e, Expr::BufLoad { buf: lb, index: li, .. } if lb == buf && **li == *index);
        let (acc, x) = if is_acc(a) {
            (a, b)
        } else if is_acc(b) {
            (b, a)
        } else {
            return None;
        };
        let mut plain = x.uses_var(k);
        x.visit(&mut |e| match e {
            Expr::BufLoad {
                buf: lb, index: li, ..
            } => plain &= lb != buf && matches!(li.stride_in(k), Some(0 | 1)),
            Expr::Load { .. } | Expr::Reduce { .. } => plain = false,
            _ => {}
        });
        plain.then_some(Fold {
            buf: *buf,
            index,
            acc,
            op: *op,
            x,
        })
    }
}

impl LoweredFunc {
    /// The declaration of a buffer.
    pub fn buffer(&self, id: BufId) -> &BufferDecl {
        &self.buffers[id.0 as usize]
    }
}

impl Stmt {
    /// Calls `f` on every statement, parents first.
    pub fn visit(&self, f: &mut impl FnMut(&Stmt)) {
        f(self);
        match self {
            Stmt::For { body, .. } | Stmt::Allocate { body, .. } => body.visit(f),
            Stmt::If {
                then, otherwise, ..
            } => {
                then.visit(f);
                if let Some(o) = otherwise {
                    o.visit(f);
                }
            }
            Stmt::Seq(v) => v.iter().for_each(|s| s.visit(f)),
            Stmt::Store { .. } | Stmt::Shuffle { .. } | Stmt::Sync | Stmt::Prefetch { .. } => {}
        }
    }

    /// A copy of this statement with `f` applied to each of its direct child statements (a
    /// loop's or an allocation's body, a branch, the items of a sequence); a leaf is cloned.
    pub fn map_children(&self, f: &mut dyn FnMut(&Stmt) -> Stmt) -> Stmt {
        match self {
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => Stmt::For {
                var: *var,
                extent: *extent,
                kind: *kind,
                body: Box::new(f(body)),
            },
            Stmt::Allocate { buf, body } => Stmt::Allocate {
                buf: *buf,
                body: Box::new(f(body)),
            },
            Stmt::If {
                cond,
                then,
                otherwise,
            } => Stmt::If {
                cond: cond.clone(),
                then: Box::new(f(then)),
                otherwise: otherwise.as_ref().map(|o| Box::new(f(o))),
            },
            Stmt::Seq(v) => Stmt::Seq(v.iter().map(f).collect()),
            Stmt::Store { .. } | Stmt::Shuffle { .. } | Stmt::Sync | Stmt::Prefetch { .. } => {
                self.clone()
            }
        }
    }

    /// A copy with `f` applied to every expression (store indices and values, conditions) and
    /// `store_buf` to the buffer of every store; the loops and allocations stay.
    pub fn map_exprs(&self, f: &dyn Fn(&Expr) -> Expr, store_buf: &dyn Fn(BufId) -> BufId) -> Stmt {
        match self {
            Stmt::Store { buf, index, value } => Stmt::Store {
                buf: store_buf(*buf),
                index: f(index),
                value: f(value),
            },
            Stmt::Shuffle {
                buf,
                index,
                value,
                lane_xor,
            } => Stmt::Shuffle {
                buf: store_buf(*buf),
                index: f(index),
                value: f(value),
                lane_xor: *lane_xor,
            },
            Stmt::Prefetch { buf, index, level } => Stmt::Prefetch {
                buf: *buf,
                index: f(index),
                level: *level,
            },
            Stmt::If {
                cond,
                then,
                otherwise,
            } => Stmt::If {
                cond: f(cond),
                then: Box::new(then.map_exprs(f, store_buf)),
                otherwise: otherwise
                    .as_ref()
                    .map(|o| Box::new(o.map_exprs(f, store_buf))),
            },
            _ => self.map_children(&mut |c| c.map_exprs(f, store_buf)),
        }
    }

    /// A sequence, flattened: nested `Seq`s are spliced and a single statement is returned as
    /// itself.
    pub fn seq(stmts: Vec<Stmt>) -> Stmt {
        let mut out = Vec::with_capacity(stmts.len());
        for s in stmts {
            match s {
                Stmt::Seq(inner) => out.extend(inner),
                s => out.push(s),
            }
        }
        if out.len() == 1 {
            out.pop().unwrap_or(Stmt::Seq(Vec::new()))
        } else {
            Stmt::Seq(out)
        }
    }
}

/// Prints a statement with the function's buffer names.
struct StmtPrinter<'a> {
    func: &'a LoweredFunc,
}

impl StmtPrinter<'_> {
    fn expr(&self, e: &Expr) -> String {
        named_expr(e, self.func)
    }

    fn stmt(&self, s: &Stmt, depth: usize, out: &mut String) {
        let pad = "  ".repeat(depth);
        match s {
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => {
                let k = match kind {
                    ForKind::Serial => String::new(),
                    ForKind::Parallel => "parallel ".into(),
                    ForKind::Vectorized => "vectorized ".into(),
                    ForKind::Unrolled => "unrolled ".into(),
                    ForKind::ThreadBound(t) => format!("{} ", t.name()),
                };
                out.push_str(&format!("{pad}{k}for {} in 0..{extent}:\n", var.name));
                self.stmt(body, depth + 1, out);
            }
            Stmt::Store { buf, index, value } => {
                out.push_str(&format!(
                    "{pad}{}[{}] = {}\n",
                    self.func.buffer(*buf).name,
                    self.expr(index),
                    self.expr(value)
                ));
            }
            Stmt::Shuffle {
                buf,
                index,
                value,
                lane_xor,
            } => {
                out.push_str(&format!(
                    "{pad}{}[{}] = shuffle_xor({}, {lane_xor})\n",
                    self.func.buffer(*buf).name,
                    self.expr(index),
                    self.expr(value)
                ));
            }
            Stmt::Allocate { buf, body } => {
                let b = self.func.buffer(*buf);
                let shape: Vec<String> = b.shape.iter().map(|d| d.to_string()).collect();
                let rows = if b.row_pad > 0 {
                    format!(", rows of {}", b.row_len())
                } else {
                    String::new()
                };
                out.push_str(&format!(
                    "{pad}allocate {}: {}[{}] {}{rows}\n",
                    b.name,
                    b.dtype,
                    shape.join(", "),
                    b.scope.name()
                ));
                self.stmt(body, depth, out);
            }
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                out.push_str(&format!("{pad}if {}:\n", self.expr(cond)));
                self.stmt(then, depth + 1, out);
                if let Some(o) = otherwise {
                    out.push_str(&format!("{pad}else:\n"));
                    self.stmt(o, depth + 1, out);
                }
            }
            Stmt::Seq(v) => v.iter().for_each(|s| self.stmt(s, depth, out)),
            Stmt::Sync => out.push_str(&format!("{pad}sync_threads()\n")),
            Stmt::Prefetch { buf, index, level } => out.push_str(&format!(
                "{pad}prefetch{} {}[{}]\n",
                if level.is_l1() {
                    String::new()
                } else {
                    format!(" to {}", level.name())
                },
                self.func.buffer(*buf).name,
                self.expr(index)
            )),
        }
    }
}

/// Prints an expression with buffer loads shown by buffer name, e.g. `A[i * 16 + k]`.
pub fn named_expr(e: &Expr, func: &LoweredFunc) -> String {
    let name = |b: BufId, f: &mut std::fmt::Formatter<'_>| {
        let n = func
            .buffers
            .get(b.0 as usize)
            .map(|d| d.name.as_str())
            .unwrap_or("?");
        f.write_str(n)
    };
    e.display_with(&name).to_string()
}

impl fmt::Display for LoweredFunc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let params: Vec<String> = self
            .params
            .iter()
            .map(|p| {
                let b = self.buffer(*p);
                let shape: Vec<String> = b.shape.iter().map(|d| d.to_string()).collect();
                format!("{}: {}[{}]", b.name, b.dtype, shape.join(", "))
            })
            .collect();
        writeln!(f, "func {}({}):", self.name, params.join(", "))?;
        let mut out = String::new();
        StmtPrinter { func: self }.stmt(&self.body, 1, &mut out);
        f.write_str(&out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::{BufId, Expr, Var};

    fn store(i: u32) -> Stmt {
        Stmt::Store {
            buf: BufId(0),
            index: Expr::Var(Var::new(i, "i")),
            value: Expr::int(0),
        }
    }

    fn for_(id: u32, extent: i64, kind: ForKind, body: Stmt) -> Stmt {
        Stmt::For {
            var: Var::new(id, "v"),
            extent,
            kind,
            body: Box::new(body),
        }
    }

    #[test]
    fn unrolled_copies_multiply_only_through_unrolled_loops() {
        // unrolled 4 { serial 100 { unrolled 3 { a; if { b } else { c } } } ; vectorized 16 { d } }
        let inner = for_(
            2,
            3,
            ForKind::Unrolled,
            Stmt::Seq(vec![
                store(2),
                Stmt::If {
                    cond: Expr::Var(Var::new(2, "k")).lt(1i64),
                    then: Box::new(store(2)),
                    otherwise: Some(Box::new(store(2))),
                },
            ]),
        );
        let body = Stmt::Seq(vec![
            for_(1, 100, ForKind::Serial, inner),
            for_(3, 16, ForKind::Vectorized, store(3)),
        ]);
        let s = for_(0, 4, ForKind::Unrolled, body);
        // Per copy of the outer loop: 3 * (1 + 2) + 1 = 10.
        assert_eq!(s.unrolled_copies(), 40);
        assert_eq!(
            for_(0, i64::MAX, ForKind::Unrolled, s).unrolled_copies(),
            i64::MAX
        );
    }

    /// The innermost loops (a `For` whose body holds no `For`) of the op's loops as written,
    /// each with whether its body is a fold in its variable.
    fn innermost_folds(spec: &str) -> Vec<bool> {
        let dag = crate::ops::WorkloadSpec::parse(spec)
            .and_then(|w| w.build())
            .expect("spec");
        let f = crate::lower::lower(&crate::schedule::State::new(&dag)).expect("lowers");
        let mut out = Vec::new();
        f.body.visit(&mut |s| {
            if let Stmt::For { var, body, .. } = s {
                let mut inner = false;
                body.visit(&mut |b| inner |= matches!(b, Stmt::For { .. }));
                if !inner {
                    out.push(body.as_fold(var.id).is_some());
                }
            }
        });
        out
    }

    #[test]
    fn folds_are_row_sums_and_dot_products() {
        // The row sum folds.
        assert_eq!(innermost_folds("reduce_sum:M=4,N=32"), [true]);
        // A dot product (one row of the dense layer: A's row and W's row, both contiguous
        // in k) folds; the bias and ReLU loops do not.
        assert!(innermost_folds("dense_bias_relu:M=1,N=8,K=32").contains(&true));
        // A matmul reads B across rows in k (stride N): no fold.
        assert!(!innermost_folds("matmul:M=4,N=8,K=32").contains(&true));
        // softmax's row maximum and row sum fold.
        assert_eq!(
            innermost_folds("softmax:M=4,N=32")
                .iter()
                .filter(|f| **f)
                .count(),
            2
        );
    }
}

//! Index ranges: every load of a [`ComputeDag`](crate::ComputeDag) must stay inside the tensor
//! it reads, for every value of the axes, and every access of a loop-IR function inside its
//! buffer, or the compiled program would read or write memory it does not own. The code
//! generators trust this. `check_loads` proves it for a DAG's ops when the DAG is built, so
//! that lowering (which derives every index from the ops and the loops it makes) only ever
//! produces in-bounds functions; [`check_func`] proves it for a loop-IR function that lowering
//! did not make (built by hand, deserialized, or changed after lowering), before the CPU code
//! generator compiles it.
//!
//! The proof is interval arithmetic over the axes' ranges, with what a `Select`'s condition
//! says about the branch it guards (a padded read `cond ? X[y - p] : 0` is only evaluated
//! where `cond` holds: the code generators evaluate only the chosen branch of a select that
//! loads memory). A condition narrows any sub-expression it compares, matched structurally:
//! `y*2 + r >= 1` narrows `y*2 + r` wherever the index uses it. What cannot be shown in range
//! (an index computed from a loaded value, a product that overflows) is refused: the op's
//! author clamps it (`min`/`max`) or guards it.

use crate::expr::{BinOp, CmpOp, Const, DType, Expr};
use crate::ir::{LoweredFunc, Stmt};
use rustc_hash::FxHashMap as HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Mutex, OnceLock};

/// Whether every access of `f` stays inside its buffer: the function is one that
/// [`lower`](crate::lower::lower) made in this process and has not changed since
/// ([`is_lowered`]), or it passes [`verify`](crate::verify::verify) and the interval proof of
/// the module doc over its loops, `if` guards and selects. The CPU code generator compiles
/// nothing else: the loop IR's fields are public and it deserializes from anywhere, and
/// compiled code does not check its indices.
pub fn check_func(f: &LoweredFunc) -> Result<(), String> {
    if is_lowered(f) {
        return Ok(());
    }
    // Far above any lowered function's count (one per loop), and small enough that the code
    // generator's tables indexed by variable stay small.
    const MAX_VARS: u32 = 1 << 20;
    if f.num_vars > MAX_VARS {
        return Err(format!(
            "{} loop variables: more than {MAX_VARS}",
            f.num_vars
        ));
    }
    crate::verify::verify(f)?;
    let mut sizes = Vec::with_capacity(f.buffers.len());
    for b in &f.buffers {
        let n = b
            .shape
            .iter()
            .try_fold(1i64, |n, &d| n.checked_mul(d))
            .filter(|&n| n <= crate::ops::MAX_ELEMENTS)
            .ok_or_else(|| format!("buffer `{}` of shape {:?} is too large", b.name, b.shape))?;
        sizes.push(n);
    }
    let size = |id: u32| sizes.get(id as usize).copied();
    let mut w = Walker {
        vars: HashMap::default(),
        shapes: &|_| None,
        sizes: &size,
    };
    w.stmt(&f.body, &mut Vec::new()).map_err(|b| {
        let name = f
            .buffers
            .get(b.tensor as usize)
            .map_or("?", |d| d.name.as_str());
        let size = size(b.tensor).unwrap_or(0);
        match b.range {
            Some((lo, hi)) => format!(
                "`{name}` (of {size} elements) is accessed at `{}`, which ranges over {lo}..={hi}",
                b.index
            ),
            None => format!(
                "`{name}` (of {size} elements) is accessed at `{}`, which cannot be bounded",
                b.index
            ),
        }
    })
}

/// Whether `f` is, loop for loop, a function that [`lower`](crate::lower::lower) returned in
/// this process: lowering derives every index from a validated DAG and the loops it made, so
/// its functions need no proof. Checked by a fingerprint (keyed by a per-process random key,
/// so that it cannot be forged) of everything but the name.
pub fn is_lowered(f: &LoweredFunc) -> bool {
    let print = fingerprint(f);
    lowered().lock().is_ok_and(|set| set.contains(&print))
}

/// Records `f` as made by lowering (see [`is_lowered`]).
pub(crate) fn mark_lowered(f: &LoweredFunc) {
    let print = fingerprint(f);
    if let Ok(mut set) = lowered().lock() {
        // A bound on the memory (16 bytes a function; a tuning run lowers thousands): past
        // it, functions lowered later are proved like any other.
        if set.len() < 1 << 22 {
            set.insert(print);
        }
    }
}

fn lowered() -> &'static Mutex<std::collections::HashSet<u64>> {
    static SET: OnceLock<Mutex<std::collections::HashSet<u64>>> = OnceLock::new();
    SET.get_or_init(Default::default)
}

fn fingerprint(f: &LoweredFunc) -> u64 {
    static KEY: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    struct Feed<H: Hasher>(H);
    impl<H: Hasher> std::fmt::Write for Feed<H> {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0.write(s.as_bytes());
            Ok(())
        }
    }
    let mut feed = Feed(KEY.get_or_init(Default::default).build_hasher());
    // The debug form holds every field, every constant's bits included; writing it into the
    // hasher allocates nothing.
    let _ = std::fmt::write(
        &mut feed,
        format_args!("{:?}|{:?}|{:?}|{}", f.buffers, f.params, f.body, f.num_vars),
    );
    feed.0.finish()
}

/// An inclusive range of integers.
type Range = (i64, i64);

/// What a condition says about an expression: its value is in the range.
type Fact<'a> = (&'a Expr, Range);

/// A load outside its tensor, or one whose index cannot be bounded.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct OutOfBounds {
    /// Which tensor is read (its id in the DAG being built).
    pub tensor: u32,
    /// Which of its dimensions.
    pub dim: usize,
    /// The index expression, printed.
    pub index: String,
    /// Its range, where one was found.
    pub range: Option<Range>,
}

/// Checks every load in `e` against `shapes` (indexed by tensor id), the variables of `vars`
/// ranging over `[0, extent)`.
pub(crate) fn check_loads(
    e: &Expr,
    vars: &HashMap<u32, i64>,
    shapes: &dyn Fn(u32) -> Option<Vec<i64>>,
) -> Result<(), OutOfBounds> {
    let ranges: HashMap<u32, Range> = vars
        .iter()
        .map(|(&v, &extent)| (v, (0, extent.saturating_sub(1))))
        .collect();
    Walker {
        vars: ranges,
        shapes,
        sizes: &|_| None,
    }
    .walk(e, &mut Vec::new())
}

struct Walker<'a> {
    vars: HashMap<u32, Range>,
    /// A tensor's shape (tensor expressions).
    shapes: &'a dyn Fn(u32) -> Option<Vec<i64>>,
    /// A buffer's flat size (loop IR).
    sizes: &'a dyn Fn(u32) -> Option<i64>,
}

impl<'a> Walker<'a> {
    /// Visits every load of `e` under `facts`, the conditions that hold where `e` is evaluated.
    fn walk<'e>(&self, e: &'e Expr, facts: &mut Vec<Fact<'e>>) -> Result<(), OutOfBounds> {
        match e {
            Expr::Load {
                tensor, indices, ..
            } => {
                let shape = (self.shapes)(tensor.0).unwrap_or_default();
                for (dim, index) in indices.iter().enumerate() {
                    let range = self.range(index, facts);
                    let extent = shape.get(dim).copied().unwrap_or(0);
                    let inside = matches!(range, Some((lo, hi)) if lo >= 0 && hi < extent);
                    if !inside {
                        return Err(OutOfBounds {
                            tensor: tensor.0,
                            dim,
                            index: index.to_string(),
                            range,
                        });
                    }
                    self.walk(index, facts)?;
                }
                Ok(())
            }
            Expr::Select(c, t, f) => {
                self.walk(c, facts)?;
                let n = facts.len();
                self.assume(c, true, facts);
                let r = self.walk(t, facts);
                facts.truncate(n);
                r?;
                self.assume(c, false, facts);
                let r = self.walk(f, facts);
                facts.truncate(n);
                r
            }
            Expr::Bin(_, a, b)
            | Expr::Cmp(_, a, b)
            | Expr::And(a, b)
            | Expr::Or(a, b)
            | Expr::Pair(_, a, b) => {
                self.walk(a, facts)?;
                self.walk(b, facts)
            }
            Expr::Not(a) | Expr::Cast(_, a) | Expr::Call(_, a) => self.walk(a, facts),
            Expr::Reduce { source, .. } => self.walk(source, facts),
            Expr::BufLoad { buf, index, .. } => {
                self.check_flat(buf.0, index, facts)?;
                self.walk(index, facts)
            }
            Expr::Const(_) | Expr::Var(_) => Ok(()),
        }
    }

    /// An access of buffer `buf` at the flat `index`.
    fn check_flat(&self, buf: u32, index: &Expr, facts: &[Fact<'_>]) -> Result<(), OutOfBounds> {
        let range = self.range(index, facts);
        let size = (self.sizes)(buf).unwrap_or(0);
        match range {
            Some((lo, hi)) if lo >= 0 && hi < size => Ok(()),
            _ => Err(OutOfBounds {
                tensor: buf,
                dim: 0,
                index: index.to_string(),
                range,
            }),
        }
    }

    /// Visits every access of the statement `s` under `facts`.
    fn stmt<'e>(&mut self, s: &'e Stmt, facts: &mut Vec<Fact<'e>>) -> Result<(), OutOfBounds> {
        match s {
            Stmt::For {
                var, extent, body, ..
            } => {
                let before = self.vars.insert(var.id, (0, extent.saturating_sub(1)));
                let r = self.stmt(body, facts);
                match before {
                    Some(b) => self.vars.insert(var.id, b),
                    None => self.vars.remove(&var.id),
                };
                r
            }
            Stmt::Store {
                buf, index, value, ..
            }
            | Stmt::Shuffle {
                buf, index, value, ..
            } => {
                self.check_flat(buf.0, index, facts)?;
                self.walk(index, facts)?;
                self.walk(value, facts)
            }
            Stmt::Allocate { body, .. } => self.stmt(body, facts),
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                self.walk(cond, facts)?;
                let n = facts.len();
                self.assume(cond, true, facts);
                let r = self.stmt(then, facts);
                facts.truncate(n);
                r?;
                if let Some(o) = otherwise {
                    self.assume(cond, false, facts);
                    let r = self.stmt(o, facts);
                    facts.truncate(n);
                    r?;
                }
                Ok(())
            }
            Stmt::Seq(items) => items.iter().try_for_each(|i| self.stmt(i, facts)),
            // A prefetch reads and writes nothing and never faults (see `Stmt::Prefetch`).
            Stmt::Sync | Stmt::Prefetch { .. } => Ok(()),
        }
    }

    /// Adds to `facts` what `cond` being `holds` says.
    fn assume<'e>(&self, cond: &'e Expr, holds: bool, facts: &mut Vec<Fact<'e>>) {
        match (cond, holds) {
            (Expr::Not(c), _) => self.assume(c, !holds, facts),
            (Expr::And(a, b), true) | (Expr::Or(a, b), false) => {
                self.assume(a, holds, facts);
                self.assume(b, holds, facts);
            }
            (Expr::Cmp(op, a, b), _) => {
                let op = if holds { *op } else { negate(*op) };
                let (Some(ra), Some(rb)) = (self.range(a, facts), self.range(b, facts)) else {
                    return;
                };
                // a OP b narrows a by b's range and b by a's.
                let (na, nb) = match op {
                    CmpOp::Lt => (
                        (i64::MIN, rb.1.saturating_sub(1)),
                        (ra.0.saturating_add(1), i64::MAX),
                    ),
                    CmpOp::Le => ((i64::MIN, rb.1), (ra.0, i64::MAX)),
                    CmpOp::Gt => (
                        (rb.0.saturating_add(1), i64::MAX),
                        (i64::MIN, ra.1.saturating_sub(1)),
                    ),
                    CmpOp::Ge => ((rb.0, i64::MAX), (i64::MIN, ra.1)),
                    CmpOp::Eq => (rb, ra),
                    CmpOp::Ne => return,
                };
                facts.push((a, na));
                facts.push((b, nb));
            }
            _ => {}
        }
    }

    /// The range of the integer expression `e` under `facts`; `None` where it is not an
    /// integer or cannot be bounded.
    fn range(&self, e: &Expr, facts: &[Fact<'_>]) -> Option<Range> {
        let mut r = self.structural(e, facts)?;
        for (f, (lo, hi)) in facts {
            if *f == e {
                r = (r.0.max(*lo), r.1.min(*hi));
            }
        }
        Some(r)
    }

    fn structural(&self, e: &Expr, facts: &[Fact<'_>]) -> Option<Range> {
        Some(match e {
            Expr::Const(Const::I32(c)) => (i64::from(*c), i64::from(*c)),
            Expr::Const(Const::I64(c)) => (*c, *c),
            Expr::Var(v) => *self.vars.get(&v.id)?,
            Expr::Bin(op, a, b) => {
                let (a, b) = (self.range(a, facts)?, self.range(b, facts)?);
                match op {
                    BinOp::Add => (a.0.checked_add(b.0)?, a.1.checked_add(b.1)?),
                    BinOp::Sub => (a.0.checked_sub(b.1)?, a.1.checked_sub(b.0)?),
                    BinOp::Mul => corners(a, b, i64::checked_mul)?,
                    // Floor division: monotone in each operand on a divisor range of one sign.
                    BinOp::Div if b.0 > 0 || b.1 < 0 => corners(a, b, floor_div)?,
                    BinOp::Div => return None,
                    BinOp::Mod if b.0 > 0 => {
                        if a.0 >= 0 && a.1 < b.0 {
                            a
                        } else {
                            (0, b.1 - 1)
                        }
                    }
                    BinOp::Mod if b.1 < 0 => (b.0.checked_add(1)?, 0),
                    BinOp::Mod => return None,
                    BinOp::Min => (a.0.min(b.0), a.1.min(b.1)),
                    BinOp::Max => (a.0.max(b.0), a.1.max(b.1)),
                }
            }
            Expr::Select(c, t, f) => {
                let mut with = facts.to_vec();
                self.assume(c, true, &mut with);
                let t = self.range(t, &with)?;
                let mut with = facts.to_vec();
                self.assume(c, false, &mut with);
                let f = self.range(f, &with)?;
                (t.0.min(f.0), t.1.max(f.1))
            }
            // An integer's cast to a type that holds its whole range keeps it; anything else
            // (a float truncated, an i64 wrapped into 32 bits) is bounded by the type alone.
            Expr::Cast(DType::I64, a) => self.range(a, facts).unwrap_or((i64::MIN, i64::MAX)),
            Expr::Cast(DType::I32, a) => match self.range(a, facts) {
                Some(r) if r.0 >= i64::from(i32::MIN) && r.1 <= i64::from(i32::MAX) => r,
                _ => (i64::from(i32::MIN), i64::from(i32::MAX)),
            },
            Expr::Load {
                dtype: DType::I32, ..
            } => (i64::from(i32::MIN), i64::from(i32::MAX)),
            _ => return None,
        })
    }
}

fn negate(op: CmpOp) -> CmpOp {
    match op {
        CmpOp::Lt => CmpOp::Ge,
        CmpOp::Le => CmpOp::Gt,
        CmpOp::Gt => CmpOp::Le,
        CmpOp::Ge => CmpOp::Lt,
        CmpOp::Eq => CmpOp::Ne,
        CmpOp::Ne => CmpOp::Eq,
    }
}

fn floor_div(a: i64, b: i64) -> Option<i64> {
    let q = a.checked_div(b)?;
    Some(if (a % b != 0) && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    })
}

/// The least and greatest of `f` over the four corners: exact for an operation monotone in
/// each operand over ranges of one sign, and for multiplication.
fn corners(a: Range, b: Range, f: fn(i64, i64) -> Option<i64>) -> Option<Range> {
    let v = [f(a.0, b.0)?, f(a.0, b.1)?, f(a.1, b.0)?, f(a.1, b.1)?];
    Some((*v.iter().min()?, *v.iter().max()?))
}

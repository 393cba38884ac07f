//! The loop-IR interpreter: runs a [`LoweredFunc`] on host data.
//!
//! It follows the IR's semantics exactly and checks what compiled code cannot: every index is
//! in bounds, and no element is read before it is written (temporaries start uninitialized at
//! each execution of their `Allocate`; outputs start uninitialized and must be fully written).
//! Loops of every kind run serially in order, which is a valid order for all of them.
//!
//! The buffer bookkeeping here (parameters bound from the inputs, bounds and initialization
//! checks, outputs collected) is shared with the GPU lockstep interpreter
//! ([`crate::gpu::interp`]), so that the two references agree on every convention.

use crate::data::{Data, NdData};
use crate::expr::{BufId, Expr};
use crate::ir::{BufKind, LoweredFunc, Stmt};
use crate::scalar::{self, Env, EvalError, Value};

/// One live buffer: its elements and which of them have been written.
pub(crate) struct Buf {
    data: Data,
    written: Vec<bool>,
}

impl Buf {
    /// A fresh, uninitialized instance of buffer `id` of `f`.
    pub(crate) fn fresh(f: &LoweredFunc, id: BufId) -> Result<Buf, EvalError> {
        let d = f.buffer(id);
        let n = d.size() as usize;
        let data = Data::zeros(d.dtype, n)
            .map_err(|e| EvalError::Unsupported(format!("buffer of {}: {e}", d.dtype)))?;
        Ok(Buf {
            data,
            written: vec![false; n],
        })
    }

    /// The element offset of flat index `i`, or the out-of-bounds error naming `name`.
    pub(crate) fn offset(&self, i: i64, name: &str) -> Result<usize, EvalError> {
        if i < 0 || i as usize >= self.data.len() {
            return Err(EvalError::OutOfBounds {
                name: name.to_string(),
                index: i,
                size: self.data.len() as i64,
            });
        }
        Ok(i as usize)
    }

    /// Element `k` (an offset from [`Buf::offset`]), an error if it was never written.
    pub(crate) fn get(&self, k: usize, name: &str) -> Result<Value, EvalError> {
        if !self.written[k] {
            return Err(EvalError::Uninitialized {
                name: name.to_string(),
                index: k as i64,
            });
        }
        Ok(Value::read(&self.data, k))
    }

    /// Writes element `k` (an offset from [`Buf::offset`]).
    pub(crate) fn set(&mut self, k: usize, v: Value) {
        v.write(&mut self.data, k);
        self.written[k] = true;
    }
}

/// A `Store`'s index, evaluated and checked to be an integer.
pub(crate) fn eval_index(e: &Expr, env: &mut impl Env) -> Result<i64, EvalError> {
    scalar::eval(e, env)?
        .as_i64()
        .ok_or_else(|| EvalError::Unsupported("non-integer index".into()))
}

/// The truth of an `If`'s condition.
pub(crate) fn eval_cond(e: &Expr, env: &mut impl Env) -> Result<bool, EvalError> {
    scalar::eval(e, env)?
        .as_bool()
        .ok_or_else(|| EvalError::Unsupported("non-bool condition".into()))
}

/// The buffer a loop-IR load reads (a tensor `Load` has no place in the loop IR).
pub(crate) fn load_buf(e: &Expr) -> Result<BufId, EvalError> {
    match e {
        Expr::BufLoad { buf, .. } => Ok(*buf),
        _ => Err(EvalError::Unsupported("tensor load in loop IR".into())),
    }
}

/// The parameters of `f` bound for a run, with their buffers (each input checked against its
/// declaration and fully initialized, each output fresh and uninitialized), and the outputs'
/// ids in parameter order.
pub(crate) type Params = (Vec<(BufId, Buf)>, Vec<BufId>);

/// Binds `inputs` (in parameter order) and fresh outputs to the parameters of `f`.
pub(crate) fn bind_params(f: &LoweredFunc, inputs: &[NdData]) -> Result<Params, EvalError> {
    let of_kind = |want_input: bool| -> Vec<BufId> {
        f.params
            .iter()
            .copied()
            .filter(|p| match f.buffer(*p).kind {
                BufKind::Input(_) => want_input,
                BufKind::Output(_) => !want_input,
                BufKind::Temp => false,
            })
            .collect()
    };
    let ins = of_kind(true);
    if ins.len() != inputs.len() {
        return Err(EvalError::BadInput(format!(
            "expected {} inputs, got {}",
            ins.len(),
            inputs.len()
        )));
    }
    let mut bound = Vec::with_capacity(f.params.len());
    for (id, x) in ins.iter().zip(inputs) {
        let d = f.buffer(*id);
        if d.shape != x.shape || d.dtype != x.data.dtype() || !x.is_consistent() {
            return Err(EvalError::BadInput(format!(
                "`{}` wants {}{:?}, got {} values of {}{:?}",
                d.name,
                d.dtype,
                d.shape,
                x.data.len(),
                x.data.dtype(),
                x.shape
            )));
        }
        let b = Buf {
            data: x.data.clone(),
            written: vec![true; x.data.len()],
        };
        bound.push((*id, b));
    }
    let outs = of_kind(false);
    for &o in &outs {
        bound.push((o, Buf::fresh(f, o)?));
    }
    Ok((bound, outs))
}

/// Output `o` of `f` as host data, an error if any element was never written.
pub(crate) fn collect_output(
    f: &LoweredFunc,
    o: BufId,
    b: Option<Buf>,
) -> Result<NdData, EvalError> {
    let b = b.ok_or_else(|| EvalError::Unsupported("output vanished".into()))?;
    if let Some(k) = b.written.iter().position(|w| !w) {
        return Err(EvalError::Uninitialized {
            name: format!("{} (never written)", f.buffer(o).name),
            index: k as i64,
        });
    }
    Ok(NdData {
        shape: f.buffer(o).shape.clone(),
        data: b.data,
    })
}

struct Machine<'a> {
    f: &'a LoweredFunc,
    vars: Vec<i64>,
    bufs: Vec<Option<Buf>>,
}

impl Env for Machine<'_> {
    fn var(&self, id: u32) -> Result<i64, EvalError> {
        self.vars
            .get(id as usize)
            .copied()
            .ok_or_else(|| EvalError::Unsupported(format!("variable #{id} out of range")))
    }
    fn load(&mut self, e: &Expr, indices: &[i64]) -> Result<Value, EvalError> {
        let buf = load_buf(e)?;
        let i = indices.first().copied().unwrap_or(0);
        let b = self.buf(buf)?;
        let name = &self.f.buffer(buf).name;
        b.get(b.offset(i, name)?, name)
    }
}

impl Machine<'_> {
    fn buf(&self, id: BufId) -> Result<&Buf, EvalError> {
        self.bufs
            .get(id.0 as usize)
            .and_then(|b| b.as_ref())
            .ok_or_else(|| EvalError::Unsupported(format!("buffer #{} is not live", id.0)))
    }

    fn run(&mut self, s: &Stmt) -> Result<(), EvalError> {
        match s {
            Stmt::For {
                var, extent, body, ..
            } => {
                for i in 0..*extent {
                    self.vars[var.id as usize] = i;
                    self.run(body)?;
                }
                Ok(())
            }
            Stmt::Store { buf, index, value } => {
                let i = eval_index(index, self)?;
                let v = scalar::eval(value, self)?;
                let name = &self.f.buffer(*buf).name;
                let b = self
                    .bufs
                    .get_mut(buf.0 as usize)
                    .and_then(|b| b.as_mut())
                    .ok_or_else(|| {
                        EvalError::Unsupported(format!("store to `{name}`, not live"))
                    })?;
                let k = b.offset(i, name)?;
                b.set(k, v);
                Ok(())
            }
            Stmt::Allocate { buf, body } => {
                let fresh = Buf::fresh(self.f, *buf)?;
                let saved = self.bufs[buf.0 as usize].replace(fresh);
                let r = self.run(body);
                self.bufs[buf.0 as usize] = saved;
                r
            }
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                if eval_cond(cond, self)? {
                    self.run(then)
                } else if let Some(o) = otherwise {
                    self.run(o)
                } else {
                    Ok(())
                }
            }
            Stmt::Seq(v) => v.iter().try_for_each(|x| self.run(x)),
            // A hint: it reads and writes nothing.
            Stmt::Sync | Stmt::Prefetch { .. } => Ok(()),
            // One thread has no warp to exchange with.
            Stmt::Shuffle { .. } => Err(EvalError::Unsupported(
                "a warp shuffle runs only on a GPU (the lockstep interpreter runs it)".into(),
            )),
        }
    }
}

/// Runs `f` on `inputs` (in parameter order); returns the outputs.
pub fn run(f: &LoweredFunc, inputs: &[NdData]) -> Result<Vec<NdData>, EvalError> {
    let mut m = Machine {
        f,
        vars: vec![0; f.num_vars as usize],
        bufs: (0..f.buffers.len()).map(|_| None).collect(),
    };
    let (params, outs) = bind_params(f, inputs)?;
    for (id, b) in params {
        m.bufs[id.0 as usize] = Some(b);
    }
    m.run(&f.body)?;
    outs.iter()
        .map(|&o| collect_output(f, o, m.bufs[o.0 as usize].take()))
        .collect()
}

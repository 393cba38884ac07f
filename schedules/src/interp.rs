//! The loop-IR interpreter: runs a [`LoweredFunc`] on host data.
//!
//! It follows the IR's semantics exactly and checks what compiled code cannot: every index is
//! in bounds, and no element is read before it is written (temporaries start uninitialized at
//! each execution of their `Allocate`; outputs start uninitialized and must be fully written).
//! Loops of every kind run serially in order, which is a valid order for all of them.

use crate::data::{Data, NdData};
use crate::expr::{BufId, Expr};
use crate::ir::{BufKind, LoweredFunc, Stmt};
use crate::scalar::{self, Env, EvalError, Value};

struct Buf {
    data: Data,
    written: Vec<bool>,
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
        let Expr::BufLoad { buf, .. } = e else {
            return Err(EvalError::Unsupported("tensor load in loop IR".into()));
        };
        let i = indices.first().copied().unwrap_or(0);
        let b = self.buf(*buf)?;
        let k = in_bounds(&b.data, i, &self.f.buffer(*buf).name)?;
        if !b.written[k] {
            return Err(EvalError::Uninitialized {
                name: self.f.buffer(*buf).name.clone(),
                index: i,
            });
        }
        Ok(Value::read(&b.data, k))
    }
}

fn in_bounds(d: &Data, i: i64, name: &str) -> Result<usize, EvalError> {
    if i < 0 || i as usize >= d.len() {
        return Err(EvalError::OutOfBounds {
            name: name.to_string(),
            index: i,
            size: d.len() as i64,
        });
    }
    Ok(i as usize)
}

impl Machine<'_> {
    fn buf(&self, id: BufId) -> Result<&Buf, EvalError> {
        self.bufs
            .get(id.0 as usize)
            .and_then(|b| b.as_ref())
            .ok_or_else(|| EvalError::Unsupported(format!("buffer #{} is not live", id.0)))
    }

    fn fresh(&self, id: BufId) -> Result<Buf, EvalError> {
        let d = self.f.buffer(id);
        let n = d.size() as usize;
        let data = Data::zeros(d.dtype, n)
            .map_err(|e| EvalError::Unsupported(format!("buffer of {}: {e}", d.dtype)))?;
        Ok(Buf {
            data,
            written: vec![false; n],
        })
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
                let i = scalar::eval(index, self)?
                    .as_i64()
                    .ok_or_else(|| EvalError::Unsupported("non-integer index".into()))?;
                let v = scalar::eval(value, self)?;
                let name = &self.f.buffer(*buf).name;
                let b = self
                    .bufs
                    .get_mut(buf.0 as usize)
                    .and_then(|b| b.as_mut())
                    .ok_or_else(|| {
                        EvalError::Unsupported(format!("store to `{name}`, not live"))
                    })?;
                let k = in_bounds(&b.data, i, name)?;
                v.write(&mut b.data, k);
                b.written[k] = true;
                Ok(())
            }
            Stmt::Allocate { buf, body } => {
                let fresh = self.fresh(*buf)?;
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
                let c = scalar::eval(cond, self)?
                    .as_bool()
                    .ok_or_else(|| EvalError::Unsupported("non-bool condition".into()))?;
                if c {
                    self.run(then)
                } else if let Some(o) = otherwise {
                    self.run(o)
                } else {
                    Ok(())
                }
            }
            Stmt::Seq(v) => v.iter().try_for_each(|x| self.run(x)),
            Stmt::Sync => Ok(()),
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
    let ins: Vec<BufId> = f
        .params
        .iter()
        .copied()
        .filter(|p| matches!(f.buffer(*p).kind, BufKind::Input(_)))
        .collect();
    if ins.len() != inputs.len() {
        return Err(EvalError::BadInput(format!(
            "expected {} inputs, got {}",
            ins.len(),
            inputs.len()
        )));
    }
    for (id, x) in ins.iter().zip(inputs) {
        let d = f.buffer(*id);
        if d.shape != x.shape || d.dtype != x.data.dtype() {
            return Err(EvalError::BadInput(format!(
                "`{}` wants {}{:?}, got {}{:?}",
                d.name,
                d.dtype,
                d.shape,
                x.data.dtype(),
                x.shape
            )));
        }
        m.bufs[id.0 as usize] = Some(Buf {
            data: x.data.clone(),
            written: vec![true; x.data.len()],
        });
    }
    let outs: Vec<BufId> = f
        .params
        .iter()
        .copied()
        .filter(|p| matches!(f.buffer(*p).kind, BufKind::Output(_)))
        .collect();
    for &o in &outs {
        m.bufs[o.0 as usize] = Some(m.fresh(o)?);
    }
    m.run(&f.body)?;
    outs.iter()
        .map(|&o| {
            let b = m.bufs[o.0 as usize]
                .take()
                .ok_or_else(|| EvalError::Unsupported("output vanished".into()))?;
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
        })
        .collect()
}

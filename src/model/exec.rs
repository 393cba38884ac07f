//! The executor: a model's steps in order over aligned buffers.
//!
//! A kernel's parameters may be shaped differently from the ONNX values bound to them (a
//! bias `[K]` read as `[K, 1, 1]`, a grouped convolution's `[N, G, K/G, P, Q]` result), but
//! always with the same elements in the same row-major order (see
//! `tensortune_model::ops`); so the executor checks each operand's element count and dtype
//! against the parameter and passes the buffer as it is.

use super::{Error, Model};
use crate::runtime::AlignedBuffer;
use ndarray::{ArrayD, ArrayViewD, IxDyn};
use std::time::Instant;
use tensortune_model::graph::Data;
use tensortune_model::{Plan, Step, ValueId};
use tensortune_schedules::DType;

/// How long one step of an inference took.
#[derive(Clone, Debug)]
pub struct StepTime {
    /// The nodes it covers.
    pub name: String,
    /// The task it ran (`None` for a layout step).
    pub task: Option<usize>,
    /// The op types, e.g. `Conv+Relu` or `Reshape`.
    pub ops: String,
    /// Seconds.
    pub seconds: f64,
}

/// What a model keeps between runs: its constants as buffers and when each value is last read.
pub(super) struct Constants {
    buffers: Vec<Option<AlignedBuffer>>,
    /// Per step, the values no later step reads and no caller receives: freed after it.
    free_after: Vec<Vec<ValueId>>,
}

fn buffer_of(view: &ArrayViewD<'_, f32>) -> Result<AlignedBuffer, String> {
    copy_into(view, fresh(view.len())?)
}

/// A new zeroed f32 buffer of `len` elements.
fn fresh(len: usize) -> Result<AlignedBuffer, String> {
    AlignedBuffer::zeros(&[len as i64], DType::F32).map_err(|e| e.to_string())
}

/// `view`'s elements, in row-major order, into `b` (of as many elements).
fn copy_into(view: &ArrayViewD<'_, f32>, mut b: AlignedBuffer) -> Result<AlignedBuffer, String> {
    let dst = b.as_mut_slice::<f32>().map_err(|e| e.to_string())?;
    if dst.len() != view.len() {
        return Err(format!(
            "{} elements into a buffer of {}",
            view.len(),
            dst.len()
        ));
    }
    match view.as_slice() {
        // Row-major and contiguous (every array a run makes, and most callers'): one copy.
        // Element by element, a dynamic-rank iterator costs nanoseconds per element, a
        // visible share of a small CNN's latency (docs/measurements.md).
        Some(src) => dst.copy_from_slice(src),
        None => {
            for (d, s) in dst.iter_mut().zip(view.iter()) {
                *d = *s;
            }
        }
    }
    Ok(b)
}

/// Buffers of earlier runs, reused by later ones: one inference of a model needs the same
/// sizes every time, and a fresh allocation of a few hundred KiB each step costs its page
/// faults again (a third of a small CNN's latency before the pool). A kernel writes every
/// element of its output, so a reused buffer needs no clearing.
#[derive(Default)]
pub(super) struct BufferPool {
    free: std::sync::Mutex<Vec<AlignedBuffer>>,
}

impl BufferPool {
    /// Takes every pooled buffer (a concurrent run finds the pool empty and allocates).
    fn take(&self) -> Vec<AlignedBuffer> {
        self.free
            .lock()
            .map(|mut f| std::mem::take(&mut *f))
            .unwrap_or_default()
    }

    /// Gives buffers back.
    fn give(&self, buffers: Vec<AlignedBuffer>) {
        if let Ok(mut f) = self.free.lock() {
            f.extend(buffers);
        }
    }
}

/// An f32 buffer of `len` elements from `free`, or a new one.
fn alloc(free: &mut Vec<AlignedBuffer>, len: usize) -> Result<AlignedBuffer, String> {
    match free
        .iter()
        .position(|b| b.len() == len && b.dtype() == DType::F32)
    {
        Some(i) => Ok(free.swap_remove(i)),
        None => fresh(len),
    }
}

impl Constants {
    pub(super) fn new(plan: &Plan) -> Result<Constants, Error> {
        let g = &plan.graph;
        let mut buffers: Vec<Option<AlignedBuffer>> = (0..g.values.len()).map(|_| None).collect();
        let mut last_use = vec![0usize; g.values.len()];
        let mut read = |v: ValueId, at: usize| -> Result<(), Error> {
            last_use[v.index()] = last_use[v.index()].max(at);
            if buffers[v.index()].is_none() {
                match g.constant(v) {
                    Some(Data::F32(a)) => {
                        let b = buffer_of(&a.view()).map_err(|reason| Error::Run {
                            step: "load".into(),
                            reason,
                        })?;
                        buffers[v.index()] = Some(b);
                    }
                    // Integer tensors exist only at import (see tensortune_model::graph).
                    Some(Data::I64(_)) => {
                        return Err(Error::Import(tensortune_model::ModelError::Unsupported {
                            node: g.value(v).name.clone(),
                            op: "(value)".into(),
                            reason: "an integer tensor at run time".into(),
                        }))
                    }
                    None => {}
                }
            }
            Ok(())
        };
        for (at, step) in plan.steps.iter().enumerate() {
            let reads = match step {
                Step::Kernel { operands, .. } => operands,
                Step::Layout { inputs, .. } => inputs,
            };
            for &v in reads {
                read(v, at)?;
            }
        }
        for &o in &g.outputs {
            read(o, 0)?;
        }
        for &o in &g.outputs {
            last_use[o.index()] = usize::MAX;
        }
        let mut free_after = vec![Vec::new(); plan.steps.len()];
        for (v, &at) in last_use.iter().enumerate() {
            if let Some(list) = free_after.get_mut(at) {
                list.push(ValueId(v as u32));
            }
        }
        Ok(Constants {
            buffers,
            free_after,
        })
    }
}

/// The buffer of `v`: computed in this run, or a constant.
fn value<'a>(
    vals: &'a [Option<AlignedBuffer>],
    model: &'a Model,
    v: ValueId,
    step: &str,
) -> Result<&'a AlignedBuffer, Error> {
    vals[v.index()]
        .as_ref()
        .or(model.consts.buffers[v.index()].as_ref())
        .ok_or_else(|| Error::Run {
            step: step.to_string(),
            reason: format!(
                "reads `{}`, which is not computed (an integer tensor?)",
                model.plan.graph.value(v).name
            ),
        })
}

fn view_of<'a>(b: &'a AlignedBuffer, shape: &[usize]) -> Result<ArrayViewD<'a, f32>, String> {
    let s = b.as_slice::<f32>().map_err(|e| e.to_string())?;
    ArrayViewD::from_shape(IxDyn(shape), s).map_err(|e| e.to_string())
}

/// Runs `model` on `inputs`; with `timed`, also the time of each step.
pub(super) fn run(
    model: &Model,
    inputs: &[ArrayViewD<'_, f32>],
    timed: bool,
) -> Result<(Vec<ArrayD<f32>>, Vec<StepTime>), Error> {
    let g = &model.plan.graph;
    if inputs.len() != g.inputs.len() {
        return Err(Error::Inputs(format!(
            "the model takes {} inputs, got {}",
            g.inputs.len(),
            inputs.len()
        )));
    }
    let mut free = model.pool.take();
    let result = run_with(model, inputs, timed, &mut free);
    model.pool.give(free);
    result
}

fn run_with(
    model: &Model,
    inputs: &[ArrayViewD<'_, f32>],
    timed: bool,
    free: &mut Vec<AlignedBuffer>,
) -> Result<(Vec<ArrayD<f32>>, Vec<StepTime>), Error> {
    let g = &model.plan.graph;
    let mut vals: Vec<Option<AlignedBuffer>> = (0..g.values.len()).map(|_| None).collect();
    let result = steps(model, inputs, timed, free, &mut vals);
    free.extend(vals.into_iter().flatten());
    result
}

fn steps(
    model: &Model,
    inputs: &[ArrayViewD<'_, f32>],
    timed: bool,
    free: &mut Vec<AlignedBuffer>,
    vals: &mut [Option<AlignedBuffer>],
) -> Result<(Vec<ArrayD<f32>>, Vec<StepTime>), Error> {
    let g = &model.plan.graph;
    for (a, &v) in inputs.iter().zip(&g.inputs) {
        let want = &g.value(v).shape;
        if a.shape() != want.as_slice() {
            return Err(Error::Inputs(format!(
                "input `{}` must have shape {want:?}, got {:?}",
                g.value(v).name,
                a.shape()
            )));
        }
        let b = alloc(free, a.len()).map_err(Error::Inputs)?;
        vals[v.index()] = Some(copy_into(a, b).map_err(Error::Inputs)?);
    }
    let mut times = Vec::new();
    for (at, step) in model.plan.steps.iter().enumerate() {
        let start = timed.then(Instant::now);
        let name = match step {
            Step::Kernel {
                task,
                name,
                operands,
                output,
            } => {
                let len = g.value(*output).shape.iter().product();
                let out = alloc(free, len).map_err(|reason| Error::Run {
                    step: name.clone(),
                    reason,
                })?;
                let out = run_kernel(model, vals, *task, name, operands, *output, out)?;
                vals[output.index()] = Some(out);
                name
            }
            Step::Layout {
                name,
                layout,
                inputs,
                output,
                ..
            } => {
                let views = inputs
                    .iter()
                    .map(|&v| {
                        view_of(value(vals, model, v, name)?, &g.value(v).shape).map_err(|reason| {
                            Error::Run {
                                step: name.clone(),
                                reason,
                            }
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let out_shape = &g.value(*output).shape;
                let fill = match layout {
                    tensortune_model::layout::Layout::Map { fill, .. } => *fill,
                    _ => 0.0,
                };
                let a = layout
                    .apply(&views, out_shape, fill)
                    .ok_or_else(|| Error::Run {
                        step: name.clone(),
                        reason: "the layout op did not apply".into(),
                    })?;
                let b = alloc(free, a.len())
                    .and_then(|b| copy_into(&a.view(), b))
                    .map_err(|reason| Error::Run {
                        step: name.clone(),
                        reason,
                    })?;
                vals[output.index()] = Some(b);
                name
            }
        };
        if let Some(t) = start {
            let (task, ops) = match step {
                Step::Kernel { task, .. } => (Some(*task), model.tasks[*task].ops.clone()),
                Step::Layout { op, .. } => (None, op.clone()),
            };
            times.push(StepTime {
                name: name.clone(),
                task,
                ops,
                seconds: t.elapsed().as_secs_f64(),
            });
        }
        for v in &model.consts.free_after[at] {
            free.extend(vals[v.index()].take());
        }
    }
    let mut outs = Vec::with_capacity(g.outputs.len());
    for &o in &g.outputs {
        let b = value(vals, model, o, "output")?;
        let a = view_of(b, &g.value(o).shape).map_err(|reason| Error::Run {
            step: "output".into(),
            reason,
        })?;
        outs.push(a.to_owned());
    }
    Ok((outs, times))
}

/// Runs one kernel step into `out`, a buffer of its output's element count.
fn run_kernel(
    model: &Model,
    vals: &[Option<AlignedBuffer>],
    task: usize,
    name: &str,
    operands: &[ValueId],
    output: ValueId,
    mut out: AlignedBuffer,
) -> Result<AlignedBuffer, Error> {
    let g = &model.plan.graph;
    let kernel = &model.kernels[task];
    let err = |reason: String| Error::Run {
        step: name.to_string(),
        reason,
    };
    let shape = &g.value(output).shape;
    let params = kernel.params();
    if params.len() != operands.len() + 1 {
        return Err(err(format!(
            "the kernel takes {} buffers, the step binds {}",
            params.len(),
            operands.len() + 1
        )));
    }
    let mut ptrs = Vec::with_capacity(params.len());
    for (p, &v) in params.iter().zip(operands) {
        let b = value(vals, model, v, name)?;
        let want: i64 = p.shape.iter().product();
        if p.output || p.dtype != DType::F32 || b.len() as i64 != want {
            return Err(err(format!(
                "`{}` has {} elements where `{}` takes {want}",
                g.value(v).name,
                b.len(),
                p.name
            )));
        }
        ptrs.push(b.as_ptr() as *mut u8);
    }
    let last = &params[operands.len()];
    if !last.output || last.shape.iter().product::<i64>() != out.len() as i64 {
        return Err(err(format!(
            "the kernel's output `{}` does not fit {:?}",
            last.name, shape
        )));
    }
    ptrs.push(out.as_mut_ptr());
    // SAFETY: one pointer per parameter, in parameter order, each to a 64-byte aligned f32
    // buffer with exactly the parameter's element count (checked above; the layouts agree
    // element for element, see the module doc); the output is a buffer no value of this run
    // holds (fresh, or freed after its last reader), so no input aliases it, and the inputs
    // are only read.
    let code = unsafe { kernel.call_raw(&ptrs, &model.rt) };
    kernel.status(code).map_err(|e| err(e.to_string()))?;
    Ok(out)
}

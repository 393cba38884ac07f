// The network engine of a generated module that holds whole models: `tensortune::build`
// copies this file verbatim after src/build/rt.rs (whose runtime table, aligned vectors and
// error type it uses) into a module built with `Build::model`, and then writes, per model, a
// submodule of tables for it: its steps, its tasks' kernels, its arena and its weights. It
// needs nothing but `std`. Plain `//` comments only: the module is pulled in by `include!`.
//
// Everything about the network is decided when the module is generated: which value lives in
// which buffer (values whose lifetimes do not overlap share one; a reshape is a new name for
// its input's buffer), where each weight lies in the weights blob, what each layout op reads.
// A run therefore allocates nothing but its outputs, and `Model::new` checks every table
// against the sizes of the buffers once, so that no table can make a kernel or a copy read or
// write outside a buffer.

/// A buffer a step reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// The model's input `i`, copied into an aligned buffer of the model at each run.
    Input(usize),
    /// Weight `i`, read in place from the weights blob of the binary.
    Const(usize),
    /// Buffer `i` of the model's arena.
    Arena(usize),
}

/// A kernel's packed entry point (see `tensortune::runtime::abi`).
pub type PackedFn = unsafe extern "C" fn(args: *const *mut c_void, rt: *const TtRuntime) -> i32;

/// One compiled task of a model.
#[derive(Clone, Copy)]
pub struct Task {
    /// The task's key in the records.
    pub key: &'static str,
    /// The ONNX ops it fuses, e.g. `Conv+Relu`.
    pub ops: &'static str,
    /// Where its program came from (a record, or the default schedule).
    pub source: &'static str,
    /// Its code.
    pub func: PackedFn,
    /// The element counts of its parameters, inputs first, the output last.
    pub lens: &'static [usize],
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task")
            .field("key", &self.key)
            .field("ops", &self.ops)
            .field("source", &self.source)
            .finish()
    }
}

/// One step of an inference.
#[derive(Clone, Copy, Debug)]
pub enum Step {
    /// Task `task` on `args` (in its parameters' order) into `out`.
    Kernel {
        /// The nodes it covers.
        name: &'static str,
        /// The task.
        task: usize,
        /// Its inputs.
        args: &'static [Slot],
        /// Its output.
        out: Slot,
    },
    /// `out[j0, j1, ...] = from[axes[0][j0] + axes[1][j1] + ...]`, `fill` where an offset is
    /// -1: a transpose, a pad, a slice, a nearest resize, an expand.
    Gather {
        /// The node.
        name: &'static str,
        /// The input.
        from: Slot,
        /// The output.
        out: Slot,
        /// Per output axis, the input offset of each coordinate.
        axes: &'static [&'static [i64]],
        /// The value of unmapped coordinates.
        fill: f32,
    },
    /// The inputs joined: `outer` rows, each the inputs' rows of `inners[k]` elements in turn.
    Concat {
        /// The node.
        name: &'static str,
        /// The inputs.
        from: &'static [Slot],
        /// The output.
        out: Slot,
        /// Rows.
        outer: usize,
        /// Elements of a row of each input.
        inners: &'static [usize],
    },
}

impl Step {
    fn name(&self) -> &'static str {
        match self {
            Step::Kernel { name, .. } | Step::Gather { name, .. } | Step::Concat { name, .. } => {
                name
            }
        }
    }
}

/// An input or output of a model.
#[derive(Clone, Copy, Debug)]
pub struct Io {
    /// Its name in the ONNX graph.
    pub name: &'static str,
    /// Its shape; its elements are row-major.
    pub shape: &'static [usize],
    /// Where it lives.
    pub slot: Slot,
}

impl Io {
    /// Its element count.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A model as tables, generated once per model.
#[derive(Debug)]
pub struct NetDesc {
    /// The model's name in the module.
    pub name: &'static str,
    /// Its inputs, in order.
    pub inputs: &'static [Io],
    /// Its outputs, in order.
    pub outputs: &'static [Io],
    /// Per weight: its byte offset in `weights` (a multiple of 64) and its element count.
    pub consts: &'static [(usize, usize)],
    /// The weights, little-endian f32, 64-byte aligned.
    pub weights: &'static [u8],
    /// The element count of each arena buffer.
    pub arena: &'static [usize],
    /// Its tasks.
    pub tasks: &'static [Task],
    /// Its steps, in order.
    pub steps: &'static [Step],
}

/// The time of each step of a run: its nodes, seconds.
pub type StepTimes = Vec<(&'static str, f64)>;

/// A `[u8; N]` aligned to 64 bytes: the weights blob, so that kernels read weights in place.
#[repr(C, align(64))]
pub struct AlignedBytes<const N: usize>(pub [u8; N]);

/// A model ready to run: its tables and its buffers. One inference at a time (`&mut self`);
/// load one per thread to run several at once.
pub struct Model {
    desc: &'static NetDesc,
    inputs: Vec<AlignedVec<f32>>,
    arena: Vec<AlignedVec<f32>>,
    /// Scratch for a kernel's argument pointers, rewritten by each kernel step.
    args: Vec<*mut c_void>,
}

// SAFETY: a Model owns its buffers like a Vec does; `args` holds only pointers into them (or
// into the static weights), written and used within one step.
unsafe impl Send for Model {}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("name", &self.desc.name)
            .field("tasks", &self.desc.tasks)
            .finish()
    }
}

impl Model {
    /// Checks `desc` and allocates its buffers.
    pub fn new(desc: &'static NetDesc) -> Result<Model, Error> {
        check_desc(desc).map_err(|reason| Error::Model {
            model: desc.name,
            reason,
        })?;
        Ok(Model {
            desc,
            inputs: desc.inputs.iter().map(|i| AlignedVec::zeros(i.len())).collect(),
            arena: desc.arena.iter().map(|&n| AlignedVec::zeros(n)).collect(),
            args: Vec::new(),
        })
    }

    /// The model's name.
    pub fn name(&self) -> &'static str {
        self.desc.name
    }

    /// Its inputs, in the order [`Model::run`] takes them.
    pub fn inputs(&self) -> &'static [Io] {
        self.desc.inputs
    }

    /// Its outputs, in the order [`Model::run`] returns them.
    pub fn outputs(&self) -> &'static [Io] {
        self.desc.outputs
    }

    /// Its tasks, each with where its program came from.
    pub fn tasks(&self) -> &'static [Task] {
        self.desc.tasks
    }

    /// One inference: the inputs as row-major slices, in order; the outputs likewise.
    pub fn run(&mut self, inputs: &[&[f32]]) -> Result<Vec<Vec<f32>>, Error> {
        self.run_with(inputs, None)
    }

    /// [`Model::run`], with the time of each step (its nodes, seconds).
    pub fn run_timed(
        &mut self,
        inputs: &[&[f32]],
    ) -> Result<(Vec<Vec<f32>>, StepTimes), Error> {
        let mut times = Vec::with_capacity(self.desc.steps.len());
        let outs = self.run_with(inputs, Some(&mut times))?;
        Ok((outs, times))
    }

    fn run_with(
        &mut self,
        inputs: &[&[f32]],
        mut times: Option<&mut Vec<(&'static str, f64)>>,
    ) -> Result<Vec<Vec<f32>>, Error> {
        let desc = self.desc;
        if inputs.len() != desc.inputs.len() {
            return Err(Error::Inputs {
                model: desc.name,
                expected: desc.inputs.len(),
                got: inputs.len(),
            });
        }
        for ((io, data), buf) in desc.inputs.iter().zip(inputs).zip(&mut self.inputs) {
            check_len(desc.name, io.name, data.len(), io.len())?;
            buf.copy_from_slice(data);
        }
        for step in desc.steps {
            let start = times.as_ref().map(|_| std::time::Instant::now());
            self.step(step)?;
            if let (Some(t), Some(s)) = (times.as_deref_mut(), start) {
                t.push((step.name(), s.elapsed().as_secs_f64()));
            }
        }
        let mut outs = Vec::with_capacity(desc.outputs.len());
        for io in desc.outputs {
            let p = self.ptr(io.slot);
            // SAFETY: `check_desc` made sure the slot holds at least `io.len()` elements, and
            // no mutable borrow of any buffer is alive here.
            outs.push(unsafe { std::slice::from_raw_parts(p, io.len()) }.to_vec());
        }
        Ok(outs)
    }

    /// The first element of `slot`'s buffer. Weights are behind a shared reference: steps
    /// only ever write arena buffers (`check_desc`), so the pointer to a weight is never
    /// written through.
    fn ptr(&mut self, slot: Slot) -> *mut f32 {
        match slot {
            Slot::Input(i) => self.inputs[i].as_mut_ptr(),
            Slot::Arena(i) => self.arena[i].as_mut_ptr(),
            Slot::Const(i) => {
                let (offset, _) = self.desc.consts[i];
                self.desc.weights[offset..].as_ptr() as *mut f32
            }
        }
    }

    fn step(&mut self, step: &Step) -> Result<(), Error> {
        match *step {
            Step::Kernel {
                name,
                task,
                args,
                out,
            } => {
                let t = &self.desc.tasks[task];
                let mut ptrs = std::mem::take(&mut self.args);
                ptrs.clear();
                for &a in args {
                    ptrs.push(self.ptr(a) as *mut c_void);
                }
                ptrs.push(self.ptr(out) as *mut c_void);
                // SAFETY: `check_desc` checked one pointer per parameter, each to a 64-byte
                // aligned f32 buffer of at least the parameter's element count, the output
                // an arena buffer that no input names; the kernel writes only its output.
                let code = unsafe { (t.func)(ptrs.as_ptr(), runtime()) };
                self.args = ptrs;
                status(name, code)
            }
            Step::Gather {
                from,
                out,
                axes,
                fill,
                ..
            } => {
                // SAFETY: `check_desc`: the output is an arena buffer the input is not.
                let (src, dst) = unsafe { self.pair(from, out) };
                gather(src, dst, axes, fill);
                Ok(())
            }
            Step::Concat {
                from,
                out,
                outer,
                inners,
                ..
            } => {
                let total: usize = inners.iter().sum();
                let mut at = 0;
                for (&f, &inner) in from.iter().zip(inners) {
                    // SAFETY: `check_desc`: the output is an arena buffer no input is, and
                    // every row below lies within both.
                    let (src, dst) = unsafe { self.pair(f, out) };
                    for r in 0..outer {
                        let d = r * total + at;
                        dst[d..d + inner].copy_from_slice(&src[r * inner..(r + 1) * inner]);
                    }
                    at += inner;
                }
                Ok(())
            }
        }
    }

    fn len(&self, slot: Slot) -> usize {
        slot_len(self.desc, slot).unwrap_or(0)
    }

    /// `from`'s buffer to read and `out`'s to write, each of its own length.
    ///
    /// # Safety
    ///
    /// `out` is an arena buffer that `from` is not; the slices must be dropped before any
    /// other access to either buffer.
    unsafe fn pair<'a>(&mut self, from: Slot, out: Slot) -> (&'a [f32], &'a mut [f32]) {
        let (src, src_len) = (self.ptr(from), self.len(from));
        let (dst, dst_len) = (self.ptr(out), self.len(out));
        // SAFETY: the caller's promise: distinct buffers, each with its length in elements.
        unsafe {
            (
                std::slice::from_raw_parts(src as *const f32, src_len),
                std::slice::from_raw_parts_mut(dst, dst_len),
            )
        }
    }
}

/// The element count of `slot`'s buffer; `None` for a slot the model does not have.
fn slot_len(desc: &NetDesc, slot: Slot) -> Option<usize> {
    match slot {
        Slot::Input(i) => desc.inputs.get(i).map(Io::len),
        Slot::Const(i) => desc.consts.get(i).map(|c| c.1),
        Slot::Arena(i) => desc.arena.get(i).copied(),
    }
}

/// Every table of `desc` within its buffers.
fn check_desc(desc: &NetDesc) -> Result<(), String> {
    if !is_aligned(desc.weights.as_ptr()) {
        return Err("the weights blob is not 64-byte aligned".into());
    }
    for (i, &(offset, len)) in desc.consts.iter().enumerate() {
        let end = len.checked_mul(4).and_then(|b| b.checked_add(offset));
        if !offset.is_multiple_of(ALIGN) || end.is_none_or(|e| e > desc.weights.len()) {
            return Err(format!("weight {i} lies outside the weights blob"));
        }
    }
    for (i, io) in desc.inputs.iter().enumerate() {
        if io.slot != Slot::Input(i) {
            return Err(format!("input `{}` is not bound to its buffer", io.name));
        }
    }
    let len = |s: Slot| slot_len(desc, s).ok_or_else(|| format!("no buffer {s:?}"));
    let written = |s: Slot, reads: &[Slot], name: &str| match s {
        Slot::Arena(_) if !reads.contains(&s) => Ok(()),
        _ => Err(format!("step `{name}` writes {s:?}, which it reads or may not write")),
    };
    for io in desc.outputs {
        if len(io.slot)? < io.len() {
            return Err(format!("output `{}` is larger than its buffer", io.name));
        }
    }
    for step in desc.steps {
        match *step {
            Step::Kernel {
                name,
                task,
                args,
                out,
            } => {
                let t = desc
                    .tasks
                    .get(task)
                    .ok_or_else(|| format!("step `{name}` runs a task the model lacks"))?;
                if t.lens.len() != args.len() + 1 {
                    return Err(format!("step `{name}` binds the wrong number of buffers"));
                }
                for (&s, &want) in args.iter().chain([&out]).zip(t.lens) {
                    if len(s)? < want {
                        return Err(format!("step `{name}`: {s:?} is too small"));
                    }
                }
                written(out, args, name)?;
            }
            Step::Gather {
                name,
                from,
                out,
                axes,
                ..
            } => {
                let n: usize = axes.iter().map(|a| a.len()).product();
                let src = len(from)?;
                let reach: i64 = axes
                    .iter()
                    .map(|a| a.iter().copied().max().unwrap_or(0).max(0))
                    .sum();
                if n > len(out)? || (n > 0 && reach >= src as i64) {
                    return Err(format!("step `{name}` reaches outside its buffers"));
                }
                written(out, &[from], name)?;
            }
            Step::Concat {
                name,
                from,
                out,
                outer,
                inners,
            } => {
                let total: usize = inners.iter().sum();
                if from.len() != inners.len() || outer * total > len(out)? {
                    return Err(format!("step `{name}` reaches outside its output"));
                }
                for (&f, &inner) in from.iter().zip(inners) {
                    if outer * inner > len(f)? {
                        return Err(format!("step `{name}` reaches outside {f:?}"));
                    }
                }
                written(out, from, name)?;
            }
        }
    }
    Ok(())
}

/// `dst[j0, j1, ...] = src[axes[0][j0] + axes[1][j1] + ...]` over the output's row-major
/// elements, `fill` where an offset is negative. The last axis is the inner loop.
fn gather(src: &[f32], dst: &mut [f32], axes: &[&[i64]], fill: f32) {
    let Some((inner, outer)) = axes.split_last() else {
        if let (Some(d), Some(s)) = (dst.first_mut(), src.first()) {
            *d = *s;
        }
        return;
    };
    let rows: usize = outer.iter().map(|a| a.len()).product();
    let mut idx = vec![0usize; outer.len()];
    let mut at = 0;
    for _ in 0..rows {
        let base = outer
            .iter()
            .zip(&idx)
            .try_fold(0i64, |b, (a, &j)| (a[j] >= 0).then(|| b + a[j]));
        for &o in inner.iter() {
            dst[at] = match base {
                Some(b) if o >= 0 => src[(b + o) as usize],
                _ => fill,
            };
            at += 1;
        }
        // The next row: the last outer axis fastest.
        for d in (0..outer.len()).rev() {
            idx[d] += 1;
            if idx[d] < outer[d].len() {
                break;
            }
            idx[d] = 0;
        }
    }
}

//! Whole models built ahead of time: an ONNX file and a records database become a submodule
//! of the generated module with `run(inputs) -> outputs`, the network's tuned kernels in the
//! static library, and its weights in the binary. No LLVM, ONNX parser or tensortune at run
//! time: the module carries the network as tables that its engine
//! ([`MODEL_RUNTIME_SOURCE`]) walks.
//!
//! At build time the model is imported and planned as [`crate::model::Model::load`] does;
//! each task's best record for the target (or its default schedule, with fallback) is
//! compiled to an object file; and the buffers are laid out once ([`layout_net`]): every
//! value gets a slot (the caller's input, a weight, or an arena buffer shared by values whose
//! lifetimes do not overlap, a reshape being a new name for its input's slot), and each
//! layout op becomes a gather over per-axis offsets or a concatenation of rows.

use super::choose::choose_dag;
use super::rust_module::identifier;
use super::{write_file, Member, Missing, ReuseError, ReuseWarning, Source};
use crate::codegen::llvm::emit_object;
use crate::codegen::CodegenOptions;
use crate::kernel::param_specs;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use tensortune_model::graph::Data;
use tensortune_model::layout::Layout;
use tensortune_model::{ImportOptions, Plan, Step, ValueId};
use tensortune_records::Database;
use tensortune_schedules::DType;

/// The engine of the models of a generated module, copied in verbatim after the module's
/// runtime ([`super::rust_module::RUNTIME_SOURCE`]).
pub const MODEL_RUNTIME_SOURCE: &str = include_str!("model_rt.rs");

/// A model for [`super::Build::model`]: its file, the name of its submodule, and how it is
/// imported.
#[derive(Clone, Debug)]
pub struct ModelSource {
    /// The submodule's name (a Rust identifier).
    pub name: String,
    /// The ONNX file.
    pub path: PathBuf,
    /// Input shapes (for dynamic dimensions) and inputs fixed as constants.
    pub import: ImportOptions,
}

impl ModelSource {
    /// The model at `path`, named after its file (`cls.onnx`: `cls`), imported with its
    /// declared shapes.
    pub fn new(path: impl Into<PathBuf>) -> ModelSource {
        let path = path.into();
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        ModelSource {
            name: identifier(&stem, 'm'),
            path,
            import: ImportOptions::default(),
        }
    }

    /// The submodule's name.
    pub fn name(mut self, name: impl Into<String>) -> ModelSource {
        self.name = name.into();
        self
    }

    /// Fixes the shape of input `input` (what `--input-shape NAME=1x3x224x224` does).
    pub fn input_shape(mut self, input: impl Into<String>, shape: &[usize]) -> ModelSource {
        self.import
            .input_shapes
            .insert(input.into(), shape.to_vec());
        self
    }
}

/// Where a value lives at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotRef {
    /// The model's input `i`.
    Input(usize),
    /// Weight `i` ([`NetLayout::consts`]).
    Const(usize),
    /// Arena buffer `i`.
    Arena(usize),
}

/// A step of the laid-out network.
#[derive(Clone, Debug, PartialEq)]
pub enum NetStep {
    /// A task's kernel.
    Kernel {
        /// The nodes it covers.
        name: String,
        /// The task.
        task: usize,
        /// Its inputs, in the task's parameter order.
        args: Vec<SlotRef>,
        /// Its output.
        out: SlotRef,
    },
    /// A gather over per-axis offsets (-1: `fill`).
    Gather {
        /// The node.
        name: String,
        /// The input.
        from: SlotRef,
        /// The output.
        out: SlotRef,
        /// Per output axis, the input offset of each coordinate.
        axes: Vec<Vec<i64>>,
        /// The value of unmapped coordinates.
        fill: f32,
    },
    /// A concatenation: `outer` rows, each the inputs' rows of `inners[k]` elements in turn.
    Concat {
        /// The node.
        name: String,
        /// The inputs.
        from: Vec<SlotRef>,
        /// The output.
        out: SlotRef,
        /// Rows.
        outer: usize,
        /// Elements of a row of each input.
        inners: Vec<usize>,
    },
}

/// A plan's values placed in buffers, its steps over those buffers.
#[derive(Clone, Debug, PartialEq)]
pub struct NetLayout {
    /// Per value of the graph, its slot (`None`: never needed at run time).
    pub slots: Vec<Option<SlotRef>>,
    /// The values that are weights, in [`SlotRef::Const`] order.
    pub consts: Vec<ValueId>,
    /// The element count of each arena buffer.
    pub arena: Vec<usize>,
    /// The steps (a reshape is none: its output shares its input's slot).
    pub steps: Vec<NetStep>,
}

fn elems(plan: &Plan, v: ValueId) -> usize {
    plan.graph.value(v).shape.iter().product()
}

/// Places every value of `plan` in a buffer and turns its steps into [`NetStep`]s.
///
/// A value computed by a step gets an arena buffer from the time it is computed to its last
/// reader; a buffer freed by then is reused by the next value (the smallest that holds it,
/// else the largest, grown), so the arena holds about the widest point of the network rather
/// than every activation. A step's output never shares a buffer with its inputs: they are
/// freed only after it. The model's outputs are never freed.
pub fn layout_net(plan: &Plan) -> Result<NetLayout, String> {
    let g = &plan.graph;
    let n = g.values.len();
    // A reshape's output is its input under another shape: one root, one slot.
    let mut root: Vec<usize> = (0..n).collect();
    for step in &plan.steps {
        if let Step::Layout {
            layout: Layout::Reshape,
            inputs,
            output,
            ..
        } = step
        {
            let from = *inputs.first().ok_or("a reshape without an input")?;
            root[output.index()] = root[from.index()];
        }
    }
    let reads = |step: &Step| -> Vec<ValueId> {
        match step {
            Step::Kernel { operands, .. } => operands.clone(),
            Step::Layout {
                layout: Layout::Reshape,
                ..
            } => Vec::new(),
            Step::Layout { inputs, .. } => inputs.clone(),
        }
    };
    let output_of = |step: &Step| match step {
        Step::Kernel { output, .. } | Step::Layout { output, .. } => *output,
    };
    // The last step that reads each root (usize::MAX: a model output).
    let mut last: Vec<Option<usize>> = vec![None; n];
    for (at, step) in plan.steps.iter().enumerate() {
        for v in reads(step) {
            let r = root[v.index()];
            last[r] = Some(last[r].map_or(at, |l| l.max(at)));
        }
    }
    for o in &g.outputs {
        last[root[o.index()]] = Some(usize::MAX);
    }
    let mut slots: Vec<Option<SlotRef>> = vec![None; n];
    for (i, v) in g.inputs.iter().enumerate() {
        slots[v.index()] = Some(SlotRef::Input(i));
    }
    let mut consts = Vec::new();
    // Weights: every value known at import that a step or the caller reads.
    let mut needed: Vec<ValueId> = plan.steps.iter().flat_map(reads).collect();
    needed.extend(&g.outputs);
    for v in needed {
        let r = ValueId(root[v.index()] as u32);
        if slots[r.index()].is_some() {
            continue;
        }
        match g.constant(r) {
            Some(Data::F32(_)) => {
                slots[r.index()] = Some(SlotRef::Const(consts.len()));
                consts.push(r);
            }
            Some(Data::I64(_)) => {
                return Err(format!(
                    "`{}` is an integer tensor read at run time",
                    g.value(r).name
                ))
            }
            None => {}
        }
    }
    let mut arena: Vec<usize> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut steps = Vec::new();
    let slot_of = |slots: &[Option<SlotRef>], v: ValueId| {
        slots[root[v.index()]].ok_or_else(|| {
            format!(
                "`{}` is read before it is computed",
                plan.graph.value(v).name
            )
        })
    };
    for (at, step) in plan.steps.iter().enumerate() {
        let out = output_of(step);
        if let Step::Layout {
            layout: Layout::Reshape,
            ..
        } = step
        {
            continue;
        }
        let args = reads(step)
            .into_iter()
            .map(|v| slot_of(&slots, v))
            .collect::<Result<Vec<_>, _>>()?;
        let r = root[out.index()];
        if r != out.index() || slots[r].is_some() {
            return Err(format!("`{}` is computed twice", g.value(out).name));
        }
        let need = elems(plan, out);
        let pick = free
            .iter()
            .enumerate()
            .filter(|(_, &b)| arena[b] >= need)
            .min_by_key(|(_, &b)| arena[b])
            .or_else(|| free.iter().enumerate().max_by_key(|(_, &b)| arena[b]))
            .map(|(i, _)| i);
        let b = match pick {
            Some(i) => free.swap_remove(i),
            None => {
                arena.push(0);
                arena.len() - 1
            }
        };
        arena[b] = arena[b].max(need);
        slots[r] = Some(SlotRef::Arena(b));
        if last[r].is_none() {
            // Computed and never read: its buffer is free again right after.
            last[r] = Some(at);
        }
        steps.push(net_step(plan, step, args, SlotRef::Arena(b))?);
        // Free what this step read last (and a value nobody reads).
        let mut done: Vec<usize> = reads(step)
            .into_iter()
            .map(|v| root[v.index()])
            .chain([r])
            .filter(|&x| last[x] == Some(at))
            .collect();
        done.sort_unstable();
        done.dedup();
        for x in done {
            if let Some(SlotRef::Arena(fb)) = slots[x] {
                free.push(fb);
            }
        }
    }
    for o in &g.outputs {
        slot_of(&slots, *o)?;
    }
    Ok(NetLayout {
        slots: (0..n).map(|v| slots[root[v]]).collect(),
        consts,
        arena,
        steps,
    })
}

fn net_step(plan: &Plan, step: &Step, args: Vec<SlotRef>, out: SlotRef) -> Result<NetStep, String> {
    let g = &plan.graph;
    match step {
        Step::Kernel { task, name, .. } => Ok(NetStep::Kernel {
            name: name.clone(),
            task: *task,
            args,
            out,
        }),
        Step::Layout {
            name,
            layout,
            inputs,
            output,
            ..
        } => {
            let out_shape = &g.value(*output).shape;
            if let Layout::Concat(axis) = layout {
                let tail: usize = out_shape.iter().skip(axis + 1).product();
                let outer: usize = out_shape.iter().take(*axis).product();
                let inners = inputs
                    .iter()
                    .map(|v| g.value(*v).shape.get(*axis).map(|d| d * tail))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| format!("`{name}`: an input without axis {axis}"))?;
                return Ok(NetStep::Concat {
                    name: name.clone(),
                    from: args,
                    out,
                    outer,
                    inners,
                });
            }
            let from = *args
                .first()
                .ok_or_else(|| format!("`{name}` reads nothing"))?;
            let in_shape = inputs
                .first()
                .map(|v| g.value(*v).shape.clone())
                .unwrap_or_default();
            let offsets = layout
                .axis_offsets(&in_shape, out_shape)
                .ok_or_else(|| format!("`{name}` has no per-axis offsets"))?;
            let fill = match layout {
                Layout::Map { fill, .. } => *fill,
                _ => 0.0,
            };
            Ok(NetStep::Gather {
                name: name.clone(),
                from,
                out,
                axes: offsets
                    .iter()
                    .map(|a| a.iter().map(|o| o.map_or(-1, |o| o as i64)).collect())
                    .collect(),
                fill,
            })
        }
    }
}

/// A model compiled for a generated module.
pub(crate) struct CompiledModel {
    /// One object file per task.
    pub members: Vec<Member>,
    /// Its `extern` declarations, for the module's `ffi`.
    pub ffi: String,
    /// Its submodule.
    pub module: String,
    /// Per task: key, where its program came from.
    pub tasks: Vec<(String, Source)>,
    /// What was skipped or fallen back on.
    pub warnings: Vec<ReuseWarning>,
}

/// Everything [`compile_model`] needs besides the model.
pub(crate) struct ModelBuildCtx<'a> {
    pub db: &'a Database,
    pub module: &'a str,
    pub target_key: &'a str,
    pub missing: Missing,
    pub codegen: &'a CodegenOptions,
    pub out_dir: &'a Path,
    pub ndarray: bool,
    /// The model's position among the build's models.
    pub index: usize,
}

/// Imports, plans, lays out and compiles `src`, and writes its weights beside the module.
pub(crate) fn compile_model(
    src: &ModelSource,
    cx: &ModelBuildCtx<'_>,
) -> Result<CompiledModel, ReuseError> {
    let model_err = |reason: String, user: bool| ReuseError::Model {
        path: src.path.clone(),
        reason,
        user,
    };
    let plan = crate::model::plan_file(&src.path, &src.import)
        .map_err(|e| model_err(e.to_string(), e.is_user_error()))?;
    let net = layout_net(&plan).map_err(|e| model_err(e, false))?;
    let prefix = format!("tt_{}_{}", cx.module, src.name);
    let mut members = Vec::new();
    let mut tasks = Vec::new();
    let mut warnings = Vec::new();
    let mut task_lens = Vec::new();
    let mut ffi = String::new();
    for (i, t) in plan.tasks.iter().enumerate() {
        let symbol = format!("{prefix}_t{i}");
        let choice = choose_dag(
            cx.db,
            &t.key,
            &t.dag,
            cx.target_key,
            cx.missing,
            Some(&symbol),
        )?;
        let params = param_specs(&choice.func)?;
        if let Some(p) = params.iter().find(|p| p.dtype != DType::F32) {
            return Err(model_err(
                format!("task `{}`: parameter `{}` is not f32", t.key, p.name),
                false,
            ));
        }
        let lens: Vec<usize> = params
            .iter()
            .map(|p| p.shape.iter().product::<i64>().max(0) as usize)
            .collect();
        let object = emit_object(&choice.func, cx.codegen)?;
        members.push(Member {
            // Archive member names are at most 15 bytes.
            name: format!("m{}t{i}.o", cx.index),
            data: object,
            symbols: vec![symbol.clone(), format!("{symbol}_packed")],
        });
        let _ = writeln!(
            ffi,
            "        pub fn {symbol}_packed(args: *const *mut std::ffi::c_void, rt: *const super::TtRuntime) -> i32;"
        );
        warnings.extend(choice.warnings);
        tasks.push((t.key.clone(), choice.source));
        task_lens.push(lens);
    }
    // Each kernel step binds values of exactly its parameters' sizes, as the JIT's executor
    // checks at run time; here it is checked once, at build time.
    for step in &plan.steps {
        if let Step::Kernel {
            task,
            name,
            operands,
            output,
        } = step
        {
            let want = &task_lens[*task];
            let have: Vec<usize> = operands
                .iter()
                .chain([output])
                .map(|v| elems(&plan, *v))
                .collect();
            if &have != want {
                return Err(model_err(
                    format!("step `{name}` binds {have:?} elements where its task takes {want:?}"),
                    false,
                ));
            }
        }
    }
    let (weights, consts) = weights_blob(&plan, &net).map_err(|e| model_err(e, false))?;
    let weights_path = cx
        .out_dir
        .join(format!("{}_{}.weights", cx.module, src.name));
    write_file(&weights_path, &weights)?;
    let module = module_text(
        src,
        cx,
        &plan,
        &net,
        &tasks,
        &task_lens,
        &consts,
        &prefix,
        &weights_path,
        weights.len(),
    );
    Ok(CompiledModel {
        members,
        ffi,
        module,
        tasks,
        warnings,
    })
}

/// The weights as little-endian f32, each at a 64-byte aligned offset, and per weight its
/// (offset, element count).
/// Per weight: its byte offset in the blob and its element count.
type WeightSpans = Vec<(usize, usize)>;

fn weights_blob(plan: &Plan, net: &NetLayout) -> Result<(Vec<u8>, WeightSpans), String> {
    let mut blob = Vec::new();
    let mut at = Vec::with_capacity(net.consts.len());
    for &v in &net.consts {
        let Some(Data::F32(a)) = plan.graph.constant(v) else {
            return Err(format!("weight `{}` is not f32", plan.graph.value(v).name));
        };
        while blob.len() % 64 != 0 {
            blob.push(0);
        }
        at.push((blob.len(), a.len()));
        // Row-major, whatever the array's own layout.
        for x in a.iter() {
            blob.extend_from_slice(&x.to_le_bytes());
        }
    }
    Ok((blob, at))
}

fn slot_text(s: SlotRef) -> String {
    match s {
        SlotRef::Input(i) => format!("Slot::Input({i})"),
        SlotRef::Const(i) => format!("Slot::Const({i})"),
        SlotRef::Arena(i) => format!("Slot::Arena({i})"),
    }
}

fn list<T>(items: &[T], f: impl Fn(&T) -> String) -> String {
    items.iter().map(f).collect::<Vec<_>>().join(", ")
}

/// The value of an f32 exactly, NaN and infinities included.
fn f32_text(x: f32) -> String {
    format!("f32::from_bits({:#010x})", x.to_bits())
}

#[allow(clippy::too_many_arguments)]
fn module_text(
    src: &ModelSource,
    cx: &ModelBuildCtx<'_>,
    plan: &Plan,
    net: &NetLayout,
    tasks: &[(String, Source)],
    task_lens: &[Vec<usize>],
    consts: &[(usize, usize)],
    prefix: &str,
    weights_path: &Path,
    weights_len: usize,
) -> String {
    let g = &plan.graph;
    let mut s = String::new();
    let name = &src.name;
    let _ = writeln!(
        s,
        "/// The model `{}`: {} tasks, {} steps; [`run`] runs it.",
        src.path.display(),
        plan.tasks.len(),
        net.steps.len()
    );
    let _ = writeln!(s, "pub mod {name} {{");
    let _ = writeln!(
        s,
        "use super::{{AlignedBytes, Error, Io, Model, NetDesc, Slot, Step, Task}};"
    );
    let _ = writeln!(
        s,
        "static WEIGHTS: AlignedBytes<{weights_len}> = AlignedBytes(*include_bytes!({:?}));",
        weights_path.display().to_string()
    );
    let io = |v: &ValueId| {
        let val = g.value(*v);
        let slot = net.slots[v.index()].map(slot_text).unwrap_or_default();
        format!(
            "Io {{ name: {:?}, shape: &[{}], slot: {slot} }}",
            val.name,
            list(&val.shape, |d| d.to_string())
        )
    };
    let _ = writeln!(s, "static DESC: NetDesc = NetDesc {{");
    let _ = writeln!(s, "    name: {name:?},");
    let _ = writeln!(s, "    inputs: &[{}],", list(&g.inputs, io));
    let _ = writeln!(s, "    outputs: &[{}],", list(&g.outputs, io));
    let _ = writeln!(
        s,
        "    consts: &[{}],",
        list(consts, |(o, n)| format!("({o}, {n})"))
    );
    let _ = writeln!(s, "    weights: &WEIGHTS.0,");
    let _ = writeln!(s, "    arena: &[{}],", list(&net.arena, |n| n.to_string()));
    let _ = writeln!(s, "    tasks: &[");
    for (i, ((key, source), lens)) in tasks.iter().zip(task_lens).enumerate() {
        let _ = writeln!(
            s,
            "        Task {{ key: {key:?}, ops: {:?}, source: {:?}, func: super::ffi::{prefix}_t{i}_packed, lens: &[{}] }},",
            plan.tasks[i].ops,
            source.to_string(),
            list(lens, |n| n.to_string())
        );
    }
    let _ = writeln!(s, "    ],");
    let _ = writeln!(s, "    steps: &[");
    for step in &net.steps {
        let text = match step {
            NetStep::Kernel {
                name,
                task,
                args,
                out,
            } => format!(
                "Step::Kernel {{ name: {name:?}, task: {task}, args: &[{}], out: {} }}",
                list(args, |a| slot_text(*a)),
                slot_text(*out)
            ),
            NetStep::Gather {
                name,
                from,
                out,
                axes,
                fill,
            } => format!(
                "Step::Gather {{ name: {name:?}, from: {}, out: {}, axes: &[{}], fill: {} }}",
                slot_text(*from),
                slot_text(*out),
                list(axes, |a| format!("&[{}]", list(a, |o| o.to_string()))),
                f32_text(*fill)
            ),
            NetStep::Concat {
                name,
                from,
                out,
                outer,
                inners,
            } => format!(
                "Step::Concat {{ name: {name:?}, from: &[{}], out: {}, outer: {outer}, inners: &[{}] }}",
                list(from, |a| slot_text(*a)),
                slot_text(*out),
                list(inners, |n| n.to_string())
            ),
        };
        let _ = writeln!(s, "        {text},");
    }
    let _ = writeln!(s, "    ],");
    let _ = writeln!(s, "}};");
    s.push_str(
        "/// A new instance of the model, with buffers of its own (for a thread of its own).\n\
         pub fn load() -> Result<Model, Error> {\n    Model::new(&DESC)\n}\n\
         /// The model's inputs, in the order [`run`] takes them.\n\
         pub fn inputs() -> &'static [Io] {\n    DESC.inputs\n}\n\
         /// The model's outputs, in the order [`run`] returns them.\n\
         pub fn outputs() -> &'static [Io] {\n    DESC.outputs\n}\n\
         /// The model's tasks, each with where its program came from.\n\
         pub fn tasks() -> &'static [Task] {\n    DESC.tasks\n}\n\
         static SHARED: std::sync::OnceLock<Result<std::sync::Mutex<Model>, Error>> = std::sync::OnceLock::new();\n\
         /// One inference on the process's instance (loaded by the first call; calls from \
         several threads take turns): the inputs as row-major slices in the order of \
         [`inputs`], the outputs likewise.\n\
         pub fn run(inputs: &[&[f32]]) -> Result<Vec<Vec<f32>>, Error> {\n    \
         match SHARED.get_or_init(|| load().map(std::sync::Mutex::new)) {\n        \
         Ok(m) => m.lock().unwrap_or_else(|p| p.into_inner()).run(inputs),\n        \
         Err(e) => Err(e.clone()),\n    }\n}\n",
    );
    if cx.ndarray {
        s.push_str(
            "/// [`run`] on ndarray views of any layout, returning arrays of the outputs' shapes.\n\
             pub fn run_nd(inputs: &[ndarray::ArrayViewD<'_, f32>]) -> Result<Vec<ndarray::ArrayD<f32>>, Error> {\n    \
             let std: Vec<_> = inputs.iter().map(|a| a.as_standard_layout()).collect();\n    \
             for (a, io) in std.iter().zip(DESC.inputs) {\n        \
             super::check_shape(DESC.name, io.name, a.shape(), io.shape)?;\n    }\n    \
             let slices: Vec<&[f32]> = std.iter().map(|a| a.as_slice().unwrap_or(&[])).collect();\n    \
             run(&slices)?\n        .into_iter()\n        .zip(DESC.outputs)\n        \
             .map(|(v, io)| ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(io.shape), v).map_err(|e| Error::Model { model: DESC.name, reason: e.to_string() }))\n        \
             .collect()\n}\n",
        );
    }
    let _ = writeln!(s, "}}\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensortune_model::testing::{AttrValue, ModelBuilder};

    fn plan_of(bytes: &[u8]) -> Plan {
        crate::model::plan_bytes(bytes, &ImportOptions::default()).expect("plans")
    }

    /// Checks, independently of how [`layout_net`] chose, that no two values sharing an
    /// arena buffer are alive at once. A value lives from the step computing it to its last
    /// reader, both ends included (an output to the end); a reshape and its input are one
    /// value.
    fn check_lifetimes(plan: &Plan, net: &NetLayout) {
        let g = &plan.graph;
        let mut group: Vec<usize> = (0..g.values.len()).collect();
        let mut span: Vec<Option<(usize, usize)>> = vec![None; g.values.len()];
        for (at, step) in plan.steps.iter().enumerate() {
            let (out, reads) = match step {
                Step::Kernel {
                    output, operands, ..
                } => (*output, operands.clone()),
                Step::Layout { output, inputs, .. } => (*output, inputs.clone()),
            };
            for v in &reads {
                let r = group[v.index()];
                if let Some(SlotRef::Arena(_)) = net.slots[r] {
                    let (first, _) = span[r].expect("read before it is computed");
                    span[r] = Some((first, at));
                }
            }
            if let Step::Layout {
                layout: Layout::Reshape,
                ..
            } = step
            {
                group[out.index()] = group[reads[0].index()];
            } else {
                span[out.index()] = Some((at, at));
            }
        }
        for o in &g.outputs {
            if let Some(s) = &mut span[group[o.index()]] {
                s.1 = usize::MAX;
            }
        }
        let mut live: Vec<(usize, usize, usize)> = Vec::new();
        for (v, s) in span.iter().enumerate() {
            if let (Some((first, last)), Some(SlotRef::Arena(b))) = (s, net.slots[v]) {
                live.push((b, *first, *last));
            }
        }
        for (i, a) in live.iter().enumerate() {
            for b in &live[i + 1..] {
                assert!(
                    a.0 != b.0 || a.2 < b.1 || b.2 < a.1,
                    "buffer {} holds two live values: {a:?} {b:?}",
                    a.0
                );
            }
        }
        for (v, s) in net.slots.iter().enumerate() {
            if let Some(SlotRef::Arena(b)) = s {
                let n: usize = g.values[v].shape.iter().product();
                assert!(net.arena[*b] >= n, "`{}` does not fit", g.values[v].name);
            }
        }
    }

    /// A chain of matmuls and standalone ReLUs: two arena buffers serve any length.
    #[test]
    fn a_chain_reuses_two_buffers() {
        let mut m = ModelBuilder::new(13).input("x", &[4, 16]);
        let mut prev = "x".to_string();
        for i in 0..6 {
            let w = format!("w{i}");
            m = m
                .init(
                    &w,
                    &[16, 16],
                    (0..256).map(|k| (k % 7) as f32 - 3.0).collect(),
                )
                .node("MatMul", &[&prev, &w], &[&format!("h{i}")], &[])
                .node("Sigmoid", &[&format!("h{i}")], &[&format!("s{i}")], &[]);
            prev = format!("s{i}");
        }
        let plan = plan_of(&m.output(&prev).build());
        let net = layout_net(&plan).expect("lays out");
        check_lifetimes(&plan, &net);
        assert_eq!(net.consts.len(), 6);
        assert!(net.arena.len() <= 2, "{:?}", net.arena);
        assert!(net.steps.len() >= 6);
    }

    /// Layout ops: a reshape shares its input's buffer, a transpose and a pad become
    /// gathers, a concat joins rows; the output is never freed.
    #[test]
    fn layout_ops_become_gathers_and_a_reshape_a_shared_slot() {
        let bytes = ModelBuilder::new(13)
            .input("x", &[2, 6])
            .init("w", &[6, 6], (0..36).map(|k| (k % 5) as f32).collect())
            .init_i64("shape", &[3], vec![2, 2, 3])
            .init_i64("pads", &[6], vec![0, 1, 0, 0, 0, 0])
            .node("MatMul", &["x", "w"], &["h"], &[])
            .node("Reshape", &["h", "shape"], &["r"], &[])
            .node(
                "Transpose",
                &["r"],
                &["t"],
                &[("perm", AttrValue::Ints(vec![0, 2, 1]))],
            )
            .node("Pad", &["t", "pads"], &["p"], &[])
            .node(
                "Concat",
                &["p", "t"],
                &["c"],
                &[("axis", AttrValue::Int(1))],
            )
            .node("Sigmoid", &["c"], &["y"], &[])
            .output("y")
            .build();
        let plan = plan_of(&bytes);
        let net = layout_net(&plan).expect("lays out");
        check_lifetimes(&plan, &net);
        let id = |name: &str| {
            ValueId(
                plan.graph
                    .values
                    .iter()
                    .position(|v| v.name == name)
                    .expect("value") as u32,
            )
        };
        assert_eq!(net.slots[id("r").index()], net.slots[id("h").index()]);
        let kinds: Vec<&str> = net
            .steps
            .iter()
            .map(|s| match s {
                NetStep::Kernel { .. } => "kernel",
                NetStep::Gather { .. } => "gather",
                NetStep::Concat { .. } => "concat",
            })
            .collect();
        assert_eq!(kinds, ["kernel", "gather", "gather", "concat", "kernel"]);
        // The pad: [2, 3, 2] -> [2, 4, 2], a row of fill first along axis 1.
        let NetStep::Gather { axes, .. } = &net.steps[2] else {
            panic!("not a gather")
        };
        assert_eq!(axes[1], [-1, 0, 2, 4]);
        let NetStep::Concat { outer, inners, .. } = &net.steps[3] else {
            panic!("not a concat")
        };
        assert_eq!((*outer, inners.as_slice()), (2, &[8, 6][..]));
        assert!(matches!(
            net.slots[id("y").index()],
            Some(SlotRef::Arena(_))
        ));
    }

    #[test]
    fn identifiers_from_file_names() {
        assert_eq!(
            ModelSource::new("models/PP-OCR cls.onnx").name,
            "pp_ocr_cls"
        );
        assert_eq!(ModelSource::new("3d.onnx").name, "m3d");
        assert_eq!(identifier("", 'm'), "m");
    }
}

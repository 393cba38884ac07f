//! From the graph to what runs: tasks (tensor-expression DAGs, one per distinct layer) and
//! the steps of one inference, in order.
//!
//! Fusion follows TVM's rule for injective ops: a chain of elementwise nodes joins the
//! compute op that produces its input (a convolution's bias, a residual `Add`, the
//! activation) as one epilogue stage, as long as each intermediate result feeds nothing else
//! and keeps the producer's shape; a chain with no such producer is a task of its own. Two
//! layers whose DAGs print the same key are one task, whose weight is how often it runs.
//!
//! A task's key is its workload key in the records: a workload of the op library where the
//! layer is exactly one (`matmul:...`, `softmax:...`), else `onnx_<op>:...` naming every
//! parameter, the epilogue's expression and its operands' shapes: what tuning under
//! [`tensortune`'s `tune_dags`] files records under, as for any DAG a user builds.

use crate::ew::{self, broadcast_index, param_shape, Ew};
use crate::graph::{Data, Elem, Graph, Node, Value, ValueId};
use crate::layout::{self, Layout};
use crate::ops::{self, dims, Anchor};
use crate::ModelError;
use std::collections::HashMap;
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::te::Graph as Te;
use tensortune_schedules::ComputeDag;

/// A distinct layer to tune and compile.
#[derive(Clone, Debug)]
pub struct Task {
    /// The workload key of its records.
    pub key: String,
    /// What it computes.
    pub dag: ComputeDag,
    /// The ONNX ops it fuses, e.g. `Conv+Add+Relu`.
    pub ops: String,
    /// How many steps of one inference run it: its weight in tuning.
    pub count: usize,
}

/// One step of an inference.
#[derive(Clone, Debug)]
pub enum Step {
    /// A compiled task: `operands` bound to the DAG's inputs in order.
    Kernel {
        /// The task.
        task: usize,
        /// The nodes it covers, e.g. `conv1+relu1`.
        name: String,
        /// The values read, in the DAG's input order.
        operands: Vec<ValueId>,
        /// The value written.
        output: ValueId,
    },
    /// A layout op run directly.
    Layout {
        /// The node.
        name: String,
        /// Its op type.
        op: String,
        /// What it does.
        layout: Layout,
        /// The values read.
        inputs: Vec<ValueId>,
        /// The value written.
        output: ValueId,
    },
}

/// The tasks and steps of a model.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The graph (with the constants the plan added, e.g. pooling divisors).
    pub graph: Graph,
    /// The distinct tasks.
    pub tasks: Vec<Task>,
    /// The steps of one inference, in an order that computes every value before it is read.
    pub steps: Vec<Step>,
}

/// A fused group under construction.
struct Group {
    anchor: Option<Box<dyn Anchor>>,
    /// The values the anchor's kernel reads.
    inputs: Vec<ValueId>,
    expr: Ew,
    /// Extra operands of the epilogue and the shape each is broadcast from.
    args: Vec<(ValueId, Vec<usize>)>,
    out: ValueId,
    shape: Vec<usize>,
    names: Vec<String>,
    ops: Vec<String>,
    /// The index of the node that started the group.
    first: usize,
    /// The last node the group covers: where its step runs.
    last: usize,
}

/// Cuts the graph into tasks and steps.
pub fn plan(mut graph: Graph) -> Result<Plan, ModelError> {
    let uses = graph.use_counts();
    let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); graph.values.len()];
    for (i, n) in graph.nodes.iter().enumerate() {
        for v in n.inputs.iter().flatten() {
            consumers[v.index()].push(i);
        }
    }
    let mut producer: Vec<Option<usize>> = vec![None; graph.values.len()];
    for (i, n) in graph.nodes.iter().enumerate() {
        for v in &n.outputs {
            producer[v.index()] = Some(i);
        }
    }
    let mut fused = vec![false; graph.nodes.len()];
    let mut steps: Vec<(usize, Step)> = Vec::new();
    let mut tasks: Vec<Task> = Vec::new();
    let mut by_key: HashMap<String, usize> = HashMap::new();
    for i in 0..graph.nodes.len() {
        if fused[i] {
            continue;
        }
        let node = graph.nodes[i].clone();
        if layout::is_layout(&node.op) {
            let (layout, _) = layout::from_node(&node, &graph)?;
            let inputs = match layout {
                Layout::Concat(_) => node.inputs.iter().flatten().copied().collect(),
                _ => vec![node.input(0)?],
            };
            steps.push((
                i,
                Step::Layout {
                    name: node.name.clone(),
                    op: node.op.clone(),
                    layout,
                    inputs,
                    output: node.output()?,
                },
            ));
            continue;
        }
        let mut group = start(&node, i, &mut graph)?;
        if group.anchor.as_ref().is_none_or(|a| a.fusable()) {
            extend(&mut group, &graph, &uses, &consumers, &producer, &mut fused)?;
        }
        let (key, dag) = task_of(&group, &node)?;
        let task = *by_key.entry(key.clone()).or_insert_with(|| {
            tasks.push(Task {
                key,
                dag,
                ops: group.ops.join("+"),
                count: 0,
            });
            tasks.len() - 1
        });
        tasks[task].count += 1;
        let mut operands = group.inputs.clone();
        operands.extend(group.args.iter().map(|(v, _)| *v));
        steps.push((
            group.last,
            Step::Kernel {
                task,
                name: group.names.join("+"),
                operands,
                output: group.out,
            },
        ));
    }
    // A group's step runs after its last node; sorting by that keeps every read after the
    // write (the nodes were in topological order).
    steps.sort_by_key(|(at, _)| *at);
    Ok(Plan {
        graph,
        tasks,
        steps: steps.into_iter().map(|(_, s)| s).collect(),
    })
}

/// The group a node starts: an anchor with its own epilogue terms (a convolution's bias,
/// Gemm's `alpha·acc + beta·C`), or a standalone elementwise node.
fn start(node: &Node, at: usize, graph: &mut Graph) -> Result<Group, ModelError> {
    let out = node.output()?;
    let mut group = Group {
        anchor: None,
        inputs: Vec::new(),
        expr: Ew::Acc,
        args: Vec::new(),
        out,
        shape: graph.value(out).shape.clone(),
        names: vec![node.name.clone()],
        ops: vec![node.op.clone()],
        first: at,
        last: at,
    };
    if ew::is_elementwise(&node.op) {
        let mut args = Vec::new();
        group.expr = ew::from_node(node, graph, &mut |pos| operand(graph, node, pos, &mut args))?;
        group.args = args;
        return Ok(group);
    }
    if !ops::ANCHOR_OPS.contains(&node.op.as_str()) {
        return Err(ModelError::unsupported(node, "op type"));
    }
    let anchor = ops::anchor(node, graph)?;
    for k in 0..anchor.inputs() {
        group.inputs.push(node.input(k)?);
    }
    for (k, c) in anchor.constants().into_iter().enumerate() {
        let id = graph.add_value(Value {
            name: format!("{}.const{k}", node.name),
            shape: c.shape().to_vec(),
            elem: Elem::F32,
            constant: Some(Data::F32(c)),
        });
        group.inputs.push(id);
    }
    match node.op.as_str() {
        "Conv" if node.opt_input(2).is_some() => {
            let b = node.input(2)?;
            group
                .args
                .push((b, ew::channel_shape(&graph.value(b).shape, 4)));
            group.expr = Ew::Bin(ew::Bin::Add, Box::new(Ew::Acc), Box::new(Ew::Arg(0)));
        }
        "Gemm" => {
            group.expr = ops::matmul::gemm_epilogue(node)?;
            if let Some(c) = node.opt_input(2) {
                group.args.push((c, graph.value(c).shape.clone()));
            }
        }
        _ => {}
    }
    group.anchor = Some(anchor);
    Ok(group)
}

/// The expression for input `pos` of `node`: a scalar known at import is a constant; any
/// other tensor is an argument (reused where the same tensor is read the same way).
fn operand(
    graph: &Graph,
    node: &Node,
    pos: usize,
    args: &mut Vec<(ValueId, Vec<usize>)>,
) -> Result<Ew, ModelError> {
    let v = node.input(pos)?;
    if let Some(d) = graph.constant(v) {
        let f = d.to_f32s();
        if f.len() == 1 {
            return Ok(Ew::Const(f[0]));
        }
        if matches!(d, Data::I64(_)) {
            return Err(ModelError::unsupported(node, "an integer tensor operand"));
        }
    }
    let shape = &graph.value(v).shape;
    let bshape = if node.op == "BatchNormalization" && pos > 0 {
        let rank = graph.value(node.input(0)?).shape.len();
        ew::channel_shape(shape, rank)
    } else {
        shape.clone()
    };
    let key = (v, bshape);
    let i = match args.iter().position(|a| *a == key) {
        Some(i) => i,
        None => {
            args.push(key);
            args.len() - 1
        }
    };
    Ok(Ew::Arg(i))
}

/// Most elementwise nodes a closed region ([`closed_region`]) may take.
const MAX_REGION_NODES: usize = 8;

/// The elementwise nodes that consume the group's value when it is read more than once, if
/// they close into one value: every value they make but the last read only among them, none
/// a graph output, each of the group's shape, and their other operands made before the group
/// began (constants, inputs, earlier layers), so that none depends on the group's own result.
/// `x · clip(x + 3, 0, 6) / 6` after a convolution (HardSwish as exporters spell it) is one:
/// `x` feeds the `Add` and the `Mul`. A squeeze-excite `x · sigmoid(f(pool(x)))` is not: the
/// pool is no elementwise node. Nodes in graph order.
fn closed_region(
    group: &Group,
    graph: &Graph,
    consumers: &[Vec<usize>],
    producer: &[Option<usize>],
    fused: &[bool],
) -> Option<Vec<usize>> {
    let mut chain = vec![group.out];
    let mut nodes: Vec<usize> = Vec::new();
    while nodes.len() < MAX_REGION_NODES {
        let open: Vec<ValueId> = chain
            .iter()
            .copied()
            .filter(|v| consumers[v.index()].iter().any(|j| !nodes.contains(j)))
            .collect();
        if !nodes.is_empty() && open.iter().all(|v| Some(v) == chain.last()) {
            let inner = &chain[..chain.len() - 1];
            return (!inner.iter().any(|v| graph.outputs.contains(v))).then_some(nodes);
        }
        let j = open
            .iter()
            .flat_map(|v| consumers[v.index()].iter().copied())
            .filter(|j| !nodes.contains(j))
            .min()?;
        let next = &graph.nodes[j];
        let out = next.output().ok()?;
        let fits = !fused[j]
            && ew::is_elementwise(&next.op)
            && next.outputs.len() == 1
            && graph.value(out).shape == group.shape;
        let operands_ready = next.inputs.iter().flatten().all(|v| {
            chain.contains(v)
                || graph.constant(*v).is_some()
                || producer[v.index()].is_none_or(|p| p < group.first)
        });
        if !fits || !operands_ready {
            return None;
        }
        nodes.push(j);
        chain.push(out);
    }
    None
}

/// Adds the nodes of a closed region to the group: each node's expression with the values
/// made inside the group substituted.
fn fuse_region(
    group: &mut Group,
    graph: &Graph,
    nodes: &[usize],
    fused: &mut [bool],
) -> Result<(), ModelError> {
    let mut made: Vec<(ValueId, Ew)> = vec![(group.out, group.expr.clone())];
    let mut args = std::mem::take(&mut group.args);
    for &j in nodes {
        let next = &graph.nodes[j];
        let expr = ew::from_node(next, graph, &mut |pos| {
            let v = next.inputs.get(pos).copied().flatten();
            match made.iter().find(|(m, _)| Some(*m) == v) {
                Some((_, e)) => Ok(e.clone()),
                None => operand(graph, next, pos, &mut args),
            }
        });
        let expr = match expr {
            Ok(e) => e,
            Err(e) => {
                group.args = args;
                return Err(e);
            }
        };
        let out = next.output()?;
        made.push((out, expr.clone()));
        group.expr = expr;
        group.out = out;
        group.names.push(next.name.clone());
        group.ops.push(next.op.clone());
        group.last = group.last.max(j);
        fused[j] = true;
    }
    group.args = args;
    Ok(())
}

/// Adds elementwise consumers to the group while the rule of the module doc allows.
fn extend(
    group: &mut Group,
    graph: &Graph,
    uses: &[usize],
    consumers: &[Vec<usize>],
    producer: &[Option<usize>],
    fused: &mut [bool],
) -> Result<(), ModelError> {
    loop {
        let cur = group.out;
        if graph.outputs.contains(&cur) {
            return Ok(());
        }
        if uses[cur.index()] != 1 {
            // Read twice or more: fused only as a closed diamond of elementwise nodes.
            match closed_region(group, graph, consumers, producer, fused) {
                Some(nodes) => {
                    fuse_region(group, graph, &nodes, fused)?;
                    continue;
                }
                None => return Ok(()),
            }
        }
        // A consumer another group took already (the other operand of a residual `Add`).
        let Some(&j) = consumers[cur.index()].first().filter(|&&j| !fused[j]) else {
            return Ok(());
        };
        let next = &graph.nodes[j];
        let Ok(out) = next.output() else {
            return Ok(());
        };
        if !ew::is_elementwise(&next.op)
            || next.outputs.len() != 1
            || graph.value(out).shape != group.shape
        {
            return Ok(());
        }
        let mut args = std::mem::take(&mut group.args);
        let chain = group.expr.clone();
        let expr = ew::from_node(next, graph, &mut |pos| {
            if next.inputs.get(pos).copied().flatten() == Some(cur) {
                Ok(chain.clone())
            } else {
                operand(graph, next, pos, &mut args)
            }
        });
        group.args = args;
        group.expr = expr?;
        group.out = out;
        group.names.push(next.name.clone());
        group.ops.push(next.op.clone());
        group.last = j;
        fused[j] = true;
    }
}

/// The workload key and DAG of a group.
fn task_of(group: &Group, node: &Node) -> Result<(String, ComputeDag), ModelError> {
    let dag_err = |e: String| ModelError::Dag {
        node: node.name.clone(),
        reason: e,
    };
    let plain = group.expr == Ew::Acc && group.args.is_empty();
    if let Some(spec) = group
        .anchor
        .as_ref()
        .and_then(|a| a.library_spec())
        .filter(|_| plain)
    {
        let w = WorkloadSpec::parse(&spec).map_err(|e| dag_err(e.to_string()))?;
        return Ok((
            w.canonical(),
            w.build().map_err(|e| dag_err(e.to_string()))?,
        ));
    }
    let mut g = Te::new();
    let (built, kernel_shape) = match &group.anchor {
        Some(a) => (Some(a.build(&mut g)), a.kernel_shape()),
        None => (None, group.shape.clone()),
    };
    let arg_ts: Vec<_> = group
        .args
        .iter()
        .enumerate()
        .map(|(i, (_, s))| {
            g.placeholder(
                &format!("x{i}"),
                &param_shape(s),
                tensortune_schedules::DType::F32,
            )
        })
        .collect();
    let args_text: Vec<String> = group.args.iter().map(|(_, s)| dims(s)).collect();
    let out = match &built {
        Some((_, acc)) if plain => *acc,
        _ => {
            let shape: Vec<i64> = kernel_shape.iter().map(|&d| d as i64).collect();
            let name = if built.is_some() {
                "epilogue"
            } else {
                "elementwise"
            };
            g.compute(name, &shape, &[], |ax| {
                let logical = group.anchor.as_ref().map_or(ax.to_vec(), |a| a.logical(ax));
                let acc = || {
                    built
                        .as_ref()
                        .map_or(tensortune_schedules::Expr::f32(0.0), |(_, t)| {
                            t.at(ax.to_vec())
                        })
                };
                let arg = |i: usize| arg_ts[i].at(broadcast_index(&group.args[i].1, &logical));
                group.expr.to_expr(&acc, &arg)
            })
        }
    };
    let key = match &group.anchor {
        Some(a) if plain => a.key(),
        Some(a) => format!(
            "{},epilogue={},args={}",
            a.key(),
            group.expr,
            args_text.join(";")
        ),
        None => format!(
            "onnx_elementwise:shape={},args={},f={}",
            dims(&group.shape),
            args_text.join(";"),
            group.expr
        ),
    };
    let dag = ComputeDag::new(&g, &[out]).map_err(|e| dag_err(e.to_string()))?;
    Ok((key, dag))
}

//! Batch normalization folded into the convolution before it, at import: inference-mode
//! `BatchNormalization` is a per-channel affine map, so
//! `W'[k] = W[k] · γ[k] / sqrt(σ²[k] + ε)` and `b'[k] = (b[k] − μ[k]) · γ[k] / sqrt(σ²[k] + ε) + β[k]`
//! compute the same as the convolution and the normalization, with one op fewer at run time.
//!
//! Only where every tensor involved is known at import and the convolution's result feeds
//! nothing but the normalization; otherwise the normalization stays, as an elementwise op.

use crate::graph::{Data, Elem, Graph, Value, ValueId};
use crate::ModelError;
use ndarray::{ArrayD, Axis, IxDyn};

/// Folds every foldable `BatchNormalization` into its convolution.
pub fn fold_batchnorm(graph: &mut Graph) -> Result<(), ModelError> {
    let uses = graph.use_counts();
    let mut producer: Vec<Option<usize>> = vec![None; graph.values.len()];
    for (i, n) in graph.nodes.iter().enumerate() {
        for o in &n.outputs {
            producer[o.index()] = Some(i);
        }
    }
    let mut removed = vec![false; graph.nodes.len()];
    for b in 0..graph.nodes.len() {
        let bn = &graph.nodes[b];
        if bn.op != "BatchNormalization"
            || bn.outputs.len() != 1
            || bn.int("training_mode", 0)? != 0
        {
            continue;
        }
        let Some(x) = bn.opt_input(0) else { continue };
        let Some(c) = producer[x.index()] else {
            continue;
        };
        let conv = &graph.nodes[c];
        if conv.op != "Conv" || uses[x.index()] != 1 || removed[c] {
            continue;
        }
        let Some((w, bias)) = folded(graph, c, b)? else {
            continue;
        };
        let (wid, bid) = (
            add_const(graph, &conv_name(graph, c, "weight"), w),
            add_const(graph, &conv_name(graph, c, "bias"), bias),
        );
        let out = graph.nodes[b].outputs[0];
        let bn_name = graph.nodes[b].name.clone();
        let conv = &mut graph.nodes[c];
        conv.inputs.resize(3, None);
        conv.inputs[1] = Some(wid);
        conv.inputs[2] = Some(bid);
        conv.outputs[0] = out;
        conv.name = format!("{}+{bn_name}", conv.name);
        removed[b] = true;
    }
    let mut k = 0;
    graph.nodes.retain(|_| {
        k += 1;
        !removed[k - 1]
    });
    Ok(())
}

/// A convolution's weight and bias.
type WeightBias = (ArrayD<f32>, ArrayD<f32>);

fn conv_name(graph: &Graph, c: usize, what: &str) -> String {
    format!("{}.folded_{what}", graph.nodes[c].name)
}

fn add_const(graph: &mut Graph, name: &str, a: ArrayD<f32>) -> ValueId {
    graph.add_value(Value {
        name: name.to_string(),
        shape: a.shape().to_vec(),
        elem: Elem::F32,
        constant: Some(Data::F32(a)),
    })
}

/// The folded weight and bias of convolution `c` followed by normalization `b`, or `None`
/// where a tensor is not known at import or has an unexpected shape.
fn folded(graph: &Graph, c: usize, b: usize) -> Result<Option<WeightBias>, ModelError> {
    let (conv, bn) = (&graph.nodes[c], &graph.nodes[b]);
    let f32s = |v: Option<ValueId>| match v.and_then(|v| graph.constant(v)) {
        Some(Data::F32(a)) => Some(a.clone()),
        _ => None,
    };
    let Some(w) = f32s(conv.opt_input(1)) else {
        return Ok(None);
    };
    let k = w.shape().first().copied().unwrap_or(0);
    let vec_k = |i: usize| {
        f32s(bn.opt_input(i))
            .filter(|a| a.len() == k)
            .map(|a| a.iter().copied().collect::<Vec<f32>>())
    };
    let (Some(gamma), Some(beta), Some(mean), Some(var)) = (vec_k(1), vec_k(2), vec_k(3), vec_k(4))
    else {
        return Ok(None);
    };
    let bias: Vec<f32> = match conv.opt_input(2) {
        None => vec![0.0; k],
        Some(v) => match f32s(Some(v)) {
            Some(a) if a.len() == k => a.iter().copied().collect(),
            _ => return Ok(None),
        },
    };
    let eps = bn.float("epsilon", 1e-5)?;
    let scale: Vec<f32> = gamma
        .iter()
        .zip(&var)
        .map(|(g, v)| g / (v + eps).sqrt())
        .collect();
    let mut w = w;
    for (ch, mut slab) in w.axis_iter_mut(Axis(0)).enumerate() {
        slab.mapv_inplace(|x| x * scale[ch]);
    }
    let b: Vec<f32> = (0..k)
        .map(|i| (bias[i] - mean[i]) * scale[i] + beta[i])
        .collect();
    let b = ArrayD::from_shape_vec(IxDyn(&[k]), b)
        .map_err(|e| ModelError::invalid(bn, e.to_string()))?;
    Ok(Some((w, b)))
}

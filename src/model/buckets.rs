//! Dynamic batch by buckets: a model whose batch dimension is dynamic is planned, tuned and
//! compiled once per bucket (a batch size such as 1, 2, 4, 8), each bucket its own set of
//! tasks, and a batch of `n` runs on the smallest bucket that holds it, padded with zero rows
//! that are sliced off the outputs. A batch larger than the largest bucket runs in chunks of
//! the largest bucket, the last one padded.
//!
//! The batch is the first dimension of every input whose first dimension the model leaves
//! dynamic; an output carries it when its first dimension follows the bucket. Padding is sound
//! for the networks this serves (every row computed from its own input row: convolutions,
//! matmuls, pooling, softmax over a row); a model that mixes rows would not be.

use super::{plan_bytes, Error, ImportOptions, LoadOptions, Model, Plan};
use ndarray::{ArrayD, ArrayViewD, Axis};
use std::path::Path;
use tensortune_model::import::DeclaredShape;

/// Parses a list of buckets, `1,2,4,8`: batch sizes of at least 1, returned ascending without
/// repeats.
pub fn parse_buckets(text: &str) -> Result<Vec<usize>, String> {
    let bad = || format!("bad bucket list `{text}`: expected batch sizes like 1,2,4,8");
    let mut out = text
        .split(',')
        .map(|b| b.trim().parse::<usize>().ok().filter(|&b| b >= 1))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(bad)?;
    out.sort_unstable();
    out.dedup();
    if out.is_empty() {
        return Err(bad());
    }
    Ok(out)
}

/// Which inputs carry the batch (their first dimension is dynamic in the model), by position.
fn batched_inputs(declared: &[(String, DeclaredShape)]) -> Result<Vec<bool>, Error> {
    let out: Vec<bool> = declared
        .iter()
        .map(|(_, shape)| matches!(shape.as_deref(), Some([None, ..])))
        .collect();
    if !out.contains(&true) {
        return Err(Error::Inputs(
            "buckets need a dynamic batch: no input of the model leaves its first dimension \
             dynamic"
                .into(),
        ));
    }
    Ok(out)
}

/// The import options of one bucket: `base` with the first dimension of every batched input
/// set to `batch`. A batched input's other dimensions come from `base` where it gives them,
/// else from the model.
pub fn bucket_options(
    bytes: &[u8],
    base: &ImportOptions,
    batch: usize,
) -> Result<ImportOptions, Error> {
    let declared = tensortune_model::import::declared_inputs(bytes)?;
    let batched = batched_inputs(&declared)?;
    let mut opts = base.clone();
    for ((name, decl), _) in declared.iter().zip(batched).filter(|(_, b)| *b) {
        let mut shape = match base.input_shapes.get(name) {
            Some(given) => given.clone(),
            None => decl
                .iter()
                .flatten()
                .enumerate()
                .map(|(i, d)| if i == 0 { Some(batch) } else { *d })
                .collect::<Option<Vec<usize>>>()
                .ok_or_else(|| {
                    Error::Inputs(format!(
                        "input `{name}` has dynamic dimensions besides the batch: fix them \
                         with --input-shape {name}=..."
                    ))
                })?,
        };
        if let Some(first) = shape.first_mut() {
            *first = batch;
        }
        opts.input_shapes.insert(name.clone(), shape);
    }
    Ok(opts)
}

/// The plan of every bucket, ascending by bucket.
pub fn bucket_plans(
    bytes: &[u8],
    base: &ImportOptions,
    buckets: &[usize],
) -> Result<Vec<(usize, Plan)>, Error> {
    let mut sorted = buckets.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    sorted
        .into_iter()
        .map(|b| Ok((b, plan_bytes(bytes, &bucket_options(bytes, base, b)?)?)))
        .collect()
}

/// Which outputs carry the batch: those whose first dimension equals the bucket in every plan
/// (with a second batch size planned where only one bucket is given, so that an output of a
/// fixed first dimension that happens to equal the bucket is not taken for a batched one).
fn batched_outputs(
    bytes: &[u8],
    base: &ImportOptions,
    plans: &[(usize, Plan)],
) -> Result<Vec<bool>, Error> {
    let shapes = |p: &Plan| -> Vec<Option<usize>> {
        p.graph
            .outputs
            .iter()
            .map(|&o| p.graph.value(o).shape.first().copied())
            .collect()
    };
    let mut seen: Vec<(usize, Vec<Option<usize>>)> =
        plans.iter().map(|(b, p)| (*b, shapes(p))).collect();
    if seen.len() == 1 {
        let probe = seen[0].0 + 1;
        let plan = plan_bytes(bytes, &bucket_options(bytes, base, probe)?)?;
        seen.push((probe, shapes(&plan)));
    }
    let n = seen.first().map_or(0, |(_, s)| s.len());
    Ok((0..n)
        .map(|i| {
            seen.iter()
                .all(|(b, s)| s.get(i).copied().flatten() == Some(*b))
        })
        .collect())
}

/// `a` with zero rows appended along the first axis up to `rows` rows.
pub fn pad_batch(a: &ArrayViewD<'_, f32>, rows: usize) -> ArrayD<f32> {
    let mut shape = a.shape().to_vec();
    let have = shape.first().copied().unwrap_or(0);
    if let Some(first) = shape.first_mut() {
        *first = rows.max(have);
    }
    let mut out = ArrayD::<f32>::zeros(ndarray::IxDyn(&shape));
    out.slice_axis_mut(Axis(0), ndarray::Slice::from(0..have))
        .assign(a);
    out
}

/// `outputs` with those that carry the batch (`batched`, by position) cut to their first
/// `rows` rows.
pub fn slice_outputs(outputs: Vec<ArrayD<f32>>, batched: &[bool], rows: usize) -> Vec<ArrayD<f32>> {
    outputs
        .into_iter()
        .zip(batched.iter().chain(std::iter::repeat(&false)))
        .map(|(o, &b)| {
            if b && o.shape().first().is_some_and(|&n| n > rows) {
                o.slice_axis(Axis(0), ndarray::Slice::from(0..rows))
                    .to_owned()
            } else {
                o
            }
        })
        .collect()
}

/// A model compiled for each of its buckets.
pub struct BucketedModel {
    /// Ascending by bucket.
    models: Vec<(usize, Model)>,
    /// By input position: carries the batch.
    batched_in: Vec<bool>,
    /// By output position: carries the batch.
    batched_out: Vec<bool>,
}

impl std::fmt::Debug for BucketedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BucketedModel")
            .field("buckets", &self.buckets())
            .finish()
    }
}

impl BucketedModel {
    /// Loads an ONNX file for every bucket: each bucket's tasks take their best records from
    /// `opts.db` (or their default schedules) as [`Model::load`] does.
    pub fn load(
        path: impl AsRef<Path>,
        opts: &LoadOptions,
        buckets: &[usize],
    ) -> Result<BucketedModel, Error> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| tensortune_model::ModelError::Io {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        BucketedModel::from_bytes(&bytes, opts, buckets)
    }

    /// [`BucketedModel::load`] from the bytes of a model.
    pub fn from_bytes(
        bytes: &[u8],
        opts: &LoadOptions,
        buckets: &[usize],
    ) -> Result<BucketedModel, Error> {
        if buckets.is_empty() {
            return Err(Error::Inputs("no buckets given".into()));
        }
        let batched_in = batched_inputs(&tensortune_model::import::declared_inputs(bytes)?)?;
        let plans = bucket_plans(bytes, &opts.import, buckets)?;
        let batched_out = batched_outputs(bytes, &opts.import, &plans)?;
        let models = plans
            .into_iter()
            .map(|(b, plan)| Ok((b, Model::from_plan(plan, opts)?)))
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(BucketedModel {
            models,
            batched_in,
            batched_out,
        })
    }

    /// The buckets, ascending.
    pub fn buckets(&self) -> Vec<usize> {
        self.models.iter().map(|(b, _)| *b).collect()
    }

    /// The model of bucket `batch`, if it is one.
    pub fn model(&self, batch: usize) -> Option<&Model> {
        self.models
            .iter()
            .find(|(b, _)| *b == batch)
            .map(|(_, m)| m)
    }

    /// The bucket a batch of `n` runs on: the smallest at or above `n`, or the largest (the
    /// batch then runs in chunks).
    pub fn bucket_for(&self, n: usize) -> usize {
        self.models
            .iter()
            .map(|(b, _)| *b)
            .find(|&b| b >= n)
            .or_else(|| self.models.last().map(|(b, _)| *b))
            .unwrap_or(1)
    }

    /// By output position: whether the output carries the batch (and is sliced to it).
    pub fn batched_outputs(&self) -> &[bool] {
        &self.batched_out
    }

    /// `inputs` with every batched input padded with zero rows to `bucket` rows.
    pub fn pad_inputs(&self, inputs: &[ArrayViewD<'_, f32>], bucket: usize) -> Vec<ArrayD<f32>> {
        inputs
            .iter()
            .zip(self.batched_in.iter().chain(std::iter::repeat(&false)))
            .map(|(a, &batched)| {
                if batched {
                    pad_batch(a, bucket)
                } else {
                    a.to_owned()
                }
            })
            .collect()
    }

    /// The batch of `inputs`: the first dimension shared by every batched input.
    pub fn batch_of(&self, inputs: &[ArrayViewD<'_, f32>]) -> Result<usize, Error> {
        if inputs.len() != self.batched_in.len() {
            return Err(Error::Inputs(format!(
                "the model takes {} inputs, got {}",
                self.batched_in.len(),
                inputs.len()
            )));
        }
        let mut batch = None;
        for (i, (a, batched)) in inputs.iter().zip(&self.batched_in).enumerate() {
            if !batched {
                continue;
            }
            let n = a.shape().first().copied().unwrap_or(0);
            if n == 0 {
                return Err(Error::Inputs(format!("input {i} has an empty batch")));
            }
            match batch {
                None => batch = Some(n),
                Some(m) if m != n => {
                    return Err(Error::Inputs(format!(
                        "the inputs disagree on the batch: {m} and {n}"
                    )))
                }
                Some(_) => {}
            }
        }
        batch.ok_or_else(|| Error::Inputs("no input carries the batch".into()))
    }

    /// Runs a batch of any size: on the smallest bucket that holds it, padded with zero rows,
    /// or in chunks of the largest bucket; the outputs that carry the batch are sliced (and
    /// joined) back to it.
    pub fn run(&self, inputs: &[ArrayViewD<'_, f32>]) -> Result<Vec<ArrayD<f32>>, Error> {
        let n = self.batch_of(inputs)?;
        let largest = self.models.last().map_or(1, |(b, _)| *b);
        let fixed_outputs = self.batched_out.iter().any(|b| !b);
        if n > largest && fixed_outputs {
            return Err(Error::Inputs(format!(
                "a batch of {n} is larger than the largest bucket ({largest}) and an output of \
                 the model does not carry the batch, so the batch cannot be run in chunks"
            )));
        }
        let mut parts: Vec<Vec<ArrayD<f32>>> = Vec::new();
        let mut start = 0;
        while start < n {
            let rows = (n - start).min(largest);
            let bucket = self.bucket_for(rows);
            let model = self
                .model(bucket)
                .ok_or_else(|| Error::Inputs(format!("no bucket {bucket}")))?;
            let rows_of: Vec<ArrayViewD<'_, f32>> = inputs
                .iter()
                .zip(&self.batched_in)
                .map(|(a, &batched)| {
                    if batched {
                        a.slice_axis(Axis(0), ndarray::Slice::from(start..start + rows))
                    } else {
                        a.view()
                    }
                })
                .collect();
            let chunk = self.pad_inputs(&rows_of, bucket);
            let views: Vec<_> = chunk.iter().map(|a| a.view()).collect();
            parts.push(slice_outputs(model.run(&views)?, &self.batched_out, rows));
            start += rows;
        }
        let outputs = self.batched_out.len();
        (0..outputs)
            .map(|k| {
                if !self.batched_out[k] || parts.len() == 1 {
                    return parts
                        .first()
                        .and_then(|p| p.get(k).cloned())
                        .ok_or_else(|| Error::Inputs("the model gave no output".into()));
                }
                let views: Vec<_> = parts
                    .iter()
                    .filter_map(|p| p.get(k))
                    .map(|a| a.view())
                    .collect();
                ndarray::concatenate(Axis(0), &views).map_err(|e| Error::Run {
                    step: "joining the chunks".into(),
                    reason: e.to_string(),
                })
            })
            .collect()
    }
}

//! The correctness reference every backend checks its candidates against: random inputs from
//! a seed, the outputs the direct evaluator computes from them, and the comparison under
//! [`tolerance`]. A backend uploads the inputs however it runs programs (host buffers, device
//! memory), brings the outputs back as [`OutputView`]s and calls [`Reference::check`]; the CPU
//! measurer does exactly that.

use super::internal;
use tensortune_schedules::data::{bf16_to_f32, rel_diff, Data, NdData};
use tensortune_schedules::te::OpKind;
use tensortune_schedules::{eval, ComputeDag, DType, Expr};
use tensortune_tuner::measure::{MeasureError, MeasureErrorKind};

/// How thoroughly outputs are checked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CheckOptions {
    /// Workloads of up to this many FLOPs are evaluated whole and every output element is
    /// compared; larger ones at `check_points` sampled elements per output (the evaluator is
    /// an interpreter, far too slow for whole large workloads).
    pub full_check_max_flops: f64,
    /// Sampled elements per output of a large workload.
    pub check_points: usize,
    /// Seed of the sample.
    pub seed: u64,
}

impl CheckOptions {
    /// Every element of every output compared, however large the workload (for tests and
    /// one-off checks: the evaluator is slow).
    pub fn every_element() -> CheckOptions {
        CheckOptions {
            full_check_max_flops: f64::INFINITY,
            check_points: 0,
            seed: 0,
        }
    }
}

/// Reference outputs and tolerance for one workload and its inputs.
pub struct Reference {
    expected: Expected,
    tol: f64,
}

/// What a candidate's outputs are compared with.
enum Expected {
    /// Every element of every output (the evaluator ran on the whole DAG).
    Full(Vec<NdData>),
    /// Sampled elements of each output, `(flat indices, values)` per output, for workloads
    /// too large to evaluate whole; the rest of each float output must at least be written
    /// (no NaN left of the poison fill).
    Points(Vec<(Vec<i64>, Vec<f64>)>),
}

/// One output of a candidate as the check reads it: its elements, row-major.
#[derive(Clone, Copy, Debug)]
pub enum OutputView<'a> {
    /// `f32` elements.
    F32(&'a [f32]),
    /// `f64` elements.
    F64(&'a [f64]),
    /// `i32` elements.
    I32(&'a [i32]),
    /// `bf16` elements, as their bits.
    BF16(&'a [u16]),
}

impl<'a> OutputView<'a> {
    /// The elements of host data.
    pub fn of_nd(nd: &'a NdData) -> OutputView<'a> {
        match &nd.data {
            Data::F32(v) => OutputView::F32(v),
            Data::F64(v) => OutputView::F64(v),
            Data::I32(v) => OutputView::I32(v),
            Data::BF16(v) => OutputView::BF16(v),
        }
    }

    fn len(&self) -> usize {
        match self {
            OutputView::F32(s) => s.len(),
            OutputView::F64(s) => s.len(),
            OutputView::I32(s) => s.len(),
            OutputView::BF16(s) => s.len(),
        }
    }

    fn get(&self, i: usize) -> Option<f64> {
        match self {
            OutputView::F32(s) => s.get(i).map(|&x| x as f64),
            OutputView::F64(s) => s.get(i).copied(),
            OutputView::I32(s) => s.get(i).map(|&x| x as f64),
            OutputView::BF16(s) => s.get(i).map(|&x| bf16_to_f32(x) as f64),
        }
    }

    fn dtype(&self) -> DType {
        match self {
            OutputView::F32(_) => DType::F32,
            OutputView::F64(_) => DType::F64,
            OutputView::I32(_) => DType::I32,
            OutputView::BF16(_) => DType::BF16,
        }
    }

    /// True if a float output still holds NaN (the poison of elements never written).
    fn has_nan(&self) -> bool {
        match self {
            OutputView::F32(s) => s.iter().any(|x| x.is_nan()),
            OutputView::F64(s) => s.iter().any(|x| x.is_nan()),
            OutputView::I32(_) => false,
            OutputView::BF16(s) => s.iter().any(|&x| bf16_to_f32(x).is_nan()),
        }
    }
}

impl Reference {
    /// The reference of `dag` on `inputs` (from [`random_inputs`]): whole outputs for small
    /// workloads, sampled elements for large ones (see [`CheckOptions`]).
    pub fn new(
        dag: &ComputeDag,
        inputs: &[NdData],
        opts: &CheckOptions,
    ) -> Result<Reference, MeasureError> {
        let ref_err =
            |e: tensortune_schedules::scalar::EvalError| internal(format!("reference: {e}"));
        let out_ops: Vec<_> = dag.outputs().iter().map(|&t| dag.op(t)).collect();
        let dtype = out_ops.first().map(|o| o.dtype).unwrap_or(DType::F32);
        let expected = if dag.flops() <= opts.full_check_max_flops {
            Expected::Full(eval::evaluate(dag, inputs).map_err(ref_err)?)
        } else {
            let mut per_output = Vec::new();
            for (o, op) in out_ops.iter().enumerate() {
                let n: i64 = op.shape.iter().product();
                let points = sample_points(n, opts.check_points, opts.seed);
                let values = eval::evaluate_points(dag, inputs, o, &points).map_err(ref_err)?;
                per_output.push((points, values));
            }
            Expected::Points(per_output)
        };
        Ok(Reference {
            expected,
            tol: tolerance(dtype, max_reduction_len(dag)),
        })
    }

    /// The relative tolerance outputs are held to.
    pub fn tolerance(&self) -> f64 {
        self.tol
    }

    /// [`Reference::check`] of host arrays.
    pub fn check_nd(&self, outputs: &[NdData]) -> Result<(), MeasureError> {
        let views: Vec<OutputView<'_>> = outputs.iter().map(OutputView::of_nd).collect();
        self.check(&views)
    }

    /// `Ok` when `outputs` (one per output of the DAG, in order) match the reference within
    /// the tolerance; else a `WrongResult` error naming the output and how far it is off.
    pub fn check(&self, outputs: &[OutputView<'_>]) -> Result<(), MeasureError> {
        let tol = self.tol;
        let wanted = match &self.expected {
            Expected::Full(w) => w.len(),
            Expected::Points(w) => w.len(),
        };
        if outputs.len() != wanted {
            return Err(internal(format!(
                "{} outputs to check against a reference of {wanted}",
                outputs.len()
            )));
        }
        match &self.expected {
            Expected::Full(want) => {
                for (i, (o, w)) in outputs.iter().zip(want).enumerate() {
                    if o.len() != w.data.len() || o.dtype() != w.data.dtype() {
                        return Err(internal(format!(
                            "output {i} has another shape or dtype than the reference"
                        )));
                    }
                    let mut d = 0.0f64;
                    for j in 0..o.len() {
                        d = d.max(rel_diff(o.get(j).unwrap_or(f64::NAN), w.data.get_f64(j)));
                    }
                    if d.is_nan() || d > tol {
                        return Err(wrong(i, d, tol));
                    }
                }
            }
            Expected::Points(want) => {
                for (i, (o, (points, values))) in outputs.iter().zip(want).enumerate() {
                    // The whole output is scanned for the poison of unwritten elements.
                    if o.has_nan() {
                        return Err(MeasureError::new(
                            MeasureErrorKind::WrongResult,
                            format!("output {i} has elements left unwritten (NaN)"),
                        ));
                    }
                    for (&p, &w) in points.iter().zip(values) {
                        let g =
                            usize::try_from(p)
                                .ok()
                                .and_then(|p| o.get(p))
                                .ok_or_else(|| {
                                    internal(format!("check point {p} outside output {i}"))
                                })?;
                        let d = rel_diff(g, w);
                        if d.is_nan() || d > tol {
                            return Err(wrong(i, d, tol));
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

fn wrong(i: usize, d: f64, tol: f64) -> MeasureError {
    MeasureError::new(
        MeasureErrorKind::WrongResult,
        format!("output {i} differs from the reference by {d:.3e} (tolerance {tol:.1e})"),
    )
}

/// Relative tolerance (as in [`NdData::max_rel_diff`]) for outputs of `dtype` computed through
/// reductions of up to `reduce_len` terms in a different order than the reference: rounding
/// errors of a sum grow like the square root of its length for random data, and with a
/// margin of 16 ulps per term-root for `exp`/`log` and fused multiply-adds. Integers are exact.
pub fn tolerance(dtype: DType, reduce_len: i64) -> f64 {
    let growth = (reduce_len.max(1) as f64).sqrt();
    match dtype {
        DType::F32 => 16.0 * f32::EPSILON as f64 * growth,
        DType::F64 => 16.0 * f64::EPSILON * growth,
        _ => 0.0,
    }
}

/// The longest reduction of any stage of `dag` (product of its reduce axes), 1 if none.
pub fn max_reduction_len(dag: &ComputeDag) -> i64 {
    let mut worst = 1i64;
    for op in dag.ops() {
        if let OpKind::Compute { body, .. } = &op.kind {
            body.visit(&mut |e| {
                if let Expr::Reduce { axes, .. } = e {
                    let n = axes.iter().map(|a| a.extent.max(1)).product::<i64>();
                    worst = worst.max(n);
                }
            });
        }
    }
    worst
}

/// Random inputs of `dag` from `seed`, in its input order.
pub fn random_inputs(dag: &ComputeDag, seed: u64) -> Result<Vec<NdData>, MeasureError> {
    dag.inputs()
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            let op = dag.op(t);
            NdData::random(
                &op.shape,
                op.dtype,
                seed.wrapping_mul(31).wrapping_add(i as u64),
            )
            .map_err(|e| internal(format!("input `{}`: {e}", op.name)))
        })
        .collect()
}

/// `count` distinct-ish flat indices in `[0, n)`: the first and last element and
/// pseudo-random ones from `seed`.
fn sample_points(n: i64, count: usize, seed: u64) -> Vec<i64> {
    if n <= 0 {
        return Vec::new();
    }
    let mut rng = tensortune_schedules::data::SplitMix64(seed ^ 0x5eed);
    let mut pts = vec![0, n - 1];
    while pts.len() < count.max(2) && (pts.len() as i64) < n {
        pts.push((rng.next_u64() % n as u64) as i64);
    }
    pts
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensortune_schedules::ops::WorkloadSpec;

    fn matmul() -> ComputeDag {
        WorkloadSpec::parse("matmul:M=6,N=5,K=7")
            .and_then(|s| s.build())
            .expect("dag")
    }

    #[test]
    fn the_evaluators_outputs_pass_and_a_changed_element_does_not() {
        let dag = matmul();
        let ins = random_inputs(&dag, 3).expect("inputs");
        let want = eval::evaluate(&dag, &ins).expect("eval");
        for opts in [
            CheckOptions {
                full_check_max_flops: f64::INFINITY,
                check_points: 0,
                seed: 3,
            },
            // Sampled: every element of 30 is drawn at 64 points.
            CheckOptions {
                full_check_max_flops: 0.0,
                check_points: 64,
                seed: 3,
            },
        ] {
            let r = Reference::new(&dag, &ins, &opts).expect("reference");
            let views: Vec<_> = want.iter().map(OutputView::of_nd).collect();
            assert_eq!(r.check(&views), Ok(()));
            let mut bad = want[0].clone();
            if let Data::F32(v) = &mut bad.data {
                v[29] += 1e-2;
            }
            let e = r.check(&[OutputView::of_nd(&bad)]).expect_err("caught");
            assert_eq!(e.kind, MeasureErrorKind::WrongResult, "{e}");
            if let Data::F32(v) = &mut bad.data {
                v[29] = f32::NAN;
            }
            assert!(r.check(&[OutputView::of_nd(&bad)]).is_err(), "NaN caught");
            assert_eq!(
                r.check(&[]).map_err(|e| e.kind),
                Err(MeasureErrorKind::Internal),
                "a missing output is the measurer's error"
            );
        }
    }
}

//! `MaxPool`, `AveragePool`, `GlobalAveragePool` and `GlobalMaxPool` on NCHW images.
//!
//! A window op reads a padded copy of its input (a stage of its own, as the library's
//! convolution has): `-3.4e38` for max pooling, so a pad never wins, and 0 for average
//! pooling. The average divides by how many elements of each window count
//! (`count_include_pad`, and windows that `ceil_mode` lets run past the padding), which
//! depends only on the output position: `Pool::divisors` computes it once, at import, and
//! the kernel reads its reciprocal as an input.

use super::{dims, nchw, pad_stage, pads, pair, Anchor};
use crate::graph::{Graph, Node};
use crate::ModelError;
use tensortune_schedules::expr::{max_reduce, sum, DType, Expr};
use tensortune_schedules::te::{Graph as Te, Tensor};

/// A 2-D pooling op's parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool {
    /// Max (else average).
    pub max: bool,
    /// Input `[N, C, H, W]`.
    pub input: [usize; 4],
    /// Window `[R, S]`.
    pub kernel: [usize; 2],
    /// Strides.
    pub strides: [usize; 2],
    /// Dilations.
    pub dilations: [usize; 2],
    /// Padding `[top, left, bottom, right]`.
    pub pads: [usize; 4],
    /// Output `[P, Q]`.
    pub out: [usize; 2],
    /// Average pooling counts padded elements.
    pub count_include_pad: bool,
}

impl Pool {
    /// Reads a pooling node.
    pub fn from_node(node: &Node, graph: &Graph) -> Result<Pool, ModelError> {
        let input = nchw(node, graph, 0)?;
        let [_, _, h, w] = input;
        let max = node.op.contains("Max");
        if node.outputs.len() > 1 {
            return Err(ModelError::unsupported(node, "the Indices output"));
        }
        if node.op.starts_with("Global") {
            return Ok(Pool {
                max,
                input,
                kernel: [h, w],
                strides: [1, 1],
                dilations: [1, 1],
                pads: [0; 4],
                out: [1, 1],
                count_include_pad: false,
            });
        }
        if node.int("storage_order", 0)? != 0 {
            return Err(ModelError::unsupported(node, "storage_order 1"));
        }
        let kernel = match node.ints("kernel_shape")?.as_deref() {
            Some(&[r, s]) if r >= 1 && s >= 1 => [r as usize, s as usize],
            other => {
                return Err(ModelError::invalid(
                    node,
                    format!("kernel_shape {other:?} (two positive integers)"),
                ))
            }
        };
        let strides = pair(node, "strides", 1)?;
        let dilations = pair(node, "dilations", 1)?;
        let win = [
            (kernel[0] - 1) * dilations[0] + 1,
            (kernel[1] - 1) * dilations[1] + 1,
        ];
        let pads = pads(node, [h, w], win, strides)?;
        let ceil = node.int("ceil_mode", 0)? != 0;
        let mut out = [0; 2];
        for d in 0..2 {
            let span = [h, w][d] + pads[d] + pads[d + 2];
            if win[d] > span {
                return Err(ModelError::invalid(
                    node,
                    format!("window {win:?} is larger than the padded input"),
                ));
            }
            let steps = span - win[d];
            let mut o = if ceil {
                steps.div_ceil(strides[d])
            } else {
                steps / strides[d]
            } + 1;
            // A window that would start in the padding at the end is dropped (ONNX, PyTorch).
            if ceil && (o - 1) * strides[d] >= [h, w][d] + pads[d] {
                o -= 1;
            }
            out[d] = o;
        }
        let count_include_pad = node.int("count_include_pad", 0)? != 0;
        Ok(Pool {
            max,
            input,
            kernel,
            strides,
            dilations,
            pads,
            out,
            count_include_pad,
        })
    }

    /// The extent of the padded input the windows read (`ceil_mode` may read past the pads).
    fn padded(&self) -> [usize; 2] {
        let mut p = [0; 2];
        for (d, slot) in p.iter_mut().enumerate() {
            let win = (self.kernel[d] - 1) * self.dilations[d] + 1;
            let reach = (self.out[d] - 1) * self.strides[d] + win;
            *slot = reach.max(self.input[d + 2] + self.pads[d] + self.pads[d + 2]);
        }
        p
    }

    /// Whether the average needs per-position divisors (else one constant divides all).
    fn varying(&self) -> bool {
        !self.max && (self.pads != [0; 4] || self.padded() != [self.input[2], self.input[3]])
    }

    /// For average pooling with varying windows: `1 / count` per output position `[P, Q]`.
    fn divisors(&self) -> Option<Vec<f32>> {
        if !self.varying() {
            return None;
        }
        let [_, _, h, w] = self.input;
        let count_axis = |d: usize, o: usize| {
            let (size, begin) = ([h, w][d], self.pads[d]);
            let limit = if self.count_include_pad {
                size + self.pads[d] + self.pads[d + 2]
            } else {
                size + begin
            };
            let first = if self.count_include_pad { 0 } else { begin };
            (0..self.kernel[d])
                .map(|r| o * self.strides[d] + r * self.dilations[d])
                .filter(|&p| p >= first && p < limit)
                .count()
        };
        let mut v = Vec::with_capacity(self.out[0] * self.out[1]);
        for y in 0..self.out[0] {
            for x in 0..self.out[1] {
                let n = count_axis(0, y) * count_axis(1, x);
                v.push(if n == 0 { 0.0 } else { 1.0 / n as f32 });
            }
        }
        Some(v)
    }
}

impl Anchor for Pool {
    fn key(&self) -> String {
        let [n, c, h, w] = self.input;
        let [t, l, b, r] = self.pads;
        format!(
            "onnx_{}pool2d:N={n},C={c},H={h},W={w},kernel={},stride={},dilation={},pad={t}x{l}x{b}x{r},out={}{}",
            if self.max { "max" } else { "avg" },
            dims(&self.kernel),
            dims(&self.strides),
            dims(&self.dilations),
            dims(&self.out),
            if self.count_include_pad { ",count_pad=1" } else { "" }
        )
    }

    fn out_shape(&self) -> Vec<usize> {
        vec![self.input[0], self.input[1], self.out[0], self.out[1]]
    }

    fn inputs(&self) -> usize {
        1
    }

    fn constants(&self) -> Vec<ndarray::ArrayD<f32>> {
        let shape = ndarray::IxDyn(&self.out);
        self.divisors()
            .and_then(|d| ndarray::ArrayD::from_shape_vec(shape, d).ok())
            .into_iter()
            .collect()
    }

    fn build(&self, g: &mut Te) -> (Vec<Tensor>, Tensor) {
        let i = |v: usize| v as i64;
        let [n, c, h, w] = self.input;
        let data = g.placeholder("data", &[i(n), i(c), i(h), i(w)], DType::F32);
        let fill = if self.max { f32::MIN } else { 0.0 };
        let padded = pad_stage(
            g,
            data,
            self.input,
            self.padded(),
            [self.pads[0], self.pads[1]],
            fill,
        );
        let ry = g.reduce_axis(i(self.kernel[0]), "ry");
        let rx = g.reduce_axis(i(self.kernel[1]), "rx");
        let [sh, sw] = self.strides.map(i);
        let [dh, dw] = self.dilations.map(i);
        let shape: Vec<i64> = self.out_shape().iter().map(|&d| d as i64).collect();
        let name = if self.max { "max_pool" } else { "sum_pool" };
        let pooled = g.compute(name, &shape, &["n", "c", "y", "x"], |ax| {
            let v = padded.at([
                ax[0].clone(),
                ax[1].clone(),
                &ax[2] * sh + ry.expr() * dh,
                &ax[3] * sw + rx.expr() * dw,
            ]);
            if self.max {
                max_reduce(v, [&ry, &rx])
            } else {
                sum(v, [&ry, &rx])
            }
        });
        if self.max {
            return (vec![data], pooled);
        }
        if !self.varying() {
            let inv = 1.0 / (self.kernel[0] * self.kernel[1]) as f32;
            let avg = g.compute("avg_pool", &shape, &["n", "c", "y", "x"], |ax| {
                pooled.at(ax.to_vec()) * Expr::f32(inv)
            });
            return (vec![data], avg);
        }
        let inv = g.placeholder("inv_count", &[i(self.out[0]), i(self.out[1])], DType::F32);
        let avg = g.compute("avg_pool", &shape, &["n", "c", "y", "x"], |ax| {
            pooled.at(ax.to_vec()) * inv.at([ax[2].clone(), ax[3].clone()])
        });
        (vec![data, inv], avg)
    }
}

//! `Conv` on NCHW images, with groups (depthwise and grouped convolutions), strides,
//! dilations and asymmetric padding. The bias is not part of the anchor: it is the first term
//! of the epilogue, so a bias and the activation after it are one fused stage.
//!
//! Where the weights are a constant of the model and the convolution has one group, the
//! kernel reads them laid out `[R, S, C, K]` (output channels last, TensorFlow's HWIO),
//! transposed once at import: the search can then vectorize along the output channels and
//! read the weights in place, where ONNX's `[K, C, R, S]` needs a transposing copy in every
//! run. That copy cost the deep layers of a network the most, whose weights are large beside
//! their pixels (a 7x7 layer of 512 channels uses each weight 49 times; docs/measurements.md,
//! "Weights laid out output channels last").

use super::{nchw, pad_stage, pads, pair, Anchor};
use crate::graph::{Data, Graph, Node};
use crate::ModelError;
use ndarray::ArrayD;
use tensortune_schedules::expr::{sum, DType, Expr};
use tensortune_schedules::te::{Graph as Te, Tensor};

/// A 2-D convolution's parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Conv {
    /// Input `[N, C, H, W]`.
    pub input: [usize; 4],
    /// Output channels.
    pub k: usize,
    /// Groups.
    pub groups: usize,
    /// Kernel `[R, S]`.
    pub kernel: [usize; 2],
    /// Strides.
    pub strides: [usize; 2],
    /// Dilations.
    pub dilations: [usize; 2],
    /// Padding `[top, left, bottom, right]`.
    pub pads: [usize; 4],
    /// Output `[P, Q]`.
    pub out: [usize; 2],
    /// The constant weights transposed to `[R, S, C, K]`, which the kernel then reads in
    /// place of the node's weight input (see the module doc); `None` where they are not
    /// constant or the convolution has groups.
    pub hwio: Option<HwioWeights>,
}

/// A convolution's constant weights laid out `[R, S, C, K]`.
#[derive(Clone, PartialEq)]
pub struct HwioWeights(pub ArrayD<f32>);

impl std::fmt::Debug for HwioWeights {
    /// The shape only: the weights of one layer can be megabytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HwioWeights{:?}", self.0.shape())
    }
}

impl Conv {
    /// Reads a `Conv` node; its weight must be `[K, C/groups, R, S]`.
    pub fn from_node(node: &Node, graph: &Graph) -> Result<Conv, ModelError> {
        let input = nchw(node, graph, 0)?;
        let w = nchw(node, graph, 1)?;
        let groups = node.int("group", 1)?;
        let [n, c, h, wd] = input;
        let [k, cg, r, s] = w;
        let groups = usize::try_from(groups)
            .ok()
            .filter(|&g| g >= 1 && c % g == 0 && k % g == 0)
            .ok_or_else(|| {
                ModelError::invalid(
                    node,
                    format!("group {groups} does not divide {c} input and {k} output channels"),
                )
            })?;
        if cg * groups != c {
            return Err(ModelError::invalid(
                node,
                format!("weight {w:?} does not fit {c} channels in {groups} groups"),
            ));
        }
        if let Some(ks) = node.ints("kernel_shape")? {
            if ks != [r as i64, s as i64] {
                return Err(ModelError::invalid(
                    node,
                    format!("kernel_shape {ks:?} differs from the weight's {r}x{s}"),
                ));
            }
        }
        let strides = pair(node, "strides", 1)?;
        let dilations = pair(node, "dilations", 1)?;
        let win = [(r - 1) * dilations[0] + 1, (s - 1) * dilations[1] + 1];
        let pads = pads(node, [h, wd], win, strides)?;
        let (ph, pw) = (h + pads[0] + pads[2], wd + pads[1] + pads[3]);
        if win[0] > ph || win[1] > pw || n == 0 {
            return Err(ModelError::invalid(
                node,
                format!("kernel {r}x{s} is larger than the padded input {ph}x{pw}"),
            ));
        }
        let out = [
            (ph - win[0]) / strides[0] + 1,
            (pw - win[1]) / strides[1] + 1,
        ];
        let hwio = match graph.constant(node.input(1)?) {
            Some(Data::F32(kcrs)) if groups == 1 && kcrs.shape() == [k, cg, r, s] => {
                Some(HwioWeights(
                    kcrs.view()
                        .permuted_axes(ndarray::IxDyn(&[2, 3, 1, 0]))
                        .as_standard_layout()
                        .into_owned(),
                ))
            }
            _ => None,
        };
        Ok(Conv {
            input,
            k,
            groups,
            kernel: [r, s],
            strides,
            dilations,
            pads,
            out,
            hwio,
        })
    }

    fn channels_per_group(&self) -> (usize, usize) {
        (self.input[1] / self.groups, self.k / self.groups)
    }

    /// A convolution whose groups each have more than one channel in or out: computed as
    /// `[N, G, K/G, P, Q]`, so that the input channel `g·C/G + c` stays affine.
    fn five_d(&self) -> bool {
        let (cg, kg) = self.channels_per_group();
        self.groups > 1 && (cg > 1 || kg > 1)
    }
}

impl Anchor for Conv {
    fn key(&self) -> String {
        let [n, c, h, w] = self.input;
        let [r, s] = self.kernel;
        let [t, l, b, rt] = self.pads;
        // A different kernel (it reads other weights), so another workload.
        let name = if self.hwio.is_some() {
            "onnx_conv2d_hwio"
        } else {
            "onnx_conv2d"
        };
        format!(
            "{name}:N={n},C={c},H={h},W={w},K={},G={},R={r},S={s},stride={}x{},dilation={}x{},pad={t}x{l}x{b}x{rt}",
            self.k, self.groups, self.strides[0], self.strides[1], self.dilations[0], self.dilations[1]
        )
    }

    fn out_shape(&self) -> Vec<usize> {
        vec![self.input[0], self.k, self.out[0], self.out[1]]
    }

    fn kernel_shape(&self) -> Vec<usize> {
        let (_, kg) = self.channels_per_group();
        if self.five_d() {
            vec![self.input[0], self.groups, kg, self.out[0], self.out[1]]
        } else {
            self.out_shape()
        }
    }

    fn inputs(&self) -> usize {
        // With HWIO weights the kernel's second input is that constant, not the node's.
        if self.hwio.is_some() {
            1
        } else {
            2
        }
    }

    fn constants(&self) -> Vec<ArrayD<f32>> {
        self.hwio.iter().map(|w| w.0.clone()).collect()
    }

    fn logical(&self, axes: &[Expr]) -> Vec<Expr> {
        if !self.five_d() {
            return axes.to_vec();
        }
        let (_, kg) = self.channels_per_group();
        let k = &axes[1] * kg as i64 + axes[2].clone();
        vec![axes[0].clone(), k, axes[3].clone(), axes[4].clone()]
    }

    fn build(&self, g: &mut Te) -> (Vec<Tensor>, Tensor) {
        let [n, c, h, w] = self.input;
        let (cg, kg) = self.channels_per_group();
        let [r, s] = self.kernel;
        let i = |v: usize| v as i64;
        let data = g.placeholder("data", &[i(n), i(c), i(h), i(w)], DType::F32);
        let weight_shape = if self.hwio.is_some() {
            [i(r), i(s), i(cg), i(self.k)]
        } else {
            [i(self.k), i(cg), i(r), i(s)]
        };
        let weight = g.placeholder("weight", &weight_shape, DType::F32);
        let padded_hw = [
            h + self.pads[0] + self.pads[2],
            w + self.pads[1] + self.pads[3],
        ];
        let padded = pad_stage(
            g,
            data,
            self.input,
            padded_hw,
            [self.pads[0], self.pads[1]],
            0.0,
        );
        let ry = g.reduce_axis(i(r), "ry");
        let rx = g.reduce_axis(i(s), "rx");
        let [sh, sw] = self.strides.map(i);
        let [dh, dw] = self.dilations.map(i);
        let at = |y: &Expr, x: &Expr| (y * sh + ry.expr() * dh, x * sw + rx.expr() * dw);
        let shape: Vec<i64> = self.kernel_shape().iter().map(|&d| d as i64).collect();
        let out = if self.five_d() {
            let rc = g.reduce_axis(i(cg), "rc");
            g.compute("conv", &shape, &["n", "g", "k", "y", "x"], |ax| {
                let (y, x) = at(&ax[3], &ax[4]);
                let ch = &ax[1] * i(cg) + rc.expr();
                let oc = &ax[1] * i(kg) + ax[2].clone();
                sum(
                    padded.at([ax[0].clone(), ch, y, x])
                        * weight.at([oc, rc.expr(), ry.expr(), rx.expr()]),
                    [&rc, &ry, &rx],
                )
            })
        } else if self.groups > 1 {
            // Depthwise with one output per input channel: channel k reads channel k.
            g.compute("conv", &shape, &["n", "k", "y", "x"], |ax| {
                let (y, x) = at(&ax[2], &ax[3]);
                sum(
                    padded.at([ax[0].clone(), ax[1].clone(), y, x])
                        * weight.at([ax[1].clone(), Expr::int(0), ry.expr(), rx.expr()]),
                    [&ry, &rx],
                )
            })
        } else {
            let rc = g.reduce_axis(i(c), "rc");
            let hwio = self.hwio.is_some();
            g.compute("conv", &shape, &["n", "k", "y", "x"], |ax| {
                let (y, x) = at(&ax[2], &ax[3]);
                let w = if hwio {
                    weight.at([ry.expr(), rx.expr(), rc.expr(), ax[1].clone()])
                } else {
                    weight.at([ax[1].clone(), rc.expr(), ry.expr(), rx.expr()])
                };
                sum(
                    padded.at([ax[0].clone(), rc.expr(), y, x]) * w,
                    [&rc, &ry, &rx],
                )
            })
        };
        (vec![data, weight], out)
    }
}

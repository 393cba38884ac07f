//! The op library and workload specs.
//!
//! A workload spec names one op at one shape: `NAME:KEY=VALUE,...`, e.g.
//! `matmul:M=1024,N=1024,K=1024` or
//! `conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1`. Values are positive integers,
//! except the optional `dtype` (`f32` by default, or `f64`, `i32`). The canonical form sorts
//! the keys (byte order, so upper-case shape keys come before `dtype`, `pad`, `stride`) and
//! fills the defaults; it is the workload key of the records database.
//!
//! ```
//! use tensortune_schedules::ops::WorkloadSpec;
//! let w = WorkloadSpec::parse("matmul:N=8,M=4,K=2").unwrap();
//! assert_eq!(w.canonical(), "matmul:K=2,M=4,N=8,dtype=f32");
//! assert_eq!(w.flops(), 2.0 * 4.0 * 8.0 * 2.0);
//! ```

use crate::dag::{ComputeDag, DagError};
use crate::expr::{self, dot_bf16, pack_bf16, select, sum, Const, DType, Expr};
use crate::te::{Graph, Tensor};
use crate::text::single_line;
use std::collections::BTreeMap;
use std::fmt;

/// Largest value accepted for one shape key.
pub const MAX_DIM: i64 = 1 << 24;
/// Largest number of elements accepted for one tensor.
pub const MAX_ELEMENTS: i64 = 1 << 34;

/// One op of the library, for listings and spec checking.
#[derive(Clone, Copy, Debug)]
pub struct OpDesc {
    /// Name used in specs.
    pub name: &'static str,
    /// Required integer keys.
    pub required: &'static [&'static str],
    /// Optional integer keys with their defaults.
    pub optional: &'static [(&'static str, i64)],
    /// Inputs in order, and the output, as text.
    pub signature: &'static str,
    /// One line of description.
    pub about: &'static str,
}

/// Every op of the library.
pub const OPS: &[OpDesc] = &[
    OpDesc {
        name: "matmul",
        required: &["M", "N", "K"],
        optional: &[],
        signature: "A[M,K], B[K,N] -> C[M,N]",
        about: "matrix product C = A·B",
    },
    OpDesc {
        name: "batch_matmul",
        required: &["B", "M", "N", "K"],
        optional: &[],
        signature: "A[B,M,K], B[B,K,N] -> C[B,M,N]",
        about: "a batch of matrix products",
    },
    OpDesc {
        name: "dense_bias_relu",
        required: &["M", "N", "K"],
        optional: &[],
        signature: "X[M,K], W[N,K], bias[N] -> Y[M,N]",
        about: "Y = relu(X·Wᵀ + bias), three stages",
    },
    OpDesc {
        name: "conv2d",
        required: &["N", "C", "H", "W", "K", "R", "S"],
        optional: &[("stride", 1), ("pad", 0)],
        signature: "data[N,C,H,W], weight[K,C,R,S] -> out[N,K,P,Q]",
        about: "2-D convolution, NCHW, zero padding as its own stage",
    },
    OpDesc {
        name: "conv2d_hwio",
        required: &["N", "C", "H", "W", "K", "R", "S"],
        optional: &[("stride", 1), ("pad", 0)],
        signature: "data[N,C,H,W], weight[R,S,C,K] -> out[N,K,P,Q]",
        about: "conv2d with its weights laid out output channels last (HWIO), as a model's constant weights can be once at load",
    },
    OpDesc {
        name: "depthwise_conv2d",
        required: &["N", "C", "H", "W", "R", "S"],
        optional: &[("stride", 1), ("pad", 0)],
        signature: "data[N,C,H,W], weight[C,R,S] -> out[N,C,P,Q]",
        about: "depthwise 2-D convolution, NCHW",
    },
    OpDesc {
        name: "softmax",
        required: &["M", "N"],
        optional: &[],
        signature: "X[M,N] -> Y[M,N]",
        about: "softmax over the last axis: max, exp, sum, divide (four stages)",
    },
    OpDesc {
        name: "reduce_sum",
        required: &["M", "N"],
        optional: &[],
        signature: "X[M,N] -> Y[M]",
        about: "sum over the last axis",
    },
];

/// Why a workload spec is not valid.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// Nothing before the colon, or no colon.
    #[error("malformed workload spec `{}`: expected NAME:KEY=VALUE,... (e.g. matmul:M=64,N=64,K=64)", single_line(.spec))]
    Malformed {
        /// The spec.
        spec: String,
    },
    /// Not in the library.
    #[error("unknown op `{}`; known ops: {known}", single_line(.name))]
    UnknownOp {
        /// The name given.
        name: String,
        /// The library's names.
        known: String,
    },
    /// A `KEY=VALUE` item without `=`.
    #[error("malformed item `{}` in `{}`: expected KEY=VALUE", single_line(.item), single_line(.spec))]
    BadItem {
        /// The item.
        item: String,
        /// The spec.
        spec: String,
    },
    /// A key the op does not have.
    #[error("`{op}` has no key `{}`; its keys: {allowed}", single_line(.key))]
    UnknownKey {
        /// The op.
        op: String,
        /// The key.
        key: String,
        /// Its keys.
        allowed: String,
    },
    /// A key given twice.
    #[error("key `{}` given twice", single_line(.key))]
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// A required key not given.
    #[error("`{op}` needs key `{key}`")]
    MissingKey {
        /// The op.
        op: String,
        /// The key.
        key: String,
    },
    /// A value that is not a positive integer in range, or an unknown dtype.
    #[error("bad value `{}` for `{key}`: {reason}", single_line(.value))]
    BadValue {
        /// The key.
        key: String,
        /// The value.
        value: String,
        /// Why.
        reason: String,
    },
    /// Shapes that do not fit together (e.g. a kernel larger than the padded input).
    #[error("invalid shape for `{op}`: {reason}")]
    BadShape {
        /// The op.
        op: String,
        /// Why.
        reason: String,
    },
    /// The op's DAG failed validation (a bug in the library if it ever happens).
    #[error("`{op}` builds an invalid DAG: {source}")]
    Dag {
        /// The op.
        op: String,
        /// The DAG error.
        source: DagError,
    },
}

/// A parsed, checked workload spec.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WorkloadSpec {
    op: &'static OpDesc,
    values: BTreeMap<String, i64>,
    dtype: DType,
}

impl fmt::Display for WorkloadSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical())
    }
}

impl std::hash::Hash for OpDesc {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state)
    }
}
impl PartialEq for OpDesc {
    fn eq(&self, o: &Self) -> bool {
        self.name == o.name
    }
}
impl Eq for OpDesc {}

impl WorkloadSpec {
    /// Parses and checks a spec (see the module doc).
    pub fn parse(spec: &str) -> Result<WorkloadSpec, SpecError> {
        let spec = spec.trim();
        let malformed = || SpecError::Malformed {
            spec: spec.to_string(),
        };
        // A line break or other control character inside a spec is a pasting accident, not
        // spacing to trim: `M=2\n,N=2` should not quietly mean `M=2,N=2`.
        if spec.contains(char::is_control) {
            return Err(malformed());
        }
        let (name, rest) = spec.split_once(':').ok_or_else(malformed)?;
        let name = name.trim();
        if name.is_empty() {
            return Err(malformed());
        }
        let op = OPS
            .iter()
            .find(|o| o.name == name)
            .ok_or_else(|| SpecError::UnknownOp {
                name: name.to_string(),
                known: OPS.iter().map(|o| o.name).collect::<Vec<_>>().join(", "),
            })?;
        let allowed = || {
            let mut v: Vec<&str> = op.required.to_vec();
            v.extend(op.optional.iter().map(|(k, _)| *k));
            v.push("dtype");
            v.join(", ")
        };
        let mut values = BTreeMap::new();
        let mut dtype = None;
        for item in rest.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (k, v) = item.split_once('=').ok_or_else(|| SpecError::BadItem {
                item: item.to_string(),
                spec: spec.to_string(),
            })?;
            let (k, v) = (k.trim(), v.trim());
            if k == "dtype" {
                if dtype.is_some() {
                    return Err(SpecError::DuplicateKey { key: k.into() });
                }
                dtype = Some(match DType::parse(v) {
                    Some(d @ (DType::F32 | DType::F64 | DType::I32 | DType::BF16)) => d,
                    _ => {
                        return Err(SpecError::BadValue {
                            key: k.into(),
                            value: v.into(),
                            reason: "dtype must be f32, f64, i32 or bf16".into(),
                        })
                    }
                });
                continue;
            }
            let known = op.required.contains(&k) || op.optional.iter().any(|(o, _)| *o == k);
            if !known {
                return Err(SpecError::UnknownKey {
                    op: op.name.into(),
                    key: k.into(),
                    allowed: allowed(),
                });
            }
            let bad = |reason: &str| SpecError::BadValue {
                key: k.into(),
                value: v.into(),
                reason: reason.into(),
            };
            let n: i64 = match v.parse::<i64>() {
                Ok(n) => n,
                Err(e) => {
                    let reason = match e.kind() {
                        std::num::IntErrorKind::PosOverflow
                        | std::num::IntErrorKind::NegOverflow => "too large".to_string(),
                        _ => "not an integer".to_string(),
                    };
                    return Err(bad(&reason));
                }
            };
            let min = if k == "pad" { 0 } else { 1 };
            if n < min {
                return Err(bad(if min == 0 {
                    "must not be negative"
                } else {
                    "must be at least 1"
                }));
            }
            if n > MAX_DIM {
                return Err(bad(&format!("too large (at most {MAX_DIM})")));
            }
            if values.insert(k.to_string(), n).is_some() {
                return Err(SpecError::DuplicateKey { key: k.into() });
            }
        }
        for k in op.required {
            if !values.contains_key(*k) {
                return Err(SpecError::MissingKey {
                    op: op.name.into(),
                    key: (*k).into(),
                });
            }
        }
        for (k, d) in op.optional {
            values.entry(k.to_string()).or_insert(*d);
        }
        let w = WorkloadSpec {
            op,
            values,
            dtype: dtype.unwrap_or(DType::F32),
        };
        w.check_shapes()?;
        Ok(w)
    }

    /// The op's name.
    pub fn op_name(&self) -> &'static str {
        self.op.name
    }
    /// The op's description.
    pub fn op(&self) -> &'static OpDesc {
        self.op
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The value of a key (defaults filled).
    pub fn get(&self, key: &str) -> Option<i64> {
        self.values.get(key).copied()
    }
    fn v(&self, key: &str) -> i64 {
        // Keys are checked at parse time; 1 keeps a (never expected) miss harmless.
        self.get(key).unwrap_or(1)
    }

    /// Keys sorted, defaults filled: the workload key.
    pub fn canonical(&self) -> String {
        let mut items: Vec<(String, String)> = self
            .values
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect();
        items.push(("dtype".into(), self.dtype.to_string()));
        items.sort();
        let body: Vec<String> = items.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("{}:{}", self.op.name, body.join(","))
    }

    /// The workload key of the records database (the canonical form).
    pub fn key(&self) -> String {
        self.canonical()
    }

    /// A C identifier for the workload, e.g. `matmul_k64_m64_n64` (dtype added unless f32).
    pub fn ident(&self) -> String {
        let mut s = self.op.name.to_string();
        for (k, v) in &self.values {
            s.push_str(&format!("_{}{v}", k.to_lowercase()));
        }
        if self.dtype != DType::F32 {
            s.push_str(&format!("_{}", self.dtype));
        }
        s
    }

    /// Floating-point operations of one evaluation (see [`ComputeDag::flops`]).
    pub fn flops(&self) -> f64 {
        self.build().map(|d| d.flops()).unwrap_or(0.0)
    }

    fn conv_out(&self, op: &str) -> Result<(i64, i64), SpecError> {
        let (h, w, r, s) = (self.v("H"), self.v("W"), self.v("R"), self.v("S"));
        let (st, p) = (self.v("stride"), self.v("pad"));
        if r > h + 2 * p || s > w + 2 * p {
            return Err(SpecError::BadShape {
                op: op.into(),
                reason: format!(
                    "kernel {r}x{s} is larger than the padded input {}x{}",
                    h + 2 * p,
                    w + 2 * p
                ),
            });
        }
        Ok(((h + 2 * p - r) / st + 1, (w + 2 * p - s) / st + 1))
    }

    fn check_shapes(&self) -> Result<(), SpecError> {
        let name = self.op.name;
        if name.contains("conv2d") {
            self.conv_out(name)?;
        }
        if self.dtype == DType::BF16 {
            if !matches!(name, "matmul" | "batch_matmul" | "dense_bias_relu") {
                return Err(SpecError::BadValue {
                    key: "dtype".into(),
                    value: "bf16".into(),
                    reason: format!(
                        "bf16 inputs are for matmul, batch_matmul and dense_bias_relu, not {name}"
                    ),
                });
            }
            if self.v("K") % 2 != 0 {
                return Err(SpecError::BadShape {
                    op: name.into(),
                    reason: format!(
                        "with bf16 inputs K must be even (the dot product takes pairs), not {}",
                        self.v("K")
                    ),
                });
            }
        }
        if name == "softmax" && !self.dtype.is_float() {
            return Err(SpecError::BadValue {
                key: "dtype".into(),
                value: self.dtype.to_string(),
                reason: "softmax needs a float dtype".into(),
            });
        }
        // Every tensor's element count must fit: check the products of all keys pairwise
        // bounded by the largest tensor of each op.
        let dims: Vec<Vec<&str>> = match name {
            "matmul" | "dense_bias_relu" => vec![vec!["M", "K"], vec!["K", "N"], vec!["M", "N"]],
            "batch_matmul" => vec![
                vec!["B", "M", "K"],
                vec!["B", "K", "N"],
                vec!["B", "M", "N"],
            ],
            "conv2d" | "conv2d_hwio" => vec![
                vec!["N", "C", "H", "W"],
                vec!["K", "C", "R", "S"],
                vec!["N", "K", "H", "W"],
            ],
            "depthwise_conv2d" => vec![vec!["N", "C", "H", "W"], vec!["C", "R", "S"]],
            _ => vec![vec!["M", "N"]],
        };
        for d in dims {
            let mut n: i64 = 1;
            for k in &d {
                n = n.checked_mul(self.v(k)).unwrap_or(i64::MAX);
            }
            if name.contains("conv2d") {
                // Padding grows the input.
                let p = self.v("pad");
                let grow = |x: i64| x.checked_add(2 * p).unwrap_or(i64::MAX);
                n = (n / self.v("H").max(1) / self.v("W").max(1))
                    .checked_mul(grow(self.v("H")))
                    .and_then(|x| x.checked_mul(grow(self.v("W"))))
                    .unwrap_or(i64::MAX);
            }
            if n > MAX_ELEMENTS {
                return Err(SpecError::BadShape {
                    op: name.into(),
                    reason: format!(
                        "a tensor of shape [{}] has more than {MAX_ELEMENTS} elements",
                        d.join(",")
                    ),
                });
            }
        }
        Ok(())
    }

    /// Builds the op's DAG: inputs in the order of [`OpDesc::signature`], one output.
    pub fn build(&self) -> Result<ComputeDag, SpecError> {
        let mut g = Graph::new();
        let dt = self.dtype;
        let out = match self.op.name {
            "matmul" | "batch_matmul" | "dense_bias_relu" if dt == DType::BF16 => {
                self.build_bf16(&mut g)
            }
            "matmul" => {
                let (m, n, k) = (self.v("M"), self.v("N"), self.v("K"));
                let a = g.placeholder("A", &[m, k], dt);
                let b = g.placeholder("B", &[k, n], dt);
                let rk = g.reduce_axis(k, "k");
                g.compute("C", &[m, n], &["i", "j"], |ax| {
                    sum(
                        a.at([ax[0].clone(), rk.expr()]) * b.at([rk.expr(), ax[1].clone()]),
                        [&rk],
                    )
                })
            }
            "batch_matmul" => {
                let (bs, m, n, k) = (self.v("B"), self.v("M"), self.v("N"), self.v("K"));
                let a = g.placeholder("A", &[bs, m, k], dt);
                let b = g.placeholder("B", &[bs, k, n], dt);
                let rk = g.reduce_axis(k, "k");
                g.compute("C", &[bs, m, n], &["b", "i", "j"], |ax| {
                    sum(
                        a.at([ax[0].clone(), ax[1].clone(), rk.expr()])
                            * b.at([ax[0].clone(), rk.expr(), ax[2].clone()]),
                        [&rk],
                    )
                })
            }
            "dense_bias_relu" => {
                let (m, n, k) = (self.v("M"), self.v("N"), self.v("K"));
                let x = g.placeholder("X", &[m, k], dt);
                let w = g.placeholder("W", &[n, k], dt);
                let bias = g.placeholder("bias", &[n], dt);
                let rk = g.reduce_axis(k, "k");
                let d = g.compute("dense", &[m, n], &["i", "j"], |ax| {
                    sum(
                        x.at([ax[0].clone(), rk.expr()]) * w.at([ax[1].clone(), rk.expr()]),
                        [&rk],
                    )
                });
                let t = g.compute("bias_add", &[m, n], &["i", "j"], |ax| {
                    d.at([ax[0].clone(), ax[1].clone()]) + bias.at([ax[1].clone()])
                });
                g.compute("Y", &[m, n], &["i", "j"], |ax| {
                    expr::max(
                        t.at([ax[0].clone(), ax[1].clone()]),
                        Expr::Const(Const::zero(dt)),
                    )
                })
            }
            "conv2d" | "conv2d_hwio" | "depthwise_conv2d" => self.build_conv(&mut g)?,
            "softmax" => {
                let (m, n) = (self.v("M"), self.v("N"));
                let x = g.placeholder("X", &[m, n], dt);
                let r1 = g.reduce_axis(n, "k");
                let mx = g.compute("row_max", &[m], &["i"], |ax| {
                    expr::max_reduce(x.at([ax[0].clone(), r1.expr()]), [&r1])
                });
                let e = g.compute("exp", &[m, n], &["i", "j"], |ax| {
                    expr::exp(x.at([ax[0].clone(), ax[1].clone()]) - mx.at([ax[0].clone()]))
                });
                let r2 = g.reduce_axis(n, "k");
                let s = g.compute("row_sum", &[m], &["i"], |ax| {
                    sum(e.at([ax[0].clone(), r2.expr()]), [&r2])
                });
                g.compute("Y", &[m, n], &["i", "j"], |ax| {
                    e.at([ax[0].clone(), ax[1].clone()]) / s.at([ax[0].clone()])
                })
            }
            "reduce_sum" => {
                let (m, n) = (self.v("M"), self.v("N"));
                let x = g.placeholder("X", &[m, n], dt);
                let rk = g.reduce_axis(n, "k");
                g.compute("Y", &[m], &["i"], |ax| {
                    sum(x.at([ax[0].clone(), rk.expr()]), [&rk])
                })
            }
            other => {
                return Err(SpecError::UnknownOp {
                    name: other.into(),
                    known: String::new(),
                })
            }
        };
        ComputeDag::new(&g, &[out]).map_err(|source| SpecError::Dag {
            op: self.op.name.into(),
            source,
        })
    }

    /// A product of bf16 inputs into f32: `C[i, j] = Σ_k A[i, k]·B[k, j]` taken two steps of
    /// `k` at a time, the shape of AVX-512 BF16's `vdpbf16ps` (each f32 lane adds the dot
    /// product of one pair of adjacent bf16). A's pairs are adjacent in its rows already;
    /// the right operand's two rows of a pair (B's rows `2k` and `2k+1`; for a dense layer,
    /// columns of W's rows) are interleaved into a stage of `[K/2, N]` words (`B_pairs`,
    /// `W_pairs`), so that a vector of its words is a vector of pairs along `j`. The batch
    /// axis of `batch_matmul` leads every tensor; the dense layer adds its bias (f32) and
    /// takes the ReLU in f32.
    fn build_bf16(&self, g: &mut Graph) -> Tensor {
        let (m, n, k) = (self.v("M"), self.v("N"), self.v("K"));
        let batch = self.op.name == "batch_matmul";
        let dense = self.op.name == "dense_bias_relu";
        let lead: Vec<i64> = if batch { vec![self.v("B")] } else { vec![] };
        let dims = |rest: &[i64]| [lead.as_slice(), rest].concat();
        let (a, b) = if dense {
            (
                g.placeholder("X", &[m, k], DType::BF16),
                g.placeholder("W", &[n, k], DType::BF16),
            )
        } else {
            (
                g.placeholder("A", &dims(&[m, k]), DType::BF16),
                g.placeholder("B", &dims(&[k, n]), DType::BF16),
            )
        };
        let bias = dense.then(|| g.placeholder("bias", &[n], DType::F32));
        // Index lists: the batch index (if any) first.
        let at = |ax: &[Expr], rest: [Expr; 2]| -> Vec<Expr> {
            let mut v = if batch { vec![ax[0].clone()] } else { vec![] };
            v.extend(rest);
            v
        };
        let pairs_name = if dense { "W_pairs" } else { "B_pairs" };
        let names: &[&str] = if batch {
            &["b", "k2", "j"]
        } else {
            &["k2", "j"]
        };
        let bp = g.compute(pairs_name, &dims(&[k / 2, n]), names, |ax| {
            let (k2, j) = (ax[ax.len() - 2].clone(), ax[ax.len() - 1].clone());
            let k0 = k2 * 2;
            let (lo, hi) = if dense {
                ([j.clone(), k0.clone()], [j, k0 + 1])
            } else {
                ([k0.clone(), j.clone()], [k0 + 1, j])
            };
            pack_bf16(b.at(at(ax, lo)), b.at(at(ax, hi)))
        });
        let rk = g.reduce_axis(k / 2, "k");
        let names: &[&str] = if batch { &["b", "i", "j"] } else { &["i", "j"] };
        let name = if dense { "dense" } else { "C" };
        let c = g.compute(name, &dims(&[m, n]), names, |ax| {
            let (i, j) = (ax[ax.len() - 2].clone(), ax[ax.len() - 1].clone());
            let k0 = rk.expr() * 2;
            let pa = pack_bf16(
                a.at(at(ax, [i.clone(), k0.clone()])),
                a.at(at(ax, [i, k0 + 1])),
            );
            sum(dot_bf16(pa, bp.at(at(ax, [rk.expr(), j]))), [&rk])
        });
        let Some(bias) = bias else {
            return c;
        };
        let t = g.compute("bias_add", &[m, n], &["i", "j"], |ax| {
            c.at([ax[0].clone(), ax[1].clone()]) + bias.at([ax[1].clone()])
        });
        g.compute("Y", &[m, n], &["i", "j"], |ax| {
            expr::max(t.at([ax[0].clone(), ax[1].clone()]), Expr::f32(0.0))
        })
    }

    fn build_conv(&self, g: &mut Graph) -> Result<Tensor, SpecError> {
        let depthwise = self.op.name == "depthwise_conv2d";
        let dt = self.dtype;
        let (n, c, h, w) = (self.v("N"), self.v("C"), self.v("H"), self.v("W"));
        let (r, s, st, p) = (self.v("R"), self.v("S"), self.v("stride"), self.v("pad"));
        let (oh, ow) = self.conv_out(self.op.name)?;
        let data = g.placeholder("data", &[n, c, h, w], dt);
        let hwio = self.op.name == "conv2d_hwio";
        let weight = if depthwise {
            g.placeholder("weight", &[c, r, s], dt)
        } else if hwio {
            g.placeholder("weight", &[r, s, c, self.v("K")], dt)
        } else {
            g.placeholder("weight", &[self.v("K"), c, r, s], dt)
        };
        let padded = if p > 0 {
            g.compute(
                "pad",
                &[n, c, h + 2 * p, w + 2 * p],
                &["n", "c", "h", "w"],
                |ax| {
                    let (y, x) = (&ax[2], &ax[3]);
                    let inside = y
                        .clone()
                        .ge(p)
                        .and(y.clone().lt(h + p))
                        .and(x.clone().ge(p))
                        .and(x.clone().lt(w + p));
                    select(
                        inside,
                        data.at([ax[0].clone(), ax[1].clone(), y - p, x - p]),
                        Expr::Const(Const::zero(dt)),
                    )
                },
            )
        } else {
            data
        };
        let ry = g.reduce_axis(r, "ry");
        let rx = g.reduce_axis(s, "rx");
        let out = if depthwise {
            g.compute("out", &[n, c, oh, ow], &["n", "c", "y", "x"], |ax| {
                sum(
                    padded.at([
                        ax[0].clone(),
                        ax[1].clone(),
                        &ax[2] * st + ry.expr(),
                        &ax[3] * st + rx.expr(),
                    ]) * weight.at([ax[1].clone(), ry.expr(), rx.expr()]),
                    [&ry, &rx],
                )
            })
        } else {
            let rc = g.reduce_axis(c, "rc");
            g.compute(
                "out",
                &[n, self.v("K"), oh, ow],
                &["n", "k", "y", "x"],
                |ax| {
                    let w = if hwio {
                        weight.at([ry.expr(), rx.expr(), rc.expr(), ax[1].clone()])
                    } else {
                        weight.at([ax[1].clone(), rc.expr(), ry.expr(), rx.expr()])
                    };
                    sum(
                        padded.at([
                            ax[0].clone(),
                            rc.expr(),
                            &ax[2] * st + ry.expr(),
                            &ax[3] * st + rx.expr(),
                        ]) * w,
                        [&rc, &ry, &rx],
                    )
                },
            )
        };
        Ok(out)
    }
}

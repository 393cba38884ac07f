//! A convolution whose weights are a constant of the model reads them transposed to
//! `[R, S, C, K]` (an `onnx_conv2d_hwio` task); with the weights as a graph input, or with
//! groups, it reads ONNX's `[K, C, R, S]` as given (`onnx_conv2d`). Both against the
//! convolution written out as loops here, with strides, dilations and asymmetric padding.

use tensortune::model::testing::{random, AttrValue, ModelBuilder};
use tensortune::model::{ImportOptions, LoadOptions, Model};
use tensortune::ndarray::{ArrayD, IxDyn};
use tensortune_model::{import, plan};

/// One layer's parameters.
struct Layer {
    x: [usize; 4],
    w: [usize; 4],
    group: usize,
    strides: [usize; 2],
    dilations: [usize; 2],
    /// top, left, bottom, right
    pads: [usize; 4],
}

impl Layer {
    fn out(&self) -> [usize; 4] {
        let [n, _, h, w] = self.x;
        let [k, _, r, s] = self.w;
        let win = |e: usize, d: usize| (e - 1) * d + 1;
        let p = (h + self.pads[0] + self.pads[2] - win(r, self.dilations[0])) / self.strides[0] + 1;
        let q = (w + self.pads[1] + self.pads[3] - win(s, self.dilations[1])) / self.strides[1] + 1;
        [n, k, p, q]
    }

    /// The model: `Conv(x, W, b)`, with `W` an initializer or, with `weights_as_input`, a
    /// graph input after `x`.
    fn model(&self, w: &ArrayD<f32>, b: &ArrayD<f32>, weights_as_input: bool) -> Vec<u8> {
        let i = |v: &[usize]| v.iter().map(|&e| e as i64).collect::<Vec<_>>();
        let mut m = ModelBuilder::new(13).input("x", &i(&self.x));
        m = if weights_as_input {
            m.input("W", &i(&self.w))
        } else {
            m.init("W", &i(&self.w), w.iter().copied().collect())
        };
        m.init("b", &[self.w[0] as i64], b.iter().copied().collect())
            .node(
                "Conv",
                &["x", "W", "b"],
                &["y"],
                &[
                    ("group", AttrValue::Int(self.group as i64)),
                    ("strides", AttrValue::Ints(i(&self.strides))),
                    ("dilations", AttrValue::Ints(i(&self.dilations))),
                    ("pads", AttrValue::Ints(i(&self.pads))),
                ],
            )
            .output("y")
            .build()
    }

    /// The convolution by its definition, in f64.
    fn direct(&self, x: &ArrayD<f32>, w: &ArrayD<f32>, b: &ArrayD<f32>) -> ArrayD<f64> {
        let [_, _, h, wd] = self.x;
        let [k, cg, r, s] = self.w;
        let kg = k / self.group;
        ArrayD::from_shape_fn(IxDyn(&self.out()), |ix| {
            let (n, o, y, xx) = (ix[0], ix[1], ix[2], ix[3]);
            let g = o / kg;
            let mut acc = f64::from(b[[o]]);
            for ch in 0..cg {
                for dy in 0..r {
                    for dx in 0..s {
                        let iy = (y * self.strides[0] + dy * self.dilations[0]) as i64
                            - self.pads[0] as i64;
                        let ixx = (xx * self.strides[1] + dx * self.dilations[1]) as i64
                            - self.pads[1] as i64;
                        if iy < 0 || ixx < 0 || iy >= h as i64 || ixx >= wd as i64 {
                            continue;
                        }
                        let v = x[[n, g * cg + ch, iy as usize, ixx as usize]];
                        acc += f64::from(v) * f64::from(w[[o, ch, dy, dx]]);
                    }
                }
            }
            acc
        })
    }
}

/// The model's one task has a key starting with `prefix`, and its output on `inputs` is
/// `want`.
fn check(bytes: &[u8], inputs: &[&ArrayD<f32>], want: &ArrayD<f64>, prefix: &str) {
    let p = plan(import(bytes, &ImportOptions::default()).expect("imports")).expect("plans");
    assert_eq!(p.tasks.len(), 1);
    let key = &p.tasks[0].key;
    assert!(key.starts_with(prefix), "{key}");
    let m = Model::from_bytes(bytes, &LoadOptions::default()).expect("loads");
    let views: Vec<_> = inputs.iter().map(|a| a.view()).collect();
    let got = m.run(&views).expect("runs");
    assert_close(&got[0], want, key);
}

fn assert_close(got: &ArrayD<f32>, want: &ArrayD<f64>, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}");
    for (g, w) in got.iter().zip(want.iter()) {
        assert!(
            (f64::from(*g) - w).abs() <= 1e-4 * (1.0 + w.abs()),
            "{what}: {g} against {w}"
        );
    }
}

#[test]
fn constant_weights_are_read_hwio_and_give_the_same_convolution() {
    let layers = [
        Layer {
            x: [1, 3, 9, 7],
            w: [16, 3, 3, 3],
            group: 1,
            strides: [1, 1],
            dilations: [1, 1],
            pads: [1, 1, 1, 1],
        },
        Layer {
            x: [2, 4, 11, 10],
            w: [5, 4, 3, 2],
            group: 1,
            strides: [2, 1],
            dilations: [1, 2],
            pads: [0, 1, 2, 0],
        },
        Layer {
            x: [1, 8, 6, 6],
            w: [32, 8, 1, 1],
            group: 1,
            strides: [1, 1],
            dilations: [1, 1],
            pads: [0, 0, 0, 0],
        },
    ];
    for (seed, l) in layers.iter().enumerate() {
        let seed = seed as u64 * 3;
        let (x, w, b) = (
            random(&l.x, seed + 1),
            random(&l.w, seed + 2),
            random(&[l.w[0]], seed + 3),
        );
        let want = l.direct(&x, &w, &b);

        // The weights as an initializer: transposed at import; as an input: read as given.
        check(&l.model(&w, &b, false), &[&x], &want, "onnx_conv2d_hwio:");
        check(&l.model(&w, &b, true), &[&x, &w], &want, "onnx_conv2d:");
    }
}

#[test]
fn grouped_convolutions_keep_their_weights_as_given() {
    let l = Layer {
        x: [1, 4, 7, 7],
        w: [6, 2, 3, 3],
        group: 2,
        strides: [1, 1],
        dilations: [1, 1],
        pads: [1, 1, 1, 1],
    };
    let (x, w, b) = (random(&l.x, 1), random(&l.w, 2), random(&[6], 3));
    let want = l.direct(&x, &w, &b);
    check(&l.model(&w, &b, false), &[&x], &want, "onnx_conv2d:");
}

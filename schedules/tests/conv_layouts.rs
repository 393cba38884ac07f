//! `conv2d_hwio` is `conv2d` with its weights stored `[R, S, C, K]`: both against a
//! convolution written out as plain loops here, on shapes with strides, padding and
//! non-square windows.

mod common;

use common::{dag, inputs};
use tensortune_schedules::data::{Data, NdData};
use tensortune_schedules::eval;

/// The convolution by its definition: `out[n, k, y, x] = sum over c, r, s of
/// data[n, c, y*st + r - pad, x*st + s - pad] * w(k, c, r, s)`, zero outside the image.
#[allow(clippy::too_many_arguments)]
fn direct(
    data: &[f32],
    [n, c, h, w]: [usize; 4],
    weight: impl Fn(usize, usize, usize, usize) -> f32,
    k: usize,
    [r, s]: [usize; 2],
    st: usize,
    pad: usize,
) -> Vec<f64> {
    let (p, q) = ((h + 2 * pad - r) / st + 1, (w + 2 * pad - s) / st + 1);
    let mut out = Vec::with_capacity(n * k * p * q);
    for b in 0..n {
        for o in 0..k {
            for y in 0..p {
                for x in 0..q {
                    let mut acc = 0.0f64;
                    for ch in 0..c {
                        for dy in 0..r {
                            for dx in 0..s {
                                let (iy, ix) = (y * st + dy, x * st + dx);
                                if iy < pad || ix < pad || iy - pad >= h || ix - pad >= w {
                                    continue;
                                }
                                let v = data[((b * c + ch) * h + iy - pad) * w + ix - pad];
                                acc += f64::from(v) * f64::from(weight(o, ch, dy, dx));
                            }
                        }
                    }
                    out.push(acc);
                }
            }
        }
    }
    out
}

fn f32s(d: &NdData) -> &[f32] {
    match &d.data {
        Data::F32(v) => v,
        other => panic!("expected f32 data, got {:?}", other.dtype()),
    }
}

fn assert_close(got: &NdData, want: &[f64], what: &str) {
    let got = f32s(got);
    assert_eq!(got.len(), want.len(), "{what}: element count");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let tol = 1e-4 * (1.0 + w.abs());
        assert!(
            (f64::from(*g) - w).abs() <= tol,
            "{what}: element {i} is {g}, want {w}"
        );
    }
}

#[test]
fn hwio_weights_compute_the_same_convolution() {
    // (N, C, H, W, K, R, S, stride, pad)
    let shapes = [
        (1, 3, 7, 5, 4, 3, 3, 1, 1),
        (2, 2, 9, 8, 5, 3, 2, 2, 0),
        (1, 4, 6, 6, 3, 1, 1, 1, 0),
        (1, 5, 5, 7, 2, 2, 3, 2, 1),
    ];
    for (seed, &(n, c, h, w, k, r, s, st, pad)) in shapes.iter().enumerate() {
        let spec = |op: &str| {
            format!("{op}:N={n},C={c},H={h},W={w},K={k},R={r},S={s},stride={st},pad={pad}")
        };
        let nchw = dag(&spec("conv2d"));
        let hwio = dag(&spec("conv2d_hwio"));
        let ins = inputs(&nchw, seed as u64);
        let (data, kcrs) = (f32s(&ins[0]), f32s(&ins[1]));
        let at_kcrs =
            |o: usize, ch: usize, dy: usize, dx: usize| kcrs[((o * c + ch) * r + dy) * s + dx];
        // The same weights stored [R, S, C, K].
        let mut rsck = vec![0.0f32; k * c * r * s];
        for o in 0..k {
            for ch in 0..c {
                for dy in 0..r {
                    for dx in 0..s {
                        rsck[((dy * s + dx) * c + ch) * k + o] = at_kcrs(o, ch, dy, dx);
                    }
                }
            }
        }
        let weight_shape = hwio.op(hwio.inputs()[1]).shape.clone();
        assert_eq!(weight_shape, vec![r as i64, s as i64, c as i64, k as i64]);
        let hwio_ins = vec![
            ins[0].clone(),
            NdData::new(weight_shape, Data::F32(rsck)).expect("weight"),
        ];
        let want = direct(data, [n, c, h, w], at_kcrs, k, [r, s], st, pad);
        let got_nchw = eval::evaluate(&nchw, &ins).expect("evaluate conv2d");
        let got_hwio = eval::evaluate(&hwio, &hwio_ins).expect("evaluate conv2d_hwio");
        assert_close(&got_nchw[0], &want, &spec("conv2d"));
        assert_close(&got_hwio[0], &want, &spec("conv2d_hwio"));
    }
}

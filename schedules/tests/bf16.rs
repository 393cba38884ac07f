//! bf16 inputs: the workload spec, the DAG of a bf16 matmul against products computed here,
//! the type rules of bf16 values and pairs, and the loop-IR interpreter on tiled schedules.

mod common;
use common::dag;
use tensortune_schedules::data::{bf16_to_f32, f32_to_bf16, Data, NdData};
use tensortune_schedules::expr::{dot_bf16, pack_bf16, BinOp, DType, Expr, TensorId};
use tensortune_schedules::ops::{SpecError, WorkloadSpec};
use tensortune_schedules::random::random_state;
use tensortune_schedules::{eval, interp, lower::lower};

fn bf16_matmul_by_hand(a: &[u16], b: &[u16], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k)
                .map(|p| bf16_to_f32(a[i * k + p]) as f64 * bf16_to_f32(b[p * n + j]) as f64)
                .sum();
        }
    }
    c
}

#[test]
fn specs_of_bf16() {
    let w = WorkloadSpec::parse("matmul:M=4,N=8,K=6,dtype=bf16").expect("parses");
    assert_eq!(w.dtype(), DType::BF16);
    assert_eq!(w.canonical(), "matmul:K=6,M=4,N=8,dtype=bf16");
    // 2·M·N·K: a dot of a pair counts its two products and two adds.
    assert_eq!(w.flops(), 2.0 * 4.0 * 8.0 * 6.0);
    for odd in [
        "matmul:M=4,N=8,K=5,dtype=bf16",
        "dense_bias_relu:M=4,N=8,K=5,dtype=bf16",
        "batch_matmul:B=2,M=4,N=8,K=5,dtype=bf16",
    ] {
        let r = WorkloadSpec::parse(odd);
        assert!(matches!(r, Err(SpecError::BadShape { .. })), "{odd}: {r:?}");
    }
    for other in [
        "conv2d:N=1,C=2,H=4,W=4,K=2,R=3,S=3,stride=1,pad=1,dtype=bf16",
        "softmax:M=2,N=4,dtype=bf16",
        "reduce_sum:M=2,N=4,dtype=bf16",
    ] {
        let r = WorkloadSpec::parse(other);
        assert!(
            matches!(r, Err(SpecError::BadValue { .. })),
            "{other}: {r:?}"
        );
    }
}

#[test]
fn the_evaluator_sums_the_products_of_the_bf16_values() {
    let (m, n, k) = (5, 7, 12);
    let d = dag(&format!("matmul:M={m},N={n},K={k},dtype=bf16"));
    let a = NdData::random(&[m as i64, k as i64], DType::BF16, 1).expect("data");
    let b = NdData::random(&[k as i64, n as i64], DType::BF16, 2).expect("data");
    let (Data::BF16(av), Data::BF16(bv)) = (&a.data, &b.data) else {
        panic!("bf16 data")
    };
    let want = bf16_matmul_by_hand(av, bv, m, n, k);
    let got = eval::evaluate(&d, &[a.clone(), b.clone()]).expect("evaluates");
    let Data::F32(c) = &got[0].data else {
        panic!("f32 output")
    };
    for (i, (&g, &w)) in c.iter().zip(&want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= 1e-6 * (1.0 + w.abs()),
            "[{i}] {g} against {w}"
        );
    }
    // And the loop-IR interpreter on random schedules of it.
    for seed in 0..20 {
        let s = random_state(&d, seed, 12, false);
        let f = lower(&s).unwrap_or_else(|e| panic!("lower: {e}\n{s}"));
        let out = interp::run(&f, &[a.clone(), b.clone()]).expect("interprets");
        let diff = out[0].max_rel_diff(&got[0]).expect("same shape");
        assert!(diff < 1e-5, "seed {seed}: {diff}\n{}", s.trace());
    }
}

#[test]
fn bf16_values_only_convert_or_pair() {
    let x = || Expr::Load {
        tensor: TensorId(0),
        dtype: DType::BF16,
        indices: vec![Expr::int(0)],
    };
    assert!(Expr::bin(BinOp::Add, x(), x()).check().is_err());
    assert!(Expr::bin(BinOp::Mul, x(), x()).check().is_err());
    assert_eq!(x().cast(DType::F32).check(), Ok(DType::F32));
    assert_eq!(pack_bf16(x(), x()).check(), Ok(DType::I32));
    assert_eq!(
        dot_bf16(pack_bf16(x(), x()), pack_bf16(x(), x())).check(),
        Ok(DType::F32)
    );
    assert!(
        dot_bf16(x(), x()).check().is_err(),
        "dot of unpacked values"
    );
    assert!(
        pack_bf16(Expr::f32(1.0), x()).check().is_err(),
        "pack of an f32"
    );
    // Rounding: to nearest, ties to even, as in the code generator's conversion.
    assert_eq!(f32_to_bf16(1.0 + 1.0 / 256.0), 0x3f80);
    assert_eq!(f32_to_bf16(1.0 + 3.0 / 256.0), 0x3f82);
    assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
    assert_eq!(f32_to_bf16(-0.0), 0x8000);
}

/// The dense layer and the batched matmul of bf16 inputs against their definitions computed
/// here: relu(X·Wᵀ + bias) with an f32 bias, and one matmul per batch.
#[test]
fn bf16_dense_and_batch_matmul() {
    let (m, n, k) = (3, 5, 8);
    let d = dag(&format!("dense_bias_relu:M={m},N={n},K={k},dtype=bf16"));
    let x = NdData::random(&[m as i64, k as i64], DType::BF16, 3).expect("data");
    let w = NdData::random(&[n as i64, k as i64], DType::BF16, 4).expect("data");
    let bias = NdData::random(&[n as i64], DType::F32, 5).expect("data");
    let (Data::BF16(xv), Data::BF16(wv), Data::F32(bv)) = (&x.data, &w.data, &bias.data) else {
        panic!("dtypes")
    };
    // W is [N, K]: its transpose is the right operand.
    let wt: Vec<u16> = (0..k * n).map(|q| wv[(q % n) * k + q / n]).collect();
    let prod = bf16_matmul_by_hand(xv, &wt, m, n, k);
    let got = eval::evaluate(&d, &[x, w, bias.clone()]).expect("evaluates");
    let Data::F32(y) = &got[0].data else {
        panic!("f32 output")
    };
    for (q, &g) in y.iter().enumerate() {
        let want = (prod[q] + bv[q % n] as f64).max(0.0);
        assert!(
            (g as f64 - want).abs() <= 1e-6 * (1.0 + want.abs()),
            "[{q}] {g} against {want}"
        );
    }

    let (bs, m, n, k) = (2, 3, 4, 6);
    let d = dag(&format!("batch_matmul:B={bs},M={m},N={n},K={k},dtype=bf16"));
    let a = NdData::random(&[bs as i64, m as i64, k as i64], DType::BF16, 6).expect("data");
    let b = NdData::random(&[bs as i64, k as i64, n as i64], DType::BF16, 7).expect("data");
    let (Data::BF16(av), Data::BF16(bv)) = (&a.data, &b.data) else {
        panic!("dtypes")
    };
    let got = eval::evaluate(&d, &[a.clone(), b.clone()]).expect("evaluates");
    let Data::F32(c) = &got[0].data else {
        panic!("f32 output")
    };
    for p in 0..bs {
        let want = bf16_matmul_by_hand(
            &av[p * m * k..][..m * k],
            &bv[p * k * n..][..k * n],
            m,
            n,
            k,
        );
        for (q, w) in want.iter().enumerate() {
            let g = c[p * m * n + q] as f64;
            assert!(
                (g - w).abs() <= 1e-6 * (1.0 + w.abs()),
                "batch {p} [{q}] {g} against {w}"
            );
        }
    }
}

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
    let odd = WorkloadSpec::parse("matmul:M=4,N=8,K=5,dtype=bf16");
    assert!(matches!(odd, Err(SpecError::BadShape { .. })), "{odd:?}");
    for other in [
        "conv2d:N=1,C=2,H=4,W=4,K=2,R=3,S=3,stride=1,pad=1,dtype=bf16",
        "softmax:M=2,N=4,dtype=bf16",
        "batch_matmul:B=2,M=2,N=2,K=2,dtype=bf16",
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

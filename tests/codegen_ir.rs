//! JIT codegen of hand-built loop IR: every loop kind, guarded tails, temporaries on the stack
//! and the heap, intrinsics and dtypes, checked against the loop-IR interpreter (and, where
//! simple, against values computed here).

use tensortune::codegen::CodegenOptions;
use tensortune::runtime::{AlignedBuffer, Runtime};
use tensortune::{Kernel, RunError};
use tensortune_schedules::data::{Data, NdData};
use tensortune_schedules::expr::{self as ex, BinOp, Intrinsic};
use tensortune_schedules::interp;
use tensortune_schedules::ir::{BufKind, BufferDecl, ForKind, LoweredFunc, Scope, Stmt};
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::{BufId, DType, Expr, Var};

/// Builds a function from buffer declarations, with vars numbered as the test creates them.
struct Builder {
    buffers: Vec<BufferDecl>,
    params: Vec<BufId>,
    vars: u32,
}

impl Builder {
    fn new() -> Builder {
        Builder {
            buffers: vec![],
            params: vec![],
            vars: 0,
        }
    }
    fn buf(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[i64],
        kind: BufKind,
        scope: Scope,
    ) -> BufId {
        let id = BufId(self.buffers.len() as u32);
        self.buffers.push(BufferDecl {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            scope,
            kind,
            row_pad: 0,
        });
        if !matches!(kind, BufKind::Temp) {
            self.params.push(id);
        }
        id
    }
    fn input(&mut self, name: &str, dtype: DType, shape: &[i64]) -> BufId {
        let n = self.params.len();
        self.buf(name, dtype, shape, BufKind::Input(n), Scope::Global)
    }
    fn output(&mut self, name: &str, dtype: DType, shape: &[i64]) -> BufId {
        self.buf(name, dtype, shape, BufKind::Output(0), Scope::Global)
    }
    fn var(&mut self, name: &str) -> Var {
        self.vars += 1;
        Var::new(self.vars - 1, name)
    }
    /// [`Builder::finish`] without consuming the builder (several bodies over one set of
    /// buffers and variables).
    fn clone_finish(&self, name: &str, body: Stmt) -> LoweredFunc {
        LoweredFunc {
            name: name.into(),
            buffers: self.buffers.clone(),
            params: self.params.clone(),
            body,
            num_vars: self.vars,
        }
    }
    fn finish(self, name: &str, body: Stmt) -> LoweredFunc {
        LoweredFunc {
            name: name.into(),
            buffers: self.buffers,
            params: self.params,
            body,
            num_vars: self.vars,
        }
    }
}

fn for_(v: &Var, extent: i64, kind: ForKind, body: Stmt) -> Stmt {
    Stmt::For {
        var: *v,
        extent,
        kind,
        body: Box::new(body),
    }
}
fn ld(buf: BufId, dtype: DType, index: Expr) -> Expr {
    Expr::BufLoad {
        buf,
        dtype,
        index: Box::new(index),
    }
}
fn st(buf: BufId, index: Expr, value: Expr) -> Stmt {
    Stmt::Store { buf, index, value }
}
fn v(x: &Var) -> Expr {
    Expr::var(x)
}
fn add(a: Expr, b: Expr) -> Expr {
    Expr::bin(BinOp::Add, a, b)
}
fn mul(a: Expr, b: Expr) -> Expr {
    Expr::bin(BinOp::Mul, a, b)
}
fn int(x: i64) -> Expr {
    Expr::int(x)
}

/// Runs `f` compiled and interpreted on random inputs; returns the largest relative difference.
fn jit_vs_interp(f: &LoweredFunc, threads: usize, seed: u64) -> f64 {
    let k = Kernel::compile(f).unwrap_or_else(|e| panic!("compile: {e}\n{f}"));
    let inputs: Vec<NdData> = k
        .inputs()
        .enumerate()
        .map(|(i, p)| NdData::random(&p.shape, p.dtype, seed + i as u64).expect("data dtype"))
        .collect();
    let want = interp::run(f, &inputs).unwrap_or_else(|e| panic!("interp: {e}\n{f}"));
    let rt = Runtime::new(threads).expect("runtime");
    let got = k.run_nd(&rt, &inputs).expect("run");
    want.iter()
        .zip(&got)
        .map(|(w, g)| g.max_rel_diff(w).expect("same shape"))
        .fold(0.0, f64::max)
}

/// C[i] = A[i] * 2 + B[i] over n elements, split by 16 with a guarded vectorized tail.
fn axpy(n: i64, kind: ForKind) -> LoweredFunc {
    let mut b = Builder::new();
    let a = b.input("A", DType::F32, &[n]);
    let bb = b.input("B", DType::F32, &[n]);
    let c = b.output("C", DType::F32, &[n]);
    let (vo, vi) = (b.var("vo"), b.var("vi"));
    let i = add(mul(v(&vo), int(16)), v(&vi));
    let body = st(
        c,
        i.clone(),
        add(
            mul(ld(a, DType::F32, i.clone()), Expr::f32(2.0)),
            ld(bb, DType::F32, i.clone()),
        ),
    );
    let guarded = Stmt::If {
        cond: i.lt(int(n)),
        then: Box::new(body),
        otherwise: None,
    };
    let outer = (n + 15) / 16;
    b.finish(
        "axpy",
        for_(&vo, outer, ForKind::Serial, for_(&vi, 16, kind, guarded)),
    )
}

#[test]
fn guarded_vector_tail_matches() {
    for n in [1, 16, 37, 64, 101] {
        for kind in [ForKind::Vectorized, ForKind::Serial, ForKind::Unrolled] {
            let f = axpy(n, kind);
            assert!(jit_vs_interp(&f, 1, 3) < 1e-6, "n={n} {kind:?}");
        }
    }
}

#[test]
fn computes_known_values() {
    let f = axpy(20, ForKind::Vectorized);
    let k = Kernel::compile(&f).expect("compile");
    let a = NdData::new(vec![20], Data::F32((0..20).map(|x| x as f32).collect())).expect("a");
    let bb = NdData::new(vec![20], Data::F32(vec![1.0; 20])).expect("b");
    let out = k.run_nd(&Runtime::serial(), &[a, bb]).expect("run");
    let Data::F32(c) = &out[0].data else {
        panic!("dtype")
    };
    assert_eq!(
        c,
        &(0..20).map(|x| 2.0 * x as f32 + 1.0).collect::<Vec<_>>()
    );
}

/// C[M, N] = A[M, K] @ B[K, N] with a local accumulator tile of 4 x 16 held across k, the tile
/// rows unrolled, columns vectorized, and row blocks parallel. M, N, K divisible by the tile.
fn tiled_matmul(m: i64, n: i64, kk: i64, scope: Scope) -> LoweredFunc {
    let mut b = Builder::new();
    let a = b.input("A", DType::F32, &[m, kk]);
    let bm = b.input("B", DType::F32, &[kk, n]);
    let c = b.output("C", DType::F32, &[m, n]);
    let acc = b.buf("acc", DType::F32, &[4, 16], BufKind::Temp, scope);
    let (io, jo, k, ii, ji, ii2, ji2, ii3, ji3) = (
        b.var("io"),
        b.var("jo"),
        b.var("k"),
        b.var("ii"),
        b.var("ji"),
        b.var("ii2"),
        b.var("ji2"),
        b.var("ii3"),
        b.var("ji3"),
    );
    let acc_i = |ii: &Var, ji: &Var| add(mul(v(ii), int(16)), v(ji));
    let row = |ii: &Var| add(mul(v(&io), int(4)), v(ii));
    let col = |ji: &Var| add(mul(v(&jo), int(16)), v(ji));
    let init = for_(
        &ii,
        4,
        ForKind::Unrolled,
        for_(
            &ji,
            16,
            ForKind::Vectorized,
            st(acc, acc_i(&ii, &ji), Expr::f32(0.0)),
        ),
    );
    let update = for_(
        &k,
        kk,
        ForKind::Serial,
        for_(
            &ii2,
            4,
            ForKind::Unrolled,
            for_(
                &ji2,
                16,
                ForKind::Vectorized,
                st(
                    acc,
                    acc_i(&ii2, &ji2),
                    add(
                        ld(acc, DType::F32, acc_i(&ii2, &ji2)),
                        mul(
                            ld(a, DType::F32, add(mul(row(&ii2), int(kk)), v(&k))),
                            ld(bm, DType::F32, add(mul(v(&k), int(n)), col(&ji2))),
                        ),
                    ),
                ),
            ),
        ),
    );
    let write = for_(
        &ii3,
        4,
        ForKind::Unrolled,
        for_(
            &ji3,
            16,
            ForKind::Vectorized,
            st(
                c,
                add(mul(row(&ii3), int(n)), col(&ji3)),
                ld(acc, DType::F32, acc_i(&ii3, &ji3)),
            ),
        ),
    );
    let tile = Stmt::Allocate {
        buf: acc,
        body: Box::new(Stmt::seq(vec![init, update, write])),
    };
    let body = for_(
        &io,
        m / 4,
        ForKind::Parallel,
        for_(&jo, n / 16, ForKind::Serial, tile),
    );
    b.finish("tiled_matmul", body)
}

#[test]
fn tiled_matmul_parallel_two_threads() {
    let f = tiled_matmul(8, 32, 13, Scope::Local);
    for threads in [1, 2] {
        assert!(jit_vs_interp(&f, threads, 5) < 1e-5, "threads={threads}");
    }
}

#[test]
fn heap_temporary_matches() {
    // The same tile in global scope comes from rt->alloc.
    let f = tiled_matmul(4, 16, 5, Scope::Global);
    assert!(jit_vs_interp(&f, 2, 9) < 1e-5);
    let ir = tensortune::codegen::llvm::emit_llvm_ir(&f, &Default::default()).expect("ir");
    assert!(
        !ir.contains("alloca [64 x float]"),
        "global temp on the stack:\n{ir}"
    );
}

/// S[i] = sum_j A[i, j] with the reduction axis marked vectorized: lanes would race on S[i],
/// so the codegen must fall back to a serial loop and still be right.
#[test]
fn vectorized_reduction_axis_falls_back() {
    let mut b = Builder::new();
    let a = b.input("A", DType::F32, &[3, 21]);
    let s = b.output("S", DType::F32, &[3]);
    let (i, i2, j) = (b.var("i"), b.var("i2"), b.var("j"));
    let init = for_(&i, 3, ForKind::Serial, st(s, v(&i), Expr::f32(0.0)));
    let red = for_(
        &i2,
        3,
        ForKind::Serial,
        for_(
            &j,
            21,
            ForKind::Vectorized,
            st(
                s,
                v(&i2),
                add(
                    ld(s, DType::F32, v(&i2)),
                    ld(a, DType::F32, add(mul(v(&i2), int(21)), v(&j))),
                ),
            ),
        ),
    );
    let f = b.finish("rowsum", Stmt::seq(vec![init, red]));
    assert!(jit_vs_interp(&f, 1, 2) < 1e-5);
}

/// Every intrinsic and cast, in f32 and f64, vectorized and scalar, with a strided (gathered)
/// and a broadcast operand.
#[test]
fn intrinsics_and_dtypes() {
    for dtype in [DType::F32, DType::F64] {
        for kind in [ForKind::Vectorized, ForKind::Serial] {
            let mut b = Builder::new();
            let a = b.input("A", dtype, &[2, 24]);
            let c = b.output("C", dtype, &[24]);
            let j = b.var("j");
            let x = ld(a, dtype, v(&j));
            let strided = ld(a, dtype, mul(v(&j), int(2)));
            let bcast = ld(a, dtype, int(30));
            let lit = |x: f64| {
                if dtype == DType::F32 {
                    Expr::f32(x as f32)
                } else {
                    Expr::f64(x)
                }
            };
            let pos = add(Expr::Call(Intrinsic::Abs, Box::new(x.clone())), lit(0.5));
            let terms = vec![
                Expr::Call(Intrinsic::Exp, Box::new(x.clone())),
                Expr::Call(Intrinsic::Log, Box::new(pos.clone())),
                Expr::Call(Intrinsic::Sqrt, Box::new(pos)),
                Expr::Call(Intrinsic::Tanh, Box::new(x.clone())),
                ex::max(x.clone(), lit(0.0)),
                ex::min(strided, bcast.clone()),
                Expr::bin(BinOp::Div, x.clone(), lit(3.0)),
                ex::select(
                    x.clone().lt(lit(0.0)),
                    x.clone().cast(DType::I32).cast(dtype),
                    bcast,
                ),
            ];
            let value = terms.into_iter().reduce(add).expect("terms");
            let f = b.finish("intrin", for_(&j, 24, kind, st(c, v(&j), value)));
            assert!(jit_vs_interp(&f, 1, 11) < 1e-5, "{dtype} {kind:?}");
        }
    }
}

/// i32 floor division and modulo by constants and by data, min/max/abs, comparisons.
#[test]
fn integer_ops() {
    for kind in [ForKind::Vectorized, ForKind::Serial] {
        let mut b = Builder::new();
        let a = b.input("A", DType::I32, &[32]);
        let d = b.input("D", DType::I32, &[32]);
        let c = b.output("C", DType::I32, &[32]);
        let j = b.var("j");
        let x = ld(a, DType::I32, v(&j));
        // Divisors in [1, 9) from data that is in [-8, 8).
        let div = add(
            Expr::Call(Intrinsic::Abs, Box::new(ld(d, DType::I32, v(&j)))),
            Expr::i32(1),
        );
        let terms = vec![
            x.clone().floordiv(Expr::i32(3)),
            x.clone().floormod(Expr::i32(5)),
            x.clone().floordiv(div.clone()),
            x.clone().floormod(div),
            ex::max(x.clone(), Expr::i32(-2)),
            ex::select(x.clone().ge(Expr::i32(0)), Expr::i32(100), Expr::i32(-100)),
            v(&j).cast(DType::I32),
        ];
        let value = terms.into_iter().reduce(add).expect("terms");
        let f = b.finish("intops", for_(&j, 32, kind, st(c, v(&j), value)));
        assert_eq!(jit_vs_interp(&f, 1, 4), 0.0, "{kind:?}");
    }
}

/// A select whose untaken branch would read out of bounds (padding) must not read it.
#[test]
fn select_with_out_of_bounds_branch() {
    for kind in [ForKind::Vectorized, ForKind::Serial] {
        let mut b = Builder::new();
        let a = b.input("A", DType::F32, &[10]);
        let c = b.output("C", DType::F32, &[16]);
        let j = b.var("j");
        let idx = add(v(&j), int(-3));
        let inside = idx.clone().ge(int(0)).and(idx.clone().lt(int(10)));
        let value = ex::select(inside, ld(a, DType::F32, idx), Expr::f32(0.0));
        let f = b.finish("pad", for_(&j, 16, kind, st(c, v(&j), value)));
        assert_eq!(jit_vs_interp(&f, 1, 8), 0.0, "{kind:?}");
    }
}

/// Index comparisons against the vectorized variable (an inlined padding's bounds), which
/// the code generator turns into one compare of 32-bit lane numbers against a clamped scalar:
/// every comparison, either side, the variable with stride 1 or -1, bounds far outside the
/// lanes and differences past the 64-bit range agree with the interpreter, lane by lane.
#[test]
fn lane_bound_comparisons_match() {
    use tensortune_schedules::expr::CmpOp;
    let ops = [
        CmpOp::Lt,
        CmpOp::Le,
        CmpOp::Gt,
        CmpOp::Ge,
        CmpOp::Eq,
        CmpOp::Ne,
    ];
    // (offset added to the lane side, scale of the outer variable on the other side).
    let shifts = [
        (0, 1),
        (-3, 1),
        (5, -2),
        (1 << 40, 1),
        (-(1 << 40), 3),
        (i64::MAX - 200, 1),
        (i64::MIN + 200, -1),
    ];
    for w in [5, 16, 37, 56] {
        for (op, &(off, k)) in ops.iter().flat_map(|o| shifts.iter().map(move |s| (o, s))) {
            let mut b = Builder::new();
            let a = b.input("A", DType::F32, &[4 * w]);
            let c = b.output("C", DType::F32, &[4 * w]);
            let (s, j) = (b.var("s"), b.var("j"));
            let at = add(mul(v(&s), int(w)), v(&j));
            let other = add(mul(v(&s), int(k)), int(w / 2));
            // Stride 1 on the left, on the right, and stride -1 (`off - j`).
            let conds = [
                Expr::cmp(*op, add(v(&j), int(off)), other.clone()),
                Expr::cmp(*op, other.clone(), add(v(&j), int(off))),
                Expr::cmp(
                    *op,
                    Expr::bin(BinOp::Sub, int(off.saturating_sub(64)), v(&j)),
                    other,
                ),
            ];
            for (n, cond) in conds.into_iter().enumerate() {
                let value = ex::select(cond, ld(a, DType::F32, at.clone()), Expr::f32(-1.0));
                let body = for_(&j, w, ForKind::Vectorized, st(c, at.clone(), value));
                let f = b.clone_finish("lanecmp", for_(&s, 4, ForKind::Serial, body));
                assert_eq!(
                    jit_vs_interp(&f, 1, 5),
                    0.0,
                    "w={w} {op:?} off={off} k={k} form {n}\n{f}"
                );
            }
        }
    }
    // The fast form leaves no 64-bit lane comparison in the IR.
    let mut b = Builder::new();
    let a = b.input("A", DType::F32, &[64]);
    let c = b.output("C", DType::F32, &[64]);
    let (s, j) = (b.var("s"), b.var("j"));
    let at = add(mul(v(&s), int(16)), v(&j));
    let cond = add(v(&j), v(&s))
        .ge(int(1))
        .and(add(v(&j), v(&s)).lt(int(17)));
    let value = ex::select(cond, ld(a, DType::F32, at.clone()), Expr::f32(0.0));
    let body = for_(&j, 16, ForKind::Vectorized, st(c, at, value));
    let f = b.finish("lanecmp", for_(&s, 4, ForKind::Serial, body));
    let ir = raw_ir(&f);
    assert!(ir.contains("icmp sge <16 x i32>"), "{ir}");
    assert!(!ir.contains("x i64> %"), "a 64-bit lane operation: {ir}");
    assert_eq!(jit_vs_interp(&f, 1, 6), 0.0);
}

#[test]
fn shape_and_dtype_mismatch_are_errors() {
    let k = Kernel::compile(&axpy(20, ForKind::Vectorized)).expect("compile");
    let rt = Runtime::serial();
    let good = AlignedBuffer::zeros(&[20], DType::F32).expect("buf");
    let short = AlignedBuffer::zeros(&[19], DType::F32).expect("buf");
    let wrong = AlignedBuffer::zeros(&[20], DType::F64).expect("buf");
    let mut out = AlignedBuffer::zeros(&[20], DType::F32).expect("buf");
    let r = k.run(&rt, &[&good, &short], &mut [&mut out]);
    assert!(matches!(r, Err(RunError::Shape { .. })), "{r:?}");
    let r = k.run(&rt, &[&good, &wrong], &mut [&mut out]);
    assert!(matches!(r, Err(RunError::DType { .. })), "{r:?}");
    let r = k.run(&rt, &[&good], &mut [&mut out]);
    assert!(matches!(r, Err(RunError::ArgCount { .. })), "{r:?}");
    let mut bad_out = AlignedBuffer::zeros(&[2, 10], DType::F32).expect("buf");
    let r = k.run(&rt, &[&good, &good], &mut [&mut bad_out]);
    assert!(matches!(r, Err(RunError::Shape { .. })), "{r:?}");
    assert!(k.run(&rt, &[&good, &good], &mut [&mut out]).is_ok());
    assert!(k
        .run_nd(&rt, &[NdData::random(&[20], DType::I32, 1).expect("i32")])
        .is_err());
}

#[test]
fn avx512_assembly_uses_zmm() {
    let host = tensortune::codegen::HostTarget::host();
    if !host.has_feature("avx512f") {
        eprintln!("skipped: host {} has no AVX-512", host.cpu);
        return;
    }
    let asm =
        tensortune::codegen::llvm::emit_asm(&axpy(64, ForKind::Vectorized), &Default::default())
            .expect("asm");
    assert!(asm.contains("zmm"), "no zmm register in:\n{asm}");
}

#[test]
fn invalid_ir_is_an_error() {
    let mut b = Builder::new();
    let c = b.output("C", DType::F32, &[4]);
    let j = b.var("j");
    let stray = Var::new(7, "stray");
    let f = b.finish(
        "bad",
        for_(&j, 4, ForKind::Serial, st(c, v(&stray), Expr::f32(1.0))),
    );
    assert!(Kernel::compile(&f).is_err());
    let mut g = axpy(4, ForKind::Serial);
    g.name = "not a name".into();
    assert!(Kernel::compile(&g).is_err());
}

#[test]
fn runs_on_ndarray_views_of_any_layout() {
    let k = Kernel::compile(&axpy(12, ForKind::Vectorized)).expect("compile");
    let a = ndarray::Array1::from_iter((0..24).map(|x| x as f32));
    let strided = a.slice(ndarray::s![..;2]).into_dyn();
    let ones = ndarray::Array1::<f32>::ones(12).into_dyn();
    let out = k
        .run_arrays(&Runtime::serial(), &[strided.view(), ones.view()])
        .expect("run");
    let want: Vec<f32> = (0..12).map(|i| 2.0 * (2 * i) as f32 + 1.0).collect();
    assert_eq!(out[0].iter().copied().collect::<Vec<_>>(), want);
    let short = ndarray::Array1::<f32>::ones(11).into_dyn();
    assert!(matches!(
        k.run_arrays(&Runtime::serial(), &[short.view(), ones.view()]),
        Err(RunError::Shape { .. })
    ));
}

/// The vector `exp` (a polynomial, not libm) at the edges of the f32 range.
#[test]
fn vector_exp_edges() {
    let xs: Vec<f32> = vec![
        -200.0,
        -104.0,
        -103.0,
        -100.0,
        -90.0,
        -87.5,
        -50.0,
        -1.0,
        -0.3,
        0.0,
        0.3,
        1.0,
        10.0,
        50.0,
        88.0,
        88.5,
        88.7,
        88.73,
        100.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e-8,
        -1e-8,
        -103.98,
        -103.9,
        -104.5,
        -87.4,
        88.72,
        88.75,
        89.5,
    ];
    // And a sweep of the whole range, denormal and overflowing results included.
    let mut xs = xs;
    xs.extend((0..20_000).map(|i| -110.0 + i as f32 * 0.01));
    // Vectors of 16 lanes and multiples (AVX-512's `vscalefps` where the host has it), of 8
    // (the integer construction of 2^k) and of 24 (widened to 32 lanes on AVX-512), over rows
    // of that many lanes.
    for lanes in [8, 16, 24, 64] {
        let mut xs = xs.clone();
        xs.resize(xs.len().div_ceil(lanes) * lanes, 0.5);
        let n = xs.len() as i64;
        let rows = n / lanes as i64;
        let mut b = Builder::new();
        let a = b.input("A", DType::F32, &[n]);
        let c = b.output("C", DType::F32, &[n]);
        let (i, j) = (b.var("i"), b.var("j"));
        let at = add(mul(v(&i), int(lanes as i64)), v(&j));
        let e = Expr::Call(Intrinsic::Exp, Box::new(ld(a, DType::F32, at.clone())));
        let inner = for_(&j, lanes as i64, ForKind::Vectorized, st(c, at, e));
        let f = b.finish("vexp", for_(&i, rows, ForKind::Serial, inner));
        // The polynomial, not libm; `vscalefps` where AVX-512 is and the lanes fit it.
        let ir = tensortune::codegen::llvm::emit_llvm_ir(&f, &Default::default()).expect("ir");
        assert!(!ir.contains("@expf") && !ir.contains("@llvm.exp."), "{ir}");
        let avx512 = tensortune::codegen::HostTarget::host().has_feature("avx512f");
        if lanes == 8 || (avx512 && lanes % 16 == 0) {
            assert_eq!(ir.contains("scalef"), lanes != 8, "{lanes} lanes");
        }
        let k = Kernel::compile(&f).expect("compile");
        let input = NdData::new(vec![n], Data::F32(xs.clone())).expect("data");
        let got = k.run_nd(&Runtime::serial(), &[input]).expect("run");
        let Data::F32(y) = &got[0].data else {
            panic!("dtype")
        };
        // The reference in f64, rounded once: within 4e-7 relative in the normal range, two
        // steps of the least denormal (2^-149) below it, exact at 0, infinity and NaN.
        let least = f64::from(f32::from_bits(1));
        for (x, y) in xs.iter().zip(y) {
            let want = f64::from(*x).exp() as f32;
            let (w, g) = (f64::from(want), f64::from(*y));
            let ok = (want.is_nan() && y.is_nan())
                || want == *y
                || (want.is_normal() && ((w - g).abs() / w.abs()) < 4e-7)
                || (w.abs() < f64::from(f32::MIN_POSITIVE) && (w - g).abs() <= 2.0 * least);
            assert!(
                ok,
                "{lanes} lanes: exp({x}) = {y:e}, f64 reference {want:e}"
            );
        }
    }
}

/// `C[i, j] = A[i, j] * 2 + T[j]` over `rows x w`, `j` vectorized, through a temporary row
/// `T[j] = B[i, j]` of `scope` (so both main-memory and stack accesses of `w` lanes occur).
fn rows_op(rows: i64, w: i64, dtype: DType, scope: Scope) -> LoweredFunc {
    let mut b = Builder::new();
    let a = b.input("A", dtype, &[rows, w]);
    let bb = b.input("B", dtype, &[rows, w]);
    let c = b.output("C", dtype, &[rows, w]);
    let t = b.buf("T", dtype, &[w], BufKind::Temp, scope);
    let (i, j, j2) = (b.var("i"), b.var("j"), b.var("j2"));
    let at = |j: &Var| add(mul(v(&i), int(w)), v(j));
    let two = match dtype {
        DType::F32 => Expr::f32(2.0),
        DType::F64 => Expr::f64(2.0),
        _ => Expr::i32(2),
    };
    let fill = for_(
        &j,
        w,
        ForKind::Vectorized,
        st(t, v(&j), ld(bb, dtype, at(&j))),
    );
    let out = for_(
        &j2,
        w,
        ForKind::Vectorized,
        st(
            c,
            at(&j2),
            add(mul(ld(a, dtype, at(&j2)), two), ld(t, dtype, v(&j2))),
        ),
    );
    let body = Stmt::Allocate {
        buf: t,
        body: Box::new(Stmt::seq(vec![fill, out])),
    };
    b.finish("rows_op", for_(&i, rows, ForKind::Serial, body))
}

#[test]
fn padded_vector_accesses_match() {
    for w in [3, 7, 14, 16, 28, 56] {
        for dtype in [DType::F32, DType::F64, DType::I32] {
            for scope in [Scope::Local, Scope::Global] {
                let f = rows_op(5, w, dtype, scope);
                let d = jit_vs_interp(&f, 1, 11);
                assert!(d < 1e-6, "w={w} {dtype} {scope:?}: {d}");
            }
        }
    }
}

#[test]
fn wide_non_power_of_two_lanes_run_in_register_chunks() {
    // More lanes than a register, not a power of two: whole registers, then the rest.
    for w in [17, 24, 40, 48, 80, 100] {
        for dtype in [DType::F32, DType::F64, DType::I32] {
            for scope in [Scope::Local, Scope::Global] {
                let d = jit_vs_interp(&rows_op(3, w, dtype, scope), 1, 17);
                assert!(d < 1e-6, "w={w} {dtype} {scope:?}: {d}");
            }
        }
    }
    let host = tensortune::codegen::HostTarget::host();
    let register = (host.vector_bits / 32) as usize;
    let ir = raw_ir(&rows_op(4, 48, DType::F32, Scope::Local));
    assert!(!ir.contains("<48 x"), "{ir}");
    if 48 % register == 0 {
        assert!(ir.contains(&format!("<{register} x float>")), "{ir}");
    }
}

/// The unoptimized LLVM IR of `f` with the default options.
fn raw_ir(f: &LoweredFunc) -> String {
    let raw = CodegenOptions {
        optimize: false,
        ..CodegenOptions::default()
    };
    tensortune::codegen::llvm::emit_llvm_ir(f, &raw).expect("ir")
}

/// The unoptimized LLVM IR of `f`, or `None` (the test skips) on a host without AVX-512 masks.
fn raw_ir_with_avx512_masks(f: &LoweredFunc, opts: CodegenOptions) -> Option<String> {
    let host = tensortune::codegen::HostTarget::host();
    if !(host.has_feature("avx512f") && host.has_feature("avx512vl")) {
        eprintln!("skipped: host {} has no AVX-512 masks", host.cpu);
        return None;
    }
    let raw = CodegenOptions {
        optimize: false,
        ..opts
    };
    Some(tensortune::codegen::llvm::emit_llvm_ir(f, &raw).expect("ir"))
}

/// [`rows_op`]'s main-memory accesses as 16 lanes under a mask: A and B loaded, C stored.
fn assert_masked_main_memory(ir: &str) {
    assert_eq!(
        ir.matches("call <16 x float> @llvm.masked.load.v16f32")
            .count(),
        2,
        "{ir}"
    );
    assert_eq!(
        ir.matches("call void @llvm.masked.store.v16f32").count(),
        1,
        "{ir}"
    );
}

#[test]
fn non_power_of_two_lanes_in_main_memory_are_one_masked_access() {
    let f = rows_op(4, 14, DType::F32, Scope::Local);
    let Some(ir) = raw_ir_with_avx512_masks(&f, CodegenOptions::default()) else {
        return;
    };
    // T, an unpadded stack row, exactly: a full-width store would reach the next row.
    assert_masked_main_memory(&ir);
    assert!(ir.contains("store <14 x float>"), "{ir}");
    let exact = CodegenOptions {
        padded_vectors: false,
        ..CodegenOptions::default()
    };
    let ir = raw_ir_with_avx512_masks(&f, exact).expect("checked above");
    assert!(!ir.contains("masked"), "{ir}");
}

/// [`rows_op`] on the stack, with the temporary row padded to a power of two as lowering pads
/// local rows (`BufferDecl::row_pad`).
fn padded_rows_op(rows: i64, w: i64, dtype: DType) -> LoweredFunc {
    let mut f = rows_op(rows, w, dtype, Scope::Local);
    let t = f
        .buffers
        .iter_mut()
        .find(|b| b.name == "T")
        .expect("the temporary");
    let width = (w as u64).next_power_of_two() as i64;
    t.shape = vec![width];
    t.row_pad = width - w;
    f
}

#[test]
fn widened_vector_loops_match() {
    for w in [3, 5, 7, 12, 14] {
        for dtype in [DType::F32, DType::F64, DType::I32] {
            let d = jit_vs_interp(&padded_rows_op(5, w, dtype), 1, 13);
            assert!(d < 1e-6, "w={w} {dtype}: {d}");
        }
    }
}

#[test]
fn non_power_of_two_lanes_run_widened_over_padded_rows() {
    let f = padded_rows_op(4, 14, DType::F32);
    let Some(ir) = raw_ir_with_avx512_masks(&f, CodegenOptions::default()) else {
        return;
    };
    // Every value is 16 lanes, the padded stack row T loaded and stored whole.
    assert!(!ir.contains("<14 x"), "{ir}");
    assert_masked_main_memory(&ir);
    assert!(ir.contains("store <16 x float>"), "{ir}");
    assert!(ir.contains("load <16 x float>"), "{ir}");

    // Not widened: an integer division by a loaded value (a padding lane would divide by
    // zero).
    let mut f = padded_rows_op(4, 14, DType::I32);
    let divide = |e: &Expr| {
        e.rewrite(&mut |x| match x {
            Expr::Bin(BinOp::Mul, a, _) if matches!(**a, Expr::BufLoad { .. }) => {
                Some(Expr::Bin(BinOp::Div, a.clone(), a.clone()))
            }
            _ => None,
        })
    };
    f.body = f.body.map_exprs(&divide, &|b| b);
    let ir = raw_ir_with_avx512_masks(&f, CodegenOptions::default()).expect("checked above");
    assert!(ir.contains("<14 x i32>"), "{ir}");
}

/// `for o in 0..8 { for i in 0..inner { C[o, i] = A[o, i] + 1 } }`, or with `update`
/// `C[o, i] = A[o, i]; C[o, i] = C[o, i] + 1` (an update).
fn nest(inner: i64, inner_kind: ForKind, update: bool) -> LoweredFunc {
    let mut b = Builder::new();
    let a = b.input("A", DType::F32, &[8, inner]);
    let c = b.output("C", DType::F32, &[8, inner]);
    let (o, i) = (b.var("o"), b.var("i"));
    let at = add(mul(v(&o), int(inner)), v(&i));
    let one = Expr::f32(1.0);
    let body = if update {
        Stmt::seq(vec![
            st(c, at.clone(), ld(a, DType::F32, at.clone())),
            st(c, at.clone(), add(ld(c, DType::F32, at), one)),
        ])
    } else {
        st(c, at.clone(), add(ld(a, DType::F32, at), one))
    };
    b.finish(
        "nest",
        for_(&o, 8, ForKind::Serial, for_(&i, inner, inner_kind, body)),
    )
}

#[test]
fn llvm_does_not_unroll_loops_around_long_loops() {
    let raw = CodegenOptions {
        optimize: false,
        ..CodegenOptions::default()
    };
    let marked = |f: &LoweredFunc, opts: &CodegenOptions| {
        let ir = tensortune::codegen::llvm::emit_llvm_ir(f, opts).expect("ir");
        // Loop metadata is only ever the unroll veto.
        let n = ir.matches("!llvm.loop").count();
        assert_eq!(
            n > 0,
            ir.contains("!{!\"llvm.loop.unroll.disable\"}"),
            "{ir}"
        );
        assert!(!ir.contains("llvm.loop.unroll.enable"), "{ir}");
        n
    };
    // Updates: only the outer loop, and only around a rolled loop of more than 16 iterations.
    assert_eq!(marked(&nest(28, ForKind::Serial, true), &raw), 1);
    assert_eq!(marked(&nest(16, ForKind::Serial, true), &raw), 0);
    assert_eq!(marked(&nest(28, ForKind::Unrolled, true), &raw), 0);
    assert_eq!(marked(&nest(28, ForKind::Vectorized, true), &raw), 0);
    // Loops that update nothing: every rolled loop.
    assert_eq!(marked(&nest(16, ForKind::Serial, false), &raw), 2);
    assert_eq!(marked(&nest(16, ForKind::Vectorized, false), &raw), 1);
    let unlimited = CodegenOptions {
        llvm_unroll_max_inner: i64::MAX,
        llvm_unroll_updates_only: false,
        ..raw
    };
    assert_eq!(marked(&nest(28, ForKind::Serial, true), &unlimited), 0);
    assert_eq!(marked(&nest(28, ForKind::Serial, false), &unlimited), 0);
    for (inner, update) in [(16, true), (28, true), (16, false)] {
        let d = jit_vs_interp(&nest(inner, ForKind::Serial, update), 1, 2);
        assert!(d < 1e-6, "inner={inner} update={update}: {d}");
    }
}

#[test]
fn unrolling_is_capped_by_the_copies_of_a_whole_nest() {
    // `h` unrolled around `w` unrolled: 30 x 16 = 480 copies of the store, over the cap of 256.
    let build = |rows: i64| {
        let mut b = Builder::new();
        let a = b.input("A", DType::F32, &[rows, 16]);
        let c = b.output("C", DType::F32, &[rows, 16]);
        let (h, w) = (b.var("h"), b.var("w"));
        let at = add(mul(v(&h), int(16)), v(&w));
        let body = st(c, at.clone(), add(ld(a, DType::F32, at), Expr::f32(1.0)));
        b.finish(
            "unrolled",
            for_(
                &h,
                rows,
                ForKind::Unrolled,
                for_(&w, 16, ForKind::Unrolled, body),
            ),
        )
    };
    let raw = CodegenOptions {
        optimize: false,
        ..CodegenOptions::default()
    };
    let ir = |rows| tensortune::codegen::llvm::emit_llvm_ir(&build(rows), &raw).expect("ir");
    assert!(ir(30).contains("h.loop"), "h stays a loop:\n{}", ir(30));
    assert!(
        !ir(8).contains(".loop"),
        "8 x 16 is fully unrolled:\n{}",
        ir(8)
    );
    for rows in [8, 30] {
        assert!(jit_vs_interp(&build(rows), 1, 4) < 1e-6, "rows={rows}");
    }
}

/// `C[0..n) = 2 A` in rows of `lanes` lanes (aligned lines, or halves of them), then
/// `C[n + 4 .. n + 4 + lanes) = 2 B` as one vector a quarter line off (and `C[n .. n + 4) =
/// 0`), the rows' loop of `kind`.
fn two_alignments(rows: i64, kind: ForKind, lanes: i64) -> LoweredFunc {
    let n = rows * lanes;
    let mut b = Builder::new();
    let a = b.input("A", DType::F32, &[n]);
    let bb = b.input("B", DType::F32, &[lanes]);
    let c = b.output("C", DType::F32, &[n + 4 + lanes]);
    let (i, j, k, z) = (b.var("i"), b.var("j"), b.var("k"), b.var("z"));
    let at = add(mul(v(&i), int(lanes)), v(&j));
    let two = |e: Expr| mul(e, Expr::f32(2.0));
    let lines = for_(
        &i,
        rows,
        kind,
        for_(
            &j,
            lanes,
            ForKind::Vectorized,
            st(c, at.clone(), two(ld(a, DType::F32, at))),
        ),
    );
    let off = for_(
        &k,
        lanes,
        ForKind::Vectorized,
        st(c, add(v(&k), int(n + 4)), two(ld(bb, DType::F32, v(&k)))),
    );
    let zero = for_(
        &z,
        4,
        ForKind::Serial,
        st(c, add(v(&z), int(n)), Expr::f32(0.0)),
    );
    b.finish("two_alignments", Stmt::seq(vec![lines, zero, off]))
}

/// Vector stores of whole lines, or of halves of lines, to an output the kernel never reads
/// are non-temporal past the threshold (each checked for alignment to its size at run time,
/// an `sfence` at the end of the kernel and of each parallel part), and the results are the
/// same either way.
#[test]
fn nontemporal_stores_of_unread_outputs() {
    let host = tensortune::codegen::HostTarget::host();
    if !host.triple.starts_with("x86_64") {
        eprintln!("skipped: non-temporal stores are emitted on x86-64 only");
        return;
    }
    let always = CodegenOptions {
        nontemporal_past_bytes: Some(0),
        ..CodegenOptions::default()
    };
    let rows = 6;
    for (kind, lanes) in [
        (ForKind::Serial, 16),
        (ForKind::Parallel, 16),
        (ForKind::Serial, 8),
    ] {
        let a: Vec<f32> = (0..rows * lanes).map(|x| x as f32 * 0.5 - 3.0).collect();
        let bv: Vec<f32> = (0..lanes).map(|x| 100.0 + x as f32).collect();
        let mut want: Vec<f32> = a.iter().map(|x| 2.0 * x).collect();
        want.extend([0.0; 4]);
        want.extend(bv.iter().map(|x| 2.0 * x));
        let f = two_alignments(rows, kind, lanes);
        let ir = tensortune::codegen::llvm::emit_llvm_ir(&f, &always).expect("ir");
        let nt = format!("store <{lanes} x float>");
        let align = format!("align {}", lanes * 4);
        assert!(
            ir.lines()
                .any(|l| l.contains(&nt) && l.contains(&align) && l.contains("!nontemporal")),
            "{ir}"
        );
        let fences = ir.matches("call void @llvm.x86.sse.sfence").count();
        let parts = if kind == ForKind::Parallel { 2 } else { 1 };
        assert_eq!(fences, parts, "{ir}");
        // Under the default threshold (the last-level cache) this small output streams not.
        let ir = tensortune::codegen::llvm::emit_llvm_ir(&f, &Default::default()).expect("ir");
        assert!(
            !ir.contains("!nontemporal") && !ir.contains("sfence"),
            "{ir}"
        );
        for opts in [&always, &CodegenOptions::default()] {
            let k = Kernel::compile_with(&f, opts).expect("compile");
            let ins = [
                NdData::new(vec![rows * lanes], Data::F32(a.clone())).expect("a"),
                NdData::new(vec![lanes], Data::F32(bv.clone())).expect("b"),
            ];
            let rt = Runtime::new(2).expect("runtime");
            let got = k.run_nd(&rt, &ins).expect("run");
            assert_eq!(got[0].data, Data::F32(want.clone()), "{kind:?}");
        }
    }
    // An output the kernel reads back (an accumulation) is never streamed.
    let mut b = Builder::new();
    let a = b.input("A", DType::F32, &[64]);
    let c = b.output("C", DType::F32, &[64]);
    let (r, j) = (b.var("r"), b.var("j"));
    let acc = st(
        c,
        v(&j),
        add(ld(c, DType::F32, v(&j)), ld(a, DType::F32, v(&j))),
    );
    let f = b.finish(
        "acc",
        for_(
            &r,
            3,
            ForKind::Serial,
            for_(&j, 64, ForKind::Vectorized, acc),
        ),
    );
    let ir = tensortune::codegen::llvm::emit_llvm_ir(&f, &always).expect("ir");
    assert!(!ir.contains("!nontemporal"), "{ir}");
}

/// A division by a value the loop does not change (softmax's row sum) is marked `arcp`, so
/// LLVM divides once, outside the loop, and multiplies inside it: a vector division costs
/// several multiplies' time on every x86 core. The quotients stay within a rounding or two
/// of the interpreter's.
#[test]
fn division_by_a_loop_invariant_becomes_a_multiply() {
    let n = 256;
    let mut b = Builder::new();
    let a = b.input("A", DType::F32, &[n]);
    let s = b.input("S", DType::F32, &[1]);
    let c = b.output("C", DType::F32, &[n]);
    let (vo, vi) = (b.var("vo"), b.var("vi"));
    let i = add(mul(v(&vo), int(16)), v(&vi));
    let body = st(
        c,
        i.clone(),
        Expr::bin(BinOp::Div, ld(a, DType::F32, i), ld(s, DType::F32, int(0))),
    );
    let f = b.finish(
        "scale",
        for_(
            &vo,
            n / 16,
            ForKind::Serial,
            for_(&vi, 16, ForKind::Vectorized, body),
        ),
    );
    let ir = tensortune::codegen::llvm::emit_llvm_ir(&f, &Default::default()).expect("ir");
    let divisions: Vec<&str> = ir.lines().filter(|l| l.contains(" fdiv ")).collect();
    assert!(!divisions.is_empty(), "{ir}");
    // What is left is the reciprocal, 1 / S[0] (in lane 0 of a vector, or a scalar): the
    // loop's elements are multiplied by it.
    for d in &divisions {
        let reciprocal =
            d.contains("fdiv arcp float 1.0") || d.contains("fdiv arcp <16 x float> <float 1.0");
        assert!(reciprocal, "a division of the elements is left: {d}\n{ir}");
    }
    assert!(ir.contains("fmul arcp <16 x float>"), "{ir}");
    let err = jit_vs_interp(&f, 1, 5);
    assert!(err < 1e-6, "max relative difference {err}");
}

/// A register tile with a reduction loop outside it, shaped as in a conv2d 28² micro-kernel:
/// the whole accumulator `acc[x2 < 4, t < 7, k2 < 2, j < 64]` is zeroed first; then, for
/// each outer reduction step `ro` and each of the tiles `x2`, `k2`,
/// `acc[x2, t, k2, :] += X[r', x2, t] * w[r', k2, :]` over the inner reduction `r`
/// (`r' = ro·inner + r`), with `t` unrolled, `j` vectorized and `w` a temporary computed
/// from the input (half of it, so that LLVM cannot read the input in its place).
fn tile_with_outer_reduction(outer: i64, inner: i64, rows_kind: ForKind) -> LoweredFunc {
    let (tiles_x, rows, tiles_k, lanes) = (4, 7, 2, 64);
    let (per_x, per_k) = (rows * tiles_k * lanes, tiles_k * lanes);
    let reduce = outer * inner;
    let mut b = Builder::new();
    let x = b.input("X", DType::F32, &[reduce, tiles_x, rows]);
    let wi = b.input("W", DType::F32, &[reduce, per_k]);
    let o = b.output("O", DType::F32, &[tiles_x, rows, tiles_k, lanes]);
    let w = b.buf(
        "w",
        DType::F32,
        &[reduce, per_k],
        BufKind::Temp,
        Scope::Local,
    );
    let acc = b.buf(
        "acc",
        DType::F32,
        &[tiles_x, rows, tiles_k, lanes],
        BufKind::Temp,
        Scope::Local,
    );
    let (pr, pj, zi, ro, x2, k2, r, t, j, oi) = (
        b.var("pr"),
        b.var("pj"),
        b.var("zi"),
        b.var("ro"),
        b.var("x2"),
        b.var("k2"),
        b.var("r"),
        b.var("t"),
        b.var("j"),
        b.var("oi"),
    );
    // The accumulator's index puts the unrolled `t` between the two outer tiles' terms.
    let acc_i = add(
        add(
            add(mul(v(&x2), int(per_x)), mul(v(&t), int(per_k))),
            mul(v(&k2), int(lanes)),
        ),
        v(&j),
    );
    let step = add(mul(v(&ro), int(inner)), v(&r));
    let pack = for_(
        &pr,
        reduce,
        ForKind::Serial,
        for_(
            &pj,
            per_k,
            ForKind::Vectorized,
            st(
                w,
                add(mul(v(&pr), int(per_k)), v(&pj)),
                mul(
                    ld(wi, DType::F32, add(mul(v(&pr), int(per_k)), v(&pj))),
                    Expr::f32(0.5),
                ),
            ),
        ),
    );
    let all = tiles_x * per_x;
    let zero = for_(&zi, all, ForKind::Serial, st(acc, v(&zi), Expr::f32(0.0)));
    let x_i = add(
        add(
            mul(step.clone(), int(tiles_x * rows)),
            mul(v(&x2), int(rows)),
        ),
        v(&t),
    );
    let w_i = add(add(mul(step, int(per_k)), mul(v(&k2), int(lanes))), v(&j));
    let update = for_(
        &r,
        inner,
        ForKind::Serial,
        for_(
            &t,
            rows,
            rows_kind,
            for_(
                &j,
                lanes,
                ForKind::Vectorized,
                st(
                    acc,
                    acc_i.clone(),
                    add(
                        ld(acc, DType::F32, acc_i),
                        mul(ld(x, DType::F32, x_i), ld(w, DType::F32, w_i)),
                    ),
                ),
            ),
        ),
    );
    let tiles = for_(
        &ro,
        outer,
        ForKind::Serial,
        for_(
            &x2,
            tiles_x,
            ForKind::Serial,
            for_(&k2, tiles_k, ForKind::Serial, update),
        ),
    );
    let write = for_(
        &oi,
        all,
        ForKind::Serial,
        st(o, v(&oi), ld(acc, DType::F32, v(&oi))),
    );
    let body = Stmt::Allocate {
        buf: w,
        body: Box::new(Stmt::seq(vec![
            pack,
            Stmt::Allocate {
                buf: acc,
                body: Box::new(Stmt::seq(vec![zero, tiles, write])),
            },
        ])),
    };
    b.finish("outer_reduction", body)
}

/// The accumulators of a register tile stay in registers across the reduction loop around
/// them, whether the temporaries live on the stack or in blocks from `rt->alloc`: LLVM must
/// see that the tile's addresses differ by constants and that the tile and the temporary the
/// loop reads do not overlap. Before, the tile was loaded and stored around every FMA
/// (conv2d 28² 3×3 ran at half its speed).
#[test]
fn a_register_tile_is_not_stored_inside_the_reduction_loop_around_it() {
    let f = tile_with_outer_reduction(4, 3, ForKind::Unrolled);
    for (place, opts) in [
        ("stack", CodegenOptions::default()),
        ("heap", temps_on_heap()),
    ] {
        assert_tile_in_registers(&f, &opts, place);
    }
}

/// The same tile with its rows in a rolled loop, which LLVM's unroller copies out after
/// code generation: the row's term of the index becomes a constant only then, and it must
/// still be last among the loop terms (the order the loops were entered in), or the outer
/// tile's term after it hides the constant from alias analysis again. This is the tile of a
/// matmul with its outer reduction loop outermost, which ran at a quarter of its speed.
#[test]
fn a_tile_whose_rows_llvm_unrolls_stays_in_registers_too() {
    let f = tile_with_outer_reduction(4, 3, ForKind::Serial);
    assert_tile_in_registers(&f, &temps_on_heap(), "heap, rows rolled");
}

/// Options that put every temporary in a block from `rt->alloc`.
fn temps_on_heap() -> CodegenOptions {
    CodegenOptions {
        max_stack_alloc_bytes: 0,
        ..CodegenOptions::default()
    }
}

/// Checks that the block of the reduction loop `r` of [`tile_with_outer_reduction`] holds
/// the update and no store, and that the kernel computes what the interpreter does.
fn assert_tile_in_registers(f: &LoweredFunc, opts: &CodegenOptions, place: &str) {
    let ir = tensortune::codegen::llvm::emit_llvm_ir(f, opts).expect("ir");
    assert_eq!(
        ir.contains("alloca [3584 x float]"),
        place == "stack",
        "{place}: where the tile lives:\n{ir}"
    );
    let start = ir
        .find("\nr.loop:")
        .unwrap_or_else(|| panic!("{place}: no `r.loop` block:\n{ir}"));
    let block: Vec<&str> = ir[start + 1..]
        .lines()
        .skip(1)
        .take_while(|l| !l.is_empty() && !l.ends_with(':') && !l.contains(": "))
        .collect();
    assert!(
        block
            .iter()
            .any(|l| l.contains("fmul") || l.contains("fma")),
        "{place}: the `r.loop` block is not the update:\n{ir}"
    );
    let stores: Vec<&&str> = block.iter().filter(|l| l.contains("store ")).collect();
    assert!(
        stores.is_empty(),
        "{place}: stores in the reduction loop: {stores:?}\n{ir}"
    );
    let k = Kernel::compile_with(f, opts).expect("compile");
    let inputs: Vec<NdData> = k
        .inputs()
        .enumerate()
        .map(|(i, p)| NdData::random(&p.shape, p.dtype, 3 + i as u64).expect("data"))
        .collect();
    let want = interp::run(f, &inputs).expect("interp");
    let got = k
        .run_nd(&Runtime::new(1).expect("runtime"), &inputs)
        .expect("run");
    let err = got[0].max_rel_diff(&want[0]).expect("same shape");
    assert!(err < 1e-5, "{place}: max relative difference {err}");
}

/// `S[i] = identity; S[i] = S[i] op x` over the `w` columns `k` of `rows` rows, `k` a loop
/// of `kind`, with `x` one of: `A[i, k]` (the last step of a reduction split by `rfactor`,
/// folding its partial results), `A[i, k] * B[k]` (a dot product, `B` as wide as a row),
/// `A[i, k] * 2 + B[0]` (a value read the same in every iteration), or `A[i, k/2 * 2]` (not
/// contiguous: a gather, left as a chain).
fn row_fold(
    rows: i64,
    w: i64,
    op: ex::Combiner,
    kind: ForKind,
    dtype: DType,
    form: usize,
) -> LoweredFunc {
    let mut b = Builder::new();
    let a = b.input("A", dtype, &[rows, w]);
    let bb = (form > 0).then(|| b.input("B", dtype, &[w]));
    let s = b.output("S", dtype, &[rows]);
    let (i, k) = (b.var("i"), b.var("k"));
    let row = mul(v(&i), int(w));
    let two = if dtype == DType::F32 {
        Expr::f32(2.0)
    } else {
        Expr::f64(2.0)
    };
    let x = match (form, bb) {
        (1, Some(bb)) => mul(ld(a, dtype, add(row, v(&k))), ld(bb, dtype, v(&k))),
        (2, Some(bb)) => add(
            mul(ld(a, dtype, add(row, v(&k))), two),
            ld(bb, dtype, int(0)),
        ),
        (3, Some(bb)) => add(
            ld(
                a,
                dtype,
                add(row, mul(Expr::bin(BinOp::Div, v(&k), int(2)), int(2))),
            ),
            ld(bb, dtype, int(0)),
        ),
        _ => ld(a, dtype, add(row, v(&k))),
    };
    let init = st(s, v(&i), Expr::Const(op.identity(dtype)));
    let update = st(s, v(&i), Expr::bin(op.bin_op(), ld(s, dtype, v(&i)), x));
    let body = Stmt::seq(vec![init, for_(&k, w, kind, update)]);
    b.finish("row_fold", for_(&i, rows, ForKind::Serial, body))
}

/// Rows the code generator folds on registers (whole registers, with a rest; up to four
/// registers straight, longer ones in a loop of four-register groups) and rows it leaves as
/// a chain (shorter than a register, not contiguous): sums within rounding of the
/// interpreter's chain, maxima and minima equal to it, NaNs and infinities in the rows
/// included (`f32::max`'s rule: a NaN is skipped, not propagated).
#[test]
fn folds_of_a_row_match_the_chain() {
    use ex::Combiner::{Max, Min, Sum};
    for dtype in [DType::F32, DType::F64] {
        for w in [3, 8, 16, 37, 64, 100, 256, 300, 1000, 4099] {
            for kind in [ForKind::Serial, ForKind::Unrolled, ForKind::Vectorized] {
                for op in [Sum, Max, Min] {
                    for form in 0..4 {
                        let f = row_fold(5, w, op, kind, dtype, form);
                        let d = jit_vs_interp(&f, 1, w as u64);
                        let tol = if dtype == DType::F32 { 1e-5 } else { 1e-12 };
                        assert!(d < tol, "{dtype} w={w} {kind:?} {op:?} form {form}: {d}");
                    }
                    if op == Sum {
                        continue;
                    }
                    // NaNs, infinities and signless values in the rows: exactly the chain.
                    let f = row_fold(5, w, op, kind, dtype, 0);
                    let specials = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.5, -2.0];
                    let n = (5 * w) as usize;
                    let vals: Vec<f64> = (0..n)
                        .map(|j| {
                            if j % 7 == 3 {
                                specials[j % 5]
                            } else {
                                j as f64 * 0.25
                            }
                        })
                        .collect();
                    let data = match dtype {
                        DType::F32 => Data::F32(vals.iter().map(|&x| x as f32).collect()),
                        _ => Data::F64(vals),
                    };
                    let input = NdData::new(vec![5, w], data).expect("data");
                    let want = interp::run(&f, std::slice::from_ref(&input)).expect("interp");
                    let k = Kernel::compile(&f).expect("compile");
                    let got = k.run_nd(&Runtime::serial(), &[input]).expect("run");
                    assert_eq!(
                        format!("{:?}", got[0].data),
                        format!("{:?}", want[0].data),
                        "{dtype} w={w} {kind:?} {op:?}"
                    );
                }
            }
        }
    }
    // Folded on registers, without a chain: shuffles of halves. Four registers straight;
    // a long row in a loop of four-register groups, whose accumulators are vector phis.
    let ir_of = |w: i64, form: usize| {
        let f = row_fold(2, w, Sum, ForKind::Serial, DType::F32, form);
        tensortune::codegen::llvm::emit_llvm_ir(&f, &Default::default()).expect("ir")
    };
    let ir = ir_of(64, 0);
    assert!(ir.contains("shufflevector"), "{ir}");
    let ir = ir_of(4099, 1);
    assert!(ir.contains("shufflevector") && ir.contains("phi <"), "{ir}");
    // A gather stays a chain.
    let ir = ir_of(64, 3);
    assert!(!ir.contains("shufflevector"), "{ir}");
}

/// `S[j] = max(S[j], A[k, j])` with `j` vectorized (a reduction over rows, the accumulator a
/// vector): a compare and select, not `llvm.maxnum` (whose NaN check sits in the loop-carried
/// chain), and equal to the interpreter's `f32::max` with NaNs and infinities in the input.
#[test]
fn vector_max_updates_select_and_skip_nans() {
    use ex::Combiner::{Max, Min};
    for op in [Max, Min] {
        let (rows, w) = (9, 32);
        let mut b = Builder::new();
        let a = b.input("A", DType::F32, &[rows, w]);
        let s = b.output("S", DType::F32, &[w]);
        let (j0, k, j) = (b.var("j0"), b.var("k"), b.var("j"));
        let init = for_(
            &j0,
            w,
            ForKind::Vectorized,
            st(s, v(&j0), Expr::Const(op.identity(DType::F32))),
        );
        let update = st(
            s,
            v(&j),
            Expr::bin(
                op.bin_op(),
                ld(s, DType::F32, v(&j)),
                ld(a, DType::F32, add(mul(v(&k), int(w)), v(&j))),
            ),
        );
        let red = for_(
            &k,
            rows,
            ForKind::Serial,
            for_(&j, w, ForKind::Vectorized, update),
        );
        let f = b.finish("colmax", Stmt::seq(vec![init, red]));
        let ir = tensortune::codegen::llvm::emit_llvm_ir(&f, &Default::default()).expect("ir");
        assert!(!ir.contains("maxnum") && !ir.contains("minnum"), "{ir}");
        let vals: Vec<f32> = (0..rows * w)
            .map(|x| match x % 11 {
                2 => f32::NAN,
                5 => f32::INFINITY,
                7 => f32::NEG_INFINITY,
                _ => (x as f32 * 0.37).sin(),
            })
            .collect();
        // A column of NaNs only: the identity stays.
        let mut vals = vals;
        for r in 0..rows {
            vals[(r * w + 1) as usize] = f32::NAN;
        }
        let input = NdData::new(vec![rows, w], Data::F32(vals)).expect("data");
        let want = interp::run(&f, std::slice::from_ref(&input)).expect("interp");
        let got = Kernel::compile(&f)
            .expect("compile")
            .run_nd(&Runtime::serial(), &[input])
            .expect("run");
        assert_eq!(
            format!("{:?}", got[0].data),
            format!("{:?}", want[0].data),
            "{op:?}"
        );
    }
}

/// `for io { for ii (vectorized in `lanes`, serial for 1) { out[i] = value(i) } }` over `n`
/// elements, `i = io * lanes + ii`.
fn chunked_loop(
    b: &mut Builder,
    n: i64,
    lanes: i64,
    out: BufId,
    value: impl Fn(Expr) -> Expr,
) -> Stmt {
    let (io, ii) = (b.var("io"), b.var("ii"));
    let i = add(mul(v(&io), int(lanes)), v(&ii));
    let kind = if lanes > 1 {
        ForKind::Vectorized
    } else {
        ForKind::Serial
    };
    let store = st(out, i.clone(), value(i));
    for_(
        &io,
        n / lanes,
        ForKind::Serial,
        for_(&ii, lanes, kind, store),
    )
}

/// `out[i] = acc[i] + dot_bf16(a[i], b[i])` over `n` packed pairs, the loop vectorized in
/// `lanes` (1: a serial loop), and `out[i] = dot_bf16(a[i], b[i])` without an accumulator.
fn bf16_dots(n: i64, lanes: i64, with_acc: bool) -> LoweredFunc {
    let mut b = Builder::new();
    let a = b.input("A", DType::I32, &[n]);
    let bb = b.input("B", DType::I32, &[n]);
    let acc = b.input("acc", DType::F32, &[n]);
    let out = b.output("out", DType::F32, &[n]);
    let body = chunked_loop(&mut b, n, lanes, out, |i| {
        let dot = ex::dot_bf16(ld(a, DType::I32, i.clone()), ld(bb, DType::I32, i.clone()));
        if with_acc {
            add(ld(acc, DType::F32, i), dot)
        } else {
            dot
        }
    });
    b.finish("bf16_dots", body)
}

/// bf16 dot products against f64 arithmetic on the same bits (not the interpreter, whose
/// semantics the code generator follows): whole vectors of 16, 32, 8 and 4 lanes (AVX-512
/// BF16's `vdpbf16ps` where the host has it), 12 lanes and a serial loop (unpacked into f32
/// multiply-adds everywhere). Each pair's products are exact in f32, so the result differs
/// from the exact sum by the roundings of two or three adds.
#[test]
fn bf16_pair_dot_products() {
    use tensortune_schedules::data::bf16_to_f32;
    let n = 96;
    let half = |w: i32, hi: bool| {
        bf16_to_f32(if hi {
            (w as u32 >> 16) as u16
        } else {
            w as u16
        }) as f64
    };
    for lanes in [16, 32, 8, 4, 12, 1] {
        for with_acc in [true, false] {
            let f = bf16_dots(n, lanes, with_acc);
            let k = Kernel::compile(&f).unwrap_or_else(|e| panic!("compile: {e}\n{f}"));
            // Words of two random bf16 (their bits drawn as i32 data's are not), then acc.
            let words: Vec<NdData> = (0..2)
                .map(|s| {
                    let x = NdData::random(&[2 * n], DType::BF16, 7 + s).expect("data");
                    let Data::BF16(h) = x.data else {
                        unreachable!()
                    };
                    let w = h
                        .chunks(2)
                        .map(|p| ((p[1] as u32) << 16 | p[0] as u32) as i32)
                        .collect();
                    NdData::new(vec![n], Data::I32(w)).expect("shape")
                })
                .collect();
            let acc = NdData::random(&[n], DType::F32, 9).expect("data");
            let (Data::I32(wa), Data::I32(wb), Data::F32(av)) =
                (&words[0].data, &words[1].data, &acc.data)
            else {
                unreachable!()
            };
            let want: Vec<f64> = (0..n as usize)
                .map(|i| {
                    let base = if with_acc { av[i] as f64 } else { 0.0 };
                    base + half(wa[i], false) * half(wb[i], false)
                        + half(wa[i], true) * half(wb[i], true)
                })
                .collect();
            let rt = Runtime::new(1).expect("runtime");
            let ins = [words[0].clone(), words[1].clone(), acc.clone()];
            let got = k.run_nd(&rt, &ins).expect("run");
            let Data::F32(g) = &got[0].data else {
                panic!("output dtype")
            };
            for i in 0..n as usize {
                let err = (g[i] as f64 - want[i]).abs();
                assert!(
                    err <= 4e-7 * (1.0 + want[i].abs()),
                    "lanes {lanes} acc {with_acc} [{i}]: {} against {}",
                    g[i],
                    want[i]
                );
            }
            assert!(jit_vs_interp(&f, 1, 5) < 1e-6, "lanes {lanes}");
        }
    }
    let host = tensortune::codegen::HostTarget::host();
    let ir = tensortune::codegen::llvm::emit_llvm_ir(
        &bf16_dots(64, 16, true),
        &CodegenOptions::default(),
    )
    .expect("ir");
    assert_eq!(
        ir.contains("llvm.x86.avx512bf16.dpbf16ps.512"),
        host.has_feature("avx512bf16"),
        "{ir}"
    );
}

/// bf16 loads converted to f32 and f32 rounded to bf16, in vectors and serially, against
/// the data module's conversions and values worked by hand.
#[test]
fn bf16_conversions() {
    use tensortune_schedules::data::{bf16_to_f32, f32_to_bf16};
    // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1); 1 + 3·2^-8 rounds up to
    // the even 1 + 2^-6; the largest finite f32 rounds to infinity; NaN stays NaN.
    assert_eq!(f32_to_bf16(1.0), 0x3f80);
    assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
    assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
    assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
    assert_eq!(f32_to_bf16(f32::MAX), 0x7f80);
    assert_eq!(f32_to_bf16(-2.5), 0xc020);
    assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
    assert_eq!(bf16_to_f32(0xc020), -2.5);
    let n = 48;
    for lanes in [16, 8, 1] {
        let mut b = Builder::new();
        let x = b.input("X", DType::F32, &[n]);
        let out = b.output("out", DType::F32, &[n]);
        // f32 -> bf16 -> f32: the value rounded to 8 significant bits.
        let body = chunked_loop(&mut b, n, lanes, out, |i| {
            ld(x, DType::F32, i).cast(DType::BF16).cast(DType::F32)
        });
        let f = b.finish("bf16_round_trip", body);
        let k = Kernel::compile(&f).unwrap_or_else(|e| panic!("compile: {e}\n{f}"));
        let mut xs: Vec<f32> = (0..n as usize).map(|i| (i as f32 - 20.0) * 0.37).collect();
        xs[0] = f32::from_bits(0x3f80_8000);
        xs[1] = f32::from_bits(0x3f81_8000);
        xs[2] = f32::MAX;
        xs[3] = f32::NAN;
        let input = NdData::new(vec![n], Data::F32(xs.clone())).expect("shape");
        let got = k
            .run_nd(&Runtime::new(1).expect("rt"), &[input])
            .expect("run");
        let Data::F32(g) = &got[0].data else {
            panic!("output dtype")
        };
        for (i, &x) in xs.iter().enumerate() {
            let want = bf16_to_f32(f32_to_bf16(x));
            assert!(
                g[i].to_bits() == want.to_bits() || (g[i].is_nan() && want.is_nan()),
                "lanes {lanes} [{i}] {x}: {} against {want}",
                g[i]
            );
        }
    }
}

/// Pairs of adjacent bf16 that a vectorized loop gathers (a dense layer's `W[j, 2k]`,
/// `W[j, 2k + 1]` along `j`) are gathered as 32-bit words, not as two gathers of halves
/// (which AVX-512 lacks); the words are the pairs `pack_bf16` makes, in every lane.
#[test]
fn bf16_pairs_gathered_as_words() {
    let (rows, k) = (32, 10);
    let mut b = Builder::new();
    let w = b.input("W", DType::BF16, &[rows, k]);
    let out = b.output("out", DType::I32, &[rows * (k / 2)]);
    let c = b.var("c");
    let (jo, ji) = (b.var("jo"), b.var("ji"));
    let j = add(mul(v(&jo), int(16)), v(&ji));
    let lo = add(mul(j.clone(), int(k)), mul(v(&c), int(2)));
    let hi = add(lo.clone(), int(1));
    let value = ex::pack_bf16(ld(w, DType::BF16, lo), ld(w, DType::BF16, hi));
    let store = st(out, add(mul(v(&c), int(rows)), j), value);
    let body = for_(
        &c,
        k / 2,
        ForKind::Serial,
        for_(
            &jo,
            rows / 16,
            ForKind::Serial,
            for_(&ji, 16, ForKind::Vectorized, store),
        ),
    );
    let f = b.finish("pairs_gathered", body);
    assert_eq!(jit_vs_interp(&f, 1, 3), 0.0);
    let ir = raw_ir(&f);
    assert!(ir.contains("@llvm.masked.gather.v16i32"), "{ir}");
    assert!(!ir.contains("@llvm.masked.gather.v16i16"), "{ir}");
}

/// Generated code does not check its indices: a function that lowering did not make is
/// compiled (or written as an object) only where every access is shown to stay inside its
/// buffer, and a function that lowering made but that was changed since is proved like any
/// other.
#[test]
fn accesses_outside_a_buffer_are_refused_before_compiling() {
    // One past the end: `C[i + 1]` for `i` in 0..8 of an 8-element buffer.
    let mut b = Builder::new();
    let a = b.input("A", DType::F32, &[8]);
    let c = b.output("C", DType::F32, &[8]);
    let i = b.var("i");
    let next = add(v(&i), int(1));
    let f = b.finish(
        "past_the_end",
        for_(
            &i,
            8,
            ForKind::Serial,
            st(c, next.clone(), ld(a, DType::F32, v(&i))),
        ),
    );
    let Err(e) = Kernel::compile(&f) else {
        panic!("refused")
    };
    assert!(e.to_string().contains("`C` (of 8 elements)"), "{e}");
    assert!(e.to_string().contains("1..=8"), "{e}");
    assert!(tensortune::codegen::llvm::emit_object(&f, &CodegenOptions::default()).is_err());
    // Guarded, the same store is fine (and so is every hand-built function of this file).
    let mut b = Builder::new();
    let a = b.input("A", DType::F32, &[8]);
    let c = b.output("C", DType::F32, &[8]);
    let i = b.var("i");
    let next = add(v(&i), int(1));
    let guarded = Stmt::If {
        cond: next.clone().lt(int(8)),
        then: Box::new(st(c, next, ld(a, DType::F32, v(&i)))),
        otherwise: Some(Box::new(st(c, int(0), Expr::f32(0.0)))),
    };
    let f = b.finish("guarded", for_(&i, 8, ForKind::Serial, guarded));
    Kernel::compile(&f).expect("in bounds");
    // A lowered function compiles as it is; shrink its output buffer and it is refused.
    let dag = WorkloadSpec::parse("matmul:M=4,N=4,K=4")
        .expect("spec")
        .build()
        .expect("dag");
    let mut f =
        tensortune_schedules::lower::lower(&tensortune_schedules::schedule::State::new(&dag))
            .expect("lowers");
    Kernel::compile(&f).expect("lowered");
    let out = f.params[2].0 as usize;
    f.buffers[out].shape = vec![4, 3];
    let Err(e) = Kernel::compile(&f) else {
        panic!("changed after lowering")
    };
    assert!(e.to_string().contains("of 12 elements"), "{e}");
    // Changed in a way that keeps every access in range (one more, unused, variable id): not
    // the function lowering made, so it is proved, and passes.
    let mut g =
        tensortune_schedules::lower::lower(&tensortune_schedules::schedule::State::new(&dag))
            .expect("lowers");
    g.num_vars += 1;
    assert!(!tensortune_schedules::bounds::is_lowered(&g));
    tensortune_schedules::bounds::check_func(&g).expect("in bounds");
    Kernel::compile(&g).expect("proved");
}

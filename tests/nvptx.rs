//! PTX from the loop IR (`tensortune::codegen::nvptx`), checked without a GPU: the text
//! LLVM's NVPTX back end emits, the launch sizes, the errors, `ptxas` from the CUDA toolkit
//! assembling the PTX where one is found, and the bound schedule's meaning through the loop
//! IR interpreter.

use std::path::PathBuf;
use std::process::Command;
use tensortune::codegen::nvptx::{emit_ptx, launch_dims, LaunchDims, LaunchError};
use tensortune::codegen::CodegenError;
use tensortune::measure::{max_reduction_len, random_inputs, tolerance};
use tensortune_schedules::expr::{self, BinOp, BufId};
use tensortune_schedules::ir::{
    BufKind, BufferDecl, ForKind, LoweredFunc, Scope, Stmt, ThreadAxis,
};
use tensortune_schedules::lower::lower;
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::schedule::State;
use tensortune_schedules::{eval, interp, ComputeDag, DType, Expr, Var};

const ARCH: &str = "sm_90";

fn dag(spec: &str) -> ComputeDag {
    WorkloadSpec::parse(spec)
        .unwrap_or_else(|e| panic!("{spec}: {e}"))
        .build()
        .unwrap_or_else(|e| panic!("{spec}: {e}"))
}

/// matmul 64x64x64 with i and j split by 16, the outer halves bound to blockIdx.x/y and the
/// inner ones to threadIdx.x/y: a 4x4 grid of 16x16 blocks, one output element per thread.
fn bound_matmul() -> (ComputeDag, State) {
    let d = dag("matmul:M=64,N=64,K=64");
    let mut s = State::new(&d);
    let c = s.stages().len() as u32 - 1;
    s.split(c, 0, &[16]).expect("split i"); // io ii j k
    s.split(c, 2, &[16]).expect("split j"); // io ii jo ji k
    s.reorder(c, &[0, 2, 1, 3, 4]).expect("reorder"); // io jo ii ji k
    for (pos, axis) in [
        ThreadAxis::BlockX,
        ThreadAxis::BlockY,
        ThreadAxis::ThreadX,
        ThreadAxis::ThreadY,
    ]
    .into_iter()
    .enumerate()
    {
        s.bind(c, pos as u32, axis).expect("bind");
    }
    (d, s)
}

/// The same statement with the loops named in `kinds` (by loop variable name) rebound.
fn rebind(s: &Stmt, kinds: &[(&str, ForKind)]) -> Stmt {
    let mut out = s.map_children(&mut |c| rebind(c, kinds));
    if let Stmt::For { var, kind, .. } = &mut out {
        if let Some(&(_, k)) = kinds.iter().find(|(n, _)| *n == var.name) {
            *kind = k;
        }
    }
    out
}

/// Names of the loops of `s`, outermost first.
fn loop_names(s: &Stmt) -> Vec<&'static str> {
    let mut names = Vec::new();
    s.visit(&mut |x| {
        if let Stmt::For { var, .. } = x {
            names.push(var.name);
        }
    });
    names
}

#[test]
fn bound_matmul_emits_a_kernel_reading_the_block_and_thread_registers() {
    let (_, s) = bound_matmul();
    let f = lower(&s).expect("lowers");
    let ptx = emit_ptx(&f, ARCH).unwrap_or_else(|e| panic!("{e}\n{f}"));
    for want in [
        ".visible .entry",
        "%tid.x",
        "%tid.y",
        "%ctaid.x",
        "%ctaid.y",
        ".target sm_90",
        ".address_size 64",
        &format!("{}(", f.name),
    ] {
        assert!(ptx.contains(want), "no `{want}` in\n{ptx}\n{f}");
    }
    // Exact launch, so no bounds guard; the k loop stays a loop.
    assert_eq!(
        launch_dims(&f),
        Ok(LaunchDims {
            grid: [4, 4, 1],
            block: [16, 16, 1],
        })
    );
    assert!(ptx.contains("ld.global"), "{ptx}");
    assert!(ptx.contains("st.global"), "{ptx}");
}

#[test]
fn unbound_function_is_a_single_thread_kernel() {
    let d = dag("matmul:M=8,N=6,K=5");
    let f = lower(&State::new(&d)).expect("lowers");
    assert_eq!(
        launch_dims(&f),
        Ok(LaunchDims {
            grid: [1, 1, 1],
            block: [1, 1, 1],
        })
    );
    let ptx = emit_ptx(&f, ARCH).unwrap_or_else(|e| panic!("{e}\n{f}"));
    assert!(ptx.contains(".visible .entry"), "{ptx}");
    assert!(!ptx.contains("%tid") && !ptx.contains("%ctaid"), "{ptx}");
    assemble(&ptx, "unbound");
}

/// A loop bound to `threadIdx.x` inside one bound to it reads the same index (the threads
/// cooperating on an attached stage); a wider inner one would never run its last iterations.
#[test]
fn rebinding_an_axis_inside_itself_is_the_same_thread_and_may_not_widen() {
    let d = dag("matmul:M=8,N=8,K=5");
    let mut f = lower(&State::new(&d)).expect("lowers");
    let names = loop_names(&f.body);
    let (outer, inner) = (names[0], names[1]);
    f.body = rebind(
        &f.body,
        &[
            (outer, ForKind::ThreadBound(ThreadAxis::ThreadX)),
            (inner, ForKind::ThreadBound(ThreadAxis::ThreadX)),
        ],
    );
    assert_eq!(
        launch_dims(&f).map(|l| l.block),
        Ok([8, 1, 1]),
        "one register for both\n{f}"
    );
    assemble(
        &emit_ptx(&f, ARCH).unwrap_or_else(|e| panic!("{e}\n{f}")),
        "rebound",
    );
    let d = dag("matmul:M=4,N=8,K=5");
    let mut g = lower(&State::new(&d)).expect("lowers");
    let names = loop_names(&g.body);
    let (outer, inner) = (names[0], names[1]);
    g.body = rebind(
        &g.body,
        &[
            (outer, ForKind::ThreadBound(ThreadAxis::ThreadX)),
            (inner, ForKind::ThreadBound(ThreadAxis::ThreadX)),
        ],
    );
    match launch_dims(&g) {
        Err(LaunchError::RebindWider {
            axis,
            outer: o,
            outer_extent: 4,
            inner: i,
            inner_extent: 8,
        }) => {
            assert_eq!(axis, "threadIdx.x");
            assert_eq!((o.as_str(), i.as_str()), (outer, inner));
        }
        r => panic!("{r:?}\n{g}"),
    }
    assert!(
        matches!(emit_ptx(&g, ARCH), Err(CodegenError::InvalidIr(_))),
        "{g}"
    );
}

#[test]
fn blocks_over_1024_threads_are_an_error() {
    let (_, s) = bound_matmul();
    let mut f = lower(&s).expect("lowers");
    // Bind the outer loops to threads as well: 64 x 64 threads in a block.
    let names = loop_names(&f.body);
    f.body = rebind(
        &f.body,
        &[
            (names[0], ForKind::ThreadBound(ThreadAxis::ThreadZ)),
            (names[1], ForKind::Serial),
        ],
    );
    // 16 x 16 x 4 = 1024 is still allowed.
    assert_eq!(
        launch_dims(&f).map(|l| l.threads_per_block()),
        Ok(1024),
        "{f}"
    );
    let d = dag("matmul:M=64,N=64,K=64");
    let mut g = lower(&State::new(&d)).expect("lowers");
    let n = loop_names(&g.body);
    g.body = rebind(
        &g.body,
        &[
            (n[0], ForKind::ThreadBound(ThreadAxis::ThreadX)),
            (n[1], ForKind::ThreadBound(ThreadAxis::ThreadY)),
        ],
    );
    assert!(
        matches!(
            launch_dims(&g),
            Err(LaunchError::TooManyThreads { threads: 4096, .. })
        ),
        "{:?}",
        launch_dims(&g)
    );
    assert!(matches!(
        emit_ptx(&g, ARCH),
        Err(CodegenError::Unsupported(_))
    ));
    assert!(matches!(
        emit_ptx(&f, "gfx90a"),
        Err(CodegenError::Target(_))
    ));
}

/// An f32 buffer of `len` elements.
fn f32_buffer(name: &str, len: i64, kind: BufKind, scope: Scope) -> BufferDecl {
    BufferDecl {
        name: name.into(),
        dtype: DType::F32,
        shape: vec![len],
        scope,
        kind,
        row_pad: 0,
    }
}

/// `buf[index]` of an f32 buffer.
fn load(buf: u32, index: Expr) -> Expr {
    Expr::BufLoad {
        buf: BufId(buf),
        dtype: DType::F32,
        index: Box::new(index),
    }
}

/// `threadIdx.x for var in 0..extent: buf[var] = value`.
fn thread_store(var: Var, extent: i64, buf: u32, value: Expr) -> Stmt {
    Stmt::For {
        var,
        extent,
        kind: ForKind::ThreadBound(ThreadAxis::ThreadX),
        body: Box::new(Stmt::Store {
            buf: BufId(buf),
            index: Expr::var(&var),
            value,
        }),
    }
}

/// A kernel of an input `A` and an output `B` of `len` elements, and `temps`.
fn hand_built(name: &str, len: i64, temps: Vec<BufferDecl>, body: Stmt) -> LoweredFunc {
    let mut buffers = vec![
        f32_buffer("A", len, BufKind::Input(0), Scope::Global),
        f32_buffer("B", len, BufKind::Output(0), Scope::Global),
    ];
    buffers.extend(temps);
    LoweredFunc {
        name: name.into(),
        buffers,
        params: vec![BufId(0), BufId(1)],
        body,
        num_vars: 2,
    }
}

/// Two sibling nests bound to threadIdx.x with extents 8 and 4: the launch has 8 threads, and
/// the second nest runs only in the first 4 (a guard).
fn siblings() -> LoweredFunc {
    let (i, j) = (Var::new(0, "i"), Var::new(1, "j"));
    let a = || load(0, Expr::var(&i));
    // exp(a) + tanh(log(a)): the three functions the GPU computes its own way.
    let first = Expr::bin(BinOp::Add, expr::exp(a()), expr::tanh(expr::log(a())));
    let second = Expr::bin(BinOp::Mul, load(1, Expr::var(&j)), Expr::f32(2.0));
    let body = Stmt::Seq(vec![
        thread_store(i, 8, 1, first),
        Stmt::Sync,
        thread_store(j, 4, 1, second),
    ]);
    hand_built("siblings", 8, Vec::new(), body)
}

#[test]
fn sibling_nests_share_the_launch_with_a_guard() {
    let f = siblings();
    assert_eq!(
        launch_dims(&f),
        Ok(LaunchDims {
            grid: [1, 1, 1],
            block: [8, 1, 1],
        })
    );
    let ptx = emit_ptx(&f, ARCH).unwrap_or_else(|e| panic!("{e}\n{f}"));
    assert!(ptx.contains("bar.sync"), "{ptx}");
    assert!(ptx.contains("ex2.approx"), "{ptx}");
    assert!(ptx.contains("lg2.approx"), "{ptx}");
    // The guard of the 4-thread nest compares %tid.x with 4.
    assert!(ptx.contains(", 3;") || ptx.contains(", 4;"), "{ptx}");
    assemble(&ptx, "siblings");
}

#[test]
fn every_op_default_schedule_emits_ptx_that_ptxas_accepts() {
    for spec in [
        "matmul:M=13,N=17,K=19",
        "dense_bias_relu:M=5,N=19,K=11",
        "conv2d:N=1,C=3,H=7,W=7,K=5,R=3,S=3,stride=1,pad=1",
        "conv2d_hwio:N=1,C=3,H=7,W=7,K=5,R=3,S=3,stride=1,pad=1",
        "softmax:M=5,N=23",
        "reduce_sum:M=4,N=13,dtype=i32",
    ] {
        let f = lower(&State::new(&dag(spec))).expect("lowers");
        let ptx = emit_ptx(&f, ARCH).unwrap_or_else(|e| panic!("{spec}: {e}\n{f}"));
        assemble(&ptx, &f.name);
    }
}

#[test]
fn ptxas_accepts_the_bound_matmul() {
    let (_, s) = bound_matmul();
    let f = lower(&s).expect("lowers");
    let ptx = emit_ptx(&f, ARCH).unwrap_or_else(|e| panic!("{e}\n{f}"));
    assemble(&ptx, "bound_matmul");
}

/// The bound schedule computes matmul: the interpreter runs bound loops as serial loops,
/// which is what a launch covering every iteration once amounts to.
#[test]
fn bound_matmul_computes_matmul() {
    let (d, s) = bound_matmul();
    let f = lower(&s).expect("lowers");
    assert!(
        loop_names(&f.body).len() >= 5,
        "the bound loops are still in the IR\n{f}"
    );
    let ins = random_inputs(&d, 7).expect("inputs");
    let want = eval::evaluate(&d, &ins).expect("evaluate");
    let got = interp::run(&f, &ins).expect("interpret");
    let tol = tolerance(want[0].data.dtype(), max_reduction_len(&d));
    for (w, g) in want.iter().zip(&got) {
        let diff = g.max_rel_diff(w).expect("same shape and dtype");
        assert!(diff <= tol, "differs by {diff} > {tol}\n{f}");
    }
}

/// `ptxas`: `$PTXAS`, else on `PATH`, else in the `nvidia-cuda-nvcc-cu12` wheel of `python3`.
fn find_ptxas() -> Option<PathBuf> {
    tensortune::codegen::nvptx::find_ptxas()
}

/// Assembles `ptx` for [`ARCH`] with `ptxas` and asserts it succeeds; skips without one.
fn assemble(ptx: &str, what: &str) {
    let Some(ptxas) = find_ptxas() else {
        eprintln!("skipped: no ptxas (pip install nvidia-cuda-nvcc-cu12)");
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join(format!("{what}.ptx"));
    std::fs::write(&file, ptx).expect("write PTX");
    let out = Command::new(&ptxas)
        .arg(format!("-arch={ARCH}"))
        .arg("-o")
        .arg(dir.path().join(format!("{what}.cubin")))
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", ptxas.display()));
    assert!(
        out.status.success(),
        "ptxas rejected {what}:\n{}\n{ptx}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("ptxas ({}) accepted {what}", ptxas.display());
}

/// `exp`, `log` and `tanh` of f64 are written out in the kernel (no libdevice): PTX with no
/// call to a function defined elsewhere, which `ptxas` assembles.
#[test]
fn f64_exp_log_tanh_need_no_library() {
    let f = lower(&State::new(&dag("softmax:M=3,N=5,dtype=f64"))).expect("lowers");
    let ptx = emit_ptx(&f, ARCH).unwrap_or_else(|e| panic!("{e}\n{f}"));
    assert!(!ptx.contains(".extern") && !ptx.contains("call"), "{ptx}");
    assert!(ptx.contains("fma.rn.f64"), "{ptx}");
    assemble(&ptx, "softmax_f64");
    // exp(a) + tanh(log(a)), all in f64.
    let mut g = siblings();
    for b in &mut g.buffers {
        b.dtype = DType::F64;
    }
    let to_f64 = |e: &Expr| {
        e.rewrite(&mut |x| match x {
            Expr::BufLoad { buf, index, .. } => Some(Expr::BufLoad {
                buf: *buf,
                dtype: DType::F64,
                index: index.clone(),
            }),
            Expr::Const(tensortune_schedules::Const::F32(v)) => Some(Expr::f64(*v as f64)),
            _ => None,
        })
    };
    g.body = g.body.map_exprs(&to_f64, &|b| b);
    let ptx = emit_ptx(&g, ARCH).unwrap_or_else(|e| panic!("{e}\n{g}"));
    assert!(!ptx.contains(".extern") && !ptx.contains("call"), "{ptx}");
    // No f32 approximation in the f64 kernel.
    assert!(!ptx.contains("ex2.approx.f32"), "{ptx}");
    assemble(&ptx, "math_f64");
}

/// A `Shared` temporary is one `.shared` array of the block: threads write it, meet at the
/// barrier, and read each other's elements.
#[test]
fn shared_temporary_is_block_shared_memory() {
    let (i, j) = (Var::new(0, "i"), Var::new(1, "j"));
    let reversed = Expr::bin(BinOp::Sub, Expr::int(31), Expr::var(&j));
    let body = Stmt::Allocate {
        buf: BufId(2),
        body: Box::new(Stmt::Seq(vec![
            thread_store(i, 32, 2, load(0, Expr::var(&i))),
            Stmt::Sync,
            thread_store(j, 32, 1, load(2, reversed)),
        ])),
    };
    let shared = f32_buffer("S", 32, BufKind::Temp, Scope::Shared);
    let f = hand_built("reverse", 32, vec![shared], body);
    let ptx = emit_ptx(&f, ARCH).unwrap_or_else(|e| panic!("{e}\n{f}"));
    for want in [".shared", "st.shared.f32", "ld.shared.f32", "bar.sync"] {
        assert!(ptx.contains(want), "no `{want}` in\n{ptx}");
    }
    assemble(&ptx, "reverse");
    // The same buffer as a per-thread `Local` temporary is local memory or registers, never
    // shared.
    let mut local = f.clone();
    local.buffers[2].scope = Scope::Local;
    let ptx = emit_ptx(&local, ARCH).unwrap_or_else(|e| panic!("{e}\n{local}"));
    assert!(!ptx.contains(".shared"), "{ptx}");
    assemble(&ptx, "reverse_local");
}

/// matmul with a hand GPU schedule (as schedules/tests/gpu_lowering.rs's): C's i and j split
/// in three, the outer parts fused to blockIdx.x and the middle ones to threadIdx.x, a local
/// accumulator computed in each thread with its reduction split by `kt`, and A and B staged
/// through shared memory at the outer reduce loop, fetched by all the block's threads.
fn shared_matmul(spec: &str, ti: i64, tj: i64, ri: i64, rj: i64, kt: i64) -> State {
    let d = dag(spec);
    let mut s = State::new(&d);
    // 0 A, 1 B, 2 C -> 0 A, 1 A.shared, 2 B, 3 B.shared, 4 C.local, 5 C.
    s.cache_write(2, Scope::Local).expect("cache_write");
    s.cache_read(0, Scope::Shared, &[2]).expect("cache_read A");
    s.cache_read(2, Scope::Shared, &[3]).expect("cache_read B");
    let (a_sh, b_sh, local, out) = (1, 3, 4, 5);
    s.split(out, 0, &[ti, ri]).expect("split i");
    s.split(out, 3, &[tj, rj]).expect("split j");
    s.reorder(out, &[0, 3, 1, 4, 2, 5]).expect("reorder");
    s.fuse(out, &[0, 1]).expect("fuse blocks");
    s.fuse(out, &[1, 2]).expect("fuse threads");
    s.bind(out, 0, ThreadAxis::BlockX).expect("bind bx");
    s.bind(out, 1, ThreadAxis::ThreadX).expect("bind tx");
    s.compute_at(local, out, 1).expect("local at tx");
    s.split(local, 2, &[kt]).expect("split k");
    s.reorder(local, &[2, 3, 0, 1]).expect("reorder local");
    for st in [a_sh, b_sh] {
        s.compute_at(st, local, 0).expect("shared at ko");
        s.fuse(st, &[0, 1]).expect("fuse copy");
        s.split(st, 0, &[ti * tj]).expect("split copy");
        s.bind(st, 1, ThreadAxis::ThreadX).expect("bind copy");
    }
    s
}

/// The PTX of a shared-memory matmul kernel for sm_90 against `tests/golden/ptx_matmul_sm90.ptx`
/// (`BLESS=1 cargo test --release --test nvptx golden` rewrites it; review the diff), with its
/// structure checked apart from the text: a kernel entry, shared arrays, barriers, the thread
/// and block registers; and the same PTX on a second emission.
#[test]
fn golden_shared_matmul_ptx() {
    let s = shared_matmul("matmul:M=64,N=64,K=64", 8, 8, 2, 2, 8);
    let f = lower(&s).expect("lowers");
    let ptx = emit_ptx(&f, ARCH).unwrap_or_else(|e| panic!("{e}\n{f}"));
    let again = emit_ptx(&f, ARCH).expect("emits twice");
    assert_eq!(ptx, again, "PTX is not deterministic");
    for want in [
        ".visible .entry",
        ".shared",
        "bar.sync",
        "%tid.x",
        "%ctaid.x",
    ] {
        assert!(ptx.contains(want), "no `{want}` in\n{ptx}");
    }
    assert_eq!(launch_dims(&f).expect("launch").grid, [16, 1, 1]);
    assemble(&ptx, "shared_matmul");
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/ptx_matmul_sm90.ptx");
    if std::env::var_os("BLESS").is_some() {
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("golden dir");
        std::fs::write(&path, &ptx).expect("write golden file");
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("missing {}: run with BLESS=1", path.display()));
    assert_eq!(
        ptx, want,
        "PTX of the shared matmul changed; rerun with BLESS=1 and review the diff"
    );
}

/// A block of 16 threads copies 64 elements of `A` into a shared array, 4 a thread through a
/// vectorized loop, and back into `B`: `S[t * 4 + l] = A[t * 4 + l + offset]`.
fn vector_fetch(offset: i64) -> LoweredFunc {
    let (t, l, u) = (Var::new(0, "t"), Var::new(1, "l"), Var::new(2, "u"));
    let lane = Expr::var(&t) * 4i64 + Expr::var(&l);
    let fetch = Stmt::For {
        var: t,
        extent: 16,
        kind: ForKind::ThreadBound(ThreadAxis::ThreadX),
        body: Box::new(Stmt::For {
            var: l,
            extent: 4,
            kind: ForKind::Vectorized,
            body: Box::new(Stmt::Store {
                buf: BufId(2),
                index: lane.clone(),
                value: load(0, lane + offset),
            }),
        }),
    };
    let body = Stmt::Allocate {
        buf: BufId(2),
        body: Box::new(Stmt::seq(vec![
            fetch,
            Stmt::Sync,
            thread_store(u, 64, 1, load(2, Expr::var(&u))),
        ])),
    };
    let mut f = hand_built(
        "vector_fetch",
        68,
        vec![f32_buffer("S", 64, BufKind::Temp, Scope::Shared)],
        body,
    );
    f.num_vars = 3;
    f
}

#[test]
fn a_contiguous_aligned_vectorized_copy_is_one_wide_load_and_store() {
    let wide = emit_ptx(&vector_fetch(0), ARCH).expect("PTX");
    assert!(wide.contains("ld.global.nc.v4.f32"), "{wide}");
    assert!(wide.contains("st.shared.v4.f32"), "{wide}");
    assemble(&wide, "vector_fetch");
    // One element off a multiple of 4: the loads are contiguous but not 16-byte aligned, so
    // they stay four scalar loads (a misaligned vector load faults on the GPU). (The stores
    // into the aligned shared array LLVM's own load-store vectorizer may still merge.)
    let scalar = emit_ptx(&vector_fetch(1), ARCH).expect("PTX");
    let global_loads: Vec<&str> = scalar.lines().filter(|l| l.contains("ld.global")).collect();
    assert_eq!(global_loads.len(), 4, "{scalar}");
    assert!(global_loads.iter().all(|l| !l.contains(".v")), "{scalar}");
    assemble(&scalar, "scalar_fetch");
}

/// `ptxas -v`'s resource lines, as the dry run and the tests read them.
#[test]
fn ptxas_resource_lines_are_read() {
    use tensortune::codegen::nvptx::PtxasResources;
    let log = "ptxas info    : Compiling entry function 'kernel' for 'sm_90'\n\
               ptxas info    : Function properties for kernel\n\
               \x20   120 bytes stack frame, 172 bytes spill stores, 172 bytes spill loads\n\
               ptxas info    : Used 255 registers, used 1 barriers, 5504 bytes smem\n";
    let r = PtxasResources::parse(log);
    assert_eq!(
        r,
        PtxasResources {
            registers: 255,
            shared_bytes: 5504,
            stack_bytes: 120,
            spill_store_bytes: 172,
        }
    );
    assert!(r.uses_local_memory());
    let clean = PtxasResources::parse(
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
         ptxas info    : Used 40 registers, used 1 barriers, 368 bytes cmem[0]\n",
    );
    assert_eq!((clean.registers, clean.shared_bytes), (40, 0));
    assert!(!clean.uses_local_memory());
}

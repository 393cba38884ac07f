//! The CUDA backend through the same `tune()` as the CPU's, without a GPU: candidates are
//! made by the GPU sketch rules, checked by the GPU verifier, compiled to PTX by LLVM, and
//! run by the lockstep interpreter (`LockstepDevice`), whose outputs are checked against the
//! direct evaluator. Its times mean nothing; what is tested is that every stage of the GPU
//! pipeline runs under the tuner and that wrong programs are caught.

use tensortune::backend::cuda::{
    parse_cuda_key, CudaArtifact, CudaBackend, CudaTargetError, GpuDevice, GpuRun,
    GpuTimingOptions, LockstepDevice,
};
use tensortune::backend::{Backend, Purpose};
use tensortune::records::Database;
use tensortune::schedules::data::NdData;
use tensortune::schedules::ops::WorkloadSpec;
use tensortune::schedules::target::CudaDesc;
use tensortune::tuner::measure::{MeasureError, MeasureErrorKind, Measurer};
use tensortune::TuneOptions;

fn sm90() -> CudaDesc {
    CudaDesc::for_arch("sm_90").expect("sm_90 is in the table")
}

fn lockstep_backend() -> CudaBackend {
    let key = parse_cuda_key("cuda -arch=sm_90").expect("a cuda key");
    CudaBackend::with_device(&key, Box::new(LockstepDevice::new(sm90()))).expect("backend")
}

fn small_opts(trials: usize, db: Option<std::path::PathBuf>) -> TuneOptions {
    TuneOptions {
        trials,
        batch_size: 8,
        population: 32,
        quiet: true,
        db,
        ..TuneOptions::default()
    }
}

#[test]
fn tune_on_the_lockstep_device_checks_every_candidate_and_files_cuda_records() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db_path = dir.path().join("gpu.db");
    let backend = lockstep_backend();
    let spec = WorkloadSpec::parse("matmul:M=24,N=20,K=12").expect("spec");
    let r = tensortune::tune(&spec, &backend, &small_opts(16, Some(db_path.clone())))
        .expect("tuning runs");
    assert_eq!(r.trials, 16);
    assert_eq!(r.target, "cuda -arch=sm_90");
    assert!(
        r.errors < r.trials,
        "every GPU candidate failed: {} of {}",
        r.errors,
        r.trials
    );
    assert!(r.best_latency_s.is_some(), "no valid program");
    // The best trace is a GPU program: it binds threads.
    let best = r.best_trace.expect("a best trace");
    assert!(
        best.contains("threadIdx") || best.contains("ThreadX"),
        "{best}"
    );
    let db = Database::open_read_only(&db_path).expect("db");
    let records = db
        .records(&spec.canonical(), "cuda -arch=sm_90")
        .expect("records");
    assert_eq!(records.len(), 16, "one record per trial under the cuda key");

    // Reuse: the best record, compiled for the GPU, runs and computes what the evaluator does.
    let k = backend
        .kernel_from_records(&db, &spec, tensortune::Missing::Error)
        .expect("a cuda kernel from the records");
    assert!(k.source.starts_with("record #"), "{}", k.source);
    let dag = spec.build().expect("dag");
    let inputs = tensortune::measure::random_inputs(&dag, 9).expect("inputs");
    let got = backend.run_kernel(&k, &inputs).expect("runs");
    let want = tensortune::schedules::eval::evaluate(&dag, &inputs).expect("evaluates");
    assert_eq!(got.len(), want.len());
    let (tensortune::schedules::data::Data::F32(g), tensortune::schedules::data::Data::F32(w)) =
        (&got[0].data, &want[0].data)
    else {
        panic!("f32 outputs");
    };
    for (a, b) in g.iter().zip(w) {
        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
    }

    // The command line finds those records under the short key `cuda` (sm_90 offline) too.
    let cli = |target: &str, cmd: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_tensortune"))
            .args([
                cmd,
                "--target",
                target,
                "--workload",
                &spec.canonical(),
                "--db",
            ])
            .arg(&db_path)
            .args(if cmd == "codegen" {
                &["--emit", "ptx"][..]
            } else {
                &[][..]
            })
            .output()
            .expect("tensortune runs")
    };
    for cmd in ["codegen", "show"] {
        let o = cli("cuda", cmd);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{cmd}: {err}");
        let o = cli("cuda -arch=sm_86", cmd);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            o.status.code(),
            Some(2),
            "{cmd} for sm_86 has no record: {err}"
        );
    }
    let shown = String::from_utf8_lossy(&cli("cuda", "show").stdout).into_owned();
    assert!(shown.contains("threadIdx"), "{shown}");

    // Another workload has no record: an error, or the default GPU schedule on request.
    let other = WorkloadSpec::parse("matmul:M=8,N=8,K=8").expect("spec");
    match backend.kernel_from_records(&db, &other, tensortune::Missing::Error) {
        Err(tensortune::backend::cuda::CudaKernelError::Reuse(e)) => {
            assert!(e.to_string().contains("matmul"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    let k = backend
        .kernel_from_records(&db, &other, tensortune::Missing::Fallback)
        .expect("the default GPU schedule");
    assert_eq!(k.source, "default GPU schedule");
    // The records of a cuda key are not a CPU build's: asking for them ahead of time is a
    // typed error naming the target.
    let e = tensortune::build::check_target("cuda -arch=sm_90").expect_err("cuda is not built");
    assert!(e.to_string().contains("only `llvm` (CPU) targets"), "{e}");
}

/// A device that returns what the kernel computed, with one element changed: every
/// candidate must come back a wrong result, not a timing.
struct Corrupting(LockstepDevice);

impl GpuDevice for Corrupting {
    fn desc(&self) -> CudaDesc {
        self.0.desc()
    }
    fn times_are_real(&self) -> bool {
        false
    }
    fn run(
        &mut self,
        a: &CudaArtifact,
        inputs: &[NdData],
        o: &GpuTimingOptions,
    ) -> Result<GpuRun, MeasureError> {
        let mut r = self.0.run(a, inputs, o)?;
        if let Some(out) = r.outputs.first_mut() {
            if let tensortune::schedules::data::Data::F32(v) = &mut out.data {
                if let Some(x) = v.get_mut(3) {
                    *x += 1.0;
                }
            }
        }
        Ok(r)
    }
}

#[test]
fn a_device_that_returns_wrong_outputs_gets_wrong_result_records() {
    let key = parse_cuda_key("cuda").expect("key");
    let backend = CudaBackend::with_device(&key, Box::new(Corrupting(LockstepDevice::new(sm90()))))
        .expect("backend");
    let spec = WorkloadSpec::parse("matmul:M=16,N=16,K=8").expect("spec");
    let dag = spec.build().expect("dag");
    let (state, _) = tensortune::tuner::sketch::rules::default_schedule(&dag, backend.desc());
    let f = tensortune::schedules::lower::lower(&state).expect("lowers");
    let art = backend.compile(&f).expect("compiles");
    assert!(art.ptx.contains(".entry"), "{}", art.ptx);
    let got = backend.run(&dag, &[art], Purpose::Tuning, 3);
    match &got[..] {
        [Err(e)] => assert_eq!(e.kind, MeasureErrorKind::WrongResult, "{e}"),
        other => panic!("expected one wrong result, got {other:?}"),
    }
}

#[test]
fn candidates_over_the_gpu_limits_are_compile_errors_before_llvm() {
    let backend = lockstep_backend();
    // The unbound schedule of a 64x64 matmul is one thread: valid. Bind 2048 threads to one
    // block instead: over the 1024 limit, refused by the verifier.
    let spec = WorkloadSpec::parse("matmul:M=64,N=32,K=8").expect("spec");
    let dag = spec.build().expect("dag");
    let mut s = tensortune::schedules::schedule::State::new(&dag);
    let c = dag.outputs()[0];
    let stage = s.position_of(c).expect("the output's stage") as u32;
    s.fuse(stage, &[0, 1]).expect("fuse i, j");
    s.bind(stage, 0, tensortune::schedules::ir::ThreadAxis::ThreadX)
        .expect("bind");
    let f = tensortune::schedules::lower::lower(&s).expect("lowers");
    match backend.compile(&f) {
        Err(e) => {
            assert_eq!(e.kind, MeasureErrorKind::Compile);
            assert!(
                e.message.contains("2048") && e.message.contains("1024"),
                "{e}"
            );
        }
        Ok(_) => panic!("2048 threads in a block compiled"),
    }
}

#[test]
fn bad_cuda_keys_and_arch_mismatches_are_typed_errors() {
    let unknown = parse_cuda_key("cuda -arch=sm_75").expect("parses");
    match CudaBackend::offline(&unknown) {
        Err(CudaTargetError::UnknownArch { arch, known }) => {
            assert_eq!(arch, "sm_75");
            assert!(known.iter().any(|k| k == "sm_90"));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        parse_cuda_key("llvm"),
        Err(CudaTargetError::NotCuda(_))
    ));
    let other_arch = parse_cuda_key("cuda -arch=sm_80").expect("parses");
    match CudaBackend::with_device(&other_arch, Box::new(LockstepDevice::new(sm90()))) {
        Err(e @ CudaTargetError::ArchMismatch { .. }) => {
            assert_eq!(e.to_string(), "the key names sm_80, the GPU is sm_90")
        }
        other => panic!("{other:?}"),
    }
    // Offline: compiles, but running is an error record, not a panic.
    let offline = CudaBackend::offline(&parse_cuda_key("cuda").expect("key")).expect("sm_90");
    assert_eq!(offline.arch(), "sm_90");
    let dag = WorkloadSpec::parse("matmul:M=8,N=8,K=8")
        .and_then(|s| s.build())
        .expect("dag");
    let (state, _) = tensortune::tuner::sketch::rules::default_schedule(&dag, offline.desc());
    let art = offline
        .compile(&tensortune::schedules::lower::lower(&state).expect("lowers"))
        .expect("compiles");
    let got = offline.run(&dag, &[art], Purpose::Tuning, 0);
    assert!(matches!(&got[..], [Err(e)] if e.kind == MeasureErrorKind::Internal));
}

/// A batch of GPU candidates of a small matmul: sketch draws, and one the verifier refuses.
fn mixed_batch() -> (
    tensortune::schedules::ComputeDag,
    Vec<tensortune::schedules::schedule::State>,
) {
    use rand::SeedableRng;
    let dag = WorkloadSpec::parse("matmul:M=24,N=20,K=12")
        .and_then(|s| s.build())
        .expect("dag");
    let target = tensortune::schedules::target::TargetDesc::Cuda(sm90());
    let opts = TuneOptions::default();
    let sketches = tensortune::tuner::sketch::rules::generate_for(
        &dag,
        &opts,
        &target,
        &tensortune::tuner::sketch::rules::gpu_rules(),
    );
    let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(3);
    let mut states = Vec::new();
    for _ in 0..10 {
        let dec = tensortune::tuner::sketch::sample::sample(&sketches[0], &mut rng, &opts);
        states.push(sketches[0].instantiate(&dag, &dec).expect("instance"));
    }
    // Ten virtual threads, over the verifier's 8: a compile error record.
    let mut over = tensortune::schedules::schedule::State::new(&dag);
    let stage = over.position_of(dag.outputs()[0]).expect("stage") as u32;
    over.split(stage, 1, &[10]).expect("split j");
    over.bind(stage, 2, tensortune::schedules::ir::ThreadAxis::VThread)
        .expect("bind 10 virtual threads");
    states.insert(4, over);
    (dag, states)
}

#[test]
fn the_overlapped_measurer_gives_what_compile_then_run_gives_in_order() {
    let backend = lockstep_backend();
    let (dag, states) = mixed_batch();
    let overlapped = backend.measurer(Purpose::Tuning, 5).measure(&dag, &states);
    let plain = tensortune::backend::BackendMeasurer::new(&backend, Purpose::Tuning, 5)
        .measure(&dag, &states);
    assert_eq!(overlapped.len(), states.len());
    for (i, (a, b)) in overlapped.iter().zip(&plain).enumerate() {
        match (a, b) {
            (Ok(_), Ok(_)) => {}
            (Err(x), Err(y)) => assert_eq!((x.kind, &x.message), (y.kind, &y.message), "#{i}"),
            _ => panic!("candidate {i}: {a:?} against {b:?}"),
        }
    }
    assert!(overlapped.iter().filter(|r| r.is_ok()).count() >= 5);
    match &overlapped[4] {
        Err(e) => assert!(
            e.kind == MeasureErrorKind::Compile && e.message.contains("10"),
            "{e}"
        ),
        Ok(_) => panic!("10 virtual threads ran"),
    }
    // From inside a rayon pool of one thread (where waiting on compiles queued to the same
    // pool would never end) it compiles first, then runs, with the same results.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a pool");
    let inside = pool.install(|| backend.measurer(Purpose::Tuning, 5).measure(&dag, &states));
    assert_eq!(
        inside.iter().map(|r| r.is_ok()).collect::<Vec<_>>(),
        overlapped.iter().map(|r| r.is_ok()).collect::<Vec<_>>()
    );
}

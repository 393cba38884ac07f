//! Tuned GPU kernels run in this process on device arrays (`tensortune::gpu::device`):
//! uploads, launches and downloads checked against the direct evaluator, and every refusal
//! (wrong shapes and dtypes, arrays of another context) typed. On a machine without a CUDA
//! driver or device the device tests skip themselves, saying so; what needs no device (the
//! error for a missing driver) runs everywhere.

use tensortune::backend::cuda::{parse_cuda_key, CudaBackend, CudaKernel};
use tensortune::gpu::device::{arch_runs_on, ptx_target, DeviceError, GpuContext};
use tensortune::gpu::driver::GpuError;
use tensortune::measure::reference::{random_inputs, CheckOptions, Reference};
use tensortune::records::Database;
use tensortune::schedules::data::NdData;
use tensortune::schedules::ops::WorkloadSpec;
use tensortune::schedules::{ComputeDag, DType};
use tensortune::{Missing, RunError};

/// Odd sizes, so that the default schedule's tails are exercised.
const WORKLOAD: &str = "matmul:M=67,N=45,K=33";

/// Device 0's context, or `None` (with the reason printed) where there is none.
fn context() -> Option<GpuContext> {
    match GpuContext::open(0) {
        Ok(c) => {
            println!("device: {} ({})", c.name(), c.desc().arch);
            Some(c)
        }
        Err(e @ DeviceError::Gpu(GpuError::NoDriver(_) | GpuError::NotBuilt)) => {
            println!("skipped: {e}");
            None
        }
        Err(e @ DeviceError::Gpu(GpuError::NoDevice { .. })) => {
            println!("skipped: {e}");
            None
        }
        Err(e) => panic!("a CUDA driver is here but device 0 did not open: {e}"),
    }
}

fn check_against_evaluator(dag: &ComputeDag, inputs: &[NdData], outputs: &[NdData]) {
    Reference::new(dag, inputs, &CheckOptions::every_element())
        .and_then(|r| r.check_nd(outputs))
        .expect("the GPU's outputs agree with the evaluator");
}

/// The workload's default GPU kernel for the device's own architecture.
fn kernel_for(ctx: &GpuContext, spec: &WorkloadSpec) -> CudaKernel {
    let key = parse_cuda_key(&format!("cuda -arch={}", ctx.desc().arch)).expect("device key");
    let backend = CudaBackend::offline(&key).expect("an offline backend for the device");
    // An empty database: `Missing::Fallback` gives the default GPU schedule, as a program
    // built before any tuning would get.
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Database::open(dir.path().join("empty.db")).expect("database");
    backend
        .kernel_from_records(&db, spec, Missing::Fallback)
        .expect("the default GPU kernel")
}

#[test]
fn no_device_is_a_typed_error() {
    match GpuContext::open(0) {
        Ok(c) => println!("a GPU is here: {}", c.name()),
        Err(e) => {
            assert!(
                matches!(
                    e,
                    DeviceError::Gpu(
                        GpuError::NoDriver(_) | GpuError::NotBuilt | GpuError::NoDevice { .. }
                    )
                ),
                "{e}"
            );
            assert!(!e.to_string().contains('\n'), "{e}");
        }
    }
}

#[test]
fn kernels_name_the_architecture_that_load_checks() {
    // What `GpuContext::load` compares with the device: the `.target` of the PTX the
    // backend made, for every architecture of the table.
    let spec = WorkloadSpec::parse(WORKLOAD).expect("spec");
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Database::open(dir.path().join("empty.db")).expect("database");
    for arch in ["sm_80", "sm_86", "sm_89", "sm_90"] {
        let key = parse_cuda_key(&format!("cuda -arch={arch}")).expect("key");
        let backend = CudaBackend::offline(&key).expect("offline backend");
        let kernel = backend
            .kernel_from_records(&db, &spec, Missing::Fallback)
            .expect("default kernel");
        assert_eq!(ptx_target(&kernel.artifact.ptx), Some(arch));
        assert!(arch_runs_on(arch, "sm_90"));
        assert_eq!(arch_runs_on(arch, "sm_80"), arch == "sm_80");
    }
}

#[test]
fn a_kernel_from_records_runs_on_device_arrays() {
    let Some(ctx) = context() else { return };
    let spec = WorkloadSpec::parse(WORKLOAD).expect("spec");
    let dag = spec.build().expect("dag");
    let kernel = kernel_for(&ctx, &spec);
    let loaded = ctx.load(&kernel).expect("load");
    println!(
        "{}: launch {:?}, params {:?}",
        loaded.name(),
        loaded.launch_dims(),
        loaded.params()
    );

    let inputs = random_inputs(&dag, 5).expect("inputs");
    let on_device = inputs
        .iter()
        .map(|x| ctx.upload(x))
        .collect::<Result<Vec<_>, _>>()
        .expect("upload");
    // The round trip alone is exact.
    for (x, d) in inputs.iter().zip(&on_device) {
        assert_eq!(&d.download().expect("download"), x);
    }
    let out_spec = loaded
        .params()
        .iter()
        .find(|p| p.output)
        .expect("an output");
    let mut out = ctx.zeros(out_spec.dtype, &out_spec.shape).expect("zeros");
    let ins: Vec<_> = on_device.iter().collect();
    loaded.launch(&ins, &mut [&mut out]).expect("launch");
    let first = out.download().expect("download");
    check_against_evaluator(&dag, &inputs, std::slice::from_ref(&first));

    // The arrays stay on the device: a second launch into the same output, and new input
    // values copied into the same arrays.
    loaded.launch(&ins, &mut [&mut out]).expect("second launch");
    assert_eq!(out.download().expect("download"), first);
    let inputs2 = random_inputs(&dag, 6).expect("inputs");
    let mut on_device = on_device;
    for (d, x) in on_device.iter_mut().zip(&inputs2) {
        d.copy_from(x).expect("copy_from");
    }
    let ins: Vec<_> = on_device.iter().collect();
    loaded
        .launch(&ins, &mut [&mut out])
        .expect("launch on new values");
    check_against_evaluator(&dag, &inputs2, &[out.download().expect("download")]);

    // Host arrays in and out give the same.
    let host = loaded.run(&inputs).expect("run on host arrays");
    assert_eq!(host, vec![first]);
}

#[test]
fn bf16_pairs_run_on_the_device() {
    // bf16 operands, f32 accumulation: the pairs packed and unpacked in the kernel's integer
    // registers (the CPU's AVX-512 BF16 instruction has no counterpart here). Odd sizes for
    // the tails; K even, as bf16 pairs need.
    let Some(ctx) = context() else { return };
    for spec in [
        "matmul:M=37,N=29,K=34,dtype=bf16",
        "dense_bias_relu:M=5,N=41,K=26,dtype=bf16",
    ] {
        let spec = WorkloadSpec::parse(spec).expect("spec");
        let dag = spec.build().expect("dag");
        let loaded = ctx.load(&kernel_for(&ctx, &spec)).expect("load");
        let inputs = random_inputs(&dag, 7).expect("inputs");
        let outputs = loaded.run(&inputs).expect("run on host arrays");
        check_against_evaluator(&dag, &inputs, &outputs);
    }
}

#[test]
fn wrong_arrays_are_refused_before_the_device_sees_them() {
    let Some(ctx) = context() else { return };
    let spec = WorkloadSpec::parse(WORKLOAD).expect("spec");
    let dag = spec.build().expect("dag");
    let loaded = ctx.load(&kernel_for(&ctx, &spec)).expect("load");
    let inputs = random_inputs(&dag, 5).expect("inputs");
    let a = ctx.upload(&inputs[0]).expect("upload");
    let b = ctx.upload(&inputs[1]).expect("upload");
    let mut out = ctx.zeros(DType::F32, &[67, 45]).expect("zeros");

    // Too few inputs.
    let e = loaded.launch(&[&a], &mut [&mut out]).unwrap_err();
    assert!(
        matches!(
            e,
            DeviceError::Args(RunError::ArgCount {
                expected: 2,
                got: 1,
                ..
            })
        ),
        "{e}"
    );
    // Inputs swapped: the shapes differ.
    let e = loaded.launch(&[&b, &a], &mut [&mut out]).unwrap_err();
    assert!(
        matches!(e, DeviceError::Args(RunError::Shape { .. })),
        "{e}"
    );
    // An output of the wrong dtype.
    let mut wrong = ctx.zeros(DType::I32, &[67, 45]).expect("zeros");
    let e = loaded.launch(&[&a, &b], &mut [&mut wrong]).unwrap_err();
    assert!(
        matches!(e, DeviceError::Args(RunError::DType { .. })),
        "{e}"
    );
    // An array of another context.
    let other = GpuContext::open(0).expect("a second context");
    let b2 = other.upload(&inputs[1]).expect("upload");
    let e = loaded.launch(&[&a, &b2], &mut [&mut out]).unwrap_err();
    assert!(matches!(e, DeviceError::OtherContext(_)), "{e}");
    // Host data of the wrong shape, and arrays the device cannot hold.
    let e = a.download().map(|_| ()).and_then(|_| {
        let mut a2 = ctx.upload(&inputs[0])?;
        a2.copy_from(&inputs[1])
    });
    assert!(
        matches!(e, Err(DeviceError::Args(RunError::Shape { .. }))),
        "{e:?}"
    );
    assert!(matches!(
        ctx.zeros(DType::Bool, &[4]),
        Err(DeviceError::DType(DType::Bool))
    ));
    assert!(matches!(
        ctx.zeros(DType::F32, &[-1]),
        Err(DeviceError::Shape(_))
    ));
    // After all that, the kernel still runs and is right.
    loaded.launch(&[&a, &b], &mut [&mut out]).expect("launch");
    check_against_evaluator(&dag, &inputs, &[out.download().expect("download")]);
    assert!(!ctx.is_poisoned());
}

//! The GPU worker and its supervisor (`tensortune::gpu`): the protocol and the restarts,
//! shown with the simulated device (`cuda-worker --simulate`, the lockstep interpreter) and
//! the worker's fault-injection hooks, so that they run on machines without a GPU; and one
//! run on the real device, skipped where there is no CUDA driver.

use std::time::{Duration, Instant};
use tensortune::gpu::driver::{device_desc, driver_available};
use tensortune::gpu::worker::{FAULT_ENV, FAULT_ONCE_ENV};
use tensortune::gpu::{
    GpuProgram, GpuRunError, GpuSupervisor, ParamSpec, RunOptions, SimProgram, WorkerCommand,
};
use tensortune::measure::reference::{random_inputs, CheckOptions, Reference};
use tensortune::schedules::data::{Data, NdData};
use tensortune::schedules::gpu::interp::run_lockstep;
use tensortune::schedules::lower::lower;
use tensortune::schedules::ops::WorkloadSpec;
use tensortune::schedules::target::CudaDesc;
use tensortune::schedules::{ComputeDag, DType};
use tensortune::tuner::sketch::rules::default_schedule;

const WORKLOAD: &str = "matmul:M=32,N=32,K=16";

fn worker() -> WorkerCommand {
    WorkerCommand::new(env!("CARGO_BIN_EXE_tensortune"))
}

fn sim_worker() -> WorkerCommand {
    worker().simulate(true)
}

/// The workload's DAG, its default GPU schedule lowered, and that schedule's program for the
/// simulated device (PTX for `device` where given, else the sm_90 row and no PTX).
fn program(
    device: Option<&CudaDesc>,
) -> (
    ComputeDag,
    tensortune::schedules::ir::LoweredFunc,
    GpuProgram,
) {
    let spec = WorkloadSpec::parse(WORKLOAD).unwrap();
    let dag = spec.build().unwrap();
    let desc = device
        .cloned()
        .unwrap_or_else(|| CudaDesc::for_arch("sm_90").unwrap());
    let (state, _) = default_schedule(&dag, &desc);
    let func = lower(&state).unwrap();
    let ptx = match device {
        Some(d) => tensortune::codegen::nvptx::emit_ptx(&func, &d.arch).unwrap(),
        None => String::new(),
    };
    let program = GpuProgram::from_lowered(&func, ptx)
        .unwrap()
        .with_sim(SimProgram::new(spec.canonical(), &state));
    (dag, func, program)
}

fn quick() -> RunOptions {
    RunOptions {
        repeat: 3,
        timeout: Duration::from_secs(30),
        ..RunOptions::default()
    }
}

fn check_against_evaluator(dag: &ComputeDag, inputs: &[NdData], outputs: &[NdData]) {
    Reference::new(dag, inputs, &CheckOptions::every_element())
        .and_then(|r| r.check_nd(outputs))
        .expect("the GPU's outputs agree with the evaluator");
}

#[test]
fn program_from_lowered_has_the_launch_and_params() {
    let (_, func, p) = program(None);
    let dims = tensortune::schedules::gpu::launch_dims(&func).unwrap();
    assert_eq!((p.grid, p.block), (dims.grid, dims.block));
    assert_eq!(p.entry, func.name);
    assert_eq!(p.params.len(), func.params.len());
    assert_eq!(p.inputs().count(), 2);
    assert_eq!(p.outputs().count(), 1);
    assert!(
        p.grid.iter().chain(&p.block).product::<u32>() > 1,
        "a GPU schedule"
    );
}

#[test]
fn simulated_run_equals_lockstep_and_evaluator() {
    let (dag, func, p) = program(None);
    let inputs = random_inputs(&dag, 7).unwrap();
    let mut sup = GpuSupervisor::new(sim_worker());
    let info = sup.device_info().unwrap();
    assert!(info.simulated);
    assert_eq!(info.desc, CudaDesc::for_arch("sm_90").unwrap());
    let r = sup.run(&p, &inputs, &quick()).unwrap();
    let direct = run_lockstep(&func, &inputs).unwrap();
    assert_eq!(r.outputs, direct);
    check_against_evaluator(&dag, &inputs, &r.outputs);
    assert!(r.median_s().is_some());
    assert_eq!(r.registers, None);
    // A second run goes to the same worker.
    sup.run(&p, &inputs, &quick()).unwrap();
    assert_eq!(sup.workers_started(), 1);
}

#[test]
fn bad_inputs_and_foreign_sim_forms_are_invalid() {
    let (dag, _, p) = program(None);
    let inputs = random_inputs(&dag, 7).unwrap();
    let mut sup = GpuSupervisor::new(sim_worker());
    let e = sup.run(&p, &inputs[..1], &quick()).unwrap_err();
    assert!(matches!(e, GpuRunError::Invalid(_)), "{e}");
    // The simulation form of another workload does not pass for this program.
    let other = WorkloadSpec::parse("matmul:M=16,N=32,K=16").unwrap();
    let odag = other.build().unwrap();
    let (ostate, _) = default_schedule(&odag, &CudaDesc::for_arch("sm_90").unwrap());
    let foreign = p
        .clone()
        .with_sim(SimProgram::new(other.canonical(), &ostate));
    let e = sup.run(&foreign, &inputs, &quick()).unwrap_err();
    assert!(matches!(e, GpuRunError::Invalid(_)), "{e}");
    let mut no_sim = p.clone();
    no_sim.sim = None;
    let e = sup.run(&no_sim, &inputs, &quick()).unwrap_err();
    assert!(matches!(e, GpuRunError::Invalid(_)), "{e}");
    // None of that cost the worker.
    sup.run(&p, &inputs, &quick()).unwrap();
    assert_eq!(sup.workers_started(), 1);
}

/// A supervisor whose worker fails as `fault` on its first run, once across restarts.
fn faulty(fault: &str, dir: &tempfile::TempDir) -> GpuSupervisor {
    GpuSupervisor::new(
        sim_worker()
            .env(FAULT_ENV, fault)
            .env(FAULT_ONCE_ENV, dir.path().join("fired")),
    )
}

#[test]
fn aborting_worker_is_a_fault_and_is_restarted() {
    let (dag, _, p) = program(None);
    let inputs = random_inputs(&dag, 3).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut sup = faulty("abort", &dir);
    let e = sup.run(&p, &inputs, &quick()).unwrap_err();
    match &e {
        GpuRunError::Fault(m) => assert!(m.contains("SIGABRT"), "{m}"),
        other => panic!("expected a fault, got {other}"),
    }
    let r = sup.run(&p, &inputs, &quick()).unwrap();
    check_against_evaluator(&dag, &inputs, &r.outputs);
    assert_eq!(sup.workers_started(), 2);
}

#[test]
fn exiting_worker_is_a_fault_with_its_status() {
    let (dag, _, p) = program(None);
    let inputs = random_inputs(&dag, 3).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut sup = faulty("exit", &dir);
    let e = sup.run(&p, &inputs, &quick()).unwrap_err();
    assert!(
        matches!(&e, GpuRunError::Fault(m) if m.contains("status 3")),
        "{e}"
    );
    sup.run(&p, &inputs, &quick()).unwrap();
}

#[test]
fn hanging_worker_is_killed_after_the_timeout_and_restarted() {
    let (dag, _, p) = program(None);
    let inputs = random_inputs(&dag, 3).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut sup = faulty("hang", &dir);
    sup.device_info().unwrap();
    let opts = RunOptions {
        timeout: Duration::from_millis(700),
        ..quick()
    };
    let t = Instant::now();
    let e = sup.run(&p, &inputs, &opts).unwrap_err();
    assert!(matches!(e, GpuRunError::Timeout(_)), "{e}");
    assert!(t.elapsed() < Duration::from_secs(10));
    let r = sup.run(&p, &inputs, &quick()).unwrap();
    check_against_evaluator(&dag, &inputs, &r.outputs);
    assert_eq!(sup.workers_started(), 2);
}

#[test]
fn garbage_reply_is_a_protocol_error_and_the_worker_is_replaced() {
    let (dag, _, p) = program(None);
    let inputs = random_inputs(&dag, 3).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut sup = faulty("garbage", &dir);
    let e = sup.run(&p, &inputs, &quick()).unwrap_err();
    assert!(matches!(e, GpuRunError::Protocol(_)), "{e}");
    sup.run(&p, &inputs, &quick()).unwrap();
    assert_eq!(sup.workers_started(), 2);
}

#[test]
fn fault_on_a_later_run_only() {
    let (dag, _, p) = program(None);
    let inputs = random_inputs(&dag, 3).unwrap();
    let mut sup = GpuSupervisor::new(sim_worker().env(FAULT_ENV, "abort:2"));
    sup.run(&p, &inputs, &quick()).unwrap();
    let e = sup.run(&p, &inputs, &quick()).unwrap_err();
    assert!(matches!(e, GpuRunError::Fault(_)), "{e}");
    // The fresh worker counts from 1 again: its first run is fine.
    sup.run(&p, &inputs, &quick()).unwrap();
}

#[test]
fn malformed_fault_variable_and_missing_binary_are_errors() {
    let mut sup = GpuSupervisor::new(sim_worker().env(FAULT_ENV, "explode"));
    let e = sup.device_info().unwrap_err();
    assert!(
        matches!(&e, GpuRunError::Fault(m) if m.contains("status 2")),
        "{e}"
    );
    let mut sup = GpuSupervisor::new(WorkerCommand::new("/nonexistent/tensortune"));
    let e = sup.device_info().unwrap_err();
    assert!(matches!(e, GpuRunError::Unavailable(_)), "{e}");
}

#[test]
fn no_driver_is_one_line_and_no_panic() {
    match driver_available() {
        Ok(()) => {
            println!("a CUDA driver is present; device 0: {:?}", device_desc(0));
        }
        Err(e) => {
            let text = e.to_string();
            assert!(text.starts_with("no CUDA driver found"), "{text}");
            assert!(!text.contains('\n'), "{text}");
            let d = device_desc(0).unwrap_err();
            assert!(!d.to_string().contains('\n'));
            // A worker for the real device answers that it has none.
            let mut sup = GpuSupervisor::new(worker());
            let e = sup.device_info().unwrap_err();
            assert!(matches!(e, GpuRunError::Unavailable(_)), "{e}");
        }
    }
}

/// `out[i] = in[i] + 1` for the 64 threads of one block.
const ADD_ONE_PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry add_one(.param .u64 src, .param .u64 dst)
{
    .reg .b32 %r<2>;
    .reg .f32 %f<3>;
    .reg .b64 %rd<7>;
    ld.param.u64 %rd1, [src];
    ld.param.u64 %rd2, [dst];
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd5, %r1, 4;
    add.s64 %rd3, %rd3, %rd5;
    add.s64 %rd6, %rd4, %rd5;
    ld.global.f32 %f1, [%rd3];
    add.f32 %f2, %f1, 0f3F800000;
    st.global.f32 [%rd6], %f2;
    ret;
}
"#;

#[test]
fn real_device_runs_ptx() {
    if let Err(e) = driver_available() {
        println!("skipped: no CUDA driver ({e})");
        return;
    }
    let mut sup = GpuSupervisor::new(worker());
    let info = match sup.device_info() {
        Ok(i) => i,
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            return;
        }
    };
    println!("device: {} {:?}", info.name, info.desc);
    assert!(!info.simulated);
    let p = GpuProgram {
        ptx: ADD_ONE_PTX.into(),
        entry: "add_one".into(),
        grid: [1, 1, 1],
        block: [64, 1, 1],
        params: vec![
            ParamSpec {
                name: "src".into(),
                shape: vec![64],
                dtype: DType::F32,
                output: false,
            },
            ParamSpec {
                name: "dst".into(),
                shape: vec![64],
                dtype: DType::F32,
                output: true,
            },
        ],
        sim: None,
    };
    let x = NdData::new(vec![64], Data::F32((0..64).map(|i| i as f32).collect())).unwrap();
    let opts = RunOptions {
        l2_flush_bytes: RunOptions::l2_flush_for(&info.desc),
        min_repeat_ms: 1.0,
        ..quick()
    };
    let r = sup.run(&p, std::slice::from_ref(&x), &opts).unwrap();
    let want: Vec<f32> = (0..64).map(|i| i as f32 + 1.0).collect();
    assert_eq!(r.outputs[0].data, Data::F32(want));
    assert!(r.times_s.len() >= 3);
    assert!(r.registers.is_some());
    println!(
        "add_one: median {:.2} us over {} launches, {:?} registers",
        r.median_s().unwrap_or(0.0) * 1e6,
        r.times_s.len(),
        r.registers
    );
    // PTX the JIT rejects is a load error, and the worker carries on.
    let mut bad = p.clone();
    bad.ptx = ".version 7.0\n.target sm_70\nthis is not ptx".into();
    let e = sup.run(&bad, std::slice::from_ref(&x), &opts).unwrap_err();
    assert!(matches!(e, GpuRunError::Load(_)), "{e}");

    // The default GPU schedule of a matmul, from the PTX generator, checked against the
    // evaluator and against the simulated device.
    let (dag, _, gp) = program(Some(&info.desc));
    let inputs = random_inputs(&dag, 11).unwrap();
    let r = sup.run(&gp, &inputs, &opts).unwrap();
    check_against_evaluator(&dag, &inputs, &r.outputs);
    let s = GpuSupervisor::new(sim_worker())
        .run(&gp, &inputs, &quick())
        .unwrap();
    check_against_evaluator(&dag, &inputs, &s.outputs);
    println!(
        "{WORKLOAD}: median {:.2} us, {:?} registers, {:?} shared bytes",
        r.median_s().unwrap_or(0.0) * 1e6,
        r.registers,
        r.shared_bytes
    );
}

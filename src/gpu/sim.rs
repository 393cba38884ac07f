//! The simulated device of `tensortune cuda-worker --simulate`: programs run in the loop-IR
//! lockstep interpreter ([`run_lockstep`]) instead of on a GPU.
//!
//! PTX cannot be run without a GPU, so the simulated device rebuilds the program from what
//! it was made of: the workload and the schedule's trace ([`SimProgram`]), replayed and
//! lowered exactly as the tuner lowers a candidate
//! ([`tensortune_schedules::lower::lower`]'s options, the kernel named after the program's
//! entry). It checks that what it rebuilt has the program's launch and parameters,
//! so a program whose simulation form belongs to another program is refused rather than
//! simulated.
//!
//! It exists to test the worker protocol, the output checks and the supervisor's restarts on
//! machines without a GPU. Its times are the interpreter's wall time: meaningless for
//! performance. It reports no registers, shared or local memory.

use super::wire::ErrorKind;
use super::worker::WorkerError;
use super::{GpuProgram, GpuRunResult, ParamSpec};
use serde::{Deserialize, Serialize};
use std::time::Instant;
use tensortune_schedules::data::NdData;
use tensortune_schedules::gpu::interp::run_lockstep;
use tensortune_schedules::gpu::launch_dims;
use tensortune_schedules::ir::{BufKind, LoweredFunc};
use tensortune_schedules::lower::{lower_with, LowerOptions};
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::schedule::State;
use tensortune_schedules::target::{CudaDesc, CudaKey};
use tensortune_schedules::trace::Trace;

/// A program as its workload and schedule, for the simulated device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimProgram {
    /// The workload spec (its canonical form, as records store it).
    pub workload: String,
    /// The schedule's trace as JSON, as records store it.
    pub trace: String,
}

impl SimProgram {
    /// The simulation form of `state`, a schedule of the workload `workload_canonical`.
    pub fn new(workload_canonical: impl Into<String>, state: &State) -> SimProgram {
        SimProgram {
            workload: workload_canonical.into(),
            trace: state.trace().to_json(),
        }
    }

    /// The lowered function: the workload built, the trace replayed, lowered with the
    /// tuner's options and named `entry`.
    pub fn lower(&self, entry: &str) -> Result<LoweredFunc, String> {
        let spec = WorkloadSpec::parse(&self.workload).map_err(|e| format!("workload: {e}"))?;
        let dag = spec.build().map_err(|e| format!("workload: {e}"))?;
        let state = Trace::from_json(&self.trace)
            .and_then(|t| t.replay(&dag))
            .map_err(|e| format!("trace: {e}"))?;
        lower_with(
            &state,
            &LowerOptions {
                name: Some(entry.to_string()),
                ..LowerOptions::default()
            },
        )
        .map_err(|e| format!("lowering: {e}"))
    }
}

/// What the simulated device says it is: the table's row of [`CudaKey::DEFAULT_ARCH`].
pub fn sim_desc() -> CudaDesc {
    CudaDesc::for_arch(CudaKey::DEFAULT_ARCH).unwrap_or(CudaDesc {
        // The table has the default architecture; this is only what a table without it
        // would leave, the limits every CUDA GPU shares.
        arch: CudaKey::DEFAULT_ARCH.to_string(),
        warp_size: 32,
        max_threads_per_block: 1024,
        shared_memory_per_block: 48 * 1024,
        registers_per_thread: 255,
        multiprocessors: 1,
        l2_bytes: 0,
    })
}

fn invalid(message: String) -> WorkerError {
    WorkerError {
        kind: ErrorKind::Invalid,
        message,
        sticky: false,
    }
}

/// Runs `program` in the interpreter on `inputs` (already checked against its parameters).
pub(crate) fn run(program: &GpuProgram, inputs: &[NdData]) -> Result<GpuRunResult, WorkerError> {
    let sim = program.sim.as_ref().ok_or_else(|| {
        invalid("the simulated device needs the program's simulation form (GpuProgram::sim)".into())
    })?;
    let func = sim
        .lower(&program.entry)
        .map_err(|e| invalid(format!("simulation form: {e}")))?;
    check_same(program, &func)
        .map_err(|e| invalid(format!("the simulation form is not this program: {e}")))?;
    let t = Instant::now();
    let outputs = run_lockstep(&func, inputs).map_err(|e| WorkerError {
        kind: ErrorKind::Simulation,
        message: e.to_string(),
        sticky: false,
    })?;
    let elapsed = t.elapsed().as_secs_f64();
    Ok(GpuRunResult {
        outputs,
        times_s: vec![elapsed],
        registers: None,
        shared_bytes: None,
        local_bytes: None,
    })
}

/// Whether `func` has `program`'s launch and parameters.
fn check_same(program: &GpuProgram, func: &LoweredFunc) -> Result<(), String> {
    let dims = launch_dims(func).map_err(|e| e.to_string())?;
    if dims.grid != program.grid || dims.block != program.block {
        return Err(format!(
            "launch grid {:?} block {:?}, the program's grid {:?} block {:?}",
            dims.grid, dims.block, program.grid, program.block
        ));
    }
    let params: Vec<ParamSpec> = func
        .params
        .iter()
        .filter_map(|id| func.buffers.get(id.0 as usize))
        .map(|d| ParamSpec {
            name: d.name.clone(),
            shape: d.shape.clone(),
            dtype: d.dtype,
            output: matches!(d.kind, BufKind::Output(_)),
        })
        .collect();
    let same = params.len() == program.params.len()
        && params
            .iter()
            .zip(&program.params)
            .all(|(a, b)| a.shape == b.shape && a.dtype == b.dtype && a.output == b.output);
    if !same {
        return Err("its parameters differ".into());
    }
    Ok(())
}

//! `tensortune codegen`: print what the CPU backend makes of a workload's default schedule.

use super::run::parse_workload;
use super::CliError;
use crate::codegen::llvm::{emit_asm, emit_llvm_ir};
use crate::codegen::CodegenOptions;
use std::io::Write;
use tensortune_schedules::lower::lower;
use tensortune_schedules::schedule::State;

/// What to print.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Emit {
    /// The lowered loop IR.
    Loop,
    /// The optimized LLVM IR.
    Llvm,
    /// The host assembly.
    Asm,
}

/// Arguments of `tensortune codegen`.
#[derive(Debug, clap::Args)]
pub struct CodegenArgs {
    /// The workload, e.g. `matmul:M=64,N=64,K=64`.
    #[arg(long, value_name = "SPEC")]
    pub workload: String,
    /// What to print.
    #[arg(long, value_enum, default_value_t = Emit::Llvm)]
    pub emit: Emit,
}

/// Runs `tensortune codegen`.
pub fn codegen(args: &CodegenArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let (_, dag) = parse_workload(&args.workload)?;
    let func = lower(&State::new(&dag)).map_err(|e| CliError::Internal(e.to_string()))?;
    let opts = CodegenOptions::default();
    let text = match args.emit {
        Emit::Loop => func.to_string(),
        Emit::Llvm => emit_llvm_ir(&func, &opts).map_err(|e| CliError::Internal(e.to_string()))?,
        Emit::Asm => emit_asm(&func, &opts).map_err(|e| CliError::Internal(e.to_string()))?,
    };
    out.write_all(text.as_bytes())
        .map_err(|e| CliError::Internal(e.to_string()))
}

//! `tensortune codegen`: what the CPU backend makes of a workload: its loop IR, LLVM IR or
//! assembly, or an object file and C header for other build systems. With `--db` the program
//! is the best record for the target (see [`crate::build::choose`]), else the default schedule.

use super::run::parse_workload;
use super::CliError;
use crate::build::header::{self, HeaderKernel};
use crate::build::{compile_object, symbol_name, Missing, ReuseError};
use crate::codegen::llvm::{emit_asm, emit_llvm_ir};
use crate::codegen::{CodegenOptions, HostTarget};
use std::io::Write;
use std::path::PathBuf;
use tensortune_records::Database;
use tensortune_schedules::lower::{lower_with, LowerOptions};
use tensortune_schedules::schedule::State;

/// What to print or write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Emit {
    /// The lowered loop IR.
    Loop,
    /// The optimized LLVM IR.
    Llvm,
    /// The host assembly.
    Asm,
    /// An ELF object file (to `--out`) defining `tt_IDENT` and `tt_IDENT_packed`, and its C
    /// header.
    Obj,
}

/// Arguments of `tensortune codegen`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Example: tensortune codegen --db tuning.db \
    --workload matmul:M=512,N=512,K=512 --emit obj --out matmul.o   (writes matmul.o and matmul.h)")]
pub struct CodegenArgs {
    /// The workload, e.g. `matmul:M=64,N=64,K=64`.
    #[arg(long, value_name = "SPEC")]
    pub workload: String,
    /// What to print (or, for `obj`, write to `--out`).
    #[arg(long, value_enum, default_value_t = Emit::Llvm)]
    pub emit: Emit,
    /// Records database: compile the best record of the workload for the target.
    #[arg(long, value_name = "DB")]
    pub db: Option<PathBuf>,
    /// Target key records are looked up under (default: this CPU with `--threads`).
    #[arg(long, value_name = "KEY")]
    pub target: Option<String>,
    /// Threads of the default target key (0: every core).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Use the default schedule (with a warning) where the database has no usable record,
    /// instead of failing.
    #[arg(long)]
    pub fallback: bool,
    /// Output file (required for `--emit obj`; other kinds print to stdout without it).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// The C header for `--emit obj` (default: `--out` with the extension `.h`).
    #[arg(long, value_name = "FILE")]
    pub header: Option<PathBuf>,
}

fn reuse_error(e: ReuseError) -> CliError {
    if e.is_user_error() {
        CliError::Usage(e.to_string())
    } else {
        CliError::Internal(e.to_string())
    }
}

fn write_out(path: &std::path::Path, bytes: &[u8]) -> Result<(), CliError> {
    super::output::write_file(path, bytes)
}

/// Runs `tensortune codegen`.
pub fn codegen(args: &CodegenArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let (spec, dag) = parse_workload(&args.workload)?;
    let header_path = match (&args.out, &args.header) {
        (_, Some(h)) => Some(h.clone()),
        (Some(o), None) if args.emit == Emit::Obj => Some(o.with_extension("h")),
        _ => None,
    };
    let inputs: Vec<(&str, &std::path::Path)> =
        args.db.iter().map(|p| ("--db", p.as_path())).collect();
    let outputs: Vec<(&str, &std::path::Path)> = args
        .out
        .iter()
        .map(|p| ("--out", p.as_path()))
        .chain(header_path.iter().map(|p| ("--header", p.as_path())))
        .collect();
    super::output::refuse_clobbering(&inputs, &outputs)?;
    let key = match &args.target {
        Some(key) => key.clone(),
        None => HostTarget::host().key(super::resolve_threads("--threads", args.threads)?),
    };
    let missing = if args.fallback {
        Missing::Fallback
    } else {
        Missing::Error
    };
    let db = match &args.db {
        Some(p) => {
            crate::build::check_target(&key).map_err(reuse_error)?;
            Some(Database::open_read_only(p)?)
        }
        None => None,
    };
    let opts = CodegenOptions::default();
    if args.emit == Emit::Obj {
        let Some(path) = &args.out else {
            return Err(CliError::Usage("--emit obj needs --out FILE".into()));
        };
        let c = compile_object(db.as_ref(), &spec, &key, missing, &opts).map_err(reuse_error)?;
        for w in &c.warnings {
            log::warn!("{w}");
        }
        let header_path = header_path.unwrap_or_else(|| path.with_extension("h"));
        let guard: String = header_path
            .file_name()
            .map(|n| n.to_string_lossy().to_uppercase())
            .unwrap_or_default()
            .chars()
            .map(|ch| if ch.is_ascii_alphanumeric() { ch } else { '_' })
            .collect();
        let text = header::generate(
            &format!("TT_{guard}"),
            &key,
            &[HeaderKernel {
                symbol: c.symbol.clone(),
                workload: spec.canonical(),
                source: c.source.to_string(),
                params: c.params.clone(),
            }],
        );
        write_out(path, &c.object)?;
        write_out(&header_path, text.as_bytes())?;
        return writeln!(
            out,
            "wrote {} ({} bytes, `{}`) and {}: {} from {}",
            path.display(),
            c.object.len(),
            c.symbol,
            header_path.display(),
            spec.canonical(),
            c.source
        )
        .map_err(|e| CliError::Internal(e.to_string()));
    }
    let func = match &db {
        Some(db) => {
            let symbol = symbol_name(&spec);
            let choice = crate::build::choose_named(db, &spec, &key, missing, Some(&symbol))
                .map_err(reuse_error)?;
            for w in &choice.warnings {
                log::warn!("{w}");
            }
            choice.func
        }
        None => lower_with(
            &State::new(&dag),
            &LowerOptions {
                name: Some(symbol_name(&spec)),
                ..LowerOptions::default()
            },
        )
        .map_err(|e| CliError::Internal(e.to_string()))?,
    };
    let text = match args.emit {
        Emit::Llvm => emit_llvm_ir(&func, &opts).map_err(|e| CliError::Internal(e.to_string()))?,
        Emit::Asm => emit_asm(&func, &opts).map_err(|e| CliError::Internal(e.to_string()))?,
        Emit::Loop | Emit::Obj => func.to_string(),
    };
    match &args.out {
        Some(p) => write_out(p, text.as_bytes()),
        None => out
            .write_all(text.as_bytes())
            .map_err(|e| CliError::Internal(e.to_string())),
    }
}

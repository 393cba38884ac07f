//! `tensortune codegen`: what a backend makes of a workload. For a CPU target: its loop IR,
//! LLVM IR or assembly, or an object file and C header for other build systems. For a CUDA
//! target (`--target cuda`, `--target "cuda -arch=sm_86"`): its loop IR, the NVPTX LLVM IR
//! or the PTX of the kernel, made without a GPU. With `--db` the program is the best record
//! for the target (see [`crate::build::choose`]), else the default schedule (on a GPU the
//! default GPU schedule, [`tensortune_tuner::sketch::rules::default_schedule`]).

use super::run::parse_workload;
use super::CliError;
use crate::build::header::{self, HeaderKernel};
use crate::build::{compile_object, symbol_name, Missing, ReuseError};
use crate::codegen::llvm::{emit_asm, emit_llvm_ir};
use crate::codegen::nvptx::{emit_nvptx_llvm_ir, emit_ptx};
use crate::codegen::{CodegenError, CodegenOptions, HostTarget};
use std::io::Write;
use std::path::PathBuf;
use tensortune_records::Database;
use tensortune_schedules::gpu::verify::verify_gpu;
use tensortune_schedules::lower::{lower_with, LowerOptions};
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::target::{CudaDesc, CudaKey, TargetKey};
use tensortune_schedules::ComputeDag;

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
    /// The PTX assembly of the kernel (CUDA targets only).
    Ptx,
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
    /// Target key records are looked up under and code is made for (default: this CPU with
    /// `--threads`; `cuda` or `"cuda -arch=sm_86"` for an NVIDIA GPU).
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
    // A key that does not parse is refused here, whatever is emitted: without `--db` it
    // would otherwise be ignored, and code made for the wrong kind of machine.
    let parsed = match args.target.as_deref().map(str::parse::<TargetKey>) {
        Some(Err(e)) => return Err(CliError::Usage(e.to_string())),
        Some(Ok(k)) => Some(k),
        None => None,
    };
    if let Some(TargetKey::Cuda(cuda)) = &parsed {
        return codegen_cuda(args, &spec, &dag, cuda, out);
    }
    if args.emit == Emit::Ptx {
        return Err(CliError::Usage(
            "--emit ptx is for CUDA targets (--target cuda)".into(),
        ));
    }
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
        // Both or neither: a header that cannot be written must not leave a new object
        // beside an old header (or replace the user's object and then fail).
        tensortune_records::write_files_atomic(&[
            (path, &c.object),
            (&header_path, text.as_bytes()),
        ])
        .map_err(|e| {
            CliError::Usage(format!(
                "{} and {}: cannot write: {e}",
                path.display(),
                header_path.display()
            ))
        })?;
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
            &crate::build::default_cpu_state(
                &dag,
                key.parse::<TargetKey>().map_or(1, |k| k.threads()),
            ),
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
        Emit::Loop | Emit::Obj | Emit::Ptx => func.to_string(),
    };
    emit_text(args, &text, out)
}

/// Writes `text` to `--out`, else to `out`.
fn emit_text(args: &CodegenArgs, text: &str, out: &mut dyn Write) -> Result<(), CliError> {
    match &args.out {
        Some(p) => write_out(p, text.as_bytes()),
        None => out
            .write_all(text.as_bytes())
            .map_err(|e| CliError::Internal(e.to_string())),
    }
}

/// A code generator's error: unsupported input is the user's to change (another schedule or
/// dtype), anything else is ours.
fn codegen_error(e: CodegenError) -> CliError {
    match e {
        CodegenError::Unsupported(_) => CliError::Usage(e.to_string()),
        e => CliError::Internal(e.to_string()),
    }
}

/// The GPU architecture of `key`, described, or a usage error naming the known ones.
pub(crate) fn cuda_desc(key: &CudaKey) -> Result<CudaDesc, CliError> {
    let arch = key.arch_or_default();
    CudaDesc::for_arch(arch).ok_or_else(|| {
        CliError::Usage(format!(
            "unknown GPU architecture `{arch}` (known: {})",
            CudaDesc::known_archs().join(", ")
        ))
    })
}

/// `tensortune codegen` for a CUDA target: the program (best record or default GPU
/// schedule), checked by the GPU verifier, as loop IR, NVPTX LLVM IR or PTX.
/// The key records of `key` are filed under: its architecture spelled out, as the CUDA
/// backend files them (`cuda` is `cuda -arch=sm_90` offline, the device's own arch on a GPU).
pub(crate) fn cuda_record_key(key: &CudaKey) -> String {
    TargetKey::Cuda(CudaKey {
        arch: Some(key.arch_or_default().to_string()),
    })
    .to_string()
}

fn codegen_cuda(
    args: &CodegenArgs,
    spec: &WorkloadSpec,
    dag: &ComputeDag,
    key: &CudaKey,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    if matches!(args.emit, Emit::Asm | Emit::Obj) {
        return Err(CliError::Usage(
            "--emit asm/obj is for CPU targets; use --emit ptx".into(),
        ));
    }
    let desc = cuda_desc(key)?;
    let arch = key.arch_or_default();
    let target = cuda_record_key(key);
    let symbol = symbol_name(spec);
    let from_db = match &args.db {
        Some(p) => {
            let db = Database::open_read_only(p)?;
            // With `Missing::Error` the choice never falls back to the CPU's default
            // schedule (a one-thread kernel): the GPU's own default is taken below instead.
            match crate::build::choose_named(&db, spec, &target, Missing::Error, Some(&symbol)) {
                Ok(choice) => {
                    for w in &choice.warnings {
                        log::warn!("{w}");
                    }
                    Some((choice.func, choice.source.to_string()))
                }
                Err(e @ ReuseError::NoRecord { .. }) if args.fallback => {
                    log::warn!("{e}; using the default GPU schedule");
                    None
                }
                Err(e) => return Err(reuse_error(e)),
            }
        }
        None => None,
    };
    let recorded = from_db.is_some();
    let (func, source) = match from_db {
        Some(x) => x,
        None => {
            let (state, _) = tensortune_tuner::sketch::rules::default_schedule(dag, &desc);
            let func = lower_with(
                &state,
                &LowerOptions {
                    name: Some(symbol.clone()),
                    ..LowerOptions::default()
                },
            )
            .map_err(|e| CliError::Internal(e.to_string()))?;
            (func, "the default GPU schedule".to_string())
        }
    };
    verify_gpu(&func, &desc).map_err(|e| {
        let message = format!(
            "{} from {source} does not run on {arch}: {e}",
            spec.canonical()
        );
        // A record may come from another GPU (or a bad tuner); the default schedule is
        // checked by the verifier as it is made, so its failing here is a bug of ours.
        if recorded {
            CliError::Usage(message)
        } else {
            CliError::Internal(message)
        }
    })?;
    let text = match args.emit {
        Emit::Ptx => emit_ptx(&func, arch).map_err(codegen_error)?,
        Emit::Llvm => emit_nvptx_llvm_ir(&func, arch).map_err(codegen_error)?,
        Emit::Loop | Emit::Asm | Emit::Obj => func.to_string(),
    };
    emit_text(args, &text, out)
}

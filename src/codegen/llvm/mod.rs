//! Loop IR to LLVM IR, optimized for the host CPU.
//!
//! One [`LoweredFunc`] becomes one LLVM module holding the kernel in the two entry points of
//! [`crate::runtime::abi`] (positional and packed) plus one outlined body per parallel loop.
//! How each IR construct is compiled:
//!
//! - `Serial` loops are counted loops; `Unrolled` loops are real copies of the body with the
//!   loop variable a constant (so indices of register tiles fold and SROA keeps the tiles in
//!   registers); `Parallel` loops are outlined (see `gen.rs`) and run through
//!   `rt->parallel_for`, and run serially when nested in another parallel loop.
//! - `Vectorized` loops are compiled once with explicit `<N x T>` values (see `vector.rs`):
//!   contiguous accesses become vector loads and stores, loop-invariant ones scalar loads that
//!   are broadcast, any other access a gather or scatter; an `If` whose condition varies across
//!   lanes becomes a mask on the loads and stores under it. A body whose lanes could see one
//!   another's stores (a reduction over the vectorized axis) is compiled as a serial loop.
//!   On AVX-512 hosts a contiguous access of a non-power-of-two lane count to main memory is
//!   one masked access of the next power of two lanes ([`CodegenOptions::padded_vectors`]).
//! - LLVM's unroller may unroll the loops left rolled that update a buffer (a reduction's
//!   accumulation), except one around a rolled loop of more than
//!   [`CodegenOptions::llvm_unroll_max_inner`] iterations; the others carry
//!   `llvm.loop.unroll.disable` ([`CodegenOptions::llvm_unroll_updates_only`]).
//! - `local`/`shared` temporaries up to [`CodegenOptions::max_stack_alloc_bytes`] are 64-byte
//!   aligned stack arrays; the others come from `rt->alloc`.
//! - Every function carries the host's `target-cpu`/`target-features` and, on AVX-512 hosts,
//!   `prefer-vector-width` and `min-legal-vector-width` of 512, without which LLVM splits
//!   512-bit vectors into halves on CPUs it tunes for 256-bit. Floating-point adds and
//!   multiplies carry the `contract` flag so FMAs form; nothing else is relaxed.
//! - Buffer parameters are `noalias nocapture align 64 dereferenceable(size)`.

mod expr;
mod gen;
pub(crate) mod jit;
mod vector;

use super::{CodegenError, CodegenOptions, HostTarget};
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine, TargetTriple,
};
use inkwell::OptimizationLevel;
use std::sync::OnceLock;
use tensortune_schedules::ir::LoweredFunc;

/// LLVM options every compilation in this process runs with, set once, before the first.
///
/// - `-unroll-threshold=100` (O3's default is 300): LLVM's own unroller only sees the loops a
///   schedule left rolled, and at 300 it unrolled big loop nests of poor candidates into
///   bodies that took up to a second to compile. Measured on conv2d's 256 tuning candidates:
///   compile time halved, and the search, which controls unrolling itself (`auto_unroll`),
///   then found as fast programs (see `examples/compile_cost.rs`).
/// - `-post-RA-scheduler=false`: the list scheduler after register allocation, which the
///   out-of-order cores we target hardly need; without it conv2d's candidates compiled in
///   0.9x the time, and the best programs of conv2d and matmul ran as fast (geometric mean
///   within 3%, the noise of the machine).
///
/// Tried and left out: `-disable-lsr` (no loop strength reduction) cut the compile work of
/// 48 conv2d candidates by 13% (cachegrind) with conv2d's best programs as fast, but the 8
/// best matmul 1024³ programs of two tuning runs lost about 5% (geometric mean, three
/// interleaved rounds on an AVX2 EPYC).
pub const LLVM_ARGS: &[&str] = &["-unroll-threshold=100", "-post-RA-scheduler=false"];

/// Options that make LLVM's parser print and end the process instead of setting anything:
/// refused in `TENSORTUNE_LLVM_ARGS` rather than let a tuning run exit with status 0.
const PROCESS_ENDING_OPTIONS: &[&str] = &[
    "help",
    "help-hidden",
    "help-list",
    "help-list-hidden",
    "print-all-options",
    "print-options",
    "version",
];

// SAFETY: the function is defined in `src/codegen/llvm/options.cpp` (compiled by build.rs)
// with exactly this C signature.
unsafe extern "C" {
    fn tensortune_parse_llvm_options(
        argc: std::os::raw::c_int,
        argv: *const *const std::os::raw::c_char,
        err: *mut std::os::raw::c_char,
        err_len: usize,
    ) -> std::os::raw::c_int;
}

/// Registers the x86 target and sets the process's LLVM options ([`LLVM_ARGS`], then any in
/// the environment variable `TENSORTUNE_LLVM_ARGS`, split at whitespace), once per process.
/// An option LLVM does not know, or one that would end the process, is an error, returned by
/// this and every later call: code compiled without the options asked for would be measured
/// as if it had them.
pub(crate) fn init_llvm() -> Result<(), CodegenError> {
    static INIT: OnceLock<Result<(), String>> = OnceLock::new();
    INIT.get_or_init(|| {
        Target::initialize_x86(&InitializationConfig::default());
        let extra = match std::env::var("TENSORTUNE_LLVM_ARGS") {
            Ok(text) => text,
            Err(std::env::VarError::NotPresent) => String::new(),
            Err(std::env::VarError::NotUnicode(_)) => return Err("not valid UTF-8".to_string()),
        };
        parse_options(&extra)
    })
    .clone()
    .map_err(CodegenError::LlvmOptions)
}

/// Whether the LLVM options of this process (`TENSORTUNE_LLVM_ARGS`) were accepted; the
/// binary checks this before any command, so that a typo is a usage error up front.
pub fn check_llvm_options() -> Result<(), CodegenError> {
    init_llvm()
}

/// Hands [`LLVM_ARGS`] and `extra` to LLVM's option parser; LLVM's own message on refusal.
fn parse_options(extra: &str) -> Result<(), String> {
    for arg in extra.split_whitespace() {
        let name = arg.trim_start_matches('-');
        let name = name.split('=').next().unwrap_or(name);
        if !arg.starts_with('-') {
            return Err(format!(
                "`{arg}` is not an option (LLVM options start with `-`)"
            ));
        }
        if PROCESS_ENDING_OPTIONS.contains(&name) {
            return Err(format!("`{arg}` would print and exit; it sets nothing"));
        }
    }
    let args: Vec<std::ffi::CString> = std::iter::once("tensortune")
        .chain(LLVM_ARGS.iter().copied())
        .chain(extra.split_whitespace())
        .filter_map(|a| std::ffi::CString::new(a).ok())
        .collect();
    let ptrs: Vec<*const std::os::raw::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    let argc = std::os::raw::c_int::try_from(ptrs.len()).map_err(|_| "too many options")?;
    let mut message = vec![0 as std::os::raw::c_char; 1024];
    // SAFETY: `ptrs` holds `argc` pointers to NUL-terminated strings that outlive the call
    // (LLVM copies what it keeps); `message` is writable for its length, which is passed. It
    // runs once per process (under the OnceLock), before anything is optimized or compiled.
    let (ok, printed) = with_stderr_captured(|| unsafe {
        tensortune_parse_llvm_options(argc, ptrs.as_ptr(), message.as_mut_ptr(), message.len())
    });
    if ok == 1 {
        return Ok(());
    }
    // SAFETY: the C++ side always NUL-terminates within the buffer's length.
    let text = unsafe { std::ffi::CStr::from_ptr(message.as_ptr()) }.to_string_lossy();
    Err(llvm_message(&format!("{printed}\n{text}")))
}

/// Runs `f` with file descriptor 2 sent to a temporary file, and returns what was written
/// there: LLVM reports a bad option value (`-unroll-threshold=abc`) on stderr itself, not on
/// the stream the parser is given, which would make the usage error two lines.
fn with_stderr_captured<T>(f: impl FnOnce() -> T) -> (T, String) {
    #[cfg(unix)]
    {
        use std::io::{Read, Seek};
        let Ok(mut file) = tempfile_in_tmp() else {
            return (f(), String::new());
        };
        // SAFETY: dup/dup2 on descriptors this process owns; stderr is restored before
        // returning, and nothing else is running yet (this is the first LLVM call).
        let saved = unsafe { libc::dup(2) };
        if saved < 0 {
            return (f(), String::new());
        }
        // SAFETY: as above.
        unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&file), 2) };
        let r = f();
        // SAFETY: as above: stderr back to what it was, and our copy closed.
        unsafe {
            libc::dup2(saved, 2);
            libc::close(saved);
        }
        let mut text = String::new();
        if file.rewind().is_ok() {
            let _ = file.read_to_string(&mut text);
        }
        (r, text)
    }
    #[cfg(not(unix))]
    (f(), String::new())
}

/// An anonymous temporary file (removed as soon as it is opened).
#[cfg(unix)]
fn tempfile_in_tmp() -> std::io::Result<std::fs::File> {
    let path = std::env::temp_dir().join(format!(
        "tensortune-llvm-options-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    let _ = std::fs::remove_file(&path);
    Ok(file)
}

/// LLVM's refusal as one line: `tensortune: Unknown command line argument '-x'.  Try:
/// 'tensortune --help'` (and perhaps a "Did you mean" line) without the program name and the
/// hint at a `--help` this binary does not forward to LLVM.
fn llvm_message(text: &str) -> String {
    let parts: Vec<String> = text
        .lines()
        .map(|l| l.trim().trim_start_matches("tensortune:").trim())
        .map(|l| match l.find("Try: ") {
            Some(at) => l[..at].trim_end().to_string(),
            None => l.to_string(),
        })
        .filter(|l| !l.is_empty())
        .collect();
    if parts.is_empty() {
        "LLVM refused the options".to_string()
    } else {
        parts.join(" ")
    }
}

/// A target machine for the host CPU (PIC, so objects link into position-independent
/// executables).
pub fn host_target_machine() -> Result<TargetMachine, CodegenError> {
    host_target_machine_at(OptimizationLevel::Aggressive)
}

/// The LLVM optimization level of machine-code generation for `CodegenOptions::codegen_level`.
pub fn codegen_level(level: u8) -> OptimizationLevel {
    match level {
        0 => OptimizationLevel::None,
        1 => OptimizationLevel::Less,
        2 => OptimizationLevel::Default,
        _ => OptimizationLevel::Aggressive,
    }
}

/// A host target machine generating code at `level`.
pub fn host_target_machine_at(level: OptimizationLevel) -> Result<TargetMachine, CodegenError> {
    init_llvm()?;
    let host = HostTarget::host();
    let triple = TargetTriple::create(&host.triple);
    let target = Target::from_triple(&triple).map_err(|e| CodegenError::Target(e.to_string()))?;
    target
        .create_target_machine(
            &triple,
            &host.cpu,
            &host.features,
            level,
            RelocMode::PIC,
            CodeModel::Default,
        )
        .ok_or_else(|| CodegenError::Target(format!("no target machine for {}", host.triple)))
}

thread_local! {
    /// The host target machine that optimizes modules on this thread. Made once per thread: a
    /// target machine parses the host's feature string into a subtarget for every function it
    /// is asked about, about 0.5 ms for an AVX-512 CPU, and caches it; a fresh one per
    /// compile paid that again each time.
    static PIPELINE_TM: std::cell::OnceCell<Result<TargetMachine, CodegenError>> =
        const { std::cell::OnceCell::new() };
}

/// Runs `f` with this thread's host target machine (see [`PIPELINE_TM`]).
fn with_pipeline_tm<R>(
    f: impl FnOnce(&TargetMachine) -> Result<R, CodegenError>,
) -> Result<R, CodegenError> {
    PIPELINE_TM.with(|cell| match cell.get_or_init(host_target_machine) {
        Ok(tm) => f(tm),
        Err(e) => Err(e.clone()),
    })
}

/// Builds the module for `func` in `cx`, verifies it, and runs the O3 pipeline on it.
pub fn build_module<'ctx>(
    cx: &'ctx Context,
    func: &LoweredFunc,
    opts: &CodegenOptions,
) -> Result<Module<'ctx>, CodegenError> {
    check_name(&func.name)?;
    with_pipeline_tm(|tm| build_module_with(cx, func, opts, tm))
}

fn build_module_with<'ctx>(
    cx: &'ctx Context,
    func: &LoweredFunc,
    opts: &CodegenOptions,
    tm: &TargetMachine,
) -> Result<Module<'ctx>, CodegenError> {
    let module = cx.create_module(&func.name);
    module.set_triple(&tm.get_triple());
    module.set_data_layout(&tm.get_target_data().get_data_layout());
    gen::emit_kernel(cx, &module, func, opts, HostTarget::host())?;
    module
        .verify()
        .map_err(|e| CodegenError::Llvm(format!("module does not verify: {e}")))?;
    if opts.optimize {
        let pb = PassBuilderOptions::create();
        pb.set_loop_vectorization(opts.llvm_vectorize);
        pb.set_loop_slp_vectorization(opts.llvm_vectorize);
        pb.set_loop_interleaving(opts.llvm_vectorize);
        pb.set_loop_unrolling(opts.llvm_unroll);
        pb.set_merge_functions(false);
        module
            .run_passes(&opts.pipeline, tm, pb)
            .map_err(|e| CodegenError::Llvm(format!("pipeline `{}`: {e}", opts.pipeline)))?;
    }
    Ok(module)
}

/// `name` is a C identifier (an error otherwise); also what the GPU kernel's name must be.
pub(crate) fn check_name(name: &str) -> Result<(), CodegenError> {
    let mut chars = name.chars();
    let ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(CodegenError::InvalidIr(format!(
            "function name `{name}` is not a C identifier"
        )))
    }
}

/// Compiles `func` into this process's JIT ([`jit`]): the module [`build_module`] makes,
/// compiled to an object by this thread's host target machine at `opts.codegen_level`, with
/// its external symbols renamed apart from every other kernel's. Returns the loaded code and
/// the address of `NAME_packed`. `symbols` are the C functions generated code may call (the
/// first call in the process fixes them).
pub(crate) fn jit_compile(
    func: &LoweredFunc,
    opts: &CodegenOptions,
    symbols: &[(&str, usize)],
) -> Result<jit::Loaded, CodegenError> {
    use inkwell::module::Linkage;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let jit = jit::jit(symbols)?;
    let cx = Context::create();
    let module = build_module(&cx, func, opts)?;
    // Renamed after optimization, so the code is what `emit_object` writes for a build.
    let tag = NEXT.fetch_add(1, Ordering::Relaxed);
    let local = |l: Linkage| matches!(l, Linkage::Private | Linkage::Internal);
    let mut next = module.get_first_function();
    while let Some(f) = next {
        next = f.get_next_function();
        if f.count_basic_blocks() > 0 && !local(f.get_linkage()) {
            let name = format!("{}.tt{tag}", f.get_name().to_string_lossy());
            f.as_global_value().set_name(&name);
        }
    }
    let mut next = module.get_first_global();
    while let Some(g) = next {
        next = g.get_next_global();
        if !g.is_declaration() && !local(g.get_linkage()) {
            let name = format!("{}.tt{tag}", g.get_name().to_string_lossy());
            g.set_name(&name);
        }
    }
    let write = |tm: &TargetMachine| {
        tm.write_to_memory_buffer(&module, FileType::Object)
            .map_err(|e| CodegenError::Llvm(e.to_string()))
    };
    let object = match codegen_level(opts.codegen_level) {
        OptimizationLevel::Aggressive => with_pipeline_tm(write)?,
        level => write(&host_target_machine_at(level)?)?,
    };
    jit.add(object.as_slice(), &format!("{}_packed.tt{tag}", func.name))
}

/// The optimized LLVM IR of `func`, as text.
pub fn emit_llvm_ir(func: &LoweredFunc, opts: &CodegenOptions) -> Result<String, CodegenError> {
    let cx = Context::create();
    let module = build_module(&cx, func, opts)?;
    Ok(module.print_to_string().to_string())
}

/// The host assembly of `func`.
pub fn emit_asm(func: &LoweredFunc, opts: &CodegenOptions) -> Result<String, CodegenError> {
    let bytes = emit_file(func, opts, FileType::Assembly)?;
    String::from_utf8(bytes).map_err(|e| CodegenError::Llvm(format!("assembly is not UTF-8: {e}")))
}

/// An ELF object file defining `NAME` and `NAME_packed` (see [`crate::runtime::abi`]).
/// Refused, as [`crate::Kernel::compile`] refuses it, unless every access of `func` is
/// shown to stay inside its buffer ([`check_bounds`]): the object runs in the user's program.
pub fn emit_object(func: &LoweredFunc, opts: &CodegenOptions) -> Result<Vec<u8>, CodegenError> {
    check_bounds(func)?;
    emit_file(func, opts, FileType::Object)
}

/// `Ok` where every load and store of `func` stays inside its buffer: it is a function that
/// lowering made in this process, or one that the interval proof of
/// [`tensortune_schedules::bounds::check_func`] accepts. Compiled code does not check its
/// indices, so what runs (a JIT kernel, an object file) passes this first; printing the IR or
/// the assembly does not need it.
pub fn check_bounds(func: &LoweredFunc) -> Result<(), CodegenError> {
    tensortune_schedules::bounds::check_func(func).map_err(CodegenError::InvalidIr)
}

fn emit_file(
    func: &LoweredFunc,
    opts: &CodegenOptions,
    kind: FileType,
) -> Result<Vec<u8>, CodegenError> {
    let cx = Context::create();
    let module = build_module(&cx, func, opts)?;
    let tm = host_target_machine_at(codegen_level(opts.codegen_level))?;
    let buf = tm
        .write_to_memory_buffer(&module, kind)
        .map_err(|e| CodegenError::Llvm(e.to_string()))?;
    Ok(buf.as_slice().to_vec())
}

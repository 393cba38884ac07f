//! Compile-time reuse of tuning records: from a records database to machine code, with no
//! tuning and no JIT when the program runs.
//!
//! Two ways in:
//!
//! - [`crate::Kernel::from_records`] compiles the best record of one workload in process (a
//!   JIT kernel), for programs that link tensortune anyway.
//! - [`Build`], for a user's `build.rs`: for each workload spec it takes the best record for
//!   the stated target, emits it as an object file through LLVM, packs the objects into one
//!   static library, and writes a Rust module of safe wrappers to `OUT_DIR`. The program
//!   includes that module and links the library; it contains no LLVM and no tensortune.
//!   [`Build::model`] adds a whole ONNX network the same way: its tuned layers, its weights
//!   and `tuned::NAME::run(inputs) -> outputs` (see [`model`]).
//!
//! ```text
//! // build.rs
//! fn main() {
//!     let built = tensortune::build::Build::new("records.db")
//!         .workload("matmul:M=1024,N=1024,K=1024")
//!         .threads(4)
//!         .compile();
//!     if let Err(e) = built {
//!         eprintln!("error: {e}");
//!         std::process::exit(1);
//!     }
//! }
//! // main.rs
//! include!(concat!(env!("OUT_DIR"), "/tuned.rs"));
//! // ... tuned::matmul_k1024_m1024_n1024(&a, &b, &mut c)?;
//! ```
//!
//! `examples/build-reuse` is the same as a complete, tested project.
//!
//! **Targets are stated, not guessed.** Records are looked up under one target key: by
//! default the host CPU's with one thread ([`crate::Target::host`]), or the host's with
//! [`Build::threads`], or a key given in full with [`Build::target`]. Code is generated for
//! the CPU the build runs on, so a key naming another CPU is refused; a database without
//! records for the key fails the build with the list of targets it has, unless
//! [`Build::fallback`] asks for default schedules (with a cargo warning). Which program each
//! workload gets is decided by [`choose`]: the fastest record whose trace still replays.
//!
//! Parallel kernels call back into a runtime table (see [`crate::runtime::abi`]); the
//! generated module provides it: the thread pool and aligned allocation of the JIT's
//! [`crate::runtime::Runtime`], carried as source, so a built kernel runs on what tuning
//! measured it on. The pool has the target's thread count (`tuned::set_threads` changes it
//! before the first call).

mod archive;
mod choose;
mod error;
pub mod header;
pub mod model;
pub mod rust_module;

#[cfg(test)]
mod rt_tests;

pub use archive::{write as write_archive, Member};
#[cfg(feature = "tuning")]
pub(crate) use choose::choose_named;
#[cfg(feature = "tuning")]
pub(crate) use choose::gpu_only;
pub use choose::{
    choose, choose_dag, default_choice_dag, default_choice_threads, default_cpu_state, Choice,
    Missing, ReuseOptions, ReuseWarning, Source,
};
pub use error::ReuseError;
pub use model::ModelSource;

use crate::codegen::llvm::emit_object;
use crate::codegen::{CodegenOptions, HostTarget};
use crate::kernel::param_specs;
use rust_module::{KernelDesc, ModuleDesc};
use std::path::{Path, PathBuf};
use tensortune_records::Database;
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::target::{TargetKey, TargetKeyError, TargetKind};

/// The C symbol of a workload's kernel: `tt_` and the workload's identifier.
pub fn symbol_name(spec: &WorkloadSpec) -> String {
    format!("tt_{}", spec.ident())
}

/// The thread count a target key states (`-threads=N`; 1 where it says nothing or does not
/// parse).
pub fn key_threads(key: &str) -> usize {
    key.parse::<TargetKey>().map(|k| k.threads()).unwrap_or(1)
}

/// Checks that code for `key` can be generated here, i.e. that it names this CPU.
pub fn check_target(key: &str) -> Result<(), ReuseError> {
    let parsed: TargetKey = key
        .parse()
        .map_err(|e: TargetKeyError| ReuseError::Target {
            target: key.into(),
            reason: e.to_string(),
        })?;
    if parsed.kind() != TargetKind::Cpu {
        return Err(ReuseError::Target {
            target: key.into(),
            reason: "only `llvm` (CPU) targets can be built ahead of time".into(),
        });
    }
    let host = HostTarget::host().target_key(1).machine();
    if parsed.machine() != host {
        return Err(ReuseError::Target {
            target: key.into(),
            reason: format!(
                "code is generated for the CPU the build runs on, `{host}`; building for \
                 another CPU is not supported"
            ),
        });
    }
    Ok(())
}

/// The records of `db` for `key` must exist unless `missing` allows fallback; with fallback,
/// their absence is a warning.
fn check_db_has_target(
    db: &Database,
    key: &str,
    missing: Missing,
) -> Result<Option<ReuseWarning>, ReuseError> {
    let targets = db.targets()?;
    if targets.iter().any(|t| t == key) {
        return Ok(None);
    }
    match missing {
        Missing::Error => Err(ReuseError::NoTarget {
            db: db.path().to_path_buf(),
            target: key.into(),
            available: targets,
        }),
        Missing::Fallback => Ok(Some(ReuseWarning::NoTarget {
            target: key.into(),
            available: targets,
        })),
    }
}

/// One compiled kernel, ready for an archive and a wrapper.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The workload spec.
    pub spec: WorkloadSpec,
    /// The C symbol of its positional entry point (`NAME_packed` is the other).
    pub symbol: String,
    /// The ELF object.
    pub object: Vec<u8>,
    /// Its parameters, inputs first.
    pub params: Vec<crate::ParamSpec>,
    /// Where its program came from.
    pub source: Source,
    /// What was skipped or fallen back on.
    pub warnings: Vec<ReuseWarning>,
}

/// Chooses the program of `spec` for `target_key` in `db` (or its default schedule where
/// `db` is `None`) and emits it as an object file defining [`symbol_name`]`(spec)`.
pub fn compile_object(
    db: Option<&Database>,
    spec: &WorkloadSpec,
    target_key: &str,
    missing: Missing,
    codegen: &CodegenOptions,
) -> Result<Compiled, ReuseError> {
    let symbol = symbol_name(spec);
    let choice = match db {
        Some(db) => choose::choose_named(db, spec, target_key, missing, Some(&symbol))?,
        None => choose::default_choice(spec, Some(&symbol))?,
    };
    let params = param_specs(&choice.func)?;
    let object = emit_object(&choice.func, codegen)?;
    Ok(Compiled {
        spec: spec.clone(),
        symbol,
        object,
        params,
        source: choice.source,
        warnings: choice.warnings,
    })
}

/// What a build wrote.
#[derive(Clone, Debug)]
pub struct Built {
    /// The static library.
    pub lib: PathBuf,
    /// The link name of the library (`-l static=NAME`).
    pub lib_name: String,
    /// The generated Rust module.
    pub module: PathBuf,
    /// The target key the records were looked up under.
    pub target: String,
    /// Per kernel: Rust function name, workload key, and where its program came from.
    pub kernels: Vec<(String, String, Source)>,
    /// Per model: its submodule's name, and per task its key and where its program came
    /// from.
    pub models: Vec<(String, Vec<(String, Source)>)>,
    /// Everything skipped or fallen back on.
    pub warnings: Vec<ReuseWarning>,
}

/// A build of tuned kernels for a `build.rs` (see the module doc).
#[derive(Clone, Debug)]
pub struct Build {
    db: PathBuf,
    workloads: Vec<String>,
    models: Vec<ModelSource>,
    target: Option<String>,
    threads: usize,
    missing: Missing,
    out_dir: Option<PathBuf>,
    module: String,
    ndarray: bool,
    codegen: CodegenOptions,
}

impl Build {
    /// A build from the records database at `db` (relative paths are taken from the current
    /// directory, which for a build script is the package's root).
    pub fn new(db: impl Into<PathBuf>) -> Build {
        Build {
            db: db.into(),
            workloads: Vec::new(),
            models: Vec::new(),
            target: None,
            threads: 1,
            missing: Missing::Error,
            out_dir: None,
            module: "tuned".into(),
            ndarray: false,
            codegen: CodegenOptions::default(),
        }
    }

    /// Adds a workload spec, e.g. `matmul:M=1024,N=1024,K=1024`.
    pub fn workload(mut self, spec: impl Into<String>) -> Build {
        self.workloads.push(spec.into());
        self
    }

    /// Adds workload specs.
    pub fn workloads<S: Into<String>>(mut self, specs: impl IntoIterator<Item = S>) -> Build {
        self.workloads.extend(specs.into_iter().map(Into::into));
        self
    }

    /// Adds a whole ONNX model (its file, relative to the current directory), as the
    /// submodule named after the file: `cls.onnx` gives `tuned::cls::run(&[&x])`. Each of its
    /// layers runs its best record (see [`model`]); its weights go into the binary.
    pub fn model(mut self, path: impl Into<PathBuf>) -> Build {
        self.models.push(ModelSource::new(path));
        self
    }

    /// Adds a whole ONNX model with a name or input shapes of its own (see [`ModelSource`]).
    pub fn model_source(mut self, source: ModelSource) -> Build {
        self.models.push(source);
        self
    }

    /// The target key records are looked up under, in full (it must name the build's CPU).
    pub fn target(mut self, key: impl Into<String>) -> Build {
        self.target = Some(key.into());
        self
    }

    /// Looks up records of the host CPU with `threads` threads (default 1), unless
    /// [`Build::target`] names a key.
    pub fn threads(mut self, threads: usize) -> Build {
        self.threads = threads.max(1);
        self
    }

    /// True: a workload without a usable record gets its default schedule, with a warning
    /// (also where the database has no record for the target at all). False (the default):
    /// the build fails.
    pub fn fallback(mut self, yes: bool) -> Build {
        self.missing = if yes {
            Missing::Fallback
        } else {
            Missing::Error
        };
        self
    }

    /// Where to write the library and module (default: `$OUT_DIR`).
    pub fn out_dir(mut self, dir: impl Into<PathBuf>) -> Build {
        self.out_dir = Some(dir.into());
        self
    }

    /// The generated module's name (default `tuned`; the file is `NAME.rs`).
    pub fn module(mut self, name: impl Into<String>) -> Build {
        self.module = name.into();
        self
    }

    /// Also generate `NAME_nd` wrappers over ndarray views (the program must depend on
    /// `ndarray` 0.15 or 0.16).
    pub fn ndarray(mut self, yes: bool) -> Build {
        self.ndarray = yes;
        self
    }

    /// Codegen options (default: what tuning measured with).
    pub fn codegen(mut self, opts: CodegenOptions) -> Build {
        self.codegen = opts;
        self
    }

    /// The target key this build looks records up under.
    pub fn target_key(&self) -> String {
        self.target
            .clone()
            .unwrap_or_else(|| HostTarget::host().key(self.threads))
    }

    /// Writes the library and module, then prints what cargo needs: `rerun-if-changed` for
    /// the database, the link directives, and a `cargo:warning` per warning.
    pub fn compile(&self) -> Result<Built, ReuseError> {
        // Cargo sets TARGET and HOST for build scripts; the code is for the host CPU.
        if let (Ok(t), Ok(h)) = (std::env::var("TARGET"), std::env::var("HOST")) {
            if t != h {
                return Err(ReuseError::Target {
                    target: t,
                    reason: format!("cross-compiling from `{h}` is not supported"),
                });
            }
        }
        println!("cargo:rerun-if-changed={}", self.db.display());
        for m in &self.models {
            println!("cargo:rerun-if-changed={}", m.path.display());
        }
        let wal = PathBuf::from(format!("{}-wal", self.db.display()));
        if wal.exists() {
            // Writes of a tuning run sit in the WAL until a checkpoint moves them in.
            println!("cargo:rerun-if-changed={}", wal.display());
        }
        let built = self.write()?;
        for w in &built.warnings {
            println!("cargo:warning={w}");
        }
        if let Some(dir) = built.lib.parent() {
            println!("cargo:rustc-link-search=native={}", dir.display());
        }
        println!("cargo:rustc-link-lib=static={}", built.lib_name);
        if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
            // Generated code may call expf/logf/tanhf... from the C math library.
            println!("cargo:rustc-link-lib=m");
        }
        Ok(built)
    }

    /// Writes the library and module without printing anything.
    pub fn write(&self) -> Result<Built, ReuseError> {
        let mut out_dir = match &self.out_dir {
            Some(d) => d.clone(),
            None => std::env::var_os("OUT_DIR")
                .map(PathBuf::from)
                .ok_or_else(|| ReuseError::Io {
                    path: PathBuf::from("$OUT_DIR"),
                    message: "not set: call from a build script or set Build::out_dir".into(),
                })?,
        };
        if !is_identifier(&self.module) {
            return Err(ReuseError::Target {
                target: self.module.clone(),
                reason: "the module name must be a Rust identifier".into(),
            });
        }
        let key = self.target_key();
        check_target(&key)?;
        let db = Database::open_read_only(&self.db)?;
        let mut warnings: Vec<ReuseWarning> = check_db_has_target(&db, &key, self.missing)?
            .into_iter()
            .collect();
        let mut specs: Vec<WorkloadSpec> = Vec::new();
        for w in &self.workloads {
            let spec = WorkloadSpec::parse(w).map_err(|source| ReuseError::Spec {
                spec: w.clone(),
                source,
            })?;
            if let Some(prev) = specs.iter().find(|s| s.ident() == spec.ident()) {
                if prev.canonical() == spec.canonical() {
                    continue;
                }
                return Err(ReuseError::DuplicateName {
                    name: spec.ident(),
                    first: prev.canonical(),
                    second: spec.canonical(),
                });
            }
            specs.push(spec);
        }
        let mut members = Vec::new();
        let mut descs = Vec::new();
        let mut kernels = Vec::new();
        for (i, spec) in specs.iter().enumerate() {
            let c = compile_object(Some(&db), spec, &key, self.missing, &self.codegen)?;
            members.push(Member {
                name: format!("k{i}.o"),
                data: c.object,
                symbols: vec![c.symbol.clone(), format!("{}_packed", c.symbol)],
            });
            descs.push(KernelDesc {
                name: spec.ident(),
                symbol: c.symbol,
                workload: spec.canonical(),
                source: c.source.to_string(),
                params: c.params,
            });
            kernels.push((spec.ident(), spec.canonical(), c.source));
            warnings.extend(c.warnings);
        }
        let mut models = Vec::new();
        let mut model_texts = Vec::new();
        if !self.models.is_empty() {
            // The module includes each model's weights by absolute path: `include_bytes!`
            // in a file pulled in by `include!` would otherwise resolve against the includer.
            std::fs::create_dir_all(&out_dir)
                .and_then(|()| out_dir.canonicalize())
                .map(|d| out_dir = d)
                .map_err(|e| ReuseError::Io {
                    path: out_dir.clone(),
                    message: e.to_string(),
                })?;
        }
        for m in &self.models {
            let taken = specs.iter().any(|s| s.ident() == m.name)
                || models.iter().any(|(n, _)| n == &m.name)
                || RESERVED_NAMES.contains(&m.name.as_str());
            if !is_identifier(&m.name) || taken {
                return Err(ReuseError::Model {
                    path: m.path.clone(),
                    reason: format!(
                        "`{}` cannot name its submodule (not an identifier, or taken); name it \
                         with ModelSource::name",
                        m.name
                    ),
                    user: true,
                });
            }
            let c = model::compile_model(
                m,
                &model::ModelBuildCtx {
                    db: &db,
                    module: &self.module,
                    target_key: &key,
                    missing: self.missing,
                    codegen: &self.codegen,
                    out_dir: &out_dir,
                    ndarray: self.ndarray,
                    index: models.len(),
                },
            )?;
            members.extend(c.members);
            warnings.extend(c.warnings);
            models.push((m.name.clone(), c.tasks));
            model_texts.push((c.ffi, c.module));
        }
        let lib_name = format!("tensortune_{}", self.module);
        let lib = out_dir.join(format!("lib{lib_name}.a"));
        let bytes = write_archive(&members).map_err(|message| ReuseError::Io {
            path: lib.clone(),
            message,
        })?;
        write_file(&lib, &bytes)?;
        let text = rust_module::generate(
            &ModuleDesc {
                module: self.module.clone(),
                target: key.clone(),
                threads: key_threads(&key),
                db: self.db.display().to_string(),
                ndarray: self.ndarray,
            },
            &descs,
            &model_texts,
        );
        let module = out_dir.join(format!("{}.rs", self.module));
        write_file(&module, text.as_bytes())?;
        Ok(Built {
            lib,
            lib_name,
            module,
            target: key,
            kernels,
            models,
            warnings,
        })
    }
}

/// Names of the generated module's own items, which a model's submodule may not take.
const RESERVED_NAMES: [&str; 8] = [
    "ffi",
    "model",
    "runtime",
    "pool",
    "threads",
    "set_threads",
    "gather",
    "status",
];

fn is_identifier(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

/// Writes `bytes` to `path`, creating its directory.
pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> Result<(), ReuseError> {
    let io = |e: std::io::Error| ReuseError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
    }
    // Atomic: a build interrupted mid-write never leaves a truncated object for the next
    // build (or the linker) to pick up.
    tensortune_records::write_bytes_atomic(path, bytes).map_err(io)
}

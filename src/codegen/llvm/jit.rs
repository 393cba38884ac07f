//! The in-process JIT: object files linked into this process by ORC's LLJIT.
//!
//! One LLJIT serves the whole process. A kernel's module is compiled to an ELF object by this
//! thread's cached host target machine (the same code [`super::emit_object`] writes for
//! builds: position-independent, small code model), its external symbols renamed apart, and
//! the object added to the JIT under a resource tracker of its own; dropping the returned
//! [`Loaded`] frees its code. Generated code may call a fixed set of C library functions
//! ([`Jit::create`] defines them as absolute symbols), nothing else of the host process.
//!
//! MCJIT, used before, made a target machine for every engine (0.6-1.1 ms per kernel on an
//! AVX-512 EPYC, measured as object emission with a fresh against a cached one) and compiled
//! with the large code model of JITs. LLJIT linking our objects does neither: compiling 48
//! conv2d candidates took 1.3% fewer instructions (cachegrind), the best programs of a conv2d
//! and a matmul run were as fast, and the code measured is the code a build links.

use super::CodegenError;
use inkwell::llvm_sys::error::{
    LLVMConsumeError, LLVMDisposeErrorMessage, LLVMErrorRef, LLVMGetErrorMessage,
};
use inkwell::llvm_sys::orc2::lljit::{
    LLVMOrcCreateLLJIT, LLVMOrcLLJITAddObjectFileWithRT, LLVMOrcLLJITGetExecutionSession,
    LLVMOrcLLJITGetMainJITDylib, LLVMOrcLLJITLookup, LLVMOrcLLJITMangleAndIntern, LLVMOrcLLJITRef,
};
use inkwell::llvm_sys::orc2::{
    LLVMJITEvaluatedSymbol, LLVMJITSymbolFlags, LLVMJITSymbolGenericFlags, LLVMOrcAbsoluteSymbols,
    LLVMOrcCSymbolMapPair, LLVMOrcDisposeMaterializationUnit,
    LLVMOrcExecutionSessionSetErrorReporter, LLVMOrcJITDylibCreateResourceTracker,
    LLVMOrcJITDylibDefine, LLVMOrcReleaseResourceTracker, LLVMOrcResourceTrackerRef,
    LLVMOrcResourceTrackerRemove,
};
use std::ffi::{c_void, CStr, CString};
use std::sync::OnceLock;

/// The process's LLJIT.
pub(crate) struct Jit {
    jit: LLVMOrcLLJITRef,
}

// SAFETY: ORC's LLJIT is thread-safe: adding objects, looking symbols up and removing resource
// trackers take the execution session's lock. The instance lives as long as the process.
unsafe impl Send for Jit {}
// SAFETY: as above.
unsafe impl Sync for Jit {}

/// Machine code of one object in the JIT, and the address of the symbol asked for. Dropping
/// it removes the object's code and data.
pub(crate) struct Loaded {
    tracker: LLVMOrcResourceTrackerRef,
    /// Address of the symbol looked up when the object was added.
    pub(crate) address: u64,
}

// SAFETY: a resource tracker may be removed from any thread (see `Jit`).
unsafe impl Send for Loaded {}
// SAFETY: `&Loaded` only exposes the address.
unsafe impl Sync for Loaded {}

impl Drop for Loaded {
    fn drop(&mut self) {
        // SAFETY: the tracker was created by `Jit::add` and is removed and released once.
        unsafe {
            let e = LLVMOrcResourceTrackerRemove(self.tracker);
            if !e.is_null() {
                LLVMConsumeError(e);
            }
            LLVMOrcReleaseResourceTracker(self.tracker);
        }
    }
}

/// An LLVM error's message (consuming the error), or `Ok` for no error.
fn check(e: LLVMErrorRef) -> Result<(), String> {
    if e.is_null() {
        return Ok(());
    }
    // SAFETY: `e` is a live error; getting its message consumes it, and the message is
    // disposed of after copying.
    unsafe {
        let m = LLVMGetErrorMessage(e);
        let s = CStr::from_ptr(m).to_string_lossy().into_owned();
        LLVMDisposeErrorMessage(m);
        Err(s)
    }
}

/// Errors the session cannot hand back to a caller (those of a lookup come back from the
/// lookup): dropped rather than printed, since a failed kernel is reported by its caller.
extern "C" fn ignore_session_error(_ctx: *mut c_void, e: LLVMErrorRef) {
    // SAFETY: the session passes ownership of the error.
    unsafe { LLVMConsumeError(e) }
}

static JIT: OnceLock<Result<Jit, String>> = OnceLock::new();

/// The process's JIT, made on first use with `symbols` (name, address) defined for generated
/// code to call.
pub(crate) fn jit(symbols: &[(&str, usize)]) -> Result<&'static Jit, CodegenError> {
    JIT.get_or_init(|| Jit::create(symbols))
        .as_ref()
        .map_err(|e| CodegenError::Llvm(format!("JIT: {e}")))
}

impl Jit {
    fn create(symbols: &[(&str, usize)]) -> Result<Jit, String> {
        super::init_llvm().map_err(|e| e.to_string())?;
        let mut jit: LLVMOrcLLJITRef = std::ptr::null_mut();
        // SAFETY: a null builder asks for the default one (host target, in-process); on
        // success `jit` is ours and lives as long as the process.
        check(unsafe { LLVMOrcCreateLLJIT(&mut jit, std::ptr::null_mut()) })?;
        let names: Vec<CString> = symbols
            .iter()
            .map(|(n, _)| CString::new(*n).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        // SAFETY: `jit` is live; the interned names are handed to `LLVMOrcAbsoluteSymbols`,
        // which takes them over, and the unit to the dylib (disposed here if it refuses).
        unsafe {
            LLVMOrcExecutionSessionSetErrorReporter(
                LLVMOrcLLJITGetExecutionSession(jit),
                ignore_session_error,
                std::ptr::null_mut(),
            );
            let generic = LLVMJITSymbolGenericFlags::LLVMJITSymbolGenericFlagsExported as u8
                | LLVMJITSymbolGenericFlags::LLVMJITSymbolGenericFlagsCallable as u8;
            let mut pairs: Vec<LLVMOrcCSymbolMapPair> = names
                .iter()
                .zip(symbols)
                .map(|(n, &(_, address))| LLVMOrcCSymbolMapPair {
                    Name: LLVMOrcLLJITMangleAndIntern(jit, n.as_ptr()),
                    Sym: LLVMJITEvaluatedSymbol {
                        Address: address as u64,
                        Flags: LLVMJITSymbolFlags {
                            GenericFlags: generic,
                            TargetFlags: 0,
                        },
                    },
                })
                .collect();
            let unit = LLVMOrcAbsoluteSymbols(pairs.as_mut_ptr(), pairs.len());
            let e = LLVMOrcJITDylibDefine(LLVMOrcLLJITGetMainJITDylib(jit), unit);
            if !e.is_null() {
                LLVMOrcDisposeMaterializationUnit(unit);
            }
            check(e)?;
        }
        Ok(Jit { jit })
    }

    /// Links the ELF `object` into the process and returns the address of `symbol` in it.
    /// The object's external symbols must not clash with any other object's in the JIT.
    pub(crate) fn add(&self, object: &[u8], symbol: &str) -> Result<Loaded, CodegenError> {
        let err = |what: &str, e: String| CodegenError::Llvm(format!("JIT {what}: {e}"));
        let name = CString::new(symbol).map_err(|e| err("symbol", e.to_string()))?;
        // SAFETY: `self.jit` is live. The buffer copies `object` and is owned by the JIT from
        // the add call on; the tracker is owned by the returned `Loaded`, or removed and
        // released here when linking fails.
        unsafe {
            let tracker =
                LLVMOrcJITDylibCreateResourceTracker(LLVMOrcLLJITGetMainJITDylib(self.jit));
            let mut loaded = Loaded {
                tracker,
                address: 0,
            };
            let buffer = inkwell::llvm_sys::core::LLVMCreateMemoryBufferWithMemoryRangeCopy(
                object.as_ptr().cast(),
                object.len(),
                c"kernel object".as_ptr(),
            );
            check(LLVMOrcLLJITAddObjectFileWithRT(self.jit, tracker, buffer))
                .map_err(|e| err("add", e))?;
            let mut address = 0;
            check(LLVMOrcLLJITLookup(self.jit, &mut address, name.as_ptr()))
                .map_err(|e| err("lookup", e))?;
            if address == 0 {
                return Err(err("lookup", format!("`{symbol}` has a null address")));
            }
            loaded.address = address;
            Ok(loaded)
        }
    }
}

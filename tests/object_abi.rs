//! The object file and its C ABI: a kernel with a parallel loop and a heap temporary is
//! emitted as an ELF object, linked into a C program that supplies its own small runtime
//! table, and run. Skipped with a message where no C compiler is installed.

use std::process::Command;
use tensortune::codegen::llvm::emit_object;
use tensortune_schedules::expr::BinOp;
use tensortune_schedules::ir::{BufKind, BufferDecl, ForKind, LoweredFunc, Scope, Stmt};
use tensortune_schedules::{BufId, DType, Expr, Var};

/// `T = A * 2` (a global temporary), then `C = T + B`, over 4 parallel blocks of 16 lanes.
fn kernel() -> LoweredFunc {
    let decl = |name: &str, kind, scope| BufferDecl {
        name: name.into(),
        dtype: DType::F32,
        shape: vec![64],
        scope,
        kind,
        row_pad: 0,
    };
    let (a, b, c, t) = (BufId(0), BufId(1), BufId(2), BufId(3));
    let (vo, vi, vi2) = (Var::new(0, "vo"), Var::new(1, "vi"), Var::new(2, "vi2"));
    let ld = |buf, i: Expr| Expr::BufLoad {
        buf,
        dtype: DType::F32,
        index: Box::new(i),
    };
    let idx = |v: &Var| {
        Expr::bin(
            BinOp::Add,
            Expr::bin(BinOp::Mul, Expr::var(&vo), Expr::int(16)),
            Expr::var(v),
        )
    };
    let vec = |v: &Var, body: Stmt| Stmt::For {
        var: *v,
        extent: 16,
        kind: ForKind::Vectorized,
        body: Box::new(body),
    };
    let body = Stmt::seq(vec![
        vec(
            &vi,
            Stmt::Store {
                buf: t,
                index: idx(&vi),
                value: Expr::bin(BinOp::Mul, ld(a, idx(&vi)), Expr::f32(2.0)),
            },
        ),
        vec(
            &vi2,
            Stmt::Store {
                buf: c,
                index: idx(&vi2),
                value: Expr::bin(BinOp::Add, ld(t, idx(&vi2)), ld(b, idx(&vi2))),
            },
        ),
    ]);
    let par = Stmt::For {
        var: vo,
        extent: 4,
        kind: ForKind::Parallel,
        body: Box::new(body),
    };
    LoweredFunc {
        name: "tt_axpy".into(),
        buffers: vec![
            decl("A", BufKind::Input(0), Scope::Global),
            decl("B", BufKind::Input(1), Scope::Global),
            decl("C", BufKind::Output(0), Scope::Global),
            decl("T", BufKind::Temp, Scope::Global),
        ],
        params: vec![a, b, c],
        body: Stmt::Allocate {
            buf: t,
            body: Box::new(par),
        },
        num_vars: 3,
    }
}

const HARNESS: &str = r#"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
typedef struct tt_runtime tt_runtime;
typedef int32_t (*tt_body)(void *closure, int64_t begin, int64_t end);
struct tt_runtime {
  int32_t (*parallel_for)(const tt_runtime *, int64_t, tt_body, void *);
  void *(*alloc)(const tt_runtime *, int64_t);
  void (*free)(const tt_runtime *, void *);
  void *ctx;
};
static int calls;
/* Serial, but in two ranges, as a pool of two would split it. */
static int32_t pfor(const tt_runtime *rt, int64_t n, tt_body body, void *closure) {
  int64_t mid = n / 2;
  calls++;
  int32_t r = body(closure, 0, mid);
  return r ? r : body(closure, mid, n);
}
static void *al(const tt_runtime *rt, int64_t bytes) { return aligned_alloc(64, (bytes + 63) / 64 * 64); }
static void fr(const tt_runtime *rt, void *p) { free(p); }
int32_t tt_axpy(float *, float *, float *, const tt_runtime *);
int32_t tt_axpy_packed(void *const *, const tt_runtime *);
int main(void) {
  tt_runtime rt = {pfor, al, fr, 0};
  float *a = aligned_alloc(64, 256), *b = aligned_alloc(64, 256), *c = aligned_alloc(64, 256);
  for (int i = 0; i < 64; i++) { a[i] = i; b[i] = 1; c[i] = -1; }
  if (tt_axpy(a, b, c, &rt) != 0) return 2;
  for (int i = 0; i < 64; i++) if (c[i] != 2.0f * i + 1) { printf("bad %d %f\n", i, c[i]); return 3; }
  void *args[3] = {a, b, c};
  for (int i = 0; i < 64; i++) c[i] = -1;
  if (tt_axpy_packed(args, &rt) != 0) return 4;
  for (int i = 0; i < 64; i++) if (c[i] != 2.0f * i + 1) return 5;
  printf("ok %d\n", calls);
  return 0;
}
"#;

#[test]
fn object_links_into_a_c_program() {
    let Some(cc) = ["cc", "clang", "gcc"]
        .into_iter()
        .find(|c| Command::new(c).arg("--version").output().is_ok())
    else {
        eprintln!("skipped: no C compiler");
        return;
    };
    let dir = std::env::temp_dir().join(format!("tt-object-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let obj = emit_object(&kernel(), &Default::default()).expect("object");
    assert_eq!(&obj[..4], b"\x7fELF");
    std::fs::write(dir.join("k.o"), &obj).expect("write object");
    std::fs::write(dir.join("main.c"), HARNESS).expect("write harness");
    let exe = dir.join("prog");
    let out = Command::new(cc)
        .arg(dir.join("main.c"))
        .arg(dir.join("k.o"))
        .arg("-lm")
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("cc runs");
    assert!(
        out.status.success(),
        "link failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().expect("program runs");
    assert!(
        run.status.success(),
        "status {:?}: {}",
        run.status,
        String::from_utf8_lossy(&run.stdout)
    );
    // One parallel-for per call of the kernel, through the C program's own runtime.
    assert_eq!(String::from_utf8_lossy(&run.stdout).trim(), "ok 2");
    let _ = std::fs::remove_dir_all(&dir);
}

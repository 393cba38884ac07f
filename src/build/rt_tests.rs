//! Tests of the runtime that generated modules carry ([`super::rust_module::RUNTIME_SOURCE`]),
//! compiled here as an ordinary module with a pool of three threads.
#![allow(dead_code)]

const DEFAULT_THREADS: usize = 3;
include!("../runtime/shared_pool.rs");
include!("rt.rs");
include!("model_rt.rs");

use std::sync::atomic::AtomicI64;

unsafe extern "C" fn sum_range(closure: *mut c_void, begin: i64, end: i64) -> i32 {
    // SAFETY: the tests pass an AtomicI64 as the closure.
    let sum = unsafe { &*(closure as *const AtomicI64) };
    for i in begin..end {
        sum.fetch_add(i + 1, Ordering::SeqCst);
    }
    0
}

unsafe extern "C" fn fail_after_zero(_closure: *mut c_void, begin: i64, _end: i64) -> i32 {
    if begin > 0 {
        5
    } else {
        0
    }
}

fn parallel_for(n: i64, body: ParallelBody, closure: *mut c_void) -> i32 {
    let t = runtime();
    // SAFETY: the table is static; the bodies above only read their closure.
    unsafe { ((*t).parallel_for)(t, n, body, closure) }
}

#[test]
fn parallel_for_covers_each_index_once() {
    assert_eq!(threads(), 3);
    for n in [0i64, 1, 2, 3, 7, 1000] {
        let sum = AtomicI64::new(0);
        let code = parallel_for(n, sum_range, &sum as *const AtomicI64 as *mut c_void);
        assert_eq!(code, 0);
        assert_eq!(sum.load(Ordering::SeqCst), n * (n + 1) / 2, "n = {n}");
    }
}

#[test]
fn parallel_for_reports_a_failing_chunk() {
    assert_eq!(parallel_for(9, fail_after_zero, std::ptr::null_mut()), 5);
}

#[test]
fn concurrent_callers_share_the_pool() {
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..50 {
                    let sum = AtomicI64::new(0);
                    let code = parallel_for(64, sum_range, &sum as *const AtomicI64 as *mut c_void);
                    assert_eq!((code, sum.load(Ordering::SeqCst)), (0, 64 * 65 / 2));
                }
            });
        }
    });
}

#[test]
fn alloc_is_aligned() {
    let t = runtime();
    // SAFETY: the table's own functions, used as the ABI says.
    unsafe {
        let p = ((*t).alloc)(t, 1000);
        assert!(!p.is_null());
        assert_eq!(p as usize % 64, 0);
        ((*t).free)(t, p);
        ((*t).free)(t, std::ptr::null_mut());
        assert!(((*t).alloc)(t, -1).is_null());
    }
}

#[test]
fn a_small_freed_block_is_reused_by_the_same_thread() {
    let t = runtime();
    // SAFETY: the table's own functions, used as the ABI says; blocks are written within
    // their sizes only.
    unsafe {
        let a = ((*t).alloc)(t, 512);
        (a as *mut u8).write_bytes(7, 512);
        ((*t).free)(t, a);
        let b = ((*t).alloc)(t, 512);
        assert_eq!(a, b, "the same block again");
        assert_eq!(b as usize % 64, 0);
        // Another size is another block; a large block is not kept.
        let c = ((*t).alloc)(t, 4096);
        assert_ne!(b, c);
        let big = ((*t).alloc)(t, 4 << 20);
        assert!(!big.is_null());
        ((*t).free)(t, big);
        // More frees than the thread keeps: the rest go back to the allocator.
        let many: Vec<_> = (0..40).map(|_| ((*t).alloc)(t, 256)).collect();
        for p in many {
            assert!(!p.is_null());
            ((*t).free)(t, p);
        }
        ((*t).free)(t, b);
        ((*t).free)(t, c);
    }
    // Blocks freed on a thread that ends are given back with it.
    std::thread::spawn(|| {
        let t = runtime();
        // SAFETY: as above.
        unsafe {
            let p = ((*t).alloc)(t, 1024);
            ((*t).free)(t, p);
        }
    })
    .join()
    .expect("the thread ends");
}

#[test]
fn staging_copies_only_unaligned_slices() {
    let v = AlignedVec::<f32>::from_slice(&[1.0, 2.0, 3.0, 4.0, 5.0]);
    assert!(is_aligned(v.as_ptr()));
    assert!(matches!(Staged::new(&v[..]), Staged::Direct(_)));
    let s = Staged::new(&v[1..]);
    assert!(matches!(s, Staged::Copied(_)));
    assert!(is_aligned(s.ptr()));
    // SAFETY: four elements were copied.
    assert_eq!(unsafe { *s.ptr().add(3) }, 5.0);

    let mut out = AlignedVec::<f32>::zeros(5);
    let mut staged = StagedOut::new(&mut out[1..]);
    let p = staged.ptr();
    assert!(is_aligned(p));
    // SAFETY: the scratch buffer has four elements.
    unsafe { p.add(2).write(7.0) };
    staged.finish();
    assert_eq!(&out[..], &[0.0, 0.0, 0.0, 7.0, 0.0]);
}

#[test]
fn errors_read_well() {
    assert_eq!(
        check_len("k", "A", 3, 4).map_err(|e| e.to_string()),
        Err("k: `A` must have 4 elements, got 3".into())
    );
    assert_eq!(
        status("k", 1).map_err(|e| e.to_string()),
        Err("k: out of memory for a temporary".into())
    );
}

/// `out = a + b` over 4 elements, through the packed ABI.
unsafe extern "C" fn add4(args: *const *mut c_void, _rt: *const TtRuntime) -> i32 {
    // SAFETY: the tables below bind three buffers of at least 4 f32 each.
    unsafe {
        let (a, b, out) = (
            *args as *const f32,
            *args.add(1) as *const f32,
            *args.add(2) as *mut f32,
        );
        for i in 0..4 {
            *out.add(i) = *a.add(i) + *b.add(i);
        }
    }
    0
}

unsafe extern "C" fn fails(_args: *const *mut c_void, _rt: *const TtRuntime) -> i32 {
    1
}

static WEIGHTS_T: AlignedBytes<80> = {
    let mut b = [0u8; 80];
    // Weight 0 at offset 0: [10, 20, 30, 40]; weight 1 at offset 64: [-1].
    let w: [f32; 4] = [10.0, 20.0, 30.0, 40.0];
    let mut i = 0;
    while i < 4 {
        let x = w[i].to_le_bytes();
        let mut k = 0;
        while k < 4 {
            b[i * 4 + k] = x[k];
            k += 1;
        }
        i += 1;
    }
    let m = (-1.0f32).to_le_bytes();
    b[64] = m[0];
    b[65] = m[1];
    b[66] = m[2];
    b[67] = m[3];
    AlignedBytes(b)
};

const TASKS_T: &[Task] = &[
    Task {
        key: "add",
        ops: "Add",
        source: "test",
        func: add4,
        lens: &[4, 4, 4],
    },
    Task {
        key: "fails",
        ops: "Add",
        source: "test",
        func: fails,
        lens: &[4, 4, 4],
    },
];

/// x [2, 2] + w, transposed, padded to [2, 3] with -1 on the right, joined with x on axis 1.
static NET_T: NetDesc = NetDesc {
    name: "net",
    inputs: &[Io {
        name: "x",
        shape: &[2, 2],
        slot: Slot::Input(0),
    }],
    outputs: &[
        Io {
            name: "y",
            shape: &[2, 5],
            slot: Slot::Arena(0),
        },
        Io {
            name: "t",
            shape: &[2, 2],
            slot: Slot::Arena(2),
        },
    ],
    consts: &[(0, 4), (64, 1)],
    weights: &WEIGHTS_T.0,
    arena: &[10, 6, 4],
    tasks: TASKS_T,
    steps: &[
        Step::Kernel {
            name: "add",
            task: 0,
            args: &[Slot::Input(0), Slot::Const(0)],
            out: Slot::Arena(1),
        },
        Step::Gather {
            name: "transpose",
            from: Slot::Arena(1),
            out: Slot::Arena(2),
            axes: &[&[0, 1], &[0, 2]],
            fill: 0.0,
        },
        Step::Gather {
            name: "pad",
            from: Slot::Arena(2),
            out: Slot::Arena(1),
            axes: &[&[0, 2], &[0, 1, -1]],
            fill: -1.0,
        },
        Step::Concat {
            name: "concat",
            from: &[Slot::Arena(1), Slot::Input(0)],
            out: Slot::Arena(0),
            outer: 2,
            inners: &[3, 2],
        },
    ],
};

#[test]
fn a_network_of_tables_runs_its_steps_in_place() {
    let mut m = Model::new(&NET_T).expect("valid tables");
    let x = [1.0f32, 2.0, 3.0, 4.0];
    for _ in 0..2 {
        // Twice: the second run reuses the buffers of the first.
        let (outs, times) = m.run_timed(&[&x]).expect("runs");
        // x + w = [[11, 22], [33, 44]]; transposed [[11, 33], [22, 44]]; padded, joined.
        assert_eq!(
            outs[0],
            [11.0, 33.0, -1.0, 1.0, 2.0, 22.0, 44.0, -1.0, 3.0, 4.0]
        );
        assert_eq!(outs[1], [11.0, 33.0, 22.0, 44.0]);
        let names: Vec<&str> = times.iter().map(|t| t.0).collect();
        assert_eq!(names, ["add", "transpose", "pad", "concat"]);
    }
    assert_eq!(
        m.run(&[&x[..3]]).map_err(|e| e.to_string()),
        Err("net: `x` must have 4 elements, got 3".into())
    );
    assert_eq!(
        m.run(&[]).map_err(|e| e.to_string()),
        Err("net: takes 1 inputs, got 0".into())
    );
}

#[test]
fn a_failing_kernel_is_an_error_naming_its_step() {
    static FAILS: NetDesc = NetDesc {
        name: "f",
        steps: &[Step::Kernel {
            name: "bad",
            task: 1,
            args: &[Slot::Input(0), Slot::Const(0)],
            out: Slot::Arena(0),
        }],
        ..TABLES_OK
    };
    let mut m = Model::new(&FAILS).expect("valid tables");
    assert_eq!(
        m.run(&[&[0.0; 4]]).map_err(|e| e.to_string()),
        Err("bad: out of memory for a temporary".into())
    );
}

/// A one-kernel network whose variations below are each wrong in one way.
const TABLES_OK: NetDesc = NetDesc {
    name: "t",
    inputs: &[Io {
        name: "x",
        shape: &[4],
        slot: Slot::Input(0),
    }],
    outputs: &[Io {
        name: "y",
        shape: &[4],
        slot: Slot::Arena(0),
    }],
    consts: &[(0, 4)],
    weights: &WEIGHTS_T.0,
    arena: &[4, 4],
    tasks: TASKS_T,
    steps: &[Step::Kernel {
        name: "k",
        task: 0,
        args: &[Slot::Input(0), Slot::Const(0)],
        out: Slot::Arena(0),
    }],
};

#[test]
fn tables_that_reach_outside_their_buffers_are_refused() {
    static OK: NetDesc = TABLES_OK;
    assert!(Model::new(&OK).is_ok());
    static SMALL_OUT: NetDesc = NetDesc {
        arena: &[3, 4],
        ..TABLES_OK
    };
    static WRITES_INPUT: NetDesc = NetDesc {
        steps: &[Step::Kernel {
            name: "k",
            task: 0,
            args: &[Slot::Input(0), Slot::Const(0)],
            out: Slot::Input(0),
        }],
        ..TABLES_OK
    };
    static WRITES_WHAT_IT_READS: NetDesc = NetDesc {
        steps: &[Step::Kernel {
            name: "k",
            task: 0,
            args: &[Slot::Arena(0), Slot::Const(0)],
            out: Slot::Arena(0),
        }],
        ..TABLES_OK
    };
    static WEIGHT_OUTSIDE: NetDesc = NetDesc {
        consts: &[(64, 5)],
        ..TABLES_OK
    };
    static WEIGHT_UNALIGNED: NetDesc = NetDesc {
        consts: &[(4, 3)],
        ..TABLES_OK
    };
    static NO_TASK: NetDesc = NetDesc {
        steps: &[Step::Kernel {
            name: "k",
            task: 7,
            args: &[Slot::Input(0), Slot::Const(0)],
            out: Slot::Arena(0),
        }],
        ..TABLES_OK
    };
    static GATHER_OUTSIDE: NetDesc = NetDesc {
        steps: &[Step::Gather {
            name: "g",
            from: Slot::Input(0),
            out: Slot::Arena(0),
            axes: &[&[0, 4]],
            fill: 0.0,
        }],
        ..TABLES_OK
    };
    static CONCAT_OUTSIDE: NetDesc = NetDesc {
        steps: &[Step::Concat {
            name: "c",
            from: &[Slot::Input(0), Slot::Arena(1)],
            out: Slot::Arena(0),
            outer: 1,
            inners: &[4, 4],
        }],
        ..TABLES_OK
    };
    static BIG_OUTPUT: NetDesc = NetDesc {
        outputs: &[Io {
            name: "y",
            shape: &[5],
            slot: Slot::Arena(0),
        }],
        ..TABLES_OK
    };
    for bad in [
        &SMALL_OUT,
        &WRITES_INPUT,
        &WRITES_WHAT_IT_READS,
        &WEIGHT_OUTSIDE,
        &WEIGHT_UNALIGNED,
        &NO_TASK,
        &GATHER_OUTSIDE,
        &CONCAT_OUTSIDE,
        &BIG_OUTPUT,
    ] {
        match Model::new(bad) {
            Err(Error::Model { model: "t", .. }) => {}
            other => panic!("{:?} accepted: {other:?}", bad.steps),
        }
    }
}

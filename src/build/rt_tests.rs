//! Tests of the runtime that generated modules carry ([`super::rust_module::RUNTIME_SOURCE`]),
//! compiled here as an ordinary module with a pool of three threads.
#![allow(dead_code)]

const DEFAULT_THREADS: usize = 3;
include!("../runtime/shared_pool.rs");
include!("rt.rs");

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

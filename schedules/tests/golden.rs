//! Golden printer tests: the lowered text of fixed schedules, compared with files under
//! `tests/golden/`. `BLESS=1 cargo test -p tensortune-schedules --test golden` rewrites them;
//! review the diff.

mod common;
use tensortune_schedules::ir::Scope;
use tensortune_schedules::lower::lower;
use tensortune_schedules::schedule::State;

fn golden(name: &str, state: &State) {
    let text = format!("{}\n{}", state.trace(), lower(state).expect("lowers"));
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.txt"));
    if std::env::var_os("BLESS").is_some() {
        std::fs::write(&path, &text).expect("write golden file");
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("missing {}: run with BLESS=1", path.display()));
    assert_eq!(
        text, want,
        "lowered text of {name} changed; rerun with BLESS=1 and review the diff"
    );
}

#[test]
fn tiled_matmul() {
    let dag = common::dag("matmul:M=64,N=64,K=32");
    let mut s = State::new(&dag);
    let l = s.cache_write(2, Scope::Local).unwrap();
    s.tile(3, 0, 1, 8, 16).unwrap(); // C: i.0 j.0 i.1 j.1
    s.compute_at(l, 3, 1).unwrap();
    s.split(l, 2, &[4]).unwrap(); // C.local: i j k.0 k.1
    s.reorder(l, &[2, 3, 0, 1]).unwrap(); // k.0 k.1 i j
    s.unroll(l, 2).unwrap();
    s.vectorize(l, 3).unwrap();
    s.vectorize(3, 3).unwrap();
    s.parallel(3, 0).unwrap();
    golden("tiled_matmul", &s);
    common::check_state(&dag, &s, 7);
}

#[test]
fn conv2d_padding_inlined() {
    let dag = common::dag("conv2d:N=1,C=4,H=8,W=8,K=8,R=3,S=3,stride=1,pad=1");
    let mut s = State::new(&dag);
    s.compute_inline(2).unwrap();
    s.split(3, 3, &[4]).unwrap(); // n k y x.0 x.1 rc ry rx
    s.reorder(3, &[0, 1, 2, 3, 5, 6, 7, 4]).unwrap();
    s.vectorize(3, 7).unwrap();
    golden("conv2d_padding_inlined", &s);
    common::check_state(&dag, &s, 8);
}

#[test]
fn conv2d_padding_attached() {
    let dag = common::dag("conv2d:N=1,C=2,H=8,W=8,K=4,R=3,S=3,stride=1,pad=1");
    let mut s = State::new(&dag);
    let l = s.cache_write(3, Scope::Local).unwrap();
    s.split(4, 2, &[4]).unwrap(); // n k y.0 y.1 x
    s.reorder(4, &[0, 2, 1, 3, 4]).unwrap(); // n y.0 k y.1 x
    s.compute_at(l, 4, 2).unwrap();
    s.compute_at(2, l, 4).unwrap(); // pad inside out.local's rc loop
    golden("conv2d_padding_attached", &s);
    common::check_state(&dag, &s, 9);
}

#[test]
fn conv2d_padding_vectorized_by_region() {
    // The padding is 34 columns wide; attached inside a tile of 8 output columns it covers
    // 10 of them, which is what `vectorize_up_to` is checked against.
    let dag = common::dag("conv2d:N=1,C=2,H=6,W=32,K=4,R=3,S=3,stride=1,pad=1");
    let schedule = |limit: u32| {
        let mut s = State::new(&dag);
        let l = s.cache_write(3, Scope::Local).unwrap();
        s.split(4, 3, &[8]).unwrap(); // n k y x.0 x.1
        s.compute_at(l, 4, 3).unwrap();
        s.compute_at(2, l, 2).unwrap(); // pad inside out.local's y loop, above its x
        s.vectorize_up_to(2, 3, limit).unwrap(); // pad's w: 34 wide, 10 in the region
        s
    };
    let s = schedule(16);
    golden("conv2d_padding_vectorized_by_region", &s);
    common::check_state(&dag, &s, 10);
    let text = lower(&s).unwrap().to_string();
    assert!(text.contains("vectorized for w in 0..10:"), "{text}");

    let narrow = schedule(8);
    let text = lower(&narrow).unwrap().to_string();
    assert!(text.contains("for w in 0..10:"), "{text}");
    assert!(!text.contains("vectorized for w"), "{text}");
    common::check_state(&dag, &narrow, 11);
}

#[test]
fn register_tile_rows_padded() {
    // The accumulator tile is 4 rows of 14 columns; on the stack its rows are 16 apart, the
    // last two elements of each never used.
    let dag = common::dag("conv2d:N=1,C=2,H=4,W=14,K=3,R=3,S=3,stride=1,pad=1");
    let mut s = State::new(&dag);
    s.compute_inline(2).unwrap();
    let l = s.cache_write(3, Scope::Local).unwrap(); // out.local at 3, out at 4
    s.compute_at(l, 4, 1).unwrap(); // inside out's k loop: a [1, 1, 4, 14] region
    s.reorder(l, &[0, 1, 2, 4, 5, 6, 3]).unwrap(); // n k y rc ry rx x
    s.vectorize(l, 6).unwrap();
    golden("register_tile_rows_padded", &s);
    let text = lower(&s).unwrap().to_string();
    assert!(
        text.contains("allocate out.local: f32[1, 1, 4, 16] local, rows of 14"),
        "{text}"
    );
    common::check_state(&dag, &s, 12);
}

#[test]
fn dense_weight_read_through_a_transposed_copy() {
    // dense reads W[j, k]; its copy inside the tile is stored [k][j], so that the copy's
    // rows run along j, the axis a register tile vectorizes.
    let dag = common::dag("dense_bias_relu:M=4,N=16,K=8");
    let mut s = State::new(&dag);
    let w = s.cache_read(1, Scope::Local, &[3]).unwrap(); // 0 X, 1 W, 2 W.local, 3 bias, 4 dense
    s.reorder_storage(w, &[1, 0]).unwrap();
    s.compute_at(w, 4, 0).unwrap(); // inside dense's i loop
    golden("dense_weight_read_through_a_transposed_copy", &s);
    let text = lower(&s).unwrap().to_string();
    assert!(
        text.contains("allocate W.local: f32[8, 16] local"),
        "{text}"
    );
    common::check_state(&dag, &s, 13);
}

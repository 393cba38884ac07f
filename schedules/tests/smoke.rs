mod common;
use tensortune_schedules::{ir::Scope, lower, schedule::State};

#[test]
fn smoke() {
    for spec in [
        "matmul:M=5,N=7,K=3",
        "conv2d:N=1,C=2,H=5,W=5,K=3,R=3,S=3,pad=1",
        "softmax:M=3,N=5",
        "dense_bias_relu:M=4,N=6,K=5",
        "reduce_sum:M=3,N=9",
        "depthwise_conv2d:N=1,C=2,H=6,W=6,R=3,S=3,stride=2,pad=1",
        "batch_matmul:B=2,M=3,N=4,K=5",
    ] {
        let dag = common::dag(spec);
        let s = State::new(&dag);
        println!("{}", lower::lower(&s).unwrap());
        common::check_state(&dag, &s, 1);
    }
    let dag = common::dag("matmul:M=10,N=12,K=7");
    let mut s = State::new(&dag);
    let l = s.cache_write(2, Scope::Local).unwrap();
    s.split(3, 0, &[4]).unwrap();
    s.split(3, 2, &[4]).unwrap();
    s.reorder(3, &[0, 2, 1, 3]).unwrap();
    s.compute_at(l, 3, 1).unwrap();
    s.split(l, 2, &[3]).unwrap();
    s.vectorize(3, 3).unwrap();
    println!("{s}");
    println!("{}", lower::lower(&s).unwrap());
    common::check_state(&dag, &s, 2);
}

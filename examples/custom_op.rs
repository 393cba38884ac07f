//! A compute written with the DSL, not from the op library, tuned end to end: a row-wise
//! L2 norm after a matrix product, `y[i] = sqrt(sum_j (A·B)[i, j]^2)`.

#[path = "common/args.rs"]
mod common_args;

use tensortune::schedules::data::NdData;
use tensortune::schedules::expr::{sqrt, sum};
use tensortune::schedules::te::Graph;
use tensortune::schedules::{eval, ComputeDag, DType};
use tensortune::{tune_dags, Kernel, Target, TuneOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let trials = common_args::arg("--trials", 24usize);
    let (m, n, k) = (128, 96, 64);
    let mut g = Graph::new();
    let a = g.placeholder("A", &[m, k], DType::F32);
    let b = g.placeholder("B", &[k, n], DType::F32);
    let rk = g.reduce_axis(k, "k");
    let c = g.compute("C", &[m, n], &["i", "j"], |ax| {
        sum(
            a.at([ax[0].clone(), rk.expr()]) * b.at([rk.expr(), ax[1].clone()]),
            [&rk],
        )
    });
    let rj = g.reduce_axis(n, "j");
    let sq = g.compute("sumsq", &[m], &["i"], |ax| {
        let x = c.at([ax[0].clone(), rj.expr()]);
        sum(x.clone() * x, [&rj])
    });
    let y = g.compute("norm", &[m], &["i"], |ax| sqrt(sq.at([ax[0].clone()])));
    let dag = ComputeDag::new(&g, &[y])?;

    let opts = TuneOptions {
        trials,
        batch_size: 12,
        population: 256,
        db: Some(common_args::arg("--db", "custom.db".to_string()).into()),
        ..TuneOptions::default()
    };
    let key = format!("custom:rownorm_matmul,M={m},N={n},K={k}");
    let r = tune_dags(vec![(key, dag.clone(), 1.0)], &Target::host(1), &opts)?.remove(0);
    println!(
        "{}: {:.1} GFLOP/s after {} trials",
        r.workload,
        r.best_gflops.unwrap_or(0.0),
        r.trials
    );

    // Check the best program against the direct evaluator.
    let state = r.best_state(&dag).ok_or("no valid program")?;
    let kernel = Kernel::from_state(&state, &Default::default())?;
    let inputs = vec![
        NdData::random(&[m, k], DType::F32, 1)?,
        NdData::random(&[k, n], DType::F32, 2)?,
    ];
    let got = kernel.run_nd(&tensortune::runtime::Runtime::new(1)?, &inputs)?;
    let want = eval::evaluate(&dag, &inputs)?;
    let d = got[0].max_rel_diff(&want[0]).ok_or("shape")?;
    println!("largest relative difference to the direct evaluator: {d:.2e}");
    Ok(())
}

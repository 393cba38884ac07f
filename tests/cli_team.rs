//! What a team runs: `tensortune tune` into a PostgreSQL server (the same records as into a
//! file for the same seed; four tuners writing one server at once, one of them killed
//! mid-run), and a plan split into shards.
//!
//! The server tests run on the server named by `TENSORTUNE_TEST_PG_URL` (`.ci/run` starts
//! one with `scripts/pg-test-server.sh`), in a schema of their own; without the variable they
//! pass with a message. The plan test runs its shards as plain processes with the job
//! array's variable set, as a SLURM array would start them, each into its own SQLite file,
//! merged at the end; with a SLURM cluster (`.ci/run` starts a single-node one with
//! `scripts/slurm-test-cluster.sh` and names its configuration in
//! `TENSORTUNE_TEST_SLURM_CONF`) the same script is submitted by `sbatch` as a job array
//! writing the server.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tensortune_records::{Database, ImportMode, JsonSyntaxValidator};

const PG_URL_ENV: &str = "TENSORTUNE_TEST_PG_URL";
const SLURM_CONF_ENV: &str = "TENSORTUNE_TEST_SLURM_CONF";

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tensortune"))
}

/// A URL of a fresh schema on the test server, or `None` (with a message) without one.
fn fresh_server_db(test: &str) -> Option<String> {
    let Ok(base) = std::env::var(PG_URL_ENV) else {
        eprintln!("skipped: {PG_URL_ENV} is not set");
        return None;
    };
    let schema = format!("tt_cli_{}_{test}", std::process::id());
    let mut client = postgres::Client::connect(&base, postgres::NoTls).expect("test server");
    client
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
        ))
        .expect("schema");
    let sep = if base.contains('?') { '&' } else { '?' };
    Some(format!("{base}{sep}options=-csearch_path%3D{schema}"))
}

/// A tiny tuning run: the untrained model and one batch of `batch`, so that the candidates
/// depend on the seed alone.
fn tune(db: &Path, workload: &str, trials: usize, batch: usize, seed: u64) -> Command {
    let mut cmd = bin();
    cmd.args(["tune", "--workload", workload, "--cold", "--quiet"])
        .args([
            "--trials",
            &trials.to_string(),
            "--batch-size",
            &batch.to_string(),
        ])
        .args(["--seed", &seed.to_string(), "--population", "64", "--db"])
        .arg(db);
    cmd
}

/// Waits for every child, which must all succeed.
fn wait_all(children: impl IntoIterator<Item = Child>) {
    for child in children {
        let out = child.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn succeed(cmd: &mut Command) -> String {
    let out = cmd.output().expect("tensortune runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What two runs of one seed share: each record's workload, target and trace.
fn content(db: &Path) -> Vec<(String, String, String)> {
    let text = succeed(bin().arg("export").arg("--db").arg(db));
    let mut lines: Vec<_> = text
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
            let field = |k: &str| v[k].to_string();
            (field("workload"), field("target"), field("trace"))
        })
        .collect();
    lines.sort();
    lines
}

#[test]
fn a_file_and_a_server_tuned_with_one_seed_hold_the_same_records() {
    let Some(url) = fresh_server_db("same_seed") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("tune.db");
    let server = PathBuf::from(&url);
    let spec = "matmul:M=16,N=16,K=16";
    for db in [&file, &server] {
        succeed(&mut tune(db, spec, 8, 8, 11));
    }
    let (a, b) = (content(&file), content(&server));
    assert_eq!(a.len(), 8);
    assert_eq!(a, b);

    let listed = succeed(bin().arg("records").arg("--db").arg(&server));
    assert!(
        listed.contains("matmul:K=16,M=16,N=16,dtype=f32"),
        "{listed}"
    );
    assert!(
        !listed.contains("tensortune:tensortune@"),
        "no password: {listed}"
    );
    succeed(
        bin()
            .args(["best", "--workload", spec, "--db"])
            .arg(&server),
    );
    let merged = dir.path().join("merged.db");
    succeed(
        bin()
            .arg("merge")
            .arg("--into")
            .arg(&merged)
            .arg(&file)
            .arg(&server),
    );
    assert_eq!(
        Database::open_read_only(&merged)
            .expect("open")
            .count()
            .expect("count"),
        16
    );
}

/// Waits until `db` holds at least `n` records of `workload`, or panics after two minutes.
fn wait_for_records(db: &Path, workload: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let held = Database::open_read_only(db)
            .and_then(|d| d.workloads())
            .map(|ws| {
                ws.iter()
                    .filter(|w| w.workload.key == workload)
                    .map(|w| w.records)
                    .sum::<u64>()
            })
            .unwrap_or(0);
        if held >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{workload}: {held} records after 2 min"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn four_tuners_share_one_server_and_a_killed_one_leaves_only_whole_batches() {
    let Some(url) = fresh_server_db("four") else {
        return;
    };
    let server = PathBuf::from(&url);
    // Create the tables first, so that the writers do not all wait on the schema lock.
    drop(Database::open(&server).expect("create"));
    let specs = [
        "M=16,N=16,K=16",
        "M=16,N=16,K=32",
        "M=32,N=16,K=16",
        "M=16,N=32,K=16",
    ];
    let keys: Vec<String> = specs
        .iter()
        .map(|s| {
            tensortune::WorkloadSpec::parse(&format!("matmul:{s}"))
                .expect("spec")
                .canonical()
        })
        .collect();
    let (trials, batch) = (24, 8);
    let mut children: Vec<Child> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            // The last one is killed: a budget it cannot finish first.
            let n = if i == 3 { 10_000 } else { trials };
            tune(&server, &format!("matmul:{s}"), n, batch, i as u64)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn tune")
        })
        .collect();
    wait_for_records(&server, &keys[3], batch as u64);
    let mut killed = children.pop().expect("four children");
    killed.kill().expect("SIGKILL");
    killed.wait().expect("reap");
    wait_all(children);

    let db = Database::open_read_only(&server).expect("open");
    for (i, key) in keys.iter().enumerate() {
        let target = db.targets_of(key).expect("targets");
        assert_eq!(target.len(), 1, "{key}");
        let records = db.records(key, &target[0]).expect("records");
        let n = records.len();
        if i < 3 {
            assert_eq!(n, trials, "{key}: every committed batch of a finished run");
        } else {
            assert!(
                n >= batch && n.is_multiple_of(batch),
                "{key}: {n} records, not whole batches"
            );
        }
        let hashes = db.measured_hashes(key, &target[0]).expect("hashes");
        assert_eq!(hashes.len(), n, "{key}: a program measured twice");
    }
    let runs = db.runs().expect("runs");
    assert_eq!(runs.len(), 4);
    assert_eq!(runs.iter().filter(|r| r.finished_at.is_some()).count(), 3);

    // Every stored content id is the one its content gives: exported and imported into a
    // file, where ids are computed afresh, the records have the same ids.
    let dir = tempfile::tempdir().expect("temp dir");
    let lines = dir.path().join("all.jsonl");
    db.export_file(&lines).expect("export");
    let mut copy = Database::open(dir.path().join("copy.db")).expect("open copy");
    copy.import_file(&lines, &JsonSyntaxValidator, ImportMode::Strict)
        .expect("import");
    let uids = |d: &Database| {
        let mut all = Vec::new();
        for key in &keys {
            for t in d.targets_of(key).expect("targets") {
                all.extend(
                    d.records(key, &t)
                        .expect("records")
                        .into_iter()
                        .map(|r| r.uid),
                );
            }
        }
        all.sort();
        all
    };
    assert_eq!(uids(&db), uids(&copy));
}

/// The PATH with the tested `tensortune` first, as the batch script finds it on a node.
fn path_with_the_binary() -> std::ffi::OsString {
    let exe = Path::new(env!("CARGO_BIN_EXE_tensortune"));
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = exe.parent().map(Path::to_path_buf).into_iter().collect();
    dirs.extend(std::env::split_paths(&path));
    std::env::join_paths(dirs).expect("PATH")
}

/// Array task `slurm_id` of `deploy/slurm/tune-array.sbatch` (run by bash as the batch
/// script it is, with the variables of an array `--array=1-2`): `tune --plan` of shard
/// `auto/2` into `db`, where `%a` stands for the array index.
fn shard(plan: &Path, db: &str, slurm_id: u32) -> Command {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/slurm/tune-array.sbatch");
    let mut cmd = Command::new("bash");
    cmd.arg(script)
        .arg(plan)
        .arg(db)
        .args(["--batch-size", "4", "--population", "64", "--quiet"])
        .env("PATH", path_with_the_binary())
        .env("SLURM_ARRAY_TASK_ID", slurm_id.to_string())
        .env("SLURM_ARRAY_TASK_MIN", "1")
        .env("SLURM_ARRAY_TASK_COUNT", "2")
        .env_remove("SLURM_CPUS_PER_TASK")
        .env_remove("JOB_COMPLETION_INDEX");
    cmd
}

/// A plan of four small matmuls, four trials each (the last of weight 3), written to `plan`.
fn write_plan(plan: &Path) -> (String, tensortune::plan::Plan) {
    let specs = [
        "M=8,N=8,K=8",
        "M=8,N=8,K=16",
        "M=16,N=8,K=8",
        "M=8,N=16,K=8@3",
    ];
    let mut cmd = bin();
    cmd.args(["plan", "--trials", "4", "--out"]).arg(plan);
    for s in specs {
        cmd.arg("--workload").arg(format!("matmul:{s}"));
    }
    succeed(&mut cmd);
    let text = std::fs::read_to_string(plan).expect("plan file");
    let parsed = tensortune::plan::Plan::parse(&text).expect("a valid plan");
    assert_eq!(parsed.tasks.len(), 4);
    assert_eq!(parsed.tasks[3].weight, 3.0);
    (text, parsed)
}

/// Every task of `plan` has its trials in `db`, from runs that name the plan, and both of
/// its two shards had work; `tensortune records` counts the plan's tasks done.
fn assert_every_task_tuned_by_two_shards(db: &Path, plan: &tensortune::plan::Plan) {
    let records_db = Database::open_read_only(db).expect("open");
    let mut shards_seen = Vec::new();
    for task in &plan.tasks {
        let targets = records_db.targets_of(&task.workload).expect("targets");
        assert_eq!(targets.len(), 1, "{}", task.workload);
        let records = records_db
            .records(&task.workload, &targets[0])
            .expect("records");
        assert_eq!(records.len(), task.trials, "{}", task.workload);
        let run = records_db
            .run(records[0].run.expect("a run"))
            .expect("query")
            .expect("the run");
        let plan_of_run = run.plan.expect("the run names its plan");
        assert_eq!(
            (plan_of_run.id.as_str(), plan_of_run.shards),
            (plan.id.as_str(), 2)
        );
        shards_seen.push(plan_of_run.shard);
    }
    shards_seen.sort();
    shards_seen.dedup();
    assert_eq!(shards_seen, [0, 1], "both shards had work");

    let listed = succeed(bin().arg("records").arg("--db").arg(db));
    let line = format!("plan {}: 4 task(s): 4 done, 0 under way, 0 left", plan.id);
    assert!(listed.contains(&line), "{listed}");
}

#[test]
fn two_shards_of_a_plan_tune_every_task_once_and_say_which_shard_did() {
    let dir = tempfile::tempdir().expect("temp dir");
    let plan = dir.path().join("plan.json");
    let (text, parsed) = write_plan(&plan);

    let pattern = dir.path().join("shards/shard-%a.db");
    let pattern = pattern.to_str().expect("a UTF-8 temp path");
    let children = [
        shard(&plan, pattern, 1)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn"),
        shard(&plan, pattern, 2)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn"),
    ];
    let (a, b) = (
        dir.path().join("shards/shard-1.db"),
        dir.path().join("shards/shard-2.db"),
    );
    wait_all(children);
    let all = dir.path().join("all.db");
    succeed(bin().arg("merge").arg("--into").arg(&all).arg(&a).arg(&b));

    assert_every_task_tuned_by_two_shards(&all, &parsed);
    // A shard started again (a requeued array task) finds its tasks done.
    let again = succeed(&mut shard(&plan, pattern, 1));
    assert!(again.contains("0 task(s) tuned"), "{again}");

    // The Kubernetes job has as many pods as its shards.
    let job = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/k8s/tune-indexed-job.yaml"),
    )
    .expect("the job file");
    let completions = job
        .lines()
        .find_map(|l| l.trim().strip_prefix("completions: "))
        .expect("completions");
    assert!(job.contains(&format!("- auto/{completions}\n")), "{job}");

    // An edited plan and a shard out of range are refused, one line each.
    std::fs::write(&plan, text.replace("\"trials\": 4", "\"trials\": 5")).expect("edit");
    for cmd in [
        &mut shard(&plan, pattern, 1),
        bin().args(["tune", "--plan", "x.json", "--shard", "2/2"]),
    ] {
        let out = cmd.output().expect("runs");
        assert_eq!(out.status.code(), Some(2));
        assert_eq!(
            String::from_utf8_lossy(&out.stderr).trim().lines().count(),
            1
        );
    }
}

/// The SLURM batch script as SLURM runs it: `sbatch --array=1-2` on the test cluster
/// (`scripts/slurm-test-cluster.sh`, named by `TENSORTUNE_TEST_SLURM_CONF`), both array
/// tasks writing one PostgreSQL server. Without a cluster or a server it passes with a message.
#[test]
fn a_slurm_job_array_tunes_a_plan_into_one_server() {
    let Ok(conf) = std::env::var(SLURM_CONF_ENV) else {
        eprintln!("skipped: {SLURM_CONF_ENV} is not set");
        return;
    };
    let Some(url) = fresh_server_db("slurm") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let plan = dir.path().join("plan.json");
    let (_, parsed) = write_plan(&plan);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/slurm/tune-array.sbatch");
    let out = Command::new("sbatch")
        .args(["--wait", "--array=1-2", "--chdir"])
        .arg(dir.path())
        .arg(script)
        .arg(&plan)
        .arg(&url)
        .args(["--batch-size", "4", "--population", "64", "--quiet"])
        .env("SLURM_CONF", &conf)
        .env("PATH", path_with_the_binary())
        .output()
        .expect("sbatch runs");
    let logs: String = std::fs::read_dir(dir.path())
        .expect("the job's folder")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect();
    assert!(
        out.status.success(),
        "sbatch: {}\n{}\njob logs:\n{logs}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("Submitted batch job"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_every_task_tuned_by_two_shards(&PathBuf::from(&url), &parsed);
}

/// A plan of a whole model: its layers (of two batch buckets) as tasks, the model found beside
/// the plan file by the shards, every task tuned, and a changed model refused.
#[test]
fn a_plan_of_a_model_tunes_its_layers_in_shards() {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = dir.path().join("mlp.onnx");
    std::fs::write(
        &model,
        tensortune::model::testing::mlp_dynamic_batch_bytes(),
    )
    .expect("write the model");
    let plan = dir.path().join("plan.json");
    // Planned from the model's folder: the plan names it `mlp.onnx`, found beside the plan.
    succeed(
        bin()
            .current_dir(dir.path())
            .args(["plan", "--model", "mlp.onnx", "--buckets", "2,1"])
            .args(["--trials", "4", "--out", "plan.json"]),
    );
    let text = std::fs::read_to_string(&plan).expect("plan file");
    let parsed = tensortune::plan::Plan::parse(&text).expect("a valid plan");
    assert_eq!(parsed.models.len(), 1);
    assert_eq!(parsed.models[0].path, "mlp.onnx");
    assert_eq!(parsed.models[0].buckets, [1, 2]);
    assert_eq!(parsed.tasks.len(), 2, "{text}");

    let pattern = dir.path().join("shards/shard-%a.db");
    let pattern = pattern.to_str().expect("a UTF-8 temp path");
    let children = [1, 2].map(|id| {
        shard(&plan, pattern, id)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn")
    });
    wait_all(children);
    let all = dir.path().join("all.db");
    succeed(
        bin()
            .arg("merge")
            .arg("--into")
            .arg(&all)
            .arg(dir.path().join("shards/shard-1.db"))
            .arg(dir.path().join("shards/shard-2.db")),
    );
    let db = Database::open_read_only(&all).expect("open");
    for task in &parsed.tasks {
        let targets = db.targets_of(&task.workload).expect("targets");
        assert_eq!(targets.len(), 1, "{}", task.workload);
        let records = db.records(&task.workload, &targets[0]).expect("records");
        assert_eq!(records.len(), task.trials, "{}", task.workload);
    }
    // The model runs with those records, in either bucket.
    let ran = succeed(
        bin()
            .arg("run-model")
            .arg(&model)
            .arg("--db")
            .arg(&all)
            .args(["--buckets", "1,2", "--repeat", "1"]),
    );
    assert!(
        ran.contains("1 tasks: 1 from records, 0 on their default schedule"),
        "{ran}"
    );

    // Another model under the same name is refused, one line, exit 2.
    std::fs::write(&model, tensortune::model::testing::mlp_bytes()).expect("replace the model");
    let out = shard(&plan, pattern, 1).output().expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("SHA-256 differs"), "{err}");
}

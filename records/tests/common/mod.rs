//! Helpers shared by the records integration tests: sample records and a validator that
//! plays the part of the schedule crate.

#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use tensortune_records::{
    Database, ErrorKind, NewRecord, NewRun, RecordValidator, Timestamp, Timing, ValidWorkload,
    ValidationError, Workload,
};

pub const CPU: &str = "llvm -mcpu=znver4 -mattr=+avx512f -threads=1";
pub const GPU: &str = "cuda -arch=sm_90";

/// The environment variable naming a PostgreSQL server for the tests, e.g.
/// `postgres://tensortune:tensortune@127.0.0.1:55432/tensortune` (what
/// `scripts/pg-test-server.sh start` prints). The user needs to create schemas.
pub const PG_URL_ENV: &str = "TENSORTUNE_TEST_PG_URL";

/// Declares a test that runs once on SQLite files and once on a PostgreSQL server: the
/// function `$name(place: &Place)` becomes the tests `$name::sqlite` and `$name::postgres`
/// (the second passes with a message when no server is given).
#[macro_export]
macro_rules! on_both_backends {
    ($name:ident) => {
        mod $name {
            #[test]
            fn sqlite() {
                super::$name(&$crate::common::Place::sqlite());
            }

            #[test]
            fn postgres() {
                if let Some(place) = $crate::common::Place::postgres() {
                    super::$name(&place);
                }
            }
        }
    };
}

/// Where one test keeps its databases: files in a temporary folder, or, on a server, one
/// fresh schema per database name (dropped at the end), so that tests run in parallel.
pub struct Place {
    dir: tempfile::TempDir,
    server: Option<String>,
    schemas: RefCell<BTreeMap<String, String>>,
}

impl Place {
    pub fn sqlite() -> Place {
        Place {
            dir: temp_dir(),
            server: None,
            schemas: RefCell::new(BTreeMap::new()),
        }
    }

    /// A place on the server of [`PG_URL_ENV`], or `None` (with a message) without one.
    pub fn postgres() -> Option<Place> {
        match std::env::var(PG_URL_ENV) {
            Ok(url) if !url.trim().is_empty() => Some(Place {
                dir: temp_dir(),
                server: Some(url.trim().to_string()),
                schemas: RefCell::new(BTreeMap::new()),
            }),
            _ => {
                eprintln!("skipped: {PG_URL_ENV} is not set, so the PostgreSQL half does not run");
                None
            }
        }
    }

    pub fn is_server(&self) -> bool {
        self.server.is_some()
    }

    /// The database called `name`: a file in the folder, or a URL whose `search_path` is a
    /// schema of its own. The same name gives the same database.
    pub fn db(&self, name: &str) -> PathBuf {
        let Some(base) = &self.server else {
            return self.file(name);
        };
        let mut schemas = self.schemas.borrow_mut();
        let schema = schemas
            .entry(name.to_string())
            .or_insert_with(|| create_schema(base, name));
        let sep = if base.contains('?') { '&' } else { '?' };
        PathBuf::from(format!("{base}{sep}options=-csearch_path%3D{schema}"))
    }

    /// A plain file in the place's folder (exports, imports).
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A plain SQL connection to the database `name` (which must be on a server), to forge
    /// rows as another program would.
    pub fn sql(&self, name: &str) -> postgres::Client {
        let url = self.db(name);
        let url = url.to_str().expect("a URL is text");
        postgres::Client::connect(url, postgres::NoTls).expect("connect to the test server")
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let Some(base) = &self.server else { return };
        let schemas = self.schemas.borrow();
        if schemas.is_empty() {
            return;
        }
        // Best effort: a schema left behind on a throwaway server harms nothing.
        if let Ok(mut client) = postgres::Client::connect(base, postgres::NoTls) {
            for schema in schemas.values() {
                let _ = client.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
            }
        }
    }
}

/// A new schema on the server for the database `name` of one test.
fn create_schema(base: &str, name: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(20)
        .collect();
    let schema = format!(
        "tt_{}_{}_{clean}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let mut client =
        postgres::Client::connect(base, postgres::NoTls).expect("connect to the test server");
    client
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .expect("create a schema for the test");
    schema
}

pub fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

pub fn db_path(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}

pub fn matmul(n: u32) -> Workload {
    let n64 = f64::from(n);
    Workload::new(
        format!("matmul:K={n},M={n},N={n},dtype=f32"),
        2.0 * n64 * n64 * n64,
    )
}

/// A trace in the shape the fake validator accepts: steps naming stage 0.
pub fn trace(tile: u32) -> String {
    format!(
        r#"[{{"Split":{{"stage":0,"loop":0,"factors":[{tile},4]}}}},{{"Vectorize":{{"stage":0,"loop":3}}}}]"#
    )
}

pub fn timing(median_s: f64) -> Timing {
    Timing {
        median_s,
        min_s: median_s * 0.9,
        max_s: median_s * 1.2,
        repeats: 10,
    }
}

/// A successful record measured at a fixed time (`ms` after 2026-01-01).
pub fn ok_record(w: &Workload, target: &str, tile: u32, median_s: f64, ms: i64) -> NewRecord {
    let mut r = NewRecord::measured(w.clone(), target, trace(tile), timing(median_s));
    r.measured_at = Timestamp::from_unix_ms(1_767_225_600_000 + ms);
    r
}

pub fn failed_record(w: &Workload, target: &str, tile: u32, ms: i64) -> NewRecord {
    let mut r = NewRecord::failed(
        w.clone(),
        target,
        trace(tile),
        ErrorKind::WrongResult,
        "max abs error 0.5 at [3, 7]",
    );
    r.measured_at = Timestamp::from_unix_ms(1_767_225_600_000 + ms);
    r
}

pub fn new_run(tag: &str) -> NewRun {
    NewRun {
        tool_version: "tensortune 0.1.0".into(),
        target: CPU.into(),
        seed: Some(7),
        options: format!("tensortune tune --tag {tag}"),
        plan: None,
    }
}

/// A small database: two workloads, two targets, one run, a failure among the records.
pub fn fill_sample(db: &mut Database, tag: &str, offset_ms: i64) {
    let run = db.begin_run(&new_run(tag)).expect("begin run");
    let m64 = matmul(64);
    let m128 = matmul(128);
    let batch = vec![
        ok_record(&m64, CPU, 8, 3e-5, offset_ms),
        ok_record(&m64, CPU, 16, 2e-5, offset_ms + 1),
        failed_record(&m64, CPU, 32, offset_ms + 2),
        ok_record(&m64, GPU, 8, 5e-6, offset_ms + 3),
        ok_record(&m128, CPU, 8, 2.5e-4, offset_ms + 4),
    ];
    db.insert_batch(Some(run), &batch).expect("insert");
    db.finish_run(run).expect("finish run");
}

pub fn export_string(db: &Database) -> String {
    let mut out = Vec::new();
    db.export_to(&mut out, Path::new("<memory>"))
        .expect("export");
    String::from_utf8(out).expect("utf-8 export")
}

/// Plays the schedule crate: knows `matmul` (M, N, K, dtype=f32) with one stage, canonicalizes
/// by sorting keys and filling the dtype, and "replays" a trace by checking that every step
/// names stage 0.
pub struct FakeSchedules;

impl RecordValidator for FakeSchedules {
    fn check(&self, spec: &str, trace_json: &str) -> Result<ValidWorkload, ValidationError> {
        let bad = |message: &str| ValidationError::BadSpec {
            spec: spec.to_string(),
            message: message.to_string(),
        };
        let (op, args) = spec.split_once(':').ok_or_else(|| bad("no ':'"))?;
        if op != "matmul" {
            return Err(ValidationError::UnknownOp { op: op.to_string() });
        }
        let mut keys = BTreeMap::new();
        for pair in args.split(',') {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| bad("expected KEY=VALUE"))?;
            keys.insert(k.to_string(), v.to_string());
        }
        keys.entry("dtype".to_string())
            .or_insert_with(|| "f32".to_string());
        let dim = |k: &str| -> Result<f64, ValidationError> {
            keys.get(k)
                .and_then(|v| v.parse::<f64>().ok())
                .ok_or_else(|| bad(&format!("missing {k}")))
        };
        let flops = 2.0 * dim("M")? * dim("N")? * dim("K")?;
        let steps: Vec<serde_json::Value> =
            serde_json::from_str(trace_json).map_err(|e| ValidationError::BadTrace {
                message: e.to_string(),
            })?;
        let key = format!(
            "matmul:{}",
            keys.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        for (i, step) in steps.iter().enumerate() {
            let stage = step
                .as_object()
                .and_then(|o| o.values().next())
                .and_then(|body| body.get("stage"))
                .and_then(|s| s.as_u64());
            if stage != Some(0) {
                return Err(ValidationError::DoesNotReplay {
                    workload: key,
                    message: format!("step {i} names a stage the DAG does not have"),
                });
            }
        }
        Ok(ValidWorkload {
            key,
            flops: Some(flops),
        })
    }
}

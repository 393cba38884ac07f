//! What only a server database has to show: the same content as a file, merges between the
//! two kinds, a lost connection retried and then failing cleanly, schemas it must not take
//! over; and plans, on both kinds.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::*;
use tensortune_records::{
    Backend, Database, RecordsError, RunPlan, SCHEMA_VERSION, WRITE_ATTEMPTS,
};

#[test]
fn a_file_and_a_server_fed_the_same_export_the_same_lines_and_merge_both_ways() {
    let Some(server) = Place::postgres() else {
        return;
    };
    let files = Place::sqlite();
    let mut file = Database::open(files.db("a.db")).expect("open file");
    let mut pg = Database::open(server.db("a")).expect("open server");
    assert_eq!(
        (file.backend(), pg.backend()),
        (Backend::Sqlite, Backend::Postgres)
    );
    for db in [&mut file, &mut pg] {
        fill_sample(db, "same", 0);
        // No run, a message with quotes and line breaks, and a seed past i64.
        let mut odd = failed_record(&matmul(64), GPU, 99, 50);
        odd.outcome = tensortune_records::Outcome::Failed {
            kind: tensortune_records::ErrorKind::Compile,
            message: "nvrtc: \"error\"\n  at line 3 — µ".into(),
        };
        db.insert_batch(None, &[odd]).expect("insert");
    }
    // Runs differ by uid and time; the records of each export name their own run.
    let strip_runs = |text: String| -> Vec<serde_json::Value> {
        text.lines()
            .map(|l| {
                let mut v: serde_json::Value = serde_json::from_str(l).expect("json");
                v.as_object_mut().map(|o| o.remove("run"));
                v
            })
            .collect()
    };
    assert_eq!(
        strip_runs(export_string(&file)),
        strip_runs(export_string(&pg))
    );

    // Merged into each other, each holds both runs' records once, and says the same.
    let into_file = file
        .merge_from(&[pg.path()], &FakeSchedules)
        .expect("merge");
    assert_eq!(
        into_file.added(),
        5,
        "the run-less record is the same measurement"
    );
    let into_pg = pg
        .merge_from(&[file.path()], &FakeSchedules)
        .expect("merge");
    assert_eq!(into_pg.added(), 5);
    assert_eq!(export_string(&file), export_string(&pg));
    assert_eq!(
        pg.merge_from(&[file.path()], &FakeSchedules)
            .expect("again")
            .added(),
        0
    );
    let own = pg.path().to_path_buf();
    let err = pg.merge_from(&[own], &FakeSchedules).expect_err("itself");
    assert!(matches!(err, RecordsError::MergeIntoSelf { .. }), "{err}");
    assert!(
        !err.to_string().contains(":tensortune@"),
        "no password: {err}"
    );
}

on_both_backends!(plans_and_the_shards_of_runs_are_kept_exported_and_merged);
fn plans_and_the_shards_of_runs_are_kept_exported_and_merged(place: &Place) {
    let mut db = Database::open(place.db("plan.db")).expect("open");
    let body = r#"{"format":"tensortune.plan/1","tasks":[]}"#;
    db.put_plan("p1", body).expect("plan");
    db.put_plan("p1", "ignored: the first body stays")
        .expect("plan again");
    let mut run = new_run("shard");
    run.plan = Some(RunPlan {
        id: "p1".into(),
        shard: 1,
        shards: 2,
    });
    let id = db.begin_run(&run).expect("begin");
    let w = matmul(64);
    let batch: Vec<_> = (0..3)
        .map(|i| ok_record(&w, CPU, i, 1e-5, i64::from(i)))
        .collect();
    db.insert_batch(Some(id), &batch).expect("insert");
    db.insert_batch(None, &[ok_record(&matmul(128), CPU, 1, 1e-4, 9)])
        .expect("insert");

    let plans = db.plans().expect("plans");
    assert_eq!(plans.len(), 1);
    assert_eq!((plans[0].id.as_str(), plans[0].body.as_str()), ("p1", body));
    let progress = db.plan_progress("p1").expect("progress");
    assert_eq!(progress.len(), 1, "the run-less record belongs to no plan");
    assert_eq!(
        (progress[0].workload.as_str(), progress[0].records),
        (w.key.as_str(), 3)
    );
    assert!(db.plan_progress("p2").expect("progress").is_empty());
    assert_eq!(db.runs().expect("runs")[0].plan, run.plan);

    let text = export_string(&db);
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    let shards: Vec<&serde_json::Value> =
        lines.iter().map(|v| &v["run"]["plan"]["shard"]).collect();
    // By workload key: matmul 128 (no run) sorts before matmul 64 (the plan's run).
    assert_eq!(
        shards,
        [&serde_json::Value::Null, &1.into(), &1.into(), &1.into()]
    );
    let mut copy = Database::open(place.db("copy.db")).expect("open");
    copy.merge_from(&[db.path()], &FakeSchedules)
        .expect("merge");
    assert_eq!(copy.plans().expect("plans"), plans);
    assert_eq!(copy.plan_progress("p1").expect("progress"), progress);
    assert_eq!(export_string(&copy), text);
}

/// A TCP relay between the client and the server that the test can cut, and then refuse.
struct Relay {
    port: u16,
    open: Arc<Mutex<Vec<TcpStream>>>,
    refusing: Arc<AtomicBool>,
}

impl Relay {
    fn start(server: std::net::SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let open = Arc::new(Mutex::new(Vec::new()));
        let refusing = Arc::new(AtomicBool::new(false));
        let (streams, refuse) = (Arc::clone(&open), Arc::clone(&refusing));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if refuse.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let Ok(upstream) = TcpStream::connect(server) else {
                    continue;
                };
                for (from, to) in [(&client, &upstream), (&upstream, &client)] {
                    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
                        continue;
                    };
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        while let Ok(n @ 1..) = from.read(&mut buf) {
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
                let mut open = streams.lock().unwrap_or_else(|e| e.into_inner());
                open.extend([client, upstream]);
            }
        });
        Relay {
            port,
            open,
            refusing,
        }
    }

    /// Breaks every connection made so far, as a network failure or a server restart would.
    fn cut(&self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        for stream in open.drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

#[test]
fn a_lost_connection_is_retried_and_then_fails_cleanly() {
    let Some(place) = Place::postgres() else {
        return;
    };
    let direct = place.db("relayed");
    let direct_url = direct.to_str().expect("url").to_string();
    let config: postgres::Config = direct_url.parse().expect("test url");
    let (Some(postgres::config::Host::Tcp(host)), Some(port)) =
        (config.get_hosts().first(), config.get_ports().first())
    else {
        eprintln!("skipped: {PG_URL_ENV} has no TCP host and port to relay");
        return;
    };
    let server = format!("{host}:{port}")
        .parse()
        .or_else(|_| {
            std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), *port))
                .map(|mut a| a.next().expect("an address"))
        })
        .expect("server address");
    let relay = Relay::start(server);
    let relayed = direct_url.replacen(
        &format!("{host}:{port}"),
        &format!("127.0.0.1:{}", relay.port),
        1,
    );

    let mut db = Database::open(&relayed).expect("open through the relay");
    let run = db.begin_run(&new_run("relay")).expect("begin");
    let w = matmul(32);
    let batch = |n: u32| -> Vec<_> {
        (0..20)
            .map(|i| ok_record(&w, CPU, n * 100 + i, 1e-5, i64::from(n * 100 + i)))
            .collect()
    };
    assert_eq!(db.insert_batch(Some(run), &batch(0)).expect("first"), 20);
    relay.cut();
    assert_eq!(
        db.insert_batch(Some(run), &batch(1))
            .expect("retried on a new connection"),
        20
    );
    relay.refusing.store(true, Ordering::SeqCst);
    relay.cut();
    let err = db
        .insert_batch(Some(run), &batch(2))
        .expect_err("no server to reach");
    assert!(
        matches!(err, RecordsError::ConnectionLost { attempts, .. } if attempts == WRITE_ATTEMPTS),
        "{err}"
    );
    assert!(err.is_user_error());

    let check = Database::open_read_only(&direct).expect("open directly");
    assert_eq!(
        check.count().expect("count"),
        40,
        "two whole batches, nothing of the third"
    );
}

#[test]
fn a_server_schema_is_refused_when_newer_or_foreign_and_read_only_stays_read_only() {
    let Some(place) = Place::postgres() else {
        return;
    };
    let missing = Database::open_existing(place.db("none")).expect_err("empty schema");
    assert!(matches!(missing, RecordsError::Missing { .. }), "{missing}");
    let missing = Database::open_read_only(place.db("none")).expect_err("empty schema");
    assert!(matches!(missing, RecordsError::Missing { .. }), "{missing}");

    let mut db = Database::open(place.db("future")).expect("create");
    fill_sample(&mut db, "f", 0);
    assert_eq!(db.schema_version().expect("version"), SCHEMA_VERSION);
    let mut reader = Database::open_read_only(place.db("future")).expect("reader");
    assert_eq!(reader.count().expect("count"), 5);
    let err = reader
        .insert_batch(None, &[ok_record(&matmul(8), CPU, 1, 1e-6, 0)])
        .expect_err("read-only");
    assert!(matches!(err, RecordsError::Postgres { .. }), "{err}");
    drop((db, reader));
    place
        .sql("future")
        .batch_execute("UPDATE tensortune_meta SET value = '99' WHERE name = 'schema_version'")
        .expect("bump");
    for err in [
        Database::open(place.db("future")).expect_err("newer"),
        Database::open_read_only(place.db("future")).expect_err("newer"),
    ] {
        assert!(
            matches!(err, RecordsError::NewerSchema { found: 99, .. }),
            "{err}"
        );
        assert!(err.is_user_error());
    }

    place
        .sql("other")
        .batch_execute("CREATE TABLE photos (id BIGINT PRIMARY KEY)")
        .expect("table");
    let err = Database::open(place.db("other")).expect_err("foreign");
    assert!(matches!(err, RecordsError::Foreign { .. }), "{err}");
    let tables: i64 = place
        .sql("other")
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()",
            &[],
        )
        .and_then(|r| r.try_get(0))
        .expect("count");
    assert_eq!(tables, 1, "nothing was created beside it");
}

#[test]
fn bad_and_unreachable_urls_are_the_users_to_fix_and_never_show_the_password() {
    let err = Database::open("postgres://ann:s3cret@127.0.0.1:1/x?connect_timeout=2")
        .expect_err("nothing listens on port 1");
    assert!(
        matches!(
            err,
            RecordsError::Postgres {
                connection: true,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.is_user_error());
    assert!(!err.to_string().contains("s3cret"), "{err}");
    let err = Database::open("postgres://ann:s3cret@h/x?sslmode=bogus").expect_err("bad url");
    assert!(matches!(err, RecordsError::BadUrl { .. }), "{err}");
    assert!(!err.to_string().contains("s3cret"), "{err}");
}

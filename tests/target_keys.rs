//! Target keys already written keep their meaning: every key of the committed database (written
//! by the code before keys were parsed) parses and prints back as the same text, the host's key
//! round-trips, and what builds and tuning refuse, they refuse with the key in the message.

use tensortune::build::{check_target, key_threads};
use tensortune::records::Database;
use tensortune::schedules::target::{TargetKey, TargetKind};
use tensortune::Target;

#[test]
fn keys_in_an_existing_database_round_trip() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/build-reuse/records.db"
    );
    let db = Database::open_read_only(path).expect("the example database");
    let mut keys = db.targets().expect("targets");
    keys.extend(db.runs().expect("runs").into_iter().map(|r| r.target));
    assert!(!keys.is_empty());
    for text in &keys {
        let key: TargetKey = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(&key.to_string(), text);
        assert_eq!(key.kind(), TargetKind::Cpu);
        assert_eq!(key.threads(), key_threads(text));
    }
    // What the example's key states, read through the parsed key.
    assert_eq!(key_threads(&keys[0]), 2);
}

#[test]
fn the_host_key_round_trips_and_foreign_keys_are_refused_by_name() {
    for threads in [1, 4] {
        let text = Target::host(threads).key();
        let key: TargetKey = text.parse().expect("the host's key parses");
        assert_eq!(key.to_string(), text);
        assert_eq!(key, Target::host(threads).target_key());
        assert_eq!(key.threads(), threads);
        assert!(check_target(&text).is_ok(), "{text}");
        assert_eq!(Target::parse(&text, 9), Ok(Target::host(threads)));
    }
    assert_eq!(Target::parse("llvm", 3), Ok(Target::host(3)));
    assert_eq!(Target::parse("llvm -threads=2", 3), Ok(Target::host(2)));
    for bad in [
        "llvm -mcpu=test",
        "cuda -arch=sm_90",
        "opencl",
        "llvm -fast",
    ] {
        let e = check_target(bad).expect_err(bad).to_string();
        assert!(e.contains(bad), "{e}");
        let e = Target::parse(bad, 1).expect_err(bad).to_string();
        assert!(e.contains(bad), "{e}");
    }
    assert_eq!(key_threads("llvm -mcpu=test"), 1);
}

//! The store conformance cases (promptd_core::store::conformance) on a real PostgreSQL server
//! this test starts (the test kit's `postgres` module, host/testkit/src/postgres.rs); SQLite runs the same ones
//! (host/store/tests/store_suite.rs). Plus what only this store has: migrations, and a server
//! that goes away.

use std::sync::{Arc, OnceLock};

use promptd_core::store::{EventKind, NewEvent, SessionStore};
use promptd_store_postgres::{PostgresStore, SCHEMA_VERSION};
use promptd_testkit::postgres as harness;
use serde_json::json;

/// One server for the whole binary (stopped when the process exits), one database per case.
fn server() -> &'static harness::Server {
    static SERVER: OnceLock<harness::Server> = OnceLock::new();
    SERVER.get_or_init(harness::Server::start)
}

fn postgres() -> impl Fn() -> Arc<dyn SessionStore> {
    let url = server().database();
    move || Arc::new(PostgresStore::open(&url).unwrap()) as Arc<dyn SessionStore>
}

promptd_core::store_suite!(postgres());

#[test]
fn migrations_apply_once_even_when_daemons_start_together() {
    let url = server().database();
    let versions: Vec<(i32, i32)> = std::thread::scope(|s| {
        let starts: Vec<_> = (0..4)
            .map(|_| s.spawn(|| PostgresStore::open(&url).unwrap().migrate().unwrap()))
            .collect();
        starts.into_iter().map(|t| t.join().unwrap()).collect()
    });
    // Every store found the schema current after its own open.
    assert!(
        versions
            .iter()
            .all(|v| *v == (SCHEMA_VERSION, SCHEMA_VERSION)),
        "{versions:?}"
    );
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let rows = admin
        .query("SELECT version FROM promptd_schema ORDER BY version", &[])
        .unwrap();
    let recorded: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(recorded, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
}

#[test]
fn a_schema_newer_than_the_binary_is_refused_naming_both_versions() {
    let url = server().database();
    drop(PostgresStore::open(&url).unwrap());
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    admin
        .execute(
            "INSERT INTO promptd_schema (version, applied_ms) VALUES ($1, 0)",
            &[&(SCHEMA_VERSION + 1)],
        )
        .unwrap();
    let err = PostgresStore::open(&url).err().expect("refused");
    let message = err.to_string();
    assert!(
        message.contains(&format!("version {}", SCHEMA_VERSION + 1))
            && message.contains(&format!("version {SCHEMA_VERSION}")),
        "{message}"
    );
}

#[test]
fn a_stopped_server_is_unavailable_and_the_store_reconnects_when_it_is_back() {
    // A server of its own: the others' cases must not see it stop.
    let own = harness::Server::start();
    let url = own.database();
    let store = PostgresStore::open(&url).unwrap();
    let id = store
        .create_session("a", NewEvent::json(EventKind::SessionCreated, &json!({})))
        .unwrap();
    let step = |n: u64| vec![NewEvent::json(EventKind::Step, &json!({"step": n}))];
    store.append(&id, 2, step(1)).unwrap();
    own.stop();
    for call in 0..3 {
        let err = store.append(&id, 3, step(2)).unwrap_err();
        assert_eq!(err.code(), "store_unavailable", "call {call}: {err}");
        assert_eq!(store.events(&id).unwrap_err().code(), "store_unavailable");
    }
    own.resume();
    // The pooled connections died with the server: the store connects anew.
    store.append(&id, 3, step(2)).unwrap();
    let seqs: Vec<u64> = store.events(&id).unwrap().iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3]);
}

//! Logs written by earlier releases stay readable: every step of the sessions in
//! `tests/fixtures/logs/v0.1.0/` (written by the 0.1.0 binary, see its README) rebuilds to the
//! exact bytes that binary returned, in every format.

use std::path::{Path, PathBuf};

use promptd_core::formats::{self, Format};
use promptd_core::session;
use promptd_core::store::{SessionStore, BODY_VERSION};
use promptd_store::SqliteStore;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/logs/v0.1.0")
}

#[test]
fn q4_q9_a_0_1_0_log_rebuilds_byte_identically_in_every_format() {
    let tmp = tempfile::tempdir().unwrap();
    // Opening upgrades the schema in place, so work on a copy.
    let db = tmp.path().join("sessions.db");
    std::fs::copy(fixture().join("sessions.db"), &db).unwrap();
    let store = SqliteStore::open(&db).unwrap();
    let mut checked = 0;
    for entry in std::fs::read_dir(fixture()).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        let id = dir.file_name().unwrap().to_str().unwrap().to_string();
        assert!(store.session_agent(&id).unwrap().is_some(), "session {id}");
        let events = store.events(&id).unwrap();
        assert!(events.iter().all(|e| e.version == BODY_VERSION));
        let steps = session::step_count(&events);
        assert!(steps >= 2, "session {id} has {steps} steps");
        for n in 1..=steps {
            let frozen = session::rebuild(&id, &events, n).unwrap();
            for (format, name) in [
                (Format::Neutral, "neutral"),
                (Format::Openai, "openai"),
                (Format::Anthropic, "anthropic"),
            ] {
                let path = dir.join(format!("step{n}.{name}.json"));
                let expected = std::fs::read_to_string(&path).unwrap();
                let got = formats::render(&frozen, format).to_string();
                assert_eq!(got, expected, "{}", path.display());
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 24, "8 steps in 3 formats");
    // Reopening the upgraded file is a no-op.
    drop(store);
    SqliteStore::open(&db).unwrap();
}

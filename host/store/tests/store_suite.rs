//! The store conformance cases (promptd_core::store::conformance) on SQLite; PostgreSQL runs
//! the same ones (host/store-postgres/tests/store_suite.rs).

use std::sync::Arc;

use promptd_core::store::SessionStore;
use promptd_store::SqliteStore;

/// A fresh database in a temporary folder; each call opens it again.
fn sqlite() -> impl Fn() -> Arc<dyn SessionStore> {
    let dir = tempfile::tempdir().unwrap();
    move || Arc::new(SqliteStore::open(&dir.path().join("s.db")).unwrap()) as Arc<dyn SessionStore>
}

promptd_core::store_suite!(sqlite());

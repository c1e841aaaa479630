//! The SQLite store's own rules: media kept once, ordered durable appends, group commit, a
//! database lost under the store noticed (Q7, Q11–Q13).

use super::*;
use serde_json::json;
use std::sync::Arc;

/// The same screenshot in 50 events is stored once, and every event reads back as given.
#[test]
fn q13_media_data_is_stored_once_by_its_hash() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let image = "iVBORw0K".repeat(1000);
    let store = SqliteStore::open(&path).unwrap();
    let id = store
        .create_session("a", NewEvent::json(EventKind::SessionCreated, &json!({})))
        .unwrap();
    let body = |i: usize| {
        json!({"role": "tool", "tool_call_id": format!("c{i}"), "content": [
            {"type": "text", "text": "screen"},
            {"type": "image", "media_type": "image/png", "data": image},
            {"type": "image", "media_type": "image/png", "data": "c21hbGw="}]})
    };
    for i in 0..50 {
        store
            .append(
                &id,
                2 + i as u64,
                vec![NewEvent::json(EventKind::ToolResult, &body(i))],
            )
            .unwrap();
    }
    let events = store.events(&id).unwrap();
    assert_eq!(events.len(), 51);
    for (i, e) in events[1..].iter().enumerate() {
        assert_eq!(
            e.body_value().unwrap(),
            body(i),
            "event {} reads back as given",
            e.seq
        );
    }
    drop(store);
    let conn = Connection::open(&path).unwrap();
    let blobs: i64 = conn
        .query_row("SELECT count(*) FROM blobs", [], |r| r.get(0))
        .unwrap();
    assert_eq!(blobs, 1);
    let inline: i64 = conn
        .query_row(
            "SELECT count(*) FROM events WHERE instr(body, ?1) > 0",
            [&image[..64]],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(inline, 0, "no event body holds the image");
    let small: i64 = conn
        .query_row(
            "SELECT count(*) FROM events WHERE instr(body, 'c21hbGw=') > 0",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(small, 50, "small data stays inline");
}

#[test]
fn q7_appends_are_ordered_durable_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let id = {
        let store = SqliteStore::open(&path).unwrap();
        let id = store
            .create_session(
                "coder",
                NewEvent::json(EventKind::SessionCreated, &json!({"agent": "coder"})),
            )
            .unwrap();
        store
            .append(
                &id,
                2,
                vec![
                    NewEvent::json(EventKind::UserMessage, &json!(1)),
                    NewEvent::json(EventKind::Step, &json!({"x": "y"})),
                ],
            )
            .unwrap();
        let err = store
            .append(&id, 2, vec![NewEvent::json(EventKind::Step, &json!(null))])
            .unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::Conflict {
                    expected: 2,
                    found: 3,
                    ..
                }
            ),
            "{err}"
        );
        id
    };
    // Reopened from the file: everything acknowledged is there, in order.
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.session_agent(&id).unwrap().as_deref(), Some("coder"));
    let events = store.events(&id).unwrap();
    let kinds: Vec<(u64, &str)> = events.iter().map(|e| (e.seq, e.kind.as_str())).collect();
    assert_eq!(
        kinds,
        [(1, "session/created"), (2, "user/message"), (3, "step")]
    );
    assert!(events.iter().all(|e| e.version == BODY_VERSION));
    assert_eq!(events[2].body, r#"{"x":"y"}"#);
    assert_eq!(store.session_agent("nope").unwrap(), None);
    assert!(store.events("nope").unwrap().is_empty());
}

fn new_session(store: &SqliteStore) -> String {
    store
        .create_session("a", NewEvent::json(EventKind::SessionCreated, &json!({})))
        .unwrap()
}

fn step(n: u64) -> Vec<NewEvent> {
    vec![NewEvent::json(EventKind::Step, &json!({"step": n}))]
}

#[test]
fn q11_a_failed_commit_acknowledges_nothing_of_its_batch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = SqliteStore::open(&path).unwrap();
    let id = new_session(&store);
    store.fail_commits(1);
    let err = store.append(&id, 2, step(1)).unwrap_err();
    assert_eq!(err.code(), "store", "{err}");
    assert_eq!(store.events(&id).unwrap().len(), 1, "nothing was written");
    // The next commit works, at the same seq.
    store.append(&id, 2, step(1)).unwrap();
    drop(store);
    let events = SqliteStore::open(&path).unwrap().events(&id).unwrap();
    assert_eq!(events.len(), 2);
}

/// Removes the database and its -wal and -shm, as `rm s.db*` does.
fn remove_files(path: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        std::fs::remove_file(&name).unwrap();
    }
}

/// Everything the store does fails with code `store`, naming the file and the cause.
fn assert_lost(store: &SqliteStore, id: &str, cause: &str) {
    let err = store.append(id, 3, step(2)).unwrap_err();
    assert_eq!(err.code(), "store", "{err}");
    assert!(err.to_string().contains(cause), "{err}");
    let err = store.health().unwrap_err();
    assert!(err.to_string().contains(cause), "{err}");
    assert_eq!(store.events(id).unwrap_err().code(), "store");
    assert_eq!(store.session_agent(id).unwrap_err().code(), "store");
    let err = store
        .create_session("a", NewEvent::json(EventKind::SessionCreated, &json!({})))
        .unwrap_err();
    assert_eq!(err.code(), "store", "{err}");
    // Lost for good: a later append fails too, it is not written anywhere.
    assert!(store.append(id, 3, step(2)).is_err());
}

#[test]
fn q12_a_database_deleted_under_the_store_acknowledges_nothing_after() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = SqliteStore::open(&path).unwrap();
    let id = new_session(&store);
    store.append(&id, 2, step(1)).unwrap();
    store.health().unwrap();
    remove_files(&path);
    assert_lost(&store, &id, "s.db was deleted while open");
    // A reader must not have created an empty database at the path.
    assert!(!path.exists());
    drop(store);
    // Whatever is at the path now holds nothing acknowledged after the deletion (and a
    // new store there starts empty: the deleted data is gone, as the operator asked).
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.session_agent(&id).unwrap(), None);
    assert!(store.events(&id).unwrap().is_empty());
}

#[test]
fn q12_a_deleted_wal_or_shm_loses_the_store_too() {
    for suffix in ["-wal", "-shm"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let store = SqliteStore::open(&path).unwrap();
        let id = new_session(&store);
        store.append(&id, 2, step(1)).unwrap();
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        std::fs::remove_file(&name).unwrap();
        assert_lost(&store, &id, &format!("s.db{suffix} was deleted while open"));
        drop(store);
        // What was acknowledged before is still there (the main file was kept).
        let events = SqliteStore::open(&path).unwrap().events(&id).unwrap();
        assert_eq!(events.len(), 2, "nothing after the deletion: {events:?}");
    }
}

#[test]
fn q12_a_database_replaced_by_another_file_is_noticed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let other = dir.path().join("other.db");
    drop(SqliteStore::open(&other).unwrap());
    let store = SqliteStore::open(&path).unwrap();
    let id = new_session(&store);
    // `mv other.db s.db`: the path now leads to another file (a new inode).
    std::fs::rename(&other, &path).unwrap();
    assert_lost(&store, &id, "s.db was replaced while open");
    // (Not reopened here: SQLite does not checkpoint into a moved database on close, so
    // the old s.db-wal stays beside the new file and would be replayed onto it.)
}

#[test]
fn q12_a_database_overwritten_in_place_is_noticed_before_anything_is_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let other = dir.path().join("other.db");
    {
        let other = SqliteStore::open(&other).unwrap();
        for _ in 0..50 {
            new_session(&other);
        }
    }
    let store = SqliteStore::open(&path).unwrap();
    let id = new_session(&store);
    store.append(&id, 2, step(1)).unwrap();
    #[cfg(unix)]
    let inode = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&path).unwrap().ino()
    };
    // `cp other.db s.db`: the same file (its inode kept), another database's bytes.
    std::fs::write(&path, std::fs::read(&other).unwrap()).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().ino(),
            inode,
            "overwritten in place"
        );
    }
    assert_lost(&store, &id, "s.db was overwritten in place while open");
}

#[test]
fn q12_a_database_grown_in_place_with_its_header_kept_is_noticed_by_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = SqliteStore::open(&path).unwrap();
    let id = new_session(&store);
    store.append(&id, 2, step(1)).unwrap();
    // Bytes added at the end: the first 100 are what the store last wrote, the size is not
    // (the size compared comes from the same `stat` that checks the file's identity).
    let header = std::fs::read(&path).unwrap()[..100].to_vec();
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    std::io::Write::write_all(&mut file, &[0u8; 4096]).unwrap();
    drop(file);
    assert_eq!(
        std::fs::read(&path).unwrap()[..100],
        header[..],
        "header kept"
    );
    assert_lost(&store, &id, "s.db was overwritten in place while open");
}

#[test]
fn q11_concurrent_appends_are_group_committed_and_a_refused_one_undoes_only_itself() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = Arc::new(SqliteStore::open(&path).unwrap());
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let id = new_session(&store);
                let mut refused = 0;
                for n in 1..=40u64 {
                    // Every fifth append claims a seq that is already taken.
                    if n % 5 == 0 {
                        let err = store.append(&id, n, step(n)).unwrap_err();
                        assert_eq!(err.code(), "store_conflict", "thread {t}: {err}");
                        refused += 1;
                    }
                    store.append(&id, n + 1, step(n)).unwrap();
                }
                (id, refused)
            })
        })
        .collect();
    let sessions: Vec<(String, u32)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    // 16 × (1 creation + 48 appends), and appends queued behind a sync share the next one.
    let batches = store.batches();
    assert!(
        batches < 16 * 49,
        "{batches} batches for {} writes",
        16 * 49
    );
    drop(Arc::try_unwrap(store).ok().unwrap());
    let store = SqliteStore::open(&path).unwrap();
    for (id, refused) in sessions {
        assert_eq!(refused, 8);
        let seqs: Vec<u64> = store.events(&id).unwrap().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=41).collect::<Vec<_>>(), "session {id}");
    }
}

/// Deferred appends (a step planned on the async runtime): `append_then` returns at once, each
/// callback gets its own append's result once it is durable, a refused one is refused alone,
/// and appends deferred together share commits.
#[test]
fn q11_deferred_appends_are_answered_once_durable_and_share_commits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = Arc::new(SqliteStore::open(&path).unwrap());
    assert!(store.defers());
    let sessions: Vec<String> = (0..8).map(|_| new_session(&store)).collect();
    let before = store.batches();
    let (tx, rx) = std::sync::mpsc::channel();
    for n in 1..=20u64 {
        for (s, id) in sessions.iter().enumerate() {
            let tx = tx.clone();
            store.append_then(
                id,
                n + 1,
                step(n),
                Box::new(move |r| tx.send((s, n, r)).unwrap()),
            );
        }
        // And one that claims a seq already taken.
        let tx = tx.clone();
        store.append_then(
            &sessions[0],
            1,
            step(n),
            Box::new(move |r| tx.send((usize::MAX, n, r)).unwrap()),
        );
    }
    drop(tx);
    let answers: Vec<_> = rx.iter().collect();
    assert_eq!(answers.len(), 20 * 9, "every callback called once");
    for (s, n, r) in &answers {
        match *s {
            usize::MAX => assert_eq!(r.as_ref().unwrap_err().code(), "store_conflict"),
            _ => assert!(r.is_ok(), "session {s} append {n}: {r:?}"),
        }
    }
    let batches = store.batches() - before;
    assert!(batches < 20 * 9, "{batches} batches for {} appends", 20 * 9);
    drop(Arc::try_unwrap(store).ok().unwrap());
    let store = SqliteStore::open(&path).unwrap();
    for id in &sessions {
        let seqs: Vec<u64> = store.events(id).unwrap().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=21).collect::<Vec<_>>(), "session {id}");
    }
}

/// A deferred append to a store whose files were lost is refused, not acknowledged (Q12).
#[test]
fn q12_a_deferred_append_to_a_lost_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = SqliteStore::open(&path).unwrap();
    let id = new_session(&store);
    remove_files(&path);
    let (tx, rx) = std::sync::mpsc::channel();
    store.append_then(&id, 2, step(1), Box::new(move |r| tx.send(r).unwrap()));
    let err = rx.recv().unwrap().unwrap_err();
    assert_eq!(err.code(), "store", "{err}");
    assert!(err.to_string().contains("deleted while open"), "{err}");
}

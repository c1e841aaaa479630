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

/// Rows are kept in the order they were appended, whichever session they belong to, and each
/// session's are found by seq.
#[test]
fn q7_events_are_stored_in_append_order_and_read_by_session() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = SqliteStore::open(&path).unwrap();
    let (a, b) = (new_session(&store), new_session(&store));
    for n in 2..=4 {
        store.append(&b, n, step(n)).unwrap();
        store.append(&a, n, step(n)).unwrap();
    }
    let seqs = |id: &str| -> Vec<u64> { store.events(id).unwrap().iter().map(|e| e.seq).collect() };
    assert_eq!(seqs(&a), [1, 2, 3, 4]);
    assert_eq!(seqs(&b), [1, 2, 3, 4]);
    drop(store);
    let conn = Connection::open(&path).unwrap();
    let order: Vec<(String, i64)> = conn
        .prepare("SELECT session_id, seq FROM events ORDER BY rowid")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut expected = vec![(a.clone(), 1), (b.clone(), 1)];
    for n in 2..=4 {
        expected.extend([(b.clone(), n), (a.clone(), n)]);
    }
    assert_eq!(order, expected);
}

/// The sessions and events tables as every database before issue 50 had them.
const KEYED_BY_SESSION: &str =
    "CREATE TABLE sessions (id TEXT PRIMARY KEY, agent TEXT NOT NULL, created_ms INTEGER NOT NULL);
     CREATE TABLE events (
         session_id TEXT NOT NULL REFERENCES sessions(id),
         seq INTEGER NOT NULL,
         kind TEXT NOT NULL,
         body TEXT NOT NULL,
         at_ms INTEGER NOT NULL,
         body_version INTEGER NOT NULL DEFAULT 1,
         PRIMARY KEY (session_id, seq)
     ) WITHOUT ROWID";

/// A database from before issue 50, its events table keyed by (session, seq), is rebuilt in
/// append order when opened, once: every row kept column for column, and its sessions go on.
#[test]
fn q7_an_events_table_keyed_by_session_is_moved_to_append_order_keeping_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let rows: Vec<(String, i64, String, String, i64, i64)> = vec![
        ("bb".into(), 1, "session/created".into(), "{}".into(), 10, 1),
        ("aa".into(), 1, "session/created".into(), "{}".into(), 11, 1),
        ("bb".into(), 2, "step".into(), r#"{"step":2}"#.into(), 12, 1),
        ("aa".into(), 2, "step".into(), r#"{"n":"é"}"#.into(), 13, 1),
    ];
    let all = |conn: &Connection| -> Vec<(String, i64, String, String, i64, i64)> {
        conn.prepare(
            "SELECT session_id, seq, kind, body, at_ms, body_version FROM events
             ORDER BY session_id, seq",
        )
        .unwrap()
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
    };
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(&format!(
            "PRAGMA journal_mode = WAL; {KEYED_BY_SESSION};
             INSERT INTO sessions VALUES ('aa', 'coder', 1), ('bb', 'coder', 2);"
        ))
        .unwrap();
        for r in &rows {
            conn.execute(
                "INSERT INTO events VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![r.0, r.1, r.2, r.3, r.4, r.5],
            )
            .unwrap();
        }
    }
    let schema = |conn: &Connection| -> String {
        conn.query_row(
            "SELECT group_concat(sql, ';') FROM sqlite_schema WHERE tbl_name = 'events'",
            [],
            |r| r.get(0),
        )
        .unwrap()
    };
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(
        store
            .events("aa")
            .unwrap()
            .iter()
            .map(|e| (e.seq, e.body.as_str()))
            .collect::<Vec<_>>(),
        [(1, "{}"), (2, r#"{"n":"é"}"#)]
    );
    let err = store.append("aa", 2, step(2)).unwrap_err();
    assert!(
        matches!(err, StoreError::Conflict { found: 2, .. }),
        "{err}"
    );
    store.append("aa", 3, step(3)).unwrap();
    drop(store);
    let conn = Connection::open(&path).unwrap();
    let after = schema(&conn);
    assert!(!after.to_uppercase().contains("WITHOUT ROWID"), "{after}");
    assert!(!after.contains("events_by_session"), "{after}");
    let keyed: i64 = conn
        .query_row("SELECT COUNT(*) FROM event_keys", [], |r| r.get(0))
        .unwrap();
    assert_eq!(keyed as usize, rows.len(), "every moved row is keyed");
    let mut kept = all(&conn);
    let new = kept.remove(2);
    assert_eq!((new.0.as_str(), new.1, new.2.as_str()), ("aa", 3, "step"));
    let mut sorted = rows.clone();
    sorted.sort();
    assert_eq!(kept, sorted, "every row, column for column");
    drop(conn);
    // Opening it again changes nothing.
    drop(SqliteStore::open(&path).unwrap());
    let conn = Connection::open(&path).unwrap();
    assert_eq!(schema(&conn), after);
    assert_eq!(all(&conn).len(), rows.len() + 1);
}

/// The move is one transaction: when it fails (here an event whose session is missing, which
/// the new table's foreign key refuses), opening says so and the old table is left as it was.
#[test]
fn q7_a_move_to_append_order_that_fails_leaves_the_old_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(&format!(
            "PRAGMA foreign_keys = OFF; PRAGMA journal_mode = WAL; {KEYED_BY_SESSION};
             INSERT INTO sessions VALUES ('aa', 'coder', 1);
             INSERT INTO events VALUES ('aa', 1, 'session/created', '{{}}', 1, 1);
             INSERT INTO events VALUES ('gone', 1, 'session/created', '{{}}', 2, 1);"
        ))
        .unwrap();
    }
    let err = SqliteStore::open(&path).err().expect("refused");
    let moving = format!(
        "moving the events table of {} to append order",
        path.display()
    );
    assert!(err.to_string().contains(&moving), "{err}");
    assert!(err.to_string().contains("FOREIGN KEY"), "{err}");
    let conn = Connection::open(&path).unwrap();
    let sql: String = conn
        .query_row(
            "SELECT sql FROM sqlite_schema WHERE name = 'events'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(sql.contains("WITHOUT ROWID"), "{sql}");
    let rows: i64 = conn
        .query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 2);
    let tables: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM sqlite_schema WHERE name = 'events_appended'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tables, 0, "nothing of the new table is left");
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

/// A store at `dir/s.db` with one session at seq 2: the store, the session, the database's
/// path and the path of its file ending in `suffix` (`-wal`, `-shm`).
fn appended_once(dir: &Path, suffix: &str) -> (SqliteStore, String, PathBuf, PathBuf) {
    let path = dir.join("s.db");
    let store = SqliteStore::open(&path).unwrap();
    let id = new_session(&store);
    store.append(&id, 2, step(1)).unwrap();
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    (store, id, path, PathBuf::from(name))
}

#[test]
fn q12_a_deleted_wal_or_shm_loses_the_store_too() {
    for suffix in ["-wal", "-shm"] {
        let dir = tempfile::tempdir().unwrap();
        let (store, id, path, name) = appended_once(dir.path(), suffix);
        std::fs::remove_file(&name).unwrap();
        assert_lost(&store, &id, &format!("s.db{suffix} was deleted while open"));
        drop(store);
        // What was acknowledged before is still there (the main file was kept).
        let events = SqliteStore::open(&path).unwrap().events(&id).unwrap();
        assert_eq!(events.len(), 2, "nothing after the deletion: {events:?}");
    }
}

#[test]
fn q12_a_wal_or_shm_replaced_by_another_file_loses_the_store_too() {
    // Their identity is read without their times (`identity`): a new inode at the path is
    // still found.
    for suffix in ["-wal", "-shm"] {
        let dir = tempfile::tempdir().unwrap();
        let (store, id, _, name) = appended_once(dir.path(), suffix);
        let copy = dir.path().join("copy");
        std::fs::copy(&name, &copy).unwrap();
        // `mv copy s.db-wal`: the same bytes, another inode.
        std::fs::rename(&copy, &name).unwrap();
        assert_lost(
            &store,
            &id,
            &format!("s.db{suffix} was replaced while open"),
        );
    }
}

#[test]
fn an_identity_read_without_times_is_the_one_a_whole_stat_gives() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, b"x").unwrap();
    let (whole, stat) = crate::file_id(&file).unwrap();
    assert_eq!(crate::identity(&file).unwrap(), whole);
    // The database file's check reads its size and time; the others' read neither.
    assert_eq!(crate::checked(&file, true).unwrap(), (whole, stat));
    assert!(stat.modified.is_some() && stat.size == 1);
    assert_eq!(
        crate::checked(&file, false).unwrap(),
        (whole, Stat::default())
    );
    let gone = crate::identity(&dir.path().join("missing")).unwrap_err();
    assert_eq!(gone.kind(), std::io::ErrorKind::NotFound);
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

/// A store at `dir/s.db` with one session at seq 2, and `dir/other.db`, another database
/// (50 sessions) to overwrite it with: the store, the session, and both paths.
fn beside_another(dir: &Path) -> (SqliteStore, String, PathBuf, PathBuf) {
    let path = dir.join("s.db");
    let other = dir.join("other.db");
    {
        let other = SqliteStore::open(&other).unwrap();
        for _ in 0..50 {
            new_session(&other);
        }
    }
    let store = SqliteStore::open(&path).unwrap();
    let id = new_session(&store);
    store.append(&id, 2, step(1)).unwrap();
    (store, id, path, other)
}

#[test]
fn q12_a_database_overwritten_in_place_is_noticed_before_anything_is_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let (store, id, path, other) = beside_another(dir.path());
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
fn q12_a_database_overwritten_with_its_header_and_size_kept_is_noticed_by_its_write_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = SqliteStore::open(&path).unwrap();
    let id = new_session(&store);
    store.append(&id, 2, step(1)).unwrap();
    // The file's own bytes with one changed past its header, as a copy of another database
    // of the same schema and page count would be: the header and size are what the store
    // last wrote, the data is not. (Written a tick later than the store's last look: file
    // times are kept to the kernel's clock tick.)
    let mut bytes = std::fs::read(&path).unwrap();
    assert!(bytes.len() > 100, "{} bytes", bytes.len());
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::thread::sleep(std::time::Duration::from_millis(50));
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().len() as usize,
        bytes.len()
    );
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
fn q11_a_job_failing_in_a_shared_batch_leaves_nothing_and_the_others_are_kept() {
    // Jobs are first written without savepoints; a job that fails other than by a conflict
    // (here an append to a session that does not exist, refused by the foreign key) makes the
    // batch be written again with one around each job.
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("s.db")).unwrap());
    let (a, b) = (new_session(&store), new_session(&store));
    // The next commit waits until the jobs to share a batch are queued behind it.
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (open_tx, open) = std::sync::mpsc::channel::<()>();
    store.during_next_commit(move || {
        entered_tx.send(()).unwrap();
        let _ = open.recv();
    });
    let first = {
        let (store, a) = (store.clone(), a.clone());
        std::thread::spawn(move || store.append(&a, 2, step(1)))
    };
    entered.recv().unwrap();
    let before = store.batches();
    let (tx, rx) = std::sync::mpsc::channel();
    let jobs = [
        (b.clone(), 2),
        ("0000".to_string(), 1),
        (a.clone(), 3),
        (b.clone(), 2),
    ];
    for (i, (id, seq)) in jobs.iter().enumerate() {
        let tx = tx.clone();
        store.append_then(
            id,
            *seq,
            step(*seq),
            Box::new(move |r| tx.send((i, r)).unwrap()),
        );
    }
    open_tx.send(()).unwrap();
    first.join().unwrap().unwrap();
    let mut results: Vec<_> = (0..jobs.len()).map(|_| rx.recv().unwrap()).collect();
    results.sort_by_key(|(i, _)| *i);
    assert!(results[0].1.is_ok(), "{:?}", results[0].1);
    let err = results[1].1.as_ref().unwrap_err();
    assert_eq!(err.code(), "store", "{err}");
    assert!(err.to_string().contains("FOREIGN KEY"), "{err}");
    assert!(results[2].1.is_ok(), "{:?}", results[2].1);
    // The same seq twice in one batch: the second is a conflict, and undoes only itself.
    assert_eq!(results[3].1.as_ref().unwrap_err().code(), "store_conflict");
    assert_eq!(
        store.batches(),
        before + 1,
        "the four jobs shared one batch"
    );
    assert_eq!(store.events(&a).unwrap().len(), 3);
    assert_eq!(store.events(&b).unwrap().len(), 2);
    assert!(store.events("0000").unwrap().is_empty());
}

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

/// Q12: a database file overwritten in place while a write commits is found before that
/// write is acknowledged, and the store acknowledges nothing after (the commit's own check
/// compares the file, not only the check before it).
#[test]
fn q12_a_database_overwritten_while_a_write_commits_acknowledges_nothing_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let (store, id, path, other) = beside_another(dir.path());
    let (target, bytes) = (path.clone(), std::fs::read(&other).unwrap());
    // `cp other.db s.db` in the middle of the next write.
    store.during_next_commit(move || std::fs::write(&target, bytes).unwrap());
    let err = store.append(&id, 3, step(2)).unwrap_err();
    assert_eq!(err.code(), "store", "{err}");
    assert!(
        err.to_string()
            .contains("s.db was overwritten in place while open"),
        "{err}"
    );
    assert!(store.append(&id, 3, step(2)).is_err(), "lost for good");
    assert_eq!(store.health().unwrap_err().code(), "store");
}

/// Q12 with checkpoints: the writer copies the WAL into the database file once it passes
/// 1,000 pages, as SQLite's automatic checkpoint would, so the WAL stays bounded however
/// long the appends go on, and every append reads back.
#[test]
fn q12_the_writer_copies_the_wal_into_the_database_file_and_the_wal_stays_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = SqliteStore::open(&path).unwrap();
    let id = new_session(&store);
    let text = "x".repeat(16 * 1024);
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let mut largest = 0;
    // About 5 pages each: the WAL passes 1,000 pages several times.
    let n = 1000;
    for seq in 2..2 + n {
        let body = json!({"role": "user", "content": format!("{seq} {text}")});
        store
            .append(
                &id,
                seq,
                vec![NewEvent::json(EventKind::UserMessage, &body)],
            )
            .unwrap();
        largest = largest.max(std::fs::metadata(&wal).unwrap().len());
    }
    // A WAL frame is a page and its 24-byte header; one commit adds at most a few dozen.
    let bound = u64::from(checkpoint::CHECKPOINT_PAGES + 64) * (4096 + 24);
    assert!(
        largest <= bound,
        "the WAL grew to {largest} bytes (bound {bound})"
    );
    let copied = std::fs::metadata(&path).unwrap().len();
    assert!(
        copied >= 3 * u64::from(checkpoint::CHECKPOINT_PAGES) * 4096,
        "the database file holds {copied} bytes: the WAL was not copied into it"
    );
    // Each check compared the file with what the checkpoint before it left: no false loss.
    store.health().unwrap();
    drop(store);
    let events = SqliteStore::open(&path).unwrap().events(&id).unwrap();
    assert_eq!(events.len() as u64, n + 1, "every append kept");
    assert!(events[n as usize]
        .body
        .starts_with(&format!("{{\"content\":\"{} ", n + 1)));
}

/// What the database holds of the keys: (keyed rows, the mark, unkeyed rows, every row),
/// after checking that each key points at its own row and every row up to the mark is keyed.
fn key_counts(path: &Path) -> (i64, i64, i64, i64) {
    let conn = Connection::open(path).unwrap();
    let (wrong, unkeyed_early): (i64, i64) = conn
        .query_row(
            "SELECT (SELECT COUNT(*) FROM event_keys k LEFT JOIN events e ON e.rowid = k.event
                     WHERE e.session_id IS NOT k.session_id OR e.seq IS NOT k.seq),
                    (SELECT COUNT(*) FROM events e
                     WHERE rowid <= (SELECT upto FROM event_keys_upto)
                       AND NOT EXISTS (SELECT 1 FROM event_keys k WHERE k.event = e.rowid))",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((wrong, unkeyed_early), (0, 0), "keys point at their rows");
    conn.query_row(
        "SELECT (SELECT COUNT(*) FROM event_keys), (SELECT upto FROM event_keys_upto),
                (SELECT COUNT(*) FROM events e
                 WHERE NOT EXISTS (SELECT 1 FROM event_keys k WHERE k.event = e.rowid)),
                (SELECT COUNT(*) FROM events)",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )
    .unwrap()
}

/// A session's seqs, its last seq, its seqs after `after`, and its listing's event count.
fn seen(store: &SqliteStore, id: &str, after: u64) -> (Vec<u64>, u64, Vec<u64>, u64) {
    let seqs = |events: Vec<Event>| events.iter().map(|e| e.seq).collect::<Vec<_>>();
    let listed = store.sessions(id, 5).unwrap();
    assert_eq!(listed.len(), 1, "{id}");
    (
        seqs(store.events(id).unwrap()),
        store.last_seq(id).unwrap(),
        seqs(store.events_after(id, after).unwrap()),
        listed[0].events,
    )
}

/// The key table trails the rows by less than [`keys::LAG`] of them, and every read sees a
/// session's keyed rows and the rows past the mark together, before and after the tail is
/// keyed, and after a reopen; a stale seq is refused wherever the session's last row is.
#[test]
fn q7_the_keys_trail_the_rows_and_every_read_sees_keyed_and_tail_rows_together() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = SqliteStore::open(&path).unwrap();
    let ids: Vec<String> = (0..3).map(|_| new_session(&store)).collect();
    let mut last = [1u64; 3];
    let mut marks = std::collections::BTreeSet::new();
    // Rows enough to be keyed twice; one session falls quiet so its last row gets keyed.
    for round in 0..(keys::LAG + 20) {
        for (i, id) in ids.iter().enumerate() {
            if i == 2 && round > 10 {
                continue;
            }
            store.append(id, last[i] + 1, step(round)).unwrap();
            last[i] += 1;
        }
        let (keyed, upto, unkeyed, rows) = key_counts(&path);
        assert_eq!(keyed + unkeyed, rows);
        assert!(unkeyed < keys::LAG as i64, "{unkeyed} rows unkeyed");
        marks.insert(upto);
        if round % 37 == 0 || round + 1 == keys::LAG + 20 {
            for (i, id) in ids.iter().enumerate() {
                let after = last[i] / 2;
                assert_eq!(
                    seen(&store, id, after),
                    (
                        (1..=last[i]).collect(),
                        last[i],
                        (after + 1..=last[i]).collect(),
                        last[i]
                    ),
                    "session {i}, round {round}"
                );
            }
        }
    }
    assert!(marks.len() >= 3, "the mark moved: {marks:?}");
    // A stale seq is refused for the session whose last row is keyed and the busy ones.
    for (i, id) in ids.iter().enumerate() {
        let err = store.append(id, last[i], step(0)).unwrap_err();
        assert!(
            matches!(err, StoreError::Conflict { found, .. } if found == last[i]),
            "{err}"
        );
    }
    drop(store);
    let store = SqliteStore::open(&path).unwrap();
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(seen(&store, id, 0).0, (1..=last[i]).collect::<Vec<_>>());
        let err = store.append(id, last[i], step(0)).unwrap_err();
        assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
        store.append(id, last[i] + 1, step(0)).unwrap();
    }
    drop(store);
    // Once keyed, a second key at a (session, seq) is refused by the database too.
    let conn = Connection::open(&path).unwrap();
    let again = conn.execute(
        "INSERT INTO event_keys (session_id, seq, event) VALUES (?1, 2, 0)",
        [&ids[2]],
    );
    assert!(
        again.unwrap_err().to_string().contains("UNIQUE"),
        "a second key at (session, 2) is refused"
    );
}

/// A database from issue 50 until the key table, its events found by the SQLite index
/// `events_by_session`, is keyed when opened, once, and the index dropped; rows a binary from
/// then writes into it later (re-creating its index) are read as the tail.
#[test]
fn q7_a_database_with_the_index_is_keyed_once_and_rows_written_by_an_older_binary_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let older = |conn: &Connection, from: i64, to: i64| {
        conn.execute_batch(
            "CREATE UNIQUE INDEX IF NOT EXISTS events_by_session ON events (session_id, seq)",
        )
        .unwrap();
        for seq in from..=to {
            conn.execute(
                "INSERT INTO events (session_id, seq, kind, body, at_ms, body_version)
                 VALUES ('aa', ?1, 'step', '{}', ?1, 1)",
                [seq],
            )
            .unwrap();
        }
    };
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(&format!(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE sessions (id TEXT PRIMARY KEY, agent TEXT NOT NULL, created_ms INTEGER NOT NULL);
             CREATE TABLE events {EVENTS};
             INSERT INTO sessions VALUES ('aa', 'coder', 1);"
        ))
        .unwrap();
        older(&conn, 1, 5);
    }
    let index = |path: &Path| -> i64 {
        Connection::open(path)
            .unwrap()
            .query_row(
                "SELECT COUNT(*) FROM sqlite_schema WHERE name = 'events_by_session'",
                [],
                |r| r.get(0),
            )
            .unwrap()
    };
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(index(&path), 0, "the index is dropped");
    assert_eq!(key_counts(&path), (5, 5, 0, 5), "every row keyed");
    store.append("aa", 6, step(6)).unwrap();
    drop(store);
    // An older binary opens it again, re-creates its index and appends 7..=9.
    older(&Connection::open(&path).unwrap(), 7, 9);
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(index(&path), 0);
    assert_eq!(key_counts(&path), (5, 5, 4, 9), "rows 6..=9 are the tail");
    assert_eq!(
        seen(&store, "aa", 4),
        ((1..=9).collect(), 9, (5..=9).collect(), 9)
    );
    let err = store.append("aa", 9, step(9)).unwrap_err();
    assert!(
        matches!(err, StoreError::Conflict { found: 9, .. }),
        "{err}"
    );
    store.append("aa", 10, step(10)).unwrap();
    drop(store);
    // An older binary appends more than the lag: the next commit keys all but fewer than the lag.
    let many = 10 + keys::LAG as i64 + 40;
    older(&Connection::open(&path).unwrap(), 11, many);
    let store = SqliteStore::open(&path).unwrap();
    store.append("aa", many as u64 + 1, step(0)).unwrap();
    let (keyed, _, unkeyed, rows) = key_counts(&path);
    assert_eq!(rows, many + 1);
    assert!(
        unkeyed < keys::LAG as i64 && keyed + unkeyed == rows,
        "{keyed} keyed, {unkeyed} not"
    );
    assert_eq!(
        seen(&store, "aa", 0).0,
        (1..=many as u64 + 1).collect::<Vec<_>>()
    );
}

/// A commit that would key the tail and fails keys nothing: the mark stays, the store reads
/// its tail again, and the next commit keys it, a chunk of the oldest rows.
#[test]
fn q11_a_failed_commit_that_would_key_the_tail_keys_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = SqliteStore::open(&path).unwrap();
    let id = new_session(&store);
    // Row 1 is the creation: after these the tail is one row short of being keyed.
    for seq in 2..keys::LAG {
        store.append(&id, seq, step(seq)).unwrap();
    }
    let n = keys::LAG as i64;
    assert_eq!(key_counts(&path), (0, 0, n - 1, n - 1));
    store.fail_commits(1);
    let err = store.append(&id, keys::LAG, step(0)).unwrap_err();
    assert_eq!(err.code(), "store", "{err}");
    assert_eq!(key_counts(&path), (0, 0, n - 1, n - 1));
    store.append(&id, keys::LAG, step(0)).unwrap();
    let chunk = keys::CHUNK as i64;
    assert_eq!(
        key_counts(&path),
        (chunk, chunk, n - chunk, n),
        "the oldest rows keyed once it committed"
    );
    assert_eq!(
        seen(&store, &id, chunk as u64 - 2),
        (
            (1..=keys::LAG).collect(),
            keys::LAG,
            (chunk as u64 - 1..=keys::LAG).collect(),
            keys::LAG
        )
    );
}

/// Two stores on one file (another daemon, a restart beside the old one) each key rows and
/// see the other's: every append's seq is checked against both, every key points at its row.
#[test]
fn q7_two_stores_on_one_file_key_each_others_rows_and_refuse_stale_seqs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let stores = [
        SqliteStore::open(&path).unwrap(),
        SqliteStore::open(&path).unwrap(),
    ];
    let ids: Vec<String> = (0..4).map(|i| new_session(&stores[i % 2])).collect();
    let mut last = vec![1u64; ids.len()];
    // 32 events an append: past the keys' lag twice in 64 commits, before the WAL needs a
    // checkpoint, which a second store on the file takes for an overwrite (Q12).
    const EACH: u64 = 32;
    for round in 0..(2 * keys::LAG / EACH) {
        let i = round as usize % ids.len();
        let store = &stores[(round as usize / ids.len() + i) % 2];
        // The other store appended to this session last: the next seq is taken as such.
        let events = (0..EACH).flat_map(step).collect();
        store.append(&ids[i], last[i] + 1, events).unwrap();
        last[i] += EACH;
    }
    for (i, id) in ids.iter().enumerate() {
        for store in &stores {
            let err = store.append(id, last[i], step(0)).unwrap_err();
            assert!(
                matches!(err, StoreError::Conflict { found, .. } if found == last[i]),
                "{err}"
            );
        }
    }
    let (keyed, _, unkeyed, rows) = key_counts(&path);
    assert!(
        keyed > 0 && keyed + unkeyed == rows,
        "{keyed} + {unkeyed} != {rows}"
    );
    for (i, id) in ids.iter().enumerate() {
        for store in &stores {
            assert_eq!(seen(store, id, 3).0, (1..=last[i]).collect::<Vec<_>>());
        }
    }
}

//! What every [`SessionStore`] must do (Q1, Q7, Q11), as functions over a way to open the
//! store: each store's tests run all of them through [`crate::store_suite!`], so SQLite and
//! PostgreSQL are held to the very same cases.
//!
//! `open` opens the store under test; called again it opens another handle on the same data
//! (a restart, or a second daemon on a shared database).

use std::sync::Arc;

use serde_json::{json, Value};

use super::{EventKind, NewEvent, SessionStore, StoreError, BODY_VERSION};

/// Opens the store under test; each call is a new handle on the same data.
pub type Open<'a> = &'a dyn Fn() -> Arc<dyn SessionStore>;

/// Generates one `#[test]` per conformance case; `$open` evaluates to a closure that opens the
/// store under test (it may own what the store needs, e.g. a temporary folder).
#[macro_export]
macro_rules! store_suite {
    ($open:expr) => {
        $crate::store_suite!(@cases $open;
            created_sessions_read_back,
            appends_are_gapless_and_checked,
            appends_are_durable_across_handles,
            last_seq_and_events_after_follow_the_log,
            bodies_read_back_as_given,
            racing_appends_at_one_seq_have_one_winner,
            sessions_are_listed_most_recent_first,
            appending_to_an_unknown_session_fails,
            plugin_sets_are_numbered_content_addressed_and_shared,
            every_published_plugin_set_reads_back_by_version,
            key_spend_adds_up_per_period_across_handles);
    };
    (@cases $open:expr; $($case:ident),*) => {
        $(
            #[test]
            fn $case() {
                let open = $open;
                $crate::store::conformance::$case(&open);
            }
        )*
    };
}

fn created(store: &dyn SessionStore, agent: &str) -> String {
    store
        .create_session(
            agent,
            NewEvent::json(EventKind::SessionCreated, &json!({"agent": agent})),
        )
        .unwrap()
}

fn step(n: u64) -> Vec<NewEvent> {
    vec![
        NewEvent::json(
            EventKind::UserMessage,
            &json!({"role": "user", "content": format!("m{n}")}),
        ),
        NewEvent::json(EventKind::Step, &json!({"step": n, "facts": {}})),
    ]
}

fn seqs(store: &dyn SessionStore, id: &str) -> Vec<u64> {
    store.events(id).unwrap().iter().map(|e| e.seq).collect()
}

/// Sessions get their own ids and read back their agent and first event; unknown ones read as empty.
pub fn created_sessions_read_back(open: Open) {
    let store = open();
    let a = created(&*store, "coder");
    let b = created(&*store, "coder");
    assert_ne!(a, b, "each session gets its own id");
    assert_eq!(store.session_agent(&a).unwrap().as_deref(), Some("coder"));
    let events = store.events(&a).unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(
        (events[0].seq, events[0].kind, events[0].version),
        (1, EventKind::SessionCreated, BODY_VERSION)
    );
    assert_eq!(events[0].body_value().unwrap(), json!({"agent": "coder"}));
    assert_eq!(store.session_agent("no-such-session").unwrap(), None);
    assert!(store.events("no-such-session").unwrap().is_empty());
    assert_eq!(store.last_seq("no-such-session").unwrap(), 0);
}

/// Appends go at the next seq only: a stale `next_seq` is a conflict and writes nothing.
pub fn appends_are_gapless_and_checked(open: Open) {
    let store = open();
    let id = created(&*store, "a");
    store.append(&id, 2, step(1)).unwrap();
    store.append(&id, 4, step(2)).unwrap();
    // A writer that did not see the last append is refused, and writes nothing.
    for stale in [2, 4, 7] {
        let err = store.append(&id, stale, step(9)).unwrap_err();
        assert!(
            matches!(err, StoreError::Conflict { expected, found: 5, .. } if expected == stale),
            "{err}"
        );
        assert_eq!(err.code(), "store_conflict");
    }
    assert_eq!(seqs(&*store, &id), [1, 2, 3, 4, 5]);
    let kinds: Vec<&str> = store
        .events(&id)
        .unwrap()
        .iter()
        .map(|e| e.kind.as_str())
        .collect();
    assert_eq!(
        kinds,
        [
            "session/created",
            "user/message",
            "step",
            "user/message",
            "step"
        ]
    );
}

/// What one handle acknowledged, another handle (a restart) reads exactly.
pub fn appends_are_durable_across_handles(open: Open) {
    let (id, expected) = {
        let store = open();
        let id = created(&*store, "a");
        for n in 0..10 {
            store.append(&id, 2 + 2 * n, step(n)).unwrap();
        }
        let events = store.events(&id).unwrap();
        (id, events)
    };
    // Another handle (a restart, or another daemon) reads exactly what was acknowledged.
    let store = open();
    assert_eq!(store.events(&id).unwrap(), expected);
    store.append(&id, 22, step(10)).unwrap();
    assert_eq!(store.last_seq(&id).unwrap(), 23);
}

/// `last_seq` and `events_after` see appends made through another handle at once.
pub fn last_seq_and_events_after_follow_the_log(open: Open) {
    let store = open();
    let other = open();
    let id = created(&*store, "a");
    assert_eq!(store.last_seq(&id).unwrap(), 1);
    store.append(&id, 2, step(1)).unwrap();
    // Appended through one handle, seen through the other at once.
    other.append(&id, 4, step(2)).unwrap();
    assert_eq!(store.last_seq(&id).unwrap(), 5);
    let after: Vec<u64> = store
        .events_after(&id, 3)
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(after, [4, 5]);
    assert_eq!(
        store.events_after(&id, 3).unwrap(),
        store.events(&id).unwrap()[3..]
    );
    assert!(store.events_after(&id, 5).unwrap().is_empty());
}

/// Bodies (Unicode, large images, floats) come back as the bytes given.
pub fn bodies_read_back_as_given(open: Open) {
    let store = open();
    let id = created(&*store, "a");
    let image = "iVBORw0K".repeat(400);
    let bodies: Vec<(EventKind, Value)> = vec![
        (
            EventKind::UserMessage,
            json!({"role": "user", "content": "ünïcødé ✓ \u{1F600} \"quoted\" \\ \n\t"}),
        ),
        (
            EventKind::ToolResult,
            json!({"role": "tool", "tool_call_id": "c1", "content": [
                {"type": "text", "text": "screen"},
                {"type": "image", "media_type": "image/png", "data": image},
                {"type": "image", "media_type": "image/png", "data": "c21hbGw="}]}),
        ),
        (
            EventKind::RequestHeader,
            json!({"reason": "initial", "run": "r", "header": {"model": {"temperature": 0.1,
                "max_tokens": 1024, "top_p": 1e-7, "n": -3}, "system": "", "tools": []}}),
        ),
        (
            EventKind::Step,
            json!({"step": 1, "facts": {"z": "1", "a": "2"}}),
        ),
    ];
    let events: Vec<NewEvent> = bodies.iter().map(|(k, b)| NewEvent::json(*k, b)).collect();
    store.append(&id, 2, events).unwrap();
    let read = open().events(&id).unwrap();
    for ((kind, body), event) in bodies.iter().zip(&read[1..]) {
        assert_eq!((event.kind, &event.body_value().unwrap()), (*kind, body));
        // A store hands back the bytes it was given.
        assert_eq!(event.body, body.to_string());
    }
}

/// Writers racing for one seq: one wins each seq, none is lost or written twice.
pub fn racing_appends_at_one_seq_have_one_winner(open: Open) {
    let stores: Vec<Arc<dyn SessionStore>> = (0..4).map(|_| open()).collect();
    let id = created(&*stores[0], "a");
    const EACH: u64 = 15;
    // Each writer reads the last seq and appends after it, retrying when another won that seq.
    let (won, refused): (Vec<u64>, Vec<u64>) = std::thread::scope(|s| {
        let writers: Vec<_> = stores
            .iter()
            .enumerate()
            .map(|(w, store)| {
                let id = &id;
                s.spawn(move || {
                    let (mut won, mut refused) = (0, 0);
                    while won < EACH {
                        let last = store.last_seq(id).unwrap();
                        let body = json!({"writer": w, "n": won});
                        match store.append(
                            id,
                            last + 1,
                            vec![NewEvent::json(EventKind::Step, &body)],
                        ) {
                            Ok(()) => won += 1,
                            Err(StoreError::Conflict { .. }) => refused += 1,
                            Err(e) => panic!("writer {w}: {e}"),
                        }
                    }
                    (won, refused)
                })
            })
            .collect();
        writers.into_iter().map(|w| w.join().unwrap()).unzip()
    });
    let events = stores[0].events(&id).unwrap();
    let total = 1 + EACH * stores.len() as u64;
    assert_eq!(
        events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1..=total).collect::<Vec<_>>(),
        "gapless, one event per seq"
    );
    assert_eq!(won.iter().sum::<u64>(), EACH * stores.len() as u64);
    // Every acknowledged append is there exactly once.
    let mut bodies: Vec<String> = events[1..].iter().map(|e| e.body.to_string()).collect();
    bodies.sort();
    bodies.dedup();
    assert_eq!(
        bodies.len() as u64,
        total - 1,
        "no append was written twice"
    );
    let _ = refused;
}

/// Lists put the most recent activity first, honour the limit and take the filter as plain text.
pub fn sessions_are_listed_most_recent_first(open: Open) {
    let store = open();
    let tag = format!("lister{}", std::process::id());
    let a = created(&*store, &format!("{tag}-a"));
    std::thread::sleep(std::time::Duration::from_millis(5));
    let b = created(&*store, &format!("{tag}-b"));
    std::thread::sleep(std::time::Duration::from_millis(5));
    store.append(&a, 2, step(1)).unwrap();
    let listed = store.sessions(&tag, 10).unwrap();
    let ids: Vec<&str> = listed.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, [a.as_str(), b.as_str()], "the last appended first");
    assert_eq!((listed[0].steps, listed[0].events), (1, 3));
    assert_eq!((listed[1].steps, listed[1].events), (0, 1));
    assert!(listed[0].last_ms >= listed[0].created_ms);
    assert_eq!(store.sessions(&tag, 1).unwrap().len(), 1);
    assert_eq!(store.sessions(&format!("{tag}-b"), 10).unwrap()[0].id, b);
    // The filter is plain text: `%` and `_` mean themselves.
    assert!(store.sessions("%", 10).unwrap().is_empty());
    // G10: the sessions active since a time, as listed (other tests' sessions aside).
    let since = |ms: u64| -> Vec<String> {
        let active = store.active_since(ms, 10_000).unwrap();
        let ours = active.into_iter().filter(|s| s.agent.starts_with(&tag));
        ours.map(|s| s.id).collect()
    };
    assert_eq!(since(listed[0].last_ms), std::slice::from_ref(&a));
    assert_eq!(since(listed[1].last_ms), [a.clone(), b.clone()]);
    assert!(since(listed[0].last_ms + 1).is_empty());
}

/// Appending to a session that does not exist fails and creates nothing.
pub fn appending_to_an_unknown_session_fails(open: Open) {
    let store = open();
    let err = store.append("no-such-session", 2, step(1)).unwrap_err();
    assert!(!err.to_string().is_empty());
    assert!(store.events("no-such-session").unwrap().is_empty());
    assert_eq!(store.session_agent("no-such-session").unwrap(), None);
}

/// K10: a published set is numbered after the latest, its files read back by sha256 from any
/// handle, and publishing the latest's files again makes no new version.
pub fn plugin_sets_are_numbered_content_addressed_and_shared(open: Open) {
    let store = open();
    assert_eq!(store.latest_set().unwrap(), None);
    let v1 = vec![
        ("persona".to_string(), b"persona v1".to_vec()),
        ("a".to_string(), b"shared bytes".to_vec()),
    ];
    let first = store.publish_set(&v1).unwrap();
    assert_eq!(first.version, 1);
    let stems: Vec<&str> = first.files.iter().map(|f| f.stem.as_str()).collect();
    assert_eq!(stems, ["a", "persona"], "sorted by stem");
    assert_eq!(
        store.publish_set(&v1).unwrap(),
        first,
        "the same files: the same set"
    );
    let v2 = vec![
        ("persona".to_string(), b"persona v2".to_vec()),
        ("a".to_string(), b"shared bytes".to_vec()),
    ];
    let second = store.publish_set(&v2).unwrap();
    assert_eq!(second.version, 2);
    let other = open();
    assert_eq!(other.latest_set().unwrap(), Some(second.clone()));
    for file in &second.files {
        let bytes = other.set_file(&file.sha256).unwrap();
        assert_eq!(super::sha256_hex(&bytes), file.sha256);
    }
    assert_eq!(
        other.set_file(&first.files[1].sha256).unwrap(),
        b"persona v1",
        "an older set's files stay readable"
    );
    assert!(other.set_file(&"0".repeat(64)).is_err());
}

/// K10: every published set reads back by its version from any handle (a following daemon
/// whose latest set does not load falls back on an older one); a version never published is
/// none.
pub fn every_published_plugin_set_reads_back_by_version(open: Open) {
    let store = open();
    assert_eq!(store.plugin_set(1).unwrap(), None);
    let mut published = Vec::new();
    for n in 1..=3u8 {
        let files = vec![("persona".to_string(), vec![b'v', n])];
        published.push(store.publish_set(&files).unwrap());
    }
    let other = open();
    for set in &published {
        assert_eq!(other.plugin_set(set.version).unwrap().as_ref(), Some(set));
    }
    assert_eq!(other.plugin_set(0).unwrap(), None);
    assert_eq!(other.plugin_set(4).unwrap(), None);
    assert_eq!(other.latest_set().unwrap().as_ref(), published.last());
}

/// G12: a gateway key's spend adds up per period, is returned as the total after each add,
/// and is read back by another handle (a restart, or another daemon of the fleet).
pub fn key_spend_adds_up_per_period_across_handles(open: Open) {
    let (a, b) = (open(), open());
    let periods = ["2026-12-06", "2026-12"];
    assert_eq!(a.spend("team-a", &periods).unwrap(), vec![0, 0]);
    assert_eq!(
        a.add_spend("team-a", &periods, 1_500).unwrap(),
        vec![1_500, 1_500]
    );
    assert_eq!(
        b.add_spend("team-a", &periods, 500).unwrap(),
        vec![2_000, 2_000]
    );
    assert_eq!(
        a.add_spend("team-a", &["2026-12-07", "2026-12"], 7)
            .unwrap(),
        vec![7, 2_007]
    );
    assert_eq!(b.add_spend("team-b", &periods, 1).unwrap(), vec![1, 1]);
    assert_eq!(
        open().spend("team-a", &periods).unwrap(),
        vec![2_000, 2_007]
    );
    assert_eq!(a.spend("team-a", &["2026-11"]).unwrap(), vec![0]);
}

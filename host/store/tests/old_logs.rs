//! Logs written by earlier binaries stay readable: every step of the sessions in
//! `tests/fixtures/logs/v0.1.0/` (written by the 0.1.0 binary) and
//! `tests/fixtures/logs/v0.2.0-dev/` (written at commit 89d9014, before the typed event
//! bodies) rebuilds to the exact bytes that binary returned, in every format it was fetched
//! in; and the newer log also replays, explains, diffs and reports usage as it did; every
//! gateway step of `tests/fixtures/logs/v0.3.0-dev/` (written through the gateway, issue 47)
//! rebuilds the bytes it sent upstream. See each fixture's README for how it was written.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use promptd_core::formats::{self, Format};

use promptd_core::session;
use promptd_core::store::{Event, EventKind, SessionStore, BODY_VERSION};
use promptd_store::SqliteStore;

/// The formats the 0.1.0 fixture holds (it predates `openai-responses`).
const THREE_FORMATS: [(Format, &str); 3] = [
    (Format::Neutral, "neutral"),
    (Format::Openai, "openai"),
    (Format::Anthropic, "anthropic"),
];

/// Every format, with the name its files use.
const FOUR_FORMATS: [(Format, &str); 4] = [
    (Format::Neutral, "neutral"),
    (Format::Openai, "openai"),
    (Format::OpenaiResponses, "responses"),
    (Format::Anthropic, "anthropic"),
];

/// A fixture's database, opened on a copy (opening upgrades the schema in place), and its
/// sessions: one folder per session id holding the files fetched from the daemon.
struct Fixture {
    dir: PathBuf,
    store: SqliteStore,
    db: PathBuf,
    _tmp: tempfile::TempDir,
}

/// One session of a fixture: its id, its folder and its whole log.
struct Session {
    id: String,
    dir: PathBuf,
    events: Vec<Event>,
}

impl Session {
    fn steps(&self) -> u64 {
        session::step_count(&self.events)
    }

    /// The bytes the daemon returned, as stored in the fixture.
    fn stored(&self, file: &str) -> (PathBuf, String) {
        let path = self.dir.join(file);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        (path, text)
    }
}

impl Fixture {
    fn open(name: &str) -> Fixture {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/logs")
            .join(name);
        let tmp = tempfile::tempdir().unwrap();
        let db = tmp.path().join("sessions.db");
        std::fs::copy(dir.join("sessions.db"), &db).unwrap();
        let store = SqliteStore::open(&db).unwrap();
        Fixture {
            dir,
            store,
            db,
            _tmp: tmp,
        }
    }

    /// Every session, in id order, each checked to be in the database with a log that has
    /// at least one step and only bodies of the version this binary reads.
    fn sessions(&self) -> Vec<Session> {
        let mut ids: Vec<(String, PathBuf)> = std::fs::read_dir(&self.dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.is_dir())
            .map(|dir| (dir.file_name().unwrap().to_str().unwrap().to_string(), dir))
            .collect();
        ids.sort();
        ids.into_iter()
            .map(|(id, dir)| {
                assert!(
                    self.store.session_agent(&id).unwrap().is_some(),
                    "session {id}"
                );
                let events = self.store.events(&id).unwrap();
                assert!(events.iter().all(|e| e.version == BODY_VERSION), "{id}");
                assert!(session::step_count(&events) >= 2, "session {id}");
                Session { id, dir, events }
            })
            .collect()
    }

    /// Checks that every step of every session, rebuilt from the log and rendered in each of
    /// `formats`, is byte for byte the request the old binary returned; returns how many
    /// files were compared.
    fn every_step_rebuilds_to_the_stored_bytes(&self, formats: &[(Format, &str)]) -> usize {
        let mut checked = 0;
        for s in self.sessions() {
            for n in 1..=s.steps() {
                let frozen = session::rebuild(&s.id, &s.events, n).unwrap();
                for (format, name) in formats {
                    let (path, expected) = s.stored(&format!("step{n}.{name}.json"));
                    let got = formats::render(&frozen, *format).to_string();
                    assert_eq!(got, expected, "{}", path.display());
                    checked += 1;
                }
            }
        }
        checked
    }

    /// Reopening the upgraded copy is a no-op.
    fn reopens(self) {
        let db = self.db.clone();
        drop(self.store);
        SqliteStore::open(&db).unwrap();
    }
}

#[test]
fn q4_q9_a_0_1_0_log_rebuilds_byte_identically_in_every_format() {
    let fixture = Fixture::open("v0.1.0");
    let checked = fixture.every_step_rebuilds_to_the_stored_bytes(&THREE_FORMATS);
    assert_eq!(checked, 24, "8 steps in 3 formats");
    fixture.reopens();
}

#[test]
fn q4_q9_a_0_2_0_dev_log_rebuilds_byte_identically_in_all_four_formats() {
    let fixture = Fixture::open("v0.2.0-dev");
    let checked = fixture.every_step_rebuilds_to_the_stored_bytes(&FOUR_FORMATS);
    assert_eq!(checked, 60, "15 steps (7 + 6 + 2) in 4 formats");
    fixture.reopens();
}

/// Every kind this binary writes is in a fixture: those of 89d9014 in `v0.2.0-dev`, the
/// gateway's (`gateway/request`, issue 47) in `v0.3.0-dev`, written by the first binary that
/// wrote it.
#[test]
fn the_fixture_logs_hold_every_event_kind_this_binary_writes() {
    let mut kinds = BTreeSet::new();
    for name in ["v0.2.0-dev", "v0.3.0-dev"] {
        let fixture = Fixture::open(name);
        kinds.extend(
            fixture
                .sessions()
                .iter()
                .flat_map(|s| s.events.iter().map(|e| e.kind)),
        );
    }
    assert_eq!(kinds, BTreeSet::from(EventKind::ALL));
    let gateway: BTreeSet<EventKind> = Fixture::open("v0.3.0-dev")
        .sessions()
        .iter()
        .flat_map(|s| s.events.iter().map(|e| e.kind))
        .collect();
    assert!(gateway.contains(&EventKind::GatewayRequest));
}

/// G4: every gateway step of the v0.3.0-dev log rebuilds, from its `gateway/request` event,
/// the bytes that binary sent upstream.
#[test]
fn every_0_3_0_dev_gateway_step_rebuilds_its_upstream_bytes() {
    let fixture = Fixture::open("v0.3.0-dev");
    let mut checked = 0;
    for s in fixture.sessions() {
        let mut step = 0;
        for e in &s.events {
            match session::decode(&s.id, e).unwrap() {
                session::log::Body::Step(_) => step += 1,
                session::log::Body::GatewayRequest(record) => {
                    let (path, stored) = s.stored(&format!("step-{step}.upstream.json"));
                    let rebuilt = String::from_utf8(record.upstream_body()).unwrap();
                    assert!(
                        rebuilt == stored,
                        "{} differs from the rebuild",
                        path.display()
                    );
                    checked += 1;
                }
                _ => {}
            }
        }
    }
    assert_eq!(checked, 6, "3 sessions of 2 gateway steps");
}

#[test]
fn each_0_2_0_dev_session_replays_into_a_state_with_all_its_steps() {
    let fixture = Fixture::open("v0.2.0-dev");
    let mut steps = Vec::new();
    for s in fixture.sessions() {
        let state = session::SessionState::from_log(&s.id, &s.events).unwrap();
        assert_eq!(state.steps(), s.steps(), "session {}", s.id);
        assert_eq!(state.last_seq(), s.events.len() as u64, "session {}", s.id);
        steps.push(state.steps());
    }
    steps.sort_unstable();
    assert_eq!(steps, [2, 6, 7]);
}

#[test]
fn every_0_2_0_dev_step_explains_and_diffs_to_the_stored_bytes_in_all_four_formats() {
    // Serialised as the daemon's HTTP layer does: through a `Value` (sorted keys).
    let fixture = Fixture::open("v0.2.0-dev");
    let (mut explained, mut diffed, mut reports) = (0, 0, 0);
    for s in fixture.sessions() {
        for n in 1..=s.steps() {
            let frozen = session::rebuild(&s.id, &s.events, n).unwrap();
            let given = session::provenance_at(&s.id, &s.events, n).unwrap();
            for (format, name) in FOUR_FORMATS {
                // GET …/steps/{n}/explain: api::StepExplain {step, format, request, provenance}.
                let (path, expected) = s.stored(&format!("step{n}.explain.{name}.json"));
                let got = serde_json::json!({
                    "step": n,
                    "format": format,
                    "request": formats::render(&frozen, format),
                    "provenance": given,
                })
                .to_string();
                assert_eq!(got, expected, "{}", path.display());
                explained += 1;

                // GET …/steps/{n}/diff: no counter, since every budget here counts `chars`.
                let (path, expected) = s.stored(&format!("step{n}.diff.{name}.json"));
                // As stored, plus the `breaks_cache` that issue 32 added: whether step n−1's
                // request is not a prefix of this one's.
                let diff = session::step_diff(&s.id, &s.events, n, format, None).unwrap();
                let mut got = serde_json::to_value(&diff).unwrap();
                let breaks = got
                    .as_object_mut()
                    .and_then(|o| o.remove("breaks_cache"))
                    .expect("breaks_cache");
                let kept = got["previous"]["prefix_kept"].as_bool().unwrap_or(true);
                assert_eq!(breaks, serde_json::json!(!kept), "{}", path.display());
                let expected = if format == Format::Openai {
                    parts_named_alike(&expected)
                } else {
                    expected
                };
                assert_eq!(got.to_string(), expected, "{}", path.display());
                diffed += 1;
            }
        }
        // GET …/usage: as stored, plus the `ledger` that issue 29 added (K4), which for these
        // logs (no provider names a format, no `[pricing]`) sums the replies' tokens unpriced.
        let (path, expected) = s.stored("usage.json");
        let mut got =
            serde_json::to_value(session::usage_report(&s.id, &s.events).unwrap()).unwrap();
        let ledger = got
            .as_object_mut()
            .and_then(|o| o.remove("ledger"))
            .unwrap_or_else(|| panic!("{}: no ledger", path.display()));
        assert_eq!(got.to_string(), expected, "{}", path.display());
        let stored: serde_json::Value = serde_json::from_str(&expected).unwrap();
        let replied: Vec<&serde_json::Value> = stored["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|step| step.get("actual"))
            .collect();
        let sum = |key: &str| -> u64 { replied.iter().filter_map(|a| a[key].as_u64()).sum() };
        let share = match sum("input_tokens") {
            0 => serde_json::Value::Null,
            input => serde_json::json!(sum("cached_tokens") as f64 / input as f64),
        };
        assert_eq!(
            ledger,
            serde_json::json!({
                "cache_write_tokens": sum("cache_write_tokens"),
                "cached_share": share,
                "cached_tokens": sum("cached_tokens"),
                "cost": null,
                "input_tokens": sum("input_tokens"),
                "outcomes": {},
                "output_tokens": sum("output_tokens"),
                "plugins": {},
                "replies": replied.len(),
                "unpriced_models": [],
            }),
            "{}: the ledger sums the replies the report compares",
            path.display()
        );
        reports += 1;
    }
    assert_eq!(
        (explained, diffed, reports),
        (60, 60, 3),
        "15 steps in 4 formats, 3 sessions"
    );
}

/// docs/log-format.md documents every field: each field this binary writes for the events of
/// both fixtures (decoded and encoded again, so as today's binary writes them, every kind
/// included) is named in its kind's section, the request header's as `header.NAME`.
#[test]
fn every_field_the_fixtures_hold_is_documented_under_its_kind() {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/log-format.md"),
    )
    .unwrap();
    // A kind's section: from its `### ` heading to the next heading.
    let section = |kind: &str| -> String {
        let tick = format!("`{kind}`");
        let mut lines = doc
            .lines()
            .skip_while(|l| !(l.starts_with("### ") && l.contains(&tick)));
        let heading = lines
            .next()
            .unwrap_or_else(|| panic!("no section for {kind}"));
        let body: Vec<&str> = lines.take_while(|l| !l.starts_with('#')).collect();
        format!("{heading}\n{}", body.join("\n"))
    };
    let mut checked = BTreeSet::new();
    let mut missing = Vec::new();
    for name in ["v0.1.0", "v0.2.0-dev", "v0.3.0-dev"] {
        let fixture = Fixture::open(name);
        for s in fixture.sessions() {
            for e in &s.events {
                let body = session::decode(&s.id, e).unwrap().encode().unwrap().body;
                let value: serde_json::Value = serde_json::from_str(&body).unwrap();
                let mut fields: Vec<String> = value.as_object().unwrap().keys().cloned().collect();
                // The header is documented by its fields.
                if let Some(header) = value.get("header").and_then(|h| h.as_object()) {
                    fields.retain(|f| f != "header");
                    fields.extend(header.keys().map(|k| format!("header.{k}")));
                }
                let text = section(e.kind.as_str());
                for field in fields {
                    if checked.insert((e.kind.as_str(), field.clone()))
                        && !text.contains(&format!("`{field}`"))
                    {
                        missing.push(format!("{}: `{field}`", e.kind.as_str()));
                    }
                }
            }
        }
    }
    assert!(missing.is_empty(), "undocumented fields: {missing:?}");
    // Every kind was seen, with its fields: the check above covered them all.
    let kinds: BTreeSet<&str> = checked.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        kinds.len(),
        EventKind::ALL.len(),
        "kinds checked: {kinds:?}"
    );
    assert!(checked.len() >= 25, "fields checked: {checked:?}");
}

/// A Chat Completions diff as stored, with the part names issue 45 made alike in every format
/// (Q16): the binary that wrote these logs named the system message `message 1` and counted
/// the conversation from 2; now it is `system`, and the conversation counts from 1.
fn parts_named_alike(stored: &str) -> String {
    fn renamed(label: &str) -> String {
        let Some((n, rest)) = label.strip_prefix("message ").and_then(|r| {
            let digits = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
            Some((r[..digits].parse::<usize>().ok()?, &r[digits..]))
        }) else {
            return label.to_string();
        };
        match n {
            1 => format!("system{rest}"),
            n => format!("message {}{rest}", n - 1),
        }
    }
    // Edited as text: the stored floats are kept byte for byte. Each `"part":"…"` is renamed
    // where it stands, in one pass (renaming by search and replace could rename a part twice).
    let diff: serde_json::Value = serde_json::from_str(stored).unwrap();
    const PART: &str = "\"part\":\"";
    let mut out = String::with_capacity(stored.len());
    let mut rest = stored;
    while let Some(at) = rest.find(PART) {
        let (before, after) = rest.split_at(at + PART.len());
        let end = after.find('"').expect("a part's closing quote");
        out.push_str(before);
        out.push_str(&renamed(&after[..end]));
        rest = &after[end..];
    }
    out.push_str(rest);
    if let Some(causes) = diff["causes"].as_array() {
        let renamed: Vec<String> = causes
            .iter()
            .map(|c| renamed(c.as_str().unwrap_or_default()))
            .collect();
        out = out.replace(
            &format!("\"causes\":{}", serde_json::Value::from(causes.clone())),
            &format!("\"causes\":{}", serde_json::json!(renamed)),
        );
    }
    out
}

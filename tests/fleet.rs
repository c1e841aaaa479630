//! K10 on the embedded SQLite store: a daemon with `[fleet] follow = true` serving the plugin
//! sets `promptd plugins publish` stores in its own state folder, restarted while the latest
//! set does not load (issue 45). Several daemons on one PostgreSQL database are
//! tests/postgres.rs's.

use promptd_testkit as common;

use std::path::{Path, PathBuf};

use common::daemon::{state_dir, Served};
use common::Folder;
use serde_json::{json, Value};

const CONFIG: &str = r#"
model = { model = "test-model", max_tokens = 512 }

[fleet]
follow = true
poll_ms = 100
"#;

/// A follower's config (in a folder of its own, which the daemon does not serve from) and
/// its state folder, where the SQLite store keeps sessions and published sets.
struct Fleet {
    config: Folder,
    _state: tempfile::TempDir,
    state: PathBuf,
}

impl Fleet {
    fn new() -> Fleet {
        let config = Folder::new();
        config.config(CONFIG);
        let (tmp, state) = state_dir();
        Fleet {
            config,
            _state: tmp,
            state,
        }
    }

    fn config_path(&self) -> PathBuf {
        self.config.path().join("promptd.toml")
    }

    /// `promptd plugins publish DIR` into the state folder's store; the set's version.
    fn publish(&self, dir: &Path) -> u64 {
        let out = common::promptd_command()
            .args(["plugins", "publish"])
            .arg(dir)
            .arg("--config")
            .arg(self.config_path())
            .arg("--state")
            .arg(&self.state)
            .output()
            .unwrap();
        let stdout = common::stdout(&out);
        assert!(out.status.success(), "{stdout}{}", common::stderr(&out));
        stdout
            .strip_prefix("plugin set ")
            .and_then(|r| r.split(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no version in {stdout:?}"))
    }

    /// A following daemon, ready (health `ok`), its log at info in `log`.
    fn serve_logged(&self, log: &Path) -> Served {
        Served::start_logged(self.config.path(), &self.config_path(), &self.state, log)
    }

    /// A following daemon, once its first load is over, whatever its health says then.
    fn serve_loaded(&self) -> Served {
        let served = Served::start_unready(self.config.path(), &self.config_path(), &self.state);
        common::eventually_within(180, "the daemon to finish its first load", || {
            let status = served.health()["status"].clone();
            status.is_string() && status != "loading"
        });
        served
    }
}

/// A folder holding `versioned` at version `version` (its system prompt and tool say it),
/// and a file that is not a component when `broken`.
fn set(version: u8, broken: bool) -> Folder {
    let folder = Folder::new();
    let v = std::fs::read(common::fixture(&format!("versioned_v{version}"))).unwrap();
    common::put(folder.path(), "versioned", &v);
    if broken {
        common::put(folder.path(), "broken", b"not wasm");
    }
    folder
}

/// One step of session `id` in the Anthropic format: (status, body).
fn step(d: &Served, id: &str, text: &str) -> (u16, Value) {
    let body = json!({"messages": [{"role": "user", "content": text}], "format": "anthropic"});
    let (status, reply) = d.post(&format!("/v1/sessions/{id}/steps"), &body.to_string());
    (
        status,
        serde_json::from_str(&reply).unwrap_or_else(|e| panic!("{e}: {reply}")),
    )
}

/// What a step's request shows of the set that served it: the system prompt and tool names.
fn served_by(reply: &Value) -> (String, Vec<String>) {
    let request = &reply["request"];
    let system = request["system"].to_string();
    let tools = request["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .map(|t| t["name"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default();
    (system, tools)
}

fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("")
}

/// K10: a following daemon restarted while the latest published set does not load serves
/// the newest older set that does (here set 1), as the daemons that kept running do, and
/// says so: `plugin_set` in `/v1/health` and `set` in `GET /v1/plugins` give `serving` 1,
/// `latest` 2 and the error naming set 2, and the log has a warning naming both.
#[test]
fn k10_a_restarted_follower_whose_latest_set_does_not_load_serves_the_newest_that_does() {
    let fleet = Fleet::new();
    assert_eq!(fleet.publish(set(1, false).path()), 1);
    let logs = tempfile::tempdir().unwrap();
    let d = fleet.serve_logged(&logs.path().join("first.log"));
    assert_eq!(d.health()["plugin_set"]["serving"], 1, "{}", d.health());
    let before = d.session("default");
    let (status, reply) = step(&d, &before, "on set 1");
    assert_eq!(status, 200, "{reply}");
    d.kill9();

    // Set 2: a newer `versioned` beside a file that is not a component: it never loads.
    assert_eq!(fleet.publish(set(2, true).path()), 2);
    let log = logs.path().join("restarted.log");
    let d = fleet.serve_logged(&log);
    let health = d.health();
    assert_eq!(health["status"], "ok", "{health}");
    assert_eq!(health["plugins"], 1, "{health}");
    let status = &health["plugin_set"];
    assert_eq!(
        (&status["serving"], &status["latest"]),
        (&json!(1), &json!(2)),
        "{health}"
    );
    let message = status["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.starts_with("plugin set 2 was not loaded, so set 1 serves: ")
            && message.contains("broken"),
        "{health}"
    );
    let listed = d.ok("GET", "/v1/plugins", None);
    assert_eq!(&listed["set"], status, "{listed}");
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN")
                && l.contains("plugin set 2 was not loaded, so set 1 serves")),
        "{log}"
    );

    // A new session's step, and the one from before the restart, are planned on set 1.
    for id in [d.session("default"), before] {
        let (status, reply) = step(&d, &id, "after the restart");
        assert_eq!(status, 200, "{reply}");
        let (system, tools) = served_by(&reply);
        assert!(system.contains("version 1"), "{reply}");
        assert_eq!(tools, ["versioned_tool"], "{reply}");
    }
    // The poll does not try set 2 again: it keeps serving set 1, with the same error.
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(&d.health()["plugin_set"], status);
}

/// K10: when no published set loads, a following daemon serves none rather than an empty
/// registry: a step is refused with 503 `plugin_set_unavailable` naming the latest set and
/// its error, and `/v1/health` says `no_plugin_set` (still 200); once a set that loads is
/// published, the next poll takes it and steps are served.
#[test]
fn k10_a_follower_whose_only_published_set_does_not_load_refuses_steps_until_one_does() {
    let fleet = Fleet::new();
    assert_eq!(fleet.publish(set(1, true).path()), 1);
    let d = fleet.serve_loaded();
    let (code, body) = d.get("/v1/health");
    let health: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (code, &health["status"]),
        (200, &json!("no_plugin_set")),
        "{health}"
    );
    assert_eq!(health["plugins"], 0, "{health}");
    assert_eq!(
        health["error"]["code"], "plugin_set_unavailable",
        "{health}"
    );
    let status = &health["plugin_set"];
    assert_eq!(
        (&status["serving"], &status["latest"]),
        (&Value::Null, &json!(1)),
        "{health}"
    );
    let message = status["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.starts_with("plugin set 1 was not loaded, so no set serves: ")
            && message.contains("broken"),
        "{health}"
    );
    let listed = d.ok("GET", "/v1/plugins", None);
    assert_eq!(&listed["set"], status, "{listed}");

    let id = d.session("default");
    let (code, reply) = step(&d, &id, "with no set");
    assert_eq!(
        (code, error_code(&reply)),
        (503, "plugin_set_unavailable"),
        "{reply}"
    );
    let refused = reply["error"]["message"].as_str().unwrap_or("");
    assert!(
        refused.contains("plugin set 1 was not loaded") && refused.contains("broken"),
        "{reply}"
    );
    assert_eq!(
        d.event_kinds(&id),
        ["session/created"],
        "nothing recorded for the refused step"
    );

    // A set that loads: the next poll serves it, and the same session steps on it.
    assert_eq!(fleet.publish(set(1, false).path()), 2);
    common::eventually("the poll to serve set 2", || {
        d.health()["plugin_set"]["serving"] == 2
    });
    let health = d.health();
    assert_eq!(health["status"], "ok", "{health}");
    assert!(health.get("error").is_none(), "{health}");
    assert_eq!(health["plugin_set"]["error"], Value::Null, "{health}");
    let (code, reply) = step(&d, &id, "on set 2");
    assert_eq!(code, 200, "{reply}");
    let (system, tools) = served_by(&reply);
    assert!(system.contains("version 1"), "{reply}");
    assert_eq!(tools, ["versioned_tool"], "{reply}");
}

/// K10: a following daemon whose store holds no published set serves an empty registry, as
/// before any set is published (`ok`, steps answered), and takes the first set published.
#[test]
fn k10_a_follower_with_no_published_set_serves_an_empty_registry_until_one_is_published() {
    let fleet = Fleet::new();
    let d = fleet.serve_loaded();
    let health = d.health();
    assert_eq!(health["status"], "ok", "{health}");
    assert_eq!(
        health["plugin_set"],
        json!({"serving": null, "latest": null, "error": null}),
        "{health}"
    );
    let id = d.session("default");
    let (code, reply) = step(&d, &id, "nothing published");
    assert_eq!(code, 200, "{reply}");
    assert_eq!(served_by(&reply).1, Vec::<String>::new(), "{reply}");
    assert_eq!(fleet.publish(set(1, false).path()), 1);
    common::eventually("the poll to serve set 1", || {
        d.health()["plugin_set"]["serving"] == 1
    });
    let (code, reply) = step(&d, &id, "on set 1");
    assert_eq!(code, 200, "{reply}");
    assert_eq!(served_by(&reply).1, ["versioned_tool"], "{reply}");
}

//! Issue 29's scripted workload: 100 sessions of two agents that share a prefix, through a real
//! daemon (the bundled Rust plugins, a fixture plugin swapped between two versions, an MCP
//! server that crashes and is restarted) and the stub provider, whose cache follows the
//! providers' documented rules on the time the test gives it. The outcome recorded with each
//! reply must be one the script caused, step by step, and none `unexplained`.
//!
//! The script (seeded, so every run is the same):
//! - session `s` starts at `s × 17 s`, alternating agents `alpha` and `beta`, 4–7 steps each
//!   in the Anthropic format; a step after a tool call comes 1–3 s later, any other after an
//!   idle gap drawn from: 80% uniform over 2–90 s, 20% uniform over 6–20 minutes (past the
//!   5-minute TTL);
//! - the `versioned` plugin is swapped (v1 ↔ v2) at 10, 25 and 40 minutes;
//! - the MCP server crashes at 15 and 30 minutes and is restarted with the same tools;
//! - eight sessions have their first message compacted after their third step;
//! - one OpenAI session sends 20 steps 2 s apart: the 16th passes the per-key rate.
//!
//! What each step's outcome must be: a session's first step `hit` when any session sent the
//! same head (tools and system) within the TTL, else `cold`; later steps `prefix_changed`
//! naming `versioned` after a swap, `compacted` after a compaction, `ttl_expired` after a gap
//! past the TTL (any of them when several happened), else `hit`.

use promptd_testkit as common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use common::daemon::Served;
use common::{eventually_within, fixture, put, repo_root, Folder};
use serde_json::{json, Value};

const TTL_MS: u64 = 300_000;
const MIN_MS: u64 = 60_000;

/// xorshift64*: the script's draws, the same on every run.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
    fn idle_gap(&mut self) -> u64 {
        if self.next() % 10 < 8 {
            self.between(2_000, 90_000)
        } else {
            self.between(6 * MIN_MS, 20 * MIN_MS)
        }
    }
}

pub(crate) fn python(dir: &str) -> PathBuf {
    let python = repo_root().join(dir).join(".venv/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: `cargo xtask test` installs it",
        python.display()
    );
    python
}

/// A long static persona, so the head passes every model's minimum cacheable length.
pub(crate) fn persona() -> String {
    let rule = "Check every claim against the code before you state it, and say plainly what you did not check. ";
    rule.repeat(90)
}

fn config(starts: &std::path::Path, extra: &str) -> String {
    let (py, server) = (
        python("tests/mcp"),
        repo_root().join("tests/mcp/fixture_server.py"),
    );
    format!(
        r#"
[model]
max_tokens = 1024
[model.anthropic]
model = "claude-sonnet-4-5"
[model.openai]
model = "gpt-4.1"

[agents.alpha]
[agents.beta]
[agents.ops]

[plugins.identity]
config = {{ name = "Ada", model = "example-model" }}
[plugins.persona]
config = {{ text = {persona:?} }}

[mcp.s]
command = {py:?}
args = [{server:?}, "same"]
env = {{ FIXTURE_STARTS = {starts:?} }}

[pricing."claude-sonnet-4-5"]
input = 3.0
output = 15.0
[pricing."gpt-4.1"]
input = 2.0
output = 8.0
{extra}
"#,
        persona = persona(),
        py = py.display().to_string(),
        server = server.display().to_string(),
        starts = starts.display().to_string(),
    )
}

/// The stub provider, told the time by the test.
pub(crate) struct Stub {
    _child: common::process::Bounded,
    url: String,
}

impl Stub {
    pub(crate) fn start() -> Stub {
        let (child, url) =
            common::process::start_stub_provider(&python("tests/sdk_loops"), "900", None);
        Stub { _child: child, url }
    }

    /// GETs one of the stub's own routes (`/stub/ledger`).
    pub(crate) fn get(&self, path: &str) -> Value {
        let text = ureq::get(format!("{}{path}", self.url))
            .call()
            .unwrap_or_else(|e| panic!("stub {path}: {e}"))
            .body_mut()
            .read_to_string()
            .unwrap_or_default();
        serde_json::from_str(&text).unwrap()
    }

    pub(crate) fn call(&self, path: &str, body: &Value, now_ms: u64) -> Value {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into();
        let mut r = agent
            .post(format!("{}{path}", self.url))
            .header("Content-Type", "application/json")
            .header("X-Stub-Now-Ms", now_ms.to_string())
            .send(body.to_string())
            .unwrap_or_else(|e| panic!("stub {path}: {e}"));
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().unwrap_or_default();
        assert_eq!(status, 200, "the stub refused a body promptd built: {text}");
        serde_json::from_str(&text).unwrap()
    }
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    promptd_daemon::plugin_dir::hex(&Sha256::digest(bytes))
}

/// A request's head as a cache sees it: its tools and system prompt (or, for Chat, its
/// first message), without the breakpoints.
fn head(request: &Value) -> String {
    fn strip(v: &Value) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .filter(|(k, _)| *k != "cache_control")
                    .map(|(k, v)| (k.clone(), strip(v)))
                    .collect(),
            ),
            Value::Array(a) => Value::Array(a.iter().map(strip).collect()),
            other => other.clone(),
        }
    }
    let system = request
        .get("system")
        .cloned()
        .unwrap_or_else(|| request["messages"][0].clone());
    strip(&json!([request["model"], request["tools"], system])).to_string()
}

/// What the script did to one session since its previous step.
#[derive(Default)]
struct Session {
    id: String,
    agent: &'static str,
    steps: u64,
    last_ms: u64,
    version: u8,
    compacted: bool,
    /// Tool calls the last reply made, to answer in the next step.
    calls: Vec<String>,
    /// Per step: the outcomes the script allows.
    expected: Vec<BTreeSet<&'static str>>,
}

impl Session {
    /// The next step's messages: a new task, or a result for each tool call the last reply
    /// made.
    fn next_messages(&self) -> Vec<Value> {
        if self.calls.is_empty() {
            vec![
                json!({"role": "user", "content": format!("task {} of {}", self.steps + 1, self.id)}),
            ]
        } else {
            self.calls
                .iter()
                .map(|c| json!({"role": "tool", "tool_call_id": c, "content": "done"}))
                .collect()
        }
    }
}

struct Rig {
    d: Served,
    stub: Stub,
    folder: Folder,
    starts: PathBuf,
    /// Each head, when a request last carried it, and that request's agent.
    heads: HashMap<String, (u64, &'static str)>,
    /// First steps that found their head warm from the other agent's requests.
    shared: u64,
    version: u8,
    _state: tempfile::TempDir,
}

impl Rig {
    /// One step of `s` at `now`, in `format`: promptd's step, the stub's reply, recorded.
    fn step(&mut self, s: &mut Session, now: u64, format: &str) {
        let body = json!({"format": format, "messages": s.next_messages(),
                          "facts": {"cwd": "/src/app"}, "sent_at": now});
        let step = self
            .d
            .ok("POST", &format!("/v1/sessions/{}/steps", s.id), Some(&body));
        let request = &step["request"];
        let h = head(request);
        let mut allowed = BTreeSet::new();
        if s.steps == 0 {
            let warm = self.heads.get(&h).filter(|&&(t, _)| now - t <= TTL_MS);
            if warm.is_some_and(|&(_, agent)| agent != s.agent) {
                self.shared += 1;
            }
            allowed.insert(if warm.is_some() { "hit" } else { "cold" });
        } else {
            if s.version != self.version {
                allowed.insert("prefix_changed");
            }
            if s.compacted {
                allowed.insert("compacted");
            }
            if now - s.last_ms > TTL_MS {
                allowed.insert("ttl_expired");
            }
            if allowed.is_empty() {
                allowed.insert("hit");
            }
        }
        let path = if format == "anthropic" {
            "/v1/messages"
        } else {
            "/v1/chat/completions"
        };
        let reply = self.stub.call(path, request, now);
        self.d.ok(
            "POST",
            &format!("/v1/sessions/{}/messages?sent_at={now}", s.id),
            Some(&reply),
        );
        s.calls = tool_calls(&reply);
        self.heads.insert(h, (now, s.agent));
        s.expected.push(allowed);
        s.steps += 1;
        s.last_ms = now;
        s.version = self.version;
        s.compacted = false;
    }

    /// Swaps `versioned` to its other version and waits until it serves.
    fn swap(&mut self) {
        self.version = 3 - self.version;
        let bytes = std::fs::read(fixture(&format!("versioned_v{}", self.version))).unwrap();
        put(self.folder.path(), "versioned", &bytes);
        let want = sha256(&bytes);
        eventually_within(30, "the swapped plugin to serve", || {
            self.d.plugin("versioned")["sha256"] == want.as_str()
        });
    }

    /// Crashes the MCP server through a tool call of the `ops` agent and waits until it is
    /// restarted and serving again.
    fn flap(&mut self, n: u64) {
        let id = self.d.session("ops");
        let starts = || {
            std::fs::read_to_string(&self.starts)
                .unwrap_or_default()
                .lines()
                .count()
        };
        let before = starts();
        self.d.ok(
            "POST",
            &format!("/v1/sessions/{id}/steps"),
            Some(&json!({"messages": [{"role": "user", "content": "crash"}]})),
        );
        let call = format!("crash{n}");
        let reply = json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": call, "name": "crash", "arguments": {}}]});
        self.d
            .ok("POST", &format!("/v1/sessions/{id}/messages"), Some(&reply));
        self.d.ok(
            "POST",
            &format!("/v1/sessions/{id}/tool-calls/{call}/run"),
            None,
        );
        eventually_within(30, "the crashed MCP server to serve again", || {
            starts() > before && self.d.plugin("mcp:s")["state"] == "loaded"
        });
    }

    /// Compacts the session's first user message into a summary.
    fn compact(&mut self, s: &mut Session) {
        let events = self
            .d
            .ok("GET", &format!("/v1/sessions/{}/events", s.id), None);
        let first = events["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["kind"] == "user/message")
            .map(|e| e["seq"].as_u64().unwrap())
            .unwrap();
        let body = json!({"from": first, "to": first, "summary": "(an earlier task, done)"});
        self.d.ok(
            "POST",
            &format!("/v1/sessions/{}/compact", s.id),
            Some(&body),
        );
        s.compacted = true;
    }

    /// The outcome recorded with each of the session's replies, and the plugin it names.
    fn recorded(&self, id: &str) -> Vec<(String, Option<String>)> {
        let usage = self.d.ok("GET", &format!("/v1/sessions/{id}/usage"), None);
        usage["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let c = &s["cache"];
                (
                    c["outcome"].as_str().unwrap_or("(none)").to_string(),
                    c["plugin"].as_str().map(String::from),
                )
            })
            .collect()
    }
}

/// The ids of the tool calls in an Anthropic or Chat reply.
pub(crate) fn tool_calls(reply: &Value) -> Vec<String> {
    let anthropic = reply["content"].as_array().into_iter().flatten();
    let chat = reply["choices"][0]["message"]["tool_calls"]
        .as_array()
        .into_iter()
        .flatten();
    anthropic
        .filter(|b| b["type"] == "tool_use")
        .chain(chat)
        .map(|b| b["id"].as_str().unwrap().to_string())
        .collect()
}

fn rig(extra: &str) -> Rig {
    let folder = Folder::new()
        .bundled("identity")
        .bundled("persona")
        .bundled("tools")
        .bundled("workspace");
    put(
        folder.path(),
        "versioned",
        &std::fs::read(fixture("versioned_v1")).unwrap(),
    );
    let starts = folder.path().join("mcp-starts");
    let (d, state) = folder.serve(&config(&starts, extra));
    eventually_within(30, "the MCP server to serve", || {
        d.plugin("mcp:s")["state"] == "loaded"
    });
    Rig {
        d,
        stub: Stub::start(),
        folder,
        starts,
        heads: HashMap::new(),
        shared: 0,
        version: 1,
        _state: state,
    }
}

/// The script's 100 Anthropic sessions, in time order, with the plugin swaps and MCP crashes;
/// returns the sessions and how many crashes happened.
fn timeline(rig: &mut Rig) -> (Vec<Session>, u64) {
    let mut draw = Draw(0x9e37_79b9_7f4a_7c15);
    let mut sessions: Vec<Session> = (0..100)
        .map(|i| Session {
            id: rig.d.session(if i % 2 == 0 { "alpha" } else { "beta" }),
            agent: if i % 2 == 0 { "alpha" } else { "beta" },
            version: 1,
            ..Session::default()
        })
        .collect();
    // (time, session, steps left): the timeline, run in time order by one thread.
    let mut queue: BTreeMap<(u64, usize), u64> = (0..100)
        .map(|i| ((i as u64 * 17_000, i), draw.between(4, 7)))
        .collect();
    let mut swaps = vec![10 * MIN_MS, 25 * MIN_MS, 40 * MIN_MS]
        .into_iter()
        .peekable();
    let mut flaps = vec![15 * MIN_MS, 30 * MIN_MS].into_iter().peekable();
    let mut flapped = 0;
    while let Some(((now, i), left)) = queue.pop_first() {
        while swaps.next_if(|&t| t <= now).is_some() {
            rig.swap();
        }
        while flaps.next_if(|&t| t <= now).is_some() {
            flapped += 1;
            rig.flap(flapped);
        }
        let s = &mut sessions[i];
        rig.step(s, now, "anthropic");
        if s.steps == 3 && i % 12 == 5 {
            rig.compact(s);
        }
        if left > 1 {
            let gap = if s.calls.is_empty() {
                draw.idle_gap()
            } else {
                draw.between(1_000, 3_000)
            };
            queue.insert((now + gap, i), left - 1);
        }
    }
    (sessions, flapped)
}

/// The stub's ledger summed: tokens read, written (5 minutes, 1 hour), uncached, and the
/// cost in input-token equivalents at Anthropic's multiples.
fn ledger_totals(stub: &Stub) -> [u64; 5] {
    let rows = stub.get("/stub/ledger")["requests"]
        .as_array()
        .unwrap()
        .clone();
    let sum = |k: &str| rows.iter().map(|r| r[k].as_u64().unwrap_or(0)).sum::<u64>();
    let (read, w5, w1h, uncached) = (
        sum("read"),
        sum("written_5m"),
        sum("written_1h"),
        sum("uncached"),
    );
    let cost = (read as f64 * 0.1 + w5 as f64 * 1.25 + w1h as f64 * 2.0 + uncached as f64) as u64;
    [read, w5, w1h, uncached, cost]
}

/// Issue 30's comparison through the real daemon and the caching stub: the same 100 sessions
/// (with the three swaps of `versioned`) under today's defaults and with `refresh =
/// "boundary"` on the swapped plugin; the held run reads more from the stub's cache and writes
/// less, as the cache model predicts (docs/cache.md), and both runs' totals are printed.
#[test]
fn k7_held_swaps_cost_less_through_the_daemon_and_the_stub() {
    let mut totals = Vec::new();
    for extra in ["", "[plugins.versioned]\nrefresh = \"boundary\"\n"] {
        let mut rig = rig(extra);
        timeline(&mut rig);
        totals.push(ledger_totals(&rig.stub));
    }
    eprintln!("| run | read | written 5m | written 1h | uncached | cost |");
    for (name, [read, w5, w1h, uncached, cost]) in
        ["today", "refresh = boundary"].iter().zip(&totals)
    {
        eprintln!("| {name} | {read} | {w5} | {w1h} | {uncached} | {cost} |");
    }
    let ([read, w5, ..], [held_read, held_w5, ..]) = (totals[0], totals[1]);
    assert!(held_read > read && held_w5 < w5, "{totals:?}");
    assert!(
        totals[1][4] < totals[0][4],
        "the held run costs less: {totals:?}"
    );
}

#[test]
fn k2_a_scripted_workload_of_100_sessions_records_only_outcomes_its_script_caused() {
    let mut rig = rig("");
    let (sessions, flapped) = timeline(&mut rig);
    assert_eq!(flapped, 2, "the timeline reaches both crashes");
    // The OpenAI session: 20 steps 2 s apart on one `prompt_cache_key`, an hour later.
    let mut burst = Session {
        id: rig.d.session("alpha"),
        agent: "alpha",
        version: rig.version,
        ..Session::default()
    };
    for k in 0..20 {
        rig.step(&mut burst, 60 * MIN_MS + k * 2_000, "openai");
    }
    for (k, allowed) in burst.expected.iter_mut().enumerate() {
        *allowed = BTreeSet::from([match k {
            0 => "cold",
            15 => "routing",
            _ => "hit",
        }]);
    }

    let mut tally: BTreeMap<String, u64> = BTreeMap::new();
    let mut wrong = Vec::new();
    for s in sessions.iter().chain([&burst]) {
        let recorded = rig.recorded(&s.id);
        assert_eq!(recorded.len(), s.expected.len(), "session {}", s.id);
        for (n, ((outcome, plugin), allowed)) in recorded.iter().zip(&s.expected).enumerate() {
            *tally.entry(outcome.clone()).or_default() += 1;
            let named = outcome != "prefix_changed" || plugin.as_deref() == Some("versioned");
            if !allowed.contains(outcome.as_str()) || !named {
                wrong.push(format!(
                    "{} ({}) step {}: recorded {outcome} (plugin {plugin:?}), the script allows {allowed:?}",
                    s.id, s.agent, n + 1
                ));
            }
        }
    }
    eprintln!("outcomes: {tally:?}");
    assert!(
        wrong.is_empty(),
        "{} steps:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert_eq!(tally.get("unexplained"), None);
    // The script made every cause it means to test happen.
    for kind in [
        "hit",
        "cold",
        "prefix_changed",
        "ttl_expired",
        "compacted",
        "routing",
    ] {
        assert!(
            tally.get(kind).copied().unwrap_or(0) > 0,
            "no {kind} in {tally:?}"
        );
    }
    assert!(sessions.iter().map(|s| s.steps).sum::<u64>() >= 400);
    // The agents share their head: sessions of one start warm from the other's requests.
    assert!(
        rig.shared > 10,
        "{} first steps warm from the other agent",
        rig.shared
    );

    // The ledger across sessions says the same, priced; /metrics names the plugin.
    let summary = rig.d.ok("GET", "/v1/usage", None);
    let steps: u64 = tally.values().sum();
    assert_eq!(summary["total"]["replies"], steps, "{summary}");
    for (kind, n) in &tally {
        assert_eq!(summary["total"]["outcomes"][kind]["replies"], *n, "{kind}");
    }
    assert!(summary["total"]["plugins"]["versioned"]["lost_tokens"].as_u64() > Some(0));
    assert!(summary["total"]["cost"]["total"].as_f64() > Some(0.0));
    assert!(summary["total"]["outcomes"]["ttl_expired"]["miss_cost"].as_f64() > Some(0.0));
    let alpha = rig.d.ok("GET", "/v1/usage?agent=alpha", None);
    assert_eq!(
        alpha["agents"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["alpha"]
    );
    let (_, metrics) = rig.d.get("/metrics");
    assert!(
        metrics.contains(
            "promptd_cache_lost_tokens_by_plugin_total{agent=\"alpha\",plugin=\"versioned\"}"
        ),
        "{metrics}"
    );
    let hits = tally["hit"];
    assert!(
        metrics.lines().any(|l| l.starts_with("promptd_cache_outcomes_total{agent=\"alpha\",outcome=\"hit\"}")),
        "{metrics}"
    );
    assert!(hits > steps / 2, "most steps hit: {tally:?}");

    // The CLI says the same: `promptd usage` and `promptd session log`.
    let usage = common::ok(&["usage", "--server", &rig.d.url]);
    eprintln!("promptd usage:\n{usage}");
    assert!(
        usage.contains(&format!("all agents: {steps} replies")),
        "{usage}"
    );
    assert!(usage.contains("plugin versioned: "), "{usage}");
    assert!(
        usage
            .lines()
            .any(|l| l.trim_start().starts_with("ttl_expired")),
        "{usage}"
    );
    let expired = sessions
        .iter()
        .find(|s| {
            s.expected
                .iter()
                .any(|a| a.len() == 1 && a.contains("ttl_expired"))
        })
        .expect("a session with a gap past the TTL");
    let log = common::ok(&["session", "log", &expired.id, "--server", &rig.d.url]);
    eprintln!("promptd session log {}:\n{log}", expired.id);
    assert!(log.contains("[cache: ttl_expired, "), "{log}");
    assert!(log.contains("\ncache: "), "{log}");
}

/// The outcome survives a restart: a daemon that starts on the same log judges the next reply
/// against the one recorded before it stopped (nothing is lost with the process).
#[test]
fn k3_the_outcome_baseline_survives_a_restart() {
    let folder = Folder::new()
        .bundled("identity")
        .bundled("persona")
        .bundled("tools")
        .bundled("workspace");
    let starts = folder.path().join("mcp-starts");
    let config = folder.config(&config(&starts, ""));
    let (_tmp, state) = common::daemon::state_dir();
    let stub = Stub::start();
    let d = Served::start(folder.path(), &config, &state);
    eventually_within(30, "the MCP server to serve", || {
        d.plugin("mcp:s")["state"] == "loaded"
    });
    let id = d.session("alpha");
    let mut s = Session {
        id: id.clone(),
        ..Session::default()
    };
    let once = |d: &Served, s: &mut Session, now: u64| {
        let body = json!({"format": "anthropic", "messages": [{"role": "user", "content": format!("t{now}")}]});
        let step = d.ok("POST", &format!("/v1/sessions/{}/steps", s.id), Some(&body));
        let reply = stub.call("/v1/messages", &step["request"], now);
        d.ok(
            "POST",
            &format!("/v1/sessions/{}/messages?sent_at={now}", s.id),
            Some(&reply),
        );
        s.calls = tool_calls(&reply);
        if !s.calls.is_empty() {
            let results: Vec<Value> = s
                .calls
                .iter()
                .map(|c| json!({"role": "tool", "tool_call_id": c, "content": "done"}))
                .collect();
            let step = d.ok(
                "POST",
                &format!("/v1/sessions/{}/steps", s.id),
                Some(&json!({"format": "anthropic", "messages": results})),
            );
            let reply = stub.call("/v1/messages", &step["request"], now + 1_000);
            d.ok(
                "POST",
                &format!("/v1/sessions/{}/messages?sent_at={}", s.id, now + 1_000),
                Some(&reply),
            );
        }
    };
    once(&d, &mut s, 1_000_000);
    d.stop();
    let d = Served::start(folder.path(), &config, &state);
    eventually_within(30, "the MCP server to serve", || {
        d.plugin("mcp:s")["state"] == "loaded"
    });
    once(&d, &mut s, 1_000_000 + 60_000);
    let usage = d.ok("GET", &format!("/v1/sessions/{id}/usage"), None);
    let outcomes: Vec<&str> = usage["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["cache"]["outcome"].as_str().unwrap_or("(none)"))
        .collect();
    assert_eq!(outcomes.first(), Some(&"cold"), "{usage}");
    assert!(
        outcomes[1..].iter().all(|o| *o == "hit"),
        "{outcomes:?}: {usage}"
    );
    let last = usage["steps"].as_array().unwrap().last().unwrap()["cache"].clone();
    assert_eq!(
        last["gap_ms"].as_u64().map(|g| g <= 60_000),
        Some(true),
        "{last}"
    );
}

/// Issue 45: a changed plugin is named in a Chat Completions session as in an Anthropic one,
/// whether it changed a tool (the `versioned` swap) or only a section (a dynamic section whose
/// text is a step fact): the system prompt is the part `system` in both formats, so the
/// ledger, `GET /v1/usage` and `/metrics` count the miss by plugin in both. And a compaction's
/// `lost` is what the previous request left cached that this one did not read, by the
/// provider's own counts.
#[test]
fn k2_k4_a_change_is_named_in_every_format_and_a_compaction_loses_what_was_cached() {
    let mut rig = rig("[plugins.probe]\nconfig = { \"fact_section.variant\" = \"50\" }\n");
    put(
        rig.folder.path(),
        "probe",
        &std::fs::read(fixture("scripted")).unwrap(),
    );
    eventually_within(30, "the probe plugin to serve", || {
        rig.d.plugin("probe")["state"] == "loaded"
    });
    let formats = ["openai", "anthropic"];
    let mut sessions: Vec<Session> = formats
        .iter()
        .map(|_| Session {
            id: rig.d.session("beta"),
            agent: "beta",
            version: rig.version,
            ..Session::default()
        })
        .collect();
    // One step of `s` with the fact `variant` (answering the last reply's tool calls, if it
    // made any), answered by the stub and recorded.
    let step = |rig: &Rig, s: &mut Session, now: u64, format: &str, variant: &str| {
        let body = json!({"format": format, "sent_at": now, "messages": s.next_messages(),
            "facts": {"cwd": "/src/app", "variant": variant}});
        let step = rig
            .d
            .ok("POST", &format!("/v1/sessions/{}/steps", s.id), Some(&body));
        let path = if format == "anthropic" {
            "/v1/messages"
        } else {
            "/v1/chat/completions"
        };
        let reply = rig.stub.call(path, &step["request"], now);
        rig.d.ok(
            "POST",
            &format!("/v1/sessions/{}/messages?sent_at={now}", s.id),
            Some(&reply),
        );
        s.calls = tool_calls(&reply);
        s.steps += 1;
    };
    // Three steps, a section's text changes (step 4), then the `versioned` swap (step 5).
    for k in 0..4 {
        for (s, format) in sessions.iter_mut().zip(formats) {
            step(&rig, s, k * 10_000, format, if k < 3 { "a" } else { "b" });
        }
    }
    rig.swap();
    for (s, format) in sessions.iter_mut().zip(formats) {
        step(&rig, s, 40_000, format, "b");
    }
    for (s, format) in sessions.iter().zip(formats) {
        let usage = rig
            .d
            .ok("GET", &format!("/v1/sessions/{}/usage", s.id), None);
        for (n, part, plugin) in [
            (3, "system", "probe"),
            (4, "tool `versioned_tool`", "versioned"),
        ] {
            let cache = &usage["steps"][n]["cache"];
            assert_eq!(cache["outcome"], "prefix_changed", "{format}: {cache}");
            assert_eq!(cache["part"], part, "{format}: {cache}");
            assert_eq!(cache["plugin"], plugin, "{format}: {cache}");
            assert!(cache["lost"].as_u64() > Some(0), "{format}: {cache}");
            assert_eq!(
                usage["ledger"]["plugins"][plugin]["replies"], 1,
                "{format}: {usage}"
            );
        }
    }
    let summary = rig.d.ok("GET", "/v1/usage?agent=beta", None);
    for plugin in ["probe", "versioned"] {
        assert_eq!(
            summary["agents"]["beta"]["plugins"][plugin]["replies"], 2,
            "one miss per format: {summary}"
        );
    }
    let (_, metrics) = rig.d.get("/metrics");
    assert!(
        metrics
            .contains("promptd_cache_lost_tokens_by_plugin_total{agent=\"beta\",plugin=\"probe\"}"),
        "{metrics}"
    );

    // Compact the Anthropic session's first message; its next reply loses what the previous
    // request left cached (read + written, the stub's own counts) less what this one read.
    let mut s = sessions.pop().unwrap();
    rig.compact(&mut s);
    step(&rig, &mut s, 67_000, "anthropic", "b");
    let rows = rig.stub.get("/stub/ledger")["requests"]
        .as_array()
        .unwrap()
        .clone();
    let (before, now) = (&rows[rows.len() - 2], &rows[rows.len() - 1]);
    let n = |r: &Value, k: &str| r[k].as_u64().unwrap();
    let held = n(before, "read") + n(before, "written_5m") + n(before, "written_1h");
    let usage = rig
        .d
        .ok("GET", &format!("/v1/sessions/{}/usage", s.id), None);
    let cache = &usage["steps"][5]["cache"];
    assert_eq!(cache["outcome"], "compacted", "{cache}");
    assert_eq!(
        cache["lost"],
        held - n(now, "read"),
        "{cache}\n{before}\n{now}"
    );
}

//! Sessions pinned to their plugins (G11, docs/gateway.md): with `[agents.NAME.gateway]
//! pin_plugins = true`, a plugin swapped while a gateway session is warm leaves that session's
//! next request byte-identical, a new session takes the new version at once, and the pinned
//! session moves on once idle past the cache's TTL, or when the operator turns the pin off.
//! Each `gateway/request` names the plugin versions it was built from. Shares the stub of
//! tests/gateway.rs.

use promptd_testkit as common;

use std::time::{Duration, Instant};

use common::daemon::Served;
use common::{eventually, fixture, put, Folder};
use serde_json::{json, Value};

use crate::gateway::{header_of, raw_post, Stub};

/// The cache TTL the test gives Anthropic (the gateway's steps take the shortest TTL).
const TTL_S: u64 = 4;

fn config(stub: &str, pin: bool, versioned: &str) -> String {
    format!(
        r#"
[plugins.identity]
config = {{ name = "Ada", model = "example-model" }}
[plugins.versioned]
config = {{ no_tool = "true" }}
{versioned}

[cache.anthropic]
ttl_s = {TTL_S}

[gateway]
enabled = true
[gateway.upstream.anthropic]
provider = "anthropic"
base_url = "{stub}"

[agents.coder.gateway]
pin_plugins = {pin}
"#
    )
}

fn version(n: u8) -> Vec<u8> {
    std::fs::read(fixture(&format!("versioned_v{n}"))).unwrap()
}

/// Puts version `n` of `versioned` in place and waits until it serves: its sha256.
fn swap_to(d: &Served, folder: &Folder, n: u8) -> String {
    let bytes = version(n);
    put(folder.path(), "versioned", &bytes);
    let sha = {
        use sha2::{Digest, Sha256};
        promptd_daemon::plugin_dir::hex(&Sha256::digest(&bytes))
    };
    eventually("the new version serves", || {
        d.plugin("versioned")["serving_sha256"] == sha.as_str()
    });
    sha
}

/// A client's conversation, kept as an SDK user keeps it.
struct Conversation {
    messages: Vec<Value>,
    session: String,
    /// When its last reply came.
    replied: Instant,
}

impl Conversation {
    fn new() -> Conversation {
        Conversation {
            messages: Vec::new(),
            session: String::new(),
            replied: Instant::now(),
        }
    }

    /// Sends `text` as the next user turn: the upstream body the stub got.
    fn say(&mut self, d: &Served, stub: &Stub, text: &str) -> Value {
        self.messages.push(json!({"role": "user", "content": text}));
        let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 64,
                          "messages": self.messages});
        let (head, reply) = raw_post(
            &d.url,
            "/gateway/coder/v1/messages",
            &[("content-type", "application/json")],
            body.to_string().as_bytes(),
        );
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        self.replied = Instant::now();
        let session = header_of(&head, "x-promptd-session").unwrap().to_string();
        if self.session.is_empty() {
            self.session = session.clone();
        }
        assert_eq!(
            session, self.session,
            "the conversation stays in its session"
        );
        let reply: Value = serde_json::from_slice(&reply).unwrap();
        let text = reply["content"][0]["text"]
            .as_str()
            .unwrap_or("")
            .to_string();
        self.messages
            .push(json!({"role": "assistant", "content": text}));
        let sent = stub.requests().pop().unwrap().2;
        serde_json::from_slice(&sent).unwrap()
    }

    /// The versions its last `gateway/request` names, once the reply is recorded.
    fn built_from(&self, d: &Served) -> Value {
        let mut events = Vec::new();
        eventually("the reply recorded", || {
            events = d.ok(
                "GET",
                &format!("/v1/sessions/{}/events", self.session),
                None,
            )["events"]
                .as_array()
                .unwrap()
                .clone();
            events
                .last()
                .is_some_and(|e| e["kind"] == "assistant/message")
        });
        let request = events.iter().rev().find(|e| e["kind"] == "gateway/request");
        request.unwrap()["body"]["plugins"].clone()
    }
}

fn version_sent(upstream: &Value) -> &'static str {
    let system = upstream["system"].to_string();
    ["version 1", "version 2"]
        .into_iter()
        .find(|v| system.contains(v))
        .unwrap_or("none")
}

/// G11: a pinned session keeps the plugin versions its header was built from while the cache
/// is warm (the next request's system bytes unchanged, the record naming the old version), a
/// new session gets the new version at once, and the pinned session moves on after an idle
/// gap past the TTL, or at once when the operator turns `pin_plugins` off.
#[test]
fn g11_a_pinned_session_keeps_its_plugins_while_warm_and_moves_on_when_cold_or_forced() {
    let stub = Stub::start();
    let folder = Folder::new().bundled("identity");
    put(folder.path(), "versioned", &version(1));
    let config = folder.config(&config(&stub.url, true, ""));
    let (tmp, state) = common::daemon::state_dir();
    let d = Served::start_logged(folder.path(), &config, &state, &tmp.path().join("d.log"));
    let v1 = d.plugin("versioned")["serving_sha256"]
        .as_str()
        .unwrap()
        .to_string();

    let mut a = Conversation::new();
    let first = a.say(&d, &stub, "a1");
    assert_eq!(version_sent(&first), "version 1", "{first}");
    let second = a.say(&d, &stub, "a2");
    assert_eq!(a.built_from(&d)["versioned"], v1.as_str());

    // A new version while the session is warm: its next request is the same bytes.
    let v2 = swap_to(&d, &folder, 2);
    assert!(
        a.replied.elapsed() < Duration::from_secs(TTL_S),
        "still warm"
    );
    let held = a.say(&d, &stub, "a3");
    assert_eq!(
        held["system"].to_string(),
        second["system"].to_string(),
        "the pinned session's sections are the same bytes"
    );
    assert_eq!(version_sent(&held), "version 1");
    assert_eq!(a.built_from(&d)["versioned"], v1.as_str(), "named as built");

    // A new session gets the new version at once.
    let mut b = Conversation::new();
    let fresh = b.say(&d, &stub, "b1");
    assert_eq!(version_sent(&fresh), "version 2", "{fresh}");
    assert_eq!(b.built_from(&d)["versioned"], v2.as_str());

    // Idle past the TTL: the pinned session moves on, and its header says why.
    std::thread::sleep(Duration::from_millis(TTL_S * 1000 + 500));
    let moved = a.say(&d, &stub, "a4");
    assert_eq!(version_sent(&moved), "version 2", "{moved}");
    assert_eq!(a.built_from(&d)["versioned"], v2.as_str());
    let events = d.ok("GET", &format!("/v1/sessions/{}/events", a.session), None);
    let header = (events["events"].as_array().unwrap().iter())
        .rev()
        .find(|e| e["kind"] == "request/header")
        .unwrap()
        .clone();
    let cause = header["body"]["released"]["cause"].as_str().unwrap_or("");
    assert!(cause.starts_with("idle "), "{header}");

    // Pinned again on version 2, then forced: the operator turns the pin off (the config
    // reloads; `refresh = "step"` spelled out so the test sees the reload), and the warm
    // session moves on at its next request.
    swap_to(&d, &folder, 1);
    let pinned = a.say(&d, &stub, "a5");
    assert_eq!(version_sent(&pinned), "version 2", "{pinned}");
    std::fs::write(
        &config,
        self::config(&stub.url, false, "refresh = \"step\""),
    )
    .unwrap();
    eventually("the config reloads", || {
        d.plugin("versioned")["refresh"]["by"] == "config"
    });
    assert!(
        a.replied.elapsed() < Duration::from_secs(TTL_S),
        "still warm: the pin's end moves it, not idleness"
    );
    let forced = a.say(&d, &stub, "a6");
    assert_eq!(version_sent(&forced), "version 1", "{forced}");
    assert_eq!(a.built_from(&d)["versioned"], v1.as_str());
}

//! Gateway keys (G12, docs/gateway.md "Keys, tenants and spend"): a key admits a client to the
//! agents and upstreams it lists, in place of the provider key or beside it; a forged,
//! revoked or other agent's key is refused in the provider's shape; a key past its spend
//! limit gets the provider's 429 with `retry-after`, through the official SDK's typed error;
//! keys rotate without a restart; the spend survives one; and on PostgreSQL two daemons count
//! one spend. Shares the harness of `tests/gateway.rs`.

use promptd_testkit as common;
use promptd_testkit::postgres as pg;

use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::daemon::{state_dir, Served};
use common::Folder;
use promptd_core::gateway::keys::token_sha256;

use crate::gateway::{header_of, newest_session, python, raw_post, records, Stub};
use crate::gateway_edges::{json, MESSAGES};

const TEAM_A: &str = "sk-gw-team-a-0123456789";
const TEAM_A_NEW: &str = "sk-gw-team-a-rotated-9876";
const TEAM_B: &str = "sk-gw-team-b-0123456789";
const TEAM_C: &str = "sk-gw-team-c-0123456789";
const CONFIGURED: &str = "sk-ant-configured-upstream-key";

/// $1 per token, so one reply is far past a $1 limit.
const PRICES: &str = r#"
[pricing."claude-sonnet-4-5"]
input = 1000000.0
output = 1000000.0
"#;

fn config(stub: &str, team_a_tokens: &str, with_b: bool, extra: &str) -> String {
    let b = if with_b {
        format!(
            "[gateway.keys.team-b]\ntoken_sha256 = \"{}\"\nagents = [\"reviewer\"]\n",
            token_sha256(TEAM_B)
        )
    } else {
        String::new()
    };
    format!(
        r#"[gateway]
enabled = true
[gateway.upstream.anthropic]
provider = "anthropic"
base_url = "{stub}"
api_key_env = "PROMPTD_TEST_UPSTREAM_KEY"
[gateway.upstream.openai]
provider = "openai"
base_url = "{stub}"
[gateway.keys.team-a]
token_sha256 = {team_a_tokens}
agents = ["coder"]
usd_per_day = 1.0
{b}
[gateway.keys.team-c]
token_sha256 = "{c}"
[agents.coder.gateway]
[agents.reviewer.gateway]
{PRICES}
{extra}
"#,
        c = token_sha256(TEAM_C),
    )
}

fn start(folder: &Folder, config: &str, state: &std::path::Path, log: &std::path::Path) -> Served {
    let path = folder.config(config);
    Served::start_logged_with_env(
        folder.path(),
        &path,
        state,
        &[("PROMPTD_TEST_UPSTREAM_KEY", CONFIGURED)],
        log,
    )
}

fn messages(served: &Served, headers: &[(&str, &str)]) -> (String, serde_json::Value) {
    let (head, body) = raw_post(
        &served.url,
        "/gateway/coder/v1/messages",
        headers,
        MESSAGES.as_bytes(),
    );
    (head, json(&body))
}

fn status(head: &str) -> u16 {
    head.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The Anthropic SDK's view of one call with `key` as its API key: `ok`, or the typed error's
/// class, status, `retry-after` and message.
fn sdk_call(served: &Served, key: &str) -> String {
    let script = r#"
import sys, anthropic
client = anthropic.Anthropic(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0)
try:
    client.messages.create(model="claude-sonnet-4-5", max_tokens=10,
                           messages=[{"role": "user", "content": "hi"}])
    print("ok")
except anthropic.APIStatusError as e:
    print(type(e).__name__, e.status_code, e.response.headers.get("retry-after"), e.message)
"#;
    let out = Command::new(python())
        .arg("-c")
        .arg(script)
        .arg(format!("{}/gateway/coder", served.url))
        .arg(key)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Seconds to the next UTC midnight, as the daemon's `retry-after` for a day's limit says.
fn to_midnight() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    86_400 - now % 86_400
}

/// G12: without a key, with a forged one, or with another agent's key, a request is refused in
/// Anthropic's shape before anything is read or sent; a key sent as the provider's key is
/// never forwarded (the configured key goes); `x-promptd-key` beside the client's own key
/// leaves that key as it was; the key's name is on each `gateway/request`; once the day's
/// spend is past the limit the SDK gets a `RateLimitError` with `retry-after` to UTC
/// midnight; a rotated token works, the old one and a removed key are refused, all without a
/// restart; and the spend is still there after one.
#[test]
fn g12_keys_admit_refuse_count_spend_and_rotate_without_a_restart() {
    let stub = Stub::start();
    let folder = Folder::new().bundled("identity");
    let (tmp, state) = state_dir();
    let log = tmp.path().join("daemon.log");
    let a_tokens = format!("\"{}\"", token_sha256(TEAM_A));
    let served = start(
        &folder,
        &config(&stub.url, &a_tokens, true, ""),
        &state,
        &log,
    );

    // No key, a forged one, another agent's key.
    let (head, body) = messages(&served, &[]);
    assert_eq!(status(&head), 401, "{head}");
    assert_eq!(header_of(&head, "x-promptd-error"), Some("key_required"));
    assert_eq!(body["error"]["type"], "authentication_error", "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("x-promptd-key"));
    let (head, body) = messages(&served, &[("x-api-key", "sk-forged-key-4242")]);
    assert_eq!(status(&head), 401, "{head}");
    assert_eq!(header_of(&head, "x-promptd-error"), Some("key_invalid"));
    assert!(!body.to_string().contains("sk-forged-key-4242"), "{body}");
    let (head, body) = messages(&served, &[("x-api-key", TEAM_B)]);
    assert_eq!(status(&head), 403, "{head}");
    assert_eq!(header_of(&head, "x-promptd-error"), Some("key_agent"));
    assert_eq!(body["error"]["type"], "permission_error", "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("`team-b`"));
    assert!(
        stub.requests().is_empty(),
        "nothing refused reached the upstream"
    );

    // Admitted, in the provider key's place: the configured key goes upstream instead.
    assert_eq!(sdk_call(&served, TEAM_A), "ok");
    let sent = stub.requests();
    assert_eq!(sent.len(), 1);
    let header = |name: &str| {
        (sent[0].1.iter())
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    assert_eq!(header("x-api-key").as_deref(), Some(CONFIGURED));
    assert!(
        !sent[0].1.iter().any(|(_, v)| v.contains(TEAM_A)),
        "the gateway key never reaches the upstream: {:?}",
        sent[0].1
    );
    let events = newest_session(&served);
    assert_eq!(records(&events)[0].key.as_deref(), Some("team-a"));

    // One reply at $1 a token spent the day's $1: the next request would start past it. The
    // cost is counted just after the reply is recorded, so a request may slip in between.
    let mut tries = 0;
    let (refused, sent_before) = loop {
        let before = stub.requests().len();
        let answer = sdk_call(&served, TEAM_A);
        if answer != "ok" {
            break (answer, before);
        }
        tries += 1;
        assert!(tries < 20, "never refused");
        std::thread::sleep(Duration::from_millis(100));
    };
    let words: Vec<&str> = refused.splitn(4, ' ').collect();
    assert_eq!(&words[..2], ["RateLimitError", "429"], "{refused}");
    let after: u64 = words[2].parse().expect("retry-after in seconds");
    assert!(
        after.abs_diff(to_midnight()) <= 5,
        "{after} vs {}",
        to_midnight()
    );
    assert!(
        words[3].contains("team-a") && words[3].contains("$1.000000 per day"),
        "{refused}"
    );
    assert_eq!(
        stub.requests().len(),
        sent_before,
        "the refused request was not sent"
    );
    // The usage API counts the same replies to the key, at the spend the refusal names.
    let usage: serde_json::Value = serde_json::from_str(
        &common::daemon::request(
            &served.url,
            "GET",
            "/v1/usage?days=1&key=team-a",
            None,
            None,
        )
        .1,
    )
    .unwrap();
    assert_eq!(usage["keys"][0]["key"], "team-a", "{usage}");
    assert_eq!(usage["keys"][0]["replies"], tries + 1, "{usage}");
    let spent = words[3]
        .split("spent $")
        .nth(1)
        .and_then(|t| t.split(',').next())
        .unwrap();
    let spent: f64 = spent.parse().unwrap();
    let cost = usage["keys"][0]["cost"].as_f64().unwrap();
    assert!(
        (cost - spent).abs() < 1e-5,
        "usage {cost} vs the limit's count {spent}"
    );

    // x-promptd-key beside the client's own key (an upstream with no api_key_env): the
    // client's key goes as it came; the same key in the provider's place is refused, since
    // there is nothing to send instead.
    let chat = br#"{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}]}"#;
    let own = [
        ("authorization", "Bearer sk-openai-client-own"),
        ("x-promptd-key", TEAM_C),
    ];
    let (head, _) = raw_post(
        &served.url,
        "/gateway/coder/v1/chat/completions",
        &own,
        chat,
    );
    assert_eq!(status(&head), 200, "{head}");
    let sent = stub.requests();
    let last = &sent.last().unwrap().1;
    assert!(last.iter().any(
        |(k, v)| k.eq_ignore_ascii_case("authorization") && v == "Bearer sk-openai-client-own"
    ));
    assert!(!last
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("x-promptd-key") || v.contains(TEAM_C)));
    let bearer = format!("Bearer {TEAM_C}");
    let (head, body) = raw_post(
        &served.url,
        "/gateway/coder/v1/chat/completions",
        &[("authorization", &bearer)],
        chat,
    );
    assert_eq!(status(&head), 403, "{head}");
    assert_eq!(
        header_of(&head, "x-promptd-error"),
        Some("key_no_upstream_credential")
    );
    assert!(String::from_utf8_lossy(&body).contains("api_key_env"));

    // Rotation and revocation, without a restart: team-a's new token replaces the old one
    // (its spend goes with its name), team-b is removed.
    let rotated = format!("\"{}\"", token_sha256(TEAM_A_NEW));
    folder.config(&config(&stub.url, &rotated, false, ""));
    common::eventually("the rotated config is in force", || {
        status(&messages(&served, &[("x-api-key", TEAM_A)]).0) == 401
    });
    let (head, _) = messages(&served, &[("x-api-key", TEAM_B)]);
    assert_eq!(
        header_of(&head, "x-promptd-error"),
        Some("key_invalid"),
        "{head}"
    );
    let (head, _) = messages(&served, &[("x-api-key", TEAM_A_NEW)]);
    assert_eq!(
        header_of(&head, "x-promptd-error"),
        Some("key_spend_limit"),
        "{head}"
    );

    // The spend is in the store: a restarted daemon still refuses.
    served.stop();
    let served = start(
        &folder,
        &config(&stub.url, &rotated, false, ""),
        &state,
        &log,
    );
    let (head, _) = messages(&served, &[("x-api-key", TEAM_A_NEW)]);
    assert_eq!(
        header_of(&head, "x-promptd-error"),
        Some("key_spend_limit"),
        "{head}"
    );

    // No key reaches the daemon's log.
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    for secret in [TEAM_A, TEAM_A_NEW, TEAM_B, TEAM_C, CONFIGURED] {
        assert!(!text.contains(secret), "the log holds a key");
    }
}

/// G12: `requests_per_minute` admits that many requests in a UTC minute, then answers 429
/// `key_rate_limit` with `retry-after` to the minute's end; a key's conversations are its
/// own: the same messages sent with another key start another session.
#[test]
fn g12_a_rate_limit_and_one_keys_sessions_are_not_anothers() {
    let stub = Stub::start();
    let folder = Folder::new().bundled("identity");
    let (tmp, state) = state_dir();
    let log = tmp.path().join("daemon.log");
    let a_tokens = format!("\"{}\"", token_sha256(TEAM_A));
    let text = config(&stub.url, &a_tokens, true, "")
        .replace("usd_per_day = 1.0\n", "requests_per_minute = 2\n");
    let served = start(&folder, &text, &state, &log);
    // Not at a minute's edge: the three requests fall in one minute.
    let second = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        % 60;
    if second > 50 {
        std::thread::sleep(Duration::from_secs(61 - second));
    }
    let started = Instant::now();
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let (head, _) = messages(&served, &[("x-promptd-key", TEAM_A), ("x-api-key", "own")]);
        assert_eq!(status(&head), 200, "{head}");
        sessions.push(header_of(&head, "x-promptd-session").unwrap().to_string());
    }
    let (head, body) = messages(&served, &[("x-promptd-key", TEAM_A), ("x-api-key", "own")]);
    assert!(started.elapsed() < Duration::from_secs(9));
    assert_eq!(status(&head), 429, "{head}");
    assert_eq!(header_of(&head, "x-promptd-error"), Some("key_rate_limit"));
    assert_eq!(body["error"]["type"], "rate_limit_error");
    let after: u64 = header_of(&head, "retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&after), "{after}");

    // The second request continued nothing of the first's (same opening message, new
    // session); team-c's identical request does not join team-a's sessions, and team-a's
    // session named by header is not team-c's to use.
    let (head, _) = messages(&served, &[("x-promptd-key", TEAM_C), ("x-api-key", "own")]);
    assert_eq!(status(&head), 200, "{head}");
    let c_session = header_of(&head, "x-promptd-session").unwrap().to_string();
    assert!(!sessions.contains(&c_session));
    let (head, _) = messages(
        &served,
        &[
            ("x-promptd-key", TEAM_C),
            ("x-api-key", "own"),
            ("x-promptd-session", &sessions[0]),
        ],
    );
    assert_eq!(status(&head), 404, "{head}");
    assert_eq!(header_of(&head, "x-promptd-error"), Some("unknown_session"));
}

fn pg_server() -> &'static pg::Server {
    static SERVER: OnceLock<pg::Server> = OnceLock::new();
    SERVER.get_or_init(pg::Server::start)
}

/// G12 on PostgreSQL: two daemons on one database count one spend, so a key past its limit
/// on one daemon is refused by the other too.
#[test]
fn g12_two_daemons_on_postgresql_hold_one_spend_limit() {
    let stub = Stub::start();
    let url = pg_server().database();
    let a_tokens = format!("\"{}\"", token_sha256(TEAM_A));
    let text = format!(
        "{}\n[store]\nurl_env = \"PROMPTD_TEST_DATABASE_URL\"\n",
        config(&stub.url, &a_tokens, false, "")
    );
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let folder = Folder::new().bundled("identity");
        let (tmp, state) = state_dir();
        let path = folder.config(&text);
        let log = tmp.path().join("daemon.log");
        let served = Served::start_logged_with_env(
            folder.path(),
            &path,
            &state,
            &[
                ("PROMPTD_TEST_UPSTREAM_KEY", CONFIGURED),
                ("PROMPTD_TEST_DATABASE_URL", url.as_str()),
            ],
            &log,
        );
        nodes.push((served, folder, tmp));
    }
    let (a, b) = (&nodes[0].0, &nodes[1].0);
    // b admits the key and reads its spend (none yet) for a request it then refuses for its
    // body: b has spent nothing of its own.
    let (head, _) = raw_post(
        &b.url,
        "/gateway/coder/v1/messages",
        &[("x-api-key", TEAM_A)],
        b"{}",
    );
    assert_eq!(status(&head), 400, "{head}");
    // a spends past the limit.
    let (head, _) = messages(a, &[("x-api-key", TEAM_A)]);
    assert_eq!(status(&head), 200, "{head}");
    // b refuses once it reads the shared count (within its 1 s refresh), and so does a.
    for (name, node) in [("b", b), ("a", a)] {
        let started = Instant::now();
        let refused = loop {
            let (head, _) = messages(node, &[("x-api-key", TEAM_A)]);
            if status(&head) == 429 {
                break head;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{name} never refused: {head}"
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(
            header_of(&refused, "x-promptd-error"),
            Some("key_spend_limit"),
            "{name}"
        );
    }
    // Only a's request and the ones b let through before its refresh reached the upstream;
    // none after either refused.
    let sent = stub.requests().len();
    let (head, _) = messages(b, &[("x-api-key", TEAM_A)]);
    assert_eq!(status(&head), 429, "{head}");
    assert_eq!(stub.requests().len(), sent);
}

/// A gateway to the stub for agent `coder`, with no key configured.
fn keyless_config(folder: &Folder, stub: &Stub) -> std::path::PathBuf {
    folder.config(&format!(
        "[gateway]\nenabled = true\n[gateway.upstream.anthropic]\nprovider = \"anthropic\"\nbase_url = \"{}\"\n[agents.coder.gateway]\n",
        stub.url
    ))
}

/// G12: a daemon listening beyond loopback serves gateway traffic only with a key: with none
/// configured every gateway request is refused (401 `key_required`, naming why), the admin
/// token is no gateway key, and it keeps guarding the admin routes.
#[test]
fn g12_a_daemon_listening_beyond_loopback_refuses_gateway_traffic_without_a_key() {
    let stub = Stub::start();
    let folder = Folder::new().bundled("identity");
    let (_tmp, state) = state_dir();
    let path = keyless_config(&folder, &stub);
    let served = Served::start_with(
        folder.path(),
        &path,
        &state,
        &["--listen", "0.0.0.0:0"],
        &[("PROMPTD_TOKEN", "admin-token-77")],
    );
    let (head, body) = messages(&served, &[("x-api-key", "sk-ant-client-own")]);
    assert_eq!(status(&head), 401, "{head}");
    assert_eq!(header_of(&head, "x-promptd-error"), Some("key_invalid"));
    assert!(!body.to_string().contains("sk-ant-client-own"));
    let (head, body) = messages(&served, &[]);
    assert_eq!(status(&head), 401, "{head}");
    assert_eq!(header_of(&head, "x-promptd-error"), Some("key_required"));
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("beyond loopback"),
        "{body}"
    );
    // Without a key nothing of the config is told: an agent that does not exist is a 401 too,
    // not the 404 that lists the agents served.
    let (head, body) = raw_post(
        &served.url,
        "/gateway/nobody/v1/messages",
        &[],
        MESSAGES.as_bytes(),
    );
    assert_eq!(status(&head), 401, "{head}");
    assert!(!String::from_utf8_lossy(&body).contains("coder"));
    let (head, _) = messages(&served, &[("authorization", "Bearer admin-token-77")]);
    assert_eq!(
        header_of(&head, "x-promptd-error"),
        Some("key_invalid"),
        "{head}"
    );
    assert!(stub.requests().is_empty());
    let (code, _) = common::daemon::request(&served.url, "GET", "/v1/sessions", None, None);
    assert_eq!(code, 401, "the admin routes still want the token");
    let (code, _) = common::daemon::request(
        &served.url,
        "GET",
        "/v1/sessions",
        None,
        Some("admin-token-77"),
    );
    assert_eq!(code, 200);
}

/// G12: on loopback with no key configured the gateway is open, and a key sent as
/// `x-promptd-key` is still checked.
#[test]
fn g12_on_loopback_without_keys_the_gateway_is_open_but_a_sent_key_is_checked() {
    let stub = Stub::start();
    let folder = Folder::new().bundled("identity");
    let (_tmp, state) = state_dir();
    let path = keyless_config(&folder, &stub);
    let served = Served::start(folder.path(), &path, &state);
    let (head, _) = messages(&served, &[("x-api-key", "sk-ant-client-own")]);
    assert_eq!(status(&head), 200, "{head}");
    let (head, _) = messages(
        &served,
        &[
            ("x-api-key", "sk-ant-client-own"),
            ("x-promptd-key", "sk-gw-unknown"),
        ],
    );
    assert_eq!(status(&head), 401, "{head}");
    assert_eq!(header_of(&head, "x-promptd-error"), Some("key_invalid"));
    assert_eq!(stub.requests().len(), 1);
}

//! `GET /v1/usage`'s day buckets (K12) over real records: a real `promptd serve` with prices,
//! steps and replies sent through its API on three UTC days (`sent_at`), a plugin swap between
//! two of them, so the log holds a cold start, expired TTLs, a prefix a plugin broke and a hit. The
//! fixture is shared with the inspector's usage page test (`tests/inspector.rs`, K13). The API
//! test then sends a request through the gateway (to the provider stub): its reply counts too,
//! under the keyless `null` key, as every gateway reply no key served.

use promptd_testkit as common;

use common::daemon::Served;
use common::{eventually, fixture, put, Folder};
use serde_json::{json, Value};

const DAY_MS: u64 = 86_400_000;
const MIN_MS: u64 = 60_000;

pub(crate) const CONFIG: &str = r#"
[model]
max_tokens = 1024
[model.anthropic]
model = "claude-sonnet-4-5"

[agents.coder]

[plugins.identity]
config = { name = "Ada", model = "example-model" }

# Its tool is not for the gateway's agent, which serves no plugin tools.
[plugins.versioned]
scope = "coder"

# A model without a price: the inspector's usage page test records a reply of it.
[agents.haiku]
model = { model = "claude-haiku-4-5" }

[pricing."claude-sonnet-4-5"]
input = 3.0
output = 15.0
"#;

/// The daemon and what the fixture made.
pub(crate) struct Fixture {
    pub(crate) d: Served,
    pub(crate) _state: tempfile::TempDir,
    pub(crate) _folder: Folder,
    pub(crate) _stub: crate::gateway::Stub,
    /// The coder's three-day session, the coder's session of today, the default agent's.
    pub(crate) sessions: [String; 3],
    /// The first day, `YYYY-MM-DD`; the other two follow it.
    pub(crate) first_day: String,
}

pub(crate) fn step(d: &Served, id: &str, at: u64, text: &str) {
    let body = json!({"messages": [{"role": "user", "content": text}], "format": "anthropic",
                      "sent_at": at});
    d.ok("POST", &format!("/v1/sessions/{id}/steps"), Some(&body));
}

/// A reply as Anthropic reports it: `read` tokens read from the cache, `written` written.
pub(crate) fn reply(d: &Served, id: &str, at: u64, read: u64, written: u64, output: u64) -> Value {
    let body = json!({"role": "assistant", "content": "Done.",
        "usage": {"input_tokens": 12, "cache_read_input_tokens": read,
                  "cache_creation_input_tokens": written, "output_tokens": output}});
    d.ok(
        "POST",
        &format!("/v1/sessions/{id}/messages?format=anthropic&sent_at={at}"),
        Some(&body),
    )
}

/// Three sessions over the two days before today and today (UTC, 01:00–03:00 of each, so a
/// run near midnight still counts them in a window ending today).
pub(crate) fn recorded() -> Fixture {
    let folder = Folder::new().bundled("identity");
    let v1 = std::fs::read(fixture("versioned_v1")).unwrap();
    let v2 = std::fs::read(fixture("versioned_v2")).unwrap();
    put(folder.path(), "versioned", &v1);
    // A provider stub behind the gateway: a gateway step's record reads like any other.
    let stub = crate::gateway::Stub::start();
    let (d, state) = folder.serve(&format!(
        "{CONFIG}\n[gateway]\nenabled = true\n[gateway.upstream.anthropic]\nprovider = \"anthropic\"\nbase_url = \"{}\"\n[agents.gw.gateway]\n",
        stub.url
    ));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let today = now / DAY_MS * DAY_MS;
    let (day0, day1) = (
        today - 2 * DAY_MS + 60 * MIN_MS,
        today - DAY_MS + 60 * MIN_MS,
    );
    let day2 = today + 60 * MIN_MS;

    let coder = d.session("coder");
    step(&d, &coder, day0, "Start.");
    reply(&d, &coder, day0, 0, 3000, 40); // cold
    step(&d, &coder, day1, "A day later.");
    reply(&d, &coder, day1, 0, 3100, 30); // ttl_expired
    let before = d.plugin("versioned")["sha256"].clone();
    put(folder.path(), "versioned", &v2);
    eventually("versioned v2 to serve", || {
        let p = d.plugin("versioned");
        p["sha256"] != before && p["state"] == "loaded"
    });
    step(&d, &coder, day1 + MIN_MS, "After the swap.");
    reply(&d, &coder, day1 + MIN_MS, 0, 3200, 50); // prefix_changed by `versioned`

    let today_session = d.session("coder");
    step(&d, &today_session, day2, "Today.");
    reply(&d, &today_session, day2, 0, 3000, 10);
    // A minute later: what the first request wrote is read back.
    step(&d, &today_session, day2 + MIN_MS, "And again.");
    reply(&d, &today_session, day2 + MIN_MS, 3000, 200, 10); // hit

    let other = d.session("default");
    step(&d, &other, day1 + 60 * MIN_MS, "Hello.");
    reply(&d, &other, day1 + 60 * MIN_MS, 0, 2000, 20);
    step(&d, &other, day2 + 60 * MIN_MS, "Again.");
    reply(&d, &other, day2 + 60 * MIN_MS, 0, 2100, 20);

    let first_day = d.ok("GET", "/v1/usage?days=3", None)["window"]["from"]
        .as_str()
        .unwrap()
        .to_string();
    Fixture {
        d,
        _state: state,
        _folder: folder,
        _stub: stub,
        sessions: [coder, today_session, other],
        first_day,
    }
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn k12_usage_is_bucketed_by_utc_day_agent_and_key_from_real_records() {
    let fx = recorded();
    let d = &fx.d;
    let [coder, today, other] = &fx.sessions;
    let u = d.ok("GET", "/v1/usage?days=3", None);
    let days = u["days"].as_array().unwrap();
    assert_eq!(days.len(), 3, "{u}");
    assert_eq!(u["window"]["days"], 3);
    assert_eq!(days[0]["day"], fx.first_day.as_str());
    let replies: Vec<u64> = days
        .iter()
        .map(|b| b["replies"].as_u64().unwrap())
        .collect();
    assert_eq!(replies, [1, 3, 3], "{u}");
    // Day 1: the coder's expired TTL and the swap the `versioned` plugin broke, the default
    // agent's first reply.
    let d1 = &days[1];
    assert_eq!(d1["outcomes"]["ttl_expired"]["replies"], 1, "{d1}");
    assert_eq!(d1["outcomes"]["prefix_changed"]["replies"], 1, "{d1}");
    assert_eq!(d1["plugins"]["versioned"]["replies"], 1, "{d1}");
    assert!(f(&d1["plugins"]["versioned"]["miss_cost"]) > 0.0, "{d1}");
    assert_eq!(d1["by_agent"]["coder"]["replies"], 2);
    assert_eq!(d1["by_agent"]["default"]["replies"], 1);
    assert_eq!(days[0]["outcomes"]["cold"]["replies"], 1);
    // Today: a hit read the 3000 tokens its session wrote a minute before.
    let d2 = &days[2];
    assert_eq!(d2["outcomes"]["hit"]["replies"], 1, "{d2}");
    assert_eq!(d2["cached_tokens"], 3000);
    let share = 3000.0 / f(&d2["input_tokens"]);
    assert!((f(&d2["cached_share"]) - share).abs() < 1e-12, "{d2}");
    assert_eq!(days[1]["cached_share"], 0.0);
    // No gateway key served these: one keyless entry a day, and in total.
    assert_eq!(d1["by_key"], json!([d1["by_key"][0].clone()]));
    assert_eq!(d1["by_key"][0]["key"], Value::Null);
    assert_eq!(d1["by_key"][0]["replies"], 3);
    assert_eq!(u["keys"][0]["key"], Value::Null);
    assert_eq!(u["keys"][0]["replies"], 7);
    // Day 0's cost is the cold write at its price: 3000 × 3.75 + 12 × 3 + 40 × 15 per million.
    let cost0 = f(&days[0]["cost"]["total"]);
    assert!((cost0 - (3000.0 * 3.75 + 12.0 * 3.0 + 40.0 * 15.0) / 1e6).abs() < 1e-12);
    // The buckets add up to the window's total, and to each agent's.
    let by_day: f64 = days.iter().map(|b| f(&b["cost"]["total"])).sum();
    assert!(
        (by_day - f(&u["total"]["cost"]["total"])).abs() < 1e-12,
        "{u}"
    );
    let coder_days: f64 = days
        .iter()
        .filter_map(|b| b["by_agent"]["coder"]["cost"].as_f64())
        .sum();
    assert!((coder_days - f(&u["agents"]["coder"]["cost"]["total"])).abs() < 1e-12);
    // The top sessions: the coder's three-day session costs most; its costliest step is the
    // one after the swap (the largest write, the most output).
    let top = u["top_sessions"].as_array().unwrap();
    let ids: Vec<&str> = top.iter().map(|s| s["session"].as_str().unwrap()).collect();
    assert_eq!(ids[0], coder.as_str(), "{u}");
    assert_eq!(top[0]["top_step"], 3);
    assert_eq!(top.len(), 3);
    assert!(ids.contains(&today.as_str()) && ids.contains(&other.as_str()));

    // The CLI prints the same days, key and top session.
    let printed = common::ok(&["usage", "--server", &d.url, "--days", "3"]);
    for d in days {
        let line = format!(
            "  {}  {:>6} replies",
            d["day"].as_str().unwrap(),
            d["replies"].as_u64().unwrap()
        );
        assert!(printed.contains(&line), "`{line}` in {printed}");
        let spend = format!("spend ${:.4}", f(&d["cost"]["total"]));
        assert!(
            printed
                .lines()
                .any(|l| l.starts_with(&line) && l.contains(&spend)),
            "{spend} in {printed}"
        );
    }
    assert!(printed.contains("key (no key): 7 replies"), "{printed}");
    assert!(
        printed.contains(&format!("top: session {coder} (agent coder)")),
        "{printed}"
    );

    // Filters: an agent, a window of one day by dates, a key nobody used, the top one.
    let one = d.ok(
        "GET",
        &format!("/v1/usage?from={0}&to={0}&agent=default", fx.first_day),
        None,
    );
    assert_eq!(one["days"][0]["replies"], 0, "{one}");
    assert_eq!(one["total"]["replies"], 0);
    let keyed = d.ok("GET", "/v1/usage?days=3&key=ci", None);
    assert_eq!(keyed["total"]["replies"], 0, "{keyed}");
    assert_eq!(keyed["key"], "ci");
    assert_eq!(keyed["top_sessions"], json!([]));
    let first = d.ok("GET", "/v1/usage?top=1", None);
    assert_eq!(first["top_sessions"].as_array().map(Vec::len), Some(1));
    assert_eq!(first["window"], Value::Null);
    assert_eq!(first["days"], json!([]));
    assert_eq!(
        first["total"]["replies"], 7,
        "without a window, every reply"
    );

    // A request through the gateway: its reply counts today, with no key (none served it).
    let before = d.ok("GET", "/v1/usage?days=1", None);
    let body = r#"{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"Count me."}]}"#;
    let (head, _) =
        crate::gateway::raw_post(&d.url, "/gateway/gw/v1/messages", &[], body.as_bytes());
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let gateway_session = crate::gateway::header_of(&head, "x-promptd-session")
        .unwrap()
        .to_string();
    let events = crate::gateway::newest_session(d);
    assert!(
        events.iter().any(|e| e["kind"] == "gateway/request"),
        "{events:?}"
    );
    let after = d.ok("GET", "/v1/usage?days=1", None);
    assert_eq!(
        after["total"]["replies"].as_u64(),
        before["total"]["replies"].as_u64().map(|n| n + 1),
        "{after}"
    );
    assert_eq!(after["keys"].as_array().map(Vec::len), Some(1), "{after}");
    assert_eq!(after["keys"][0]["key"], Value::Null);
    assert_eq!(after["days"][0]["by_key"][0]["key"], Value::Null);
    let listed = after["top_sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["session"] == gateway_session.as_str())
        .unwrap_or_else(|| panic!("{gateway_session} not among {after}"));
    assert_eq!(
        (listed["agent"].as_str(), listed["top_step"].as_u64()),
        (Some("gw"), Some(1))
    );

    // Bad windows and filters are refused, naming the parameter.
    for (query, code, names) in [
        ("days=0", "invalid_window", "366"),
        ("days=367", "invalid_window", "367"),
        ("from=2026-12-05&to=2026-12-04", "invalid_window", "`to`"),
        ("days=3&from=2026-12-01", "invalid_window", "`days`"),
        ("from=2026-02-30", "invalid_date", "`from`"),
        ("to=soon", "invalid_date", "`to`"),
        ("top=0", "invalid_top", "`top`"),
        ("key=", "invalid_filter", "`key`"),
        ("agent=", "invalid_filter", "`agent`"),
    ] {
        let (status, body) = d.get(&format!("/v1/usage?{query}"));
        assert_eq!(status, 400, "{query}: {body}");
        let e: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(e["error"]["code"], code, "{query}: {body}");
        let message = e["error"]["message"].as_str().unwrap();
        assert!(message.contains(names), "{query}: {message}");
    }
}

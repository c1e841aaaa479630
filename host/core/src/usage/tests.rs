use super::*;
use crate::cache::outcome::{Kind, Outcome};
use crate::cache::price::{Cost, Price};
use crate::cache::RulesConfig;
use crate::formats::replies::ProviderUsage;
use crate::formats::Format;
use crate::ledger::Pricing;
use crate::store::{Event, EventKind, BODY_VERSION};

/// 2026-12-04 00:00 UTC.
const DEC4: u64 = 1_796_342_400_000;
const HOUR: u64 = 3_600_000;

fn usage(input: u64, cached: u64, output: u64) -> ProviderUsage {
    ProviderUsage {
        input_tokens: Some(input),
        cached_tokens: Some(cached),
        output_tokens: Some(output),
        ..ProviderUsage::default()
    }
}

fn outcome(kind: Kind, plugin: Option<&str>, lost: u64, at: u64) -> Outcome {
    Outcome {
        outcome: kind,
        format: Format::Anthropic,
        model: "claude-sonnet-4-5".into(),
        sent_at_ms: at,
        expected_read: 0,
        lost,
        gap_ms: None,
        part: None,
        plugin: plugin.map(String::from),
        cause: None,
    }
}

fn reply(
    step: u64,
    at: u64,
    key: Option<&str>,
    total: f64,
    miss: f64,
    o: Option<Outcome>,
) -> PricedReply {
    PricedReply {
        step,
        at_ms: at,
        key: key.map(String::from),
        usage: usage(1000, 600, 10),
        outcome: o,
        cost: Some(Cost {
            total,
            miss,
            ..Cost::default()
        }),
    }
}

fn window(from: &str, to: &str) -> Window {
    Window::resolve(Some(from), Some(to), None, Day(0))
        .unwrap()
        .unwrap()
}

#[test]
fn k12_days_are_utc_dates_read_and_written_as_yyyy_mm_dd() {
    for (text, day) in [
        ("1970-01-01", 0),
        ("2000-03-01", 11_017),
        ("2024-02-29", 19_782),
    ] {
        let d = Day::parse("from", text).unwrap();
        assert_eq!(d, Day(day), "{text}");
        assert_eq!(d.to_string(), text);
    }
    assert_eq!(Day::of_ms(DEC4).to_string(), "2026-12-04");
    assert_eq!(Day::of_ms(DEC4 - 1).to_string(), "2026-12-03");
    // Every day of four centuries prints as the date it parses from.
    for n in (0..146_097).step_by(37) {
        let d = Day(n);
        assert_eq!(Day::parse("to", &d.to_string()), Ok(d));
    }
    for bad in [
        "2026-02-29",
        "2026-13-01",
        "2026-1-01",
        "",
        "1969-12-31",
        "2026-12-0x",
        "2026-12-04T00",
    ] {
        let e = Day::parse("from", bad).unwrap_err();
        assert_eq!(e.code(), "invalid_date", "{bad}");
        assert!(e.to_string().contains("`from`"), "{e}");
    }
}

#[test]
fn k12_a_window_is_whole_utc_days_and_bounded() {
    let today = Day::of_ms(DEC4 + 5 * HOUR);
    assert_eq!(Window::resolve(None, None, None, today), Ok(None));
    let w = Window::resolve(None, None, Some(7), today)
        .unwrap()
        .unwrap();
    assert_eq!(
        (w.from.to_string(), w.to.to_string(), w.days),
        ("2026-11-28".into(), "2026-12-04".into(), 7)
    );
    // One end given: `to` defaults to today, `from` to 30 days ending at `to`.
    let w = Window::resolve(Some("2026-12-01"), None, None, today)
        .unwrap()
        .unwrap();
    assert_eq!(
        (w.from, w.to, w.days),
        (Day::parse("f", "2026-12-01").unwrap(), today, 4)
    );
    let w = Window::resolve(None, Some("2026-01-30"), None, today)
        .unwrap()
        .unwrap();
    assert_eq!(
        (w.from.to_string(), w.days),
        ("2026-01-01".into(), DEFAULT_DAYS)
    );
    assert!(w.holds(Day::parse("f", "2026-01-30").unwrap().start_ms() + 86_399_999));
    assert!(!w.holds(Day::parse("f", "2026-01-31").unwrap().start_ms()));
    for (from, to, days, code) in [
        (
            Some("2026-12-05"),
            Some("2026-12-04"),
            None,
            "invalid_window",
        ),
        (
            Some("2024-01-01"),
            Some("2026-01-01"),
            None,
            "invalid_window",
        ),
        (None, None, Some(0), "invalid_window"),
        (None, None, Some(MAX_DAYS + 1), "invalid_window"),
        (Some("2026-12-01"), None, Some(3), "invalid_window"),
        (Some("yesterday"), None, None, "invalid_date"),
    ] {
        let e = Window::resolve(from, to, days, today).unwrap_err();
        assert_eq!(e.code(), code, "{from:?} {to:?} {days:?}: {e}");
    }
    assert_eq!(
        Window::resolve(None, None, Some(MAX_DAYS), today)
            .unwrap()
            .unwrap()
            .days,
        MAX_DAYS
    );
    assert_eq!(
        Query::new(None, None, None, Some(0)).unwrap_err().code(),
        "invalid_top"
    );
    assert_eq!(
        Query::new(None, None, None, Some(MAX_TOP + 1))
            .unwrap_err()
            .code(),
        "invalid_top"
    );
    assert_eq!(
        Query::new(None, None, Some(String::new()), None)
            .unwrap_err()
            .code(),
        "invalid_filter"
    );
    assert_eq!(Query::new(None, None, None, None).unwrap().top, DEFAULT_TOP);
}

#[test]
fn k12_replies_are_summed_per_utc_day_by_agent_and_key_with_misses_by_cause_and_plugin() {
    let w = window("2026-12-03", "2026-12-05");
    let mut usage = Usage::new(Query::new(Some(w), None, None, None).unwrap());
    let day3 = DEC4 - 2 * HOUR; // 2026-12-03 22:00
    let day4 = DEC4 + HOUR;
    usage.add_session(
        "s1",
        "coder",
        &[
            reply(
                1,
                day3,
                Some("ci"),
                0.5,
                0.0,
                Some(outcome(Kind::Cold, None, 0, day3)),
            ),
            reply(
                2,
                day4,
                Some("ci"),
                0.25,
                0.1,
                Some(outcome(Kind::PrefixChanged, Some("skills"), 400, day4)),
            ),
            reply(
                3,
                day4 + HOUR,
                None,
                0.125,
                0.05,
                Some(outcome(Kind::TtlExpired, None, 300, day4 + HOUR)),
            ),
            // Outside the window: counted nowhere.
            reply(4, DEC4 - 3 * 86_400_000, None, 9.0, 0.0, None),
        ],
    );
    usage.add_session("s2", "reviewer", &[reply(1, day4, None, 1.0, 0.0, None)]);
    let r = usage.finish();
    assert_eq!(r.window, Some(w));
    let days: Vec<String> = r.days.iter().map(|d| d.day.to_string()).collect();
    assert_eq!(days, ["2026-12-03", "2026-12-04", "2026-12-05"]);
    let (d3, d4, d5) = (&r.days[0], &r.days[1], &r.days[2]);
    assert_eq!(d3.start_ms, DEC4 - 86_400_000);
    assert_eq!(
        (d3.ledger.replies, d4.ledger.replies, d5.ledger.replies),
        (1, 3, 0)
    );
    assert_eq!(d4.ledger.cached_share, Some(0.6));
    assert_eq!(d5.ledger.cached_share, None, "an empty day has no share");
    assert_eq!(d4.ledger.cost.map(|c| c.total), Some(1.375));
    assert_eq!(d4.by_agent["coder"].cost, 0.375);
    assert_eq!(d4.by_agent["reviewer"].cost, 1.0);
    assert_eq!(d4.by_agent["coder"].miss_cost, 0.15000000000000002);
    // The keyless first, then by name; each with what it spent that day.
    let keys: Vec<(Option<&str>, u64, f64)> = d4
        .by_key
        .iter()
        .map(|k| (k.key.as_deref(), k.spend.replies, k.spend.cost))
        .collect();
    assert_eq!(keys, [(None, 2, 1.125), (Some("ci"), 1, 0.25)]);
    assert_eq!(d4.ledger.outcomes["prefix_changed"].lost_tokens, 400);
    assert_eq!(d4.ledger.outcomes["ttl_expired"].miss_cost, 0.05);
    assert_eq!(d4.ledger.plugins["skills"].miss_cost, 0.1);
    assert!(d3.ledger.plugins.is_empty());
    // The window's totals: the same replies, by agent and by key.
    assert_eq!(r.summary.total.replies, 4);
    assert_eq!(r.summary.agents["coder"].replies, 3);
    let keys: Vec<(Option<&str>, u64)> = r
        .keys
        .iter()
        .map(|k| (k.key.as_deref(), k.spend.replies))
        .collect();
    assert_eq!(keys, [(None, 2), (Some("ci"), 2)]);
    // The day buckets add up to the total.
    let by_day: f64 = r
        .days
        .iter()
        .filter_map(|d| d.ledger.cost.map(|c| c.total))
        .sum();
    assert_eq!(by_day, r.summary.total.cost.unwrap().total);
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["days"][1]["day"], "2026-12-04");
    assert_eq!(json["days"][1]["by_key"][0]["key"], serde_json::Value::Null);
    assert_eq!(json["days"][1]["by_key"][1]["cost"], 0.25);
    assert_eq!(json["window"]["from"], "2026-12-03");
    assert!(
        json["total"]["outcomes"].is_object() && json["agents"].is_object(),
        "{json}"
    );
}

#[test]
fn k12_the_top_sessions_are_the_most_expensive_with_their_costliest_step() {
    let mut usage = Usage::new(Query::new(None, None, None, Some(2)).unwrap());
    usage.add_session("cheap", "a", &[reply(1, DEC4, None, 0.1, 0.0, None)]);
    usage.add_session(
        "dear",
        "a",
        &[
            reply(1, DEC4, None, 0.5, 0.0, None),
            reply(2, DEC4, None, 2.0, 0.0, None),
            reply(3, DEC4, None, 2.0, 0.0, None),
        ],
    );
    usage.add_session("middle", "b", &[reply(1, DEC4, None, 1.0, 0.2, None)]);
    usage.add_session("silent", "b", &[]);
    let r = usage.finish();
    let top: Vec<(&str, f64, u64, f64)> = r
        .top_sessions
        .iter()
        .map(|s| {
            (
                s.session.as_str(),
                s.spend.cost,
                s.top_step,
                s.top_step_cost,
            )
        })
        .collect();
    assert_eq!(top, [("dear", 4.5, 2, 2.0), ("middle", 1.0, 1, 1.0)]);
    assert_eq!(r.top_sessions[1].spend.miss_cost, 0.2);
    assert_eq!(r.summary.sessions, 4, "every session read is counted");
    assert!(
        r.days.is_empty() && r.window.is_none(),
        "no window, no buckets"
    );
}

#[test]
fn k12_the_key_and_since_filters_keep_only_their_replies() {
    let q = Query::new(None, Some(DEC4), Some("ci".into()), None).unwrap();
    let mut usage = Usage::new(q);
    usage.add_session(
        "s",
        "coder",
        &[
            reply(1, DEC4 - 1, Some("ci"), 1.0, 0.0, None),
            reply(2, DEC4, Some("ci"), 0.5, 0.0, None),
            reply(3, DEC4, Some("other"), 0.25, 0.0, None),
            reply(4, DEC4, None, 0.125, 0.0, None),
        ],
    );
    let r = usage.finish();
    assert_eq!(r.summary.total.replies, 1);
    assert_eq!(r.key.as_deref(), Some("ci"));
    assert_eq!(r.keys.len(), 1);
    assert_eq!(r.top_sessions[0].top_step, 2);
}

fn event(seq: u64, kind: EventKind, body: &serde_json::Value) -> Event {
    Event {
        seq,
        kind,
        version: BODY_VERSION,
        body: body.to_string(),
        at_ms: DEC4,
    }
}

#[test]
fn k12_each_reply_carries_the_key_its_steps_gateway_request_names() {
    let prices = BTreeMap::from([(
        "claude-sonnet-4-5".to_string(),
        Price {
            input: 3.0,
            output: 15.0,
            ..Price::default()
        },
    )]);
    let rules = RulesConfig::default();
    let pricing = Pricing {
        prices: &prices,
        rules: &rules,
    };
    let cache = serde_json::to_value(outcome(Kind::Hit, None, 0, DEC4 + HOUR)).unwrap();
    let reply_body = serde_json::json!({"role": "assistant", "content": "ok",
        "usage": {"input_tokens": 100, "cached_tokens": 40, "output_tokens": 5}, "cache": cache});
    let gateway = |key: Option<&str>| {
        let mut body = serde_json::json!({"ingress": "messages", "upstream": "anthropic",
            "joined_by": "new", "client_body": "{}", "splice": {"edits": []},
            "messages": 1, "digest": "d", "new_from": 0});
        if let Some(k) = key {
            body["key"] = k.into();
        }
        body
    };
    let events = [
        event(1, EventKind::Step, &serde_json::json!({"step": 1})),
        event(2, EventKind::GatewayRequest, &gateway(Some("team-a"))),
        event(3, EventKind::AssistantMessage, &reply_body),
        event(4, EventKind::Step, &serde_json::json!({"step": 2})),
        event(5, EventKind::GatewayRequest, &gateway(None)),
        event(6, EventKind::AssistantMessage, &reply_body),
        // Step 3 answered without a usage (not counted) and a second reply answering no step
        // (not counted either); then step 4 through the body API (no gateway/request: no key).
        event(7, EventKind::Step, &serde_json::json!({"step": 3})),
        event(
            8,
            EventKind::AssistantMessage,
            &serde_json::json!({"role": "assistant", "content": "no usage"}),
        ),
        event(9, EventKind::AssistantMessage, &reply_body),
        event(10, EventKind::Step, &serde_json::json!({"step": 4})),
        event(11, EventKind::AssistantMessage, &reply_body),
    ];
    let replies = crate::session::priced_replies("s", &events, pricing).unwrap();
    let seen: Vec<(u64, Option<&str>, u64)> = replies
        .iter()
        .map(|r| (r.step, r.key.as_deref(), r.at_ms))
        .collect();
    assert_eq!(
        seen,
        [
            (1, Some("team-a"), DEC4 + HOUR),
            (2, None, DEC4 + HOUR),
            (4, None, DEC4 + HOUR)
        ]
    );
    let cost = replies[0].cost.unwrap();
    assert!(
        (cost.total - (60.0 * 3.0 + 40.0 * 0.3 + 5.0 * 15.0) / 1e6).abs() < 1e-15,
        "{cost:?}"
    );
    // The same replies the session's ledger counts.
    let report = crate::session::priced_usage_report("s", &events, pricing, None).unwrap();
    assert_eq!(report.ledger.replies, replies.len() as u64);
    // A gateway body that is not JSON is the store's corruption, named.
    let mut broken = events.to_vec();
    broken[1].body = "{".into();
    let e = crate::session::priced_replies("s", &broken, pricing).unwrap_err();
    assert!(e.to_string().contains("gateway/request"), "{e}");
}

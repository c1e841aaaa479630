//! What a gateway key costs a request (G12; issue 49's target: under 10 µs each): the key
//! check and the spend check, the pure work the gateway's door does per request.
//!
//! Run: `cargo bench -p promptd --bench gateway_keys` (criterion). Environment:
//! `GATEWAY_KEYS` (1 000 keys configured).
//!
//! Method: an index of `GATEWAY_KEYS` keys, each with agents, upstreams and every limit.
//! `key_check`: the key a request's headers present (`x-api-key`, looked up among 12
//! headers by a linear scan, a little slower than the daemon's `HeaderMap`), found by its SHA-256, and held to its
//! agents and upstreams. `spend_check`: the UTC periods of now, and the key's counts judged
//! against its rate and spend limits and the request counted (the count current, as it is
//! but for a key's first request of a day; that read is the store's, measured by the gateway
//! bench). The daemon adds one uncontended mutex per check around the counts.

use std::collections::BTreeMap;
use std::time::Duration;

use criterion::Criterion;
use promptd_core::gateway::keys::{self, Counts, KeyConfig, KeyIndex, Periods};
use promptd_core::gateway::Provider;

fn main() {
    let n: usize = std::env::var("GATEWAY_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let keys: BTreeMap<String, KeyConfig> = (0..n)
        .map(|i| {
            let key = serde_json::json!({
                "token_sha256": keys::token_sha256(&format!("sk-gw-{i:06}-0123456789abcdef")),
                "agents": ["coder", "reviewer"],
                "upstreams": ["anthropic"],
                "requests_per_minute": 1_000_000,
                "usd_per_day": 1_000_000.0,
                "usd_per_month": 1_000_000.0,
            });
            (
                format!("key-{i}"),
                serde_json::from_value(key).expect("a key"),
            )
        })
        .collect();
    let index = KeyIndex::new(&keys);
    let headers = [
        ("host", "127.0.0.1:7070"),
        ("accept", "application/json"),
        ("anthropic-version", "2023-06-01"),
        ("content-type", "application/json"),
        ("user-agent", "Anthropic/Python 0.75.0"),
        ("x-stainless-lang", "python"),
        ("x-stainless-package-version", "0.75.0"),
        ("x-stainless-os", "Linux"),
        ("x-stainless-arch", "x64"),
        ("x-stainless-runtime", "CPython"),
        ("x-stainless-retry-count", "0"),
        ("x-api-key", "sk-gw-000500-0123456789abcdef"),
    ];
    let header = |name: &str| headers.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
    let check = || {
        let presented = keys::presented(Provider::Anthropic, &header).expect("a key");
        let (name, key) = index.find(presented.token).expect("found");
        key.allows("coder", "anthropic").expect("allowed");
        name.len()
    };
    assert_eq!(check(), "key-500".len());
    let key = index.get("key-500").expect("a key");
    let mut counts = Counts::default();
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    };
    let periods = Periods::at(now());
    counts.read("key-500", &periods, Some(&[1_000, 1_000]), now());

    let mut c = Criterion::default()
        .sample_size(50)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    c.bench_function("key_check", |b| b.iter(check));
    c.bench_function("spend_check", |b| {
        b.iter(|| {
            let periods = Periods::at(now());
            counts.admit(key, "key-500", &periods).is_ok()
        })
    });
    c.final_summary();
}

//! The CLI client: `promptd session …`, `promptd plugins`, `promptd replay` and `plugin check --against` against a running daemon.

use std::collections::BTreeMap;

use anyhow::{bail, Context};
use serde_json::{json, Value};

/// Where `promptd serve` listens by default.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8417";

#[derive(clap::Args)]
pub struct Server {
    /// The daemon's URL.
    #[arg(
        long,
        env = "PROMPTD_URL",
        default_value = "http://127.0.0.1:8417",
        global = true
    )]
    server: String,
}

impl Server {
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.server.trim_end_matches('/'));
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let token = std::env::var("PROMPTD_TOKEN")
            .ok()
            .filter(|t| !t.is_empty());
        let auth = token.map(|t| format!("Bearer {t}"));
        let response = match (method, body) {
            ("GET", _) => {
                let mut req = agent.get(&url);
                if let Some(a) = &auth {
                    req = req.header("Authorization", a);
                }
                req.call()
            }
            (_, body) => {
                let mut req = agent.post(&url).header("Content-Type", "application/json");
                if let Some(a) = &auth {
                    req = req.header("Authorization", a);
                }
                req.send(body.unwrap_or(json!({})).to_string())
            }
        };
        let mut response =
            response.with_context(|| format!("cannot reach the daemon at {}", self.server))?;
        let status = response.status();
        let text = response
            .body_mut()
            .read_to_string()
            .context("read the daemon's reply")?;
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if !status.is_success() {
            let code = value["error"]["code"].as_str().unwrap_or("http");
            let message = value["error"]["message"].as_str().unwrap_or("");
            bail!(ClientError(format!(
                "error[{code}]: {message} (HTTP {status})"
            )));
        }
        Ok(value)
    }

    pub fn create_session(&self, agent: &str) -> anyhow::Result<()> {
        let v = self.call("POST", "/v1/sessions", Some(json!({"agent": agent})))?;
        println!("{}", v["id"].as_str().unwrap_or_default());
        Ok(())
    }

    pub fn step(
        &self,
        id: &str,
        user: Option<String>,
        facts: &BTreeMap<String, String>,
        format: &str,
    ) -> anyhow::Result<()> {
        let messages: Vec<Value> = user
            .into_iter()
            .map(|u| json!({"role": "user", "content": u}))
            .collect();
        let body = json!({"messages": messages, "facts": facts, "format": format});
        let v = self.call("POST", &format!("/v1/sessions/{id}/steps"), Some(body))?;
        println!("{}", serde_json::to_string_pretty(&v)?);
        Ok(())
    }

    pub fn log(&self, id: &str) -> anyhow::Result<()> {
        let v = self.call("GET", &format!("/v1/sessions/{id}/events"), None)?;
        for e in v["events"].as_array().into_iter().flatten() {
            // One line per event; a step's measurement is said in words before its body.
            let u = &e["body"]["usage"];
            let usage = if e["kind"] == "assistant/message" && u.is_object() {
                // What the provider reported for a reply (formats.md, recording replies).
                let n = |k: &str| u[k].as_u64().unwrap_or(0);
                format!(
                    "[reported: {} input ({} from cache, {} written), {} output] ",
                    n("input_tokens"),
                    n("cached_tokens"),
                    n("cache_write_tokens"),
                    n("output_tokens")
                )
            } else if e["kind"] == "step" && u.is_object() {
                let window = u["window"]
                    .as_u64()
                    .map_or("no window".to_string(), |w| format!("window {w}"));
                format!(
                    "[usage: {} tokens ({}), {window}, reserve {}: tools {}, system {}, messages {} ({})] ",
                    u["total"]["tokens"],
                    u["tokenizer"].as_str().unwrap_or(""),
                    u["reserve"],
                    u["tools"]["tokens"],
                    u["system"]["tokens"],
                    u["messages"]["tokens"],
                    u["message_count"],
                )
            } else {
                String::new()
            };
            let cache = if e["body"]["cache"].is_object() {
                format!("[cache: {}] ", describe_outcome(&e["body"]["cache"]))
            } else {
                String::new()
            };
            println!(
                "{:>4}  {:<18} {usage}{cache}{}",
                e["seq"],
                e["kind"].as_str().unwrap_or(""),
                e["body"]
            );
        }
        let events = v["events"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| {
                let kind: promptd_core::store::EventKind = e["kind"].as_str()?.parse().ok()?;
                Some((kind, &e["body"]))
            });
        let (kept, compared) = promptd_core::prefix::prefix_kept_share(events);
        if compared > 0 {
            println!(
                "prefix kept: {kept} of {compared} steps ({:.0}%) sent all of the previous request first",
                100.0 * kept as f64 / compared as f64
            );
        }
        let usage = self.call("GET", &format!("/v1/sessions/{id}/usage"), None)?;
        if usage["ledger"]["replies"].as_u64().unwrap_or(0) > 0 {
            print_ledger("cache", &usage["ledger"]);
        }
        Ok(())
    }

    /// The cost ledger across sessions (`GET /v1/usage`), as a table or as JSON.
    pub fn usage(
        &self,
        agent: Option<&str>,
        since: Option<&str>,
        days: Option<u64>,
        key: Option<&str>,
        json: bool,
    ) -> anyhow::Result<()> {
        let mut query = Vec::new();
        if let Some(a) = agent {
            query.push(format!("agent={}", percent(a)));
        }
        if let Some(s) = since {
            query.push(format!("since={}", since_ms(s)?));
        }
        if let Some(n) = days {
            query.push(format!("days={n}"));
        }
        if let Some(k) = key {
            query.push(format!("key={}", percent(k)));
        }
        let path = if query.is_empty() {
            "/v1/usage".to_string()
        } else {
            format!("/v1/usage?{}", query.join("&"))
        };
        let v = self.call("GET", &path, None)?;
        if json {
            println!("{}", serde_json::to_string_pretty(&v)?);
            return Ok(());
        }
        println!(
            "{} sessions, {} replies{}",
            v["sessions"],
            v["total"]["replies"],
            since.map_or(String::new(), |s| format!(" since {s}"))
        );
        print_ledger("all agents", &v["total"]);
        for (agent, ledger) in v["agents"].as_object().into_iter().flatten() {
            print_ledger(&format!("agent {agent}"), ledger);
        }
        print_buckets(&v);
        Ok(())
    }

    /// The session's steps, from its log (for "the last step" when none is named).
    fn last_step(&self, id: &str) -> anyhow::Result<u64> {
        let v = self.call("GET", &format!("/v1/sessions/{id}/events"), None)?;
        let steps = v["events"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["kind"] == "step")
            .count() as u64;
        if steps == 0 {
            bail!("session {id} has no step yet");
        }
        Ok(steps)
    }

    /// Step N (default: the last) against the step before: the prefix a provider's cache can
    /// reuse, where it broke and why.
    pub fn diff(&self, id: &str, n: Option<u64>, format: &str) -> anyhow::Result<()> {
        let n = match n {
            Some(n) => n,
            None => self.last_step(id)?,
        };
        let d = self.call(
            "GET",
            &format!("/v1/sessions/{id}/steps/{n}/diff?format={format}"),
            None,
        )?;
        let paint = Paint::stdout();
        let bytes = d["bytes"].as_u64().unwrap_or(0);
        let share = |shared: u64| 100.0 * shared as f64 / bytes.max(1) as f64;
        println!(
            "{}",
            paint.bold(&format!(
                "step {n} of session {id} ({format}), {bytes} bytes"
            ))
        );
        for (what, a) in [
            ("step", &d["previous"]),
            ("same header as step", &d["same_header"]),
        ] {
            if !a.is_object() {
                continue;
            }
            let shared = a["shared_bytes"].as_u64().unwrap_or(0);
            let kept = if a["prefix_kept"] == true {
                paint.green("prefix kept")
            } else {
                paint.red("prefix broken")
            };
            println!(
                "  against {what} {}: {shared} bytes shared ({:.1}%), {kept}",
                a["step"],
                share(shared)
            );
            if let Some(part) = a["first_divergence"]["part"].as_str() {
                println!(
                    "    first difference: {part}, at byte {}",
                    a["first_divergence"]["offset"]
                );
            }
        }
        for cause in d["causes"].as_array().into_iter().flatten() {
            println!("  cause: {}", paint.yellow(cause.as_str().unwrap_or("")));
        }
        for note in d["notes"].as_array().into_iter().flatten() {
            println!("  note: {}", note.as_str().unwrap_or(""));
        }
        let c = &d["cached_share"];
        let tokens = match c["tokens"].as_object() {
            Some(t) => format!(
                "; {} of {} tokens ({})",
                t["shared"],
                t["total"],
                t["tokenizer"].as_str().unwrap_or("")
            ),
            None => String::new(),
        };
        println!(
            "  cached share: {:.1}% of bytes{tokens}",
            100.0 * c["bytes"].as_f64().unwrap_or(0.0)
        );
        Ok(())
    }

    /// Step N's request (default: the last) with the plugin and scope of every part.
    pub fn show(&self, id: &str, n: Option<u64>, format: &str) -> anyhow::Result<()> {
        let n = match n {
            Some(n) => n,
            None => self.last_step(id)?,
        };
        let v = self.call(
            "GET",
            &format!("/v1/sessions/{id}/steps/{n}/explain?format={format}"),
            None,
        )?;
        let paint = Paint::stdout();
        println!(
            "{}",
            paint.bold(&format!("step {n} of session {id} ({format})"))
        );
        let p = &v["provenance"];
        if p.is_object() {
            let sha = |plugin: &str| -> String {
                p["plugins"][plugin]
                    .as_str()
                    .unwrap_or("")
                    .chars()
                    .take(12)
                    .collect()
            };
            for kind in ["sections", "contexts", "variables", "tools"] {
                let list = p[kind].as_array().cloned().unwrap_or_default();
                if list.is_empty() {
                    continue;
                }
                println!("{}", paint.bold(kind));
                for g in list {
                    let plugin = g["plugin"].as_str().unwrap_or("");
                    println!(
                        "  {:<24} {} {}  scope {}",
                        g["name"].as_str().unwrap_or(""),
                        paint.cyan(&format!("plugin {plugin}")),
                        sha(plugin),
                        g["scope"].as_str().unwrap_or("")
                    );
                }
            }
        } else {
            println!("(no provenance recorded: a step written before 0.2)");
        }
        println!("{}", paint.bold("request"));
        println!("{}", serde_json::to_string_pretty(&v["request"])?);
        Ok(())
    }

    pub fn plugins(&self) -> anyhow::Result<()> {
        let v = self.call("GET", "/v1/plugins", None)?;
        for p in v["plugins"].as_array().into_iter().flatten() {
            let error = p["last_error"]["message"].as_str().unwrap_or("");
            let sha: String = p["sha256"]
                .as_str()
                .unwrap_or("")
                .chars()
                .take(12)
                .collect();
            let refresh = &p["refresh"];
            let intent = match refresh["mode"].as_str() {
                Some(mode) => {
                    let deferred = refresh["defer"]["tools"].as_array().map_or(0, Vec::len);
                    let defer = match (refresh["defer"]["all"].as_bool(), deferred) {
                        (Some(true), _) => format!(
                            ", every tool deferred ({})",
                            refresh["defer"]["by"].as_str().unwrap_or("")
                        ),
                        (_, 0) => String::new(),
                        (_, n) => format!(
                            ", {n} tool(s) deferred ({})",
                            refresh["defer"]["by"].as_str().unwrap_or("")
                        ),
                    };
                    format!(
                        "refresh {mode} ({}){defer}",
                        refresh["by"].as_str().unwrap_or("default")
                    )
                }
                None => String::new(),
            };
            println!(
                "{:<16} {:<8} {sha}  {intent}  {error}",
                p["id"].as_str().unwrap_or(""),
                p["state"].as_str().unwrap_or(""),
            );
        }
        Ok(())
    }
}

/// What `promptd replay` and `promptd plugin check --against` ask the daemon to replay.
#[derive(Default)]
pub struct Replay {
    pub sessions: Vec<String>,
    pub agent: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub since: Option<u64>,
    pub limit: Option<u64>,
    pub plugins: Option<std::path::PathBuf>,
    pub swap: Vec<std::path::PathBuf>,
    pub config: Option<std::path::PathBuf>,
    pub format: Option<String>,
    pub json: bool,
}

/// `--since`: milliseconds since the Unix epoch, or a duration ago (`45s`, `30m`, `2h`,
/// `1d`).
pub fn since_ms(text: &str) -> anyhow::Result<u64> {
    since_at(text, now_ms())
}

/// [`since_ms`] with `now` given.
fn since_at(text: &str, now: u64) -> anyhow::Result<u64> {
    let bad = || crate::error::CliError::BadArgument {
        flag: "--since",
        value: text.to_string(),
        expected: "expected milliseconds since the epoch or a duration such as 30m, 2h, 1d".into(),
    };
    if let Ok(ms) = text.parse::<u64>() {
        return Ok(ms);
    }
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (n, unit) = text.split_at(split);
    let n: u64 = n.parse().map_err(|_| bad())?;
    let unit_ms: u64 = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad().into()),
    };
    Ok(now.saturating_sub(n.saturating_mul(unit_ms)))
}

impl Server {
    /// Replays sessions with a candidate and prints the report: a table per session (or the
    /// JSON with `json`).
    pub fn replay(&self, r: &Replay) -> anyhow::Result<()> {
        let path = |p: &std::path::Path| Value::String(p.display().to_string());
        let mut body = serde_json::Map::new();
        if !r.sessions.is_empty() {
            body.insert("sessions".into(), json!(r.sessions));
        }
        if let Some(a) = &r.agent {
            body.insert("agent".into(), json!(a));
        }
        if let Some(t) = r.since {
            body.insert("since".into(), json!(t));
        }
        if let Some(l) = r.limit {
            body.insert("limit".into(), json!(l));
        }
        if let Some(p) = &r.plugins {
            body.insert("plugins".into(), path(p));
        }
        if !r.swap.is_empty() {
            body.insert(
                "swap".into(),
                Value::Array(r.swap.iter().map(|p| path(p)).collect()),
            );
        }
        if let Some(c) = &r.config {
            body.insert("config".into(), path(c));
        }
        if let Some(f) = &r.format {
            body.insert("format".into(), json!(f));
        }
        let v = self.call("POST", "/v1/replay", Some(Value::Object(body)))?;
        if r.json {
            println!("{}", serde_json::to_string_pretty(&v)?);
            return Ok(());
        }
        print!("{}", replay_table(&v, &Paint::stdout()));
        Ok(())
    }
}

/// A replay report as text: the candidate, a table per session, the totals.
pub fn replay_table(v: &Value, paint: &Paint) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let c = &v["candidate"];
    let config = c["config"].as_str().unwrap_or("the daemon's config");
    let _ = writeln!(
        out,
        "candidate: {} ({} plugins), {config}",
        c["plugins"].as_str().unwrap_or(""),
        c["loaded"].as_array().map_or(0, Vec::len)
    );
    let sessions = v["sessions"].as_array().cloned().unwrap_or_default();
    for s in &sessions {
        let t = &s["totals"];
        let _ = writeln!(
            out,
            "\n{}",
            paint.bold(&format!(
                "session {} (agent {}, {}): {} steps, {} differ, {} failed",
                s["session"].as_str().unwrap_or(""),
                s["agent"].as_str().unwrap_or(""),
                s["format"].as_str().unwrap_or(""),
                t["steps"],
                t["differing_steps"],
                t["failed_steps"]
            ))
        );
        let _ = writeln!(
            out,
            "{:>4}  {:<7}  {:>8}  {:>28}  {:>10}  {:>29}  {:>10}",
            "step",
            "differs",
            "Δ tokens",
            "recorded read/written/missed",
            "cost",
            "candidate read/written/missed",
            "cost"
        );
        for step in s["steps"].as_array().into_iter().flatten() {
            let differs = if step["differs"] == true {
                paint.red("yes    ")
            } else {
                paint.green("no     ")
            };
            let _ = writeln!(
                out,
                "{:>4}  {differs}  {:>8}  {:>28}  {:>10}  {:>29}  {:>10}",
                step["step"].as_u64().unwrap_or(0),
                signed(&step["tokens"]["delta"]),
                cache_figures(&step["recorded"]),
                dollars(&step["recorded"]["cost"]),
                cache_figures(&step["candidate"]),
                dollars(&step["candidate"]["cost"]),
            );
            if let Some(e) = step["error"].as_object() {
                let _ = writeln!(
                    out,
                    "        {}",
                    paint.red(&format!(
                        "cannot plan: error[{}]: {} (the recorded step stands in)",
                        e["code"].as_str().unwrap_or(""),
                        e["message"].as_str().unwrap_or("")
                    ))
                );
            }
            let d = &step["first_difference"];
            if d.is_object() {
                let plugin = d["plugin"]
                    .as_str()
                    .map_or(String::new(), |p| format!(" (plugin `{p}`)"));
                let _ = writeln!(
                    out,
                    "        first difference: {} at byte {}{plugin}: {}",
                    d["part"].as_str().unwrap_or(""),
                    d["offset"],
                    paint.yellow(d["cause"].as_str().unwrap_or(""))
                );
            }
        }
        out.push_str(&totals_line(t));
    }
    if sessions.len() != 1 {
        let _ = write!(out, "\nall {} sessions: ", sessions.len());
        out.push_str(&totals_line(&v["totals"]));
    }
    out
}

fn totals_line(t: &Value) -> String {
    let cost = match (
        t["recorded"]["cost"].as_f64(),
        t["candidate"]["cost"].as_f64(),
    ) {
        (Some(r), Some(c)) => format!(
            "; cost {} recorded, {} candidate ({}{})",
            dollars(&json!(r)),
            dollars(&json!(c)),
            if c >= r { "+" } else { "-" },
            dollars(&json!((c - r).abs()))
        ),
        _ => "; not priced (no [pricing] for the model)".into(),
    };
    format!(
        "totals: {} steps, {} differ, {} failed; input tokens {} recorded, {} candidate ({}){cost}\n",
        t["steps"],
        t["differing_steps"],
        t["failed_steps"],
        t["tokens_recorded"],
        t["tokens_candidate"],
        signed(&t["tokens_delta"]),
    )
}

fn cache_figures(f: &Value) -> String {
    let n = |k: &str| f[k].as_u64().unwrap_or(0);
    format!(
        "{}/{}/{}",
        n("read"),
        n("written") + n("written_1h"),
        n("uncached")
    )
}

fn dollars(v: &Value) -> String {
    v.as_f64().map_or("-".into(), |c| format!("${c:.6}"))
}

fn signed(v: &Value) -> String {
    match v.as_i64() {
        Some(n) if n > 0 => format!("+{n}"),
        Some(n) => n.to_string(),
        None => "-".into(),
    }
}

/// A daemon error, already formatted as `error[CODE]: …`.
#[derive(Debug)]
pub struct ClientError(pub String);

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ClientError {}

/// ANSI colours when stdout is a terminal, plain text otherwise (pipes, files, tests).
pub struct Paint(bool);

impl Paint {
    pub fn stdout() -> Self {
        use std::io::IsTerminal;
        Paint(std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none())
    }

    fn wrap(&self, code: &str, text: &str) -> String {
        if self.0 {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }

    fn bold(&self, text: &str) -> String {
        self.wrap("1", text)
    }
    fn red(&self, text: &str) -> String {
        self.wrap("31", text)
    }
    fn green(&self, text: &str) -> String {
        self.wrap("32", text)
    }
    fn yellow(&self, text: &str) -> String {
        self.wrap("33", text)
    }
    fn cyan(&self, text: &str) -> String {
        self.wrap("36", text)
    }
}

/// A recorded cache outcome in words: `ttl_expired, read 0 of 4,800 expected, lost 4,800
/// tokens, after 7m12s idle`.
pub fn describe_outcome(c: &Value) -> String {
    let mut out = c["outcome"].as_str().unwrap_or("?").to_string();
    out += &format!(", expected to read {}", c["expected_read"]);
    if let Some(lost) = c["lost"].as_u64().filter(|l| *l > 0) {
        out += &format!(", lost {lost} tokens");
    }
    if let Some(gap) = c["gap_ms"].as_u64() {
        out += &format!(", {} after the previous", duration(gap));
    }
    if let Some(part) = c["part"].as_str() {
        out += &format!(", at {part}");
    }
    if let Some(plugin) = c["plugin"].as_str() {
        out += &format!(" (plugin `{plugin}`)");
    }
    if let Some(cause) = c["cause"].as_str() {
        out += &format!(": {cause}");
    }
    out
}

/// `7m12s`, `1h03m`, `850ms`.
fn duration(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0 => format!("{ms}ms"),
        1..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// A ledger (`replies`, tokens, `outcomes`, `plugins`, `cost`) as indented lines.
/// `GET /v1/usage`'s day buckets (with a window), spend per gateway key and top sessions.
fn print_buckets(v: &Value) {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let dollars = |v: &Value| v.as_f64().map_or("-".to_string(), |d| format!("${d:.4}"));
    let share = |v: &Value| {
        v.as_f64()
            .map_or("-".to_string(), |s| format!("{:.1}%", 100.0 * s))
    };
    let days = v["days"].as_array().map_or(&[][..], Vec::as_slice);
    if !days.is_empty() {
        println!("by day (UTC):");
    }
    for d in days {
        println!(
            "  {}  {:>6} replies  {:>10} input tokens  {:>6} from cache  spend {}  misses {}",
            d["day"].as_str().unwrap_or(""),
            n(&d["replies"]),
            n(&d["input_tokens"]),
            share(&d["cached_share"]),
            dollars(&d["cost"]["total"]),
            dollars(&d["cost"]["miss"]),
        );
    }
    for k in v["keys"].as_array().into_iter().flatten() {
        let name = k["key"].as_str().unwrap_or("(no key)");
        println!(
            "key {name}: {} replies, spend {}, misses {}",
            n(&k["replies"]),
            dollars(&k["cost"]),
            dollars(&k["miss_cost"]),
        );
    }
    for t in v["top_sessions"].as_array().into_iter().flatten() {
        println!(
            "top: session {} (agent {}): spend {}, costliest step {} ({})",
            t["session"].as_str().unwrap_or(""),
            t["agent"].as_str().unwrap_or(""),
            dollars(&t["cost"]),
            n(&t["top_step"]),
            dollars(&t["top_step_cost"]),
        );
    }
}

fn print_ledger(title: &str, l: &Value) {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let share = l["cached_share"].as_f64().map_or(String::new(), |s| {
        format!(" ({:.1}% from cache)", 100.0 * s)
    });
    println!(
        "{title}: {} replies, {} input tokens, {} read from cache{share}, {} written, {} output",
        n(&l["replies"]),
        n(&l["input_tokens"]),
        n(&l["cached_tokens"]),
        n(&l["cache_write_tokens"]),
        n(&l["output_tokens"]),
    );
    let dollars = |v: &Value| v.as_f64().map_or("-".to_string(), |d| format!("${d:.4}"));
    // Per outcome and per plugin alike: replies, tokens lost, what the misses cost.
    let totals = |t: &Value| {
        (
            n(&t["replies"]),
            n(&t["lost_tokens"]),
            dollars(&t["miss_cost"]),
        )
    };
    for (kind, t) in l["outcomes"].as_object().into_iter().flatten() {
        let (replies, lost, miss) = totals(t);
        println!("  {kind:<15} {replies:>6} replies  {lost:>10} tokens lost  miss cost {miss}");
    }
    for (plugin, t) in l["plugins"].as_object().into_iter().flatten() {
        let (replies, lost, miss) = totals(t);
        println!(
            "  plugin {plugin}: {replies} prefix changes, {lost} tokens lost, miss cost {miss}"
        );
    }
    if l["cost"].is_object() {
        let c = &l["cost"];
        println!(
            "  cost {}: input {}, cache reads {}, cache writes {}, output {}; misses added {}",
            dollars(&c["total"]),
            dollars(&c["input"]),
            dollars(&c["cache_read"]),
            dollars(&c["cache_write"]),
            dollars(&c["output"]),
            dollars(&c["miss"]),
        );
    }
    let unpriced: Vec<&str> = l["unpriced_models"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !unpriced.is_empty() {
        println!("  no [pricing] for {}: tokens only", unpriced.join(", "));
    }
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `text` percent-encoded for a query value.
fn percent(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod since_tests {
    use super::since_at;

    #[test]
    fn since_takes_epoch_milliseconds_or_a_duration_ago() {
        assert_eq!(since_at("1700000000000", 0).unwrap(), 1_700_000_000_000);
        assert_eq!(since_at("30m", 3_600_000).unwrap(), 1_800_000);
        assert_eq!(since_at("2d", 86_400_000).unwrap(), 0);
        let e = since_at("yesterday", 0).unwrap_err().to_string();
        assert!(e.contains("yesterday") && e.contains("--since"), "{e}");
    }
}

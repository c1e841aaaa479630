//! The CLI client: `promptd session …` and `promptd plugins` against a running daemon.

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
            let usage = if u.is_object() {
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
            println!(
                "{:>4}  {:<18} {usage}{}",
                e["seq"],
                e["kind"].as_str().unwrap_or(""),
                e["body"]
            );
        }
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
            println!(
                "{:<16} {:<8} {sha}  {error}",
                p["id"].as_str().unwrap_or(""),
                p["state"].as_str().unwrap_or(""),
            );
        }
        Ok(())
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

//! A real `promptd serve` process for tests, and a small HTTP client.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

/// A running `promptd serve`, killed when dropped.
pub struct Served {
    /// The daemon's process.
    pub child: Child,
    /// Where it listens: `http://127.0.0.1:PORT`, or `unix:PATH`.
    pub url: String,
}

impl Served {
    /// Starts `promptd serve` on a free loopback port and waits until it listens.
    pub fn start(plugins: &Path, config: &Path, state: &Path) -> Served {
        Self::start_with(plugins, config, state, &[], &[])
    }

    /// Starts and returns as soon as the daemon listens, before its plugins are loaded.
    pub fn start_unready(plugins: &Path, config: &Path, state: &Path) -> Served {
        Self::launch(plugins, config, state, &[], &[], Stdio::null())
    }

    /// [`Served::start`] with `extra` arguments and `env` variables.
    pub fn start_with(
        plugins: &Path,
        config: &Path,
        state: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Served {
        Self::spawn(plugins, config, state, extra, env, Stdio::null())
    }

    /// Starts with the daemon's log (stderr, at info) written to `log`.
    pub fn start_logged(plugins: &Path, config: &Path, state: &Path, log: &Path) -> Served {
        Self::start_with_logged(plugins, config, state, &[], log)
    }

    /// [`Served::start_with`] `extra` arguments, with the log written to `log` as in
    /// [`Served::start_logged`].
    pub fn start_with_logged(
        plugins: &Path,
        config: &Path,
        state: &Path,
        extra: &[&str],
        log: &Path,
    ) -> Served {
        let file = std::fs::File::create(log).expect("log file");
        Self::spawn(
            plugins,
            config,
            state,
            extra,
            &[("PROMPTD_LOG", "info")],
            file.into(),
        )
    }

    /// [`Served::start_logged`] with `env` variables too.
    pub fn start_logged_with_env(
        plugins: &Path,
        config: &Path,
        state: &Path,
        env: &[(&str, &str)],
        log: &Path,
    ) -> Served {
        let file = std::fs::File::create(log).expect("log file");
        let mut env = env.to_vec();
        env.push(("PROMPTD_LOG", "debug"));
        Self::spawn(plugins, config, state, &[], &env, file.into())
    }

    fn spawn(
        plugins: &Path,
        config: &Path,
        state: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
        stderr: Stdio,
    ) -> Served {
        let served = Self::launch(plugins, config, state, extra, env, stderr);
        served.wait_ready();
        served
    }

    fn launch(
        plugins: &Path,
        config: &Path,
        state: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
        stderr: Stdio,
    ) -> Served {
        let mut cmd = Command::new(super::promptd_bin());
        cmd.arg("serve")
            .arg("--plugins")
            .arg(plugins)
            .arg("--config")
            .arg(config)
            .arg("--state")
            .arg(state)
            .args(extra);
        if !extra.contains(&"--listen") {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start promptd serve");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read the listen line");
        let url = line
            .trim()
            .strip_prefix("promptd listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
            .to_string();
        Served { child, url }
    }

    /// The daemon listens before its plugins are loaded; tests start from a loaded one.
    fn wait_ready(&self) {
        super::eventually_within(180, "the daemon to finish loading its plugins", || {
            self.health()["status"] == "ok"
        });
    }

    /// `GET /v1/health`, over TCP or the Unix socket.
    pub fn health(&self) -> Value {
        let body = match self.url.strip_prefix("unix:") {
            Some(socket) => {
                use std::io::{Read, Write};
                let Ok(mut stream) = std::os::unix::net::UnixStream::connect(socket) else {
                    return Value::Null;
                };
                let request =
                    "GET /v1/health HTTP/1.1\r\nHost: promptd\r\nConnection: close\r\n\r\n";
                let mut reply = String::new();
                if stream.write_all(request.as_bytes()).is_err()
                    || stream.read_to_string(&mut reply).is_err()
                {
                    return Value::Null;
                }
                reply
                    .split_once("\r\n\r\n")
                    .map(|(_, body)| body.to_string())
                    .unwrap_or_default()
            }
            None => self.get("/v1/health").1,
        };
        serde_json::from_str(&body).unwrap_or(Value::Null)
    }

    /// Stops with SIGTERM (graceful) and waits.
    pub fn stop(mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }

    /// Stops with SIGKILL: no chance to flush anything.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// GET; returns (status, body).
    pub fn get(&self, path: &str) -> (u16, String) {
        request(&self.url, "GET", path, None, None)
    }

    /// POST a JSON body; returns (status, body).
    pub fn post(&self, path: &str, body: &str) -> (u16, String) {
        request(&self.url, "POST", path, Some(body), None)
    }

    /// DELETE; returns (status, body).
    pub fn delete(&self, path: &str) -> (u16, String) {
        request(&self.url, "DELETE", path, None, None)
    }

    /// GET/POST expecting 2xx; returns parsed JSON.
    pub fn ok(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let body = body.map(|b| b.to_string());
        let (status, text) = request(&self.url, method, path, body.as_deref(), None);
        assert!(
            (200..300).contains(&status),
            "{method} {path} -> {status}: {text}"
        );
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}"))
    }
}

impl Served {
    /// Creates a session for `agent`; returns its id.
    pub fn session(&self, agent: &str) -> String {
        let v = self.ok(
            "POST",
            "/v1/sessions",
            Some(&serde_json::json!({"agent": agent})),
        );
        v["id"].as_str().expect("session id").to_string()
    }

    /// The one session that has taken steps, as `(id, agent)`, for a test whose program
    /// prints no id; panics unless there is exactly one.
    pub fn stepped_session(&self) -> (String, String) {
        let listed = self.ok("GET", "/v1/sessions", None);
        let stepped: Vec<&Value> = listed["sessions"]
            .as_array()
            .expect("sessions")
            .iter()
            .filter(|s| s["steps"].as_u64() > Some(0))
            .collect();
        let [only] = stepped.as_slice() else {
            panic!("one session with steps: {listed}");
        };
        let field = |k: &str| only[k].as_str().expect(k).to_string();
        (field("id"), field("agent"))
    }

    /// One step with an empty body; returns (status, parsed body).
    pub fn step(&self, id: &str) -> (u16, Value) {
        let (status, text) = self.post(&format!("/v1/sessions/{id}/steps"), "{}");
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// The `GET /v1/plugins` entry of plugin `id` (null when there is none).
    pub fn plugin(&self, id: &str) -> Value {
        let v = self.ok("GET", "/v1/plugins", None);
        let plugins = v["plugins"].as_array().cloned().unwrap_or_default();
        plugins
            .into_iter()
            .find(|p| p["id"] == id)
            .unwrap_or(Value::Null)
    }

    /// The kinds of session `id`'s events, in order.
    pub fn event_kinds(&self, id: &str) -> Vec<String> {
        let v = self.ok("GET", &format!("/v1/sessions/{id}/events"), None);
        let events = v["events"].as_array().cloned().unwrap_or_default();
        events
            .iter()
            .map(|e| e["kind"].as_str().unwrap_or("").to_string())
            .collect()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP request; returns (status, body). Non-2xx statuses are answers, not errors.
pub fn request(
    base: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    token: Option<&str>,
) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let url = format!("{base}{path}");
    let auth = token.map(|t| format!("Bearer {t}"));
    let result = match method {
        "GET" => {
            let mut r = agent.get(&url);
            if let Some(a) = &auth {
                r = r.header("Authorization", a);
            }
            r.call()
        }
        "DELETE" => agent.delete(&url).call(),
        _ => {
            let mut r = agent.post(&url).header("Content-Type", "application/json");
            if let Some(a) = &auth {
                r = r.header("Authorization", a);
            }
            r.send(body.unwrap_or("").to_string())
        }
    };
    let mut response = result.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().unwrap_or_default();
    (status, text)
}

/// A fresh state folder (not yet created) inside a temporary folder, which the caller keeps
/// alive.
pub fn state_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state");
    (dir, path)
}

//! End-to-end: nothing a plugin or a client sends grows without a bound.
//! Hostile components (the `scripted` fixture, built from Rust source, and WAT) in the real
//! daemon; each test names the limit it checks.

use promptd_testkit as common;

use std::time::{Duration, Instant};

use common::daemon::{state_dir, Served};
use common::Folder;
use serde_json::{json, Value};

/// Checks on a step's input are linear in the input plus the session's cached state: 10,000
/// tool results after a 10,000-message step used to cost ~25 s of CPU (each result scanned
/// the whole log).
#[test]
fn q5_ten_thousand_tool_results_are_checked_in_linear_time() {
    let folder = Folder::new().scripted("s");
    let (d, _s) = folder.serve("[plugins.s]\nconfig = { \"section.a\" = \"0|A\" }\n");
    let id = d.session("default");
    let n = 10_000;
    let users: Vec<Value> = (0..n)
        .map(|i| json!({"role": "user", "content": format!("message {i}")}))
        .collect();
    let started = Instant::now();
    let (status, body) = d.post(
        &format!("/v1/sessions/{id}/steps"),
        &json!({"messages": users}).to_string(),
    );
    assert_eq!(status, 200, "{}", &body[..body.len().min(400)]);
    let first = started.elapsed();

    let calls: Vec<Value> = (0..n)
        .map(|i| json!({"id": format!("call_{i}"), "name": "t", "arguments": {}}))
        .collect();
    let reply = json!({"role": "assistant", "content": "", "tool_calls": calls});
    let started = Instant::now();
    let (status, body) = d.post(&format!("/v1/sessions/{id}/messages"), &reply.to_string());
    assert_eq!(status, 201, "{body}");
    let record = started.elapsed();

    let results: Vec<Value> = (0..n)
        .rev()
        .map(|i| json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": "ok"}))
        .collect();
    let started = Instant::now();
    let (status, body) = d.post(
        &format!("/v1/sessions/{id}/steps"),
        &json!({"messages": results}).to_string(),
    );
    let second = started.elapsed();
    assert_eq!(status, 200, "{}", &body[..body.len().min(400)]);
    eprintln!("10,000 user messages: {first:?}; 10,000 tool calls: {record:?}; 10,000 results: {second:?}");
    // Generous for a shared 2-core machine; the measured figure is in the note.
    assert!(
        second < Duration::from_secs(5),
        "10,000 tool results took {second:?}"
    );

    // A result for a call nobody made is still refused, by name.
    let (status, body) = d.post(
        &format!("/v1/sessions/{id}/steps"),
        &json!({"messages": [{"role": "tool", "tool_call_id": "call_x", "content": "?"}]})
            .to_string(),
    );
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("unknown_tool_call") && body.contains("call_x"),
        "{body}"
    );
}

fn log_text(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// A folder of plugins served with the daemon's log at info in `log`.
fn serve_logged(folder: &Folder, config: &str) -> (Served, tempfile::TempDir, std::path::PathBuf) {
    let config = folder.config(config);
    let (tmp, state) = state_dir();
    let log = tmp.path().join("daemon.log");
    (
        Served::start_logged(folder.path(), &config, &state, &log),
        tmp,
        log,
    )
}

/// A plugin that logs in a loop gets a bounded share of the log: 20,000 records of 1 KiB (20
/// MiB) in one call, in declare, and through stdout become at most the per-call budget each,
/// plus one line saying how much was dropped. (A generous call deadline: 20,000 writes take
/// a while on a busy machine, and the point here is the log, not the clock.)
#[test]
fn l9_a_log_flood_is_cut_to_its_budget_with_one_line_saying_so() {
    let folder = Folder::new()
        .scripted("flood")
        .scripted("printer")
        .scripted("quiet");
    let (d, _s, log) = serve_logged(
        &folder,
        "[limits]\ntimeout_ms = 20000\nlog_kb_per_call = 16\nlog_lines_per_s = 1000000\n\
         [plugins.flood]\nconfig = { flood_in_declare = \"20000\", \"flood_section.f\" = \"0|20000|log\" }\n\
         [plugins.printer]\nconfig = { \"flood_section.p\" = \"1|20000|stdout\" }\n\
         [plugins.quiet]\nconfig = { \"section.q\" = \"2|quiet\" }\n",
    );
    let id = d.session("default");
    let (status, v) = d.step(&id);
    assert_eq!(status, 200, "{v}");
    let text = log_text(&log);
    assert!(
        text.len() < 512 << 10,
        "the log grew by {} bytes for 60 MiB of attempted plugin output",
        text.len()
    );
    let dropped: Vec<&str> = text.lines().filter(|l| l.contains("dropped")).collect();
    let declare = dropped
        .iter()
        .filter(|l| l.contains("declare: dropped"))
        .count();
    let call = dropped
        .iter()
        .filter(|l| l.contains("call: dropped"))
        .count();
    assert!(
        declare >= 1 && call >= 2,
        "one line per flooding call says what was dropped: {dropped:#?}"
    );
    assert!(
        dropped
            .iter()
            .all(|l| l.contains("(limits.log_kb_per_call)")),
        "{dropped:#?}"
    );
    // What was kept is still there, tagged with the plugin.
    assert!(text
        .lines()
        .any(|l| l.contains("plugin=flood") && l.contains(" ffff")));
    assert_eq!(d.get("/v1/health").0, 200);
}

/// The per-plugin rate applies across calls: 50 steps that each log 10 records stay within
/// `log_lines_per_s` records per second.
#[test]
fn l9_the_log_rate_is_per_plugin_across_calls() {
    let folder = Folder::new().scripted("chatty");
    let (d, _s, log) = serve_logged(
        &folder,
        "[limits]\nlog_lines_per_s = 20\n\
         [plugins.chatty]\nconfig = { \"flood_section.c\" = \"0|10|log\" }\n",
    );
    let id = d.session("default");
    let started = Instant::now();
    for _ in 0..50 {
        assert_eq!(d.step(&id).0, 200);
    }
    let secs = started.elapsed().as_secs() + 1;
    let text = log_text(&log);
    let kept = text.lines().filter(|l| l.contains(" ffff")).count() as u64;
    assert!(
        kept <= 20 * (secs + 1),
        "{kept} records kept in about {secs} s at 20 per second"
    );
    assert!(text.contains("(limits.log_lines_per_s)"), "{text}");
}

/// Untrusted text cannot forge a log line: a plugin message with a newline and ANSI escapes,
/// a file name with a newline, and a refused section name each stay inside one record (the
/// ESC may be written `\x1b` by the formatter or `\u{1b}` by the sink; either way it is text).
#[test]
fn l9_untrusted_text_stays_inside_one_log_record() {
    let forged = "2030-01-01T00:00:00Z ERROR promptd: forged";
    let folder = Folder::new()
        .scripted("liar")
        .scripted("badname")
        .scripted(&format!("x\n{forged}"));
    let (d, _s, log) = serve_logged(
        &folder,
        &format!(
            "[plugins.liar]\nconfig = {{ \"log_section.l\" = \"0|hello\\n{forged}\\u001b[31m red\" }}\n\
             [plugins.badname]\nconfig = {{ \"section.bad\\n{forged}\" = \"1|x\" }}\n"
        ),
    );
    let id = d.session("default");
    assert_eq!(d.step(&id).0, 200);
    let refusals = || {
        log_text(&log)
            .lines()
            .filter(|l| l.contains("refused"))
            .count()
    };
    for _ in 0..500 {
        if refusals() >= 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        refusals() >= 2,
        "both refusals are logged:\n{}",
        log_text(&log)
    );
    assert!(
        log_text(&log)
            .lines()
            .any(|l| l.contains("refused: plugin file") && l.contains("forged.wasm")),
        "{}",
        log_text(&log)
    );
    let text = log_text(&log);
    for line in text.lines() {
        assert!(!line.starts_with("2030-01-01"), "a forged line: {line}");
        assert!(!line.contains('\u{1b}'), "a raw escape: {line:?}");
    }
    assert!(
        text.lines()
            .any(|l| l.contains("hello\\n2030-01-01") && l.contains("[31m red")),
        "the message is kept, escaped, on one line:\n{text}"
    );
}

/// A declaration over its limits is refused at load with an error naming the limit; the
/// other plugins keep loading and serving.
#[test]
fn l8_a_declaration_over_its_limits_is_refused_by_name() {
    let folder = Folder::new()
        .scripted("sections")
        .scripted("tools")
        .scripted("longname")
        .scripted("heavy")
        .scripted("fine");
    let (d, _s) = folder.serve(
        "[plugins.sections]\nconfig = { bulk_sections = \"100000|1\" }\n\
         [plugins.tools]\nconfig = { bulk_tools = \"100000\" }\n\
         [plugins.longname]\nconfig = { long_name = \"10240\" }\n\
         [plugins.heavy]\nconfig = { bulk_sections = \"900|5000\" }\n\
         [plugins.fine]\nmax_sections = 2000\nconfig = { bulk_sections = \"1500|10\" }\n",
    );
    let expect = [
        (
            "sections",
            "declares 100000 sections, over the limit of 1000 (limits.max_sections)",
        ),
        (
            "tools",
            "declares 100000 tools, over the limit of 256 (limits.max_tools)",
        ),
        (
            "longname",
            "is 10240 bytes, over the limit of 128 (limits.max_name_bytes)",
        ),
        (
            "heavy",
            "KiB in all, over the limit of 4096 (limits.max_declared_kb)",
        ),
    ];
    for (plugin, words) in expect {
        let p = d.plugin(plugin);
        assert_eq!(p["state"], "refused", "{p}");
        assert_eq!(p["last_error"]["code"], "declaration_limit", "{p}");
        let message = p["last_error"]["message"].as_str().unwrap_or("");
        assert!(message.contains(words), "{plugin}: {message}");
        assert!(message.len() < 300, "the message stays short: {message}");
    }
    assert_eq!(d.plugin("fine")["state"], "loaded", "a per-plugin override");
    let id = d.session("default");
    let (status, v) = d.step(&id);
    assert_eq!(status, 200, "{v}");
}

/// A plugin that grows past `memory_mb` is reported as that limit, first, in the config's
/// words; the engine's details come after.
#[test]
fn l2_a_memory_trap_names_the_limit_first() {
    let folder = Folder::new().scripted("hog");
    let (d, _s) =
        folder.serve("[plugins.hog]\nmemory_mb = 64\nconfig = { \"grow_section.eat\" = \"0\" }\n");
    let id = d.session("default");
    let (status, v) = d.step(&id);
    assert_eq!(status, 502, "{v}");
    assert_eq!(v["error"]["code"], "plugin_trap");
    let message = v["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.starts_with(
            "plugin `hog`, section `eat`: memory limit of 64 MiB exceeded (memory_mb)"
        ),
        "{message}"
    );
}

/// Loads run in parallel: three plugins whose declare loops until a 4 s deadline delay the
/// first registry by about one deadline, not three, and health answers all along. (The
/// bound leaves room for a busy machine: one after another they take 12 s.)
#[test]
fn h5_hostile_plugins_at_start_up_do_not_add_up() {
    let folder = Folder::new()
        .scripted("loop1")
        .scripted("loop2")
        .scripted("loop3")
        .scripted("good");
    let looping = "timeout_ms = 4000\nconfig = { loop_in_declare = \"true\" }\n";
    let config = folder.config(&format!(
        "[plugins.loop1]\n{looping}[plugins.loop2]\n{looping}[plugins.loop3]\n{looping}\
         [plugins.good]\nconfig = {{ \"section.g\" = \"0|good\" }}\n"
    ));
    let (_tmp, state) = state_dir();
    let started = Instant::now();
    let d = Served::start_unready(folder.path(), &config, &state);
    let health = d.health();
    assert_eq!(health["status"], "loading", "{health}");
    common::eventually("the first registry", || d.health()["status"] == "ok");
    let ready = started.elapsed();
    assert!(
        ready < Duration::from_millis(9000),
        "three 4 s deadlines in parallel took {ready:?} (one after another: 12 s)"
    );
    for p in ["loop1", "loop2", "loop3"] {
        assert_eq!(d.plugin(p)["last_error"]["code"], "declare_failed");
    }
    let id = d.session("default");
    let (status, v) = d.step(&id);
    assert_eq!(status, 200, "{v}");
}

/// The daemon's threads at this moment (Linux: its tasks).
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

/// `PROMPTD_BLOCKING_THREADS` (docs/operations.md) bounds the threads steps run on: 32
/// clients stepping at once add at most that many threads to an idle daemon, and a value that
/// is not a positive integer stops `serve` with an error naming it.
#[test]
fn blocking_threads_bound_the_threads_concurrent_steps_take() {
    let folder = Folder::new().scripted("s");
    let config = folder.config("[plugins.s]\nconfig = { \"section.a\" = \"0|A\" }\n");
    let (_tmp, state) = state_dir();
    let d = Served::start_with(
        folder.path(),
        &config,
        &state,
        &[],
        &[("PROMPTD_BLOCKING_THREADS", "2")],
    );
    let ids: Vec<String> = (0..32).map(|_| d.session("default")).collect();
    // Creating the sessions may have started pool threads already: at most the bound.
    let idle = threads(d.child.id());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let most = std::thread::scope(|scope| {
        for id in &ids {
            let (d, stop) = (&d, &stop);
            scope.spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let (status, v) = d.step(id);
                    assert_eq!(status, 200, "{v}");
                }
            });
        }
        let mut most = 0;
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            most = most.max(threads(d.child.id()));
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        most
    });
    assert!(
        most <= idle + 2,
        "32 concurrent steps with PROMPTD_BLOCKING_THREADS=2: {most} threads (idle: {idle})"
    );

    let (_tmp2, state2) = state_dir();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_promptd"))
        .args(["serve", "--plugins"])
        .arg(folder.path())
        .arg("--config")
        .arg(&config)
        .arg("--state")
        .arg(&state2)
        .args(["--listen", "127.0.0.1:0"])
        .env("PROMPTD_BLOCKING_THREADS", "none")
        .output()
        .expect("run promptd serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("error[bad_argument]: PROMPTD_BLOCKING_THREADS `none`"),
        "{stderr}"
    );
}

/// Cancellation: a client that disconnects while its step is assembling (an optional plugin's
/// dynamic section spins until its 1.5 s deadline, after which the step would go on without
/// it) gets nothing recorded; the plugin call runs out its deadline and its result is dropped;
/// the session stays usable and its next step records as usual.
#[test]
fn a_client_that_disconnects_while_its_step_assembles_gets_nothing_recorded() {
    use std::io::Write;
    let folder = Folder::new().scripted("s").scripted("slow");
    let (d, _s) = folder.serve(
        "[plugins.s]\nconfig = { \"section.a\" = \"0|A\" }\n\
         [plugins.slow]\noptional = true\ntimeout_ms = 1500\n\
         config = { \"loop_section.spin\" = \"1\" }\n",
    );
    let id = d.session("default");
    let events = |d: &Served| d.ok("GET", &format!("/v1/sessions/{id}/events"), None);
    let before = events(&d);

    let addr = d.url.trim_start_matches("http://").to_string();
    let body = json!({"messages": [{"role": "user", "content": "never recorded"}]}).to_string();
    let mut client = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        client,
        "POST /v1/sessions/{id}/steps HTTP/1.1\r\nHost: promptd\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // Gone while the slow section spins (it spins for 1.5 s; nothing outside the daemon marks
    // the step as assembling, so this pause places the disconnect inside that window).
    std::thread::sleep(Duration::from_millis(300));
    drop(client);
    // The step is counted cancelled when it returns, which is after the plugin call ran out its
    // deadline: without cancellation the step would have been recorded by then.
    common::eventually("the step to end cancelled", || {
        d.get("/metrics")
            .1
            .contains("promptd_steps_total{outcome=\"cancelled\"} 1")
    });
    assert_eq!(events(&d), before, "a cancelled step records nothing");
    let (_, metrics) = d.get("/metrics");
    assert!(
        metrics.contains("promptd_steps_total{outcome=\"cancelled\"} 1"),
        "{metrics}"
    );

    // The session stays usable: the next step records its message (and not the other).
    let (status, v) = d.post(
        &format!("/v1/sessions/{id}/steps"),
        &json!({"messages": [{"role": "user", "content": "recorded"}]}).to_string(),
    );
    assert_eq!(status, 200, "{v}");
    let after = events(&d).to_string();
    assert!(after.contains("recorded"), "{after}");
    assert!(!after.contains("never recorded"), "{after}");
}

/// The compiler children of `pid` running now (`promptd compile …`).
fn compiling(pid: u32) -> usize {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return 0;
    };
    procs
        .filter_map(|p| p.ok())
        .filter(|p| {
            p.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|p| {
            let stat = std::fs::read_to_string(p.path().join("stat")).unwrap_or_default();
            // pid (comm) state ppid …: the comm may hold spaces, so read after its `)`.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
            ppid == Some(pid) && String::from_utf8_lossy(&cmdline).contains("compile")
        })
        .count()
}

/// L7: `[limits] compile_memory_total_mb` bounds what compiles reserve together: with it
/// equal to one compile's `compile_memory_mb`, four plugins loading in parallel (nothing
/// cached) compile one at a time, and all of them load.
#[test]
fn l7_compiles_together_stay_within_compile_memory_total_mb() {
    let folder = Folder::new()
        .bundled("identity")
        .bundled("persona")
        .bundled("tools")
        .bundled("workspace");
    let config = folder.config(
        "[limits]\ncompile_memory_mb = 1024\ncompile_memory_total_mb = 1024\n\
         [agents.default]\n",
    );
    let (_tmp, state) = state_dir();
    let d = Served::start_unready(folder.path(), &config, &state);
    let pid = d.child.id();
    let mut most = 0;
    let until = Instant::now() + Duration::from_secs(60);
    while d.health()["status"] != "ok" {
        assert!(Instant::now() < until, "the plugins did not load in 60 s");
        most = most.max(compiling(pid));
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(
        most >= 1,
        "no compile was seen: the plugins must not come from a cache"
    );
    assert!(
        most <= 1,
        "{most} compiles ran at once within 1024 MiB of 1024 each"
    );
    let plugins = d.ok("GET", "/v1/plugins", None);
    let loaded = plugins["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["state"] == "loaded")
        .count();
    assert_eq!(loaded, 4, "{plugins}");
}

/// VmHWM (peak RSS) of a process in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Issue 32: the memory a step may cost is a small multiple of its body. One step with a
/// 20 MiB user message (under the 32 MiB body limit) raised the daemon's peak RSS by eleven
/// times the body (222 MiB); it may raise it by at most six: the message as parsed, its event
/// as written, SQLite's two copies of that row (the bound text and the record), the session's
/// fragment of it, with room for the allocator (docs/operations.md#memory).
#[test]
fn a_step_with_a_20_mib_message_raises_peak_memory_by_a_small_multiple_of_its_body() {
    let folder = Folder::new().bundled("persona").bundled("workspace");
    let (d, _state) =
        folder.serve("[model.anthropic]\nmodel = \"claude-sonnet-4-5\"\nmax_tokens = 1024\n");
    let id = d.session("default");
    let (status, v) = d.step(&id);
    assert_eq!(status, 200, "{v}");
    let pid = d.child.id();
    let before = peak_rss_kib(pid);
    let text = "word ".repeat(4 << 20); // 20 MiB
    let body =
        json!({"messages": [{"role": "user", "content": text}], "format": "anthropic"}).to_string();
    let (status, reply) = d.post(&format!("/v1/sessions/{id}/steps"), &body);
    assert_eq!(status, 200, "{reply:.300}");
    let grew = peak_rss_kib(pid).saturating_sub(before) as f64 / 1024.0;
    let body_mib = body.len() as f64 / (1 << 20) as f64;
    eprintln!("a {body_mib:.1} MiB step raised peak RSS by {grew:.0} MiB");
    assert!(
        grew <= 6.0 * body_mib,
        "a {body_mib:.1} MiB step raised the daemon's peak RSS by {grew:.0} MiB (more than 6x)"
    );
}

//! Project tasks: `cargo xtask run` and `cargo xtask test` (see README.md).
//!
//! - `run [-- ARGS]`: build the daemon (release, in the background) while the SDK toolchains
//!   install and the bundled plugins build to wasm32-wasip2 into `target/plugins/`, then start
//!   the daemon serving them (`promptd serve` with the example
//!   config `promptd.toml`, on 127.0.0.1:8417, until Ctrl-C). ARGS replace the promptd
//!   arguments, e.g. `cargo xtask run -- assemble --plugins target/plugins`.
//! - `test`: install what the tests need (rustup target, rustfmt, clippy, the JavaScript,
//!   Python and C SDK toolchains, then — on a thread of their own, overlapping the builds — the
//!   OpenAI and Anthropic clients of tests/provider_sdks.rs, Claude Code for tests/agent_cli.rs
//!   (tests/agents/install.sh) and each of `TEST_INSTALLERS`: the
//!   client libraries, the browser, the database and proxy, the MCP servers, the OpenAPI
//!   tools), then check formatting, lint, and run every test.
//! - `imports`: print the import loops among each host crate's modules (`imports.rs`); `test`
//!   fails on any.
//! - `plugins`: only build and collect the bundled plugins.
//! - `sdks`: only install the JavaScript, Python and C SDK toolchains (each `sdk/LANG/install.sh`).
//! - `soak-fuzz`: the long schemathesis run of issue 32 (not part of `test`: hours on 2
//!   cores): every operation fuzzed from the document, stateful phase and negative data on,
//!   `SCHEMATHESIS_SEEDS` (default three) × `SCHEMATHESIS_EXAMPLES` per operation (1,000).
//!
//! Both `run` and `test` install the SDK toolchains first: the bundled plugins are written in
//! Rust, JavaScript, Python and C. A toolchain that cannot be installed stops with the
//! installer's message; nothing is skipped.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use anyhow::{bail, Context, Result};

mod imports;

const WASM_TARGET: &str = "wasm32-wasip2";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = root();
    match args.first().map(String::as_str) {
        Some("run") => run(&root, &args[1..]),
        Some("test") => test(&root),
        Some("imports") => print_imports(&root),
        Some("plugins") => plugins(&root).map(|dir| println!("{}", dir.display())),
        Some("sdks") => install_sdks(&root),
        Some("soak-fuzz") => soak_fuzz(&root),
        _ => bail!(
            "usage: cargo xtask run [-- PROMPTD ARGS] | cargo xtask test | cargo xtask imports | cargo xtask plugins | cargo xtask sdks | cargo xtask soak-fuzz"
        ),
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask/ has a parent")
        .to_path_buf()
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// While set, [`sh`] runs its commands at a lower priority (`nice -n 10`): `xtask run` sets it
/// while the SDK toolchains and plugins build beside the daemon's release build, so that build
/// — the long pole of a first run — gets the cores first, and the rest fills what it leaves.
static BESIDE_THE_BUILD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn sh(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: {cmd:?}");
    let mut niced;
    let cmd = if BESIDE_THE_BUILD.load(std::sync::atomic::Ordering::Relaxed) {
        niced = Command::new("nice");
        niced
            .args(["-n", "10"])
            .arg(cmd.get_program())
            .args(cmd.get_args());
        if let Some(dir) = cmd.get_current_dir() {
            niced.current_dir(dir);
        }
        for (key, value) in cmd.get_envs() {
            match value {
                Some(value) => niced.env(key, value),
                None => niced.env_remove(key),
            };
        }
        &mut niced
    } else {
        cmd
    };
    let status = cmd
        .status()
        .with_context(|| format!("could not start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}

/// Installs the wasm target and the lint tools through rustup; says how when rustup is absent.
fn install_toolchain_parts() -> Result<()> {
    let rustup = Command::new("rustup").arg("--version").output();
    if rustup.is_err() {
        let sysroot = Command::new("rustc")
            .args(["--print", "sysroot"])
            .output()?;
        let sysroot = String::from_utf8_lossy(&sysroot.stdout).trim().to_string();
        if Path::new(&sysroot)
            .join("lib/rustlib")
            .join(WASM_TARGET)
            .is_dir()
        {
            return Ok(());
        }
        bail!("the {WASM_TARGET} target is missing and rustup is not installed: install rustup, then `rustup target add {WASM_TARGET}`");
    }
    sh(Command::new("rustup").args(["target", "add", WASM_TARGET]))?;
    sh(Command::new("rustup").args(["component", "add", "rustfmt", "clippy"]))
}

/// The bundled plugins written with the other SDKs: (plugin folder in plugins/, SDK language).
const SDK_PLUGINS: [(&str, &str); 3] =
    [("skills", "js"), ("documents", "python"), ("datetime", "c")];

/// Installs the JavaScript, Python and C toolchains through each SDK's own installer, which
/// does nothing when its tools are already in place.
fn install_sdks(root: &Path) -> Result<()> {
    for lang in ["js", "python", "c"] {
        let script = root.join("sdk").join(lang).join("install.sh");
        sh(Command::new("bash").arg(&script)).with_context(|| {
            format!("installing the {lang} SDK toolchain ({})", script.display())
        })?;
    }
    Ok(())
}

/// What the end-to-end tests drive besides the provider SDKs (the official OpenAI and Anthropic
/// clients, pinned, into tests/sdk_loops), each installed (pinned, idempotent) by its own
/// script: the client libraries built as packages and installed from those artifacts, the
/// headless browser for the inspector, PostgreSQL and HAProxy, the MCP servers, the OpenAPI
/// tools, and Arize Phoenix for the telemetry test.
const TEST_INSTALLERS: &[(&str, &str)] = &[
    ("sdk/clients/python/install.sh", "the Python client"),
    ("sdk/clients/typescript/install.sh", "the TypeScript client"),
    ("tests/inspector/install.sh", "chromium and selenium"),
    ("tests/postgres/install.sh", "PostgreSQL and HAProxy"),
    ("tests/mcp/install.sh", "the MCP servers"),
    (
        "tests/openapi/install.sh",
        "openapi-spec-validator and schemathesis",
    ),
    (
        "tests/telemetry/install.sh",
        "Arize Phoenix (the trace backend)",
    ),
];

/// Runs the provider SDKs' installer, Claude Code's (the coding agent CLI that
/// tests/agent_cli.rs drives through the gateway, pinned in tests/agents; a no-op once
/// installed, issue 47) and each of [`TEST_INSTALLERS`], in turn, on a thread of their own:
/// they wait on the network and apt, so they overlap with the compiling that follows instead
/// of preceding it (issue 27). Each one's output goes to `target/xtask-logs/NAME.log`
/// (shown when it fails). Called after the SDK toolchains are installed, so no two apt-get
/// runs overlap.
fn install_in_background(root: &Path) -> std::thread::JoinHandle<Result<()>> {
    let root = root.to_path_buf();
    std::thread::spawn(move || {
        let logs = root.join("target/xtask-logs");
        std::fs::create_dir_all(&logs).with_context(|| format!("create {}", logs.display()))?;
        let scripts = [
            ("tests/sdk_loops/install.sh", "the provider SDKs"),
            ("tests/agents/install.sh", "Claude Code (the agent CLI)"),
        ]
        .into_iter()
        .chain(TEST_INSTALLERS.iter().copied());
        for (script, what) in scripts {
            let path = root.join(script);
            let log = logs.join(format!("{}.log", script.replace('/', "_")));
            let out =
                std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
            let err = out.try_clone()?;
            let started = std::time::Instant::now();
            let status = Command::new("bash")
                .arg(&path)
                .current_dir(&root)
                .stdout(out)
                .stderr(err)
                .status()
                .with_context(|| format!("could not start {}", path.display()))?;
            if !status.success() {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                bail!(
                    "installing {what} ({}) failed ({status}); its output ({}):\n{text}",
                    path.display(),
                    log.display()
                );
            }
            eprintln!(
                "xtask: installed {what} ({script}, {:.0} s; log in {})",
                started.elapsed().as_secs_f64(),
                log.display()
            );
        }
        Ok(())
    })
}

/// The newest modification time of the files under `dir`, leaving out installed tools
/// (node_modules, venvs, `.tools`), build output, caches and docs.
fn newest(dir: &Path) -> Result<SystemTime> {
    let mut latest = SystemTime::UNIX_EPOCH;
    for entry in std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.')
            || name == "node_modules"
            || name == "target"
            || name == "__pycache__"
            || name.ends_with(".wasm")
            || name.ends_with(".md")
        {
            continue;
        }
        let meta = entry.metadata()?;
        let time = if meta.is_dir() {
            newest(&entry.path())?
        } else {
            meta.modified()?
        };
        latest = latest.max(time);
    }
    Ok(latest)
}

/// Builds `plugins/NAME` with `sdk/LANG/build.sh` into `out/NAME.wasm`, unless the output is
/// newer than the plugin's sources, the SDK and the WIT.
fn build_sdk_plugin(root: &Path, name: &str, lang: &str, out: &Path) -> Result<()> {
    let src = root.join("plugins").join(name);
    let sdk = root.join("sdk").join(lang);
    let wasm = out.join(format!("{name}.wasm"));
    let built = std::fs::metadata(&wasm).and_then(|m| m.modified()).ok();
    let inputs = newest(&src)?
        .max(newest(&sdk)?)
        .max(newest(&root.join("wit"))?);
    if built.is_some_and(|b| b > inputs) {
        return Ok(());
    }
    sh(Command::new("bash")
        .arg(sdk.join("build.sh"))
        .arg(&src)
        .arg(&wasm))
    .with_context(|| {
        format!("building plugins/{name} ({lang}); `cargo xtask sdks` installs its toolchain")
    })
}

/// Builds a wasm workspace (release) and returns its output folder.
fn build_wasm(root: &Path, dir: &str) -> Result<PathBuf> {
    let target_dir = root.join(dir).join("target");
    sh(cargo()
        .args([
            "build",
            "--release",
            "--target",
            WASM_TARGET,
            "--manifest-path",
        ])
        .arg(root.join(dir).join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir))?;
    Ok(target_dir.join(WASM_TARGET).join("release"))
}

/// Builds the bundled plugins and copies each `NAME.wasm` into `target/plugins/`.
fn plugins(root: &Path) -> Result<PathBuf> {
    let built = build_wasm(root, "plugins")?;
    let out = root.join("target").join("plugins");
    std::fs::create_dir_all(&out)?;
    let manifest = std::fs::read_to_string(root.join("plugins/Cargo.toml"))?;
    for name in ["identity", "persona", "tools", "workspace"] {
        if !manifest.contains(&format!("\"{name}\"")) {
            bail!("plugins/Cargo.toml no longer lists {name}");
        }
        let file = format!("{name}.wasm");
        std::fs::copy(built.join(&file), out.join(&file))
            .with_context(|| format!("copy {file}"))?;
    }
    for (name, lang) in SDK_PLUGINS {
        build_sdk_plugin(root, name, lang, &out)?;
    }
    Ok(out)
}

fn run(root: &Path, args: &[String]) -> Result<()> {
    install_toolchain_parts()?;
    // The daemon's first build is most of a first run (docs/build-time.md): start it now, so
    // the SDK toolchains download and the plugins build meanwhile. Its output goes to a log;
    // `cargo run` below then finds it built (or shows the error).
    let logs = root.join("target/xtask-logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("create {}", logs.display()))?;
    let log = logs.join("build-promptd.log");
    let out = std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
    eprintln!(
        "xtask: building promptd (release) in the background; progress in {}",
        log.display()
    );
    let mut build = cargo()
        .current_dir(root)
        .args(["build", "--release", "-p", "promptd"])
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .context("could not start cargo build")?;
    BESIDE_THE_BUILD.store(true, std::sync::atomic::Ordering::Relaxed);
    let beside = install_sdks(root).and_then(|()| plugins(root));
    BESIDE_THE_BUILD.store(false, std::sync::atomic::Ordering::Relaxed);
    let dir = match beside {
        Ok(dir) => dir,
        Err(e) => {
            let _ = build.kill();
            let _ = build.wait();
            return Err(e);
        }
    };
    let built = build.wait().context("wait for cargo build")?;
    if !built.success() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        bail!(
            "building promptd failed ({built}); its output ({}):\n{text}",
            log.display()
        );
    }
    let mut cmd = cargo();
    cmd.current_dir(root)
        .args(["run", "--release", "--quiet", "-p", "promptd", "--"]);
    let rest: Vec<&String> = args.iter().skip_while(|a| *a == "--").collect();
    if rest.is_empty() {
        cmd.args(["serve", "--config", "promptd.toml", "--plugins"])
            .arg(&dir);
    } else {
        cmd.args(rest);
    }
    sh(&mut cmd)
}

/// Crates the pure core must never depend on (not even through another crate): the engine,
/// the database, HTTP, the async runtime and the file watcher sit at the edges.
const NOT_IN_CORE: &[&str] = &[
    "wasmtime",
    "wasmtime-wasi",
    "cranelift-codegen",
    "rusqlite",
    "libsqlite3-sys",
    "axum",
    "hyper",
    "tokio",
    "notify",
];

/// Fails when `promptd-core`'s dependency tree (normal and build dependencies) holds any of
/// [`NOT_IN_CORE`].
fn check_core_is_pure(root: &Path) -> Result<()> {
    let out = cargo()
        .current_dir(root)
        .args([
            "tree",
            "-p",
            "promptd-core",
            "-e",
            "normal,build",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .output()
        .context("run cargo tree")?;
    if !out.status.success() {
        bail!(
            "cargo tree -p promptd-core failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let tree = String::from_utf8_lossy(&out.stdout);
    let found: Vec<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| NOT_IN_CORE.contains(name))
        .collect();
    if !found.is_empty() {
        bail!(
            "promptd-core must stay free of the engine, database, HTTP and async runtime, but \
             its dependency tree holds: {}",
            found.join(", ")
        );
    }
    println!(
        "promptd-core's dependency tree is pure ({} crates)",
        tree.lines().count()
    );
    Ok(())
}

/// `cargo xtask imports`: prints every import loop, or that there is none.
fn print_imports(root: &Path) -> Result<()> {
    let cycles = imports::cycles(root)?;
    for cycle in &cycles {
        println!("{cycle}");
    }
    println!("{} import loops in the host crates", cycles.len());
    Ok(())
}

/// Fails when a module of a host crate imports one that imports it back (issue 46), naming
/// each loop as a chain of files.
fn check_no_import_loops(root: &Path) -> Result<()> {
    let cycles = imports::cycles(root)?;
    if !cycles.is_empty() {
        bail!(
            "{} import loops in the host crates (a module imports one that imports it back; \
             `cargo xtask imports` lists them):\n{}",
            cycles.len(),
            cycles.join("\n")
        );
    }
    println!("no import loops in the host crates");
    Ok(())
}

/// `cargo xtask soak-fuzz`: installs the OpenAPI tools and what the daemon serves, then runs
/// the ignored long schemathesis test.
fn soak_fuzz(root: &Path) -> Result<()> {
    install_toolchain_parts()?;
    sh(Command::new("bash")
        .current_dir(root)
        .arg("tests/openapi/install.sh"))?;
    plugins(root)?;
    build_wasm(root, "tests/fixtures")?;
    sh(cargo().current_dir(root).args([
        "test",
        "-p",
        "promptd",
        "--test",
        "e2e",
        "--",
        "--ignored",
        "--exact",
        "openapi::schemathesis_long_run",
        "--nocapture",
    ]))
}

fn test(root: &Path) -> Result<()> {
    check_core_is_pure(root)?;
    check_no_import_loops(root)?;
    install_toolchain_parts()?;
    install_sdks(root)?;
    let installs = install_in_background(root);
    plugins(root)?;
    build_wasm(root, "tests/fixtures")?;
    sh(cargo().current_dir(root).args(["fmt", "--all", "--check"]))?;
    for manifest in ["plugins/Cargo.toml", "tests/fixtures/Cargo.toml"] {
        sh(cargo().current_dir(root).args([
            "fmt",
            "--all",
            "--check",
            "--manifest-path",
            manifest,
        ]))?;
    }
    sh(cargo().current_dir(root).args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    sh(cargo().current_dir(root).args([
        "clippy",
        "--release",
        "--target",
        WASM_TARGET,
        "--manifest-path",
        "plugins/Cargo.toml",
        "--target-dir",
        "plugins/target",
        "--",
        "-D",
        "warnings",
    ]))?;
    // The Python SDK's and the documents plugin's pure logic, natively (no wasm): quick, and
    // their failures read better than an assembled request that differs.
    let python = root.join("sdk/python/.venv/bin/python");
    for dir in ["sdk/python/tests", "plugins/documents/tests"] {
        sh(Command::new(&python)
            .current_dir(root)
            .args(["-m", "unittest", "discover", "-s", dir]))?;
    }
    // The JavaScript and C SDKs' dispatch of `evaluate` and `review`, natively too (the C one
    // under AddressSanitizer and UBSan when the compiler has them): ownership bugs in the
    // canonical-ABI glue show up here with a stack, not as a trap in a component.
    for script in ["sdk/js/test.sh", "sdk/c/tests/run.sh"] {
        sh(Command::new("bash").current_dir(root).arg(script))?;
    }
    // The Rust SDK is its own crate (it builds guests), tested on the host target.
    sh(cargo().current_dir(root).args([
        "test",
        "--quiet",
        "--manifest-path",
        "sdk/rust/Cargo.toml",
    ]))?;
    // Build every test before waiting for the installs, so the two overlap. `--timings` leaves
    // target/cargo-timings/cargo-timing.html: where a test build's minutes went
    // (docs/build-time.md).
    sh(cargo()
        .current_dir(root)
        .args(["test", "--workspace", "--no-run", "--timings"]))?;
    match installs.join() {
        Ok(result) => result?,
        Err(_) => bail!("the installer thread panicked"),
    }
    sh(cargo().current_dir(root).args(["test", "--workspace"]))
}

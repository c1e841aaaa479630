//! promptd's test kit: what the end-to-end tests (tests/, the `e2e` binary of package
//! `promptd`) and the benches (host/cli/benches) share, as one crate they both depend on.
//!
//! - This module: the repository, the plugins and fixtures built for wasm32-wasip2, temporary
//!   plugin folders ([`Folder`]), the real `promptd` binary run once ([`ok`], [`fails`]), and
//!   [`eventually`] (waiting for a fact instead of sleeping).
//! - [`daemon`]: a real `promptd serve` for a test ([`daemon::Served`]) and an HTTP client.
//! - [`process`]: child processes killed when dropped, and runs within a bound.
//! - [`postgres`]: a real PostgreSQL server (tests/postgres/install.sh installs it).
//! - [`soak`]: issue 32's soak, for the hour-long bench and the three-minute test.
//! - [`bench`]: what the benches measure with: binaries, a daemon with its CPU and memory, tables.
//! - [`shape`]: what the `bench` fixture plugin declares (tests/fixtures/bench-shape, shared with
//!   the plugin itself).

pub mod bench;
mod custom_section;
pub mod daemon;
pub mod postgres;
pub mod process;
pub mod soak;

pub use bench_shape as shape;
pub use custom_section::with_custom_section;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The repository root (this crate is host/testkit).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("host/testkit is two folders below the root")
        .to_path_buf()
}

/// The `promptd` binary under test: the one Cargo built for the test or bench running
/// (`CARGO_BIN_EXE_promptd`, which Cargo also sets when it runs them), else the `promptd` beside
/// the `deps` folder that holds this test binary (Cargo's layout, for a test binary run by hand).
pub fn promptd_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let bin = std::env::var_os("CARGO_BIN_EXE_promptd")
            .map(PathBuf::from)
            .or_else(|| {
                let exe = std::env::current_exe().ok()?;
                Some(exe.parent()?.parent()?.join("promptd"))
            })
            .expect("CARGO_BIN_EXE_promptd is not set and the test binary has no path");
        assert!(
            bin.is_file(),
            "no promptd binary at {}: run this through `cargo test -p promptd` or `cargo bench -p promptd`",
            bin.display()
        );
        bin
    })
    .clone()
}

/// Builds a wasm32-wasip2 workspace (release) and returns its output folder.
pub fn build_wasm_workspace(dir: &str) -> PathBuf {
    let root = repo_root();
    let manifest = root.join(dir).join("Cargo.toml");
    let target_dir = root.join(dir).join("target");
    let status = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "--release", "--target", "wasm32-wasip2"])
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target_dir)
        .status()
        .expect("run cargo");
    assert!(
        status.success(),
        "building {dir} for wasm32-wasip2 failed; `cargo xtask test` installs the target \
         (rustup target add wasm32-wasip2)"
    );
    target_dir.join("wasm32-wasip2").join("release")
}

/// The bundled plugins (plugins/), built once per test binary.
pub fn bundled() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| build_wasm_workspace("plugins"))
}

/// A shipped plugin, built by `cargo xtask plugins` into target/plugins: the Rust ones and those
/// written with the JavaScript, Python and C SDKs (skills, documents, datetime). The xtask
/// rebuilds only what changed.
pub fn shipped(name: &str) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = repo_root();
        // Its own target dir: the `cargo test` running this may still hold target/'s lock.
        let status = Command::new(env!("CARGO"))
            .args(["run", "--quiet", "--package", "xtask", "--target-dir"])
            .arg(root.join("target/xtask"))
            .args(["--", "plugins"])
            .current_dir(&root)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("run cargo xtask plugins");
        assert!(
            status.success(),
            "`cargo xtask plugins` failed; `cargo xtask sdks` installs the JavaScript, Python and C toolchains"
        );
        root.join("target/plugins")
    })
    .join(format!("{name}.wasm"))
}

/// Builds the plugin in `src` with `sdk/LANG/build.sh` (js, python, c) into `out`; `pure`
/// asks for a component that imports no WASI (`PROMPTD_PURE=1`).
pub fn sdk_build(lang: &str, src: &Path, out: &Path, pure: bool) {
    let script = repo_root().join("sdk").join(lang).join("build.sh");
    let o = Command::new("bash")
        .arg(&script)
        .arg(src)
        .arg(out)
        .env("PROMPTD_PURE", if pure { "1" } else { "0" })
        .output()
        .expect("run bash");
    assert!(
        o.status.success(),
        "{} {} failed (`cargo xtask sdks` installs the toolchain):\n{}",
        script.display(),
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Where one-shot `promptd` runs in tests keep compiled plugins: shared by every test and test
/// binary, so a 12-18 MB JavaScript or Python component is compiled once per build, not per test.
pub fn compile_cache() -> PathBuf {
    repo_root().join("target/test-compile-cache")
}

/// A test-only plugin from tests/fixtures (`scripted`, `versioned_v1`, `versioned_v2`), built
/// once per test binary.
pub fn fixture(name: &str) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| build_wasm_workspace("tests/fixtures"))
        .join(format!("{name}.wasm"))
}

/// A component built against `promptd:plugin@0.1.0` before the world moved
/// (tests/fixtures/plugin-0.1.0/NAME.wasm.gz): [`archived`] for 0.1.0.
pub fn old_world(name: &str) -> PathBuf {
    archived("0.1.0", name)
}

/// A component built against `promptd:plugin@WORLD` with that world's SDKs, before the world
/// moved (tests/fixtures/plugin-WORLD/NAME.wasm.gz), unpacked once per test binary (by an
/// atomic rename, so test binaries running side by side never see half a file).
pub fn archived(world: &str, name: &str) -> PathBuf {
    static DONE: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let dir = repo_root().join(format!("target/test-artifacts/plugin-{world}"));
    let out = dir.join(format!("{name}.wasm"));
    let key = format!("{world}/{name}");
    let mut done = DONE.lock().unwrap_or_else(|p| p.into_inner());
    if !done.contains(&key) {
        std::fs::create_dir_all(&dir).expect("create the unpack folder");
        let packed = repo_root().join(format!("tests/fixtures/plugin-{world}/{name}.wasm.gz"));
        let o = Command::new("gzip")
            .arg("-dc")
            .arg(&packed)
            .output()
            .expect("run gzip");
        assert!(
            o.status.success(),
            "gzip -dc {}: {}",
            packed.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        put(&dir, name, &o.stdout);
        done.push(key);
    }
    out
}

/// The `scripted` fixture: its declaration comes from its config.
pub fn scripted() -> PathBuf {
    fixture("scripted")
}

/// Puts `bytes` into `dir` as `NAME.wasm` the way build tools should: write a temporary file,
/// then rename it into place.
pub fn put(dir: &Path, name: &str, bytes: &[u8]) {
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, bytes).expect("write");
    std::fs::rename(&tmp, dir.join(format!("{name}.wasm"))).expect("rename");
}

/// Waits (bounded) until `check` holds; panics with `what` otherwise.
pub fn eventually(what: &str, check: impl FnMut() -> bool) {
    eventually_within(15, what, check)
}

/// [`eventually`] with its own bound, in seconds.
pub fn eventually_within(secs: u64, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if check() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("timed out waiting for: {what}");
}

/// A temporary plugins folder.
pub struct Folder {
    /// Removed with the folder.
    pub dir: tempfile::TempDir,
}

impl Default for Folder {
    fn default() -> Self {
        Self::new()
    }
}

impl Folder {
    /// An empty folder.
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Copies a bundled plugin in as `NAME.wasm`.
    pub fn bundled(self, name: &str) -> Self {
        let from = bundled().join(format!("{name}.wasm"));
        std::fs::copy(&from, self.path().join(format!("{name}.wasm")))
            .unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
        self
    }

    /// Copies a shipped plugin (see [`shipped`]) in as `NAME.wasm`.
    pub fn shipped(self, name: &str) -> Self {
        std::fs::copy(shipped(name), self.path().join(format!("{name}.wasm"))).expect("copy");
        self
    }

    /// Copies the scripted fixture in as `NAME.wasm`.
    pub fn scripted(self, name: &str) -> Self {
        std::fs::copy(scripted(), self.path().join(format!("{name}.wasm"))).expect("copy");
        self
    }

    /// Writes raw bytes as `NAME.wasm`.
    pub fn bytes(self, name: &str, bytes: &[u8]) -> Self {
        std::fs::write(self.path().join(format!("{name}.wasm")), bytes).expect("write");
        self
    }

    /// Writes `promptd.toml` into the folder (with `plugin_dir = "."`) and returns its path.
    pub fn config(&self, body: &str) -> PathBuf {
        let path = self.path().join("promptd.toml");
        std::fs::write(&path, format!("plugin_dir = \".\"\n{body}")).expect("write config");
        path
    }

    /// A real `promptd serve` on this folder with `config` (written as its promptd.toml) and a
    /// fresh state folder, ready; the temp dir holds the state and goes with the daemon.
    pub fn serve(&self, config: &str) -> (daemon::Served, tempfile::TempDir) {
        let config = self.config(config);
        let (tmp, state) = daemon::state_dir();
        (daemon::Served::start(self.path(), &config, &state), tmp)
    }
}

impl Folder {
    /// `promptd assemble --plugins FOLDER --config CONFIG EXTRA...`, expecting success.
    pub fn assemble(&self, config: &Path, extra: &[&str]) -> String {
        ok(&self.assemble_args(config, extra))
    }

    /// The same, expecting `error[CODE]`; returns the error line.
    pub fn assemble_fails(&self, config: &Path, extra: &[&str], code: &str) -> String {
        fails(&self.assemble_args(config, extra), code)
    }

    fn assemble_args<'a>(&'a self, config: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec!["assemble", "--plugins", self.path().to_str().unwrap()];
        args.extend(["--config", config.to_str().unwrap()]);
        args.extend_from_slice(extra);
        args
    }
}

/// The real `promptd` binary, quiet, with the tests' shared compile cache.
pub fn promptd_command() -> Command {
    let mut cmd = Command::new(promptd_bin());
    cmd.env_remove("PROMPTD_LOG")
        .env("PROMPTD_CACHE", compile_cache());
    cmd
}

/// Runs the real `promptd` binary.
pub fn promptd(args: &[&str]) -> Output {
    promptd_command().args(args).output().expect("run promptd")
}

/// A run's stdout, as UTF-8.
pub fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("utf-8 stdout")
}

/// A run's stderr, as UTF-8.
pub fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).expect("utf-8 stderr")
}

/// Runs promptd and expects success; returns stdout.
pub fn ok(args: &[&str]) -> String {
    let o = promptd(args);
    assert!(
        o.status.success(),
        "promptd {args:?} failed:\n{}",
        stderr(&o)
    );
    stdout(&o)
}

/// Runs promptd and expects exit 1 with a single `error[CODE]:` line; returns that line.
pub fn fails(args: &[&str], code: &str) -> String {
    let o = promptd(args);
    assert_eq!(
        o.status.code(),
        Some(1),
        "promptd {args:?} should fail: {}",
        stdout(&o)
    );
    let err = stderr(&o);
    let line = err.trim_end();
    assert!(
        !line.contains('\n'),
        "expected one line on stderr, got:\n{err}"
    );
    assert!(
        line.starts_with(&format!("error[{code}]: ")),
        "expected error[{code}], got: {line}"
    );
    line.to_string()
}

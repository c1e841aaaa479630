//! Compiling in a child process (L7), so a compile bomb costs a bounded time and memory.
//!
//! Cranelift's time and memory grow faster than a plugin's size: 100,000 `table.get`
//! instructions (500 KB) take a minute and 1.4 GB. In-process, nothing could stop that, and the
//! allocator would keep what the compiler used long after (a cold JavaScript plugin left the
//! daemon at 354 MB resident). So the engine runs `promptd compile --out FILE` (the running
//! binary itself: same wasmtime, same settings, so its artifact loads here), feeds it the
//! component on stdin, and gives it an address-space cap (`RLIMIT_AS`) and a deadline (it is
//! killed at expiry). The artifact is written to a file the parent maps, usually straight into
//! the compile cache; the parent never holds the compiler's memory.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use promptd_core::load::CacheLookup;
use promptd_core::plugin::sandbox::Sandbox;
use promptd_core::sync::lock;
use promptd_core::Error;
use wasmtime::component::Component;
use wasmtime::Engine;

use crate::cache::{scratch_path, CompileCache};
use crate::EngineError;

/// The hidden subcommand the child runs.
pub const SUBCOMMAND: &str = "compile";

/// The child's exit status when wasmtime refused the bytes (its message is on stderr).
const EXIT_REFUSED: u8 = 3;
/// The child's exit status when compiling ran out of memory with an error, not an abort.
const EXIT_MEMORY: u8 = 4;
/// The child's exit status when it could not read its input or write its output.
const EXIT_IO: u8 = 5;

/// Most of the child's stderr kept for messages.
const STDERR_KEPT: u64 = 16 << 10;

/// How to start the compiler: the `promptd` executable to run as `EXE compile --out FILE`.
#[derive(Clone, Debug)]
pub struct Compiler {
    exe: PathBuf,
    /// Shared by every compile this compiler (and its clones) runs.
    budget: Arc<Budget>,
}

/// The address space all compiling children may reserve at once (`compile_memory_total_mb`):
/// each takes its own cap (`compile_memory_mb`) from it before it starts and gives it back when
/// it ends, so parallel loads cannot reserve more together.
#[derive(Debug)]
struct Budget {
    total: u64,
    used: Mutex<u64>,
    freed: Condvar,
}

impl Budget {
    /// Waits until `bytes` fit (a compile wanting more than the whole budget waits for all of
    /// it and runs alone); the reservation ends with the guard.
    fn reserve(&self, bytes: u64) -> Reserved<'_> {
        let bytes = bytes.min(self.total);
        let mut used = lock(&self.used);
        while *used + bytes > self.total {
            used = self.freed.wait(used).unwrap_or_else(|e| e.into_inner());
        }
        *used += bytes;
        Reserved {
            budget: self,
            bytes,
        }
    }
}

struct Reserved<'a> {
    budget: &'a Budget,
    bytes: u64,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        *lock(&self.budget.used) -= self.bytes;
        self.budget.freed.notify_all();
    }
}

impl Compiler {
    /// A compiler that runs `exe` (a `promptd` executable), its compiles together within the
    /// default `compile_memory_total_mb`.
    pub fn new(exe: impl Into<PathBuf>) -> Self {
        Self {
            exe: exe.into(),
            budget: Arc::new(Budget {
                total: promptd_core::limits::defaults::COMPILE_MEMORY_TOTAL_MB << 20,
                used: Mutex::new(0),
                freed: Condvar::new(),
            }),
        }
    }

    /// The same compiler, its compiles together within `bytes` of address space
    /// (`[limits] compile_memory_total_mb`).
    pub fn with_memory_total(mut self, bytes: u64) -> Self {
        self.budget = Arc::new(Budget {
            total: bytes.max(1),
            used: Mutex::new(0),
            freed: Condvar::new(),
        });
        self
    }

    /// The running executable. On Linux `/proc/self/exe`, which stays the binary this process
    /// runs even after an upgrade replaced the file: a child of another version would write
    /// artifacts this engine refuses.
    pub fn current_exe() -> std::io::Result<Self> {
        let proc = Path::new("/proc/self/exe");
        if cfg!(target_os = "linux") && proc.exists() {
            return Ok(Self::new(proc));
        }
        std::env::current_exe().map(Self::new)
    }

    /// The compiled component for `bytes` (the plugin `plugin`): from `cache` when it holds
    /// it, else compiled by a child under `sandbox`'s compile limits (and kept in `cache`).
    pub(crate) fn component(
        &self,
        engine: &Engine,
        cache: Option<&CompileCache>,
        plugin: &str,
        bytes: &[u8],
        sha256: &str,
        sandbox: &Sandbox,
    ) -> Result<(Component, Option<CacheLookup>), Error> {
        let unusable = |e: wasmtime::Error| Error::Engine {
            context: format!("loading the compiled plugin `{plugin}`"),
            source: e.into(),
        };
        let compile = |out: &Path| self.compile(plugin, bytes, out, sandbox);
        // Without a (writable) cache: a private folder, so nobody else can swap the file
        // before it is mapped.
        let uncached = || {
            let dir = private_dir().map_err(|e| Error::Engine {
                context: format!("compiling plugin `{plugin}`: a temporary folder"),
                source: e.into(),
            })?;
            let out = dir.join("component.cwasm");
            let compiled = compile(&out);
            // SAFETY: just written by the compiler child with this engine's settings, in a
            // folder only this user can write.
            let component = compiled.map(|()| unsafe { Component::deserialize_file(engine, &out) });
            let _ = std::fs::remove_dir_all(&dir);
            component?.map_err(unusable)
        };
        match cache {
            Some(cache) => cache
                .get_or_compile_into(engine, sha256, compile, unusable, uncached)
                .map(|(c, lookup)| (c, Some(lookup))),
            None => Ok((uncached()?, None)),
        }
    }

    /// Compiles `bytes` (the plugin `plugin`) in a child under `sandbox`'s compile limits,
    /// which writes the serialized component to `out`. On error `out` does not exist.
    pub(crate) fn compile(
        &self,
        plugin: &str,
        bytes: &[u8],
        out: &Path,
        sandbox: &Sandbox,
    ) -> Result<(), Error> {
        let result = self.run(plugin, bytes, out, sandbox);
        if result.is_err() {
            let _ = std::fs::remove_file(out);
        }
        result
    }

    fn run(&self, plugin: &str, bytes: &[u8], out: &Path, sandbox: &Sandbox) -> Result<(), Error> {
        let failed = |what: &str, cause: String| Error::Engine {
            context: format!("compiling plugin `{plugin}` in {}", self.exe.display()),
            source: format!("{what}: {cause}").into(),
        };
        let mut command = Command::new(&self.exe);
        command
            .arg(SUBCOMMAND)
            .arg("--out")
            .arg(out)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        limit(&mut command, sandbox.compile_memory_bytes);
        let waiting = Instant::now();
        let _reserved = self.budget.reserve(sandbox.compile_memory_bytes);
        if waiting.elapsed() > Duration::from_millis(10) {
            tracing::debug!(
                plugin,
                ms = waiting.elapsed().as_millis() as u64,
                "compile waited for compile_memory_total_mb"
            );
        }
        // The deadline counts from here: waiting for the budget is not the plugin's time.
        let started = Instant::now();
        let mut child = command
            .spawn()
            .map_err(|e| failed("cannot start the compiler", e.to_string()))?;
        let (Some(mut stdin), Some(stderr)) = (child.stdin.take(), child.stderr.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(failed("cannot start the compiler", "no pipes".into()));
        };
        // Feeding stdin and draining stderr run beside the wait, so a child that stops reading
        // or writes much still meets its deadline.
        let (status, message) = std::thread::scope(|scope| {
            scope.spawn(move || {
                // A child that dies early closes the pipe; its status tells why.
                let _ = stdin.write_all(bytes);
            });
            let reader = scope.spawn(move || {
                let mut kept = Vec::new();
                let mut stderr = stderr;
                let _ = stderr.by_ref().take(STDERR_KEPT).read_to_end(&mut kept);
                let _ = std::io::copy(&mut stderr, &mut std::io::sink());
                String::from_utf8_lossy(&kept).trim().to_string()
            });
            let status = wait(&mut child, started + sandbox.compile_deadline);
            (status, reader.join().unwrap_or_default())
        });
        let ms = started.elapsed().as_millis() as u64;
        let status = match status {
            Waited::Exited(status) => status,
            Waited::TimedOut => {
                tracing::warn!(
                    plugin,
                    ms,
                    "compile deadline exceeded: the compiler was killed"
                );
                return Err(Error::CompileLimit {
                    plugin: plugin.into(),
                    exceeded: format!(
                        "took longer than {} ms",
                        sandbox.compile_deadline.as_millis()
                    ),
                    key: "compile_timeout_ms",
                });
            }
            Waited::Failed(e) => return Err(failed("cannot wait for the compiler", e)),
        };
        tracing::debug!(plugin, ms, %status, "compiler exited");
        match classify(status, &message) {
            Outcome::Compiled => Ok(()),
            Outcome::Refused => Err(Error::NotAComponent {
                plugin: plugin.into(),
                cause: one_line(&message),
                source: None,
            }),
            Outcome::OutOfMemory => Err(Error::CompileLimit {
                plugin: plugin.into(),
                exceeded: format!(
                    "needed more than {} MiB of memory",
                    sandbox.compile_memory_bytes >> 20
                ),
                key: "compile_memory_mb",
            }),
            Outcome::Failed => Err(failed(
                &format!("the compiler failed ({status})"),
                one_line(&message),
            )),
        }
    }
}

/// Sets the child's limits, applied between fork and exec.
fn limit(command: &mut Command, memory_bytes: u64) {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure runs in the forked child before exec, and only makes
        // async-signal-safe system calls on values copied in; it allocates nothing.
        unsafe {
            command.pre_exec(move || {
                let cap = libc::rlimit {
                    rlim_cur: memory_bytes as libc::rlim_t,
                    rlim_max: memory_bytes as libc::rlim_t,
                };
                if libc::setrlimit(libc::RLIMIT_AS, &cap) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // An abort at the memory cap must not leave a core file behind.
                let none = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::setrlimit(libc::RLIMIT_CORE, &none);
                // A compiler outliving a killed daemon would burn its deadline for nothing.
                #[cfg(target_os = "linux")]
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
    }
    #[cfg(not(unix))]
    let _ = (command, memory_bytes);
}

enum Waited {
    Exited(ExitStatus),
    TimedOut,
    Failed(String),
}

/// Waits for `child` until `deadline`, then kills it. Polls (a few ms apart, backing off)
/// rather than waiting in another thread, so the child is only ever killed before it has been
/// reaped, never a process that reused its pid.
fn wait(child: &mut std::process::Child, deadline: Instant) -> Waited {
    let mut pause = Duration::from_millis(1);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Waited::Exited(status),
            Ok(None) => {}
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Waited::Failed(e.to_string());
            }
        }
        let now = Instant::now();
        if now >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Waited::TimedOut;
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Compiled,
    Refused,
    OutOfMemory,
    Failed,
}

/// What the child's exit says. At the address-space cap an allocation fails and Rust aborts
/// with "memory allocation of N bytes failed"; a thread that cannot get its stack fails with
/// ENOMEM ("Cannot allocate memory") and panics; wasmtime's own checks exit `EXIT_MEMORY`.
fn classify(status: ExitStatus, stderr: &str) -> Outcome {
    match status.code() {
        Some(0) => return Outcome::Compiled,
        Some(c) if c == i32::from(EXIT_REFUSED) => return Outcome::Refused,
        Some(c) if c == i32::from(EXIT_MEMORY) => return Outcome::OutOfMemory,
        Some(c) if c == i32::from(EXIT_IO) => return Outcome::Failed,
        _ => {}
    }
    let out_of_memory = [
        "memory allocation of",
        "Cannot allocate memory",
        "out of memory",
        // The dynamic loader, when the cap is too small to even start.
        "failed to map segment",
    ];
    if out_of_memory.iter().any(|m| stderr.contains(m)) {
        Outcome::OutOfMemory
    } else {
        Outcome::Failed
    }
}

fn one_line(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.is_empty() {
        "(no message)".into()
    } else {
        line
    }
}

/// A new folder only this user may enter, in the system's temporary folder.
fn private_dir() -> std::io::Result<PathBuf> {
    let dir = scratch_path(&std::env::temp_dir().join("promptd-compile"));
    let mut builder = std::fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    // `create` fails on an existing name, so a planted folder or link is never used.
    builder.create(&dir)?;
    Ok(dir)
}

/// The settings of every promptd engine. The compiler child (L7) uses them too, so its
/// artifacts load in the parent.
pub(crate) fn settings(config: &mut wasmtime::Config) -> &mut wasmtime::Config {
    config.wasm_component_model(true).epoch_interruption(true)
}

/// An engine with [`crate::WasmEngine::new`]'s settings that only compiles (the compiler child).
fn compiling_engine() -> Result<Engine, EngineError> {
    Engine::new(settings(&mut wasmtime::Config::new())).map_err(EngineError::Init)
}

/// The child's side, `promptd compile --out FILE [INPUT]`: reads the component from INPUT or
/// stdin, compiles it with the engine's settings and writes the serialized artifact to FILE
/// (written beside, then renamed). Exit statuses are the parent's protocol: 0 compiled,
/// `EXIT_REFUSED` not a valid component, `EXIT_MEMORY` out of memory, `EXIT_IO` files.
pub fn child_main(input: Option<&Path>, out: &Path) -> ExitCode {
    let bytes = match input {
        Some(path) => std::fs::read(path),
        None => {
            let mut bytes = Vec::new();
            std::io::stdin().read_to_end(&mut bytes).map(|_| bytes)
        }
    };
    let bytes = match bytes {
        Ok(bytes) => bytes,
        Err(e) => {
            eprintln!("cannot read the component: {e}");
            return ExitCode::from(EXIT_IO);
        }
    };
    let engine = match compiling_engine() {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EXIT_IO);
        }
    };
    let artifact = match engine.precompile_component(&bytes) {
        Ok(artifact) => artifact,
        Err(e) => {
            eprintln!("{e:#}");
            return ExitCode::from(if out_of_memory(&e) {
                EXIT_MEMORY
            } else {
                EXIT_REFUSED
            });
        }
    };
    drop(bytes);
    let tmp = scratch_path(out);
    let written = std::fs::write(&tmp, &artifact).and_then(|()| std::fs::rename(&tmp, out));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        eprintln!("cannot write {}: {e}", out.display());
        return ExitCode::from(EXIT_IO);
    }
    ExitCode::SUCCESS
}

/// Whether a compile error is the memory cap rather than the component's fault.
fn out_of_memory(e: &wasmtime::Error) -> bool {
    e.chain().any(|cause| {
        cause.is::<wasmtime::OutOfMemory>()
            || cause
                .downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::OutOfMemory)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[cfg(unix)]
    fn status(code: i32) -> ExitStatus {
        use std::os::unix::process::ExitStatusExt;
        ExitStatus::from_raw(code << 8)
    }

    #[cfg(unix)]
    #[test]
    fn l7_parallel_compiles_reserve_at_most_the_total_together() {
        let budget = Budget {
            total: 4 << 30,
            used: Mutex::new(0),
            freed: Condvar::new(),
        };
        let (now, most) = (AtomicU64::new(0), AtomicU64::new(0));
        std::thread::scope(|scope| {
            for _ in 0..6 {
                scope.spawn(|| {
                    let _held = budget.reserve(2 << 30);
                    let running = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(running, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(30));
                    now.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        assert_eq!(
            most.load(Ordering::SeqCst),
            2,
            "two 2 GiB compiles fit in 4 GiB"
        );
        assert_eq!(*lock(&budget.used), 0, "every reservation was given back");
        // One larger than the whole budget runs, alone.
        let held = budget.reserve(8 << 30);
        assert_eq!(*lock(&budget.used), 4 << 30);
        drop(held);
    }

    #[test]
    fn l7_exit_statuses_say_what_happened() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(classify(status(0), ""), Outcome::Compiled);
        assert_eq!(classify(status(3), "invalid"), Outcome::Refused);
        assert_eq!(classify(status(4), ""), Outcome::OutOfMemory);
        let abort = ExitStatus::from_raw(libc::SIGABRT);
        assert_eq!(
            classify(abort, "memory allocation of 4096 bytes failed"),
            Outcome::OutOfMemory
        );
        assert_eq!(classify(abort, ""), Outcome::Failed);
        assert_eq!(
            classify(
                status(101),
                "failed to spawn thread: Cannot allocate memory"
            ),
            Outcome::OutOfMemory
        );
        assert_eq!(classify(status(5), "cannot write"), Outcome::Failed);
    }
}

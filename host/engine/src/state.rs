//! A plugin instance's store and its host state: WASI with exactly the sandbox's grants (L1),
//! the memory cap (L2), the log budget of the running call (L9) with stdout and stderr
//! forwarded to it, and a trap described in the config's words.

use std::sync::Arc;

use promptd_core::plugin::provider::{CallError, CallResult};
use promptd_core::plugin::sandbox::Sandbox;
use wasmtime::component::ResourceTable;
use wasmtime::{Engine, Store, StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxView, WasiView};

use crate::log::{CallLog, Level, PluginLog};

/// The memory cap of one store (L2). It remembers a refused growth, so the trap it causes is
/// reported as the limit it is, not as the engine's backtrace.
struct MemoryCap {
    bytes: usize,
    exceeded: Option<usize>,
    /// Tables and instances: wasmtime's defaults, trapping like memory.
    others: StoreLimits,
}

impl wasmtime::ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.bytes {
            self.exceeded = Some(desired);
            wasmtime::bail!("memory limit of {} bytes exceeded", self.bytes);
        }
        self.others.memory_growing(current, desired, maximum)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.others.table_growing(current, desired, maximum)
    }
}

/// Per-store host state: WASI with no grants, the memory limiter, and the plugin id for logs.
pub(crate) struct State {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: MemoryCap,
    /// The last error-level log line, attached to a trap's message (the SDKs log panics).
    last_error: Option<String>,
    /// The log budget of the running call (L9), shared with stdout/stderr.
    log: Arc<CallLog>,
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl State {
    /// The plugin's `log` import, in the host's terms (each world converts its level).
    pub(crate) fn log(&mut self, level: Level, message: &str) {
        if level == Level::Error {
            self.last_error = Some(message.chars().take(2000).collect());
        }
        self.log.write(level, None, message);
    }

    /// The log budget of the running call.
    pub(crate) fn call_log(&self) -> &Arc<CallLog> {
        &self.log
    }
}

/// A store whose WASI grants exactly what the sandbox says (L1): by default nothing — no
/// preopened directories, environment, arguments, stdin or network.
pub(crate) fn new_store(
    engine: &Engine,
    sandbox: &Sandbox,
    plugin_log: &Arc<PluginLog>,
) -> CallResult<Store<State>> {
    let mut wasi = WasiCtx::builder();
    for (host, guest) in &sandbox.dirs {
        wasi.preopened_dir(host, guest, FsPerms::ReadOnly)
            .map_err(|e| {
                CallError::Failed(format!("granted directory {}: {e:#}", host.display()))
            })?;
    }
    wasi.envs(&sandbox.env);
    let log = CallLog::new(plugin_log.clone());
    if sandbox.stdio_to_log {
        wasi.stdout(LogStream::new(&log, "stdout"));
        wasi.stderr(LogStream::new(&log, "stderr"));
    }
    let state = State {
        wasi: wasi.build(),
        table: ResourceTable::new(),
        limits: MemoryCap {
            bytes: sandbox.memory_bytes,
            exceeded: None,
            others: StoreLimitsBuilder::new().trap_on_grow_failure(true).build(),
        },
        last_error: None,
        log,
    };
    let mut store = Store::new(engine, state);
    store.limiter(|s| &mut s.limits);
    Ok(store)
}

/// Describes a trap, with the plugin's last error log line (e.g. its panic message).
pub(crate) fn trap(e: &wasmtime::Error, store: &mut Store<State>) -> CallError {
    let mut message = match e.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::Interrupt) => "deadline exceeded (the call was interrupted)".into(),
        Some(t) => t.to_string(),
        None => root_cause(e),
    };
    // Said first, in the config's words; the engine's backtrace follows.
    if let Some(wanted) = store.data_mut().limits.exceeded.take() {
        message = format!(
            "memory limit of {} MiB exceeded (memory_mb): the plugin asked for {} MiB; {message}",
            store.data().limits.bytes >> 20,
            wanted.div_ceil(1 << 20)
        );
    }
    if let Some(logged) = store.data_mut().last_error.take() {
        message = format!("{message}; the plugin logged: {logged}");
    }
    CallError::Trapped(message)
}

/// The error chain on one line (wasmtime's messages may span several).
pub(crate) fn root_cause(e: &wasmtime::Error) -> String {
    format!("{e:#}")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// A plugin's stdout or stderr, forwarded line by line to the host log with its id, under the
/// same budget as its `log` calls (L9).
struct LogStream {
    log: Arc<CallLog>,
    stream: &'static str,
}

impl LogStream {
    fn new(log: &Arc<CallLog>, stream: &'static str) -> Self {
        Self {
            log: log.clone(),
            stream,
        }
    }
}

impl wasmtime_wasi::cli::IsTerminal for LogStream {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl wasmtime_wasi::cli::StdoutStream for LogStream {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(LogWriter {
            log: self.log.clone(),
            stream: self.stream,
            line: Vec::new(),
        })
    }
}

struct LogWriter {
    log: Arc<CallLog>,
    stream: &'static str,
    line: Vec<u8>,
}

impl LogWriter {
    /// Longest line kept before it is logged anyway.
    const MAX_LINE: usize = 4096;

    fn emit(&mut self) {
        let text = String::from_utf8_lossy(&self.line);
        self.log
            .write(Level::Info, Some(self.stream), text.trim_end());
        self.line.clear();
    }
}

impl tokio::io::AsyncWrite for LogWriter {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        for &b in buf {
            if b == b'\n' || self.line.len() >= Self::MAX_LINE {
                self.emit();
            }
            if b != b'\n' {
                self.line.push(b);
            }
        }
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if !self.line.is_empty() {
            self.emit();
        }
        std::task::Poll::Ready(Ok(()))
    }
}

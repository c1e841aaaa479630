//! The WebAssembly edge: load a component, check it implements the world, call it.
//!
//! One [`WasmEngine`] owns the engine and the linker; each loaded plugin becomes a
//! [`WasmProvider`] holding a warm instance (instantiating per call is slow for Python and
//! JavaScript guests). Every call runs under an epoch deadline, so a looping guest is stopped,
//! and every store has a memory cap. A trapped instance is never re-entered: it is dropped and a
//! fresh one is made from the pre-instantiated component on the next call.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{Engine, Store, StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxView, WasiView};

use promptd_core::load::{CacheLookup, Engine as PluginEngine, Instantiated, LoadRequest};
use promptd_core::model::{self, Content, Declaration, Scope, Step};
use promptd_core::provider::{CallError, CallResult, Provider};
use promptd_core::sandbox::Sandbox;
use promptd_core::Error;

use crate::cache::CompileCache;
use crate::compile::Compiler;
use crate::log::{CallLog, Level, PluginLog};
use crate::EngineError;

mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "plugin",
    });
}

use bindings::promptd::plugin::types as wit;
use bindings::{Plugin, PluginPre};

/// How long one epoch tick lasts; deadlines are counted in ticks.
const TICK: Duration = Duration::from_millis(5);

/// The engine, the linker and the epoch ticker shared by every loaded plugin.
pub struct WasmEngine {
    engine: Engine,
    linker: Linker<State>,
    stop: Arc<AtomicBool>,
    cache: Option<CompileCache>,
    /// Compiles in a bounded child process (L7); `None` compiles in this process, unbounded.
    compiler: Option<Compiler>,
}

impl Drop for WasmEngine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl WasmEngine {
    pub fn new() -> Result<Self, EngineError> {
        Self::with_config(wasmtime::Config::new())
    }

    /// The same engine on wasmtime's pooling instance allocator, for the `instances` bench
    /// (BENCHMARKS.md): it was measured and not kept, because promptd instantiates only at load
    /// and after a trap, never per step.
    #[cfg(feature = "pooling")]
    pub fn with_pooling_allocator() -> Result<Self, EngineError> {
        let mut pooling = wasmtime::PoolingAllocationConfig::default();
        pooling.max_memory_size(1 << 30);
        let mut config = wasmtime::Config::new();
        config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pooling));
        Self::with_config(config)
    }

    fn with_config(mut config: wasmtime::Config) -> Result<Self, EngineError> {
        let engine = Engine::new(settings(&mut config)).map_err(EngineError::Init)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(EngineError::Init)?;
        Plugin::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)
            .map_err(EngineError::Init)?;

        // `tokio::time::timeout` cannot stop a busy guest; epoch interruption can. One thread
        // advances the epoch; each call sets its deadline in ticks.
        let stop = Arc::new(AtomicBool::new(false));
        let (ticker_engine, ticker_stop) = (engine.weak(), stop.clone());
        thread::Builder::new()
            .name("promptd-epoch".into())
            .spawn(move || {
                while !ticker_stop.load(Ordering::Relaxed) {
                    thread::sleep(TICK);
                    match ticker_engine.upgrade() {
                        Some(engine) => engine.increment_epoch(),
                        None => break,
                    }
                }
            })
            .map_err(EngineError::Ticker)?;
        Ok(Self {
            engine,
            linker,
            stop,
            cache: None,
            compiler: None,
        })
    }

    /// Compiles plugins in child processes started with `compiler`, each bounded by its
    /// plugin's `compile_timeout_ms` and `compile_memory_mb` (L7), instead of in this one.
    pub fn with_compiler(mut self, compiler: Compiler) -> Self {
        self.compiler = Some(compiler);
        self
    }

    /// Keeps compiled code in `dir` (H4), bounded to `max_bytes`.
    pub fn with_cache(
        mut self,
        dir: &std::path::Path,
        max_bytes: u64,
    ) -> Result<Self, EngineError> {
        let cache = CompileCache::new(dir, &self.engine, max_bytes).map_err(|source| {
            EngineError::CacheDir {
                path: dir.to_path_buf(),
                source,
            }
        })?;
        self.cache = Some(cache);
        Ok(self)
    }

    pub fn cache(&self) -> Option<&CompileCache> {
        self.cache.as_ref()
    }

    /// Compiles `bytes` as the plugin `id`, checks the world, instantiates it and calls
    /// `declare(config)`. Nothing is validated against the registry here; see
    /// [`promptd_core::registry::PluginEntry::new`].
    pub fn load(
        &self,
        id: &str,
        bytes: &[u8],
        sha256: &str,
        config: Vec<(String, String)>,
        sandbox: Sandbox,
    ) -> Result<(Declaration, Arc<WasmProvider>, Option<CacheLookup>), Error> {
        if let Some(cause) = precheck(bytes) {
            return Err(Error::NotAComponent {
                plugin: id.into(),
                cause: cause.into(),
                source: None,
            });
        }
        let compile = || Component::from_binary(&self.engine, bytes);
        let (component, lookup) = match (&self.compiler, &self.cache) {
            (Some(compiler), cache) => {
                compiler.component(&self.engine, cache.as_ref(), id, bytes, sha256, &sandbox)?
            }
            (None, Some(cache)) => cache
                .get_or_compile(&self.engine, sha256, compile)
                .map(|(c, l)| (c, Some(l)))
                .map_err(|e| not_a_component(id, e))?,
            (None, None) => compile()
                .map(|c| (c, None))
                .map_err(|e| not_a_component(id, e))?,
        };
        let wrong_world = |e: wasmtime::Error| Error::WrongWorld {
            plugin: id.into(),
            cause: root_cause(&e),
            source: e.into(),
        };
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(wrong_world)?;
        let pre = PluginPre::new(pre).map_err(wrong_world)?;
        let provider = WasmProvider {
            log: PluginLog::new(id, &sandbox),
            engine: self.engine.clone(),
            pre,
            sandbox,
            config,
            pool: Mutex::new(Pool::default()),
            returned: Condvar::new(),
            failures: AtomicU32::new(0),
        };
        let (declaration, instance) =
            provider
                .fresh_instance()
                .map_err(|e| Error::DeclareFailed {
                    plugin: id.into(),
                    cause: e.cause().to_string(),
                })?;
        provider.pool().live = 1;
        provider.checkin(Some(instance));
        Ok((declaration, Arc::new(provider), lookup))
    }
}

impl PluginEngine for WasmEngine {
    fn instantiate(&self, request: LoadRequest<'_>) -> Result<Instantiated, Error> {
        let (declaration, provider, cache) = self.load(
            request.id,
            request.bytes,
            request.sha256,
            request.config,
            request.sandbox,
        )?;
        Ok(Instantiated {
            declaration,
            provider,
            cache,
        })
    }

    fn cache_counts(&self) -> Option<(u64, u64)> {
        self.cache.as_ref().map(|c| (c.hits(), c.misses()))
    }
}

/// The settings of every promptd engine. The compiler child (L7) uses them too, so its
/// artifacts load in the parent.
fn settings(config: &mut wasmtime::Config) -> &mut wasmtime::Config {
    config.wasm_component_model(true).epoch_interruption(true)
}

/// An engine with [`WasmEngine::new`]'s settings that only compiles (the compiler child).
pub(crate) fn compiling_engine() -> Result<Engine, EngineError> {
    Engine::new(settings(&mut wasmtime::Config::new())).map_err(EngineError::Init)
}

fn not_a_component(plugin: &str, e: wasmtime::Error) -> Error {
    Error::NotAComponent {
        plugin: plugin.into(),
        cause: root_cause(&e),
        source: Some(e.into()),
    }
}

/// The error chain on one line (wasmtime's messages may span several).
fn root_cause(e: &wasmtime::Error) -> String {
    format!("{e:#}")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Plain words for the commonest wrong files, before the engine's parser speaks.
fn precheck(bytes: &[u8]) -> Option<&'static str> {
    const MAGIC: &[u8] = b"\0asm";
    const CORE_VERSION: &[u8] = &[1, 0, 0, 0];
    if bytes.is_empty() {
        return Some("the file is empty");
    }
    if !bytes.starts_with(MAGIC) {
        return Some("the file does not start with the WebAssembly magic bytes (wrong format?)");
    }
    if bytes.get(4..8) == Some(CORE_VERSION) {
        return Some(
            "this is a core WebAssembly module, not a component; build for wasm32-wasip2 or \
             wrap it with `wasm-tools component new`",
        );
    }
    None
}

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
struct State {
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

impl wit::Host for State {}

impl bindings::promptd::plugin::host::Host for State {
    fn log(&mut self, level: wit::Level, message: String) {
        if matches!(level, wit::Level::Error) {
            self.last_error = Some(message.chars().take(2000).collect());
        }
        let level = match level {
            wit::Level::Trace => Level::Trace,
            wit::Level::Debug => Level::Debug,
            wit::Level::Info => Level::Info,
            wit::Level::Warn => Level::Warn,
            wit::Level::Error => Level::Error,
        };
        self.log.write(level, None, &message);
    }
}

struct Instance {
    store: Store<State>,
    plugin: Plugin,
}

/// The warm instances not in use, and how many exist in all (idle or in a call).
#[derive(Default)]
struct Pool {
    idle: Vec<Instance>,
    live: usize,
}

/// A loaded component: a small pool of warm instances made from `pre`, so concurrent
/// assemblies do not queue behind one instance. A trapped instance is dropped, never reused;
/// the pool makes a fresh one when a call needs it.
pub struct WasmProvider {
    engine: Engine,
    pre: PluginPre<State>,
    sandbox: Sandbox,
    config: Vec<(String, String)>,
    pool: Mutex<Pool>,
    /// Signalled when an instance goes back to the pool or is dropped.
    returned: Condvar,
    /// Failed calls since the last successful one (L3: quarantine after too many).
    failures: AtomicU32,
    /// The plugin's log budget (L9), shared by its instances.
    log: Arc<PluginLog>,
}

impl WasmProvider {
    /// A store whose WASI grants exactly what the sandbox says (L1): by default nothing — no
    /// preopened directories, environment, arguments, stdin or network.
    fn new_store(&self) -> CallResult<Store<State>> {
        let mut wasi = WasiCtx::builder();
        for (host, guest) in &self.sandbox.dirs {
            wasi.preopened_dir(host, guest, FsPerms::ReadOnly)
                .map_err(|e| {
                    CallError::Failed(format!("granted directory {}: {e:#}", host.display()))
                })?;
        }
        wasi.envs(&self.sandbox.env);
        let log = CallLog::new(self.log.clone());
        if self.sandbox.stdio_to_log {
            wasi.stdout(LogStream::new(&log, "stdout"));
            wasi.stderr(LogStream::new(&log, "stderr"));
        }
        let state = State {
            wasi: wasi.build(),
            table: ResourceTable::new(),
            limits: MemoryCap {
                bytes: self.sandbox.memory_bytes,
                exceeded: None,
                others: StoreLimitsBuilder::new().trap_on_grow_failure(true).build(),
            },
            last_error: None,
            log,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        Ok(store)
    }

    fn deadline_ticks(&self) -> u64 {
        (self.sandbox.call_deadline.as_millis() / TICK.as_millis()).max(1) as u64
    }

    /// Output checks: a returned text larger than the sandbox allows is a plugin error.
    fn bounded(&self, what: &str, text: &str) -> CallResult<()> {
        let max = self.sandbox.max_output_bytes;
        if text.len() > max {
            return Err(CallError::Failed(format!(
                "{what} is {} bytes, over the limit of {max} bytes (max_output_kb)",
                text.len()
            )));
        }
        Ok(())
    }

    /// Instantiates and calls `declare`. The SDKs set up their dynamic callbacks in `declare`,
    /// so every fresh instance is declared again.
    fn fresh_instance(&self) -> CallResult<(Declaration, Instance)> {
        let mut store = self.new_store()?;
        store.set_epoch_deadline(self.deadline_ticks());
        let log = store.data().log.clone();
        log.begin();
        let declared = self
            .pre
            .instantiate(&mut store)
            .and_then(|plugin| Ok((plugin.call_declare(&mut store, &self.config)?, plugin)));
        log.end("declare");
        let (declared, plugin) = declared.map_err(|e| trap(e, &mut store))?;
        let declared = declared.map_err(CallError::Failed)?;
        let declaration = from_wit(declared);
        for (what, text) in declared_texts(&declaration) {
            self.bounded(&what, text)?;
        }
        Ok((declaration, Instance { store, plugin }))
    }

    fn pool(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An idle instance, or a fresh one while fewer than `max_instances` exist, or else the
    /// first one another call gives back.
    fn checkout(&self) -> CallResult<Instance> {
        let mut pool = self.pool();
        loop {
            if let Some(instance) = pool.idle.pop() {
                return Ok(instance);
            }
            if pool.live < self.sandbox.max_instances {
                pool.live += 1;
                drop(pool);
                // Instantiated outside the lock; `live` already counts it.
                return self.fresh_instance().map(|(_, i)| i).inspect_err(|_| {
                    self.pool().live -= 1;
                    self.returned.notify_one();
                });
            }
            pool = self.returned.wait(pool).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Gives an instance back, or (after a trap) drops it.
    fn checkin(&self, instance: Option<Instance>) {
        let mut pool = self.pool();
        match instance {
            Some(instance) => pool.idle.push(instance),
            None => pool.live -= 1,
        }
        drop(pool);
        self.returned.notify_one();
    }

    /// Runs `f` on a pooled instance under the call deadline. A trap drops the instance.
    fn call<T>(
        &self,
        f: impl FnOnce(&Plugin, &mut Store<State>) -> wasmtime::Result<Result<T, String>>,
    ) -> CallResult<T> {
        let mut instance = match self.checkout() {
            Ok(instance) => instance,
            Err(e) => {
                let err = Err(e);
                self.count(&err);
                return err;
            }
        };
        instance.store.set_epoch_deadline(self.deadline_ticks());
        let log = instance.store.data().log.clone();
        log.begin();
        let outcome = f(&instance.plugin, &mut instance.store);
        log.end("call");
        let result = match outcome {
            Ok(result) => {
                self.checkin(Some(instance));
                result.map_err(CallError::Failed)
            }
            Err(e) => {
                let err = trap(e, &mut instance.store);
                self.checkin(None); // never re-enter a trapped instance (L3)
                Err(err)
            }
        };
        self.count(&result);
        result
    }

    fn count<T>(&self, result: &CallResult<T>) {
        match result {
            Ok(_) => self.failures.store(0, Ordering::Relaxed),
            Err(_) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Checks a returned text, counting an oversized one as a failure.
    fn checked(&self, what: &str, result: CallResult<String>) -> CallResult<String> {
        let text = result?; // a failed call was counted already
        let checked = self.bounded(what, &text).map(|_| text);
        if checked.is_err() {
            self.count(&checked);
        }
        checked
    }
}

/// Describes a trap, with the plugin's last error log line (e.g. its panic message).
fn trap(e: wasmtime::Error, store: &mut Store<State>) -> CallError {
    let mut message = match e.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::Interrupt) => "deadline exceeded (the call was interrupted)".into(),
        Some(t) => t.to_string(),
        None => root_cause(&e),
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

impl Provider for WasmProvider {
    fn section_text(&self, name: &str, scope: &Scope, step: &Step) -> CallResult<String> {
        let (wscope, wstep) = (to_wit_scope(scope), to_wit_step(step));
        let result = self.call(|p, s| p.call_section_text(s, name, &wscope, &wstep));
        self.checked("the text", result)
    }

    fn context_text(&self, name: &str, scope: &Scope, step: &Step) -> CallResult<String> {
        let (wscope, wstep) = (to_wit_scope(scope), to_wit_step(step));
        let result = self.call(|p, s| p.call_context_text(s, name, &wscope, &wstep));
        self.checked("the text", result)
    }

    fn variable_value(&self, name: &str, scope: &Scope, step: &Step) -> CallResult<Option<String>> {
        let (wscope, wstep) = (to_wit_scope(scope), to_wit_step(step));
        let result = self.call(|p, s| p.call_variable_value(s, name, &wscope, &wstep));
        match result {
            Ok(Some(v)) => self.checked("the value", Ok(v)).map(Some),
            other => other,
        }
    }

    fn consecutive_failures(&self) -> u32 {
        self.failures.load(Ordering::Relaxed)
    }

    fn shown_tools(&self, step: &Step) -> CallResult<Vec<String>> {
        let step = to_wit_step(step);
        self.call(|p, s| p.call_shown_tools(s, &step))
    }
}

/// Every text a declaration carries, named for error messages.
fn declared_texts(d: &Declaration) -> Vec<(String, &str)> {
    fn text(c: &Content) -> Option<&str> {
        match c {
            Content::Static(t) => Some(t),
            Content::Dynamic => None,
        }
    }
    let mut out = Vec::new();
    for s in &d.sections {
        out.extend(text(&s.text).map(|t| (format!("section `{}`", s.name), t)));
    }
    for c in &d.contexts {
        out.extend(text(&c.text).map(|t| (format!("context `{}`", c.name), t)));
    }
    for v in &d.variables {
        out.extend(text(&v.value).map(|t| (format!("variable `{}`", v.name), t)));
    }
    for t in &d.tools {
        out.push((
            format!("tool `{}` description", t.name),
            t.description.as_str(),
        ));
        out.push((
            format!("tool `{}` parameters", t.name),
            t.parameters.as_str(),
        ));
    }
    out
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

fn to_wit_scope(scope: &Scope) -> wit::Scope {
    match scope {
        Scope::Global => wit::Scope::Global,
        Scope::Agent(a) => wit::Scope::Agent(a.clone()),
    }
}

fn to_wit_step(step: &Step) -> wit::Step {
    wit::Step {
        agent: step.agent.clone(),
        scope_chain: step.scope_chain.clone(),
        session_id: step.session_id.clone(),
        step_number: step.step_number,
        facts: step.facts.clone().into_iter().collect(),
    }
}

fn from_wit(d: wit::Declaration) -> Declaration {
    let scope = |s: wit::Scope| match s {
        wit::Scope::Global => Scope::Global,
        wit::Scope::Agent(a) => Scope::Agent(a),
    };
    let content = |c: wit::Content| match c {
        wit::Content::StaticText(t) => Content::Static(t),
        wit::Content::Dynamic => Content::Dynamic,
    };
    Declaration {
        sections: d
            .sections
            .into_iter()
            .map(|s| model::Section {
                name: s.name,
                order: s.order,
                text: content(s.text),
                complete: s.complete,
                scope: scope(s.scope),
            })
            .collect(),
        contexts: d
            .contexts
            .into_iter()
            .map(|c| model::Context {
                name: c.name,
                order: c.order,
                text: content(c.text),
                scope: scope(c.scope),
            })
            .collect(),
        variables: d
            .variables
            .into_iter()
            .map(|v| model::Variable {
                name: v.name,
                value: content(v.value),
                scope: scope(v.scope),
            })
            .collect(),
        tools: d
            .tools
            .into_iter()
            .map(|t| model::Tool {
                name: t.name,
                description: t.description,
                parameters: t.parameters,
                scope: scope(t.scope),
            })
            .collect(),
        filters_tools: d.filters_tools,
    }
}

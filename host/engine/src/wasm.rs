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

use promptd_core::sync::{lock, wait};
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{Engine, Store, StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxView, WasiView};

use promptd_core::load::{CacheLookup, Engine as PluginEngine, Instantiated, LoadRequest};
use promptd_core::plugin::model::{Content, Declaration, Scope, Step};
use promptd_core::plugin::provider::{CallError, CallResult, Evaluation, Provider, Wanted};
use promptd_core::plugin::provider::{ReviewInput, Verdict};
use promptd_core::plugin::sandbox::Sandbox;
use promptd_core::Error;

use crate::cache::CompileCache;
use crate::compile::Compiler;
use crate::log::{CallLog, Level, PluginLog};
use crate::worlds::{self, v0_1, v0_2, World};
use crate::EngineError;

/// A component ready to instantiate, in the world it implements.
enum Pre {
    V0_1(v0_1::PluginPre<State>),
    V0_2(v0_2::PluginPre<State>),
}

/// An instance's exports, in its world.
enum Exports {
    V0_1(v0_1::Plugin),
    V0_2(v0_2::Plugin),
}

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
    /// An engine with promptd's settings, the on-demand instance allocator and no compile cache.
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
        // Both worlds' imports: their interfaces are versioned, so they never clash.
        v0_1::Plugin::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)
            .map_err(EngineError::Init)?;
        v0_2::Plugin::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)
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

    /// Its compile cache, if it has one.
    pub fn cache(&self) -> Option<&CompileCache> {
        self.cache.as_ref()
    }

    /// Compiles `bytes` as the plugin `id`, checks the world, instantiates it and calls
    /// `declare(config)`. Nothing is validated against the registry here; see
    /// [`promptd_core::plugin::registry::PluginEntry::new`].
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
        let world = World::of(&component, &self.engine);
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(wrong_world)?;
        let pre = match world {
            World::V0_1 => Pre::V0_1(v0_1::PluginPre::new(pre).map_err(wrong_world)?),
            World::V0_2 => Pre::V0_2(v0_2::PluginPre::new(pre).map_err(wrong_world)?),
        };
        let provider = WasmProvider {
            log: PluginLog::new(id, &sandbox),
            engine: self.engine.clone(),
            pre,
            sandbox,
            config,
            pool: Mutex::new(Pool::default()),
            lowered: Mutex::new((None, None)),
            wanted: Mutex::new(None),
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

impl State {
    fn log(&mut self, level: Level, message: &str) {
        if level == Level::Error {
            self.last_error = Some(message.chars().take(2000).collect());
        }
        self.log.write(level, None, message);
    }
}

impl v0_1::promptd::plugin::types::Host for State {}

impl v0_1::promptd::plugin::host::Host for State {
    fn log(&mut self, level: v0_1::promptd::plugin::types::Level, message: String) {
        State::log(self, worlds::level_v1(level), &message);
    }
}

impl v0_2::promptd::plugin::types::Host for State {}

impl v0_2::promptd::plugin::host::Host for State {
    fn log(&mut self, level: v0_2::promptd::plugin::types::Level, message: String) {
        State::log(self, worlds::level_v2(level), &message);
    }
}

struct Instance {
    store: Store<State>,
    plugin: Exports,
}

/// The warm instances not in use, and how many exist in all (idle or in a call).
#[derive(Default)]
struct Pool {
    idle: Vec<Instance>,
    live: usize,
}

/// The last step lowered for each world (see [`WasmProvider::with_step_v1`]).
type Lowered = (Option<worlds::w1::Step>, Option<worlds::w2::Step>);

/// A loaded component: a small pool of warm instances made from `pre`, so concurrent
/// assemblies do not queue behind one instance. A trapped instance is dropped, never reused;
/// the pool makes a fresh one when a call needs it.
pub struct WasmProvider {
    engine: Engine,
    pre: Pre,
    sandbox: Sandbox,
    config: Vec<(String, String)>,
    pool: Mutex<Pool>,
    /// Signalled when an instance goes back to the pool or is dropped.
    returned: Condvar,
    /// Failed calls since the last successful one (L3: quarantine after too many).
    failures: AtomicU32,
    /// The plugin's log budget (L9), shared by its instances.
    log: Arc<PluginLog>,
    /// The last step as lowered for each world, kept to lower the next one by what changed
    /// (its number, mostly) instead of copying every string per call.
    lowered: Mutex<Lowered>,
    /// The last `Wanted` as lowered for world 0.2.0: a plugin is usually asked the same
    /// every step, so its lowering is made once, not per call.
    wanted: Mutex<Option<(Wanted, Arc<worlds::w2::Wanted>)>>,
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
        let declared = match &self.pre {
            Pre::V0_1(pre) => pre.instantiate(&mut store).and_then(|plugin| {
                let declared = plugin.call_declare(&mut store, &self.config)?;
                Ok((declared.map(worlds::declaration_v1), Exports::V0_1(plugin)))
            }),
            Pre::V0_2(pre) => pre.instantiate(&mut store).and_then(|plugin| {
                let declared = plugin.call_declare(&mut store, &self.config)?;
                Ok((declared.map(worlds::declaration_v2), Exports::V0_2(plugin)))
            }),
        };
        log.end("declare");
        let (declared, plugin) = declared.map_err(|e| trap(e, &mut store))?;
        let declaration = declared.map_err(CallError::Failed)?;
        for (what, text) in declared_texts(&declaration) {
            self.bounded(&what, text)?;
        }
        Ok((declaration, Instance { store, plugin }))
    }

    fn pool(&self) -> std::sync::MutexGuard<'_, Pool> {
        lock(&self.pool)
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
            pool = wait(&self.returned, pool);
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
        f: impl FnOnce(&Exports, &mut Store<State>) -> wasmtime::Result<Result<T, String>>,
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

/// A 0.1.0 call on a 0.2.0 instance or the reverse: the host never makes one, since
/// [`Provider::batches`] tells assembly which calls a provider takes.
fn other_world<T>() -> wasmtime::Result<Result<T, String>> {
    Ok(Err("internal: a call of the other plugin world".into()))
}

impl WasmProvider {
    fn world(&self) -> World {
        match self.pre {
            Pre::V0_1(_) => World::V0_1,
            Pre::V0_2(_) => World::V0_2,
        }
    }

    /// One 0.2.0 call for every wanted item; each returned text is checked against the
    /// output bound, and a failed item counts as a failed call (L3).
    fn evaluate_v2(&self, step: &Step, wanted: &Wanted) -> CallResult<Evaluation> {
        let wwanted = {
            let mut last = lock(&self.wanted);
            match last.as_ref() {
                Some((w, lowered)) if w == wanted => lowered.clone(),
                _ => {
                    let lowered = Arc::new(worlds::wanted_v2(wanted));
                    *last = Some((wanted.clone(), lowered.clone()));
                    lowered
                }
            }
        };
        let answer = self.with_step_v2(step, |wstep| {
            self.call(|p, s| match p {
                Exports::V0_2(p) => Ok(p
                    .call_evaluate(s, wstep, &wwanted)?
                    .map(worlds::evaluation_v2)),
                Exports::V0_1(_) => other_world(),
            })
        })?;
        answer.check(wanted)?;
        let bound =
            |r: CallResult<String>, what: &str| r.and_then(|t| self.bounded(what, &t).map(|()| t));
        let answer = Evaluation {
            sections: (answer.sections.into_iter())
                .map(|r| bound(r, "the text"))
                .collect(),
            contexts: (answer.contexts.into_iter())
                .map(|r| bound(r, "the text"))
                .collect(),
            variables: (answer.variables.into_iter())
                .map(|r| match r {
                    Ok(Some(v)) => bound(Ok(v), "the value").map(Some),
                    other => other,
                })
                .collect(),
            shown_tools: answer.shown_tools,
        };
        let item_failed = answer.sections.iter().any(Result::is_err)
            || answer.contexts.iter().any(Result::is_err)
            || answer.shown_tools.as_ref().is_some_and(Result::is_err);
        if item_failed {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        Ok(answer)
    }

    /// One item through [`WasmProvider::evaluate_v2`] (only reached through the per-item
    /// methods, which assembly does not use for 0.2.0 plugins).
    /// Runs `f` on `step` lowered for world 0.1.0, from the last lowering when one is free.
    fn with_step_v1<R>(&self, step: &Step, f: impl FnOnce(&worlds::w1::Step) -> R) -> R {
        fn slot(l: &mut Lowered) -> &mut Option<worlds::w1::Step> {
            &mut l.0
        }
        self.with_lowered(step, slot, worlds::step_v1, worlds::refresh_v1, f)
    }

    /// [`WasmProvider::with_step_v1`] for world 0.2.0.
    fn with_step_v2<R>(&self, step: &Step, f: impl FnOnce(&worlds::w2::Step) -> R) -> R {
        fn slot(l: &mut Lowered) -> &mut Option<worlds::w2::Step> {
            &mut l.1
        }
        self.with_lowered(step, slot, worlds::step_v2, worlds::refresh_v2, f)
    }

    /// Takes the kept lowering out of its `slot` (another call may be using it: then lowers
    /// afresh), brings it up to `step`, runs `f` on it and puts it back.
    fn with_lowered<L, R>(
        &self,
        step: &Step,
        slot: fn(&mut Lowered) -> &mut Option<L>,
        lower: fn(&Step) -> L,
        refresh: fn(&mut L, &Step),
        f: impl FnOnce(&L) -> R,
    ) -> R {
        let kept = slot(&mut lock(&self.lowered)).take();
        let lowered = match kept {
            Some(mut lowered) => {
                refresh(&mut lowered, step);
                lowered
            }
            None => lower(step),
        };
        let result = f(&lowered);
        *slot(&mut lock(&self.lowered)) = Some(lowered);
        result
    }

    fn one_v2<T>(
        &self,
        step: &Step,
        wanted: Wanted,
        pick: impl FnOnce(Evaluation) -> Option<CallResult<T>>,
    ) -> CallResult<T> {
        let answer = self.evaluate_v2(step, &wanted)?;
        pick(answer).unwrap_or_else(|| Err(CallError::Failed("no answer".into())))
    }
}

impl Provider for WasmProvider {
    fn section_text(&self, name: &str, scope: &Scope, step: &Step) -> CallResult<String> {
        if self.world() == World::V0_2 {
            let wanted = Wanted {
                sections: vec![(name.to_string(), scope.clone())],
                ..Wanted::default()
            };
            return self.one_v2(step, wanted, |e| e.sections.into_iter().next());
        }
        let wscope = worlds::scope_v1(scope);
        let result = self.with_step_v1(step, |wstep| {
            self.call(|p, s| match p {
                Exports::V0_1(p) => p.call_section_text(s, name, &wscope, wstep),
                Exports::V0_2(_) => other_world(),
            })
        });
        self.checked("the text", result)
    }

    fn context_text(&self, name: &str, scope: &Scope, step: &Step) -> CallResult<String> {
        if self.world() == World::V0_2 {
            let wanted = Wanted {
                contexts: vec![(name.to_string(), scope.clone())],
                ..Wanted::default()
            };
            return self.one_v2(step, wanted, |e| e.contexts.into_iter().next());
        }
        let wscope = worlds::scope_v1(scope);
        let result = self.with_step_v1(step, |wstep| {
            self.call(|p, s| match p {
                Exports::V0_1(p) => p.call_context_text(s, name, &wscope, wstep),
                Exports::V0_2(_) => other_world(),
            })
        });
        self.checked("the text", result)
    }

    fn variable_value(&self, name: &str, scope: &Scope, step: &Step) -> CallResult<Option<String>> {
        if self.world() == World::V0_2 {
            let wanted = Wanted {
                variables: vec![(name.to_string(), scope.clone())],
                ..Wanted::default()
            };
            return self.one_v2(step, wanted, |e| e.variables.into_iter().next());
        }
        let wscope = worlds::scope_v1(scope);
        let result = self.with_step_v1(step, |wstep| {
            self.call(|p, s| match p {
                Exports::V0_1(p) => p.call_variable_value(s, name, &wscope, wstep),
                Exports::V0_2(_) => other_world(),
            })
        });
        match result {
            Ok(Some(v)) => self.checked("the value", Ok(v)).map(Some),
            other => other,
        }
    }

    fn consecutive_failures(&self) -> u32 {
        self.failures.load(Ordering::Relaxed)
    }

    fn shown_tools(&self, step: &Step) -> CallResult<Vec<String>> {
        if self.world() == World::V0_2 {
            let wanted = Wanted {
                shown_tools: true,
                ..Wanted::default()
            };
            return self.one_v2(step, wanted, |e| e.shown_tools);
        }
        self.with_step_v1(step, |wstep| {
            self.call(|p, s| match p {
                Exports::V0_1(p) => p.call_shown_tools(s, wstep),
                Exports::V0_2(_) => other_world(),
            })
        })
    }

    fn batches(&self) -> bool {
        self.world() == World::V0_2
    }

    fn evaluate(&self, step: &Step, wanted: &Wanted) -> CallResult<Evaluation> {
        match self.world() {
            World::V0_2 => self.evaluate_v2(step, wanted),
            // The adapter: a 0.1.0 plugin answers item by item, as it always did.
            World::V0_1 => Ok(promptd_core::plugin::provider::per_item(self, step, wanted)),
        }
    }

    fn review(&self, step: &Step, input: &ReviewInput) -> CallResult<Verdict> {
        if self.world() == World::V0_1 {
            return Ok(Verdict::Accept); // 0.1.0 has no hook
        }
        let (wstep, winput) = (worlds::step_v2(step), worlds::review_input_v2(input));
        let verdict = self.call(|p, s| match p {
            Exports::V0_2(p) => Ok(p.call_review(s, &wstep, &winput)?.map(worlds::verdict_v2)),
            Exports::V0_1(_) => other_world(),
        })?;
        if let Err(cause) = verdict.check() {
            let err = Err(CallError::Failed(cause));
            self.count(&err);
            return err;
        }
        Ok(verdict)
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

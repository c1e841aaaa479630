//! The WebAssembly edge: load a component, check it implements the world, call it.
//!
//! One [`WasmEngine`] owns the engine and the linker; each loaded plugin becomes a
//! [`WasmProvider`] holding a warm instance (instantiating per call is slow for Python and
//! JavaScript guests). Every call runs under an epoch deadline, so a looping guest is stopped,
//! and every store has a memory cap. A trapped instance is never re-entered: it is dropped and a
//! fresh one is made from the pre-instantiated component on the next call.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use promptd_core::sync::{lock, Signal};
use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, Store};

use promptd_core::load::{CacheLookup, Engine as PluginEngine, Instantiated, LoadRequest};
use promptd_core::plugin::model::{Content, Declaration, Scope, Step};
use promptd_core::plugin::provider::{CallError, CallResult, Evaluation, Provider, Wanted};
use promptd_core::plugin::provider::{ReviewInput, Verdict};
use promptd_core::plugin::sandbox::Sandbox;
use promptd_core::Error;

use crate::cache::CompileCache;
use crate::compile::{settings, Compiler};
use crate::log::PluginLog;
use crate::state::{new_store, root_cause, trap, State};
use crate::worlds::{self, Calls, WithWorld, World};
use crate::EngineError;

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
        // Every world's imports: their interfaces are versioned, so they never clash.
        worlds::add_to_linker(&mut linker).map_err(EngineError::Init)?;

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
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| wrong_world(id, e))?;
        let load = Load {
            engine: &self.engine,
            pre,
            id,
            config,
            sandbox,
        };
        let (declaration, provider) = worlds::dispatch(&component, &self.engine, load)?;
        Ok((declaration, Arc::new(provider), lookup))
    }
}

/// A component's loading once its world is known: checked against the world, instantiated
/// and declared.
struct Load<'a> {
    engine: &'a Engine,
    pre: wasmtime::component::InstancePre<State>,
    id: &'a str,
    config: Vec<(String, String)>,
    sandbox: Sandbox,
}

impl WithWorld for Load<'_> {
    type Output = Result<(Declaration, WasmProvider), Error>;

    fn with<W: World>(self) -> Self::Output {
        let id = self.id;
        let pre = W::pre(self.pre).map_err(|e| wrong_world(id, e))?;
        let plugin = Plugin::<W> {
            log: PluginLog::new(id, &self.sandbox),
            engine: self.engine.clone(),
            pre,
            sandbox: self.sandbox,
            config: self.config,
            pool: Mutex::new(Pool::default()),
            memo: W::Memo::default(),
            returned: Signal::default(),
            failures: AtomicU32::new(0),
        };
        let (declaration, instance) =
            plugin.fresh_instance().map_err(|e| Error::DeclareFailed {
                plugin: id.into(),
                cause: e.cause().to_string(),
            })?;
        plugin.pool().live = 1;
        plugin.checkin(Some(instance));
        Ok((declaration, WasmProvider(Box::new(plugin))))
    }
}

fn wrong_world(plugin: &str, e: wasmtime::Error) -> Error {
    Error::WrongWorld {
        plugin: plugin.into(),
        cause: root_cause(&e),
        source: e.into(),
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

fn not_a_component(plugin: &str, e: wasmtime::Error) -> Error {
    Error::NotAComponent {
        plugin: plugin.into(),
        cause: root_cause(&e),
        source: Some(e.into()),
    }
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

struct Instance<W: World> {
    store: Store<State>,
    plugin: W::Exports,
}

/// The warm instances not in use, and how many exist in all (idle or in a call).
struct Pool<W: World> {
    idle: Vec<Instance<W>>,
    live: usize,
}

impl<W: World> Default for Pool<W> {
    fn default() -> Self {
        Self {
            idle: Vec::new(),
            live: 0,
        }
    }
}

/// A loaded component, in the world it implements (see `Plugin`).
pub struct WasmProvider(Box<dyn Provider>);

impl Provider for WasmProvider {
    fn section_text(&self, name: &str, scope: &Scope, step: &Step) -> CallResult<String> {
        self.0.section_text(name, scope, step)
    }

    fn context_text(&self, name: &str, scope: &Scope, step: &Step) -> CallResult<String> {
        self.0.context_text(name, scope, step)
    }

    fn variable_value(&self, name: &str, scope: &Scope, step: &Step) -> CallResult<Option<String>> {
        self.0.variable_value(name, scope, step)
    }

    fn shown_tools(&self, step: &Step) -> CallResult<Vec<String>> {
        self.0.shown_tools(step)
    }

    fn batches(&self) -> bool {
        self.0.batches()
    }

    fn evaluate(&self, step: &Step, wanted: &Wanted) -> CallResult<Evaluation> {
        self.0.evaluate(step, wanted)
    }

    fn review(&self, step: &Step, input: &ReviewInput) -> CallResult<Verdict> {
        self.0.review(step, input)
    }

    fn consecutive_failures(&self) -> u32 {
        self.0.consecutive_failures()
    }
}

/// A loaded component of world `W`: a small pool of warm instances made from `pre`, so
/// concurrent assemblies do not queue behind one instance. A trapped instance is dropped,
/// never reused; the pool makes a fresh one when a call needs it.
struct Plugin<W: World> {
    engine: Engine,
    pre: W::Pre,
    sandbox: Sandbox,
    config: Vec<(String, String)>,
    pool: Mutex<Pool<W>>,
    /// Signalled when an instance goes back to the pool or is dropped.
    returned: Signal,
    /// Failed calls since the last successful one (L3: quarantine after too many).
    failures: AtomicU32,
    /// The plugin's log budget (L9), shared by its instances.
    log: Arc<PluginLog>,
    /// What the world keeps between calls (the last step lowered, …).
    memo: W::Memo,
}

impl<W: World> Plugin<W> {
    fn deadline_ticks(&self) -> u64 {
        (self.sandbox.call_deadline.as_millis() / TICK.as_millis()).max(1) as u64
    }

    /// Instantiates and calls `declare`. The SDKs set up their dynamic callbacks in `declare`,
    /// so every fresh instance is declared again.
    fn fresh_instance(&self) -> CallResult<(Declaration, Instance<W>)> {
        let mut store = new_store(&self.engine, &self.sandbox, &self.log)?;
        store.set_epoch_deadline(self.deadline_ticks());
        let log = store.data().call_log().clone();
        log.begin();
        let declared = W::instantiate(&self.pre, &mut store).and_then(|plugin| {
            let declared = W::declare(&plugin, &mut store, &self.config)?;
            Ok((declared, plugin))
        });
        log.end("declare");
        let (declared, plugin) = declared.map_err(|e| trap(&e, &mut store))?;
        let declaration = declared.map_err(CallError::Failed)?;
        for (what, text) in declared_texts(&declaration) {
            self.bounded(&what, text)?;
        }
        Ok((declaration, Instance { store, plugin }))
    }

    fn pool(&self) -> std::sync::MutexGuard<'_, Pool<W>> {
        lock(&self.pool)
    }

    /// An idle instance, or a fresh one while fewer than `max_instances` exist, or else the
    /// first one another call gives back.
    fn checkout(&self) -> CallResult<Instance<W>> {
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
            pool = self.returned.wait(pool);
        }
    }

    /// Gives an instance back, or (after a trap) drops it.
    fn checkin(&self, instance: Option<Instance<W>>) {
        let mut pool = self.pool();
        match instance {
            Some(instance) => pool.idle.push(instance),
            None => pool.live -= 1,
        }
        drop(pool);
        self.returned.notify_one();
    }

    fn count<T>(&self, result: &CallResult<T>) {
        match result {
            Ok(_) => self.failures.store(0, Ordering::Relaxed),
            Err(_) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl<W: World> Calls<W> for Plugin<W> {
    fn call<T>(
        &self,
        f: impl FnOnce(&W::Exports, &mut Store<State>) -> wasmtime::Result<Result<T, String>>,
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
        let log = instance.store.data().call_log().clone();
        log.begin();
        let outcome = f(&instance.plugin, &mut instance.store);
        log.end("call");
        let result = match outcome {
            Ok(result) => {
                self.checkin(Some(instance));
                result.map_err(CallError::Failed)
            }
            Err(e) => {
                let err = trap(&e, &mut instance.store);
                self.checkin(None); // never re-enter a trapped instance (L3)
                Err(err)
            }
        };
        self.count(&result);
        result
    }

    fn memo(&self) -> &W::Memo {
        &self.memo
    }

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

    fn failed(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }
}

impl<W: World> Provider for Plugin<W> {
    fn section_text(&self, name: &str, scope: &Scope, step: &Step) -> CallResult<String> {
        W::section_text(self, name, scope, step)
    }

    fn context_text(&self, name: &str, scope: &Scope, step: &Step) -> CallResult<String> {
        W::context_text(self, name, scope, step)
    }

    fn variable_value(&self, name: &str, scope: &Scope, step: &Step) -> CallResult<Option<String>> {
        W::variable_value(self, name, scope, step)
    }

    fn shown_tools(&self, step: &Step) -> CallResult<Vec<String>> {
        W::shown_tools(self, step)
    }

    fn batches(&self) -> bool {
        W::batches()
    }

    fn evaluate(&self, step: &Step, wanted: &Wanted) -> CallResult<Evaluation> {
        W::evaluate(self, step, wanted)
    }

    fn review(&self, step: &Step, input: &ReviewInput) -> CallResult<Verdict> {
        W::review(self, step, input)
    }

    fn consecutive_failures(&self) -> u32 {
        self.failures.load(Ordering::Relaxed)
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

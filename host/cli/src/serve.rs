//! `promptd serve`: start the daemon on TCP or a Unix socket, stop gracefully on SIGINT/SIGTERM.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use promptd_core::config::Config;
use promptd_core::store::SessionStore;
use promptd_daemon::{http, server, Daemon};
use promptd_engine::{cache, WasmEngine};
use promptd_store::SqliteStore;
use promptd_store_postgres::PostgresStore;

use crate::error::CliError;

/// How to serve (from the command line).
pub struct Options {
    pub plugins: Option<PathBuf>,
    pub listen: String,
    pub state: PathBuf,
    /// Watch the plugin folder and the config file (H1).
    pub watch: bool,
    pub config_path: Option<PathBuf>,
    /// A cargo workspace of Rust plugins to rebuild on change.
    pub dev: Option<PathBuf>,
}

pub fn run(config: Config, options: Options) -> anyhow::Result<()> {
    let Options {
        plugins,
        listen,
        state,
        watch,
        config_path,
        dev,
    } = options;
    let (listen, state) = (listen.as_str(), state.as_path());
    let token = std::env::var("PROMPTD_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
        .or_else(|| config.token.clone());
    let (follow, dir, poll) = plugin_source(&config, plugins, state);

    let target = listen_target(listen, token.is_some())?;
    // Beyond loopback, gateway traffic presents a gateway key (G12).
    let listening = match &target {
        Listen::Tcp(addr) if !addr.ip().is_loopback() => promptd_daemon::gateway::Listening::Beyond,
        _ => promptd_daemon::gateway::Listening::Local,
    };

    std::fs::create_dir_all(state).map_err(|source| CliError::Folder {
        path: state.to_path_buf(),
        source,
    })?;
    // Read at start; the timeouts are read again for each new connection (H6).
    let max_connections = config.max_connections();
    let store = open_store(&config, state)?;
    let store_name = store_name(&config)?;
    let engine = WasmEngine::new()?
        .with_cache(&state.join("cache"), cache::DEFAULT_MAX_BYTES)?
        .with_compiler(crate::compiler()?.with_memory_total(config.compile_memory_total()));
    if follow {
        std::fs::create_dir_all(&dir).map_err(|source| CliError::Folder {
            path: dir.clone(),
            source,
        })?;
    }
    // Fail early on a plugin folder that cannot be read; the files load after we listen.
    promptd_daemon::plugin_dir::plugin_files(&dir)?;
    // [telemetry] (and OTEL_*): a bad setting stops the start, naming it.
    let telemetry = promptd_telemetry::Settings::resolve(
        &config.telemetry,
        &|name| std::env::var(name).ok(),
        listen,
    )
    .map_err(|e| anyhow::anyhow!("error[{}]: {e}", e.code()))?;
    let public_url_set = config.telemetry.public_url.is_some();
    let daemon = Arc::new(Daemon::loading(store, Arc::new(engine), config, &dir));
    let exporting = match telemetry {
        Some(settings) => Some(start_telemetry(&daemon, settings, store_name)?),
        None => None,
    };
    // Listen first, load in the background: a slow (or hostile) plugin delays nothing but
    // the steps that wait for the first registry.
    spawn_loader(daemon.clone(), follow)?;
    // Kept alive until the server stops.
    let _watch = if watch {
        Some(promptd_daemon::watch::watch(daemon.clone(), config_path)?)
    } else {
        None
    };
    if follow {
        promptd_daemon::fleet::follow(daemon.clone(), dir.clone(), poll)
            .context("start the fleet thread")?;
    }
    if let Some(workspace) = dev {
        crate::dev::spawn(&workspace, daemon.plugin_dir().to_path_buf())?;
    }
    // The timeouts from the config in force at each connection; max_connections as at start.
    let limits = server::Limits {
        max_connections,
        ..server::Limits::of(&daemon)
    };
    // MCP servers connect on the runtime below; each publishes beside the plugins (M1).
    let mcp = daemon.clone();
    let app = http::app(daemon, token, listening);

    runtime()?.block_on(async move {
        promptd_mcp::start(&mcp, &tokio::runtime::Handle::current());
        match target {
            Listen::Tcp(addr) => {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("listen on {addr}"))?;
                let base = format!("http://{}", listener.local_addr()?);
                if let Some(t) = &exporting {
                    t.set_listening(&base, public_url_set);
                }
                announce(&base);
                server::serve(server::no_delay(listener), app, limits, shutdown()).await;
            }
            Listen::Unix(path) => {
                // A stale socket file from an earlier run would make bind fail.
                let _ = std::fs::remove_file(&path);
                let listener = tokio::net::UnixListener::bind(&path)
                    .with_context(|| format!("listen on {}", path.display()))?;
                announce(&format!("unix:{}", path.display()));
                server::serve(listener, app, limits, shutdown()).await;
                let _ = std::fs::remove_file(&path);
            }
        }
        // Spans waiting for a reply, and those queued, go out before the process ends.
        if let Some(t) = &exporting {
            t.shutdown(std::time::Duration::from_secs(5));
        }
        tracing::info!("stopped");
        anyhow::Ok(())
    })
}

/// Where the plugins come from: K10, a daemon that follows its store's plugin sets serves them
/// from the state folder (polled every `poll`), else the plugin folder.
fn plugin_source(
    config: &Config,
    plugins: Option<PathBuf>,
    state: &std::path::Path,
) -> (bool, PathBuf, std::time::Duration) {
    let follow = config.fleet.follow;
    let dir = if follow {
        state.join("fleet")
    } else {
        plugins
            .or_else(|| config.plugin_dir.clone())
            .unwrap_or_else(|| PathBuf::from("plugins"))
    };
    let poll = std::time::Duration::from_millis(
        config
            .fleet
            .poll_ms
            .unwrap_or(promptd_core::config::DEFAULT_FLEET_POLL_MS),
    );
    (follow, dir, poll)
}

/// Where `promptd serve` listens.
enum Listen {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

/// `--listen` read: `unix:/path` or `HOST:PORT`; anything but loopback needs a token (L5).
fn listen_target(listen: &str, has_token: bool) -> anyhow::Result<Listen> {
    Ok(match listen.strip_prefix("unix:") {
        Some(path) => Listen::Unix(PathBuf::from(path)),
        None => {
            let addr: SocketAddr = listen.parse().map_err(|e| CliError::BadArgument {
                flag: "--listen",
                value: listen.to_string(),
                expected: format!("{e}; use HOST:PORT or unix:/path"),
            })?;
            if !addr.ip().is_loopback() && !has_token {
                return Err(CliError::TokenRequired { addr }.into());
            }
            Listen::Tcp(addr)
        }
    })
}

/// Starts the OTLP export and adds telemetry to the daemon's observers.
fn start_telemetry(
    daemon: &Arc<Daemon>,
    settings: promptd_telemetry::Settings,
    store_name: &'static str,
) -> anyhow::Result<Arc<promptd_telemetry::Telemetry>> {
    let (endpoint, protocol) = (settings.traces_endpoint.clone(), settings.protocol);
    let counted = Arc::downgrade(daemon);
    let source: promptd_telemetry::Source = Arc::new(move || {
        counted
            .upgrade()
            .map(|d| d.metric_samples())
            .unwrap_or_default()
    });
    let t = promptd_telemetry::Telemetry::start(settings, Some(source))
        .map_err(|e| anyhow::anyhow!("error[{}]: {e}", e.code()))?;
    let t = Arc::new(t);
    daemon
        .observers
        .add(Arc::new(promptd_telemetry::Observer::new(
            t.clone(),
            store_name,
        )));
    tracing::info!(%endpoint, protocol = protocol.as_str(), "telemetry: exporting traces over OTLP");
    Ok(t)
}

/// Loads the plugins (the store's set first, when following) on a thread of their own, and
/// says what serves.
fn spawn_loader(loader: Arc<Daemon>, follow: bool) -> anyhow::Result<()> {
    std::thread::Builder::new()
        .name("promptd-load".into())
        .spawn(move || {
            let started = std::time::Instant::now();
            if follow {
                if let Err(e) = loader.follow_once(loader.plugin_dir()) {
                    tracing::error!("reading the store's plugin set failed: error[{}]: {e}", e.code());
                }
            }
            if let Err(e) = loader.load_initial() {
                tracing::error!("loading the plugin folder failed: error[{}]: {e}", e.code());
            }
            for p in loader.plugins() {
                match &p.last_error {
                    None => tracing::info!(plugin = %p.id, sha256 = %p.sha256, "serving"),
                    Some(e) => {
                        tracing::warn!(plugin = %p.id, "not serving: error[{}]: {}", e.code, e.message)
                    }
                }
            }
            tracing::info!(
                ms = started.elapsed().as_millis() as u64,
                "plugins loaded; ready"
            );
        })
        .context("start the loader thread")?;
    Ok(())
}

/// The async runtime. Steps, appends and reads run on tokio's blocking pool:
/// `PROMPTD_BLOCKING_THREADS` bounds its threads (tokio's default is 512, one per concurrent
/// step). Measured in BENCHMARKS.md (issue 31).
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = std::env::var_os("PROMPTD_BLOCKING_THREADS") {
        let n = n
            .to_str()
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|n| *n > 0)
            .ok_or_else(|| CliError::BadArgument {
                flag: "PROMPTD_BLOCKING_THREADS",
                value: n.to_string_lossy().into_owned(),
                expected: "expected a positive integer".into(),
            })?;
        runtime.max_blocking_threads(n);
    }
    runtime
        .enable_all()
        .build()
        .context("start the async runtime")
}

/// `promptd plugins publish DIR`: stores every plugin file of `dir` in the config's session
/// store as one plugin set (K10), which daemons with `[fleet] follow = true` switch to.
pub fn publish(
    config: &Config,
    state: &std::path::Path,
    dir: &std::path::Path,
) -> anyhow::Result<()> {
    let paths = promptd_daemon::plugin_dir::plugin_files(dir)?;
    if paths.is_empty() {
        anyhow::bail!(
            "plugin folder {} holds no .wasm file: nothing to publish",
            dir.display()
        );
    }
    let mut files = Vec::with_capacity(paths.len());
    for path in paths {
        let file = promptd_daemon::plugin_dir::read(&path)?;
        files.push((file.stem.clone(), file.bytes.to_vec()));
    }
    std::fs::create_dir_all(state).map_err(|source| CliError::Folder {
        path: state.to_path_buf(),
        source,
    })?;
    let store = open_store(config, state)?;
    let set = store.publish_set(&files)?;
    println!(
        "plugin set {} ({} files): {}",
        set.version,
        set.files.len(),
        set.files
            .iter()
            .map(|f| format!("{} {}", f.stem, &f.sha256[..12]))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

/// The config's store: SQLite in `state` by default, else PostgreSQL (migrated on open; a
/// database that cannot be reached at start is an error, later outages are 503s).
pub fn open_store(
    config: &Config,
    state: &std::path::Path,
) -> anyhow::Result<Arc<dyn SessionStore>> {
    match config.store.url(&|name| std::env::var(name).ok())? {
        None => Ok(Arc::new(SqliteStore::open(&state.join("sessions.db"))?)),
        Some(url) => {
            let shown = promptd_store_postgres::redacted(&url);
            let store = PostgresStore::open(&url)?;
            tracing::info!(store = %shown, "sessions on PostgreSQL");
            Ok(Arc::new(store))
        }
    }
}

/// The config's store as `db.system.name` says it: `sqlite` or `postgresql`.
fn store_name(config: &Config) -> anyhow::Result<&'static str> {
    Ok(match config.store.url(&|name| std::env::var(name).ok())? {
        None => "sqlite",
        Some(_) => "postgresql",
    })
}

/// `promptd migrate`: brings the configured store's schema up to this binary's and says what
/// it did.
pub fn migrate(config: &Config, state: &std::path::Path) -> anyhow::Result<()> {
    match config.store.url(&|name| std::env::var(name).ok())? {
        None => {
            std::fs::create_dir_all(state).map_err(|source| CliError::Folder {
                path: state.to_path_buf(),
                source,
            })?;
            let path = state.join("sessions.db");
            drop(SqliteStore::open(&path)?);
            println!("sqlite {}: schema current", path.display());
        }
        Some(url) => {
            let shown = promptd_store_postgres::redacted(&url);
            let (from, to) = PostgresStore::migrate_url(&url)?;
            println!("postgres {shown}: schema version {to} (was {from})");
        }
    }
    Ok(())
}

/// The first line on stdout says where the daemon listens (tests and scripts read it).
fn announce(addr: &str) {
    println!("promptd listening on {addr}");
    let _ = std::io::stdout().flush();
}

async fn shutdown() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down");
}

//! The `promptd` command line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use promptd_core::assembly;
use promptd_core::config::{AgentSettings, Config, DEFAULT_AGENT};
use promptd_core::plugin::model::{Step, StepInputs};
use promptd_core::{load, request};
use promptd_daemon::plugin_dir;
use promptd_engine::{cache, Compiler, WasmEngine};

// Measured against glibc's in BENCHMARKS.md (issue 31, second part: "Allocators with a
// bounded blocking pool"); not kept.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
#[cfg(all(feature = "jemalloc", not(feature = "mimalloc")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

mod client;
mod dev;
mod error;
mod log;
mod scaffold;
mod serve;

use error::CliError;

#[derive(Parser)]
#[command(
    name = "promptd",
    version,
    about = "A host for WebAssembly prompt plugins"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// What `promptd assemble` shows plugins of the request a step would answer (world 0.3.0's
/// declared inputs); a daemon takes them from the session and the client's request.
#[derive(clap::Args)]
struct InputArgs {
    /// The last user message's text (the session then has one user turn).
    #[arg(long, value_name = "TEXT")]
    user: Option<String>,
    /// The model the request is for (default: the fact `model`, as a daemon takes it).
    #[arg(long)]
    model: Option<String>,
    /// A tool the client sends, by name; repeatable, in order.
    #[arg(long = "client-tool", value_name = "NAME")]
    client_tools: Vec<String>,
    /// The step's number.
    #[arg(long, default_value_t = 0)]
    step: u64,
}

#[derive(Subcommand)]
enum Command {
    /// Load the plugins in a folder and print the assembled request as JSON.
    Assemble {
        /// The plugins folder (default: the config's `plugin_dir`, else ./plugins).
        #[arg(long)]
        plugins: Option<PathBuf>,
        /// The config file (default: ./promptd.toml when it exists).
        #[arg(long)]
        config: Option<PathBuf>,
        /// The agent to assemble for.
        #[arg(long, default_value = DEFAULT_AGENT)]
        agent: String,
        /// A step fact, KEY=VALUE; repeatable.
        #[arg(long = "fact", value_name = "KEY=VALUE")]
        facts: Vec<String>,
        /// Also print which plugin gave each section, context, variable and tool.
        #[arg(long)]
        explain: bool,
        /// Also print what each part costs (`usage`), by the agent's budget and tokenizer.
        #[arg(long)]
        budget: bool,
        /// The request inputs plugins of world 0.3.0 may read.
        #[command(flatten)]
        inputs: InputArgs,
    },
    /// The cost ledger across sessions: replies, cache outcomes, misses by cause and by
    /// plugin, and cost by the config's `[pricing]`, in total and per agent.
    Usage {
        /// Only this agent's sessions.
        #[arg(long)]
        agent: Option<String>,
        /// Only replies since then: milliseconds since the Unix epoch, or a duration ago
        /// (`30m`, `2h`, `7d`).
        #[arg(long)]
        since: Option<String>,
        /// Only the last N UTC days (1 to 366), with a line per day.
        #[arg(long)]
        days: Option<u64>,
        /// Only replies served with this gateway key.
        #[arg(long)]
        key: Option<String>,
        /// Print the daemon's JSON as it is.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        server: client::Server,
    },
    /// Inspect plugin files.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
    /// Run the daemon: load the plugins and serve the HTTP API.
    Serve {
        /// The config file (default: ./promptd.toml when it exists).
        #[arg(long)]
        config: Option<PathBuf>,
        /// The plugins folder (default: the config's `plugin_dir`, else ./plugins).
        #[arg(long)]
        plugins: Option<PathBuf>,
        /// `HOST:PORT` (port 0 picks a free one), or `unix:/path/to.sock`.
        #[arg(long, default_value = client::DEFAULT_LISTEN)]
        listen: String,
        /// Where sessions (`sessions.db`) and the compile cache (`cache/`) are kept.
        #[arg(long, default_value = ".promptd")]
        state: PathBuf,
        /// Do not watch the plugin folder and config for changes.
        #[arg(long)]
        no_watch: bool,
        /// Also rebuild plugins when their sources change and copy the new .wasm files into the
        /// plugin folder: DIR is a cargo workspace of Rust plugins (e.g. `plugins`) or a plugin
        /// folder of any language made by `promptd plugin new`.
        #[arg(long, value_name = "DIR")]
        dev: Option<PathBuf>,
    },
    /// Create or upgrade the session store's schema (the config's `store`) and exit. `serve`
    /// does it too; run this first when several daemons share one PostgreSQL database.
    Migrate {
        /// The config file (default: ./promptd.toml when it exists).
        #[arg(long)]
        config: Option<PathBuf>,
        /// The state folder, for the default SQLite store.
        #[arg(long, default_value = ".promptd")]
        state: PathBuf,
    },
    /// Drive sessions on a running daemon.
    Session {
        #[command(subcommand)]
        command: SessionCommand,
        #[command(flatten)]
        server: client::Server,
    },
    /// List the plugins of a running daemon, or publish a plugin set for a fleet.
    Plugins {
        #[command(subcommand)]
        command: Option<PluginsCommand>,
        #[command(flatten)]
        server: client::Server,
    },
    /// Re-assemble recorded sessions on a running daemon with a candidate plugin folder or
    /// config, and report per step where the candidate's request differs, the token delta,
    /// and what the prompt cache would read, write and miss and cost, beside the recorded
    /// figures. Nothing is written.
    Replay {
        /// Sessions to replay (default: the most recent ones, at most --limit).
        sessions: Vec<String>,
        /// Only this agent's sessions.
        #[arg(long)]
        agent: Option<String>,
        /// Only sessions with activity since: milliseconds since the epoch, or a duration
        /// ago (`30m`, `2h`, `1d`, `45s`).
        #[arg(long)]
        since: Option<String>,
        /// Without SESSIONs, at most this many.
        #[arg(long, default_value_t = 100)]
        limit: u64,
        /// The candidate plugin folder, on the daemon's machine (default: the daemon's own).
        #[arg(long)]
        plugins: Option<PathBuf>,
        /// The candidate config file, on the daemon's machine (default: the daemon's).
        #[arg(long)]
        config: Option<PathBuf>,
        /// openai, anthropic, openai-responses, gemini or bedrock (default: the format of the session's
        /// recorded replies, else anthropic).
        #[arg(long)]
        format: Option<String>,
        /// Print the daemon's report as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        server: client::Server,
    },
    /// Compile one component to FILE: the engine runs this as a bounded child process (L7).
    #[command(hide = true)]
    Compile {
        /// Where the compiled artifact goes (written beside, then renamed).
        #[arg(long)]
        out: PathBuf,
        /// The component (default: stdin).
        input: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum PluginsCommand {
    /// Store every plugin file of DIR in the config's session store as a new plugin set
    /// (content-addressed; the same files as the latest set publish nothing new). Daemons
    /// with `[fleet] follow = true` on that store switch to it together.
    Publish {
        /// The folder of `.wasm` files.
        dir: PathBuf,
        /// The config file naming the store (default: ./promptd.toml when it exists).
        #[arg(long)]
        config: Option<PathBuf>,
        /// The state folder, for the default SQLite store.
        #[arg(long, default_value = ".promptd")]
        state: PathBuf,
    },
}

#[derive(Subcommand)]
enum SessionCommand {
    /// Create a session for AGENT and print its id.
    New { agent: String },
    /// Run one step and print the frozen request.
    Step {
        id: String,
        /// The user's message for this step.
        #[arg(long)]
        user: Option<String>,
        /// A step fact, KEY=VALUE; repeatable.
        #[arg(long = "fact", value_name = "KEY=VALUE")]
        facts: Vec<String>,
        /// neutral, openai, anthropic, openai-responses, gemini or bedrock.
        #[arg(long, default_value = "neutral")]
        format: String,
    },
    /// Print the session's event log, and the share of steps that kept the previous prefix.
    Log { id: String },
    /// Step N (default: the last) against the step before: the bytes a provider's prompt
    /// cache can reuse, where the prefix broke and why.
    Diff {
        id: String,
        n: Option<u64>,
        /// neutral, openai, anthropic, openai-responses, gemini or bedrock.
        #[arg(long, default_value = "openai")]
        format: String,
    },
    /// Step N's request (default: the last) with the plugin, sha256 and scope of each part.
    Show {
        id: String,
        n: Option<u64>,
        #[arg(long, default_value = "openai")]
        format: String,
    },
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Load one plugin and print what it declares, or why it is refused. With `--against
    /// SESSION`, replay that session on a running daemon with this file in place of the
    /// daemon's plugin of the same id (or added), and print the replay's report.
    Check {
        file: PathBuf,
        /// A config file whose `[plugins.NAME]` table supplies the plugin's settings (with
        /// `--against`: the candidate config, default the daemon's).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Replay this session of a running daemon with the plugin swapped in.
        #[arg(long, value_name = "SESSION")]
        against: Option<String>,
        /// With `--against`: openai, anthropic, openai-responses, gemini or bedrock.
        #[arg(long, requires = "against")]
        format: Option<String>,
        /// With `--against`: print the report as JSON.
        #[arg(long, requires = "against")]
        json: bool,
        #[command(flatten)]
        server: client::Server,
    },
    /// Create a new plugin folder NAME that builds with `promptd plugin build`.
    New {
        name: String,
        /// The plugin's language: rust, js, python or c.
        #[arg(long, default_value = "rust")]
        lang: String,
        /// Where to create the folder.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// Build the plugin in this folder (or DIR) into NAME.wasm beside its sources.
    Build {
        #[arg(default_value = ".")]
        dir: PathBuf,
    },
}

/// glibc's allocator, as the daemon runs it (docs/operations.md#memory): one arena per core
/// instead of eight (each blocking-pool thread otherwise keeps freed memory in an arena of
/// its own, and the soak's RSS grew to three times the heap), and blocks of 1 MiB and more
/// mapped on their own and given back when freed (glibc otherwise raises that threshold to
/// the largest block freed, so a 20 MiB message's copies stayed in the heap after its step).
/// `MALLOC_ARENA_MAX` and `MALLOC_MMAP_THRESHOLD_` in the environment win.
#[cfg(all(
    target_os = "linux",
    target_env = "gnu",
    not(any(feature = "mimalloc", feature = "jemalloc"))
))]
fn tune_glibc_malloc() {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get().max(2));
    let arenas = i32::try_from(cores).unwrap_or(i32::MAX);
    // SAFETY: mallopt only sets allocator parameters; called before the runtime starts.
    unsafe {
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
            libc::mallopt(libc::M_ARENA_MAX, arenas);
        }
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
        }
    }
}

#[cfg(not(all(
    target_os = "linux",
    target_env = "gnu",
    not(any(feature = "mimalloc", feature = "jemalloc"))
)))]
fn tune_glibc_malloc() {}

fn main() -> ExitCode {
    let cli = match Cli::parse().command {
        // The compiler child speaks to its parent in exit statuses, not error lines.
        Command::Compile { out, input } => {
            return promptd_engine::compile::child_main(input.as_deref(), &out)
        }
        command => Cli { command },
    };
    let serving = matches!(cli.command, Command::Serve { .. });
    if !serving {
        // A one-shot command piped into `head` ends quietly when the pipe closes, as Unix
        // tools do, instead of panicking in `println!`. The daemon keeps Rust's default
        // (ignored), so a client hanging up is an error on that socket, never a signal.
        // SAFETY: called before any other thread exists; SIG_DFL is a valid disposition.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    if serving {
        tune_glibc_malloc();
    }
    // The daemon logs at info by default; one-shot commands stay quiet (see init_logging).
    init_logging(serving);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line per error, so scripts can parse it.
            if let Some(e) = err.downcast_ref::<client::ClientError>() {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
            let code = error::code_of(&err);
            let message = if code == "internal" {
                format!("{err:#}")
            } else {
                err.to_string()
            };
            let message = message.split_whitespace().collect::<Vec<_>>().join(" ");
            eprintln!("error[{code}]: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Logs (including plugins' `log` lines) go to stderr when `PROMPTD_LOG` names a level
/// (error, warn, info, debug, trace). One-shot commands are quiet by default: their stderr is
/// the single `error[CODE]:` line, and a trap's message already carries the plugin's last
/// error log line.
fn init_logging(daemon: bool) {
    let level = std::env::var("PROMPTD_LOG")
        .ok()
        .and_then(|l| l.parse::<tracing::Level>().ok());
    let Some(level) = level.or(daemon.then_some(tracing::Level::INFO)) else {
        return;
    };
    // No colours: the sink escapes every control character, ANSI ones included (L9).
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_ansi(false)
        .with_writer(log::OneLineStderr)
        .init();
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Assemble {
            plugins,
            config,
            agent,
            facts,
            explain,
            budget,
            inputs,
        } => assemble(plugins, config, &agent, &facts, explain, budget, &inputs),
        Command::Plugin {
            command:
                PluginCommand::Check {
                    file,
                    config,
                    against: Some(session),
                    format,
                    json,
                    server,
                },
        } => server.replay(&client::Replay {
            sessions: vec![session],
            swap: vec![absolute("FILE", &file)?],
            config: config.map(|c| absolute("--config", &c)).transpose()?,
            format,
            json,
            ..client::Replay::default()
        }),
        Command::Plugin {
            command: PluginCommand::Check { file, config, .. },
        } => check(&file, config),
        Command::Plugin {
            command: PluginCommand::New { name, lang, dir },
        } => scaffold::new(&name, &lang, &dir),
        Command::Plugin {
            command: PluginCommand::Build { dir },
        } => scaffold::build(&dir),
        Command::Serve {
            config,
            plugins,
            listen,
            state,
            no_watch,
            dev,
        } => {
            let config_path = config_path(config);
            let options = serve::Options {
                plugins,
                listen,
                state,
                watch: !no_watch,
                config_path,
                dev,
            };
            serve::run(read_config(options.config_path.clone())?, options)
        }
        Command::Migrate { config, state } => serve::migrate(&read_config(config)?, &state),
        Command::Session { command, server } => match command {
            SessionCommand::New { agent } => server.create_session(&agent),
            SessionCommand::Step {
                id,
                user,
                facts,
                format,
            } => server.step(&id, user, &parse_facts(&facts)?, &format),
            SessionCommand::Log { id } => server.log(&id),
            SessionCommand::Diff { id, n, format } => server.diff(&id, n, &format),
            SessionCommand::Show { id, n, format } => server.show(&id, n, &format),
        },
        Command::Plugins {
            command: Some(PluginsCommand::Publish { dir, config, state }),
            ..
        } => serve::publish(&read_config(config)?, &state, &dir),
        Command::Plugins { server, .. } => server.plugins(),
        Command::Usage {
            agent,
            since,
            days,
            key,
            json,
            server,
        } => server.usage(
            agent.as_deref(),
            since.as_deref(),
            days,
            key.as_deref(),
            json,
        ),
        Command::Replay {
            sessions,
            agent,
            since,
            limit,
            plugins,
            config,
            format,
            json,
            server,
        } => server.replay(&client::Replay {
            sessions,
            agent,
            since: since.as_deref().map(client::since_ms).transpose()?,
            limit: Some(limit),
            plugins: plugins.map(|p| absolute("--plugins", &p)).transpose()?,
            swap: Vec::new(),
            config: config.map(|c| absolute("--config", &c)).transpose()?,
            format,
            json,
        }),
        Command::Compile { .. } => unreachable!("main runs the compiler child"),
    }
}

/// `path` made absolute against the working directory: the daemon reads it on its machine,
/// from wherever it was started.
fn absolute(flag: &'static str, path: &Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(path).map_err(|e| {
        CliError::BadArgument {
            flag,
            value: path.display().to_string(),
            expected: format!("a path ({e})"),
        }
        .into()
    })
}

/// The config file in use: the explicit one, or ./promptd.toml when present.
fn config_path(path: Option<PathBuf>) -> Option<PathBuf> {
    path.or_else(|| Some(PathBuf::from("promptd.toml")).filter(|p| p.is_file()))
}

/// The config from [`config_path`], or the defaults when there is none.
fn read_config(path: Option<PathBuf>) -> Result<Config, promptd_daemon::DaemonError> {
    match config_path(path) {
        Some(p) => plugin_dir::read_config(&p),
        None => Ok(Config::default()),
    }
}

/// Outside a session, `data` plugins' blocks are keyed with the config file's text (T8): the
/// same for every run of the same config, and unknown to plugins, which cannot read it.
fn data_secret(config: Option<&std::path::Path>) -> String {
    config
        .and_then(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default()
}

fn parse_facts(facts: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    facts
        .iter()
        .map(|f| match f.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(CliError::BadArgument {
                flag: "--fact",
                value: f.clone(),
                expected: "expected KEY=VALUE".into(),
            }
            .into()),
        })
        .collect()
}

fn assemble(
    plugins: Option<PathBuf>,
    config: Option<PathBuf>,
    agent: &str,
    facts: &[String],
    explain: bool,
    budget: bool,
    inputs: &InputArgs,
) -> anyhow::Result<()> {
    let config_file = config_path(config);
    let secret = data_secret(config_file.as_deref());
    let config = read_config(config_file)?;
    let facts = parse_facts(facts)?;
    let dir = plugins
        .or_else(|| config.plugin_dir.clone())
        .unwrap_or_else(|| PathBuf::from("plugins"));
    let engine = one_shot_engine()?;
    let loaded = load::load_all(&engine, plugin_dir::read_all(&dir)?, &config);
    // The one-shot command is strict: a refused plugin is an error, not a silent omission.
    if let Some(refusal) = loaded.refused.into_iter().next() {
        return Err(refusal.error.into());
    }
    let plan = AgentSettings::resolve(&config, agent, promptd_tokenize::counter)?;
    let model = (inputs.model.clone()).or_else(|| facts.get("model").cloned());
    let step = Step {
        agent: plan.agent.clone(),
        scope_chain: plan.scope_chain.clone(),
        session_id: String::new(),
        step_number: inputs.step,
        facts,
        inputs: StepInputs {
            last_user_message: inputs.user.clone(),
            model,
            client_tools: (!inputs.client_tools.is_empty()).then(|| inputs.client_tools.clone()),
            turn_count: Some(u64::from(inputs.user.is_some())),
        },
    };
    let assembled = assembly::assemble(&loaded.registry, &step, &plan.options_for(secret.into()))?;
    for o in &assembled.omitted {
        tracing::warn!(plugin = %o.plugin, "optional plugin left out: {}: {}", o.contribution, o.cause);
    }
    let mut json = request::neutral_json(&assembled, plan.model.clone(), explain);
    if budget {
        let header = promptd_core::session::header(&assembled, plan.model.clone());
        let snapshot: Vec<_> = assembled
            .runtime_context
            .iter()
            .map(|c| {
                promptd_core::formats::neutral_message(
                    &promptd_core::conversation::Message::snapshot(c),
                )
                .to_string()
            })
            .collect();
        let mut messages = promptd_core::budget::Size::default();
        for m in &snapshot {
            messages += promptd_core::budget::Size::of(m, &*plan.counter);
        }
        let usage = promptd_core::budget::usage(
            &plan.budget,
            &*plan.counter,
            &header,
            &assembled,
            promptd_core::formats::Format::Neutral,
            assembled.shown_tools.as_deref(),
            promptd_core::budget::Measured {
                size: messages,
                count: snapshot.len(),
            },
        );
        json["usage"] = serde_json::to_value(&usage)?;
    }
    println!("{}", serde_json::to_string_pretty(&json)?);
    Ok(())
}

/// The engine for one-shot commands. It keeps compiled plugins in a cache too, so a 12-18 MB
/// JavaScript or Python component compiles once rather than at every run: the folder in
/// `PROMPTD_CACHE` (`off` disables it), else `$XDG_CACHE_HOME/promptd`, else
/// `~/.cache/promptd`. A cache that cannot be created only costs time, so it is skipped.
fn one_shot_engine() -> anyhow::Result<WasmEngine> {
    let env = |key| {
        std::env::var_os(key)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let dir = match env("PROMPTD_CACHE") {
        Some(dir) if dir == Path::new("off") => None,
        Some(dir) => Some(dir),
        None => env("XDG_CACHE_HOME")
            .or_else(|| env("HOME").map(|h| h.join(".cache")))
            .map(|d| d.join("promptd")),
    };
    let engine = WasmEngine::new()?.with_compiler(compiler()?);
    match dir {
        Some(dir) if std::fs::create_dir_all(&dir).is_ok() => {
            Ok(engine.with_cache(&dir, cache::DEFAULT_MAX_BYTES)?)
        }
        _ => Ok(engine),
    }
}

/// The compiler child of every engine (L7): this very binary.
pub(crate) fn compiler() -> anyhow::Result<Compiler> {
    use anyhow::Context;
    Compiler::current_exe().context("find the promptd executable to compile plugins with")
}

fn check(file: &Path, config: Option<PathBuf>) -> anyhow::Result<()> {
    let config = read_config(config)?;
    let engine = one_shot_engine()?;
    let (entry, _) = load::load(&engine, &plugin_dir::read(file)?, &config)?;
    let json = serde_json::json!({
        "id": entry.id,
        "origin": entry.origin,
        "declares": request::declaration_json(&entry.declaration),
    });
    println!("{}", serde_json::to_string_pretty(&json)?);
    Ok(())
}

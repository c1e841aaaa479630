//! `promptd plugin new` and `promptd plugin build`: from nothing to a loadable plugin, in Rust,
//! JavaScript, Python or C.
//!
//! A plugin folder holds its sources and nothing else; its language is read off the files
//! (`Cargo.toml`, `plugin.js`, `app.py`, `*.c`). `build` runs that language's one build command
//! and leaves `NAME.wasm` in the folder. The templates (host/templates/) are the same logical
//! plugin in each language, so every language starts from the same output.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use crate::error::CliError;

/// A language a plugin can be written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lang {
    Rust,
    Js,
    Python,
    C,
}

/// A template file: its path in the new folder, and its text with `@NAME@` (and `@SDK@`) holes.
type Template = (&'static str, &'static str);

impl Lang {
    pub fn parse(name: &str) -> Result<Lang, CliError> {
        match name {
            "rust" | "rs" => Ok(Lang::Rust),
            "js" | "javascript" => Ok(Lang::Js),
            "python" | "py" => Ok(Lang::Python),
            "c" => Ok(Lang::C),
            other => Err(CliError::BadArgument {
                flag: "--lang",
                value: other.to_string(),
                expected: "expected one of rust, js, python, c".into(),
            }),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Lang::Rust => "rust",
            Lang::Js => "js",
            Lang::Python => "python",
            Lang::C => "c",
        }
    }

    fn templates(self) -> &'static [Template] {
        match self {
            Lang::Rust => &[
                ("Cargo.toml", include_str!("../templates/rust/Cargo.toml")),
                ("src/lib.rs", include_str!("../templates/rust/src/lib.rs")),
            ],
            Lang::Js => &[("plugin.js", include_str!("../templates/js/plugin.js"))],
            Lang::Python => &[("app.py", include_str!("../templates/python/app.py"))],
            Lang::C => &[("plugin.c", include_str!("../templates/c/plugin.c"))],
        }
    }

    /// The build command, as the plugin's README shows it.
    fn build_line(self) -> &'static str {
        match self {
            Lang::Rust => {
                "cargo build --release --target wasm32-wasip2, then copies the component here"
            }
            Lang::Js => "sdk/js/build.sh . NAME.wasm (esbuild, then componentize-js)",
            Lang::Python => "sdk/python/build.sh . NAME.wasm (componentize-py)",
            Lang::C => {
                "sdk/c/build.sh . NAME.wasm (clang for wasm32-wasi, then wasm-tools component new)"
            }
        }
    }

    /// Which language the plugin in `dir` is written in.
    fn detect(dir: &Path) -> Option<Lang> {
        if dir.join("Cargo.toml").is_file() {
            return Some(Lang::Rust);
        }
        if dir.join("plugin.js").is_file() {
            return Some(Lang::Js);
        }
        if dir.join("app.py").is_file() {
            return Some(Lang::Python);
        }
        let has_c = std::fs::read_dir(dir)
            .ok()?
            .flatten()
            .any(|e| e.path().extension().is_some_and(|x| x == "c"));
        has_c.then_some(Lang::C)
    }
}

/// The promptd checkout `dir` is in, if any: the nearest ancestor holding `wit/plugin.wit` and
/// the SDKs.
fn enclosing_checkout(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .find(|d| d.join("wit/plugin.wit").is_file() && d.join("sdk/rust/Cargo.toml").is_file())
        .map(Path::to_path_buf)
}

/// Where the SDKs are for a plugin in `plugin_dir`: `PROMPTD_SDK`, else the `sdk/` of the
/// checkout the plugin is in, else that of the checkout this binary was built from, if it is
/// still there.
fn sdk_dir(lang: Lang, plugin_dir: &Path) -> Result<PathBuf, CliError> {
    let root = std::env::var_os("PROMPTD_SDK")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| enclosing_checkout(plugin_dir).map(|c| c.join("sdk")))
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sdk"));
    let sdk = root.join(lang.name());
    std::fs::canonicalize(&sdk).map_err(|source| CliError::SdkNotFound {
        lang: lang.name(),
        path: sdk,
        source,
    })
}

/// The Rust SDK and the WIT it binds, built into this binary, for plugins made away from a
/// checkout: (path in the plugin folder, text). The SDK's `../../wit` then finds `wit/`.
const EMBEDDED_RUST_SDK: &[Template] = &[
    (
        "sdk/rust/Cargo.toml",
        include_str!("../../../sdk/rust/Cargo.toml"),
    ),
    (
        "sdk/rust/src/lib.rs",
        include_str!("../../../sdk/rust/src/lib.rs"),
    ),
    (
        "sdk/rust/src/runtime.rs",
        include_str!("../../../sdk/rust/src/runtime.rs"),
    ),
    ("wit/plugin.wit", include_str!("../../../wit/plugin.wit")),
];

/// How a new Rust plugin in `dir` depends on the SDK, as a path for its `Cargo.toml`:
/// `$PROMPTD_SDK/rust` when set; a relative path when `dir` is inside a promptd checkout;
/// otherwise a copy of the SDK this binary carries, written into the plugin folder, so the
/// plugin builds wherever it is moved and never points into the checkout promptd was built
/// from.
fn rust_sdk_dependency(dir: &Path) -> Result<String, CliError> {
    if let Some(root) = std::env::var_os("PROMPTD_SDK").filter(|v| !v.is_empty()) {
        let sdk = PathBuf::from(root).join("rust");
        return std::fs::canonicalize(&sdk)
            .map(|p| p.display().to_string())
            .map_err(|source| CliError::SdkNotFound {
                lang: "rust",
                path: sdk,
                source,
            });
    }
    if let Some(checkout) = enclosing_checkout(dir) {
        let depth = dir
            .strip_prefix(&checkout)
            .map(|rest| rest.components().count())
            .unwrap_or(0);
        return Ok(format!("{}sdk/rust", "../".repeat(depth)));
    }
    for (path, text) in EMBEDDED_RUST_SDK {
        write(&dir.join(path), text)?;
    }
    Ok("sdk/rust".into())
}

fn write(path: &Path, text: &str) -> Result<(), CliError> {
    let fail = |source| CliError::Write {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(fail)?;
    }
    std::fs::write(path, text).map_err(fail)
}

fn check_name(name: &str) -> Result<(), CliError> {
    let mut chars = name.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !ok {
        return Err(CliError::BadArgument {
            flag: "plugin name",
            value: name.to_string(),
            expected: "use lowercase letters, digits and `_`, starting with a letter".into(),
        });
    }
    Ok(())
}

/// Creates `parent/NAME/`: a plugin folder in `lang` that `build` turns into `NAME.wasm`.
pub fn new(name: &str, lang: &str, parent: &Path) -> anyhow::Result<()> {
    check_name(name)?;
    let lang = Lang::parse(lang)?;
    let dir = parent.join(name);
    if dir.exists() {
        bail!(CliError::AlreadyExists { path: dir });
    }
    std::fs::create_dir_all(&dir).map_err(|source| CliError::Write {
        path: dir.clone(),
        source,
    })?;
    // Absolute, so a checkout above it is found whatever the current folder.
    let dir = std::fs::canonicalize(&dir).map_err(|source| CliError::Folder {
        path: dir.clone(),
        source,
    })?;
    // Only Rust's manifest names the SDK; the other build scripts find it themselves.
    let sdk = match lang {
        Lang::Rust => rust_sdk_dependency(&dir)?,
        _ => String::new(),
    };
    for (path, text) in lang.templates() {
        let text = text.replace("@NAME@", name).replace("@SDK@", &sdk);
        write(&dir.join(path), &text)?;
    }
    write(
        &dir.join("README.md"),
        &format!(
            "# {name}\n\nA promptd plugin in {lang}. Build it into `{name}.wasm`, in this folder:\n\n\
             ```sh\npromptd plugin build\n```\n\n\
             which runs {build}. Then try it:\n\n\
             ```sh\npromptd assemble --plugins . --fact cwd=/src\n```\n\n\
             or copy `{name}.wasm` into a daemon's plugin folder.\n",
            lang = lang.name(),
            build = lang.build_line().replace("NAME", name),
        ),
    )?;
    println!(
        "created {}; build it with: cd {} && promptd plugin build",
        dir.display(),
        dir.display()
    );
    Ok(())
}

/// Builds the plugin in `dir` into `dir/NAME.wasm` and prints its path.
pub fn build(dir: &Path) -> anyhow::Result<()> {
    println!("{}", build_plugin(dir)?.display());
    Ok(())
}

/// Whether `dir` is a plugin folder `build_plugin` can build.
pub fn is_plugin_folder(dir: &Path) -> bool {
    Lang::detect(dir).is_some()
}

/// Builds the plugin in `dir` into `dir/NAME.wasm` and returns that path.
pub fn build_plugin(dir: &Path) -> anyhow::Result<PathBuf> {
    let dir = std::fs::canonicalize(dir).map_err(|source| CliError::Folder {
        path: dir.to_path_buf(),
        source,
    })?;
    let Some(lang) = Lang::detect(&dir) else {
        bail!(CliError::NotAPluginFolder { dir });
    };
    let failed = |cause: String| CliError::BuildFailed {
        dir: dir.clone(),
        lang: lang.name(),
        cause,
    };
    if lang == Lang::Rust {
        return build_rust(&dir).map_err(|e| failed(format!("{e:#}")).into());
    }
    // The id is the file stem, and a new plugin's folder is named after it.
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| failed("the plugin folder has no name".into()))?;
    let out = dir.join(format!("{name}.wasm"));
    // Built beside, then renamed: a daemon watching this folder (`serve --plugins . --dev .`)
    // never sees a half-written component. Not `*.wasm`, so no plugin scan picks it up.
    let partial = dir.join(format!(".{name}.wasm.partial"));
    let script = sdk_dir(lang, &dir)?.join("build.sh");
    let run = Command::new("bash")
        .arg(&script)
        .arg(&dir)
        .arg(&partial)
        .output()
        .map_err(|e| failed(format!("cannot run bash {}: {e}", script.display())))?;
    if !run.status.success() {
        let _ = std::fs::remove_file(&partial);
        // The script's last stderr line says what went wrong (e.g. which installer to run); it
        // becomes the error, and everything before it is shown as the tool wrote it.
        let said = String::from_utf8_lossy(&run.stderr);
        let mut lines: Vec<&str> = said.lines().filter(|l| !l.trim().is_empty()).collect();
        let last = lines.pop().unwrap_or("no message");
        for line in lines {
            eprintln!("{line}");
        }
        bail!(failed(format!(
            "{} ({}): {last}",
            script.display(),
            run.status
        )));
    }
    std::fs::rename(&partial, &out)
        .map_err(|e| failed(format!("rename into {}: {e}", out.display())))?;
    Ok(out)
}

/// Builds a Rust plugin and copies its component into `dir`. The artifact's path is the one
/// cargo reports (so `CARGO_TARGET_DIR` and workspace target folders are honoured).
fn build_rust(dir: &Path) -> anyhow::Result<PathBuf> {
    let text = std::fs::read_to_string(dir.join("Cargo.toml"))?;
    let name = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("name = \""))
        .and_then(|rest| rest.split('"').next())
        .context("Cargo.toml has no package name")?
        .replace('-', "_");
    let run = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(dir)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("run cargo (is Rust installed?)")?;
    if !run.status.success() {
        bail!(
            "cargo build failed ({}); if the target is missing: rustup target add wasm32-wasip2",
            run.status
        );
    }
    let built =
        built_artifact(&String::from_utf8_lossy(&run.stdout), &name).with_context(|| {
            format!("cargo reported no {name}.wasm (is the crate a cdylib named `{name}`?)")
        })?;
    let out = dir.join(format!("{name}.wasm"));
    std::fs::copy(&built, &out).with_context(|| format!("copy {}", built.display()))?;
    Ok(out)
}

/// The `.wasm` file of crate `name` among cargo's JSON messages.
fn built_artifact(messages: &str, name: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
        .flat_map(|m| {
            m["filenames"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f.as_str().map(PathBuf::from))
                .collect::<Vec<_>>()
        })
        .find(|f| f.extension().is_some_and(|e| e == "wasm"))
}

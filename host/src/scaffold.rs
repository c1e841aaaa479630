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
use promptd::Error;

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
    pub fn parse(name: &str) -> Result<Lang, Error> {
        match name {
            "rust" | "rs" => Ok(Lang::Rust),
            "js" | "javascript" => Ok(Lang::Js),
            "python" | "py" => Ok(Lang::Python),
            "c" => Ok(Lang::C),
            other => Err(Error::ConfigInvalid(format!(
                "--lang {other}: expected one of rust, js, python, c"
            ))),
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

/// The SDK folder of the checkout this binary was built from, or `PROMPTD_SDK`.
fn sdk_dir(lang: Lang) -> anyhow::Result<PathBuf> {
    let root = std::env::var_os("PROMPTD_SDK")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk"));
    let sdk = root.join(lang.name());
    std::fs::canonicalize(&sdk).map_err(|e| {
        Error::Io {
            path: sdk.display().to_string(),
            message: format!(
                "the {} SDK is not here ({e}); promptd uses the sdk/ of the checkout it was built \
                 from, or the folder in PROMPTD_SDK",
                lang.name()
            ),
        }
        .into()
    })
}

fn check_name(name: &str) -> Result<(), Error> {
    let mut chars = name.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !ok {
        return Err(Error::ConfigInvalid(format!(
            "plugin name `{name}`: use lowercase letters, digits and `_`, starting with a letter"
        )));
    }
    Ok(())
}

/// Creates `parent/NAME/`: a plugin folder in `lang` that `build` turns into `NAME.wasm`.
pub fn new(name: &str, lang: &str, parent: &Path) -> anyhow::Result<()> {
    check_name(name)?;
    let lang = Lang::parse(lang)?;
    let dir = parent.join(name);
    if dir.exists() {
        bail!(Error::Io {
            path: dir.display().to_string(),
            message: "already exists; choose another name or folder".into(),
        });
    }
    // Only Rust's manifest names the SDK; the other build scripts find it themselves.
    let sdk = match lang {
        Lang::Rust => sdk_dir(lang)?.display().to_string(),
        _ => String::new(),
    };
    for (path, text) in lang.templates() {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let text = text.replace("@NAME@", name).replace("@SDK@", &sdk);
        std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
    }
    std::fs::write(
        dir.join("README.md"),
        format!(
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
    let dir = std::fs::canonicalize(dir).map_err(|e| Error::Io {
        path: dir.display().to_string(),
        message: e.to_string(),
    })?;
    let Some(lang) = Lang::detect(&dir) else {
        bail!(Error::Io {
            path: dir.display().to_string(),
            message: "no plugin here (no Cargo.toml, plugin.js, app.py or .c file): run \
                      `promptd plugin build` in a folder made by `promptd plugin new`"
                .into(),
        });
    };
    let failed = |cause: String| Error::BuildFailed {
        dir: dir.display().to_string(),
        lang: lang.name().to_string(),
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
    let script = sdk_dir(lang)?.join("build.sh");
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

fn build_rust(dir: &Path) -> anyhow::Result<PathBuf> {
    let text = std::fs::read_to_string(dir.join("Cargo.toml"))?;
    let name = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("name = \""))
        .and_then(|rest| rest.split('"').next())
        .context("Cargo.toml has no package name")?
        .replace('-', "_");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--release", "--target", "wasm32-wasip2"])
        .current_dir(dir)
        .status()
        .context("run cargo (is Rust installed?)")?;
    if !status.success() {
        bail!("cargo build failed ({status}); if the target is missing: rustup target add wasm32-wasip2");
    }
    let built = dir.join(format!("target/wasm32-wasip2/release/{name}.wasm"));
    let out = dir.join(format!("{name}.wasm"));
    std::fs::copy(&built, &out).with_context(|| format!("copy {}", built.display()))?;
    Ok(out)
}

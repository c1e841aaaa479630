//! `promptd plugin new` and `promptd plugin build`: from nothing to a loadable plugin.
//!
//! Rust only for now; the JavaScript, Python and C SDKs in `sdk/` have their own build scripts
//! and join here with the languages issue.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

/// The Rust SDK of the checkout this binary was built from.
fn rust_sdk() -> anyhow::Result<PathBuf> {
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk/rust");
    std::fs::canonicalize(&sdk).with_context(|| {
        format!(
            "the Rust SDK is not at {} (promptd scaffolds against the checkout it was built from)",
            sdk.display()
        )
    })
}

fn check_name(name: &str) -> anyhow::Result<()> {
    let mut chars = name.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !ok {
        bail!(promptd::Error::ConfigInvalid(format!(
            "plugin name `{name}`: use lowercase letters, digits and `_`, starting with a letter"
        )));
    }
    Ok(())
}

/// Creates `parent/NAME/`: a one-plugin cargo workspace using the Rust SDK.
pub fn new(name: &str, lang: &str, parent: &Path) -> anyhow::Result<()> {
    check_name(name)?;
    if lang != "rust" {
        bail!(promptd::Error::ConfigInvalid(format!(
            "--lang {lang}: only `rust` is scaffolded so far; see sdk/js, sdk/python and sdk/c for the other SDKs"
        )));
    }
    let dir = parent.join(name);
    if dir.exists() {
        bail!(promptd::Error::Io {
            path: dir.display().to_string(),
            message: "already exists; choose another name or folder".into(),
        });
    }
    let sdk = rust_sdk()?;
    std::fs::create_dir_all(dir.join("src"))?;
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2021\"\npublish = false\n\n\
             [lib]\ncrate-type = [\"cdylib\"]\n\n[dependencies]\npromptd-sdk = {{ path = {sdk:?} }}\n\n\
             # A workspace of its own, so it builds wherever it lives.\n[workspace]\n\n\
             [profile.release]\nopt-level = \"s\"\nstrip = true\npanic = \"abort\"\n",
            sdk = sdk.display().to_string()
        ),
    )?;
    std::fs::write(
        dir.join("src/lib.rs"),
        format!(
            "//! The `{name}` promptd plugin.\n\n\
             use promptd_sdk::{{export_plugin, Config, Plugin}};\n\n\
             fn declare(config: &Config) -> Result<Plugin, String> {{\n\
             \x20   Ok(Plugin::new()\n\
             \x20       .section(\"{name}:rules\", 50, \"Answer as {{{{{name}_style}}}}.\")\n\
             \x20       .variable(\"{name}_style\", config.get_or(\"style\", \"briefly as you can\"))\n\
             \x20       .dynamic_context(\"{name}:cwd\", 50, |step| {{\n\
             \x20           Ok(step.fact(\"cwd\").map(|cwd| format!(\"Working in {{cwd}}.\")).unwrap_or_default())\n\
             \x20       }}))\n\
             }}\n\n\
             export_plugin!(declare);\n"
        ),
    )?;
    std::fs::write(
        dir.join("README.md"),
        format!(
            "# {name}\n\nA promptd plugin. Build it into `{name}.wasm` (in this folder):\n\n\
             ```sh\npromptd plugin build\n```\n\n\
             which runs `cargo build --release --target wasm32-wasip2` and copies the component\n\
             here. Then `promptd plugin check {name}.wasm`, or drop it into a daemon's plugin folder.\n"
        ),
    )?;
    println!(
        "created {}; build it with: cd {} && promptd plugin build",
        dir.display(),
        dir.display()
    );
    Ok(())
}

/// Builds the plugin in `dir` and copies `NAME.wasm` into `dir`; prints its path.
pub fn build(dir: &Path) -> anyhow::Result<()> {
    let manifest = dir.join("Cargo.toml");
    if !manifest.is_file() {
        bail!(promptd::Error::Io {
            path: dir.display().to_string(),
            message: "no Cargo.toml here: run `promptd plugin build` in a plugin folder made by `promptd plugin new`".into(),
        });
    }
    let text = std::fs::read_to_string(&manifest)?;
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
        bail!("cargo build failed; if the target is missing: rustup target add wasm32-wasip2");
    }
    let built = dir.join(format!("target/wasm32-wasip2/release/{name}.wasm"));
    let out = dir.join(format!("{name}.wasm"));
    std::fs::copy(&built, &out).with_context(|| format!("copy {}", built.display()))?;
    println!("{}", out.display());
    Ok(())
}

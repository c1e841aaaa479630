//! The `@NAME@` promptd plugin.

use promptd_sdk::{export_plugin, Config, Plugin, Reads};

fn declare(config: &Config) -> Result<Plugin, String> {
    Ok(Plugin::new()
        .section("@NAME@:rules", 50, "Answer as {{@NAME@_style}}.")
        .variable("@NAME@_style", config.get_or("style", "briefly as you can"))
        .dynamic_context("@NAME@:cwd", 50, |step| {
            Ok(step
                .fact("cwd")
                .map(|cwd| format!("Working in {cwd}."))
                .unwrap_or_default())
        })
        // It reads the fact `cwd` only: asked again only when that changes.
        .reads(Reads::facts(["cwd"])))
}

export_plugin!(declare);

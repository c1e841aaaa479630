//! `persona`: the agent's voice, from config (order 0, by convention).
//!
//! Config: `text` is the section's template; every other key is a variable it may use.
//!
//! ```toml
//! [plugins.persona]
//! config = { text = "You are {{name}}, a {{role}}.", name = "Ada", role = "code reviewer" }
//! ```

use promptd_sdk::{export_plugin, Config, Plugin};

const DEFAULT_TEXT: &str = "Be direct and accurate. Say so when you are unsure, and prefer \
                            short answers that show their reasoning.";

fn declare(config: &Config) -> Result<Plugin, String> {
    let order = match config.get("order") {
        Some(o) => o
            .parse::<i32>()
            .map_err(|e| format!("config `order` = `{o}`: {e}"))?,
        None => 0,
    };
    let mut plugin = Plugin::new().section("persona", order, config.get_or("text", DEFAULT_TEXT));
    for (key, value) in config
        .iter()
        .filter(|(k, _)| !["text", "order"].contains(k))
    {
        plugin = plugin.variable(key, value);
    }
    Ok(plugin)
}

export_plugin!(declare);

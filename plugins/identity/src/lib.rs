//! `identity`: who the agent is and what it runs on (order -100, by convention).
//!
//! Config: `name` (default "an AI assistant"), `model` (the model, when not given per step).
//! Step fact `model` overrides the configured model.

use promptd_sdk::{export_plugin, Config, Plugin, Reads};

fn declare(config: &Config) -> Result<Plugin, String> {
    let configured_model = config.get("model").map(str::to_string);
    let model = configured_model.clone();
    Ok(Plugin::new()
        // Both dynamic items read the fact `model` only: in a session they are asked again
        // only when it changes (world 0.3.0).
        .reads_by_default(Reads::facts(["model"]))
        .variable("agent_name", config.get_or("name", "an AI assistant"))
        .dynamic_variable("model", move |step| {
            Ok(step
                .fact("model")
                .map(str::to_string)
                .or_else(|| model.clone()))
        })
        .dynamic_section("identity", -100, move |step| {
            let runs_on = if step.fact("model").is_some() || configured_model.is_some() {
                " running on the model {{model}}"
            } else {
                ""
            };
            Ok(format!(
                "You are {{{{agent_name}}}}{runs_on}. Your instructions are assembled by \
                 promptd from plugins; a runtime context message, when present, describes \
                 your environment and supersedes earlier ones."
            ))
        }))
}

export_plugin!(declare);

use super::*;

#[test]
fn r6_tool_order_needs_rest_marker() {
    let err = Config::parse(r#"tool_order = ["bash"]"#, "t").unwrap_err();
    assert_eq!(err.code(), "tool_order_missing_rest");
}

#[test]
fn r6_tool_order_rejects_duplicates() {
    let err =
        Config::parse(r#"tool_order = ["bash", "<unlisted-tools>", "bash"]"#, "t").unwrap_err();
    assert_eq!(err.code(), "tool_order_duplicate");
    assert!(err.to_string().contains("`bash`"));
    let err = Config::parse(
        r#"tool_order = ["<unlisted-tools>", "<unlisted-tools>"]"#,
        "t",
    )
    .unwrap_err();
    assert_eq!(err.code(), "tool_order_duplicate");
}

#[test]
fn unknown_keys_are_errors() {
    let err = Config::parse("plugin_dri = \"x\"", "promptd.toml").unwrap_err();
    assert_eq!(err.code(), "config_parse");
    assert!(err.to_string().contains("plugin_dri"), "{err}");
    let err = Config::parse("[agents.a]\nparnet = \"b\"", "t").unwrap_err();
    assert!(err.to_string().contains("parnet"), "{err}");
    assert!(
        err.to_string()
            .contains("t: line 2, column 1: unknown field"),
        "{err}"
    );
}

#[test]
fn l8_declaration_limits_default_are_overridden_per_plugin_and_checked() {
    let config = Config::parse(
        "[limits]\nmax_tools = 10\nmax_declared_kb = 8\n[plugins.big]\nmax_tools = 500\n",
        "t",
    )
    .unwrap();
    let big = config.plugin_options("big").limits;
    let other = config.plugin_options("other").limits;
    assert_eq!((big.max_tools, other.max_tools), (500, 10));
    assert_eq!(big.max_declared_bytes, 8 << 10);
    assert_eq!(other.max_sections, defaults::MAX_SECTIONS as usize);
    let err = Config::parse("[limits]\nmax_sections = 0\n", "t").unwrap_err();
    assert!(
        err.to_string()
            .contains("limits.max_sections must be greater than 0"),
        "{err}"
    );
    let err = Config::parse("[plugins.x]\nmax_name_bytes = 0\n", "t").unwrap_err();
    assert!(
        err.to_string().contains("plugins.x.max_name_bytes"),
        "{err}"
    );
}

#[test]
fn q14_budgets_and_tool_result_templates_are_checked_and_inherited() {
    let c = Config::parse(
        "[agents.coder.budget]\nwindow = 1000\nreserve = 100\ntokenizer = \"o200k\"\n\
         [agents.reviewer]\nparent = \"coder\"\n[agents.reviewer.budget]\nreserve = 200\n\
         [agents.coder]\ntool_result_template = \"<o>{observation}</o>\"\n",
        "t",
    );
    let c = c.unwrap();
    let b = c.budget("reviewer").unwrap();
    assert_eq!(
        (b.window, b.reserve, b.tokenizer.as_str()),
        (Some(1000), 200, "o200k")
    );
    assert!(c.budget("default").is_none());
    assert_eq!(
        c.tool_results("reviewer").0.as_deref(),
        Some("<o>{observation}</o>")
    );
    assert_eq!(c.tool_results("default").1, EMPTY_TOOL_RESULT);
    let bad = |text: &str, words: &str| {
        let e = Config::parse(text, "t").unwrap_err();
        assert_eq!(e.code(), "config_invalid");
        assert!(e.to_string().contains(words), "{e}");
    };
    bad(
        "[agents.a]\ntool_result_template = \"no placeholder\"\n",
        "`{observation}` exactly once",
    );
    bad(
        "[agents.a]\ntool_result_template = \"{observation}{observation}\"\n",
        "exactly once",
    );
    bad(
        "[agents.a.budget]\nwindow = 100\nreserve = 100\n",
        "must be smaller than budget.window",
    );
    bad(
        "[agents.a.budget]\ntokenizer = \"gpt2\"\n",
        "not one of chars, o200k, cl100k",
    );
    bad("[agents.a.budget]\nwindow = 0\n", "greater than 0");
}

#[test]
fn plugin_config_values_must_be_strings() {
    let err = Config::parse("[plugins.p]\nconfig = { n = 3 }", "t").unwrap_err();
    assert_eq!(err.code(), "config_parse");
}

#[test]
fn chains_follow_parents_farthest_first() {
    let c = Config::parse(
        "[agents.coder]\n[agents.reviewer]\nparent = \"coder\"\n",
        "t",
    )
    .unwrap();
    assert_eq!(
        c.chain("reviewer").unwrap(),
        ["global", "coder", "reviewer"]
    );
    assert_eq!(c.chain("coder").unwrap(), ["global", "coder"]);
    assert_eq!(c.chain("stranger").unwrap(), ["global", "stranger"]);
    assert_eq!(c.chain(DEFAULT_AGENT).unwrap(), ["global", "default"]);
}

#[test]
fn cycles_are_config_errors() {
    let err = Config::parse(
        "[agents.a]\nparent = \"b\"\n[agents.b]\nparent = \"a\"\n",
        "t",
    )
    .unwrap_err();
    assert_eq!(err.code(), "config_invalid");
    assert!(err.to_string().contains("cycle"), "{err}");
}

#[test]
fn model_settings_merge_global_then_chain_and_per_provider() {
    let c = Config::parse(
        "[model]\nmodel = \"m1\"\nmax_tokens = 1024\n[model.anthropic]\nmodel = \"claude\"\n\
         [agents.big.model]\nmodel = \"m2\"\n[agents.big.model.anthropic]\ntemperature = 0.5\n\
         [agents.small]\nparent = \"big\"\n[agents.small.model]\nmax_tokens = 64\n",
        "t",
    )
    .unwrap();
    let model = |agent: &str| serde_json::Value::Object(c.model(agent));
    assert_eq!(
        model("default"),
        serde_json::json!({"model": "m1", "max_tokens": 1024, "anthropic": {"model": "claude"}})
    );
    // `big` sets `model` for every format: it takes it out of the global Anthropic table
    // (issue 45: the more specific scope wins, then the more specific format).
    assert_eq!(
        model("small"),
        serde_json::json!({"model": "m2", "max_tokens": 64,
            "anthropic": {"temperature": 0.5}})
    );
    let small = c.model("small");
    let pick = |f| serde_json::Value::Object(crate::formats::settings(&small, f));
    assert_eq!(
        pick(crate::formats::Format::Anthropic),
        serde_json::json!({"model": "m2", "max_tokens": 64, "temperature": 0.5})
    );
    assert_eq!(
        pick(crate::formats::Format::Openai),
        serde_json::json!({"model": "m2", "max_tokens": 64})
    );
}

/// Issue 45: along the chain the more specific scope wins, then the more specific format: an
/// agent's key for every format beats the same key in an outer level's provider table; in
/// one level the provider table beats the generic key.
#[test]
fn model_settings_the_nearer_scope_wins_then_the_provider_table() {
    use crate::formats::{settings, Format};
    let body = |toml: &str, agent: &str, format: Format| {
        let c = Config::parse(toml, "t").unwrap();
        serde_json::Value::Object(settings(&c.model(agent), format))
    };
    let global = "[model]\nmax_tokens = 64\n[model.anthropic]\nmodel = \"a\"\n";
    // An agent's generic key over the global provider table.
    let toml = format!("{global}[agents.x.model]\nmodel = \"b\"\n");
    assert_eq!(
        body(&toml, "x", Format::Anthropic),
        serde_json::json!({"model": "b", "max_tokens": 64})
    );
    // The emptied table goes; an agent that sets nothing keeps the global table.
    let c = Config::parse(&toml, "t").unwrap();
    assert_eq!(
        serde_json::Value::Object(c.model("x")),
        serde_json::json!({"model": "b", "max_tokens": 64})
    );
    assert_eq!(
        body(&toml, "y", Format::Anthropic),
        serde_json::json!({"model": "a", "max_tokens": 64})
    );
    // In one level the provider table wins over the generic key.
    let toml = format!(
        "{global}[agents.x.model]\nmodel = \"b\"\n[agents.x.model.anthropic]\nmodel = \"c\"\n"
    );
    assert_eq!(
        body(&toml, "x", Format::Anthropic),
        serde_json::json!({"model": "c", "max_tokens": 64})
    );
    assert_eq!(
        body(&toml, "x", Format::Openai),
        serde_json::json!({"model": "b", "max_tokens": 64})
    );
    // A parent's provider table against its child's generic key: the child's wins, and
    // the parent's other provider keys stay.
    let toml = format!(
        "{global}[agents.p.model.anthropic]\nmodel = \"p\"\ntemperature = 0.5\n\
         [agents.x]\nparent = \"p\"\n[agents.x.model]\nmodel = \"b\"\n"
    );
    assert_eq!(
        body(&toml, "p", Format::Anthropic),
        serde_json::json!({"model": "p", "max_tokens": 64, "temperature": 0.5})
    );
    assert_eq!(
        body(&toml, "x", Format::Anthropic),
        serde_json::json!({"model": "b", "max_tokens": 64, "temperature": 0.5})
    );
    // A child's provider table still beats its parent's generic key.
    let toml = format!(
        "{global}[agents.p.model]\nmodel = \"p\"\n\
         [agents.x]\nparent = \"p\"\n[agents.x.model.anthropic]\nmodel = \"c\"\n"
    );
    assert_eq!(
        body(&toml, "x", Format::Anthropic),
        serde_json::json!({"model": "c", "max_tokens": 64})
    );
    // Responses reads the `openai` table too: an agent's generic key beats both outer ones.
    let toml = "[model]\nmodel = \"m\"\n[model.openai]\nmodel = \"o\"\n\
                [model.openai-responses]\nmodel = \"r\"\n[agents.x.model]\nmodel = \"b\"\n";
    assert_eq!(
        body(toml, "x", Format::OpenaiResponses),
        serde_json::json!({"model": "b"})
    );
    assert_eq!(
        body(toml, "y", Format::OpenaiResponses),
        serde_json::json!({"model": "r"})
    );
    // Exact keys only: a generic `max_tokens` leaves an outer `max_output_tokens`, which
    // the Responses body still takes over it.
    let toml = "[model]\nmodel = \"m\"\n[model.openai-responses]\nmax_output_tokens = 100\n\
                [agents.x.model]\nmax_tokens = 50\n";
    assert_eq!(
        body(toml, "x", Format::OpenaiResponses),
        serde_json::json!({"model": "m", "max_output_tokens": 100})
    );
}

#[test]
fn a_provider_table_configured_anywhere_needs_its_required_keys_for_every_agent() {
    let err = Config::parse(
        "[model.anthropic]\nmodel = \"claude\"\n[agents.coder]\n",
        "t",
    )
    .unwrap_err();
    assert_eq!(err.code(), "config_invalid");
    assert!(
        err.to_string().contains("agent `default`")
            && err.to_string().contains("model setting `max_tokens`"),
        "{err}"
    );
    let err = Config::parse("[model]\nopenai = 3\n", "t").unwrap_err();
    assert!(
        err.to_string().contains("model.openai must be a table"),
        "{err}"
    );
    assert!(Config::parse(
        "[model]\nmax_tokens = 10\n[model.anthropic]\nmodel = \"c\"\n[agents.coder]\n",
        "t"
    )
    .is_ok());
}

#[test]
fn global_cannot_be_an_agent() {
    let err = Config::parse("[agents.global]\n", "t").unwrap_err();
    assert_eq!(err.code(), "invalid_agent");
}

#[test]
fn h6_connection_limits_have_defaults_and_zero_is_an_error() {
    let c = Config::parse("", "t").unwrap();
    assert_eq!(c.header_timeout(), std::time::Duration::from_secs(10));
    assert_eq!(c.idle_timeout(), std::time::Duration::from_secs(60));
    assert_eq!(c.max_connections(), 512);
    let c = Config::parse(
        "[limits]\nheader_timeout_ms = 250\nidle_timeout_ms = 500\nmax_connections = 8\n",
        "t",
    )
    .unwrap();
    assert_eq!(c.header_timeout(), std::time::Duration::from_millis(250));
    assert_eq!(c.idle_timeout(), std::time::Duration::from_millis(500));
    assert_eq!(c.max_connections(), 8);
    for key in [
        "header_timeout_ms",
        "idle_timeout_ms",
        "body_timeout_ms",
        "max_connections",
    ] {
        let err = Config::parse(&format!("[limits]\n{key} = 0\n"), "t").unwrap_err();
        assert_eq!(err.code(), "config_invalid");
        assert!(
            err.to_string()
                .contains(&format!("limits.{key} must be greater than 0")),
            "{err}"
        );
    }
}

#[test]
fn plugin_settings_are_read() {
    let c = Config::parse(
        "[plugins.persona]\nid = \"who\"\nscope = \"coder\"\noptional = true\nconfig = { name = \"Ada\" }\n",
        "t",
    )
    .unwrap();
    assert_eq!(c.plugin_id("persona"), "who");
    assert_eq!(c.plugin_id("other"), "other");
    let o = c.plugin_options("persona");
    assert_eq!(o.scope_override, Some(Scope::agent("coder")));
    assert!(o.optional);
    assert_eq!(c.plugin_values("persona"), [("name".into(), "Ada".into())]);
}

#[test]
fn mcp_servers_are_read_and_checked() {
    let c = Config::parse(
        "[mcp.time]\ncommand = \"mcp-server-time\"\nargs = [\"--local-timezone\", \"UTC\"]\nscope = \"coder\"\ntool_prefix = \"time_\"\n[mcp.web]\nurl = \"http://127.0.0.1:1/mcp\"\nheaders = { Authorization = \"Bearer x\" }\n",
        "t",
    )
    .unwrap();
    assert_eq!(c.mcp["time"].args, ["--local-timezone", "UTC"]);
    assert_eq!(c.mcp["time"].tool_prefix.as_deref(), Some("time_"));
    assert_eq!(c.mcp["web"].headers["Authorization"], "Bearer x");
    for (text, cause) in [
        ("[mcp.a]\nargs = []\n", "exactly one of `command`"),
        (
            "[mcp.a]\ncommand = \"x\"\nurl = \"http://h\"\n",
            "exactly one of `command`",
        ),
        (
            "[mcp.a]\ncommand = \"x\"\ntool_prefix = \"a.b\"\n",
            "tool_prefix",
        ),
        (
            "[mcp.a]\ncommand = \"x\"\ntimeout_ms = 0\n",
            "mcp.a.timeout_ms",
        ),
        (
            "[mcp.a]\ncommand = \"x\"\nheaders = { A = \"b\" }\n",
            "`headers` go with `url`",
        ),
    ] {
        let err = Config::parse(text, "t").unwrap_err();
        assert!(err.to_string().contains(cause), "{text}: {err}");
    }
    let err = Config::parse("[mcp.a]\ncommand = \"x\"\ncomand = 1\n", "t").unwrap_err();
    assert_eq!(err.code(), "config_parse");
}

#[test]
fn the_store_is_sqlite_unless_a_postgres_url_is_given_and_bad_values_name_the_key() {
    let no_env = |_: &str| None;
    let store = |text: &str| Config::parse(text, "t").map(|c| c.store);
    assert_eq!(store("").unwrap(), StoreConfig::Sqlite);
    assert_eq!(store("store = \"sqlite\"\n").unwrap(), StoreConfig::Sqlite);
    let url = "postgres://promptd@db:5432/promptd";
    for text in [
        format!("store = \"{url}\"\n"),
        format!("[store]\nurl = \"{url}\"\n"),
    ] {
        let s = store(&text).unwrap();
        assert_eq!(s.url(&no_env).unwrap().as_deref(), Some(url), "{text}");
    }
    let from_env = store("[store]\nurl_env = \"PROMPTD_DATABASE_URL\"\n").unwrap();
    let env = |name: &str| (name == "PROMPTD_DATABASE_URL").then(|| url.to_string());
    assert_eq!(from_env.url(&env).unwrap().as_deref(), Some(url));
    let err = from_env.url(&no_env).unwrap_err();
    assert!(
        err.to_string().contains("store.url_env")
            && err.to_string().contains("PROMPTD_DATABASE_URL"),
        "{err}"
    );
    for (text, key) in [
        ("store = \"mysql://u:secret@h/db\"\n", "store `mysql://…`"),
        ("store = 5\n", "store must be"),
        ("[store]\nurl = \"http://x\"\n", "store.url"),
        (
            "[store]\nurl = \"postgres://a\"\nurl_env = \"X\"\n",
            "exactly one of",
        ),
        ("[store]\n", "exactly one of"),
        ("[store]\nurl_env = 3\n", "store.url_env"),
        (
            "[store]\nuri = \"postgres://a\"\n",
            "store.uri: unknown key",
        ),
    ] {
        let err = store(text).unwrap_err();
        assert_eq!(err.code(), "config_invalid", "{text}");
        assert!(err.to_string().contains(key), "{text}: {err}");
        assert!(!err.to_string().contains("secret"), "{err}");
    }
}

#[test]
fn g4_deny_and_defer_tools_are_read_and_inherited_key_by_key() {
    let c = Config::parse(
        "[agents.coder.gateway]\ndeny_tools = [\"rm\"]\ndefer_tools = [\"search\", \"fetch\"]\n\
         [agents.reviewer]\nparent = \"coder\"\n[agents.reviewer.gateway]\ndeny_tools = [\"edit\"]\n\
         [agents.lean]\nparent = \"coder\"\n[agents.lean.gateway]\ndefer_tools = []\n",
        "t",
    )
    .unwrap();
    let splice = |agent: &str| c.gateway.agent(&c, agent).unwrap().unwrap().splice;
    assert_eq!(splice("coder").deny_tools, ["rm"]);
    assert_eq!(splice("coder").defer_tools, ["search", "fetch"]);
    let reviewer = splice("reviewer");
    assert_eq!(
        reviewer.deny_tools,
        ["edit"],
        "the nearer agent's list wins"
    );
    assert_eq!(
        reviewer.defer_tools,
        ["search", "fetch"],
        "inherited from its parent"
    );
    assert!(
        splice("lean").defer_tools.is_empty(),
        "an empty list clears it"
    );
    assert_eq!(splice("lean").deny_tools, ["rm"]);
    let e = Config::parse("[agents.a.gateway]\ndefer_tools = \"search\"\n", "t").unwrap_err();
    assert_eq!(e.code(), "config_parse");
}

#[test]
fn g13_tool_bounds_default_are_inherited_and_never_zero() {
    let c = Config::parse(
        "[agents.coder.gateway]\nmax_tool_rounds = 3\n\
         [agents.child]\nparent = \"coder\"\n[agents.child.gateway]\ntool_timeout_ms = 500\n\
         [agents.plain.gateway]\n",
        "t",
    )
    .unwrap();
    let bounds = |agent: &str| c.gateway.agent(&c, agent).unwrap().unwrap().tool_bounds;
    assert_eq!(bounds("plain").max_rounds, 8);
    assert_eq!(bounds("plain").timeout_ms, 30_000);
    assert_eq!(bounds("plain").max_output_bytes, 1 << 20);
    assert_eq!(bounds("child").max_rounds, 3, "inherited from its parent");
    assert_eq!(bounds("child").timeout_ms, 500);
    for key in [
        "max_tool_rounds",
        "tool_timeout_ms",
        "max_tool_output_bytes",
    ] {
        let e = Config::parse(&format!("[agents.a.gateway]\n{key} = 0\n"), "t").unwrap_err();
        assert!(
            e.to_string().contains(&format!("agents.a.gateway.{key}")),
            "{e}"
        );
    }
}

#[test]
fn g9_bedrock_credentials_go_together_and_only_on_a_bedrock_upstream() {
    let up = |provider: &str, keys: &str| {
        format!(
            "[gateway]\nenabled = true\n[gateway.upstream.aws]\nprovider = \"{provider}\"\n\
             base_url = \"http://127.0.0.1:1\"\n{keys}\n[agents.a.gateway]\n"
        )
    };
    let all = "aws_access_key_id_env = \"K\"\naws_secret_access_key_env = \"S\"\naws_region = \"us-east-1\"";
    let c = Config::parse(&up("bedrock", all), "t").unwrap();
    let a = c.gateway.agent(&c, "a").unwrap().unwrap();
    assert_eq!(a.upstreams[&crate::gateway::Provider::Bedrock], "aws");
    let e = Config::parse(&up("bedrock", "aws_access_key_id_env = \"K\""), "t").unwrap_err();
    assert_eq!(e.code(), "config_invalid");
    assert!(e.to_string().contains("aws_region"), "{e}");
    let e = Config::parse(&up("openai", all), "t").unwrap_err();
    assert!(e.to_string().contains("provider = \"bedrock\""), "{e}");
    let e = Config::parse(&up("bedrock", "aws_secret_access_key_env = \"\""), "t").unwrap_err();
    assert!(
        e.to_string().contains("not an environment variable name"),
        "{e}"
    );
}

#[test]
fn g12_gateway_keys_hold_digests_only_and_name_what_they_may_use() {
    let digest = crate::gateway::keys::token_sha256("t");
    let ok = format!(
        "[gateway.upstream.a]\nprovider = \"anthropic\"\nbase_url = \"http://x\"\n[agents.coder.gateway]\n\
         [gateway.keys.k]\ntoken_sha256 = \"{digest}\"\nagents = [\"coder\"]\nupstreams = [\"a\"]\n\
         requests_per_minute = 5\nusd_per_day = 2.5\nusd_per_month = 10\n"
    );
    let c = Config::parse(&ok, "t").unwrap();
    let key = &c.gateway.keys["k"];
    assert_eq!(key.usd_per_day.map(|u| u.micro()), Some(2_500_000));
    assert_eq!(key.usd_per_month.map(|u| u.micro()), Some(10_000_000));
    let refused = |from: &str, to: &str| {
        let text = ok.replace(from, to);
        Config::parse(&text, "t").unwrap_err().to_string()
    };
    let e = refused(&digest, "sk-the-token-itself");
    assert!(
        e.contains("gateway.keys.k.token_sha256") && e.contains("never the token"),
        "{e}"
    );
    let e = refused(&digest, &digest.to_uppercase());
    assert!(e.contains("lower-case hex"), "{e}");
    let e = refused("agents = [\"coder\"]", "agents = [\"nobody\"]");
    assert!(
        e.contains("gateway.keys.k.agents") && e.contains("nobody"),
        "{e}"
    );
    let e = refused("upstreams = [\"a\"]", "upstreams = [\"b\"]");
    assert!(
        e.contains("gateway.keys.k.upstreams") && e.contains("`b`"),
        "{e}"
    );
    let e = refused("usd_per_day = 2.5", "usd_per_day = -1");
    assert!(
        e.contains("usd_per_day") || e.contains("not an amount"),
        "{e}"
    );
    let e = refused("requests_per_minute = 5", "requests_per_minute = 0");
    assert!(e.contains("requests_per_minute"), "{e}");
    let e = refused("usd_per_month = 10", "usd_per_month = 10\ntoken = \"x\"");
    assert!(e.contains("token"), "{e}");
    let twice = format!("{ok}[gateway.keys.j]\ntoken_sha256 = [\"{digest}\"]\n");
    let e = Config::parse(&twice, "t").unwrap_err().to_string();
    assert!(e.contains("the same token"), "{e}");
}

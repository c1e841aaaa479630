/*
 * Write a promptd plugin in C.
 *
 * A plugin is a function from its config to a plugin builder: sections, contexts, variables and
 * tools. Static text is sent to the host once, at load; dynamic parts are callbacks the host
 * calls at each assembly with the step. You never touch the generated WIT bindings
 * (sdk/c/generated/, from wit/plugin.wit by wit-bindgen).
 *
 *     #include "promptd.h"
 *
 *     static void clock(const promptd_step *step, promptd_out *out, void *user) {
 *         const char *date = promptd_step_fact(step, "date");
 *         promptd_out_textf(out, "Today is %s.", date ? date : "unknown");
 *     }
 *
 *     static void declare(const promptd_config *config, promptd_plugin *p) {
 *         promptd_section(p, "deployment:persona", 0, "You are {{name}}.");
 *         promptd_variable(p, "name", promptd_config_get_or(config, "name", "an assistant"));
 *         promptd_dynamic_context(p, "clock", 50, clock, NULL);
 *     }
 *
 *     PROMPTD_EXPORT_PLUGIN(declare)
 *
 * Build with `sdk/c/build.sh PLUGIN_DIR OUT.wasm`. The plugin's id is OUT's file name without
 * `.wasm`.
 *
 * Memory: every string you pass in is copied; every string the SDK hands you (config, step) is
 * NUL-terminated and valid only during the call. Strings containing NUL bytes are cut at the
 * first NUL. The plugin is single-threaded; no function here is thread-safe.
 */
#ifndef PROMPTD_H
#define PROMPTD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define PROMPTD_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define PROMPTD_PRINTF(fmt, args)
#endif

/* A key and its value (config entries, step facts). */
typedef struct promptd_pair {
    const char *key;
    const char *value;
} promptd_pair;

/* Plugin config: the key/value strings of the plugin's `[plugins.NAME] config` table. */
typedef struct promptd_config {
    const promptd_pair *entries; /* sorted by key */
    size_t len;
} promptd_config;

/* The value of `key`, or NULL when the config does not set it. */
const char *promptd_config_get(const promptd_config *config, const char *key);
/* The value of `key`, or `fallback` when the config does not set it. */
const char *promptd_config_get_or(const promptd_config *config, const char *key,
                                  const char *fallback);

/* What the host knows about the step being assembled. */
typedef struct promptd_step {
    const char *agent;               /* the agent the request is for */
    const char *const *scope_chain;  /* `global`, the agent's ancestors, the agent */
    size_t scope_chain_len;
    const char *session_id;          /* empty outside a session */
    uint64_t step_number;            /* from 1 in a session; 0 outside one */
    const promptd_pair *facts;       /* step facts from the client, sorted by key */
    size_t facts_len;
} promptd_step;

/* One step fact, or NULL if the client did not send it. */
const char *promptd_step_fact(const promptd_step *step, const char *key);

/*
 * Where a dynamic callback puts its answer. A text callback that sets nothing answers "" (for a
 * context: nothing this step); a variable callback that sets nothing answers "no value this
 * assembly"; a show-tools callback answers the names it added. An error fails the assembly with
 * its message (or leaves the plugin out, if the host config marks it optional).
 */
typedef struct promptd_out promptd_out;

/* The text (or variable value). Replaces an earlier one. */
void promptd_out_text(promptd_out *out, const char *text);
/* The text, printf-style. */
void promptd_out_textf(promptd_out *out, const char *format, ...) PROMPTD_PRINTF(2, 3);
/* Fails this call with a message, printf-style. */
void promptd_out_error(promptd_out *out, const char *format, ...) PROMPTD_PRINTF(2, 3);
/* Show-tools callbacks: adds one tool name to the shown tools. */
void promptd_out_tool(promptd_out *out, const char *name);

/* A dynamic section/context text or variable value; `user` is the pointer given at declaration. */
typedef void (*promptd_text_fn)(const promptd_step *step, promptd_out *out, void *user);
/* Chooses the shown tools: add each with promptd_out_tool. */
typedef void (*promptd_tools_fn)(const promptd_step *step, promptd_out *out, void *user);

/* Everything a plugin contributes; filled in by your declare function. */
typedef struct promptd_plugin promptd_plugin;

/* A static section of the system prompt. `{{name}}` references are interpolated by the host.
 * Conventional orders: identity -100, persona 0, tool guidance 100..199. */
void promptd_section(promptd_plugin *p, const char *name, int32_t order, const char *text);
/* A section whose text `fn` computes at each assembly. */
void promptd_dynamic_section(promptd_plugin *p, const char *name, int32_t order,
                             promptd_text_fn fn, void *user);
/* A static part of the runtime context snapshot (sent as a user message, not system). */
void promptd_context(promptd_plugin *p, const char *name, int32_t order, const char *text);
/* A runtime context part computed at each assembly; "" contributes nothing. */
void promptd_dynamic_context(promptd_plugin *p, const char *name, int32_t order,
                             promptd_text_fn fn, void *user);
/* A variable for `{{name}}`; names match `^[a-z][a-z0-9_]*$`. */
void promptd_variable(promptd_plugin *p, const char *name, const char *value);
/* A variable computed when referenced; setting no value means "no value this assembly". */
void promptd_dynamic_variable(promptd_plugin *p, const char *name, promptd_text_fn fn, void *user);
/* A tool the plugin knows. `parameters_json` is a JSON Schema object as JSON text. */
void promptd_tool(promptd_plugin *p, const char *name, const char *description,
                  const char *parameters_json);
/* Chooses, per assembly, which known tools are shown. Without it, all are. */
void promptd_show_tools(promptd_plugin *p, promptd_tools_fn fn, void *user);
/* Makes the item added last visible only to `agent` (and the agents below it). */
void promptd_scope(promptd_plugin *p, const char *agent);
/* Marks the section added last as complete: it replaces every other section. */
void promptd_complete(promptd_plugin *p);
/* Refuses the plugin with a message, printf-style (e.g. a bad config value). */
void promptd_fail(promptd_plugin *p, const char *format, ...) PROMPTD_PRINTF(2, 3);

typedef enum promptd_level {
    PROMPTD_TRACE = 0,
    PROMPTD_DEBUG = 1,
    PROMPTD_INFO = 2,
    PROMPTD_WARN = 3,
    PROMPTD_ERROR = 4,
} promptd_level;

/* Writes a line to the host's log, tagged with this plugin's id, printf-style. */
void promptd_log(promptd_level level, const char *format, ...) PROMPTD_PRINTF(2, 3);

/* Your declare function: fill `p` from `config`. Called once, at load. */
typedef void (*promptd_declare_fn)(const promptd_config *config, promptd_plugin *p);

/* Exports `declare_fn` as this component's plugin. Use once, at file scope. */
#define PROMPTD_EXPORT_PLUGIN(declare_fn)                                              \
    void promptd__declare(const promptd_config *promptd__config, promptd_plugin *promptd__p) { \
        declare_fn(promptd__config, promptd__p);                                       \
    }

/* Defined by PROMPTD_EXPORT_PLUGIN. */
void promptd__declare(const promptd_config *config, promptd_plugin *p);

#ifdef __cplusplus
}
#endif

#endif /* PROMPTD_H */

/*
 * Write a promptd plugin in C.
 *
 * A plugin is a function from its config to a plugin builder: sections, contexts, variables and
 * tools. Static text is sent to the host once, at load; dynamic parts are callbacks the host
 * calls at each assembly with the step (all those it needs in one call of the world's
 * `evaluate`, which the SDK dispatches to your callbacks). An optional review hook sees each
 * session step's new messages and accepts, rejects or redacts them. You never touch the
 * generated WIT bindings (sdk/c/generated/, from wit/plugin.wit, world promptd:plugin@0.3.0,
 * by wit-bindgen).
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

/*
 * What the host knows about the step being assembled, as far as the call reads it: a plugin
 * that declares what its dynamic items read (promptd_reads, promptd_default_reads) is shown
 * only the facts and inputs that the items wanted in this call read. A plugin that declares
 * nothing is shown every fact and input, as before 0.3.0; so is a review hook.
 */
typedef struct promptd_step {
    const char *agent;               /* the agent the request is for */
    const char *const *scope_chain;  /* `global`, the agent's ancestors, the agent */
    size_t scope_chain_len;
    const char *session_id;          /* empty outside a session */
    uint64_t step_number;            /* from 1 in a session; 0 outside one, and 0 when not read
                                        (PROMPTD_INPUT_STEP_NUMBER) */
    const promptd_pair *facts;       /* the step facts read, from the client, sorted by key */
    size_t facts_len;
    /* The inputs below are given only when read (PROMPTD_INPUT_*). */
    const char *last_user_message;   /* the session's last user message's text; NULL when not
                                        read or there is none */
    const char *model;               /* the model the request is for; NULL when not read or
                                        unknown */
    bool client_tools_given;         /* true when read: client_tools holds the names of the tools
                                        the client sent, in its order (none when it sent none) */
    const char *const *client_tools;
    size_t client_tools_len;
    bool turn_count_given;           /* true when read: turn_count is set */
    uint64_t turn_count;             /* the session's user messages so far, this step's included;
                                        0 when not given */
} promptd_step;

/* One step fact, or NULL if the client did not send it (or no wanted item reads it). */
const char *promptd_step_fact(const promptd_step *step, const char *key);
/* True when the client sent a tool named `name` (false when client tools are not given). */
bool promptd_step_client_tool(const promptd_step *step, const char *name);

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
/* Fails this contribution (only it, this step) with a message, printf-style. */
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
/* Marks the section or context added last (static or dynamic) as verbatim: the host uses its
 * text exactly as given and never interpolates `{{...}}` in it, so it can never pull a variable
 * (a secret) into the prompt. For text the plugin did not write itself (documents, tool output,
 * facts from the client). */
void promptd_verbatim(promptd_plugin *p);
/* Refuses the plugin with a message, printf-style (e.g. a bad config value). */
void promptd_fail(promptd_plugin *p, const char *format, ...) PROMPTD_PRINTF(2, 3);

/*
 * Reads: what a dynamic item reads of a step. The step a call is shown holds only what the
 * items wanted in that call read, and in a session an item is asked again only when something
 * it reads changed (unless it is volatile): the host keeps its last answer otherwise. Without
 * any reads declared, every dynamic item reads the whole step and is asked at every step.
 *
 *     static const char *const TASK[] = {"task"};
 *     promptd_dynamic_section(p, "ops:task", 20, task, NULL);
 *     promptd_reads(p, TASK, 1, 0, false);                      // fact `task` only
 *     promptd_dynamic_context(p, "ops:turn", 40, turn, NULL);
 *     promptd_reads(p, NULL, 0, PROMPTD_INPUT_TURN_COUNT, false); // no facts, the turn count
 */

/* The request inputs a step may show besides its facts: OR them together. */
#define PROMPTD_INPUT_LAST_USER_MESSAGE (1u << 0) /* step->last_user_message */
#define PROMPTD_INPUT_MODEL (1u << 1)             /* step->model */
#define PROMPTD_INPUT_CLIENT_TOOLS (1u << 2)      /* step->client_tools */
#define PROMPTD_INPUT_STEP_NUMBER (1u << 3)       /* step->step_number */
#define PROMPTD_INPUT_TURN_COUNT (1u << 4)        /* step->turn_count */

/* Declares what the dynamic section, context or variable added last reads: the facts named in
 * `facts` (`facts_len` names, copied; NULL when 0), the PROMPTD_INPUT_* flags in `inputs`, and
 * whether it is volatile (asked at every step even when nothing it reads changed: its answer
 * depends on something else too, the clock, a file). A later call replaces it. Without it the
 * item reads what promptd_default_reads says. */
void promptd_reads(promptd_plugin *p, const char *const *facts, size_t facts_len,
                   unsigned inputs, bool is_volatile);
/* What every dynamic item without its own promptd_reads reads, and what the show-tools callback
 * reads (same arguments; a later call replaces it). Without it: the whole step, at every step. */
void promptd_default_reads(promptd_plugin *p, const char *const *facts, size_t facts_len,
                           unsigned inputs, bool is_volatile);

/* When a change to a section's or tool's text may reach the model (the operator's
 * `[plugins.ID] refresh` overrides it). */
typedef enum promptd_refresh_when {
    PROMPTD_REFRESH_STEP = 0,     /* at the session's next step (the default) */
    PROMPTD_REFRESH_BOUNDARY = 1, /* at the session's next cache-cold point, or after
                                     `max_stale_s`: catalogues, references, descriptions */
    PROMPTD_REFRESH_SESSION = 2,  /* never within a session: a new session gets the new text */
} promptd_refresh_when;

/* Sets when a change to the section (static or dynamic) or tool added last reaches the model.
 * Without it: PROMPTD_REFRESH_STEP, unless the operator's config says otherwise. */
void promptd_refresh(promptd_plugin *p, promptd_refresh_when when);
/* Marks the tool added last as deferred: sent for the provider's tool search to find, not in
 * every request's cached prefix. */
void promptd_defer(promptd_plugin *p);

/*
 * Review: a hook the host calls once per session step, after assembly, with the step's new
 * messages and what assembly made of the step. It may accept the step, reject it (the step
 * fails, HTTP 422 naming the plugin and the reason, and nothing is recorded) or redact it
 * (replacements made in the texts of its new `user` and `tool` messages before they are
 * recorded and sent; the model's own replies are not changed). Never called by
 * `promptd assemble`, which has no session.
 *
 *     static void review(const promptd_step *step, const promptd_review_input *input,
 *                        promptd_verdict *verdict, void *user) {
 *         if (promptd_review_mentions(input, "forbidden"))
 *             promptd_reject(verdict, "the step mentions \"forbidden\"");
 *         else if (promptd_review_mentions(input, "hunter2"))
 *             promptd_redact(verdict, "hunter2", "[redacted]");
 *     }   // setting nothing accepts
 *     ...
 *     promptd_review(p, 0, review, NULL);   // in declare
 */

/* One message the client sent this step. */
typedef struct promptd_message {
    const char *role;            /* `user`, `assistant` or `tool` */
    const char *const *texts;    /* its texts in order: one per text content or text block (images
                                    and documents give none); an assistant's reply gives its text */
    size_t texts_len;
    const char *tool_call_id;    /* the call a `tool` message answers; "" for the other roles */
} promptd_message;

/* What a review is shown. */
typedef struct promptd_review_input {
    const promptd_message *messages; /* the step's new messages, in order */
    size_t messages_len;
    const char *system;              /* the assembled system prompt */
    const char *runtime_context;     /* the assembled runtime context snapshot; NULL when none */
    const char *const *tools;        /* the names of the tools shown this step, in order */
    size_t tools_len;
} promptd_review_input;

/* True when some text of some message contains `needle` (a byte substring). */
bool promptd_review_mentions(const promptd_review_input *input, const char *needle);

/*
 * Where a review callback puts its verdict. Setting nothing accepts the step. The verdict is
 * the kind of the last call: promptd_accept and promptd_reject drop earlier redactions; each
 * promptd_redact adds one replacement (made in call order) and makes the verdict a redaction.
 * promptd_verdict_error fails the review call instead (the step fails naming the plugin and
 * the message), whatever else was set.
 */
typedef struct promptd_verdict promptd_verdict;

/* The step goes on unchanged. */
void promptd_accept(promptd_verdict *verdict);
/* The step fails with this reason, printf-style. */
void promptd_reject(promptd_verdict *verdict, const char *format, ...) PROMPTD_PRINTF(2, 3);
/* Replace every occurrence of `find` (non-empty) by `replace` in the step's new user and tool
 * message texts. Call it once per replacement. */
void promptd_redact(promptd_verdict *verdict, const char *find, const char *replace);
/* Fails the review call with a message, printf-style. */
void promptd_verdict_error(promptd_verdict *verdict, const char *format, ...) PROMPTD_PRINTF(2, 3);

/* A review hook; `user` is the pointer given to promptd_review. */
typedef void (*promptd_review_fn)(const promptd_step *step, const promptd_review_input *input,
                                  promptd_verdict *verdict, void *user);
/* Registers the plugin's review hook (a later call replaces it). Hooks of all plugins run one
 * after another, sorted by (order, plugin id). Without it the host never calls a review. */
void promptd_review(promptd_plugin *p, int32_t order, promptd_review_fn fn, void *user);

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

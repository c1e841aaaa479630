/*
 * The promptd C SDK: the builder (promptd.h) and its glue to the bindings wit-bindgen generates
 * from wit/plugin.wit (world promptd:plugin@0.3.0; generated/plugin.h). Only this file knows
 * the generated types.
 *
 * The world's `evaluate` export gets the step once and the lists of wanted dynamic items; it
 * answers item by item by calling the callback registered for (kind, name, scope), exactly as
 * one call per item would, with the same error texts. `review` calls the review hook, or
 * accepts when none is registered.
 *
 * Ownership rules of the generated bindings (wit-bindgen C 0.61): arguments of an exported
 * function belong to the callee (freed here), and everything an export returns must be
 * malloc'd, because the generated `cabi_post_*` functions free it after the host has read it
 * (a string or list only when its length is not zero).
 */
#include "promptd.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin.h"

/* ---- small helpers ---- */

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) abort(); /* traps the instance; the host reports it */
    return p;
}

static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) abort();
    return p;
}

/* Room for a list returned to the host: NULL when empty, since the generated post-return
 * functions free a list (or string) only when its length is not zero. */
static void *list_alloc(size_t n, size_t size) {
    return n ? xmalloc(n * size) : NULL;
}

static char *xstrdup(const char *s) {
    if (!s) s = "";
    size_t n = strlen(s);
    char *d = xmalloc(n + 1);
    memcpy(d, s, n + 1);
    return d;
}

static char *vformat(const char *format, va_list args) {
    va_list copy;
    va_copy(copy, args);
    int n = vsnprintf(NULL, 0, format, copy);
    va_end(copy);
    if (n < 0) return xstrdup("(bad format string)");
    char *buf = xmalloc((size_t)n + 1);
    vsnprintf(buf, (size_t)n + 1, format, args);
    return buf;
}

/* A NUL-terminated copy of a WIT string (cut at an embedded NUL). */
static char *cstr(const plugin_string_t *s) {
    char *d = xmalloc(s->len + 1);
    memcpy(d, s->ptr, s->len);
    d[s->len] = 0;
    return d;
}

/* A malloc'd WIT string holding a copy of `s` (the post-return functions free it). */
static plugin_string_t wit_str(const char *s) {
    plugin_string_t out;
    plugin_string_dup(&out, s ? s : "");
    return out;
}

/* ---- config and step ---- */

static const char *find_pair(const promptd_pair *pairs, size_t len, const char *key) {
    for (size_t i = 0; i < len; i++)
        if (strcmp(pairs[i].key, key) == 0) return pairs[i].value;
    return NULL;
}

const char *promptd_config_get(const promptd_config *config, const char *key) {
    return config ? find_pair(config->entries, config->len, key) : NULL;
}

const char *promptd_config_get_or(const promptd_config *config, const char *key,
                                  const char *fallback) {
    const char *v = promptd_config_get(config, key);
    return v ? v : fallback;
}

const char *promptd_step_fact(const promptd_step *step, const char *key) {
    return step ? find_pair(step->facts, step->facts_len, key) : NULL;
}

static promptd_pair *pairs_from_wit(const plugin_list_tuple2_string_string_t *list) {
    promptd_pair *pairs = xmalloc(list->len * sizeof *pairs);
    for (size_t i = 0; i < list->len; i++) {
        pairs[i].key = cstr(&list->ptr[i].f0);
        pairs[i].value = cstr(&list->ptr[i].f1);
    }
    return pairs;
}

static void pairs_free(promptd_pair *pairs, size_t len) {
    for (size_t i = 0; i < len; i++) {
        free((char *)pairs[i].key);
        free((char *)pairs[i].value);
    }
    free(pairs);
}

static const char **strings_from_wit(const plugin_list_string_t *list) {
    const char **out = xmalloc(list->len * sizeof *out);
    for (size_t i = 0; i < list->len; i++) out[i] = cstr(&list->ptr[i]);
    return out;
}

static void strings_free(const char *const *strings, size_t len) {
    for (size_t i = 0; i < len; i++) free((char *)strings[i]);
    free((void *)strings);
}

bool promptd_step_client_tool(const promptd_step *step, const char *name) {
    if (!step || !name || !step->client_tools_given) return false;
    for (size_t i = 0; i < step->client_tools_len; i++)
        if (strcmp(step->client_tools[i], name) == 0) return true;
    return false;
}

static void step_from_wit(const plugin_step_t *w, promptd_step *s) {
    s->agent = cstr(&w->agent);
    const char **chain = xmalloc(w->scope_chain.len * sizeof *chain);
    for (size_t i = 0; i < w->scope_chain.len; i++) chain[i] = cstr(&w->scope_chain.ptr[i]);
    s->scope_chain = chain;
    s->scope_chain_len = w->scope_chain.len;
    s->session_id = cstr(&w->session_id);
    s->step_number = w->step_number;
    s->facts = pairs_from_wit(&w->facts);
    s->facts_len = w->facts.len;
    s->last_user_message = w->last_user_message.is_some ? cstr(&w->last_user_message.val) : NULL;
    s->model = w->model.is_some ? cstr(&w->model.val) : NULL;
    s->client_tools_given = w->client_tools.is_some;
    s->client_tools = w->client_tools.is_some ? strings_from_wit(&w->client_tools.val) : NULL;
    s->client_tools_len = w->client_tools.is_some ? w->client_tools.val.len : 0;
    s->turn_count_given = w->turn_count.is_some;
    s->turn_count = w->turn_count.is_some ? w->turn_count.val : 0;
}

static void step_free(promptd_step *s) {
    free((char *)s->agent);
    for (size_t i = 0; i < s->scope_chain_len; i++) free((char *)s->scope_chain[i]);
    free((void *)s->scope_chain);
    free((char *)s->session_id);
    pairs_free((promptd_pair *)s->facts, s->facts_len);
    free((char *)s->last_user_message);
    free((char *)s->model);
    if (s->client_tools) strings_free(s->client_tools, s->client_tools_len);
}

/* ---- the builder ---- */

typedef enum { K_SECTION, K_CONTEXT, K_VARIABLE, K_TOOL } kind_t;

/* What a dynamic item (or, as the declaration's default, the plugin) reads. */
typedef struct reads {
    char **facts;
    size_t facts_len;
    uint8_t inputs; /* PROMPTD_INPUT_* */
    bool is_volatile;
} reads;

#define KNOWN_INPUTS                                                                     \
    (PROMPTD_INPUT_LAST_USER_MESSAGE | PROMPTD_INPUT_MODEL | PROMPTD_INPUT_CLIENT_TOOLS | \
     PROMPTD_INPUT_STEP_NUMBER | PROMPTD_INPUT_TURN_COUNT)

typedef struct item {
    kind_t kind;
    char *name;
    int32_t order;
    char *text; /* static text or value; NULL when dynamic */
    promptd_text_fn fn;
    void *user;
    char *description; /* tools */
    char *parameters;  /* tools */
    bool complete;
    bool verbatim;     /* sections and contexts */
    char *scope_agent; /* NULL: global */
    bool has_reads;    /* dynamic sections, contexts and variables */
    reads reads;
    bool has_refresh;  /* sections and tools */
    promptd_refresh_when refresh;
    bool defer;        /* tools */
} item;

struct promptd_plugin {
    item *items; /* in declaration order, all kinds */
    size_t len, cap;
    long last; /* index of the item added last, -1 before any */
    promptd_tools_fn tools_fn;
    void *tools_user;
    promptd_review_fn review_fn; /* NULL: no review hook */
    void *review_user;
    int32_t review_order;
    bool has_default_reads; /* the declaration's `reads` */
    reads default_reads;
    char *misuse; /* the first misuse or promptd_fail message */
};

/* The plugin built by the last declare; dynamic calls look their callbacks up here. */
static promptd_plugin *current;

static void misuse(promptd_plugin *p, const char *message) {
    if (!p->misuse) p->misuse = xstrdup(message);
}

static void misusef(promptd_plugin *p, const char *format, ...) PROMPTD_PRINTF(2, 3);
static void misusef(promptd_plugin *p, const char *format, ...) {
    va_list args;
    va_start(args, format);
    char *message = vformat(format, args);
    va_end(args);
    misuse(p, message);
    free(message);
}

static void reads_free(reads *r) {
    for (size_t i = 0; i < r->facts_len; i++) free(r->facts[i]);
    free(r->facts);
    memset(r, 0, sizeof *r);
}

/* Replaces *r by a copy of the arguments of promptd_reads or promptd_default_reads (`fn`);
 * false (and *r untouched) on misuse. */
static bool reads_set(promptd_plugin *p, const char *fn, reads *r, const char *const *facts,
                      size_t facts_len, unsigned inputs, bool is_volatile) {
    if (facts_len && !facts) {
        misusef(p, "%s: facts is NULL but facts_len is %zu", fn, facts_len);
        return false;
    }
    for (size_t i = 0; i < facts_len; i++) {
        if (!facts[i]) {
            misusef(p, "%s: fact %zu is NULL", fn, i);
            return false;
        }
    }
    if (inputs & ~(unsigned)KNOWN_INPUTS) {
        misusef(p, "%s: unknown input flags 0x%x", fn, inputs & ~(unsigned)KNOWN_INPUTS);
        return false;
    }
    reads_free(r);
    r->facts = facts_len ? xmalloc(facts_len * sizeof *r->facts) : NULL;
    for (size_t i = 0; i < facts_len; i++) r->facts[i] = xstrdup(facts[i]);
    r->facts_len = facts_len;
    r->inputs = (uint8_t)inputs;
    r->is_volatile = is_volatile;
    return true;
}

static item *push(promptd_plugin *p, kind_t kind, const char *name) {
    if (p->len == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 8;
        p->items = xrealloc(p->items, p->cap * sizeof *p->items);
    }
    item *it = &p->items[p->len];
    memset(it, 0, sizeof *it);
    it->kind = kind;
    it->name = xstrdup(name);
    p->last = (long)p->len++;
    return it;
}

void promptd_section(promptd_plugin *p, const char *name, int32_t order, const char *text) {
    item *it = push(p, K_SECTION, name);
    it->order = order;
    it->text = xstrdup(text);
}

void promptd_dynamic_section(promptd_plugin *p, const char *name, int32_t order,
                             promptd_text_fn fn, void *user) {
    if (!fn) misuse(p, "promptd_dynamic_section: no callback");
    item *it = push(p, K_SECTION, name);
    it->order = order;
    it->fn = fn;
    it->user = user;
}

void promptd_context(promptd_plugin *p, const char *name, int32_t order, const char *text) {
    item *it = push(p, K_CONTEXT, name);
    it->order = order;
    it->text = xstrdup(text);
}

void promptd_dynamic_context(promptd_plugin *p, const char *name, int32_t order,
                             promptd_text_fn fn, void *user) {
    if (!fn) misuse(p, "promptd_dynamic_context: no callback");
    item *it = push(p, K_CONTEXT, name);
    it->order = order;
    it->fn = fn;
    it->user = user;
}

void promptd_variable(promptd_plugin *p, const char *name, const char *value) {
    push(p, K_VARIABLE, name)->text = xstrdup(value);
}

void promptd_dynamic_variable(promptd_plugin *p, const char *name, promptd_text_fn fn,
                              void *user) {
    if (!fn) misuse(p, "promptd_dynamic_variable: no callback");
    item *it = push(p, K_VARIABLE, name);
    it->fn = fn;
    it->user = user;
}

void promptd_tool(promptd_plugin *p, const char *name, const char *description,
                  const char *parameters_json) {
    item *it = push(p, K_TOOL, name);
    it->description = xstrdup(description);
    it->parameters = xstrdup(parameters_json);
}

void promptd_show_tools(promptd_plugin *p, promptd_tools_fn fn, void *user) {
    if (!fn) misuse(p, "promptd_show_tools: no callback");
    p->tools_fn = fn;
    p->tools_user = user;
}

void promptd_scope(promptd_plugin *p, const char *agent) {
    if (p->last < 0) {
        misuse(p, "promptd_scope called before any item was added");
        return;
    }
    item *it = &p->items[p->last];
    free(it->scope_agent);
    it->scope_agent = xstrdup(agent);
}

void promptd_complete(promptd_plugin *p) {
    if (p->last < 0 || p->items[p->last].kind != K_SECTION) {
        misuse(p, "promptd_complete applies to a section only");
        return;
    }
    p->items[p->last].complete = true;
}

void promptd_verbatim(promptd_plugin *p) {
    if (p->last < 0 ||
        (p->items[p->last].kind != K_SECTION && p->items[p->last].kind != K_CONTEXT)) {
        misuse(p, "promptd_verbatim applies to a section or context only");
        return;
    }
    p->items[p->last].verbatim = true;
}

void promptd_reads(promptd_plugin *p, const char *const *facts, size_t facts_len,
                   unsigned inputs, bool is_volatile) {
    if (p->last < 0 || p->items[p->last].kind == K_TOOL || !p->items[p->last].fn) {
        misuse(p, "promptd_reads applies to a dynamic section, context or variable only");
        return;
    }
    item *it = &p->items[p->last];
    if (reads_set(p, "promptd_reads", &it->reads, facts, facts_len, inputs, is_volatile))
        it->has_reads = true;
}

void promptd_default_reads(promptd_plugin *p, const char *const *facts, size_t facts_len,
                           unsigned inputs, bool is_volatile) {
    if (reads_set(p, "promptd_default_reads", &p->default_reads, facts, facts_len, inputs,
                  is_volatile))
        p->has_default_reads = true;
}

void promptd_refresh(promptd_plugin *p, promptd_refresh_when when) {
    if (p->last < 0 ||
        (p->items[p->last].kind != K_SECTION && p->items[p->last].kind != K_TOOL)) {
        misuse(p, "promptd_refresh applies to a section or tool only");
        return;
    }
    if (when != PROMPTD_REFRESH_STEP && when != PROMPTD_REFRESH_BOUNDARY &&
        when != PROMPTD_REFRESH_SESSION) {
        misusef(p, "promptd_refresh: unknown refresh value %d", (int)when);
        return;
    }
    p->items[p->last].has_refresh = true;
    p->items[p->last].refresh = when;
}

void promptd_defer(promptd_plugin *p) {
    if (p->last < 0 || p->items[p->last].kind != K_TOOL) {
        misuse(p, "promptd_defer applies to a tool only");
        return;
    }
    p->items[p->last].defer = true;
}

void promptd_review(promptd_plugin *p, int32_t order, promptd_review_fn fn, void *user) {
    if (!fn) misuse(p, "promptd_review: no callback");
    p->review_fn = fn;
    p->review_user = user;
    p->review_order = order;
}

void promptd_fail(promptd_plugin *p, const char *format, ...) {
    va_list args;
    va_start(args, format);
    char *message = vformat(format, args);
    va_end(args);
    misuse(p, message);
    free(message);
}

static void plugin_free(promptd_plugin *p) {
    if (!p) return;
    for (size_t i = 0; i < p->len; i++) {
        item *it = &p->items[i];
        free(it->name);
        free(it->text);
        free(it->description);
        free(it->parameters);
        free(it->scope_agent);
        reads_free(&it->reads);
    }
    free(p->items);
    reads_free(&p->default_reads);
    free(p->misuse);
    free(p);
}

void promptd_log(promptd_level level, const char *format, ...) {
    va_list args;
    va_start(args, format);
    char *message = vformat(format, args);
    va_end(args);
    plugin_string_t s;
    plugin_string_set(&s, message); /* an import borrows its arguments */
    promptd_plugin_host_log((promptd_plugin_host_level_t)level, &s);
    free(message);
}

/* ---- dynamic answers ---- */

struct promptd_out {
    char *text; /* NULL: nothing set */
    char *error;
    char **tools;
    size_t tools_len, tools_cap;
};

void promptd_out_text(promptd_out *out, const char *text) {
    free(out->text);
    out->text = xstrdup(text);
}

void promptd_out_textf(promptd_out *out, const char *format, ...) {
    va_list args;
    va_start(args, format);
    free(out->text);
    out->text = vformat(format, args);
    va_end(args);
}

void promptd_out_error(promptd_out *out, const char *format, ...) {
    va_list args;
    va_start(args, format);
    free(out->error);
    out->error = vformat(format, args);
    va_end(args);
}

void promptd_out_tool(promptd_out *out, const char *name) {
    if (out->tools_len == out->tools_cap) {
        out->tools_cap = out->tools_cap ? 2 * out->tools_cap : 8;
        out->tools = xrealloc(out->tools, out->tools_cap * sizeof *out->tools);
    }
    out->tools[out->tools_len++] = xstrdup(name);
}

static void out_free(promptd_out *out) {
    free(out->text);
    free(out->error);
    for (size_t i = 0; i < out->tools_len; i++) free(out->tools[i]);
    free(out->tools);
}

/* ---- the world exports ---- */

static promptd_plugin_types_scope_t scope_to_wit(const char *agent) {
    promptd_plugin_types_scope_t s;
    memset(&s, 0, sizeof s);
    if (agent) {
        s.tag = PROMPTD_PLUGIN_TYPES_SCOPE_AGENT;
        s.val.agent = wit_str(agent);
    } else {
        s.tag = PROMPTD_PLUGIN_TYPES_SCOPE_GLOBAL;
    }
    return s;
}

static promptd_plugin_types_content_t content_to_wit(const item *it) {
    promptd_plugin_types_content_t c;
    memset(&c, 0, sizeof c);
    if (it->fn) {
        c.tag = PROMPTD_PLUGIN_TYPES_CONTENT_DYNAMIC;
    } else {
        c.tag = PROMPTD_PLUGIN_TYPES_CONTENT_STATIC_TEXT;
        c.val.static_text = wit_str(it->text);
    }
    return c;
}

/* Some reads (malloc'd, as the post-return functions free it) when `has`, else none. */
static promptd_plugin_types_option_reads_t reads_to_wit(bool has, const reads *r) {
    promptd_plugin_types_option_reads_t o;
    memset(&o, 0, sizeof o);
    if (!has) return o;
    o.is_some = true;
    o.val.facts.len = r->facts_len;
    o.val.facts.ptr = list_alloc(r->facts_len, sizeof *o.val.facts.ptr);
    for (size_t i = 0; i < r->facts_len; i++) o.val.facts.ptr[i] = wit_str(r->facts[i]);
    o.val.inputs = 0;
    if (r->inputs & PROMPTD_INPUT_LAST_USER_MESSAGE)
        o.val.inputs |= PROMPTD_PLUGIN_TYPES_INPUTS_LAST_USER_MESSAGE;
    if (r->inputs & PROMPTD_INPUT_MODEL) o.val.inputs |= PROMPTD_PLUGIN_TYPES_INPUTS_MODEL;
    if (r->inputs & PROMPTD_INPUT_CLIENT_TOOLS)
        o.val.inputs |= PROMPTD_PLUGIN_TYPES_INPUTS_CLIENT_TOOLS;
    if (r->inputs & PROMPTD_INPUT_STEP_NUMBER)
        o.val.inputs |= PROMPTD_PLUGIN_TYPES_INPUTS_STEP_NUMBER;
    if (r->inputs & PROMPTD_INPUT_TURN_COUNT)
        o.val.inputs |= PROMPTD_PLUGIN_TYPES_INPUTS_TURN_COUNT;
    o.val.volatile_ = r->is_volatile;
    return o;
}

static promptd_plugin_types_option_refresh_t refresh_to_wit(const item *it) {
    promptd_plugin_types_option_refresh_t o;
    memset(&o, 0, sizeof o);
    if (!it->has_refresh) return o;
    o.is_some = true;
    switch (it->refresh) {
    case PROMPTD_REFRESH_BOUNDARY: o.val = PROMPTD_PLUGIN_TYPES_REFRESH_BOUNDARY; break;
    case PROMPTD_REFRESH_SESSION: o.val = PROMPTD_PLUGIN_TYPES_REFRESH_SESSION; break;
    default: o.val = PROMPTD_PLUGIN_TYPES_REFRESH_STEP; break;
    }
    return o;
}

static size_t count(const promptd_plugin *p, kind_t kind) {
    size_t n = 0;
    for (size_t i = 0; i < p->len; i++) n += p->items[i].kind == kind;
    return n;
}

bool exports_plugin_declare(plugin_list_tuple2_string_string_t *config, plugin_declaration_t *ret,
                            plugin_string_t *err) {
    promptd_config cfg = {pairs_from_wit(config), config->len};
    plugin_list_tuple2_string_string_free(config);

    promptd_plugin *p = xmalloc(sizeof *p);
    memset(p, 0, sizeof *p);
    p->last = -1;
    promptd__declare(&cfg, p);
    pairs_free((promptd_pair *)cfg.entries, cfg.len);
    if (p->misuse) {
        *err = wit_str(p->misuse);
        plugin_free(p);
        return false;
    }

    memset(ret, 0, sizeof *ret);
    ret->sections.ptr = list_alloc(count(p, K_SECTION), sizeof *ret->sections.ptr);
    ret->contexts.ptr = list_alloc(count(p, K_CONTEXT), sizeof *ret->contexts.ptr);
    ret->variables.ptr = list_alloc(count(p, K_VARIABLE), sizeof *ret->variables.ptr);
    ret->tools.ptr = list_alloc(count(p, K_TOOL), sizeof *ret->tools.ptr);
    for (size_t i = 0; i < p->len; i++) {
        const item *it = &p->items[i];
        switch (it->kind) {
        case K_SECTION: {
            promptd_plugin_types_section_t *s = &ret->sections.ptr[ret->sections.len++];
            s->name = wit_str(it->name);
            s->order = it->order;
            s->text = content_to_wit(it);
            s->complete = it->complete;
            s->scope = scope_to_wit(it->scope_agent);
            s->verbatim = it->verbatim;
            s->reads = reads_to_wit(it->has_reads, &it->reads);
            s->refresh = refresh_to_wit(it);
            break;
        }
        case K_CONTEXT: {
            promptd_plugin_types_context_t *c = &ret->contexts.ptr[ret->contexts.len++];
            c->name = wit_str(it->name);
            c->order = it->order;
            c->text = content_to_wit(it);
            c->scope = scope_to_wit(it->scope_agent);
            c->verbatim = it->verbatim;
            c->reads = reads_to_wit(it->has_reads, &it->reads);
            break;
        }
        case K_VARIABLE: {
            promptd_plugin_types_variable_t *v = &ret->variables.ptr[ret->variables.len++];
            v->name = wit_str(it->name);
            v->value = content_to_wit(it);
            v->scope = scope_to_wit(it->scope_agent);
            v->reads = reads_to_wit(it->has_reads, &it->reads);
            break;
        }
        case K_TOOL: {
            promptd_plugin_types_tool_t *t = &ret->tools.ptr[ret->tools.len++];
            t->name = wit_str(it->name);
            t->description = wit_str(it->description);
            t->parameters = wit_str(it->parameters);
            t->scope = scope_to_wit(it->scope_agent);
            t->refresh = refresh_to_wit(it);
            t->defer = it->defer;
            break;
        }
        }
    }
    ret->filters_tools = p->tools_fn != NULL;
    ret->review_order.is_some = p->review_fn != NULL;
    ret->review_order.val = p->review_fn ? p->review_order : 0;
    ret->reads = reads_to_wit(p->has_default_reads, &p->default_reads);

    plugin_free(current);
    current = p;
    return true;
}

static bool same_scope(const item *it, const promptd_plugin_types_scope_t *scope) {
    if (scope->tag == PROMPTD_PLUGIN_TYPES_SCOPE_GLOBAL) return it->scope_agent == NULL;
    const plugin_string_t *a = &scope->val.agent;
    return it->scope_agent && strlen(it->scope_agent) == a->len &&
           memcmp(it->scope_agent, a->ptr, a->len) == 0;
}

static const char *kind_name(kind_t kind) {
    switch (kind) {
    case K_SECTION: return "section";
    case K_CONTEXT: return "context";
    case K_VARIABLE: return "variable";
    default: return "tool";
    }
}

/* Calls the callback of the wanted dynamic item (kind, name, scope) of `current` with `step`.
 * Returns false with *err set (malloc'd) on failure; on success `out` holds the answer. */
static bool call_dynamic(kind_t kind, const promptd_plugin_types_item_t *wanted,
                         const promptd_step *step, promptd_out *out, plugin_string_t *err) {
    char *cname = cstr(&wanted->name);
    const item *found = NULL;
    for (size_t i = 0; i < current->len; i++) {
        const item *it = &current->items[i];
        if (it->kind == kind && it->fn && strcmp(it->name, cname) == 0 &&
            same_scope(it, &wanted->scope)) {
            found = it;
            break;
        }
    }
    bool ok = false;
    if (!found) {
        char *m = xmalloc(strlen(cname) + 64);
        sprintf(m, "no dynamic %s `%s` is declared", kind_name(kind), cname);
        *err = wit_str(m);
        free(m);
    } else {
        found->fn(step, out, found->user);
        if (out->error) *err = wit_str(out->error);
        ok = !out->error;
    }
    free(cname);
    return ok;
}

/* A wanted section's or context's text: "" when the callback set none. */
static promptd_plugin_types_result_string_string_t text_result(
    kind_t kind, const promptd_plugin_types_item_t *wanted, const promptd_step *step) {
    promptd_plugin_types_result_string_string_t r;
    memset(&r, 0, sizeof r);
    promptd_out out = {0};
    r.is_err = !call_dynamic(kind, wanted, step, &out, &r.val.err);
    if (!r.is_err) r.val.ok = wit_str(out.text ? out.text : "");
    out_free(&out);
    return r;
}

/* A wanted variable's value: none when the callback set none. */
static promptd_plugin_types_result_option_string_string_t variable_result(
    const promptd_plugin_types_item_t *wanted, const promptd_step *step) {
    promptd_plugin_types_result_option_string_string_t r;
    memset(&r, 0, sizeof r);
    promptd_out out = {0};
    r.is_err = !call_dynamic(K_VARIABLE, wanted, step, &out, &r.val.err);
    if (!r.is_err) {
        r.val.ok.is_some = out.text != NULL;
        if (out.text) r.val.ok.val = wit_str(out.text);
    }
    out_free(&out);
    return r;
}

/* The names of the shown tools, from the show-tools callback. */
static promptd_plugin_types_result_list_string_string_t tools_result(const promptd_step *step) {
    promptd_plugin_types_result_list_string_string_t r;
    memset(&r, 0, sizeof r);
    if (!current->tools_fn) {
        r.is_err = true;
        r.val.err = wit_str("this plugin does not filter its tools");
        return r;
    }
    promptd_out out = {0};
    current->tools_fn(step, &out, current->tools_user);
    if (out.error) {
        r.is_err = true;
        r.val.err = wit_str(out.error);
    } else {
        r.val.ok.len = out.tools_len;
        r.val.ok.ptr = list_alloc(out.tools_len, sizeof *r.val.ok.ptr);
        for (size_t i = 0; i < out.tools_len; i++) r.val.ok.ptr[i] = wit_str(out.tools[i]);
    }
    out_free(&out);
    return r;
}

bool exports_plugin_evaluate(plugin_step_t *wstep, plugin_wanted_t *wanted,
                             plugin_evaluation_t *ret, plugin_string_t *err) {
    bool ok = false;
    if (!current) {
        *err = wit_str("the plugin was called before declare");
    } else {
        promptd_step step;
        step_from_wit(wstep, &step);
        memset(ret, 0, sizeof *ret);
        ret->sections.len = wanted->sections.len;
        ret->sections.ptr = list_alloc(wanted->sections.len, sizeof *ret->sections.ptr);
        for (size_t i = 0; i < wanted->sections.len; i++)
            ret->sections.ptr[i] = text_result(K_SECTION, &wanted->sections.ptr[i], &step);
        ret->contexts.len = wanted->contexts.len;
        ret->contexts.ptr = list_alloc(wanted->contexts.len, sizeof *ret->contexts.ptr);
        for (size_t i = 0; i < wanted->contexts.len; i++)
            ret->contexts.ptr[i] = text_result(K_CONTEXT, &wanted->contexts.ptr[i], &step);
        ret->variables.len = wanted->variables.len;
        ret->variables.ptr = list_alloc(wanted->variables.len, sizeof *ret->variables.ptr);
        for (size_t i = 0; i < wanted->variables.len; i++)
            ret->variables.ptr[i] = variable_result(&wanted->variables.ptr[i], &step);
        ret->shown_tools.is_some = wanted->shown_tools;
        if (wanted->shown_tools) ret->shown_tools.val = tools_result(&step);
        step_free(&step);
        ok = true;
    }
    plugin_step_free(wstep);
    plugin_wanted_free(wanted);
    return ok;
}

/* ---- review ---- */

typedef struct redaction {
    char *find;
    char *replace;
} redaction;

struct promptd_verdict {
    int tag; /* PROMPTD_PLUGIN_TYPES_VERDICT_* */
    char *reason;
    redaction *redactions;
    size_t len, cap;
    char *error;
};

static void verdict_clear(promptd_verdict *v) {
    free(v->reason);
    v->reason = NULL;
    for (size_t i = 0; i < v->len; i++) {
        free(v->redactions[i].find);
        free(v->redactions[i].replace);
    }
    v->len = 0;
}

void promptd_accept(promptd_verdict *v) {
    verdict_clear(v);
    v->tag = PROMPTD_PLUGIN_TYPES_VERDICT_ACCEPT;
}

void promptd_reject(promptd_verdict *v, const char *format, ...) {
    va_list args;
    va_start(args, format);
    char *reason = vformat(format, args);
    va_end(args);
    verdict_clear(v);
    v->tag = PROMPTD_PLUGIN_TYPES_VERDICT_REJECT;
    v->reason = reason;
}

void promptd_redact(promptd_verdict *v, const char *find, const char *replace) {
    if (v->tag != PROMPTD_PLUGIN_TYPES_VERDICT_REDACT) verdict_clear(v);
    v->tag = PROMPTD_PLUGIN_TYPES_VERDICT_REDACT;
    if (v->len == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 4;
        v->redactions = xrealloc(v->redactions, v->cap * sizeof *v->redactions);
    }
    v->redactions[v->len].find = xstrdup(find);
    v->redactions[v->len].replace = xstrdup(replace);
    v->len++;
}

void promptd_verdict_error(promptd_verdict *v, const char *format, ...) {
    va_list args;
    va_start(args, format);
    free(v->error);
    v->error = vformat(format, args);
    va_end(args);
}

bool promptd_review_mentions(const promptd_review_input *input, const char *needle) {
    if (!input || !needle) return false;
    for (size_t i = 0; i < input->messages_len; i++) {
        const promptd_message *m = &input->messages[i];
        for (size_t j = 0; j < m->texts_len; j++)
            if (strstr(m->texts[j], needle)) return true;
    }
    return false;
}

static void review_input_from_wit(const plugin_review_input_t *w, promptd_review_input *in) {
    promptd_message *messages = xmalloc(w->messages.len * sizeof *messages);
    for (size_t i = 0; i < w->messages.len; i++) {
        const promptd_plugin_types_message_t *m = &w->messages.ptr[i];
        messages[i].role = cstr(&m->role);
        messages[i].texts = strings_from_wit(&m->texts);
        messages[i].texts_len = m->texts.len;
        messages[i].tool_call_id = cstr(&m->tool_call_id);
    }
    in->messages = messages;
    in->messages_len = w->messages.len;
    in->system = cstr(&w->system);
    in->runtime_context = w->runtime_context.is_some ? cstr(&w->runtime_context.val) : NULL;
    in->tools = strings_from_wit(&w->tools);
    in->tools_len = w->tools.len;
}

static void review_input_free(promptd_review_input *in) {
    for (size_t i = 0; i < in->messages_len; i++) {
        const promptd_message *m = &in->messages[i];
        free((char *)m->role);
        strings_free(m->texts, m->texts_len);
        free((char *)m->tool_call_id);
    }
    free((void *)in->messages);
    free((char *)in->system);
    free((char *)in->runtime_context);
    strings_free(in->tools, in->tools_len);
}

bool exports_plugin_review(plugin_step_t *wstep, plugin_review_input_t *winput,
                           plugin_verdict_t *ret, plugin_string_t *err) {
    bool ok = false;
    memset(ret, 0, sizeof *ret);
    if (!current) {
        *err = wit_str("the plugin was called before declare");
    } else if (!current->review_fn) {
        ret->tag = PROMPTD_PLUGIN_TYPES_VERDICT_ACCEPT;
        ok = true;
    } else {
        promptd_step step;
        promptd_review_input input;
        step_from_wit(wstep, &step);
        review_input_from_wit(winput, &input);
        promptd_verdict v = {0};
        v.tag = PROMPTD_PLUGIN_TYPES_VERDICT_ACCEPT;
        current->review_fn(&step, &input, &v, current->review_user);
        review_input_free(&input);
        step_free(&step);
        if (v.error) {
            *err = wit_str(v.error);
        } else {
            ret->tag = (uint8_t)v.tag;
            if (v.tag == PROMPTD_PLUGIN_TYPES_VERDICT_REJECT) {
                ret->val.reject = wit_str(v.reason);
            } else if (v.tag == PROMPTD_PLUGIN_TYPES_VERDICT_REDACT) {
                promptd_plugin_types_list_redaction_t *list = &ret->val.redact;
                list->len = v.len;
                list->ptr = list_alloc(v.len, sizeof *list->ptr);
                for (size_t i = 0; i < v.len; i++) {
                    list->ptr[i].find = wit_str(v.redactions[i].find);
                    list->ptr[i].replace = wit_str(v.redactions[i].replace);
                }
            }
            ok = true;
        }
        verdict_clear(&v);
        free(v.redactions);
        free(v.error);
    }
    plugin_step_free(wstep);
    plugin_review_input_free(winput);
    return ok;
}

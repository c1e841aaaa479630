/*
 * The promptd C SDK: the builder (promptd.h) and its glue to the bindings wit-bindgen generates
 * from wit/plugin.wit (generated/plugin.h). Only this file knows the generated types.
 *
 * Ownership rules of the generated bindings (wit-bindgen C 0.61): arguments of an exported
 * function belong to the callee (freed here), and everything an export returns must be
 * malloc'd, because the generated `cabi_post_*` functions free it after the host has read it.
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
}

static void step_free(promptd_step *s) {
    free((char *)s->agent);
    for (size_t i = 0; i < s->scope_chain_len; i++) free((char *)s->scope_chain[i]);
    free((void *)s->scope_chain);
    free((char *)s->session_id);
    pairs_free((promptd_pair *)s->facts, s->facts_len);
}

/* ---- the builder ---- */

typedef enum { K_SECTION, K_CONTEXT, K_VARIABLE, K_TOOL } kind_t;

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
    char *scope_agent; /* NULL: global */
} item;

struct promptd_plugin {
    item *items; /* in declaration order, all kinds */
    size_t len, cap;
    long last; /* index of the item added last, -1 before any */
    promptd_tools_fn tools_fn;
    void *tools_user;
    char *misuse; /* the first misuse or promptd_fail message */
};

/* The plugin built by the last declare; dynamic calls look their callbacks up here. */
static promptd_plugin *current;

static void misuse(promptd_plugin *p, const char *message) {
    if (!p->misuse) p->misuse = xstrdup(message);
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
    }
    free(p->items);
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
            break;
        }
        case K_CONTEXT: {
            promptd_plugin_types_context_t *c = &ret->contexts.ptr[ret->contexts.len++];
            c->name = wit_str(it->name);
            c->order = it->order;
            c->text = content_to_wit(it);
            c->scope = scope_to_wit(it->scope_agent);
            break;
        }
        case K_VARIABLE: {
            promptd_plugin_types_variable_t *v = &ret->variables.ptr[ret->variables.len++];
            v->name = wit_str(it->name);
            v->value = content_to_wit(it);
            v->scope = scope_to_wit(it->scope_agent);
            break;
        }
        case K_TOOL: {
            promptd_plugin_types_tool_t *t = &ret->tools.ptr[ret->tools.len++];
            t->name = wit_str(it->name);
            t->description = wit_str(it->description);
            t->parameters = wit_str(it->parameters);
            t->scope = scope_to_wit(it->scope_agent);
            break;
        }
        }
    }
    ret->filters_tools = p->tools_fn != NULL;

    plugin_free(current);
    current = p;
    return true;
}

static bool same_scope(const item *it, const plugin_scope_t *scope) {
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

/* Calls the callback of the dynamic item (kind, name, scope); frees the arguments. Returns
 * false with *err set on failure; on success `out` holds the answer. */
static bool call_dynamic(kind_t kind, plugin_string_t *name, plugin_scope_t *scope,
                         plugin_step_t *wstep, promptd_out *out, plugin_string_t *err) {
    bool ok = false;
    char *cname = cstr(name);
    const item *found = NULL;
    if (current) {
        for (size_t i = 0; i < current->len; i++) {
            const item *it = &current->items[i];
            if (it->kind == kind && it->fn && strcmp(it->name, cname) == 0 && same_scope(it, scope)) {
                found = it;
                break;
            }
        }
    }
    if (!current) {
        *err = wit_str("the plugin was called before declare");
    } else if (!found) {
        char *m = xmalloc(strlen(cname) + 64);
        sprintf(m, "no dynamic %s `%s` is declared", kind_name(kind), cname);
        *err = wit_str(m);
        free(m);
    } else {
        promptd_step step;
        step_from_wit(wstep, &step);
        found->fn(&step, out, found->user);
        step_free(&step);
        if (out->error) *err = wit_str(out->error);
        ok = !out->error;
    }
    free(cname);
    plugin_string_free(name);
    plugin_scope_free(scope);
    plugin_step_free(wstep);
    return ok;
}

static bool text_export(kind_t kind, plugin_string_t *name, plugin_scope_t *scope,
                        plugin_step_t *step, plugin_string_t *ret, plugin_string_t *err) {
    promptd_out out = {0};
    bool ok = call_dynamic(kind, name, scope, step, &out, err);
    if (ok) *ret = wit_str(out.text ? out.text : "");
    out_free(&out);
    return ok;
}

bool exports_plugin_section_text(plugin_string_t *name, plugin_scope_t *scope, plugin_step_t *step,
                                 plugin_string_t *ret, plugin_string_t *err) {
    return text_export(K_SECTION, name, scope, step, ret, err);
}

bool exports_plugin_context_text(plugin_string_t *name, plugin_scope_t *scope, plugin_step_t *step,
                                 plugin_string_t *ret, plugin_string_t *err) {
    return text_export(K_CONTEXT, name, scope, step, ret, err);
}

bool exports_plugin_variable_value(plugin_string_t *name, plugin_scope_t *scope,
                                   plugin_step_t *step, plugin_option_string_t *ret,
                                   plugin_string_t *err) {
    promptd_out out = {0};
    bool ok = call_dynamic(K_VARIABLE, name, scope, step, &out, err);
    if (ok) {
        memset(ret, 0, sizeof *ret);
        ret->is_some = out.text != NULL;
        if (out.text) ret->val = wit_str(out.text);
    }
    out_free(&out);
    return ok;
}

bool exports_plugin_shown_tools(plugin_step_t *wstep, plugin_list_string_t *ret,
                                plugin_string_t *err) {
    bool ok = false;
    if (!current) {
        *err = wit_str("the plugin was called before declare");
    } else if (!current->tools_fn) {
        *err = wit_str("this plugin does not filter its tools");
    } else {
        promptd_out out = {0};
        promptd_step step;
        step_from_wit(wstep, &step);
        current->tools_fn(&step, &out, current->tools_user);
        step_free(&step);
        if (out.error) {
            *err = wit_str(out.error);
        } else {
            ret->len = out.tools_len;
            ret->ptr = list_alloc(out.tools_len, sizeof *ret->ptr);
            for (size_t i = 0; i < out.tools_len; i++) ret->ptr[i] = wit_str(out.tools[i]);
            ok = true;
        }
        out_free(&out);
    }
    plugin_step_free(wstep);
    return ok;
}

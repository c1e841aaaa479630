/*
 * Native unit tests of the C SDK's glue (src/promptd.c) to the generated bindings: calls the
 * world's exports as the canonical ABI would (malloc'd arguments the callee frees; results
 * freed afterwards the way the generated post-return functions do) and checks the answers.
 * Run by sdk/c/tests/run.sh, under AddressSanitizer/LeakSanitizer when the compiler has them,
 * which catches a double free or a leak in the ownership rules.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin.h"
#include "promptd.h"

static int failures;

#define CHECK(cond)                                                             \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                         \
        }                                                                       \
    } while (0)

static bool str_eq(const plugin_string_t *s, const char *want) {
    return s->len == strlen(want) && memcmp(s->ptr, want, s->len) == 0;
}

#define CHECK_STR(s, want)                                                          \
    do {                                                                            \
        if (!str_eq((s), (want))) {                                                 \
            fprintf(stderr, "%s:%d: got `%.*s`, want `%s`\n", __FILE__, __LINE__,   \
                    (int)(s)->len, (const char *)(s)->ptr, (want));                 \
            failures++;                                                             \
        }                                                                           \
    } while (0)

/* What the component model provides in a wasm build: the host's import (the log lines are
 * counted) and the symbol of the world's type object. */
static int logged;

void __wasm_import_promptd_plugin_host_log(int32_t level, uint8_t *ptr, size_t len) {
    (void)level;
    (void)ptr;
    (void)len;
    logged++;
}

void __component_type_object_force_link_plugin(void) {}

/* ---- the plugin under test ---- */

static void echo(const promptd_step *step, promptd_out *out, void *user) {
    (void)user;
    const char *value = promptd_step_fact(step, "echo");
    if (value) promptd_out_textf(out, "Echo: %s", value);
}

static void fail(const promptd_step *step, promptd_out *out, void *user) {
    (void)step;
    promptd_out_error(out, "failed %s", (const char *)user);
}

static void mood(const promptd_step *step, promptd_out *out, void *user) {
    (void)user;
    const char *value = promptd_step_fact(step, "mood");
    if (value) promptd_out_text(out, value);
}

static void shown(const promptd_step *step, promptd_out *out, void *user) {
    (void)step;
    (void)user;
    promptd_out_tool(out, "t_read");
}

/* Every request input of the step, as text: `lum=... model=... tools=a,b turns=N step=N
 * bash=0|1`, with `-` for one not given. */
static void format_inputs(const promptd_step *step, char *buf, size_t size) {
    char tools[256] = "-";
    if (step->client_tools_given) {
        strcpy(tools, step->client_tools_len ? "" : "(none)");
        for (size_t i = 0; i < step->client_tools_len; i++) {
            if (i) strcat(tools, ",");
            strcat(tools, step->client_tools[i]);
        }
    }
    char turns[32] = "-";
    if (step->turn_count_given)
        snprintf(turns, sizeof turns, "%llu", (unsigned long long)step->turn_count);
    else if (step->turn_count != 0)
        strcpy(turns, "not-zero");
    snprintf(buf, size, "lum=%s model=%s tools=%s turns=%s step=%llu bash=%d",
             step->last_user_message ? step->last_user_message : "-",
             step->model ? step->model : "-", tools, turns,
             (unsigned long long)step->step_number, promptd_step_client_tool(step, "bash"));
}

static void inputs(const promptd_step *step, promptd_out *out, void *user) {
    (void)user;
    char buf[512];
    format_inputs(step, buf, sizeof buf);
    promptd_out_text(out, buf);
}

static void review(const promptd_step *step, const promptd_review_input *input,
                   promptd_verdict *verdict, void *user) {
    (void)user;
    promptd_log(PROMPTD_INFO, "review of %s: %zu messages", step->agent, input->messages_len);
    if (step->model) { /* a review's step shows every input */
        char buf[512];
        format_inputs(step, buf, sizeof buf);
        promptd_reject(verdict, "%s", buf);
    } else if (promptd_review_mentions(input, "boom")) {
        promptd_redact(verdict, "x", "y");
        promptd_verdict_error(verdict, "boom in %s", input->system);
    } else if (promptd_review_mentions(input, "forbidden")) {
        promptd_redact(verdict, "dropped", "by the reject");
        promptd_reject(verdict, "the step mentions \"%s\"", "forbidden");
    } else if (promptd_review_mentions(input, "hunter2")) {
        promptd_redact(verdict, "hunter2", "[redacted]");
        promptd_redact(verdict, "", ""); /* passed on as is: the host validates */
    } else if (input->runtime_context == NULL && input->tools_len == 1 &&
               strcmp(input->tools[0], "t_read") == 0 && input->messages_len == 1 &&
               strcmp(input->messages[0].role, "tool") == 0 &&
               strcmp(input->messages[0].tool_call_id, "c1") == 0 &&
               input->messages[0].texts_len == 0) {
        promptd_reject(verdict, "shape seen");
        promptd_accept(verdict);
    } else {
        promptd_reject(verdict, "unexpected input");
    }
}

static const char *const TASK[] = {"task"};
static const char *const BA[] = {"b", "a"};
static const char *const CWD[] = {"cwd"};
static const char *const WITH_NULL[] = {"a", NULL};
#define ALL_INPUTS                                                                         \
    (PROMPTD_INPUT_LAST_USER_MESSAGE | PROMPTD_INPUT_MODEL | PROMPTD_INPUT_CLIENT_TOOLS | \
     PROMPTD_INPUT_STEP_NUMBER | PROMPTD_INPUT_TURN_COUNT)

/* 0.3.0: reads, refresh and defer on the items added last, and the plugin-wide reads. */
static void declare_reads(promptd_plugin *p) {
    promptd_default_reads(p, NULL, 0, PROMPTD_INPUT_STEP_NUMBER, true); /* replaced below */
    promptd_section(p, "r:static", 10, "Static.");
    promptd_refresh(p, PROMPTD_REFRESH_SESSION);
    promptd_dynamic_section(p, "r:task", 20, echo, NULL);
    promptd_reads(p, BA, 2, PROMPTD_INPUT_MODEL, true); /* replaced by the next call */
    promptd_reads(p, TASK, 1, 0, false);
    promptd_refresh(p, PROMPTD_REFRESH_BOUNDARY);
    promptd_scope(p, "coder");
    promptd_dynamic_section(p, "r:plain", 30, echo, NULL);
    promptd_context(p, "r:static", 35, "Static.");
    promptd_dynamic_context(p, "r:inputs", 40, inputs, NULL);
    promptd_reads(p, NULL, 0, ALL_INPUTS, true);
    promptd_verbatim(p);
    promptd_variable(p, "sv", "1");
    promptd_dynamic_variable(p, "ba", mood, NULL);
    promptd_reads(p, BA, 2, PROMPTD_INPUT_CLIENT_TOOLS, false);
    promptd_tool(p, "t_one", "One.", "{\"type\":\"object\"}");
    promptd_refresh(p, PROMPTD_REFRESH_STEP);
    promptd_defer(p);
    promptd_tool(p, "t_two", "Two.", "{\"type\":\"object\"}");
    promptd_default_reads(p, CWD, 1, PROMPTD_INPUT_MODEL, false);
    promptd_show_tools(p, shown, NULL);
}

/* Each misuse of the 0.3.0 functions, by name; the plugin is refused with its message. */
static void declare_misuse(const char *which, promptd_plugin *p) {
    if (strcmp(which, "reads-static") == 0) {
        promptd_section(p, "s", 0, "S.");
        promptd_reads(p, TASK, 1, 0, false);
    } else if (strcmp(which, "reads-static-variable") == 0) {
        promptd_variable(p, "v", "1");
        promptd_reads(p, TASK, 1, 0, false);
    } else if (strcmp(which, "reads-tool") == 0) {
        promptd_tool(p, "t", "T.", "{}");
        promptd_reads(p, TASK, 1, 0, false);
    } else if (strcmp(which, "reads-first") == 0) {
        promptd_reads(p, NULL, 0, 0, false);
    } else if (strcmp(which, "reads-null-facts") == 0) {
        promptd_dynamic_section(p, "s", 0, echo, NULL);
        promptd_reads(p, NULL, 2, 0, false);
    } else if (strcmp(which, "reads-null-fact") == 0) {
        promptd_dynamic_context(p, "c", 0, echo, NULL);
        promptd_reads(p, WITH_NULL, 2, 0, false);
    } else if (strcmp(which, "reads-inputs") == 0) {
        promptd_dynamic_variable(p, "v", mood, NULL);
        promptd_reads(p, TASK, 1, PROMPTD_INPUT_MODEL | (1u << 5), false);
    } else if (strcmp(which, "default-reads-inputs") == 0) {
        promptd_default_reads(p, NULL, 0, 0x80, false);
    } else if (strcmp(which, "default-reads-null-facts") == 0) {
        promptd_default_reads(p, NULL, 1, 0, false);
    } else if (strcmp(which, "refresh-context") == 0) {
        promptd_context(p, "c", 0, "C.");
        promptd_refresh(p, PROMPTD_REFRESH_BOUNDARY);
    } else if (strcmp(which, "refresh-variable") == 0) {
        promptd_dynamic_variable(p, "v", mood, NULL);
        promptd_refresh(p, PROMPTD_REFRESH_BOUNDARY);
    } else if (strcmp(which, "refresh-first") == 0) {
        promptd_refresh(p, PROMPTD_REFRESH_STEP);
    } else if (strcmp(which, "refresh-value") == 0) {
        promptd_section(p, "s", 0, "S.");
        promptd_refresh(p, (promptd_refresh_when)7);
    } else if (strcmp(which, "defer-section") == 0) {
        promptd_section(p, "s", 0, "S.");
        promptd_defer(p);
    } else if (strcmp(which, "defer-first") == 0) {
        promptd_defer(p);
    } else if (strcmp(which, "first-wins") == 0) {
        /* The first misuse is reported; what was declared before and after is freed. */
        promptd_default_reads(p, CWD, 1, 0, false);
        promptd_dynamic_section(p, "s", 0, echo, NULL);
        promptd_reads(p, TASK, 1, 0, false);
        promptd_defer(p);
        promptd_reads(p, BA, 2, 0x40, false);
        promptd_tool(p, "t", "T.", "{}");
        promptd_defer(p);
    }
}

static void declare(const promptd_config *config, promptd_plugin *p) {
    const char *mode = promptd_config_get_or(config, "mode", "full");
    if (strncmp(mode, "misuse:", 7) == 0) {
        declare_misuse(mode + 7, p);
        return;
    }
    if (strcmp(mode, "reads") == 0) {
        declare_reads(p);
        return;
    }
    if (strcmp(mode, "verbatim-variable") == 0) {
        promptd_variable(p, "v", "1");
        promptd_verbatim(p);
        return;
    }
    if (strcmp(mode, "verbatim-first") == 0) {
        promptd_verbatim(p);
        return;
    }
    if (strcmp(mode, "plain") == 0) {
        promptd_section(p, "plain", 0, "Plain.");
        return;
    }
    promptd_section(p, "s:static", 10, "Hi {{v}}.");
    promptd_dynamic_section(p, "s:echo", 30, echo, NULL);
    promptd_verbatim(p);
    promptd_dynamic_section(p, "s:fail", 40, fail, "here");
    promptd_scope(p, "coder");
    promptd_context(p, "s:raw", 35, "Raw {{v}}.");
    promptd_verbatim(p);
    promptd_dynamic_context(p, "s:ctx", 36, echo, NULL);
    promptd_dynamic_variable(p, "mood", mood, NULL);
    promptd_tool(p, "t_read", "Reads.", "{\"type\":\"object\"}");
    promptd_show_tools(p, shown, NULL);
    promptd_review(p, -5, review, NULL);
}

PROMPTD_EXPORT_PLUGIN(declare)

/* ---- building arguments as the host would (malloc'd; the callee frees them) ---- */

static plugin_string_t s(const char *text) {
    plugin_string_t out;
    plugin_string_dup(&out, text);
    return out;
}

static plugin_list_tuple2_string_string_t pairs(const char *const *kv, size_t n) {
    plugin_list_tuple2_string_string_t list = {n ? malloc(n * sizeof *list.ptr) : NULL, n};
    for (size_t i = 0; i < n; i++) {
        list.ptr[i].f0 = s(kv[2 * i]);
        list.ptr[i].f1 = s(kv[2 * i + 1]);
    }
    return list;
}

static plugin_step_t step_with(const char *const *facts, size_t n) {
    plugin_step_t st;
    memset(&st, 0, sizeof st);
    st.agent = s("coder");
    st.scope_chain.len = 2;
    st.scope_chain.ptr = malloc(2 * sizeof *st.scope_chain.ptr);
    st.scope_chain.ptr[0] = s("global");
    st.scope_chain.ptr[1] = s("coder");
    st.session_id = s("");
    st.step_number = 3;
    st.facts = pairs(facts, n);
    return st;
}

/* Sets the step's request inputs; NULL strings and a negative count leave them out. */
static void step_inputs(plugin_step_t *st, const char *lum, const char *model,
                        const char *const *tools, long ntools, long turns) {
    st->last_user_message.is_some = lum != NULL;
    if (lum) st->last_user_message.val = s(lum);
    st->model.is_some = model != NULL;
    if (model) st->model.val = s(model);
    st->client_tools.is_some = ntools >= 0;
    if (ntools > 0) {
        st->client_tools.val.len = (size_t)ntools;
        st->client_tools.val.ptr = malloc((size_t)ntools * sizeof(plugin_string_t));
        for (long i = 0; i < ntools; i++) st->client_tools.val.ptr[i] = s(tools[i]);
    }
    st->turn_count.is_some = turns >= 0;
    st->turn_count.val = turns >= 0 ? (uint64_t)turns : 0;
}

static bool list_is(const plugin_list_string_t *list, const char *const *want, size_t n) {
    if (list->len != n) return false;
    for (size_t i = 0; i < n; i++)
        if (!str_eq(&list->ptr[i], want[i])) return false;
    return true;
}

static promptd_plugin_types_item_t item_of(const char *name, const char *agent) {
    promptd_plugin_types_item_t it;
    memset(&it, 0, sizeof it);
    it.name = s(name);
    if (agent) {
        it.scope.tag = PROMPTD_PLUGIN_TYPES_SCOPE_AGENT;
        it.scope.val.agent = s(agent);
    } else {
        it.scope.tag = PROMPTD_PLUGIN_TYPES_SCOPE_GLOBAL;
    }
    return it;
}

static promptd_plugin_types_list_item_t items(promptd_plugin_types_item_t *src, size_t n) {
    promptd_plugin_types_list_item_t list = {n ? malloc(n * sizeof *list.ptr) : NULL, n};
    if (n) memcpy(list.ptr, src, n * sizeof *src);
    return list;
}

static bool declare_with(const char *mode, plugin_declaration_t *ret, plugin_string_t *err) {
    const char *kv[] = {"mode", mode};
    plugin_list_tuple2_string_string_t config = pairs(kv, 1);
    return exports_plugin_declare(&config, ret, err);
}

static plugin_review_input_t review_input(const char *const *user_texts, size_t n) {
    plugin_review_input_t in;
    memset(&in, 0, sizeof in);
    in.messages.len = 2;
    in.messages.ptr = malloc(2 * sizeof *in.messages.ptr);
    in.messages.ptr[0].role = s("assistant");
    in.messages.ptr[0].texts.len = 1;
    in.messages.ptr[0].texts.ptr = malloc(sizeof(plugin_string_t));
    in.messages.ptr[0].texts.ptr[0] = s("Sure.");
    in.messages.ptr[0].tool_call_id = s("");
    in.messages.ptr[1].role = s("user");
    in.messages.ptr[1].texts.len = n;
    in.messages.ptr[1].texts.ptr = n ? malloc(n * sizeof(plugin_string_t)) : NULL;
    for (size_t i = 0; i < n; i++) in.messages.ptr[1].texts.ptr[i] = s(user_texts[i]);
    in.messages.ptr[1].tool_call_id = s("");
    in.system = s("SYSTEM");
    in.runtime_context.is_some = true;
    in.runtime_context.val = s("CTX");
    in.tools.len = 0;
    in.tools.ptr = NULL;
    return in;
}

static void review_case(const char *const *texts, size_t n, plugin_result_verdict_string_t *r) {
    plugin_step_t st = step_with(NULL, 0);
    plugin_review_input_t in = review_input(texts, n);
    r->is_err = !exports_plugin_review(&st, &in, &r->val.ok, &r->val.err);
}

int main(void) {
    /* Before declare. */
    {
        plugin_step_t st = step_with(NULL, 0);
        plugin_wanted_t w;
        memset(&w, 0, sizeof w);
        plugin_evaluation_t ev;
        plugin_string_t err;
        CHECK(!exports_plugin_evaluate(&st, &w, &ev, &err));
        CHECK_STR(&err, "the plugin was called before declare");
        plugin_string_free(&err);
    }

    /* Misuse refuses the plugin. */
    {
        plugin_declaration_t d;
        plugin_string_t err;
        CHECK(!declare_with("verbatim-variable", &d, &err));
        CHECK_STR(&err, "promptd_verbatim applies to a section or context only");
        plugin_string_free(&err);
        CHECK(!declare_with("verbatim-first", &d, &err));
        CHECK_STR(&err, "promptd_verbatim applies to a section or context only");
        plugin_string_free(&err);
    }

    /* Without a review hook: review-order none, and review accepts. */
    {
        plugin_declaration_t d;
        plugin_string_t err;
        CHECK(declare_with("plain", &d, &err));
        CHECK(!d.review_order.is_some);
        CHECK(d.sections.len == 1 && !d.sections.ptr[0].verbatim);
        plugin_declaration_free(&d);
        plugin_result_verdict_string_t r;
        const char *texts[] = {"forbidden"};
        review_case(texts, 1, &r);
        CHECK(!r.is_err && r.val.ok.tag == PROMPTD_PLUGIN_TYPES_VERDICT_ACCEPT);
        plugin_result_verdict_string_free(&r);
    }

    /* The declaration. */
    plugin_declaration_t d;
    plugin_string_t err;
    CHECK(declare_with("full", &d, &err));
    CHECK(d.sections.len == 3 && d.contexts.len == 2 && d.variables.len == 1 && d.tools.len == 1);
    if (d.sections.len == 3 && d.contexts.len == 2) {
        CHECK(!d.sections.ptr[0].verbatim);
        CHECK(d.sections.ptr[1].verbatim);
        CHECK(d.sections.ptr[1].text.tag == PROMPTD_PLUGIN_TYPES_CONTENT_DYNAMIC);
        CHECK(!d.sections.ptr[2].verbatim);
        CHECK(d.sections.ptr[2].scope.tag == PROMPTD_PLUGIN_TYPES_SCOPE_AGENT);
        CHECK(d.contexts.ptr[0].verbatim);
        CHECK_STR(&d.contexts.ptr[0].text.val.static_text, "Raw {{v}}.");
        CHECK(!d.contexts.ptr[1].verbatim);
    }
    CHECK(d.filters_tools);
    CHECK(d.review_order.is_some && d.review_order.val == -5);
    /* Written without the 0.3.0 functions: no reads, refresh or defer anywhere. */
    CHECK(!d.reads.is_some);
    for (size_t i = 0; i < d.sections.len; i++)
        CHECK(!d.sections.ptr[i].reads.is_some && !d.sections.ptr[i].refresh.is_some);
    for (size_t i = 0; i < d.contexts.len; i++) CHECK(!d.contexts.ptr[i].reads.is_some);
    for (size_t i = 0; i < d.variables.len; i++) CHECK(!d.variables.ptr[i].reads.is_some);
    for (size_t i = 0; i < d.tools.len; i++)
        CHECK(!d.tools.ptr[i].refresh.is_some && !d.tools.ptr[i].defer);
    plugin_declaration_free(&d);

    /* One evaluate: every wanted item answered in order, errors per item. */
    {
        const char *facts[] = {"echo", "{{v}}", "mood", "calm"};
        plugin_step_t st = step_with(facts, 2);
        promptd_plugin_types_item_t sec[] = {
            item_of("s:fail", "coder"), item_of("s:echo", NULL), item_of("s:nope", NULL),
            item_of("s:fail", NULL), item_of("s:static", NULL)};
        promptd_plugin_types_item_t ctx[] = {item_of("s:ctx", NULL)};
        promptd_plugin_types_item_t var[] = {item_of("mood", NULL), item_of("nope", NULL)};
        plugin_wanted_t w = {items(sec, 5), items(ctx, 1), items(var, 2), true};
        plugin_result_evaluation_string_t r;
        r.is_err = !exports_plugin_evaluate(&st, &w, &r.val.ok, &r.val.err);
        CHECK(!r.is_err);
        plugin_evaluation_t *ev = &r.val.ok;
        CHECK(ev->sections.len == 5 && ev->contexts.len == 1 && ev->variables.len == 2);
        CHECK(ev->sections.ptr[0].is_err);
        CHECK_STR(&ev->sections.ptr[0].val.err, "failed here");
        CHECK(!ev->sections.ptr[1].is_err);
        CHECK_STR(&ev->sections.ptr[1].val.ok, "Echo: {{v}}");
        CHECK(ev->sections.ptr[2].is_err);
        CHECK_STR(&ev->sections.ptr[2].val.err, "no dynamic section `s:nope` is declared");
        CHECK(ev->sections.ptr[3].is_err); /* declared for coder only */
        CHECK_STR(&ev->sections.ptr[3].val.err, "no dynamic section `s:fail` is declared");
        CHECK(ev->sections.ptr[4].is_err); /* static: no callback */
        CHECK_STR(&ev->sections.ptr[4].val.err, "no dynamic section `s:static` is declared");
        CHECK(!ev->contexts.ptr[0].is_err);
        CHECK_STR(&ev->contexts.ptr[0].val.ok, "Echo: {{v}}");
        CHECK(!ev->variables.ptr[0].is_err && ev->variables.ptr[0].val.ok.is_some);
        CHECK_STR(&ev->variables.ptr[0].val.ok.val, "calm");
        CHECK(ev->variables.ptr[1].is_err);
        CHECK_STR(&ev->variables.ptr[1].val.err, "no dynamic variable `nope` is declared");
        CHECK(ev->shown_tools.is_some && !ev->shown_tools.val.is_err);
        CHECK(ev->shown_tools.val.val.ok.len == 1);
        if (ev->shown_tools.val.val.ok.len == 1)
            CHECK_STR(&ev->shown_tools.val.val.ok.ptr[0], "t_read");
        plugin_result_evaluation_string_free(&r);
    }

    /* Empty text, no value, shown tools not asked, nothing wanted. */
    {
        plugin_step_t st = step_with(NULL, 0);
        promptd_plugin_types_item_t sec[] = {item_of("s:echo", NULL)};
        promptd_plugin_types_item_t var[] = {item_of("mood", NULL)};
        plugin_wanted_t w = {items(sec, 1), items(NULL, 0), items(var, 1), false};
        plugin_result_evaluation_string_t r;
        r.is_err = !exports_plugin_evaluate(&st, &w, &r.val.ok, &r.val.err);
        CHECK(!r.is_err);
        CHECK(r.val.ok.sections.len == 1 && !r.val.ok.sections.ptr[0].is_err);
        CHECK_STR(&r.val.ok.sections.ptr[0].val.ok, "");
        CHECK(r.val.ok.contexts.len == 0);
        CHECK(r.val.ok.variables.len == 1 && !r.val.ok.variables.ptr[0].is_err);
        CHECK(!r.val.ok.variables.ptr[0].val.ok.is_some);
        CHECK(!r.val.ok.shown_tools.is_some);
        plugin_result_evaluation_string_free(&r);
    }

    /* Reviews. */
    {
        plugin_result_verdict_string_t r;
        const char *forbidden[] = {"hello", "this is forbidden hunter2"};
        review_case(forbidden, 2, &r);
        CHECK(!r.is_err && r.val.ok.tag == PROMPTD_PLUGIN_TYPES_VERDICT_REJECT);
        if (!r.is_err) CHECK_STR(&r.val.ok.val.reject, "the step mentions \"forbidden\"");
        plugin_result_verdict_string_free(&r);

        const char *secret[] = {"my password is hunter2"};
        review_case(secret, 1, &r);
        CHECK(!r.is_err && r.val.ok.tag == PROMPTD_PLUGIN_TYPES_VERDICT_REDACT);
        if (!r.is_err && r.val.ok.tag == PROMPTD_PLUGIN_TYPES_VERDICT_REDACT) {
            CHECK(r.val.ok.val.redact.len == 2);
            CHECK_STR(&r.val.ok.val.redact.ptr[0].find, "hunter2");
            CHECK_STR(&r.val.ok.val.redact.ptr[0].replace, "[redacted]");
            CHECK_STR(&r.val.ok.val.redact.ptr[1].find, "");
        }
        plugin_result_verdict_string_free(&r);

        const char *boom[] = {"boom"};
        review_case(boom, 1, &r);
        CHECK(r.is_err);
        if (r.is_err) CHECK_STR(&r.val.err, "boom in SYSTEM");
        plugin_result_verdict_string_free(&r);

        const char *plain[] = {"nothing here"};
        review_case(plain, 1, &r);
        CHECK(!r.is_err && r.val.ok.tag == PROMPTD_PLUGIN_TYPES_VERDICT_REJECT);
        if (!r.is_err) CHECK_STR(&r.val.ok.val.reject, "unexpected input");
        plugin_result_verdict_string_free(&r);

        /* A tool message without texts, no runtime context, one tool: accept. */
        plugin_step_t st = step_with(NULL, 0);
        plugin_review_input_t in;
        memset(&in, 0, sizeof in);
        in.messages.len = 1;
        in.messages.ptr = malloc(sizeof *in.messages.ptr);
        in.messages.ptr[0].role = s("tool");
        in.messages.ptr[0].texts.len = 0;
        in.messages.ptr[0].texts.ptr = NULL;
        in.messages.ptr[0].tool_call_id = s("c1");
        in.system = s("");
        in.tools.len = 1;
        in.tools.ptr = malloc(sizeof(plugin_string_t));
        in.tools.ptr[0] = s("t_read");
        r.is_err = !exports_plugin_review(&st, &in, &r.val.ok, &r.val.err);
        CHECK(!r.is_err && r.val.ok.tag == PROMPTD_PLUGIN_TYPES_VERDICT_ACCEPT);
        plugin_result_verdict_string_free(&r);
        CHECK(logged == 5);

        /* A review's step carries the request inputs too. */
        const char *tools[] = {"bash"};
        st = step_with(NULL, 0);
        step_inputs(&st, "Hello\n\nthere", "m-review", tools, 1, 2);
        in = review_input(plain, 1);
        r.is_err = !exports_plugin_review(&st, &in, &r.val.ok, &r.val.err);
        CHECK(!r.is_err && r.val.ok.tag == PROMPTD_PLUGIN_TYPES_VERDICT_REJECT);
        if (!r.is_err)
            CHECK_STR(&r.val.ok.val.reject,
                      "lum=Hello\n\nthere model=m-review tools=bash turns=2 step=3 bash=1");
        plugin_result_verdict_string_free(&r);
    }

    /* 0.3.0 misuse refuses the plugin with the first message. */
    {
        static const struct {
            const char *which, *message;
        } cases[] = {
            {"reads-static", "promptd_reads applies to a dynamic section, context or variable only"},
            {"reads-static-variable",
             "promptd_reads applies to a dynamic section, context or variable only"},
            {"reads-tool", "promptd_reads applies to a dynamic section, context or variable only"},
            {"reads-first", "promptd_reads applies to a dynamic section, context or variable only"},
            {"reads-null-facts", "promptd_reads: facts is NULL but facts_len is 2"},
            {"reads-null-fact", "promptd_reads: fact 1 is NULL"},
            {"reads-inputs", "promptd_reads: unknown input flags 0x20"},
            {"default-reads-inputs", "promptd_default_reads: unknown input flags 0x80"},
            {"default-reads-null-facts", "promptd_default_reads: facts is NULL but facts_len is 1"},
            {"refresh-context", "promptd_refresh applies to a section or tool only"},
            {"refresh-variable", "promptd_refresh applies to a section or tool only"},
            {"refresh-first", "promptd_refresh applies to a section or tool only"},
            {"refresh-value", "promptd_refresh: unknown refresh value 7"},
            {"defer-section", "promptd_defer applies to a tool only"},
            {"defer-first", "promptd_defer applies to a tool only"},
            {"first-wins", "promptd_defer applies to a tool only"},
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            char mode[64];
            snprintf(mode, sizeof mode, "misuse:%s", cases[i].which);
            plugin_declaration_t md;
            plugin_string_t merr;
            bool ok = declare_with(mode, &md, &merr);
            CHECK(!ok);
            if (ok) {
                fprintf(stderr, "  (case %s)\n", cases[i].which);
                plugin_declaration_free(&md);
                continue;
            }
            if (!str_eq(&merr, cases[i].message))
                fprintf(stderr, "  (case %s)\n", cases[i].which);
            CHECK_STR(&merr, cases[i].message);
            plugin_string_free(&merr);
        }
    }

    /* 0.3.0: what each item reads, its refresh and defer, and the plugin-wide reads. */
    CHECK(declare_with("reads", &d, &err));
    CHECK(d.sections.len == 3 && d.contexts.len == 2 && d.variables.len == 2 && d.tools.len == 2);
    CHECK(d.reads.is_some);
    if (d.reads.is_some) {
        CHECK(list_is(&d.reads.val.facts, CWD, 1));
        CHECK(d.reads.val.inputs == PROMPTD_PLUGIN_TYPES_INPUTS_MODEL);
        CHECK(!d.reads.val.volatile_);
    }
    if (d.sections.len == 3 && d.contexts.len == 2 && d.variables.len == 2 && d.tools.len == 2) {
        const promptd_plugin_types_section_t *sec = d.sections.ptr;
        CHECK(!sec[0].reads.is_some);
        CHECK(sec[0].refresh.is_some && sec[0].refresh.val == PROMPTD_PLUGIN_TYPES_REFRESH_SESSION);
        CHECK(sec[1].reads.is_some);
        if (sec[1].reads.is_some) {
            CHECK(list_is(&sec[1].reads.val.facts, TASK, 1));
            CHECK(sec[1].reads.val.inputs == 0 && !sec[1].reads.val.volatile_);
        }
        CHECK(sec[1].refresh.is_some && sec[1].refresh.val == PROMPTD_PLUGIN_TYPES_REFRESH_BOUNDARY);
        CHECK(sec[1].scope.tag == PROMPTD_PLUGIN_TYPES_SCOPE_AGENT);
        CHECK(!sec[2].reads.is_some && !sec[2].refresh.is_some);
        const promptd_plugin_types_context_t *ctx = d.contexts.ptr;
        CHECK(!ctx[0].reads.is_some);
        CHECK(ctx[1].reads.is_some && ctx[1].verbatim);
        if (ctx[1].reads.is_some) {
            CHECK(ctx[1].reads.val.facts.len == 0);
            CHECK(ctx[1].reads.val.inputs ==
                  (PROMPTD_PLUGIN_TYPES_INPUTS_LAST_USER_MESSAGE | PROMPTD_PLUGIN_TYPES_INPUTS_MODEL |
                   PROMPTD_PLUGIN_TYPES_INPUTS_CLIENT_TOOLS |
                   PROMPTD_PLUGIN_TYPES_INPUTS_STEP_NUMBER | PROMPTD_PLUGIN_TYPES_INPUTS_TURN_COUNT));
            CHECK(ctx[1].reads.val.volatile_);
        }
        const promptd_plugin_types_variable_t *var = d.variables.ptr;
        CHECK(!var[0].reads.is_some);
        CHECK(var[1].reads.is_some);
        if (var[1].reads.is_some) {
            CHECK(list_is(&var[1].reads.val.facts, BA, 2));
            CHECK(var[1].reads.val.inputs == PROMPTD_PLUGIN_TYPES_INPUTS_CLIENT_TOOLS);
            CHECK(!var[1].reads.val.volatile_);
        }
        const promptd_plugin_types_tool_t *tl = d.tools.ptr;
        CHECK(tl[0].refresh.is_some && tl[0].refresh.val == PROMPTD_PLUGIN_TYPES_REFRESH_STEP);
        CHECK(tl[0].defer);
        CHECK(!tl[1].refresh.is_some && !tl[1].defer);
    }
    CHECK(d.filters_tools && !d.review_order.is_some);
    plugin_declaration_free(&d);

    /* The step's request inputs reach the callbacks: given, not given, given empty. */
    {
        const char *tools[] = {"read", "bash"};
        struct {
            const char *lum, *model;
            long ntools, turns;
            const char *want;
        } cases[] = {
            {"What now?", "m1", 2, 4, "lum=What now? model=m1 tools=read,bash turns=4 step=3 bash=1"},
            {NULL, NULL, -1, -1, "lum=- model=- tools=- turns=- step=3 bash=0"},
            {"", NULL, 0, 0, "lum= model=- tools=(none) turns=0 step=3 bash=0"},
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            const char *facts[] = {"task", "t1"};
            plugin_step_t st = step_with(facts, 1);
            step_inputs(&st, cases[i].lum, cases[i].model, tools, cases[i].ntools, cases[i].turns);
            promptd_plugin_types_item_t ctx[] = {item_of("r:inputs", NULL)};
            plugin_wanted_t w = {items(NULL, 0), items(ctx, 1), items(NULL, 0), false};
            plugin_result_evaluation_string_t r;
            r.is_err = !exports_plugin_evaluate(&st, &w, &r.val.ok, &r.val.err);
            CHECK(!r.is_err && r.val.ok.contexts.len == 1 && !r.val.ok.contexts.ptr[0].is_err);
            if (!r.is_err && r.val.ok.contexts.len == 1 && !r.val.ok.contexts.ptr[0].is_err)
                CHECK_STR(&r.val.ok.contexts.ptr[0].val.ok, cases[i].want);
            plugin_result_evaluation_string_free(&r);
        }
    }

    /* A second declare replaces the first, which is freed (the leak checker would see it). */
    CHECK(declare_with("plain", &d, &err));
    plugin_declaration_free(&d);

    if (failures) {
        fprintf(stderr, "sdk/c tests: %d failure(s)\n", failures);
        return 1;
    }
    printf("sdk/c tests: ok\n");
    return 0;
}

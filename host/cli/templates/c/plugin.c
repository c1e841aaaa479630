/* The `@NAME@` promptd plugin. Build it with `promptd plugin build` (gives @NAME@.wasm). */
#include "promptd.h"

static void cwd(const promptd_step *step, promptd_out *out, void *user) {
    (void)user;
    const char *where = promptd_step_fact(step, "cwd");
    if (where != NULL) {
        promptd_out_textf(out, "Working in %s.", where);
    }
}

static void declare(const promptd_config *config, promptd_plugin *p) {
    promptd_section(p, "@NAME@:rules", 50, "Answer as {{@NAME@_style}}.");
    promptd_variable(p, "@NAME@_style", promptd_config_get_or(config, "style", "briefly as you can"));
    promptd_dynamic_context(p, "@NAME@:cwd", 50, cwd, NULL);
    /* It reads the fact `cwd` only: asked again only when that changes. */
    static const char *const READS[] = {"cwd"};
    promptd_reads(p, READS, 1, 0, false);
}

PROMPTD_EXPORT_PLUGIN(declare)

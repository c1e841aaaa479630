/* Example promptd plugin in C. Build: sdk/c/build.sh sdk/c/examples/hello c_hello.wasm */
#include <inttypes.h>

#include "promptd.h"

static const char ECHO_PARAMETERS[] =
    "{\"type\":\"object\",\"properties\":{\"text\":{\"type\":\"string\"}},\"required\":[\"text\"]}";

static void step_context(const promptd_step *step, promptd_out *out, void *user) {
    (void)user;
    promptd_out_textf(out, "step %" PRIu64 " for %s", step->step_number, step->agent);
}

static void declare(const promptd_config *config, promptd_plugin *p) {
    promptd_section(p, "hello", 10, "Hello from C, {{who}}.");
    promptd_variable(p, "who", promptd_config_get_or(config, "who", "world"));
    promptd_dynamic_context(p, "lang:step", 50, step_context, NULL);
    promptd_tool(p, "c_echo", "Echoes its `text` parameter back.", ECHO_PARAMETERS);
}

PROMPTD_EXPORT_PLUGIN(declare)

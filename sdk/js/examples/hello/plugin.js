// Example promptd plugin in JavaScript. Build: sdk/js/build.sh sdk/js/examples/hello js_hello.wasm
import { Plugin, exportPlugin } from "promptd-sdk";

const ECHO_PARAMETERS = {
  type: "object",
  properties: { text: { type: "string" } },
  required: ["text"],
};

export const { declare, evaluate, review } = exportPlugin(
  (config) =>
    new Plugin()
      .section("hello", 10, "Hello from JavaScript, {{who}}.")
      .variable("who", config.getOr("who", "world"))
      .dynamicContext("lang:step", 50, (step) => `step ${step.stepNumber} for ${step.agent}`)
      .tool("js_echo", "Echoes its `text` parameter back.", ECHO_PARAMETERS),
);

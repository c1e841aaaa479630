// The `@NAME@` promptd plugin. Build it with `promptd plugin build` (gives @NAME@.wasm).
import { Plugin, exportPlugin } from "promptd-sdk";

// componentize-js finds each world export by name, so all three are exported here.
export const { declare, evaluate, review } = exportPlugin(
  (config) =>
    new Plugin()
      .section("@NAME@:rules", 50, "Answer as {{@NAME@_style}}.")
      .variable("@NAME@_style", config.getOr("style", "briefly as you can"))
      .dynamicContext("@NAME@:cwd", 50, (step) => {
        const cwd = step.fact("cwd");
        return cwd === undefined ? "" : `Working in ${cwd}.`;
      })
      // It reads the fact `cwd` only: asked again only when that changes.
      .reads({ facts: ["cwd"] }),
);

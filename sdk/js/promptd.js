// Write a promptd plugin in JavaScript.
//
// A plugin is a function from its config to a `Plugin`: a builder of sections, contexts,
// variables and tools. Static text is sent to the host once, at load; dynamic parts are
// functions the host calls at each assembly with the `Step`. You never touch the WIT bindings.
//
//   import { Plugin, exportPlugin } from "./promptd.js";
//
//   export const { declare, sectionText, contextText, variableValue, shownTools } =
//     exportPlugin((config) =>
//       new Plugin()
//         .section("deployment:persona", 0, "You are {{name}}.")
//         .variable("name", config.getOr("name", "a helpful assistant"))
//         .dynamicContext("clock", 50, (step) => `Today is ${step.fact("date") ?? "unknown"}.`));
//
// Build with `sdk/js/build.sh DIR OUT.wasm` (componentize-js against wit/). The plugin's id is
// the file name without `.wasm`.
//
// The mapping to the WIT world (promptd:plugin@0.1.0, world `plugin`) lives in this file only:
// componentize-js calls the five named exports that `exportPlugin` returns, with WIT values in
// their JS shapes (records as camelCase objects, variants as `{ tag, val }`, u64 as BigInt,
// tuples as arrays, `result` errors as thrown values).

import { log as hostLog } from "promptd:plugin/host@0.1.0";

/** Plugin config: the key/value strings of the plugin's `[plugins.NAME] config` table. */
export class Config {
  /** @param {Array<[string, string]>} pairs */
  constructor(pairs = []) {
    /** @type {Map<string, string>} */
    this.values = new Map(pairs);
  }
  /** The value of `key`, or undefined. */
  get(key) {
    return this.values.get(key);
  }
  /** The value of `key`, or `fallback` when the config does not set it. */
  getOr(key, fallback) {
    return this.values.has(key) ? this.values.get(key) : fallback;
  }
  /** All [key, value] pairs, sorted by key. */
  entries() {
    return [...this.values.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  }
}

/** What the host knows about the step being assembled. */
export class Step {
  constructor(wit) {
    /** The agent the request is for. */
    this.agent = wit.agent;
    /** `global`, the agent's ancestors, the agent. */
    this.scopeChain = wit.scopeChain;
    /** The session id; empty outside a session. */
    this.sessionId = wit.sessionId;
    /** The step number in the session (from 1); 0 outside a session. A Number (WIT u64). */
    this.stepNumber = Number(wit.stepNumber);
    /** Step facts from the client (cwd, git branch...), as a plain object. */
    this.facts = Object.fromEntries(wit.facts);
    /**
     * The same facts as `[key, value]` pairs in the host's order (sorted by key bytes, as in
     * every SDK). Iterate these rather than `facts`: a JS object lists integer-like keys first.
     */
    this.factEntries = wit.facts.map(([key, value]) => [key, value]);
  }
  /** One step fact, or undefined if the client did not send it. */
  fact(key) {
    return Object.prototype.hasOwnProperty.call(this.facts, key) ? this.facts[key] : undefined;
  }
}

const GLOBAL = { tag: "global" };
const DYNAMIC = Symbol("dynamic");

function checkFn(what, f) {
  if (typeof f !== "function") throw new TypeError(`${what}: expected a function`);
  return f;
}

/**
 * Everything a plugin contributes. Methods add one item each and return `this`;
 * `scope(agent)` and `complete()` change the item added last.
 */
export class Plugin {
  constructor() {
    this.sections = [];
    this.contexts = [];
    this.variables = [];
    this.tools = [];
    this.shownToolsFn = null;
    this.last = null;
    this.misuse = null;
  }

  /** A static section of the system prompt; `{{name}}` references are interpolated by the host. */
  section(name, order, text) {
    return this.#push(this.sections, { name, order, text: String(text), complete: false });
  }
  /** A section whose text `f(step)` computes at each assembly. */
  dynamicSection(name, order, f) {
    return this.#push(this.sections, { name, order, fn: checkFn(name, f), complete: false });
  }
  /** A static part of the runtime context snapshot (a user message, not system). */
  context(name, order, text) {
    return this.#push(this.contexts, { name, order, text: String(text) });
  }
  /** A runtime context part `f(step)` computes at each assembly; "" contributes nothing. */
  dynamicContext(name, order, f) {
    return this.#push(this.contexts, { name, order, fn: checkFn(name, f) });
  }
  /** A variable for `{{name}}`; names match `^[a-z][a-z0-9_]*$`. */
  variable(name, value) {
    return this.#push(this.variables, { name, text: String(value) });
  }
  /** A variable `f(step)` computes when referenced; null/undefined means "no value this assembly". */
  dynamicVariable(name, f) {
    return this.#push(this.variables, { name, fn: checkFn(name, f) });
  }
  /**
   * A tool the plugin knows. `parameters` is a JSON Schema object, as JSON text or as an
   * object (which is serialised with JSON.stringify).
   */
  tool(name, description, parameters) {
    const params = typeof parameters === "string" ? parameters : JSON.stringify(parameters);
    return this.#push(this.tools, { name, description, parameters: params });
  }
  /** Chooses, per assembly, which known tools are shown: `f(step)` returns their names. */
  showTools(f) {
    this.shownToolsFn = checkFn("showTools", f);
    return this;
  }
  /** Makes the item added last visible only to `agent` (and the agents below it). */
  scope(agent) {
    if (!this.last) this.misuse ??= "scope() called before any item was added";
    else this.last.scope = { tag: "agent", val: String(agent) };
    return this;
  }
  /** Marks the section added last as complete: it replaces every other section. */
  complete() {
    if (!this.last || this.last.kind !== this.sections) {
      this.misuse ??= "complete() applies to a section only";
    } else this.last.complete = true;
    return this;
  }

  #push(list, item) {
    item.scope = GLOBAL;
    item.kind = list;
    list.push(item);
    this.last = item;
    return this;
  }
}

/** Writes a line to the host's log, tagged with this plugin's id. */
export const log = {
  trace: (m) => hostLog("trace", String(m)),
  debug: (m) => hostLog("debug", String(m)),
  info: (m) => hostLog("info", String(m)),
  warn: (m) => hostLog("warn", String(m)),
  error: (m) => hostLog("error", String(m)),
};

// ---- glue to the WIT world ----

/** An error for a WIT `result` err: componentize-js takes the payload of a thrown value. */
function errorMessage(e) {
  if (e instanceof Error) return e.message || String(e);
  return typeof e === "string" ? e : String(e);
}

function sameScope(a, b) {
  return a.tag === b.tag && (a.tag !== "agent" || a.val === b.val);
}

function content(item) {
  return item.fn ? { tag: "dynamic" } : { tag: "static-text", val: item.text };
}

function checkString(kind, name, v) {
  if (typeof v !== "string") {
    throw `${kind} \`${name}\`: the function returned ${typeof v}, expected a string`;
  }
  return v;
}

/**
 * Turns `declareFn(config) -> Plugin` into the five world exports. Use as
 * `export const { declare, sectionText, contextText, variableValue, shownTools } = exportPlugin(fn);`
 */
export function exportPlugin(declareFn) {
  checkFn("exportPlugin", declareFn);
  let plugin = null;

  // Runs `f`, turning anything thrown into the string a WIT `result` error carries.
  const guard = (f) => {
    try {
      return f();
    } catch (e) {
      throw errorMessage(e);
    }
  };
  const current = () => {
    if (!plugin) throw "the plugin was called before declare";
    return plugin;
  };
  const find = (list, kind, name, scope) => {
    const item = list.find((i) => i.name === name && sameScope(i.scope, scope));
    if (!item || !item.fn) throw `no dynamic ${kind} \`${name}\` is declared`;
    return item;
  };

  return {
    declare(config) {
      return guard(() => {
        const p = declareFn(new Config(config));
        if (!(p instanceof Plugin)) throw "declare must return a Plugin";
        if (p.misuse) throw p.misuse;
        const declaration = {
          sections: p.sections.map((s) => ({
            name: s.name,
            order: s.order,
            text: content(s),
            complete: s.complete,
            scope: s.scope,
          })),
          contexts: p.contexts.map((c) => ({
            name: c.name,
            order: c.order,
            text: content(c),
            scope: c.scope,
          })),
          variables: p.variables.map((v) => ({ name: v.name, value: content(v), scope: v.scope })),
          tools: p.tools.map((t) => ({
            name: t.name,
            description: t.description,
            parameters: t.parameters,
            scope: t.scope,
          })),
          filtersTools: p.shownToolsFn !== null,
        };
        plugin = p;
        return declaration;
      });
    },
    sectionText(name, scope, step) {
      return guard(() => {
        const item = find(current().sections, "section", name, scope);
        return checkString("section", name, item.fn(new Step(step)));
      });
    },
    contextText(name, scope, step) {
      return guard(() => {
        const item = find(current().contexts, "context", name, scope);
        return checkString("context", name, item.fn(new Step(step)));
      });
    },
    variableValue(name, scope, step) {
      return guard(() => {
        const item = find(current().variables, "variable", name, scope);
        const v = item.fn(new Step(step));
        return v === null || v === undefined ? undefined : checkString("variable", name, v);
      });
    },
    shownTools(step) {
      return guard(() => {
        const p = current();
        if (!p.shownToolsFn) throw "this plugin does not filter its tools";
        const names = p.shownToolsFn(new Step(step));
        if (!Array.isArray(names)) throw "showTools: the function must return an array of names";
        return names.map(String);
      });
    },
  };
}

// Write a promptd plugin in JavaScript.
//
// A plugin is a function from its config to a `Plugin`: a builder of sections, contexts,
// variables and tools. Static text is sent to the host once, at load; dynamic parts are
// functions the host calls at each assembly with the `Step`. A dynamic part may say what it
// reads of the step (`reads`), so that in a session the host asks again only when that changed;
// sections and tools may say when a change reaches the model (`refresh`), tools that they are
// found through the provider's tool search (`defer`). A plugin may also review each session
// step's new messages (`review`). You never touch the WIT bindings.
//
//   import { Plugin, Verdict, exportPlugin } from "./promptd.js";
//
//   export const { declare, evaluate, review } = exportPlugin((config) =>
//     new Plugin()
//       .section("deployment:persona", 0, "You are {{name}}.")
//       .variable("name", config.getOr("name", "a helpful assistant"))
//       .dynamicContext("clock", 50, (step) => `Today is ${step.fact("date") ?? "unknown"}.`)
//       .reads({ facts: ["date"] })
//       .dynamicContext("docs:found", 60, (step) => step.fact("document") ?? "")
//       .verbatim()
//       .review(0, (step, input) =>
//         input.anyTextContains("password")
//           ? Verdict.redact([["password", "[redacted]"]])
//           : Verdict.accept()));
//
// Build with `sdk/js/build.sh DIR OUT.wasm` (componentize-js against wit/). The plugin's id is
// the file name without `.wasm`.
//
// The mapping to the WIT world (promptd:plugin@0.3.0, world `plugin`) lives in this file (and in
// the small bundle entry build.sh writes):
// componentize-js calls the three named exports that `exportPlugin` returns (`declare`,
// `evaluate`, `review`), with WIT values in their JS shapes (records as camelCase objects,
// variants as `{ tag, val }`, enums as their WIT names (strings), flags as an object of
// booleans under camelCase names, `option` as the value or undefined, u64 as BigInt, tuples as
// arrays, a returned `result` as a value or a thrown error, a `result` inside a value as
// `{ tag: "ok" | "err", val }`).
//
// A plugin written for 0.2.0 builds unchanged and declares what it did: no `reads` (its calls
// are shown the whole step, at every step), no `refresh` (`step`), no `defer`. Plugins written
// for 0.1.0 export the old five names (`declare, sectionText, contextText, variableValue,
// shownTools`); build.sh then takes `evaluate` and `review` from the exported `declare` (see
// `WORLD` below), so they build unchanged.

import { log as hostLog } from "promptd:plugin/host@0.3.0";

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

/**
 * What the host knows about the step being assembled, as far as the call reads it: with
 * `reads`, a call is shown only the facts and inputs its wanted items read (a review is shown
 * everything).
 */
export class Step {
  constructor(wit) {
    /** The agent the request is for. */
    this.agent = wit.agent;
    /** `global`, the agent's ancestors, the agent. */
    this.scopeChain = wit.scopeChain;
    /** The session id; empty outside a session. */
    this.sessionId = wit.sessionId;
    /**
     * The step number in the session (from 1); 0 outside a session, and 0 when no wanted item
     * reads `step-number`. A Number (WIT u64).
     */
    this.stepNumber = Number(wit.stepNumber);
    /** Step facts from the client (cwd, git branch...) that the wanted items read, as an object. */
    this.facts = Object.fromEntries(wit.facts);
    /**
     * The same facts as `[key, value]` pairs in the host's order (sorted by key bytes, as in
     * every SDK). Iterate these rather than `facts`: a JS object lists integer-like keys first.
     */
    this.factEntries = wit.facts.map(([key, value]) => [key, value]);
    /**
     * The text of the session's last user message (its text blocks joined by a blank line);
     * undefined unless read (`last-user-message`) and there is one.
     */
    this.lastUserMessage = wit.lastUserMessage ?? undefined;
    /** The model the request is for; undefined unless read (`model`) and known. */
    this.model = wit.model ?? undefined;
    /**
     * The names of the tools the client sent, in its order (empty when it sent none);
     * undefined unless read (`client-tools`).
     */
    this.clientTools = wit.clientTools == null ? undefined : [...wit.clientTools];
    /**
     * How many user messages the session holds, this step's included; undefined unless read
     * (`turn-count`). A Number (WIT u64).
     */
    this.turnCount = wit.turnCount == null ? undefined : Number(wit.turnCount);
  }
  /** One step fact, or undefined if the client did not send it (or no wanted item reads it). */
  fact(key) {
    return Object.prototype.hasOwnProperty.call(this.facts, key) ? this.facts[key] : undefined;
  }
}

/** One message the client sent this step, as a review sees it. */
export class Message {
  constructor(wit) {
    /** `user`, `assistant` or `tool`. */
    this.role = wit.role;
    /**
     * Its texts in order: a text content is one entry, a block content one per text block
     * (images and documents give none), an assistant's reply its text (empty when it only
     * calls tools).
     */
    this.texts = [...wit.texts];
    /** The call a `tool` message answers; empty for the other roles. */
    this.toolCallId = wit.toolCallId;
  }
}

/** What a review is shown: the step's new messages and what assembly made of the step. */
export class ReviewInput {
  constructor(wit) {
    /** The step's new messages, as `Message`s. */
    this.messages = wit.messages.map((m) => new Message(m));
    /** The assembled system prompt. */
    this.system = wit.system;
    /** The assembled runtime context snapshot, or undefined when there is none. */
    this.runtimeContext = wit.runtimeContext ?? undefined;
    /** The names of the tools shown this step, in order. */
    this.tools = [...wit.tools];
  }
  /** Every text of every message, in order. */
  texts() {
    return this.messages.flatMap((m) => m.texts);
  }
  /** Whether any text of any message contains `needle`. */
  anyTextContains(needle) {
    return this.messages.some((m) => m.texts.some((t) => t.includes(needle)));
  }
}

/**
 * What a review decides; a review function returns one of these.
 *
 *   Verdict.accept()                              the step goes on unchanged
 *   Verdict.reject("why")                         the step fails (HTTP 422 with this reason)
 *   Verdict.redact([["hunter2", "[redacted]"]])   replacements made, in order, in the texts of
 *                                                 the new user and tool messages
 *
 * `redact` takes `[find, replace]` pairs or `{ find, replace }` objects; `find` must not be
 * empty.
 */
export const Verdict = Object.freeze({
  accept: () => ({ tag: "accept" }),
  reject: (reason) => ({ tag: "reject", val: String(reason) }),
  redact: (redactions) => {
    if (!Array.isArray(redactions)) throw new TypeError("Verdict.redact: expected an array");
    return {
      tag: "redact",
      val: redactions.map((r) => {
        const [find, replace] = Array.isArray(r) ? r : [r?.find, r?.replace];
        if (typeof find !== "string" || typeof replace !== "string") {
          throw new TypeError("Verdict.redact: expected [find, replace] pairs of strings");
        }
        return { find, replace };
      }),
    };
  },
});

const GLOBAL = { tag: "global" };
const DYNAMIC = Symbol("dynamic");

function checkFn(what, f) {
  if (typeof f !== "function") throw new TypeError(`${what}: expected a function`);
  return f;
}

/** The request inputs `reads` may name (the WIT flags `inputs`), and their camelCase keys. */
const INPUTS = new Map([
  ["last-user-message", "lastUserMessage"],
  ["model", "model"],
  ["client-tools", "clientTools"],
  ["step-number", "stepNumber"],
  ["turn-count", "turnCount"],
]);
const INPUT_NAMES = "last-user-message, model, client-tools, step-number or turn-count";
/** The words `refresh` takes (the WIT enum `refresh`). */
const REFRESH = ["step", "boundary", "session"];

/**
 * Checks what `reads(spec)` or `readsByDefault(spec)` was given: `{ facts, inputs, volatile }`,
 * each optional (no facts, no inputs, not volatile). Returns `{ reads }` or `{ misuse }`.
 */
function checkReads(what, spec) {
  if (spec === null || typeof spec !== "object" || Array.isArray(spec)) {
    return { misuse: `${what}: expected { facts: [...], inputs: [...], volatile: true | false }` };
  }
  for (const key of Object.keys(spec)) {
    if (key !== "facts" && key !== "inputs" && key !== "volatile") {
      return { misuse: `${what}: unknown key \`${key}\` (expected facts, inputs, volatile)` };
    }
  }
  const { facts = [], inputs = [], volatile = false } = spec;
  if (!Array.isArray(facts) || !facts.every((f) => typeof f === "string")) {
    return { misuse: `${what}: \`facts\` must be an array of fact names (strings)` };
  }
  if (!Array.isArray(inputs)) {
    return { misuse: `${what}: \`inputs\` must be an array of input names (${INPUT_NAMES})` };
  }
  for (const input of inputs) {
    if (!INPUTS.has(input)) {
      return { misuse: `${what}: unknown input \`${input}\` (expected ${INPUT_NAMES})` };
    }
  }
  if (typeof volatile !== "boolean") {
    return { misuse: `${what}: \`volatile\` must be true or false, not \`${volatile}\`` };
  }
  return { reads: { facts: [...facts], inputs: [...inputs], volatile } };
}

/** A checked `reads` as the WIT `option<reads>`: undefined (none) when not given. */
function lowerReads(reads) {
  if (!reads) return undefined;
  const inputs = {};
  for (const [name, key] of INPUTS) inputs[key] = reads.inputs.includes(name);
  return { facts: [...reads.facts], inputs, volatile: reads.volatile };
}

/**
 * Everything a plugin contributes. Methods add one item each and return `this`;
 * `scope(agent)`, `complete()`, `verbatim()`, `reads(spec)`, `refresh(word)` and `defer()`
 * change the item added last. Misuse (e.g. `defer()` after a section, an unknown input name)
 * refuses the plugin at declare with a message saying what was wrong.
 */
export class Plugin {
  constructor() {
    this.sections = [];
    this.contexts = [];
    this.variables = [];
    this.tools = [];
    this.shownToolsFn = null;
    this.reviewOrder = undefined;
    this.reviewFn = null;
    this.defaultReads = undefined;
    this.last = null;
    this.misuse = null;
  }

  /** A static section of the system prompt; `{{name}}` references are interpolated by the host. */
  section(name, order, text) {
    return this.#push(this.sections, {
      name,
      order,
      text: String(text),
      complete: false,
      verbatim: false,
    });
  }
  /** A section whose text `f(step)` computes at each assembly. */
  dynamicSection(name, order, f) {
    return this.#push(this.sections, {
      name,
      order,
      fn: checkFn(name, f),
      complete: false,
      verbatim: false,
    });
  }
  /** A static part of the runtime context snapshot (a user message, not system). */
  context(name, order, text) {
    return this.#push(this.contexts, { name, order, text: String(text), verbatim: false });
  }
  /** A runtime context part `f(step)` computes at each assembly; "" contributes nothing. */
  dynamicContext(name, order, f) {
    return this.#push(this.contexts, { name, order, fn: checkFn(name, f), verbatim: false });
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
    return this.#push(this.tools, { name, description, parameters: params, defer: false });
  }
  /**
   * Chooses, per assembly, which known tools are shown: `f(step)` returns their names. It is
   * shown what `readsByDefault` says (without it, the whole step).
   */
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
  /**
   * Marks the section or context added last as verbatim: the host uses its text exactly as
   * given, `{{` and all, and never interpolates a variable (a secret) into it. For text the
   * plugin did not write itself: retrieved documents, tool output, web pages.
   */
  verbatim() {
    if (!this.last || (this.last.kind !== this.sections && this.last.kind !== this.contexts)) {
      this.misuse ??= "verbatim() applies to a section or context only";
    } else this.last.verbatim = true;
    return this;
  }
  /**
   * Says what the dynamic section, context or variable added last reads of the step:
   * `{ facts: ["task"], inputs: ["last-user-message"], volatile: false }`. Every key is
   * optional (no facts, no inputs, not volatile). Its function is then shown only those facts
   * and inputs (with the others its wanted neighbours read), and in a session the host calls
   * it again only when one of them changed, unless `volatile` (its answer depends on
   * something else too: the clock, a file). Inputs: `last-user-message`, `model`,
   * `client-tools`, `step-number`, `turn-count`. Without it, the item reads what
   * `readsByDefault` says.
   */
  reads(spec) {
    if (!this.last || !this.last.fn) {
      this.misuse ??= "reads() applies to a dynamic section, context or variable only";
      return this;
    }
    const { reads, misuse } = checkReads("reads()", spec);
    if (misuse) this.misuse ??= misuse;
    else this.last.reads = reads;
    return this;
  }
  /**
   * What the plugin's dynamic items read unless one says (`reads`), and what `showTools`
   * reads; same shape as `reads`. Without it: the whole step, at every step.
   */
  readsByDefault(spec) {
    const { reads, misuse } = checkReads("readsByDefault()", spec);
    if (misuse) this.misuse ??= misuse;
    else this.defaultReads = reads;
    return this;
  }
  /**
   * When a change to the section or tool added last reaches the model: `"step"` (the
   * default: the session's next step), `"boundary"` (the session's next cache-cold point, or
   * after the operator's `max_stale_s`) or `"session"` (never within a session; a new session
   * starts with the current text). The operator's config overrides it.
   */
  refresh(word) {
    if (!this.last || (this.last.kind !== this.sections && this.last.kind !== this.tools)) {
      this.misuse ??= "refresh() applies to a section or tool only";
    } else if (!REFRESH.includes(word)) {
      this.misuse ??= `refresh(): unknown refresh \`${word}\` (expected step, boundary or session)`;
    } else this.last.refresh = word;
    return this;
  }
  /**
   * Defers the tool added last: it is sent for the provider's tool search to find, not in
   * every request's cached prefix. The operator's config overrides it.
   */
  defer() {
    if (!this.last || this.last.kind !== this.tools) {
      this.misuse ??= "defer() applies to a tool only";
    } else this.last.defer = true;
    return this;
  }
  /**
   * Reviews every session step: `f(step, input)` sees the step's new messages and the
   * assembled request (a `ReviewInput`) and returns a `Verdict`. Hooks of all plugins run one
   * after another, sorted by (`order`, plugin id); `order` is an integer (WIT s32).
   */
  review(order, f) {
    if (!Number.isInteger(order) || order < -(2 ** 31) || order >= 2 ** 31) {
      this.misuse ??= `review(): the order must be an integer from ${-(2 ** 31)} to ${2 ** 31 - 1}`;
    }
    this.reviewOrder = order;
    this.reviewFn = checkFn("review", f);
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

function checkVerdict(v) {
  const ok =
    v !== null &&
    typeof v === "object" &&
    (v.tag === "accept" ||
      (v.tag === "reject" && typeof v.val === "string") ||
      (v.tag === "redact" &&
        Array.isArray(v.val) &&
        v.val.every((r) => typeof r?.find === "string" && typeof r?.replace === "string")));
  if (!ok) {
    throw "review: the function must return Verdict.accept(), Verdict.reject(reason) or Verdict.redact([[find, replace], ...])";
  }
  return v.tag === "accept" ? { tag: "accept" } : v;
}

/**
 * Where build.sh finds `evaluate` and `review` when the entry module does not export them: a
 * plugin written for 0.1.0 exports `declare` and the four per-item names, which 0.2.0 and
 * later no longer have. exportPlugin puts the three world functions on its `declare` under
 * this key.
 */
export const WORLD = Symbol.for("promptd-sdk.world");

/**
 * Turns `declareFn(config) -> Plugin` into the three world exports. Use as
 * `export const { declare, evaluate, review } = exportPlugin(fn);`
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

  const shownTools = (p, step) => {
    try {
      if (!p.shownToolsFn) throw "this plugin does not filter its tools";
      const names = p.shownToolsFn(new Step(step));
      if (!Array.isArray(names)) throw "showTools: the function must return an array of names";
      return { tag: "ok", val: names.map(String) };
    } catch (e) {
      return { tag: "err", val: errorMessage(e) };
    }
  };

  const world = {
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
            verbatim: s.verbatim,
            reads: lowerReads(s.reads),
            refresh: s.refresh,
          })),
          contexts: p.contexts.map((c) => ({
            name: c.name,
            order: c.order,
            text: content(c),
            scope: c.scope,
            verbatim: c.verbatim,
            reads: lowerReads(c.reads),
          })),
          variables: p.variables.map((v) => ({
            name: v.name,
            value: content(v),
            scope: v.scope,
            reads: lowerReads(v.reads),
          })),
          tools: p.tools.map((t) => ({
            name: t.name,
            description: t.description,
            parameters: t.parameters,
            scope: t.scope,
            refresh: t.refresh,
            defer: t.defer,
          })),
          filtersTools: p.shownToolsFn !== null,
          reviewOrder: p.reviewFn ? p.reviewOrder : undefined,
          reads: lowerReads(p.defaultReads),
        };
        plugin = p;
        return declaration;
      });
    },
    evaluate(step, wanted) {
      return guard(() => {
        const p = current();
        // One fresh Step per item, as when the host called once per item (0.1.0).
        const each = (items, f) =>
          items.map(({ name, scope }) => {
            try {
              return { tag: "ok", val: f(name, scope, new Step(step)) };
            } catch (e) {
              return { tag: "err", val: errorMessage(e) };
            }
          });
        return {
          sections: each(wanted.sections, (name, scope, st) =>
            checkString("section", name, find(p.sections, "section", name, scope).fn(st)),
          ),
          contexts: each(wanted.contexts, (name, scope, st) =>
            checkString("context", name, find(p.contexts, "context", name, scope).fn(st)),
          ),
          variables: each(wanted.variables, (name, scope, st) => {
            const v = find(p.variables, "variable", name, scope).fn(st);
            return v === null || v === undefined ? undefined : checkString("variable", name, v);
          }),
          shownTools: wanted.shownTools ? shownTools(p, step) : undefined,
        };
      });
    },
    review(step, input) {
      return guard(() => {
        const p = current();
        if (!p.reviewFn) return { tag: "accept" };
        return checkVerdict(p.reviewFn(new Step(step), new ReviewInput(input)));
      });
    },
  };
  Object.defineProperty(world.declare, WORLD, { value: world });
  return world;
}

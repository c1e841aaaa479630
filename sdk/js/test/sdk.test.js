// Unit tests of promptd.js under Node, with WIT values in the shapes componentize-js gives and
// takes (records as camelCase objects, variants as { tag, val }, enums as strings, flags as an
// object of camelCase booleans, option as value or undefined, u64 as BigInt). Run: sdk/js/test.sh
import { test } from "node:test";
import assert from "node:assert/strict";

import { Plugin, ReviewInput, Verdict, WORLD, exportPlugin, log } from "promptd-sdk";
import { logged } from "./host-stub.js";

const G = { tag: "global" };
const agent = (name) => ({ tag: "agent", val: name });
const item = (name, scope = G) => ({ name, scope });
const STEP = {
  agent: "coder",
  scopeChain: ["global", "coder"],
  sessionId: "s",
  stepNumber: 7n,
  facts: [
    ["10", "ten"],
    ["echo", "{{x}}"],
  ],
};
const NOTHING = { sections: [], contexts: [], variables: [], shownTools: false };
const INPUT = {
  messages: [
    { role: "user", texts: ["hello", "my hunter2"], toolCallId: "" },
    { role: "tool", texts: [], toolCallId: "call-1" },
  ],
  system: "sys",
  runtimeContext: undefined,
  tools: ["a"],
};

/** The error a world export throws: the string componentize-js puts in the result's err. */
function thrown(f) {
  try {
    f();
  } catch (e) {
    return e;
  }
  assert.fail("expected a throw");
}

test("declare carries verbatim and review-order", () => {
  const w = exportPlugin(() =>
    new Plugin()
      .section("s", 1, "S {{x}}")
      .verbatim()
      .dynamicSection("d", 2, () => "")
      .context("c", 3, "C")
      .dynamicContext("dc", 4, () => "")
      .verbatim()
      .scope("coder")
      .review(-5, () => Verdict.accept()),
  );
  const d = w.declare([]);
  assert.deepEqual(
    d.sections.map((s) => [s.name, s.verbatim, s.complete]),
    [
      ["s", true, false],
      ["d", false, false],
    ],
  );
  assert.deepEqual(
    d.contexts.map((c) => [c.name, c.verbatim, c.scope]),
    [
      ["c", false, G],
      ["dc", true, agent("coder")],
    ],
  );
  assert.equal(d.reviewOrder, -5);
  assert.equal(d.filtersTools, false);
});

test("without a review hook, review-order is none and review accepts", () => {
  const w = exportPlugin(() => new Plugin().section("s", 1, "S"));
  assert.equal(w.declare([]).reviewOrder, undefined);
  assert.deepEqual(w.review(STEP, INPUT), { tag: "accept" });
});

test("misuse refuses the plugin at declare", () => {
  const refused = (build) => thrown(() => exportPlugin(() => build(new Plugin())).declare([]));
  assert.equal(refused((p) => p.verbatim()), "verbatim() applies to a section or context only");
  assert.equal(
    refused((p) => p.variable("v", "x").verbatim()),
    "verbatim() applies to a section or context only",
  );
  assert.equal(
    refused((p) => p.tool("t", "d", {}).verbatim()),
    "verbatim() applies to a section or context only",
  );
  assert.match(refused((p) => p.review(1.5, () => Verdict.accept())), /^review\(\): the order/);
  assert.match(refused((p) => p.review(2 ** 31, () => Verdict.accept())), /^review\(\): the order/);
  assert.throws(() => new Plugin().review(0, "not a function"), TypeError);
});

test("evaluate answers item by item, in order, with the old per-item errors", () => {
  const w = exportPlugin(() =>
    new Plugin()
      .section("static", 0, "x")
      .dynamicSection("echo", 1, (step) => `Echo: ${step.fact("echo")}`)
      .verbatim()
      .dynamicSection("boom", 2, () => {
        throw new Error("it broke");
      })
      .dynamicSection("bad", 3, () => 42)
      .dynamicSection("mine", 4, (step) => step.agent)
      .scope("coder")
      .dynamicContext("ctx", 5, (step) => `step ${step.stepNumber} ${step.factEntries.flat().join(",")}`)
      .dynamicContext("thrown-string", 6, () => {
        throw "plain";
      })
      .dynamicVariable("v", (step) => step.fact("missing"))
      .dynamicVariable("w", () => null)
      .dynamicVariable("x", () => "value")
      .variable("fixed", "f"),
  );
  w.declare([]);
  const got = w.evaluate(STEP, {
    sections: [
      item("echo"),
      item("boom"),
      item("bad"),
      item("static"),
      item("nope"),
      item("mine"),
      item("mine", agent("coder")),
    ],
    contexts: [item("ctx"), item("thrown-string")],
    variables: [item("v"), item("w"), item("x"), item("fixed")],
    shownTools: false,
  });
  assert.deepEqual(got, {
    sections: [
      { tag: "ok", val: "Echo: {{x}}" },
      { tag: "err", val: "it broke" },
      { tag: "err", val: "section `bad`: the function returned number, expected a string" },
      { tag: "err", val: "no dynamic section `static` is declared" },
      { tag: "err", val: "no dynamic section `nope` is declared" },
      { tag: "err", val: "no dynamic section `mine` is declared" },
      { tag: "ok", val: "coder" },
    ],
    contexts: [
      { tag: "ok", val: "step 7 10,ten,echo,{{x}}" },
      { tag: "err", val: "plain" },
    ],
    variables: [
      { tag: "ok", val: undefined },
      { tag: "ok", val: undefined },
      { tag: "ok", val: "value" },
      { tag: "err", val: "no dynamic variable `fixed` is declared" },
    ],
    shownTools: undefined,
  });
});

test("shown-tools is some exactly when asked", () => {
  const filtering = exportPlugin(() =>
    new Plugin()
      .tool("a", "A", { type: "object" })
      .tool("b", "B", "{}")
      .showTools((step) => (step.fact("echo") ? ["a"] : ["a", "b"])),
  );
  assert.equal(filtering.declare([]).filtersTools, true);
  assert.equal(filtering.evaluate(STEP, NOTHING).shownTools, undefined);
  assert.deepEqual(filtering.evaluate(STEP, { ...NOTHING, shownTools: true }).shownTools, {
    tag: "ok",
    val: ["a"],
  });

  const plain = exportPlugin(() => new Plugin().tool("a", "A", {}));
  plain.declare([]);
  assert.deepEqual(plain.evaluate(STEP, { ...NOTHING, shownTools: true }).shownTools, {
    tag: "err",
    val: "this plugin does not filter its tools",
  });

  const bad = exportPlugin(() => new Plugin().showTools(() => "a"));
  bad.declare([]);
  assert.deepEqual(bad.evaluate(STEP, { ...NOTHING, shownTools: true }).shownTools, {
    tag: "err",
    val: "showTools: the function must return an array of names",
  });
});

test("each item gets its own Step, as with one call per item", () => {
  const w = exportPlugin(() =>
    new Plugin()
      .dynamicSection("a", 0, (step) => {
        step.facts.echo = "changed";
        return step.fact("echo");
      })
      .dynamicSection("b", 1, (step) => step.fact("echo")),
  );
  w.declare([]);
  const got = w.evaluate(STEP, { ...NOTHING, sections: [item("a"), item("b")] });
  assert.deepEqual(got.sections, [
    { tag: "ok", val: "changed" },
    { tag: "ok", val: "{{x}}" },
  ]);
});

test("called before declare, every export fails as a whole", () => {
  const w = exportPlugin(() => new Plugin());
  assert.equal(thrown(() => w.evaluate(STEP, NOTHING)), "the plugin was called before declare");
  assert.equal(thrown(() => w.review(STEP, INPUT)), "the plugin was called before declare");
});

test("review sees the input and returns the verdict", () => {
  let seen = null;
  const w = exportPlugin(() =>
    new Plugin().review(0, (step, input) => {
      seen = { step, input };
      if (input.anyTextContains("forbidden")) return Verdict.reject('mentions "forbidden"');
      if (input.anyTextContains("hunter2")) return Verdict.redact([["hunter2", "[redacted]"]]);
      return Verdict.accept();
    }),
  );
  assert.equal(w.declare([]).reviewOrder, 0);
  assert.deepEqual(w.review(STEP, INPUT), {
    tag: "redact",
    val: [{ find: "hunter2", replace: "[redacted]" }],
  });
  assert.ok(seen.input instanceof ReviewInput);
  assert.equal(seen.step.stepNumber, 7);
  assert.deepEqual(seen.input.texts(), ["hello", "my hunter2"]);
  assert.deepEqual(
    seen.input.messages.map((m) => [m.role, m.toolCallId]),
    [
      ["user", ""],
      ["tool", "call-1"],
    ],
  );
  assert.equal(seen.input.system, "sys");
  assert.equal(seen.input.runtimeContext, undefined);
  assert.deepEqual(seen.input.tools, ["a"]);

  const forbidden = { ...INPUT, messages: [{ role: "user", texts: ["forbidden"], toolCallId: "" }] };
  assert.deepEqual(w.review(STEP, forbidden), { tag: "reject", val: 'mentions "forbidden"' });
  const fine = { ...INPUT, messages: [], runtimeContext: "rc" };
  assert.deepEqual(w.review(STEP, fine), { tag: "accept" });
  assert.equal(seen.input.runtimeContext, "rc");
});

test("review errors fail the call with their message", () => {
  const returning = (v) => {
    const w = exportPlugin(() => new Plugin().review(0, () => v));
    w.declare([]);
    return thrown(() => w.review(STEP, INPUT));
  };
  const wrong = /^review: the function must return Verdict\.accept\(\)/;
  assert.match(returning(undefined), wrong);
  assert.match(returning("accept"), wrong);
  assert.match(returning({ tag: "redact", val: [["a", "b"]] }), wrong);
  const throwing = exportPlugin(() =>
    new Plugin().review(0, () => {
      throw new Error("cannot review");
    }),
  );
  throwing.declare([]);
  assert.equal(thrown(() => throwing.review(STEP, INPUT)), "cannot review");
});

test("Verdict helpers", () => {
  assert.deepEqual(Verdict.accept(), { tag: "accept" });
  assert.deepEqual(Verdict.reject("why"), { tag: "reject", val: "why" });
  assert.deepEqual(Verdict.redact([["a", "b"], { find: "c", replace: "" }]), {
    tag: "redact",
    val: [
      { find: "a", replace: "b" },
      { find: "c", replace: "" },
    ],
  });
  assert.throws(() => Verdict.redact("a"), TypeError);
  assert.throws(() => Verdict.redact([["a"]]), TypeError);
});

test("a plugin written for 0.1.0 still finds the world on its declare", () => {
  // What build.sh's bundle entry does for `export const { declare, sectionText, ... } = ...`.
  const { declare, sectionText, contextText, variableValue, shownTools } = exportPlugin(() =>
    new Plugin().dynamicSection("d", 0, () => "D"),
  );
  assert.equal(sectionText ?? contextText ?? variableValue ?? shownTools, undefined);
  const world = declare[WORLD];
  assert.equal(world.declare, declare);
  world.declare([]);
  assert.deepEqual(world.evaluate(STEP, { ...NOTHING, sections: [item("d")] }).sections, [
    { tag: "ok", val: "D" },
  ]);
  assert.deepEqual(world.review(STEP, INPUT), { tag: "accept" });
});

test("a plugin written for 0.2.0 declares no reads, no refresh and no defer", () => {
  const w = exportPlugin(() =>
    new Plugin()
      .section("s", 1, "S")
      .dynamicSection("d", 2, () => "")
      .context("c", 3, "C")
      .dynamicContext("dc", 4, () => "")
      .variable("v", "x")
      .dynamicVariable("dv", () => undefined)
      .tool("t", "T", "{}")
      .showTools(() => ["t"]),
  );
  const none = { reads: undefined };
  assert.deepEqual(w.declare([]), {
    sections: [
      { name: "s", order: 1, text: { tag: "static-text", val: "S" }, complete: false, scope: G,
        verbatim: false, ...none, refresh: undefined },
      { name: "d", order: 2, text: { tag: "dynamic" }, complete: false, scope: G,
        verbatim: false, ...none, refresh: undefined },
    ],
    contexts: [
      { name: "c", order: 3, text: { tag: "static-text", val: "C" }, scope: G, verbatim: false,
        ...none },
      { name: "dc", order: 4, text: { tag: "dynamic" }, scope: G, verbatim: false, ...none },
    ],
    variables: [
      { name: "v", value: { tag: "static-text", val: "x" }, scope: G, ...none },
      { name: "dv", value: { tag: "dynamic" }, scope: G, ...none },
    ],
    tools: [
      { name: "t", description: "T", parameters: "{}", scope: G, refresh: undefined, defer: false },
    ],
    filtersTools: true,
    reviewOrder: undefined,
    ...none,
  });
});

test("reads, readsByDefault, refresh and defer change what is declared", () => {
  // The WIT flags `inputs`, as componentize-js takes them: an object of camelCase booleans.
  const NONE = {
    lastUserMessage: false,
    model: false,
    clientTools: false,
    stepNumber: false,
    turnCount: false,
  };
  const w = exportPlugin(() =>
    new Plugin()
      .readsByDefault({ facts: ["cwd"], inputs: ["model"], volatile: false })
      .section("catalogue", 1, "C")
      .refresh("session")
      .dynamicSection("task", 2, () => "")
      .scope("coder")
      .reads({ facts: ["task"], inputs: [], volatile: false })
      .refresh("boundary")
      .dynamicContext("found", 3, () => "")
      .verbatim()
      .reads({ inputs: ["last-user-message", "turn-count"] })
      .dynamicVariable("now", () => "12:00")
      .reads({ volatile: true })
      .dynamicVariable("plain", () => "p")
      .tool("rare", "R", {})
      .defer()
      .refresh("step")
      .tool("common", "C", {}),
  );
  const d = w.declare([]);
  assert.deepEqual(d.reads, { facts: ["cwd"], inputs: { ...NONE, model: true }, volatile: false });
  assert.deepEqual(
    d.sections.map((s) => [s.name, s.reads, s.refresh, s.scope]),
    [
      ["catalogue", undefined, "session", G],
      ["task", { facts: ["task"], inputs: NONE, volatile: false }, "boundary", agent("coder")],
    ],
  );
  assert.deepEqual(d.contexts[0].reads, {
    facts: [],
    inputs: { ...NONE, lastUserMessage: true, turnCount: true },
    volatile: false,
  });
  assert.equal(d.contexts[0].verbatim, true);
  assert.deepEqual(
    d.variables.map((v) => [v.name, v.reads]),
    [
      ["now", { facts: [], inputs: NONE, volatile: true }],
      ["plain", undefined],
    ],
  );
  assert.deepEqual(
    d.tools.map((t) => [t.name, t.refresh, t.defer]),
    [
      ["rare", "step", true],
      ["common", undefined, false],
    ],
  );
  const every = exportPlugin(() =>
    new Plugin().readsByDefault({
      inputs: ["last-user-message", "model", "client-tools", "step-number", "turn-count"],
    }),
  );
  assert.deepEqual(every.declare([]).reads, {
    facts: [],
    inputs: {
      lastUserMessage: true,
      model: true,
      clientTools: true,
      stepNumber: true,
      turnCount: true,
    },
    volatile: false,
  });
});

test("misuse of reads, refresh and defer refuses the plugin, naming the bad value", () => {
  const refused = (build) => thrown(() => exportPlugin(() => build(new Plugin())).declare([]));
  const reads = { facts: [] };
  const onlyDynamic = "reads() applies to a dynamic section, context or variable only";
  const INPUT_NAMES = "last-user-message, model, client-tools, step-number or turn-count";
  assert.equal(refused((p) => p.reads(reads)), onlyDynamic);
  assert.equal(refused((p) => p.section("s", 0, "S").reads(reads)), onlyDynamic);
  assert.equal(refused((p) => p.context("c", 0, "C").reads(reads)), onlyDynamic);
  assert.equal(refused((p) => p.variable("v", "x").reads(reads)), onlyDynamic);
  assert.equal(refused((p) => p.tool("t", "T", {}).reads(reads)), onlyDynamic);
  const dynamic = (p) => p.dynamicSection("d", 0, () => "");
  assert.equal(
    refused((p) => dynamic(p).reads({ inputs: ["model", "last_user_message"] })),
    `reads(): unknown input \`last_user_message\` (expected ${INPUT_NAMES})`,
  );
  assert.equal(
    refused((p) => p.readsByDefault({ inputs: ["clock"] })),
    `readsByDefault(): unknown input \`clock\` (expected ${INPUT_NAMES})`,
  );
  assert.equal(
    refused((p) => dynamic(p).reads({ fact: ["task"] })),
    "reads(): unknown key `fact` (expected facts, inputs, volatile)",
  );
  assert.equal(
    refused((p) => dynamic(p).reads({ facts: "task" })),
    "reads(): `facts` must be an array of fact names (strings)",
  );
  assert.match(
    refused((p) => dynamic(p).reads({ inputs: "model" })),
    /^reads\(\): `inputs` must be an array/,
  );
  assert.equal(
    refused((p) => dynamic(p).reads({ volatile: "yes" })),
    "reads(): `volatile` must be true or false, not `yes`",
  );
  assert.match(refused((p) => dynamic(p).reads()), /^reads\(\): expected \{ facts/);
  assert.match(
    refused((p) => p.readsByDefault(["task"])),
    /^readsByDefault\(\): expected \{ facts/,
  );

  assert.equal(refused((p) => p.refresh("step")), "refresh() applies to a section or tool only");
  assert.equal(
    refused((p) => p.context("c", 0, "C").refresh("step")),
    "refresh() applies to a section or tool only",
  );
  assert.equal(
    refused((p) => p.section("s", 0, "S").refresh("turn")),
    "refresh(): unknown refresh `turn` (expected step, boundary or session)",
  );
  assert.equal(
    refused((p) => p.tool("t", "T", {}).refresh("Session")),
    "refresh(): unknown refresh `Session` (expected step, boundary or session)",
  );
  assert.equal(refused((p) => p.defer()), "defer() applies to a tool only");
  assert.equal(refused((p) => p.section("s", 0, "S").defer()), "defer() applies to a tool only");
  // The first misuse is the one reported.
  assert.equal(
    refused((p) => p.section("s", 0, "S").defer().refresh("never")),
    "defer() applies to a tool only",
  );
});

test("the Step shows the 0.3.0 inputs when the host gives them", () => {
  const seen = [];
  const w = exportPlugin(() =>
    new Plugin().dynamicSection("d", 0, (step) => {
      seen.push(step);
      return "";
    }),
  );
  w.declare([]);
  const full = {
    ...STEP,
    lastUserMessage: "find the bug",
    model: "claude-x",
    clientTools: ["read", "write"],
    turnCount: 3n,
  };
  w.evaluate(full, { ...NOTHING, sections: [item("d")] });
  const got = seen.at(-1);
  assert.equal(got.lastUserMessage, "find the bug");
  assert.equal(got.model, "claude-x");
  assert.deepEqual(got.clientTools, ["read", "write"]);
  assert.equal(got.turnCount, 3);
  assert.equal(typeof got.turnCount, "number");
  assert.equal(got.fact("echo"), "{{x}}");

  // Read but empty: the client sent no tools.
  w.evaluate({ ...STEP, clientTools: [] }, { ...NOTHING, sections: [item("d")] });
  assert.deepEqual(seen.at(-1).clientTools, []);

  // Not given (not read, or unknown): undefined, as in a 0.2.0 step.
  w.evaluate(STEP, { ...NOTHING, sections: [item("d")] });
  const bare = seen.at(-1);
  for (const key of ["lastUserMessage", "model", "clientTools", "turnCount"]) {
    assert.equal(bare[key], undefined, key);
  }
  assert.equal(bare.stepNumber, 7);
});

test("log writes through the host", () => {
  log.warn("careful");
  assert.deepEqual(logged.at(-1), ["warn", "careful"]);
});

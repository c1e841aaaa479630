// `skills`: a skill catalogue. Every configured skill is listed (name and one-line description)
// in a static section; the skills the client activates for a step have their full instructions
// in a dynamic context: the runtime context at the end of the request, so activating a skill
// never rewrites the system prompt and the cached prefix holds (docs/bundled-plugins.md).
//
// Config (all strings):
//   NAME.description  one line shown in the catalogue (`&`, `<`, `>` are escaped)
//   NAME.text         the skill's full instructions; trusted, so not escaped, and `{{var}}` in it
//                     is interpolated by the host. Trailing whitespace and newlines are dropped.
//   order             optional integer, default 150: the catalogue's order; the active skills
//                     context gets order + 1
// NAME matches ^[a-z][a-z0-9_-]*$, and each skill needs both keys. Any other key is an error.
//
// Facts: `skills`, a comma-separated list of activated skill names (whitespace around names
// trimmed, empty entries and duplicates ignored). An unknown name fails the assembly. The
// context reads that fact only (world 0.3.0): in a session it is asked again only when the
// fact changes. The catalogue's changes (a config reload) wait for a cache-cold point
// (`refresh` boundary).
//
// Output:
//   skills:catalogue (order)      only when a skill is configured; skills sorted by name:
//     Skills you can use. The full instructions of an activated skill appear under <active_skills>.
//     <available_skills>
//       <skill>
//         <name>git</name>
//         <description>Commit, branch and rebase safely.</description>
//       </skill>
//     </available_skills>
//   skills:active (order + 1)     a context: "" without activated skills (the host drops it);
//                                 else, in catalogue order whatever the fact's order:
//     <active_skills>
//     <skill name="git">
//     TEXT OF GIT
//     </skill>
//     </active_skills>
//
// Example (a table, so that texts can be multi-line strings; dotted keys must be quoted):
//   [plugins.skills.config]
//   "git.description" = "Commit, branch and rebase safely."
//   "git.text" = """
//   Never rewrite published history. Work on {{branch}}.
//   """
//   "pdf.description" = "Read and fill PDF forms."
//   "pdf.text" = "Extract fields with pdftk & check each value."
import { Plugin, exportPlugin } from "promptd-sdk";

const DEFAULT_ORDER = 150;
const SKILL_NAME = /^[a-z][a-z0-9_-]*$/;
const SKILL_KEY = /^(.*)\.(description|text)$/;
const INTRO =
  "Skills you can use. The full instructions of an activated skill appear under <active_skills> in the runtime context.";

const escapeXml = (s) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");

// Order + 1 must also fit the WIT s32.
function parseOrder(value) {
  if (!/^[+-]?[0-9]+$/.test(value)) throw `config \`order\` = \`${value}\`: not an integer`;
  const order = Number(value);
  if (order < -(2 ** 31) || order > 2 ** 31 - 2) {
    throw `config \`order\` = \`${value}\`: out of range (${-(2 ** 31)} to ${2 ** 31 - 2})`;
  }
  return order;
}

/** Reads the config into the order and a Map name -> { description, text }, sorted by name. */
function readConfig(config) {
  let order = DEFAULT_ORDER;
  const fields = new Map();
  for (const [key, value] of config.entries()) {
    if (key === "order") {
      order = parseOrder(value);
      continue;
    }
    const m = SKILL_KEY.exec(key);
    if (!m) {
      throw (
        `config key \`${key}\` is unknown; ` +
        "expected `order`, `NAME.description` or `NAME.text`"
      );
    }
    const [, name, field] = m;
    if (!SKILL_NAME.test(name)) {
      throw `config key \`${key}\`: bad skill name \`${name}\` (it must match ^[a-z][a-z0-9_-]*$)`;
    }
    if (!fields.has(name)) fields.set(name, {});
    fields.get(name)[field] = value;
  }

  const skills = new Map();
  // Names are ASCII, so the default sort is byte order.
  for (const name of [...fields.keys()].sort()) {
    const { description, text } = fields.get(name);
    const key = (field) => `\`${name}.${field}\``;
    const fail = (why) => {
      throw `skill \`${name}\`: ${why}`;
    };
    const missing = (set, absent) => fail(`${key(set)} is set but ${key(absent)} is missing`);
    if (description === undefined) missing("text", "description");
    if (text === undefined) missing("description", "text");
    const line = description.trim();
    if (line === "") fail(`${key("description")} is empty`);
    if (/[\r\n]/.test(line)) fail(`${key("description")} must be one line`);
    // A TOML multi-line string ends with a newline; keep `</skill>` on the line after the text.
    const body = text.trimEnd();
    if (body === "") fail(`${key("text")} is empty`);
    skills.set(name, { description: line, text: body });
  }
  return { order, skills };
}

function catalogue(skills) {
  const entries = [...skills].map(([name, s]) =>
    [
      "  <skill>",
      `    <name>${name}</name>`,
      `    <description>${escapeXml(s.description)}</description>`,
      "  </skill>",
    ].join("\n"),
  );
  return [INTRO, "<available_skills>", ...entries, "</available_skills>"].join("\n");
}

function activeSkills(skills, step) {
  const fact = step.fact("skills");
  if (fact === undefined) return "";
  const wanted = new Set(fact.split(",").map((n) => n.trim()).filter((n) => n !== ""));
  const unknown = [...wanted].filter((n) => !skills.has(n));
  if (unknown.length > 0) {
    const names = unknown.map((n) => `\`${n}\``).join(", ");
    const available = skills.size > 0 ? [...skills.keys()].join(", ") : "none";
    const what = unknown.length > 1 ? "unknown skills" : "unknown skill";
    throw `fact \`skills\`: ${what} ${names}; available: ${available}`;
  }
  const active = [...skills].filter(([name]) => wanted.has(name));
  if (active.length === 0) return "";
  const blocks = active.map(([name, s]) => `<skill name="${name}">\n${s.text}\n</skill>`);
  return ["<active_skills>", ...blocks, "</active_skills>"].join("\n");
}

export const { declare, evaluate, review } = exportPlugin((config) => {
  const { order, skills } = readConfig(config);
  const plugin = new Plugin();
  if (skills.size > 0) {
    plugin.section("skills:catalogue", order, catalogue(skills)).refresh("boundary");
  }
  // Declared even without skills, so that a client naming a skill gets an error, not silence.
  return plugin
    .dynamicContext("skills:active", order + 1, (step) => activeSkills(skills, step))
    .reads({ facts: ["skills"] });
});

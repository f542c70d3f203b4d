// Engram's console: views over the public GraphQL API. Every view asks only for what the
// signed-in token's grants allow (viewer.allowed), and says so in a sentence when they do not.

import { ApiError, gql, token } from "./api.js";
import { append, clear, codePoint, confirmDialog, exact, field, h, json, link, when } from "./dom.js";
import { policyEditor, policyText } from "./policies.js";

const OPERATIONS = [
  "actions", "action", "createAction", "updateAction",
  "Action.memories", "Action.searchMemories", "agentMemory", "deleteAgentMemory",
  "Action.sessions", "ActionSession.executions", "ActionExecution.transcript", "execution",
  "ActionSession.searchHistory", "eraseSession",
  "clients", "Client.tokens", "createClient", "updateClient", "deleteClient", "createClientToken",
  "revokeClientToken", "revokeTokensIssuedBy", "tokensIssuedBy", "accounts", "updateAccount", "deleteAccount",
  "adminEvents",
];
const WHAT = {
  actions: "listing agents",
  action: "reading an agent's configuration",
  createAction: "creating agents",
  updateAction: "editing agents",
  "Action.memories": "listing this agent's memories",
  "Action.searchMemories": "searching memories",
  agentMemory: "reading memory records",
  deleteAgentMemory: "deleting memories",
  "Action.sessions": "listing sessions",
  "ActionSession.executions": "reading a session's turns",
  "ActionExecution.transcript": "reading transcripts",
  execution: "reading executions' inputs",
  eraseSession: "erasing sessions",
  clients: "listing clients",
  "Client.tokens": "listing tokens",
  createClient: "creating clients",
  updateClient: "editing clients",
  deleteClient: "deleting clients",
  createClientToken: "creating tokens",
  updateAccount: "renaming accounts",
  deleteAccount: "deleting accounts",
  adminEvents: "reading who changed accounts, clients and tokens",
};
const OLDER = 20; // earlier versions of an agent, and records either way of a supersede chain
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const PAGE = 20;
const EVENTS = 500; // transcript events shown per turn
const HITS = 10; // history search results
const SUMMARIES = 50; // records an erasure left, shown with their summaries

const main = document.getElementById("main");
const nav = document.getElementById("nav");
let viewer = null; // { principal, accountId, allowed: {op: {allowed, reason}} }
let historySearch = null; // whether the schema has ActionSession.searchHistory
let rendering = 0;
let flash = null; // a sentence for the next page rendered to say (what a change did)

const can = (op) => Boolean(viewer && viewer.allowed[op] && viewer.allowed[op].allowed);

function refusal(op) {
  const reason = viewer.allowed[op] && viewer.allowed[op].reason;
  return h("p", { class: "notice" },
    `Your token's grants do not allow ${WHAT[op] || op}`, reason ? `: ${reason}.` : ".");
}

function problem(error) {
  const text = error instanceof ApiError ? error.sentence : `Something went wrong: ${error}.`;
  if (error instanceof ApiError && error.code === "UNAUTHENTICATED") signOut(text);
  return h("p", { class: "error", role: "alert" }, text);
}

function notFound(what) {
  return [h("h1", { tabindex: -1 }, "Not found"), h("p", { class: "notice" }, what),
    h("p", {}, link("#/", "Back to agents"))];
}

function button(label, onclick, attrs = {}) {
  // While its action runs the button is disabled: a double click loads a page once.
  const el = h("button", { type: "button", ...attrs }, label);
  el.addEventListener("click", async (event) => {
    if (el.disabled) return;
    const focused = document.activeElement === el;
    el.disabled = true;
    try {
      await onclick(event);
    } finally {
      el.disabled = false;
      // Disabled, it lost the focus: give it back unless the action moved it elsewhere.
      if (focused && el.isConnected && !el.hidden && document.activeElement === document.body) el.focus();
    }
  });
  return el;
}

// A "Show more" button: `load(after)` appends the next page to `list`. After the last page the
// button hides, and focus goes to the first row it loaded (or the list), not to the body.
// A page that fails (a token revoked or expired since, the server gone) is said after the
// button, which stays to try again: it threw in the page, saying nothing.
function moreButton(label, list, load, attrs = {}) {
  let failed = null;
  const more = button(label, async () => {
    const seen = list.children.length;
    if (failed) failed.remove();
    try {
      await load(more.dataset.after);
    } catch (error) {
      failed = problem(error);
      if (more.isConnected) more.after(failed);
      return;
    }
    if (!more.hidden || ![more, document.body].includes(document.activeElement)) return;
    const first = list.children[seen];
    const target = first ? first.querySelector("h2") || first : list.closest("table") || list;
    target.tabIndex = -1;
    target.focus();
  }, { hidden: true, ...attrs });
  return more;
}

function pre(value) {
  return h("pre", { class: "json" }, typeof value === "string" ? value : json(value));
}

function dl(rows) {
  return h("dl", { class: "facts" }, rows.filter(Boolean).map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

function badge(text, kind = "") {
  return h("span", { class: `badge ${kind}` }, text);
}

function labelsText(labels) {
  return (labels || []).map((l) => `${l.name || `#${l.number}`}=${l.value}`).join(", ");
}

// ---------------------------------------------------------------- sign in and navigation

const VIEWER = `query($ops: [String!]!) { viewer { principal accountId tokenId
  allowed(operations: $ops) { operation allowed reason } } }`;

async function loadViewer(bearer) {
  const data = await gql(VIEWER, { ops: OPERATIONS }, bearer);
  const allowed = {};
  for (const a of data.viewer.allowed) allowed[a.operation] = a;
  return { ...data.viewer, allowed };
}

function signOut(message) {
  token.clear();
  viewer = null;
  renderNav();
  signIn(message);
}

function renderNav() {
  clear(nav);
  nav.hidden = !viewer;
  if (!viewer) return;
  append(nav, [
    h("ul", {},
      h("li", {}, link("#/", "Agents")),
      can("clients") ? h("li", {}, link("#/clients", "Clients and tokens")) : null,
      can("adminEvents") ? h("li", {}, link("#/activity", "Activity")) : null,
      h("li", { class: "who" }, "Signed in as ", h("strong", {}, viewer.principal)),
      h("li", {}, button("Sign out", () => signOut("Signed out."), { class: "secondary" }))),
  ]);
}

function signIn(message) {
  clear(main);
  const input = h("input", { type: "password", name: "token", autocomplete: "off", required: true });
  const tokenField = field("API token", input,
    "Kept for this browser tab only (sessionStorage); closing the tab forgets it.");
  const form = h("form", { class: "card narrow", onsubmit: async (e) => {
    e.preventDefault();
    tokenField.showError("");
    // What was pasted with the token ("Bearer " before it) goes; what no token holds is said
    // here, as a browser sends no header with it (fetch would fail as if the server were down).
    const value = input.value.trim().replace(/^bearer\s+/i, "");
    const odd = /[^\x20-\x7e]/.exec(value);
    if (odd) {
      tokenField.showError(`This is not a whole API token: it holds “${odd[0]}” (${codePoint(odd[0])}) at `
        + `character ${odd.index + 1}, and a token holds only letters, digits, spaces and ASCII punctuation. `
        + "Copy the whole token again (a list shows only its first characters, followed by …).");
      input.focus();
      return;
    }
    try {
      viewer = await loadViewer(value);
      token.set(value);
      renderNav();
      route();
    } catch (error) {
      tokenField.showError(error instanceof ApiError ? error.sentence : String(error));
      input.focus();
    }
  } }, tokenField, h("button", { type: "submit" }, "Sign in"));
  append(main, [
    h("h1", { tabindex: -1 }, "Sign in"),
    message ? h("p", { class: "notice", role: "status" }, message) : null,
    form,
  ]);
  input.focus();
}

// ---------------------------------------------------------------- agents

const ACTIONS = `query($first: Int!, $after: String) { actions(first: $first, after: $after) {
  nodes { actionId name version currentVersion modified } pageInfo { hasNextPage endCursor } } }`;

async function agentsView() {
  const out = [h("h1", { tabindex: -1 }, "Agents")];
  const create = can("createAction") ? h("p", {}, h("a", { href: "#/agents/new", class: "button" }, "New agent"))
    : null;
  if (!can("actions")) return [...out, create, refusal("actions"),
    h("p", {}, "Open an agent you know the ID of by going to #/agents/ followed by its ID."),
    create ? null : refusal("createAction")];
  const table = h("tbody");
  const more = moreButton("Show more agents", table, load);
  async function load(after) {
    const data = await gql(ACTIONS, { first: PAGE, after: after || null });
    for (const a of data.actions.nodes) {
      append(table, [h("tr", {},
        h("td", { dataset: { label: "Name" } }, link(`#/agents/${a.actionId}`, a.name)),
        h("td", { dataset: { label: "Version" } }, String(a.currentVersion)),
        h("td", { dataset: { label: "Modified" } }, when(a.modified)),
        h("td", { dataset: { label: "ID" }, class: "mono" }, a.actionId))]);
    }
    more.hidden = !data.actions.pageInfo.hasNextPage;
    more.dataset.after = data.actions.pageInfo.endCursor || "";
    if (!table.children.length) append(table, [h("tr", {}, h("td", { colspan: 4 }, "No agents yet."))]);
  }
  await load(null);
  return [...out, create, h("table", { class: "list" }, h("caption", {}, "Agents, newest first"),
    h("thead", {}, h("tr", {}, ["Name", "Version", "Modified", "ID"].map((t) => h("th", {}, t)))),
    table), more, create ? null : refusal("createAction")];
}

function agentTabs(actionId, current) {
  const tabs = [["", "Configuration", ["action"]], ["/memories", "Memories", ["Action.memories", "Action.searchMemories"]],
    ["/sessions", "Sessions", ["Action.sessions"]]];
  return h("nav", { class: "tabs", "aria-label": "Agent" }, tabs.map(([path, label, ops]) =>
    ops.some(can) || label === "Configuration" ? h("a", { href: `#/agents/${actionId}${path}`,
      "aria-current": current === label ? "page" : null }, label) : null));
}

// The agent at its current version (name and all when the grants allow), or null when there
// is none in this account: another tenant's agent is simply not found.
async function loadAgent(actionId) {
  if (!UUID.test(actionId)) return null;
  const fields = can("action") ? "actionId name currentVersion" : "actionId";
  const data = await gql(`query($id: UUID!) { action(actionId: $id) { ${fields} } }`, { id: actionId });
  return data.action;
}

const AGENT = `query($id: UUID!) { action(actionId: $id) { actionId name version currentVersion
  instructions model harness created modified createdBy } }`;

async function agentView({ actionId }) {
  if (!UUID.test(actionId)) return notFound(`No agent with ID ${actionId} was found.`);
  if (!can("action")) {
    const agent = await loadAgent(actionId);
    if (!agent) return notFound(`No agent with ID ${actionId} was found.`);
    return [h("h1", { tabindex: -1 }, "Agent"), agentTabs(actionId, "Configuration"), refusal("action")];
  }
  const { action } = await gql(AGENT, { id: actionId });
  if (!action) return notFound(`No agent with ID ${actionId} was found.`);
  const versions = [];
  const older = [];
  for (let v = action.currentVersion - 1; v >= Math.max(1, action.currentVersion - OLDER); v--) older.push(v);
  if (older.length) {
    const parts = older.map((v) => `v${v}: action(actionId: $id, version: ${v}) { version harness modified createdBy }`);
    const data = await gql(`query($id: UUID!) { ${parts.join(" ")} }`, { id: actionId });
    for (const v of older) if (data[`v${v}`]) versions.push(data[`v${v}`]);
  }
  const out = [
    h("h1", { tabindex: -1 }, action.name),
    agentTabs(actionId, "Configuration"),
    dl([["Agent ID", h("span", { class: "mono" }, action.actionId)], ["Version", String(action.version)],
      ["Created", when(action.created)], ["Modified", when(action.modified)], ["By", action.createdBy]]),
    h("h2", {}, `Version ${action.version} (current)`),
    h("h3", {}, "Harness"), pre(action.harness),
    action.instructions ? [h("h3", {}, "Instructions"), pre(action.instructions)] : null,
    h("h3", {}, "Model"), pre(action.model), modelNote(action.model),
  ];
  if (can("updateAction")) out.push(editForm(action));
  if (versions.length) {
    out.push(h("h2", {}, "Earlier versions"));
    if (action.currentVersion - 1 > OLDER) {
      out.push(h("p", { class: "notice" }, `Showing the ${OLDER} newest of ${action.currentVersion - 1} earlier versions; `,
        "read older ones with the API: action(actionId, version)."));
    }
    for (const v of versions) {
      out.push(h("details", { class: "version" },
        h("summary", {}, `Version ${v.version} · ${when(v.modified)} · ${v.createdBy}`), pre(v.harness)));
    }
  }
  return out;
}

// Which model an agent's turns run, where its `model` leaves it to the deployment: a field left
// out takes the deployment's setting, so {"temperature": 0.2} runs the deployment's model at its
// endpoint, which the JSON alone does not say.
function modelNote(model) {
  if (!model || !Object.keys(model).length) {
    return h("p", { class: "muted" }, "None set: its turns use the deployment's model (its ENGRAM_MODEL_* settings).");
  }
  const left = [model.name ? null : "model name (ENGRAM_MODEL_NAME)",
    model.baseUrl ? null : "endpoint (ENGRAM_MODEL_BASE_URL)"].filter(Boolean);
  return left.length ? h("p", { class: "muted" }, `Its turns use the deployment's ${left.join(" and ")}: `
    + "a field left out takes the deployment's setting.") : null;
}

// An agent's configuration as form fields, filled with `values` (text): name, instructions, and
// model and harness as JSON, as createAction and updateAction take them.
function agentFields(values, hints) {
  const controls = {
    name: h("input", { type: "text", value: values.name, required: true, autocomplete: "off" }),
    instructions: h("textarea", { rows: 4 }, values.instructions),
    model: h("textarea", { rows: 4, class: "mono", spellcheck: false }, values.model),
    harness: h("textarea", { rows: 14, class: "mono", spellcheck: false }, values.harness),
  };
  const fields = {
    name: field("Name", controls.name), instructions: field("Instructions", controls.instructions),
    model: field("Model (JSON)", controls.model, hints.model),
    harness: field("Harness (JSON)", controls.harness, hints.harness),
  };
  return {
    controls,
    elements: Object.values(fields),
    clearErrors: () => Object.values(fields).forEach((f) => f.showError("")),
    // The ActionInput the fields hold; null, with the error at its field, when model or
    // harness is not JSON.
    input() {
      const input = { name: controls.name.value, instructions: controls.instructions.value };
      for (const key of ["model", "harness"]) {
        try {
          input[key] = JSON.parse(controls[key].value || "null");
        } catch (error) {
          fields[key].showError(`This is not valid JSON: ${error.message}`);
          controls[key].focus();
          return null;
        }
      }
      return input;
    },
    // A refusal that names one of these fields ("harness.memory.extraction.every: must be
    // ..."), said there, focused: true; false for any other.
    showRefusal(error) {
      const m = /^(name|instructions|model|harness)\b/.exec(error.message || "");
      if (!(error instanceof ApiError && error.code === "BAD_REQUEST" && m)) return false;
      fields[m[1]].showError(error.message);
      controls[m[1]].focus();
      return true;
    },
  };
}

// Ctrl+Enter submits `form` from a text area, where Enter makes a new line.
function submitOnCtrlEnter(form) {
  form.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) form.requestSubmit();
  });
  return form;
}

// The form editing agent `action`, prefilled. It saves with the version it was filled from: a
// version someone saved meanwhile is refused (CONFLICT), never overwritten unseen.
function editForm(action) {
  let base = action.version;
  const agent = agentFields(
    { name: action.name, instructions: action.instructions, model: json(action.model), harness: json(action.harness) },
    { harness: "Saving writes a new version; earlier versions stay readable." });
  const status = h("div", { role: "status", class: "status" });
  // Someone saved a version after this form was filled: said, with the edits kept, and the
  // next save (a choice now) based on that version.
  async function saidMeanwhile() {
    let now;
    try {
      now = (await gql(`query($id: UUID!) { action(actionId: $id) { version createdBy modified } }`,
        { id: action.actionId })).action;
    } catch (again) {
      status.replaceChildren(h("div", { class: "error", role: "alert" },
        "Not saved: someone saved this agent after you opened this page. ", problem(again)));
      return;
    }
    base = now.version; // agents are never deleted: it is there
    status.replaceChildren(h("div", { class: "error", role: "alert" },
      h("p", {}, `Not saved: ${now.createdBy} saved version ${now.version} at ${when(now.modified)}, after `
        + `version ${action.version} this form was filled from.`),
      h("p", {}, "Your edits are still in the form: save again to write them as the next version over "
        + `version ${now.version}, or discard them to read version ${now.version} first.`),
      button(`Discard my edits and show version ${now.version}`, () => route(), { class: "secondary" })));
  }
  const form = h("form", { class: "card", onsubmit: async (e) => {
    e.preventDefault();
    agent.clearErrors();
    status.textContent = "";
    const input = agent.input();
    if (!input) return;
    try {
      const data = await gql(`mutation($id: UUID!, $input: ActionInput!, $v: Int) {
        updateAction(actionId: $id, input: $input, expectedVersion: $v) { version } }`,
      { id: action.actionId, input, v: base });
      status.textContent = `Saved as version ${data.updateAction.version}.`;
      setTimeout(route, 600);
    } catch (error) {
      if (agent.showRefusal(error)) return;
      if (error instanceof ApiError && error.code === "CONFLICT" && / is at version \d+/.test(error.message)) {
        await saidMeanwhile();
      } else {
        status.replaceChildren(problem(error));
      }
    }
  } }, h("h2", {}, "Edit as a new version"), agent.elements,
    h("button", { type: "submit" }, "Save new version"), status);
  return submitOnCtrlEnter(form);
}

const CREATE_ACTION = `mutation($input: ActionInput!) { createAction(input: $input) { actionId name version } }`;
const NEW_HARNESS = { memory: { enabled: true } };

async function newAgentView() {
  const out = [h("p", { class: "crumbs" }, link("#/", "← Agents")), h("h1", { tabindex: -1 }, "New agent")];
  if (!can("createAction")) return [...out, refusal("createAction")];
  const agent = agentFields({ name: "", instructions: "", model: "", harness: json(NEW_HARNESS) }, {
    model: "Empty: the deployment's model (its ENGRAM_MODEL_* settings). Or JSON such as "
      + "{\"name\": \"gpt-4o-mini\", \"temperature\": 0.2}.",
    harness: "What the runtime gives the agent: memory and history with their options, such as "
      + "{\"memory\": {\"enabled\": true}, \"history\": {\"index\": \"messages\"}} (docs/harness.md lists every option).",
  });
  const status = h("div", { class: "status" });
  const create = h("button", { type: "submit" }, "Create agent");
  let busy = false;
  const form = h("form", { class: "card", "aria-label": "New agent", onsubmit: async (e) => {
    e.preventDefault();
    if (busy) return;
    agent.clearErrors();
    status.replaceChildren();
    const input = agent.input();
    if (!input) return;
    busy = create.disabled = true;
    try {
      const made = (await gql(CREATE_ACTION, { input })).createAction;
      flash = `Created agent ${made.name} (version ${made.version}).`;
      location.hash = `#/agents/${made.actionId}`;
      return;
    } catch (error) {
      // What was typed stays: the server's sentence, at the field it names or above the button,
      // says what to change.
      if (!agent.showRefusal(error)) status.replaceChildren(problem(error));
    } finally {
      busy = create.disabled = false;
      if (form.isConnected && document.activeElement === document.body) create.focus();
    }
  } }, agent.elements, status, create);
  return [...out, submitOnCtrlEnter(form)];
}

// ---------------------------------------------------------------- memories

const RECORD = "memoryId version status summary kind scope sessionId preview pinned created labels { number name value }";

function memoryRow(actionId, m, score) {
  // A token that may search but not read records gets no link to a page it would be refused.
  const summary = can("agentMemory") ? link(`#/agents/${actionId}/memories/${m.memoryId}`, m.summary) : m.summary;
  return h("tr", {},
    h("td", { dataset: { label: "Summary" } }, summary,
      m.pinned ? badge("pinned") : null, m.preview ? badge("preview") : null),
    h("td", { dataset: { label: "Kind" } }, m.kind),
    // A session-scope record's session; an agent-scope one is recalled in every session: a
    // badge, which no session ID can pass for (a session may be called "agent").
    h("td", { dataset: { label: "Session" }, class: "wrap" },
      m.scope === "AGENT" ? badge("agent scope") : h("span", { class: "mono" }, exact(m.sessionId))),
    h("td", { dataset: { label: "Status" } }, badge(m.status, m.status.toLowerCase())),
    h("td", { dataset: { label: "Labels" }, class: "wrap" }, labelsText(m.labels)),
    h("td", { dataset: { label: score === undefined ? "Created" : "Score" } },
      score === undefined ? when(m.created) : score.toFixed(4)));
}

function memoryTable(caption, lastColumn) {
  const body = h("tbody");
  const table = h("table", { class: "list" }, h("caption", {}, caption),
    h("thead", {}, h("tr", {}, ["Summary", "Kind", "Session", "Status", "Labels", lastColumn].map((t) => h("th", {}, t)))),
    body);
  return { table, body };
}

// Search, for a token that may search even where it may not list: the best PAGE results, and
// "Show more results" for the next page, asked with the same query and mode as the first.
function searchForm(actionId) {
  const query = h("input", { type: "search", name: "query", required: true });
  const mode = h("select", { name: "mode" }, h("option", { value: "" }, "the agent's default"),
    ["HYBRID", "LEXICAL", "VECTOR"].map((m) => h("option", { value: m }, m.toLowerCase())));
  const found = h("p", { role: "status", class: "status" });
  const results = h("div", { class: "results" });
  let search = null; // the search shown: { q, mode, body, caption, more, seen }

  // One page of `s` after `after`; a page that comes back once another search replaced `s`
  // changes nothing.
  async function load(s, after) {
    const data = await gql(`query($id: UUID!, $q: String!, $mode: ActionAgentMemorySearchMode,
      $after: String) { action(actionId: $id) {
        searchMemories(query: $q, mode: $mode, first: ${PAGE}, after: $after) {
          edges { score node { ${RECORD} } } pageInfo { hasNextPage endCursor } } } }`,
    { id: actionId, q: s.q, mode: s.mode, after: after || null });
    if (s !== search) return;
    const { edges, pageInfo } = data.action.searchMemories;
    // Scores can move between pages (app/memory/search.py: a later page may repeat a record).
    for (const e of edges) {
      if (s.seen.has(e.node.memoryId)) continue;
      s.seen.add(e.node.memoryId);
      append(s.body, [memoryRow(actionId, e.node, e.score)]);
    }
    const shown = s.seen.size;
    if (!shown) append(s.body, [h("tr", {}, h("td", { colspan: 6 }, "Nothing matched."))]);
    s.more.hidden = !pageInfo.hasNextPage;
    s.more.dataset.after = pageInfo.endCursor || "";
    // What the operator typed, as records are shown: a character that disguises text as its code point.
    clear(s.caption);
    append(s.caption, [`Search results for “${s.q}” (${pageInfo.hasNextPage ? `first ${shown}` : shown})`]);
    found.textContent = pageInfo.hasNextPage
      ? `Showing the first ${shown} results; more matched: show more, or refine the query to narrow them.`
      : `${shown} record${shown === 1 ? "" : "s"} matched.`;
  }

  const queryField = field("Search memories", query);
  const form = h("form", { class: "card inline", role: "search", onsubmit: async (e) => {
    e.preventDefault();
    // Blank, the server lists the newest records, each scored 0: not results of a search.
    const blank = !query.value.trim();
    queryField.showError(blank ? "Type the words to search for: a blank query searches for nothing." : "");
    if (blank) {
      query.focus();
      return;
    }
    clear(results);
    found.textContent = "";
    const { table, body } = memoryTable("", "Score");
    const s = { q: query.value, mode: mode.value || null, body, caption: table.caption, seen: new Set() };
    const failed = h("div");
    s.more = moreButton("Show more results", body, async (after) => {
      clear(failed);
      try {
        await load(s, after);
      } catch (error) {
        append(failed, [problem(error)]);
      }
    });
    search = s;
    try {
      await load(s, null);
    } catch (error) {
      if (s === search) append(results, [problem(error)]);
      return;
    }
    if (s !== search) return;
    append(results, [table, s.more, failed, button("Clear search", () => {
      search = null;
      clear(results);
      found.textContent = "";
      query.value = "";
      query.focus();
    }, { class: "secondary" })]);
  } }, queryField, field("Mode", mode), h("button", { type: "submit" }, "Search"));
  return [form, found, results];
}

async function memoriesView({ actionId, session = "" }) {
  const agent = await loadAgent(actionId);
  if (!agent) return notFound(`No agent with ID ${actionId} was found.`);
  const out = [h("h1", { tabindex: -1 }, agent.name ? `Memories of ${agent.name}` : "Memories"),
    agentTabs(actionId, "Memories")];
  if (can("Action.searchMemories")) out.push(searchForm(actionId));
  else out.push(refusal("Action.searchMemories"));
  if (!can("Action.memories")) return [...out, refusal("Action.memories")];

  const kind = h("input", { type: "text", name: "kind" });
  const sessionId = h("input", { type: "text", name: "session", value: session });
  const labelName = h("input", { type: "text", name: "label" });
  const labelValue = h("input", { type: "text", name: "labelValue" });
  const scope = h("select", { name: "scope" }, h("option", { value: "" }, "any"),
    h("option", { value: "SESSION" }, "session"), h("option", { value: "AGENT" }, "agent"));
  const status = h("select", { name: "status" }, h("option", { value: "" }, "listed"),
    ["ACTIVE", "DELETED", "SUPERSEDED"].map((s) => h("option", { value: s }, s.toLowerCase())),
    h("option", { value: "ALL" }, "every status"));
  const preview = h("select", { name: "preview" }, h("option", { value: "" }, "live and preview"),
    h("option", { value: "false" }, "live only"), h("option", { value: "true" }, "preview only"));
  const listing = memoryTable("Records, newest first", "Created");
  const more = moreButton("Show older records", listing.body, load);
  const listError = h("div");
  // Opened as "memories of this session" (from a session's page), the listing starts filtered.
  let filters = session ? { sessionId: session } : {};
  let shownListing = 0; // the listing shown: a page asked for before the filters changed adds nothing
  async function load(after) {
    const mine = shownListing;
    clear(listError);
    try {
      const data = await gql(`query($id: UUID!, $first: Int!, $after: String, $kind: String,
        $labels: [AgentMemoryLabelInput!], $scope: ActionAgentMemoryScope, $preview: Boolean,
        $status: [ActionAgentMemoryStatus!], $sessionId: String) { action(actionId: $id) {
          memories(first: $first, after: $after, kind: $kind, labels: $labels, scope: $scope,
                   preview: $preview, status: $status, sessionId: $sessionId) {
            nodes { ${RECORD} } pageInfo { hasNextPage endCursor } } } }`,
      { id: actionId, first: PAGE, after: after || null, ...filters });
      if (mine !== shownListing) return;
      const page = data.action.memories;
      for (const m of page.nodes) append(listing.body, [memoryRow(actionId, m)]);
      if (!after && !page.nodes.length) append(listing.body, [h("tr", {}, h("td", { colspan: 6 }, "No records."))]);
      more.hidden = !page.pageInfo.hasNextPage;
      more.dataset.after = page.pageInfo.endCursor || "";
    } catch (error) {
      if (mine === shownListing) append(listError, [problem(error)]);
    }
  }
  const labelField = field("Label", labelName);
  const filterForm = h("form", { class: "card filters", onsubmit: async (e) => {
    e.preventDefault();
    // A value alone filters nothing: said at the label, not listed as if it were applied.
    const unnamed = labelValue.value !== "" && !labelName.value.trim();
    labelField.showError(unnamed ? "Name the label that holds this value, or clear the value to list "
      + "records whatever their labels." : "");
    if (unnamed) {
      labelName.focus();
      return;
    }
    filters = {
      kind: kind.value.trim() || null,
      labels: labelName.value.trim() ? [{ name: labelName.value.trim(), value: labelValue.value }] : null,
      scope: scope.value || null,
      preview: preview.value === "" ? null : preview.value === "true",
      status: status.value === "" ? null : status.value === "ALL" ? ["ACTIVE", "DELETED", "SUPERSEDED"] : [status.value],
      // As typed: a session ID may hold spaces at either end (a blank one is refused, and said).
      sessionId: sessionId.value === "" ? null : sessionId.value,
    };
    // The address names the session filtered by, as a session's "Memories of this session" does:
    // reloaded or shared, it lists what this page lists, not the session it was opened with.
    const address = location.hash.replace(/\?.*$/, "")
      + (filters.sessionId === null ? "" : `?session=${encodeURIComponent(filters.sessionId)}`);
    if (location.hash !== address) history.replaceState(history.state, "", address);
    shownListing += 1;
    more.hidden = true;
    clear(listing.body);
    await load(null);
  } }, h("h2", {}, "Filter"), h("div", { class: "row" }, field("Kind", kind), labelField,
    field("Label value", labelValue), field("Scope", scope), field("Session", sessionId), field("Status", status),
    field("Preview", preview)),
  h("button", { type: "submit" }, "Apply filters"));
  await load(null);
  out.push(filterForm, listError, listing.table, more);
  return out;
}

// An address of the memory list with a query it does not take: said, with the one it does.
function badFilter({ actionId }) {
  if (!UUID.test(actionId)) return notFound(`No agent with ID ${actionId} was found.`);
  return notFound(["The memory list's address takes one parameter, the session to list the records of: ",
    h("span", { class: "mono" }, `#/agents/${actionId}/memories?session=ID`),
    ", with “&”, “#” and “%” in the ID written %26, %23 and %25. ",
    link(`#/agents/${actionId}/memories`, "List every record of the agent"), "."]);
}

const MEMORY = `query($a: UUID!, $m: UUID!) { agentMemory(actionId: $a, id: $m) {
  memoryId version status summary content kind scope source pinned preview metadata created modified
  labels { number name value } replaces replacedBy executionId invocationNumber actionVersion
  sessionId modifiedBy
  history(first: 100) { nodes { version status summary content kind scope pinned modified modifiedBy
    replaces replacedBy labels { number name value } } pageInfo { hasNextPage } } } }`;
const LINK = `query($a: UUID!, $m: UUID!) { agentMemory(actionId: $a, id: $m) {
  memoryId summary status created replaces replacedBy } }`;

// The records either side of this one in its supersede chain, at most OLDER each way, and
// whether the chain goes on past them.
async function chainOf(actionId, record) {
  const before = [];
  const after = [];
  let id = record.replaces;
  while (id && before.length < OLDER) {
    const { agentMemory: m } = await gql(LINK, { a: actionId, m: id });
    if (!m) { id = null; break; }
    before.unshift(m);
    id = m.replaces;
  }
  const older = Boolean(id);
  id = record.replacedBy;
  while (id && after.length < OLDER) {
    const { agentMemory: m } = await gql(LINK, { a: actionId, m: id });
    if (!m) { id = null; break; }
    after.push(m);
    id = m.replacedBy;
  }
  return { records: [...before, record, ...after], older, newer: Boolean(id) };
}

async function recordView({ actionId, memoryId }) {
  const gone = `No record ${memoryId} of agent ${actionId} was found.`;
  if (!UUID.test(actionId) || !UUID.test(memoryId)) return notFound(gone);
  if (!can("agentMemory")) {
    return [h("h1", { tabindex: -1 }, "Memory record"), agentTabs(actionId, "Memories"), refusal("agentMemory")];
  }
  const { agentMemory: m } = await gql(MEMORY, { a: actionId, m: memoryId });
  if (!m) return notFound(gone);
  const chain = m.replaces || m.replacedBy ? await chainOf(actionId, m) : null;
  const status = h("div", { role: "status", class: "status" });
  const out = [
    h("p", { class: "crumbs" }, link(`#/agents/${actionId}/memories`, "← Memories")),
    h("h1", { tabindex: -1 }, m.summary),
    h("p", {}, badge(m.status, m.status.toLowerCase()), m.pinned ? badge("pinned") : null,
      m.preview ? badge("preview") : null),
    status,
  ];
  if (m.status === "ACTIVE" && can("deleteAgentMemory")) {
    out.push(button("Delete this record…", async () => {
      const ok = await confirmDialog({
        title: "Delete this record?",
        body: [
          h("p", {}, "Deleting writes a new version with status DELETED. The agent no longer recalls or finds it, and it leaves the memory list."),
          h("p", {}, "It does not erase anything: the record and every one of its versions stay readable here and through agentMemory and its history, and transcripts that quoted it keep their text. Records that replaced or were replaced by it are not changed."),
        ],
        ok: "Delete record",
      });
      if (!ok) return;
      try {
        await gql(`mutation($a: UUID!, $m: UUID!) { deleteAgentMemory(actionId: $a, id: $m) { version status } }`,
          { a: actionId, m: memoryId });
        await route();
        document.querySelector("#main .status").textContent =
          "Deleted: the agent no longer recalls this record; its versions stay readable below.";
      } catch (error) {
        status.replaceChildren(problem(error));
      }
    }, { class: "danger" }));
  }
  out.push(
    h("h2", {}, "Content"), m.content ? pre(m.content) : h("p", { class: "muted" }, "No content: the summary says it all."),
    h("h2", {}, "Record"),
    dl([["Record ID", h("span", { class: "mono" }, m.memoryId)], ["Version", String(m.version)],
      ["Kind", m.kind], ["Scope", m.scope], ["Source", m.source], ["Labels", labelsText(m.labels) || "none"],
      ["Created", when(m.created)], ["Modified", when(m.modified)],
      m.metadata !== null && m.metadata !== undefined ? ["Metadata", pre(m.metadata)] : null]),
    h("h2", {}, "Provenance"),
    dl([["Written by execution", h("span", { class: "mono" }, m.executionId)],
      ["Invocation", String(m.invocationNumber)],
      ["Agent version", link(`#/agents/${actionId}`, `version ${m.actionVersion}`)],
      ["Session", m.sessionId ? link(`#/agents/${actionId}/sessions/${encodeURIComponent(m.sessionId)}`, exact(m.sessionId)) : "none"],
      ["Last changed by", m.modifiedBy]]),
  );
  if (chain) {
    const beyond = (end, which) => h("p", { class: "notice" },
      `Showing ${OLDER} ${which} records of the chain; it goes on past them: open `,
      link(`#/agents/${actionId}/memories/${end.memoryId}`, `the ${which === "earlier" ? "earliest" : "latest"} one shown`),
      " to read further.");
    out.push(h("h2", {}, "Supersede chain"), chain.older ? beyond(chain.records[0], "earlier") : null,
      h("ol", { class: "timeline", "aria-label": "Supersede chain" }, chain.records.map((c) =>
      h("li", { class: c.memoryId === m.memoryId ? "current" : "" },
        h("span", { class: "when" }, when(c.created)), " ",
        c.memoryId === m.memoryId ? h("strong", {}, c.summary, " (this record)")
          : link(`#/agents/${actionId}/memories/${c.memoryId}`, c.summary),
        " ", badge(c.status, c.status.toLowerCase())))),
      chain.newer ? beyond(chain.records.at(-1), "later") : null);
  }
  out.push(h("h2", {}, "Version history"), h("ol", { class: "timeline", "aria-label": "Version history" },
    m.history.nodes.map((v) => h("li", {},
      h("div", {}, h("strong", {}, `Version ${v.version}`), " ", badge(v.status, v.status.toLowerCase()),
        " ", h("span", { class: "when" }, `${when(v.modified)} by ${v.modifiedBy}`)),
      h("div", {}, v.summary),
      v.content ? h("details", {}, h("summary", {}, "Content"), pre(v.content)) : null,
      v.replaces ? h("div", { class: "muted" }, "Replaces ", link(`#/agents/${actionId}/memories/${v.replaces}`, v.replaces)) : null,
      v.replacedBy ? h("div", { class: "muted" }, "Replaced by ", link(`#/agents/${actionId}/memories/${v.replacedBy}`, v.replacedBy)) : null))));
  if (m.history.pageInfo.hasNextPage) out.push(h("p", { class: "muted" }, "Only the newest 100 versions are shown."));
  return out;
}

// ---------------------------------------------------------------- sessions

// A session's global ID exactly as the server writes it (app/graphql/relay.py, global_id), which
// refuses any other spelling of the same parts: compact JSON with every character outside
// printable ASCII escaped (\u00e9, as Python's json does; JSON.stringify leaves it raw), and
// the agent's ID as the API returned it (lowercase).
function sessionNodeId(actionId, sessionId) {
  const json = JSON.stringify(["ActionSession", actionId, sessionId])
    .replace(/[^\x20-\x7e]/g, (c) => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0"));
  return btoa(json).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

async function sessionsView({ actionId }) {
  const agent = await loadAgent(actionId);
  if (!agent) return notFound(`No agent with ID ${actionId} was found.`);
  const out = [h("h1", { tabindex: -1 }, agent.name ? `Sessions of ${agent.name}` : "Sessions"),
    agentTabs(actionId, "Sessions")];
  if (!can("Action.sessions")) return [...out, refusal("Action.sessions")];
  const body = h("tbody");
  const more = moreButton("Show older sessions", body, load);
  async function load(after) {
    const data = await gql(`query($id: UUID!, $after: String) { action(actionId: $id) {
      sessions(first: ${PAGE}, after: $after) { nodes { sessionId turns created modified }
        pageInfo { hasNextPage endCursor } } } }`, { id: actionId, after: after || null });
    const page = data.action.sessions;
    for (const s of page.nodes) {
      append(body, [h("tr", {},
        h("td", { dataset: { label: "Session" } }, link(`#/agents/${actionId}/sessions/${encodeURIComponent(s.sessionId)}`, exact(s.sessionId))),
        h("td", { dataset: { label: "Turns" } }, String(s.turns)),
        h("td", { dataset: { label: "Started" } }, when(s.created)),
        h("td", { dataset: { label: "Last turn" } }, when(s.modified)))]);
    }
    if (!after && !page.nodes.length) append(body, [h("tr", {}, h("td", { colspan: 4 }, "No sessions yet."))]);
    more.hidden = !page.pageInfo.hasNextPage;
    more.dataset.after = page.pageInfo.endCursor || "";
  }
  await load(null);
  out.push(h("table", { class: "list" }, h("caption", {}, "Sessions, newest first"), h("thead", {}, h("tr", {},
    ["Session", "Turns", "Started", "Last turn"].map((t) => h("th", {}, t)))), body), more);
  return out;
}

function usageText(usage) {
  return Object.entries(usage || {}).map(([k, v]) => `${k} ${v}`).join(", ") || "no usage reported";
}

// What an event is called, where eraseSession left only its type (and a model call's or an
// embedding's purpose, model and usage).
const EVENT_TITLES = {
  "turn.input": "Input", "tool.execution": "Tool execution", "memory.pinned": "Pins",
  "memory.review": "Memory review", embedding: "Embedding", "output.use": "Output use",
  "context.cleared": "Context cleared", "context.summary": "Context summary", "turn.output": "Output",
  "turn.failed": "Failed",
};

function eventView(e) {
  const d = e.data || {};
  // What a tool returned or the model was given: history events (search_history) or records.
  const found = (o) => {
    const [n, what] = Array.isArray(o.events) ? [o.events.length, "history event"]
      : [(o.records || o.memories || o.sources || []).length, "record"];
    return ` · ${n} ${what}${n === 1 ? "" : "s"}`;
  };
  const head = (title, ...rest) => h("div", { class: "event-head" }, h("strong", {}, title), " ", ...rest);
  let body;
  if (d.erased && e.type !== "model.call") {
    body = [head(EVENT_TITLES[e.type] || e.type, badge("erased", "deleted"),
      e.type === "embedding" && d.tokens !== undefined ? ` · ${d.tokens} tokens` : "")];
    return h("li", { class: `event ${e.type.replace(/\./g, "-")}` }, body,
      h("details", {}, h("summary", {}, `Event ${e.sequence} data`), pre(d)));
  }
  switch (e.type) {
    case "turn.input":
      body = [head("Input"), h("div", { class: "text" }, typeof d.message === "string" ? d.message
        : typeof d.input === "string" ? d.input : json(d.input))];
      break;
    case "model.call":
      body = [head("Model call", badge(`purpose ${d.purpose}`), d.erased ? badge("erased", "deleted") : null,
        ` ${d.model || ""} · ${usageText(d.usage)}`,
        d.durationMs !== undefined ? ` · ${d.durationMs} ms` : ""),
      d.content ? h("div", { class: "text" }, d.content) : null,
      (d.toolCalls || []).length ? h("div", { class: "muted" }, "Calls: ",
        d.toolCalls.map((c, i) => [i ? ", " : "", h("bdi", {}, c.name)])) : null];
      break;
    case "tool.execution": {
      const recall = d.input && d.input.recall;
      body = [head(recall ? "Recall" : "Tool execution", badge(d.name || "tool"),
        found(d.output || {}), d.error ? badge("error", "deleted") : null),
      d.error ? h("div", { class: "text" }, d.error) : null];
      break;
    }
    case "memory.pinned":
      body = [head("Pins", `${(d.records || []).length} records listed in the instructions · ${d.tokens} tokens`)];
      break;
    case "memory.review": {
      const written = (d.written || []).length;
      body = [head("Memory review", d.messages ? `${d.messages.count} messages` : "",
        ` · ${(d.candidates || []).length} candidates · ${(d.decisions || []).length} decisions · ${written} written`),
      d.error ? h("div", { class: "text" }, d.error) : null];
      break;
    }
    case "embedding":
      body = [head("Embedding", `for ${d.for} · ${d.tokens} tokens`)];
      break;
    case "output.use":
      body = [head("Output use", `${d.use}${found(d)} reached the model`)];
      break;
    case "context.cleared":
      body = [head("Context cleared", `${d.results} tool results · ${d.tokens} tokens · ${d.reason}`)];
      break;
    case "context.summary":
      body = [head("Context summary", `${d.messages} messages folded`), h("div", { class: "text" }, d.summary || "")];
      break;
    case "turn.output":
      body = [head("Output"), h("div", { class: "text" }, typeof d.output === "string" ? d.output
        : typeof (d.output && d.output.message) === "string" ? d.output.message : json(d.output))];
      break;
    case "turn.failed":
      body = [head("Failed"), h("div", { class: "text" }, d.error || "")];
      break;
    default:
      body = [head(e.type)];
  }
  return h("li", { class: `event ${e.type.replace(/\./g, "-")}` }, body,
    h("details", {}, h("summary", {}, `Event ${e.sequence} data`), pre(d)));
}

async function hasHistorySearch() {
  if (historySearch === null) {
    try {
      // Validated, never run (@skip): a schema without the field fails validation.
      await gql(`{ node(id: "x") @skip(if: true) { ... on ActionSession {
        searchHistory(query: "x", first: 1) { score } } } }`);
      historySearch = true;
    } catch {
      historySearch = false;
    }
  }
  return historySearch;
}

// What an execution of a session is, by its kind (a replay re-runs a turn, counting none).
function executionTitle(x) {
  switch (x.kind) {
    case "ERASE": return `Erased by ${x.principal}`;
    case "OPERATOR": return `Operator write by ${x.principal}`;
    case "MCP": return `MCP tool call by ${x.principal}`;
    case "INGEST": return x.turn === null ? `Conversation handed in by ${x.principal}`
      : `Turn ${x.turn}: conversation handed in by ${x.principal}`;
    default: return `${x.replayOf ? "Replay of turn" : "Turn"}${x.turn === null ? "" : ` ${x.turn}`}`;
  }
}

// An ingest's messages, and an MCP call's tool and arguments, are its input, not transcript
// events: read when opened (an input may be as long as a megabyte).
function handedIn(x) {
  const body = h("div", {});
  let loaded = false;
  return h("details", { class: "handed-in", ontoggle: async (e) => {
    if (!e.target.open || loaded) return;
    loaded = true;
    body.replaceChildren(h("p", { class: "muted" }, "Loading…"));
    try {
      const data = await gql(`query($e: UUID!) { execution(executionId: $e) { input } }`, { e: x.executionId });
      const input = data.execution && data.execution.input;
      body.replaceChildren(x.kind === "INGEST" && input && Array.isArray(input.messages)
        ? h("ol", { class: "events" }, input.messages.map((m) => h("li", { class: "event" },
          h("div", { class: "event-head" }, h("strong", {}, String(m.role)), m.time ? ` ${when(m.time)}` : ""),
          h("div", { class: "text" }, typeof m.content === "string" ? m.content : json(m.content)))))
        : pre(input));
    } catch (error) {
      loaded = false;
      body.replaceChildren(problem(error));
    }
  } }, h("summary", {}, x.kind === "INGEST" ? "Messages handed in" : "Tool and arguments"), body);
}

async function sessionView({ actionId, sessionId }) {
  const agent = await loadAgent(actionId);
  const gone = ["No session ", exact(sessionId), ` of agent ${actionId} was found.`];
  // No session ID holds a NUL (the API refuses it), and the server refuses a node ID naming one.
  if (!agent || sessionId.includes("\0")) return notFound(gone);
  const out = [h("p", { class: "crumbs" }, link(`#/agents/${actionId}/sessions`, "← Sessions")),
    h("h1", { tabindex: -1 }, "Session ", exact(sessionId))];
  if (!can("ActionSession.executions")) return [...out, refusal("ActionSession.executions")];
  const id = sessionNodeId(agent.actionId, sessionId);
  const transcript = can("ActionExecution.transcript")
    ? `transcript(first: ${EVENTS}) { nodes { sequence invocationNumber type data created } pageInfo { hasNextPage } }` : "";
  const turns = h("div", { class: "turns" });
  const more = moreButton("Show older turns", turns, load);
  let found = true;
  async function load(after) {
    const data = await gql(`query($id: ID!, $after: String) { node(id: $id) { ... on ActionSession {
      sessionId turns executions(first: 10, after: $after) { nodes { executionId turn kind principal status
        preview replayOf error created ${transcript} } pageInfo { hasNextPage endCursor } } } } }`, { id, after: after || null });
    if (!data.node) { found = false; return; }
    for (const x of data.node.executions.nodes) {
      append(turns, [h("section", { class: "card turn" },
        h("h2", {}, executionTitle(x), " ",
          badge(x.status, x.status.toLowerCase()),
          x.preview ? badge("preview") : null, " ", h("span", { class: "when" }, when(x.created))),
        x.error ? h("p", { class: "error" }, x.error) : null,
        ["INGEST", "MCP"].includes(x.kind) && can("execution") ? handedIn(x) : null,
        !x.transcript ? refusal("ActionExecution.transcript")
          : x.transcript.nodes.length ? h("ol", { class: "events" }, x.transcript.nodes.map(eventView))
            : h("p", { class: "muted" }, "No transcript events."),
        x.transcript && x.transcript.pageInfo.hasNextPage
          ? h("p", { class: "notice" }, `Showing the first ${EVENTS} events of this turn; read the rest with the API `,
            "(ActionExecution.transcript).") : null)]);
    }
    more.hidden = !data.node.executions.pageInfo.hasNextPage;
    more.dataset.after = data.node.executions.pageInfo.endCursor || "";
  }
  try {
    await load(null);
  } catch (error) {
    if (!(error instanceof ApiError && error.code === "NOT_FOUND")) throw error;
    found = false;
  }
  if (!found) return notFound(gone);
  if (can("Action.memories")) {
    out.push(h("p", {}, link(`#/agents/${actionId}/memories?session=${encodeURIComponent(sessionId)}`,
      "Memories of this session")));
  }
  out.push(can("eraseSession") ? eraseButton(actionId, sessionId) : refusal("eraseSession"));
  if (can("ActionSession.searchHistory") && await hasHistorySearch()) {
    const query = h("input", { type: "search", required: true });
    const hits = h("p", { role: "status", class: "status" });
    const results = h("div");
    out.push(h("form", { class: "card inline", role: "search", onsubmit: async (e) => {
      e.preventDefault();
      clear(results);
      hits.textContent = "";
      try {
        const data = await gql(`query($id: ID!, $q: String!) { node(id: $id) { ... on ActionSession {
          searchHistory(query: $q, first: ${HITS + 1}) { score part text event { turn header } } } } }`, { id, q: query.value });
        // One more than shown: whether more matched, which a list (not a connection) does not say.
        const all = data.node ? data.node.searchHistory : [];
        const found = all.slice(0, HITS);
        hits.textContent = all.length > HITS
          ? `Showing the ${HITS} best matches; more matched. Refine the query to narrow them.`
          : `${found.length} match${found.length === 1 ? "" : "es"}.`;
        append(results, [h("ol", { class: "events" }, found.map((r) => h("li", { class: "event" },
          h("div", { class: "event-head" }, h("strong", {}, r.event.header), ` · score ${r.score.toFixed(4)}`),
          h("div", { class: "text" }, r.text)))), found.length ? null : h("p", {}, "Nothing matched.")]);
      } catch (error) {
        append(results, [problem(error)]);
      }
    } }, field("Search this session's history", query), h("button", { type: "submit" }, "Search history")), hits, results);
  }
  out.push(turns, more);
  return out;
}

const ERASE = `mutation($a: UUID!, $s: String!) { eraseSession(actionId: $a, sessionId: $s) {
  execution { executionId principal created } erasedEvents erasedExecutions erasedTranscriptEvents liveMemoryIds } }`;

// "Erase this session…": after a dialog that says what erasing removes and what it leaves, and
// the session's ID typed, eraseSession; the page then shows the turns as they are now, and
// above them what was erased.
function eraseButton(actionId, sessionId) {
  const status = h("div", { class: "status" });
  const erase = button("Erase this session…", async () => {
    status.replaceChildren();
    const ok = await confirmDialog({
      title: ["Erase session ", exact(sessionId), " for good?"],
      body: [
        h("p", {}, "Erasing removes for good what this session said: its history (what history search and the "
          + "agent's search_history find), with its vectors, its running summary, and the text of its turns and "
          + "operator writes (input, output, error and transcript), each replaced by [erased]. A model call keeps "
          + "its purpose, model and usage. It cannot be undone, and later turns of the session no longer read the "
          + "erased ones."),
        h("p", {}, "It does not delete the memory records the session's turns wrote: they stay, and the agent "
          + "still recalls them. The answer lists them, to delete one by one. The erasure is recorded in the "
          + `session as an execution of kind ERASE naming you (${viewer.principal}).`),
      ],
      ok: "Erase session",
      typed: sessionId,
    });
    if (!ok) return;
    // The report goes under this session's page only: one opened meanwhile is another's, and
    // the report names no session (this page lists the erasure when opened again).
    const here = location.hash;
    let erased;
    try {
      erased = (await gql(ERASE, { a: actionId, s: sessionId })).eraseSession;
    } catch (error) {
      // CONFLICT: a turn of the session is running; the server's sentence says to wait for it.
      status.replaceChildren(problem(error));
      return;
    }
    const summaries = await summariesOf(actionId, erased.liveMemoryIds);
    if (location.hash !== here) return;
    await route();
    const heading = document.querySelector("#main h1");
    if (!heading || location.hash !== here) return;
    const report = erasedReport(actionId, erased, summaries);
    heading.after(report);
    report.querySelector("h2").focus();
  }, { class: "danger" });
  return h("div", {}, erase, status);
}

// The summaries of records `ids` of agent `actionId` (the first SUMMARIES), by ID, read in one
// request where the grants allow it (else none: the IDs alone are shown).
async function summariesOf(actionId, all) {
  const ids = all.slice(0, SUMMARIES); // a request's aliases stay well under the server's token limit
  if (!ids.length || !can("agentMemory")) return {};
  const parts = ids.map((_, i) => `m${i}: agentMemory(actionId: $a, id: $m${i}) { summary }`);
  const variables = { a: actionId };
  ids.forEach((m, i) => { variables[`m${i}`] = m; });
  try {
    const data = await gql(`query($a: UUID!, ${ids.map((_, i) => `$m${i}: UUID!`).join(", ")}) {
      ${parts.join(" ")} }`, variables);
    return Object.fromEntries(ids.map((m, i) => [m, data[`m${i}`] && data[`m${i}`].summary]));
  } catch {
    return {};
  }
}

// What eraseSession answered: the counts, the ERASE execution, and the memory it left.
function erasedReport(actionId, erased, summaries) {
  const memories = erased.liveMemoryIds;
  const record = (m) => {
    const id = h("span", { class: "mono" }, m);
    const text = summaries[m] ? [summaries[m], " (", id, ")"] : id;
    return can("agentMemory") ? link(`#/agents/${actionId}/memories/${m}`, text) : text;
  };
  return h("section", { class: "card erased", "aria-labelledby": "erased-title" },
    h("h2", { id: "erased-title", tabindex: -1 }, "Session erased"),
    dl([["History events erased", String(erased.erasedEvents)],
      ["Executions whose input and output were erased", String(erased.erasedExecutions)],
      ["Transcript events erased", String(erased.erasedTranscriptEvents)],
      ["Recorded as", h("span", {}, "execution ", h("span", { class: "mono" }, erased.execution.executionId),
        ` of kind ERASE by ${erased.execution.principal} at ${when(erased.execution.created)}`)]]),
    memories.length
      ? [h("p", {}, `Left as they were: the session's ${memories.length} live memory record`
        + `${memories.length === 1 ? "" : "s"}, which the agent still recalls. Delete each that must go from its page.`),
      h("ul", { "aria-label": "Live memory records left" }, memories.map((m) => h("li", {}, record(m))))]
      : h("p", {}, "The session has no live memory records."));
}

// ---------------------------------------------------------------- clients and tokens

// How many pages of clients the next clients page loads at once: after a revocation loads it
// again (revokeIssued), as many as "Show more" had shown; then one again.
let clientPages = 1;

// The clients of account `account` (#/clients?account=ID), by default the signed-in one's.
async function clientsView({ account = null } = {}) {
  const pages = clientPages;
  clientPages = 1;
  const out = [h("h1", { tabindex: -1 }, "Clients and tokens")];
  if (!can("clients")) return [...out, refusal("clients")];
  if (account !== null && !UUID.test(account)) return notFound(`An account ID is a UUID, not “${account}”.`);
  const tokens = clientTokens();
  accountNames = await readAccounts();
  if (accountNames.size > 1) {
    out.push(accountChoice(account || viewer.accountId,
      (id, own) => own ? "#/clients" : `#/clients?account=${id}`,
      "Whose clients and tokens this page lists and creates."));
  }
  if (accountNames.has(account || viewer.accountId)) out.push(accountCard(account || viewer.accountId));
  const list = h("div", { dataset: { clientPages: 0 } });
  const shown = new Set(); // principals with a card: one created here is not listed again by "Show more"
  const more = moreButton("Show more clients", list, load);
  async function load(after) {
    const data = await gql(`query($after: String, $a: UUID) { clients(first: ${PAGE}, after: $after, accountId: $a) {
      nodes { ${CLIENT} ${tokens} }
      pageInfo { hasNextPage endCursor } } }`, { after: after || null, a: account });
    for (const c of data.clients.nodes) {
      if (shown.has(c.principal)) continue;
      shown.add(c.principal);
      append(list, [clientCard(c)]);
    }
    more.hidden = !data.clients.pageInfo.hasNextPage;
    more.dataset.after = data.clients.pageInfo.endCursor || "";
    list.dataset.clientPages = Number(list.dataset.clientPages) + 1;
  }
  await load(null);
  while (Number(list.dataset.clientPages) < pages && !more.hidden) await load(more.dataset.after);
  if (!can("Client.tokens")) out.push(refusal("Client.tokens"));
  if (!can("updateClient")) out.push(refusal("updateClient"));
  if (!can("deleteClient")) out.push(refusal("deleteClient"));
  out.push(can("createClient") ? newClient(list, shown, account) : refusal("createClient"));
  if (can("revokeTokensIssuedBy")) out.push(leakForm());
  if (can("adminEvents")) {
    out.push(h("p", {}, link(account && account !== viewer.accountId ? `#/activity?account=${account}` : "#/activity",
      "Activity of this account")));
  }
  return [...out, list, more];
}

// Which account a page shows, for a token that reads more than its own (the operator's): each
// account by name, then ID; choosing one opens the page at `address(id)` (`own`: the caller's).
function accountChoice(chosen, address, help) {
  const select = h("select", { name: "account", onchange: () => {
    location.hash = address(select.value, select.value === viewer.accountId);
  } }, [...accountNames].map(([id, name]) => h("option", { value: id, selected: id === chosen },
    `${name} (${id})${id === viewer.accountId ? ", yours" : ""}`)));
  return h("div", { class: "filters narrow" }, field("Account", select, help));
}

const RENAME_ACCOUNT = `mutation($a: UUID!, $n: String!, $e: String) {
  updateAccount(accountId: $a, input: {name: $n, expectedName: $e}) { name } }`;
const DELETE_ACCOUNT = "mutation($a: UUID!) { deleteAccount(accountId: $a) { name } }";

// The account whose clients the page lists: renamed where the grants allow it (a tenant its own,
// the operator any, its own too), passing the name shown, so that a rename made meanwhile is
// refused (CONFLICT) rather than undone; deleted by the operator, after a dialog, never its own
// (the default account). The server refuses an account that holds a client or an agent, saying
// what it holds and what to delete first, which is said here.
function accountCard(id) {
  const name = accountNames.get(id);
  const renames = can("updateAccount");
  const deletes = can("deleteAccount") && id !== viewer.accountId;
  if (!renames && !deletes) return null;
  const status = h("div", { class: "status" });
  const out = [h("h2", {}, "Account ", h("bdi", {}, name), " ", h("span", { class: "mono small-id copyable" }, id))];
  if (renames) {
    const input = h("input", { type: "text", autocomplete: "off", spellcheck: false, value: name });
    const nameField = field("New name", input, "1 to 200 characters, on one line; names need not be unique.");
    const submit = h("button", { type: "submit" }, "Rename account");
    out.push(h("form", { class: "inline", "aria-label": "Rename account", onsubmit: async (e) => {
      e.preventDefault();
      if (submit.disabled) return;
      status.replaceChildren();
      nameField.showError("");
      submit.disabled = true;
      try {
        const renamed = (await gql(RENAME_ACCOUNT, { a: id, n: input.value, e: name })).updateAccount;
        flash = `Renamed account “${name}” to “${renamed.name}”.`;
        await route();
      } catch (error) {
        if (error instanceof ApiError && error.code === "BAD_REQUEST") {
          nameField.showError(error.sentence);
          input.focus();
        } else {
          status.replaceChildren(problem(error));
        }
      } finally {
        submit.disabled = false;
      }
    } }, nameField, submit));
  }
  if (deletes) {
    out.push(button("Delete account…", async () => {
      status.replaceChildren();
      const ok = await confirmDialog({
        title: `Delete account ${name}?`,
        body: [
          h("p", {}, "Deleting removes account ", h("bdi", {}, name), ` (${id}). It cannot be undone.`),
          h("p", {}, "Only an account that holds nothing is deleted: no client and no agent. Otherwise nothing is "
            + "deleted, and you are told what it still holds: delete its clients first. An agent is never deleted, "
            + "so an account that holds one stays."),
        ],
        ok: "Delete account",
      });
      if (!ok) return;
      let gone = false; // deleted elsewhere (another operator, another tab) since the page loaded
      try {
        await gql(DELETE_ACCOUNT, { a: id });
      } catch (error) {
        if (!(error instanceof ApiError && error.code === "NOT_FOUND")) {
          status.replaceChildren(problem(error));
          return;
        }
        gone = true;
      }
      flash = gone ? `Account “${name}” was already deleted (by someone else, or in another tab).`
        : `Deleted account “${name}”.`;
      location.hash = "#/clients";
    }, { class: "danger", "aria-label": `Delete account ${name}` }));
  }
  return h("section", { class: "card account-card", "aria-label": "Manage account" }, out, status);
}

// After a leak, by the leaked token's ID: it may be revoked already, and so in no table.
function leakForm() {
  const input = h("input", { type: "text", autocomplete: "off", spellcheck: false, class: "mono" });
  const idField = field("Token ID", input, "The leaked token's tokenId (as “engram client tokens” prints it), or "
    + "the issuedByTokenId of a token it issued. It may be revoked already: the tokens it issued still name it.");
  const status = h("div", { class: "status" });
  const submit = h("button", { type: "submit", class: "danger" }, "Revoke with the tokens it issued");
  const form = h("form", { class: "inline", onsubmit: async (e) => {
    e.preventDefault();
    if (submit.disabled) return;
    status.replaceChildren();
    const id = input.value.trim().toLowerCase(); // as viewer.tokenId, to tell the signed-in token
    idField.showError(UUID.test(id) ? "" : "A token ID is a UUID: 32 hexadecimal digits in groups of 8-4-4-4-12, "
      + "such as 0b7c4f1e-2d3a-4b5c-8d9e-0f1a2b3c4d5e.");
    if (!UUID.test(id)) {
      input.focus();
      return;
    }
    submit.disabled = true;
    try {
      await revokeIssued(id, id);
    } catch (error) {
      status.replaceChildren(problem(error));
    } finally {
      submit.disabled = false;
    }
  } }, idField, submit);
  return h("details", { class: "card leak" },
    h("summary", {}, "Revoke every token a leaked token issued, by its ID"),
    h("p", {}, "A token that may create tokens may have issued others, which revoking it leaves working. This "
      + "revokes the token with that ID, if it is still there, each token it issued, each token those issued, "
      + "and so on: tokens of any client, in every account your grants reach."),
    form, status);
}

// "New client": the client form, empty; the client it creates heads the list, offering its first
// token.
function newClient(list, shown, accountId) {
  const said = h("p", { role: "status", class: "status" });
  let form = null;
  const open = h("button", { type: "button", onclick: () => {
    said.textContent = "";
    form = h("section", { class: "card new-client" }, clientForm(null, { saved, cancelled: close, accountId }));
    open.hidden = true;
    open.after(form);
    form.querySelector("input").focus();
  } }, "New client");
  function close() {
    form.remove();
    open.hidden = false;
    open.focus();
  }
  function saved(made) {
    form.remove();
    open.hidden = false;
    shown.add(made.principal);
    const tokens = can("Client.tokens") ? { nodes: [], pageInfo: { hasNextPage: false } } : undefined;
    const card = clientCard({ ...made, tokens }, { fresh: true });
    list.prepend(card);
    said.textContent = `Created client ${made.principal}.`;
    const heading = card.querySelector("h2");
    heading.tabIndex = -1;
    (card.querySelector("button.first-token") || heading).focus();
  }
  return h("div", {}, open, said);
}

const CLIENT = "principal name accountId modified policies { effect actions resources } coveredByViewer";
const TOKEN_PAGE = "nodes { tokenId prefix created expires lastUsed bootstrap issuedBy issuedByAccountId issuedByTokenId } "
  + "pageInfo { hasNextPage endCursor }";
// A card's client with its first page of tokens, when the grants allow reading them.
const clientTokens = () => (can("Client.tokens") ? `tokens(first: ${PAGE}) { ${TOKEN_PAGE} }` : "");
const DELETE_CLIENT = `mutation($p: String!, $a: UUID, $m: Timestamp) {
  deleteClient(principal: $p, accountId: $a, expectedModified: $m) { principal } }`;
const REVOKE = `mutation($p: String!, $t: UUID!, $a: UUID) {
  revokeClientToken(principal: $p, tokenId: $t, accountId: $a) { tokenId } }`;
const REVOKE_ISSUED = "mutation($t: UUID!) { revokeTokensIssuedBy(tokenId: $t) { tokenId prefix } }";
const CHAIN_READ = 1000; // tokens of a chain the revoke dialog reads before it asks
const CHAIN_SHOWN = 10; // of which it lists
const ISSUED = `query($t: UUID!) { tokensIssuedBy(tokenId: $t, first: ${CHAIN_READ}) {
  nodes { tokenId prefix accountId principal } pageInfo { hasNextPage } } }`;

// Whether token `t` of client `c` is the one this tab is signed in with (viewer.tokenId).
function signedInWith(c, t) {
  return c.accountId === viewer.accountId && c.principal === viewer.principal &&
    t.tokenId === viewer.tokenId;
}

const tokenName = (t) => (t.prefix ? `${t.prefix}…` : t.tokenId);
// A token's ID, small under what names it: what the leak form asks for. One click selects all of it.
const shownId = (id, label = "ID") => [" ", h("span", { class: "mono token-id" },
  h("span", { class: "muted" }, `${label} `), h("span", { class: "copyable" }, id))];
// Who issued a token: a client's principal (with its account when that is another, the
// operator's, and the token its request sent), or the service's own name for the command line,
// the bootstrap setting, the first start, or (read by a tenant) the default account; tokens
// issued before issuers were recorded name no one.
const tokenIssuer = (c, t) => {
  if (!t.issuedBy) return "not recorded";
  const via = t.issuedByTokenId ? shownId(t.issuedByTokenId, "via token") : null;
  if (t.issuedByAccountId && t.issuedByAccountId !== c.accountId) {
    return [t.issuedBy, " (account ", accountName(t.issuedByAccountId), ")", via];
  }
  return [t.issuedBy, via];
};

// The accounts' names by ID, read once a clients page (every page: they are few) where the
// grants allow it; a client outside the default account reads its own alone. Without them, or
// when the read fails, accounts show by ID, as before.
let accountNames = new Map();
const ACCOUNTS = `query($after: String) { accounts(first: 1000, after: $after) {
  nodes { accountId name } pageInfo { hasNextPage endCursor } } }`;

async function readAccounts() {
  const names = new Map();
  if (!can("accounts")) return names;
  try {
    let after = null;
    do {
      const page = (await gql(ACCOUNTS, { after })).accounts;
      for (const a of page.nodes) names.set(a.accountId, a.name);
      after = page.pageInfo.hasNextPage ? page.pageInfo.endCursor : null;
    } while (after);
  } catch {
    return new Map();
  }
  return names;
}

// Account `id` by its name where it is known, with its ID beside it (operators copy it).
function accountName(id) {
  const name = accountNames.get(id);
  if (name === undefined) return h("span", { class: "mono" }, id);
  return h("span", { class: "account" }, h("bdi", {}, name), " ", h("span", { class: "mono small-id copyable" }, id));
}

const counted = (n, one) => `${n} ${one}${n === 1 ? "" : "s"}`; // "3 tokens", "1 token"

// "Revoke with the tokens it issued", after a dialog: token `tokenId` (shown as `name`), if it is
// still there, and every token whose issuers lead back to it (revokeTokensIssuedBy). The clients
// page is then loaded again, each table as it is now, as many pages of clients as were shown,
// headed by what was revoked. A refusal is thrown, for the caller to say where it was asked.
async function revokeIssued(tokenId, name) {
  const mine = tokenId === viewer.tokenId;
  const chain = await readChain(tokenId);
  const among = chain && chain.nodes.some((t) => t.tokenId === viewer.tokenId);
  // Past the tokens read, the signed-in one may be among the rest.
  const notAmong = chain && !among && !chain.pageInfo.hasNextPage;
  const ok = await confirmDialog({
    title: `Revoke token ${name} and every token it issued?`,
    body: [
      mine ? h("p", { class: "notice" }, h("strong", {}, "This is the token you are signed in with."),
        " Revoking it signs you out of this console at once; sign in again with another token.") : null,
      chain ? chainSaid(chain) : null,
      h("p", {}, "Requests sending it, any token it issued, any token those issued, and so on, are refused from "
        + "now on: tokens of any client, in every account your grants reach. This cannot be undone; tokens "
        + "issued otherwise keep working."),
      mine || notAmong ? null : h("p", {}, among
        ? "The token you are signed in with is among them: this signs you out."
        : "If the token you are signed in with is among them, this signs you out."),
    ],
    ok: mine ? "Revoke all and sign out" : "Revoke with the tokens it issued",
  });
  if (!ok) return;
  const here = location.hash;
  const revoked = (await gql(REVOKE_ISSUED, { t: tokenId })).revokeTokensIssuedBy;
  const itself = revoked.some((t) => t.tokenId === tokenId);
  const issued = revoked.filter((t) => t.tokenId !== tokenId);
  let said;
  if (!revoked.length) {
    said = `Nothing revoked: token ${name} and every token it issued were revoked already, or your grants reach none `
      + "of them.";
  } else if (!issued.length) {
    said = `Revoked token ${name}: no token your grants reach was issued by it. Requests sending it are refused `
      + "from now on.";
  } else {
    said = `Revoked ${itself ? `token ${name} and ` : ""}the ${counted(issued.length, "token")} it issued, in turn`
      + `${itself ? "" : ` (token ${name} itself was revoked already)`}: requests sending any of them are refused `
      + "from now on.";
  }
  if (revoked.some((t) => t.tokenId === viewer.tokenId)) {
    signOut(`${said} The token you were signed in with was among them. Sign in with another token.`);
    return;
  }
  if (location.hash !== here) return;
  const shownPages = document.querySelector("#main [data-client-pages]");
  clientPages = shownPages ? Number(shownPages.dataset.clientPages) : 1;
  await route();
  const heading = document.querySelector("#main h1");
  if (!heading || location.hash !== here) return;
  const report = h("section", { class: "card revoked", "aria-labelledby": "revoked-title" },
    h("h2", { id: "revoked-title", tabindex: -1 }, revoked.length ? "Tokens revoked" : "Nothing revoked"),
    h("p", {}, said),
    revoked.length ? h("ul", { "aria-label": "Tokens revoked" },
      revoked.map((t) => h("li", { class: "mono" }, tokenName(t)))) : null);
  heading.after(report);
  report.querySelector("h2").focus();
}

// What revoking token `tokenId` with the tokens it issued would revoke now (tokensIssuedBy, its
// first CHAIN_READ), or null when the grants may not read tokens or the read fails: the dialog
// then says what goes in general words, as before the read.
async function readChain(tokenId) {
  if (!can("tokensIssuedBy")) return null;
  try {
    return (await gql(ISSUED, { t: tokenId })).tokensIssuedBy;
  } catch {
    return null;
  }
}

// The dialog's account of a chain read: how many tokens, of how many clients in how many
// accounts, and the first CHAIN_SHOWN of them.
function chainSaid(chain) {
  const found = chain.nodes;
  if (!found.length) {
    return h("p", { class: "chain" }, "Your grants reach no such token, nor any token it issued: nothing would be "
      + "revoked (it and what it issued were revoked already, or the ID names none).");
  }
  const clients = new Set(found.map((t) => JSON.stringify([t.accountId, t.principal])));
  const accounts = new Set(found.map((t) => t.accountId));
  const how = chain.pageInfo.hasNextPage ? `more than ${found.length} tokens; the first ${found.length} are`
    : counted(found.length, "token");
  const rest = found.length - CHAIN_SHOWN;
  return h("div", { class: "chain" },
    h("p", {}, `This revokes ${how} of ${counted(clients.size, "client")} in ${counted(accounts.size, "account")}:`),
    h("ul", { "aria-label": "Tokens to revoke" },
      found.slice(0, CHAIN_SHOWN).map((t) => h("li", {},
        h("span", { class: "mono" }, tokenName(t)), " of ", h("bdi", { class: "mono" }, t.principal),
        t.accountId === viewer.accountId ? "" : [" (account ", accountName(t.accountId), ")"])),
      rest > 0 ? h("li", {}, `and ${counted(rest, "other")}`) : null));
}

// Client `c`'s card: its policies and tokens, and what the grants allow doing with them. A
// `fresh` one was just created here: it offers its first token.
function clientCard(c, { fresh = false } = {}) {
  const status = h("div", { role: "status", class: "status" });
  const heading = h("h2");
  const policies = h("ul");
  const show = () => {
    // The name isolated (<bdi>): a right-to-left one would draw a principal's leading digits
    // to its left ("1 אבx" for name "אב", principal "1x").
    heading.replaceChildren(h("bdi", {}, c.name), " ", h("span", { class: "mono muted" }, c.principal),
      ...(fresh ? [" ", badge("new")] : []));
    policies.replaceChildren(...(c.policies.length ? c.policies.map((p) => h("li", { class: "mono" }, policyText(p)))
      : [h("li", {}, "None: this client may do nothing.")]));
  };
  show();
  const facts = h("div", {}, h("h3", {}, "Policies"), policies);
  const card = h("section", { class: "card client" }, heading, facts);
  append(card, [h("div", { class: "client-actions" }, clientChanges(c, facts, show), clientRemoval(c, card))]);
  const shown = h("div"); // a new token's secret, shown once
  const body = c.tokens ? h("tbody") : null;
  const table = h("table", { class: "list" }, h("caption", {}, `Tokens of ${c.principal}`), h("thead", {}, h("tr", {},
    ["Token", "Created", "Expires", "Last used", "Issued by", h("span", { class: "visually-hidden" }, "Actions")]
      .map((x) => h("th", {}, x)))), body);
  const empty = h("tr", {}, h("td", { colspan: 6 }, "No tokens."));

  async function revoke(t, tr) {
    const mine = signedInWith(c, t);
    const ok = await confirmDialog({
      title: mine ? `Revoke token ${tokenName(t)}, the one you are signed in with?` : `Revoke token ${t.prefix || t.tokenId}?`,
      body: [
        mine ? h("p", { class: "notice" }, h("strong", {}, "This is the token you are signed in with."),
          " Revoking it signs you out of this console at once; sign in again with another token.") : null,
        h("p", {}, `Requests sending this token of ${c.principal} are refused from now on. This cannot be undone; the client's other tokens keep working.`),
      ],
      ok: mine ? "Revoke and sign out" : "Revoke token",
    });
    if (!ok) return;
    let gone = false; // revoked elsewhere (another operator, another tab) since the list loaded
    try {
      await gql(REVOKE, { p: c.principal, t: t.tokenId, a: c.accountId });
    } catch (error) {
      if (!(error instanceof ApiError && error.code === "NOT_FOUND")) {
        status.replaceChildren(problem(error));
        return;
      }
      gone = true;
    }
    if (mine) {
      signOut(`You revoked token ${tokenName(t)}, the one you were signed in with. Sign in with another token.`);
      return;
    }
    // In place: the rest of the page, and pages loaded by "Show more", stay as they are.
    const next = tr.nextElementSibling || tr.previousElementSibling;
    tr.remove();
    if (!body.children.length) body.append(empty);
    if (shown.dataset.tokenId === t.tokenId) clear(shown);
    status.textContent = gone
      ? `Token ${tokenName(t)} was already revoked (by someone else, or in another tab, since this page `
        + "loaded): requests sending it are refused."
      : `Token ${tokenName(t)} revoked: requests sending it are refused from now on.`;
    const target = (next && next.querySelector("button")) || table;
    if (target === table) table.tabIndex = -1;
    target.focus();
  }

  const row = (t, fresh = false) => {
    const tr = h("tr", {},
      h("td", { dataset: { label: "Token" }, class: "mono" }, tokenName(t), fresh ? [" ", badge("new")] : null,
        shownId(t.tokenId)),
      h("td", { dataset: { label: "Created" } }, when(t.created)),
      h("td", { dataset: { label: "Expires" } }, t.expires ? when(t.expires) : "never"),
      h("td", { dataset: { label: "Last used" } }, t.lastUsed ? when(t.lastUsed) : "never"),
      h("td", { dataset: { label: "Issued by" } }, tokenIssuer(c, t)),
      h("td", {}, can("adminEvents") ? h("a", { href: `#/activity?token=${t.tokenId}`,
        class: "small-link", "aria-label": `Activity of token ${t.prefix || t.tokenId}` }, "Activity of this token") : null,
        t.bootstrap ? badge("bootstrap") : null, signedInWith(c, t) ? badge("signed in") : null,
        can("revokeClientToken") ? button("Revoke", () => revoke(t, tr),
          { class: "danger small", "aria-label": `Revoke token ${t.prefix || t.tokenId}` }) : null,
        can("revokeTokensIssuedBy") ? button("Revoke with the tokens it issued", async () => {
          status.replaceChildren();
          try {
            await revokeIssued(t.tokenId, tokenName(t));
          } catch (error) {
            status.replaceChildren(problem(error));
          }
        }, { class: "danger small", "aria-label": `Revoke with the tokens it issued: token ${t.prefix || t.tokenId}` })
          : null));
    return tr;
  };

  if (c.tokens) {
    append(body, c.tokens.nodes.length ? c.tokens.nodes.map((t) => row(t)) : [empty]);
    const more = moreButton("Show more tokens", body, async (after) => {
      try {
        const data = await gql(`query($p: String!, $a: UUID, $after: String) {
          client(principal: $p, accountId: $a) { tokens(first: ${PAGE}, after: $after) { ${TOKEN_PAGE} } } }`,
        { p: c.principal, a: c.accountId, after });
        const page = data.client ? data.client.tokens : { nodes: [], pageInfo: { hasNextPage: false } };
        append(body, page.nodes.map((t) => row(t)));
        more.hidden = !page.pageInfo.hasNextPage;
        more.dataset.after = page.pageInfo.endCursor || "";
      } catch (error) {
        status.replaceChildren(problem(error));
      }
    }, { class: "small" });
    more.hidden = !c.tokens.pageInfo.hasNextPage;
    more.dataset.after = c.tokens.pageInfo.endCursor || "";
    append(card, [table, more]);
  }
  append(card, [status]);
  // Just created: nothing can use it until it has a token, so its first is offered.
  const firstToken = !fresh ? null : can("createClientToken")
    ? h("p", { class: "notice" }, `Client ${c.principal} has no token yet, so nothing can use it. Create its first `
      + "token now (optionally with an expiry); it is shown once.")
    : refusal("createClientToken");
  append(card, [firstToken]);
  const issue = h("button", { type: "submit", class: fresh ? "first-token" : null },
    fresh ? "Create its first token" : "Create token");
  if (can("createClientToken") && c.coveredByViewer) {
    const expires = h("input", { type: "datetime-local" });
    const expiresField = field("Expires (optional, your local time)", expires);
    append(card, [h("form", { class: "inline", onsubmit: async (e) => {
      e.preventDefault();
      clear(shown);
      delete shown.dataset.tokenId;
      // The browser takes years past 9999, which neither a Date nor the server holds: said here,
      // not thrown as "RangeError: Invalid time value".
      const at = expires.value ? new Date(expires.value) : null;
      const unheld = at !== null && !(at.getUTCFullYear() <= 9999);
      expiresField.showError(unheld ? "A token expires at a time before the year 10000 (UTC): pick an earlier "
        + "date, or leave it empty for a token that does not expire." : "");
      if (unheld) {
        expires.focus();
        return;
      }
      try {
        const data = await gql(`mutation($p: String!, $a: UUID, $e: Timestamp) {
          createClientToken(principal: $p, accountId: $a, expires: $e) { token tokenId prefix created expires issuedBy issuedByAccountId issuedByTokenId } }`,
        { p: c.principal, a: c.accountId, e: at && at.toISOString() });
        const made = data.createClientToken;
        if (firstToken) firstToken.remove();
        issue.textContent = "Create token";
        if (body) {  // newest first, as the API lists them
          empty.remove();
          body.prepend(row({ ...made, lastUsed: null, bootstrap: false }, true));
        }
        shown.dataset.tokenId = made.tokenId;
        const once = tokenOnce(made);
        append(shown, [once]);
        once.querySelector("input").focus();
        once.querySelector("input").select();
      } catch (error) {
        append(shown, [problem(error)]);
      }
    } }, expiresField, issue), shown]);
  }
  return card;
}

// A new token's secret, shown this once, with a way to copy it.
function tokenOnce(made) {
  const value = h("input", { type: "text", readonly: true, value: made.token, class: "mono",
    "aria-label": "The new token" });
  const copied = h("span", { role: "status", class: "status" });
  const copy = button("Copy the token", async () => {
    value.select();
    try {
      await navigator.clipboard.writeText(made.token);
      copied.textContent = "Copied.";
    } catch {
      copied.textContent = "This browser did not let the page copy: the token is selected, press Ctrl+C (⌘C).";
    }
  }, { class: "secondary small" });
  return h("div", { class: "notice token-once", role: "status" },
    h("p", {}, h("strong", {}, `Token ${tokenName(made)} created. Copy it now: it is not shown again.`),
      " Only its hash is kept, so no one can read it later, you included; a lost token is replaced by "
      + "creating another."),
    value, copy, copied);
}

// "Delete client…", after a dialog saying what deleting does; not for the client this console is
// signed in as, which the server refuses (a client cannot delete itself): said instead. It passes
// the `modified` the card shows: a client changed, or deleted and created again under the same
// principal, since then is refused (CONFLICT) and not deleted; the card is then drawn again as
// the client is now, saying why, so deleting it is a choice made seeing it.
function clientRemoval(c, card) {
  if (!can("deleteClient")) return null;
  if (signedInAs(c)) {
    return h("p", { class: "muted" }, "This is the client you are signed in as: the console does not delete it, as a "
      + "client cannot delete itself (the server refuses it) and this console would lose its token. Sign in as "
      + "another client allowed to delete clients to delete it.");
  }
  const status = h("div", { class: "status" });
  const remove = button("Delete client…", async () => {
    status.replaceChildren();
    const ok = await confirmDialog({
      title: `Delete client ${c.principal}?`,
      body: [
        h("p", {}, `Deleting removes client ${c.principal} (`, h("bdi", {}, c.name), ") with its policies and every one of its tokens: "
          + "requests sending any of them are refused at once. It cannot be undone; a client created later with the "
          + "same principal gets none of them back."),
        h("p", {}, "What it did stays: agents, memory records and executions keep naming it as who made them."),
      ],
      ok: "Delete client",
    });
    if (!ok) return;
    let gone = false; // deleted elsewhere (another operator, another tab) since the page loaded
    try {
      await gql(DELETE_CLIENT, { p: c.principal, a: c.accountId, m: c.modified });
    } catch (error) {
      if (error instanceof ApiError && error.code === "CONFLICT" && /was changed or re-created since/.test(error.message)) {
        await redraw();
        return;
      }
      if (!(error instanceof ApiError && error.code === "NOT_FOUND")) {
        status.replaceChildren(problem(error));
        return;
      }
      gone = true;
    }
    // In place: a note where the card was, focused, and the rest of the list as it is.
    const note = h("p", { class: "notice", role: "status", tabindex: -1 }, gone
      ? `Client ${c.principal} was already deleted (by someone else, or in another tab, since this page loaded); `
        + "its tokens no longer work."
      : `Deleted client ${c.principal}: its tokens no longer work.`);
    card.replaceWith(note);
    note.focus();
  }, { class: "danger", "aria-label": `Delete client ${c.principal}` });

  // Refused as changed since the card was drawn: the card as the client is now, saying why.
  async function redraw() {
    const why = `Not deleted: client ${c.principal} was changed, or deleted and created again, after this page `
      + "loaded.";
    let now;
    try {
      now = (await gql(`query($p: String!, $a: UUID) { client(principal: $p, accountId: $a) {
        ${CLIENT} ${clientTokens()} } }`, { p: c.principal, a: c.accountId })).client;
    } catch (error) {
      status.replaceChildren(h("p", { class: "error", role: "alert" }, why), problem(error));
      return;
    }
    const note = h("p", { class: "notice", role: "status", tabindex: -1 }, `${why} `, now
      ? "It is shown below as it is now; delete it again if this client must go."
      : "It has since been deleted too; its tokens no longer work.");
    if (now) {
      const fresh = clientCard(now);
      fresh.querySelector("h2").after(note);
      card.replaceWith(fresh);
    } else {
      card.replaceWith(note);
    }
    note.focus();
  }
  return h("div", {}, remove, status);
}

// Whether client `c` is the one this console is signed in as.
const signedInAs = (c) => c.accountId === viewer.accountId && c.principal === viewer.principal;

// What a card offers for changing client `c`. updateClient and createClientToken refuse a client
// holding a grant the token's client does not (Client.coveredByViewer): then it says so instead.
function clientChanges(c, facts, show) {
  const edit = can("updateClient");
  const issue = can("createClientToken");
  if (!c.coveredByViewer) {
    if (!edit && !issue) return null;
    const [what, rule] = edit && issue
      ? ["edit this client or create tokens for it", "changes, and issues tokens for,"]
      : edit ? ["edit this client", "changes"] : ["create tokens for this client", "issues tokens for"];
    return h("p", { class: "notice" }, `Your token cannot ${what}: it holds grants yours does not `
      + `(a client ${rule} only clients that hold no more than it does).`);
  }
  if (!edit) return null;
  const said = h("p", { role: "status", class: "status" });
  let form = null;
  const open = h("button", { type: "button", class: "secondary", "aria-label": `Edit client ${c.principal}`,
    onclick: () => {
      said.textContent = "";
      form = clientForm(c, { saved, cancelled: close, changed: show });
      facts.hidden = open.hidden = true;
      facts.after(form);
      form.querySelector("input").focus();
    } }, "Edit client");
  function close() {
    form.remove();
    facts.hidden = open.hidden = false;
    open.focus();
  }
  async function saved(updated) {
    Object.assign(c, updated);
    show();
    close();
    said.textContent = `Saved client ${c.principal}.`;
    if (!signedInAs(c)) return;
    // Its own grants changed: what the console offers, here and elsewhere, may have too.
    try {
      viewer = await loadViewer(token.get());
    } catch (error) {
      said.replaceChildren(problem(error));
      return;
    }
    flash = `Saved client ${c.principal}, the one you are signed in as: the console now offers what its new `
      + "policies allow.";
    renderNav();
    await route();
  }
  return h("div", {}, open, said);
}

const CREATE_CLIENT = `mutation($input: ClientInput!) { createClient(input: $input) { ${CLIENT} } }`;
const UPDATE_CLIENT = `mutation($p: String!, $a: UUID, $input: ClientUpdateInput!) {
  updateClient(principal: $p, accountId: $a, input: $input) { ${CLIENT} } }`;
const READ_CLIENT = `query($p: String!, $a: UUID) { client(principal: $p, accountId: $a) { ${CLIENT} } }`;
const capital = (text) => text.charAt(0).toUpperCase() + text.slice(1).replace(/\.?$/, ".");

// The form editing client `c`, prefilled. It saves name and policies in one updateClient, with
// the `modified` it was filled from: a change made meanwhile is refused (CONFLICT), never
// overwritten unseen. What the server refuses is said at its field, or above the buttons, and
// the form stays open with what was typed. `changed(c)` redraws the client behind the form.
// Without `c` it is the form of a new client, with its principal, saved by createClient in
// account `accountId` (by default the signed-in one's).
function clientForm(c, { saved, cancelled, changed, accountId = null }) {
  const creating = !c;
  let base = creating ? null : c.modified;
  let busy = false;
  const principal = creating ? h("input", { type: "text", required: true, maxlength: 200, autocomplete: "off",
    spellcheck: false, class: "mono" }) : null;
  const principalField = creating ? field("Principal", principal, "What its tokens sign in as: 1 to 200 letters, "
    + "digits and _ . : @ / + -, starting with a letter or digit. It cannot be changed later.") : null;
  if (creating) principal.addEventListener("input", () => principalField.showError(""));
  const name = h("input", { type: "text", value: creating ? "" : c.name, required: true, maxlength: 200,
    autocomplete: "off" });
  const nameField = field("Name", name, creating ? "What people call it, such as Support console." : null);
  name.addEventListener("input", () => nameField.showError(""));
  const editor = policyEditor(creating ? [{ effect: "ALLOW", actions: ["SELECT"], resources: [] }] : c.policies);
  const outcome = h("div", { class: "status" });
  const save = h("button", { type: "submit" }, creating ? "Create client" : "Save changes");
  const title = h("h3", { id: `edit-${Math.random().toString(36).slice(2)}` },
    creating ? "New client" : `Edit client ${c.principal}`);
  const not = creating ? "Not created" : "Not saved";
  const say = (...text) => outcome.replaceChildren(h("div", { class: "error", role: "alert" }, ...text));

  async function refused(error) {
    const m = (error instanceof ApiError && error.message) || "";
    let x;
    switch (error instanceof ApiError ? error.code : null) {
      case "BAD_REQUEST":
        // "policies[1].resources: 'x' matches no known resource ..." names the field.
        x = /^policies\[(\d+)\]\.(effect|actions|resources):? ([\s\S]*)$/.exec(m);
        if (x && editor.showError(Number(x[1]), x[2], capital(x[3]))) {
          const what = { effect: "effect", actions: "verbs", resources: "resources" }[x[2]];
          return say(`${not}: correct the ${what} of policy ${Number(x[1]) + 1}.`);
        }
        if (/^client name\b/.test(m)) {
          nameField.showError(capital(m));
          name.focus();
          return say(`${not}: correct the name.`);
        }
        if (creating && /^principal\b/.test(m)) {
          principalField.showError(capital(m));
          principal.focus();
          return say(`${not}: correct the principal.`);
        }
        return say(`${not}: ${capital(m)}`);
      case "ACCESS_DENIED":
        x = /^the policies given to client .* allow (.+), which this client does not hold/.exec(m);
        if (x) {
          return say(`${not}: these policies would give ${x[1]}, which your token does not hold. A client `
            + "can give only grants it holds: remove those, or ask someone whose token holds them.");
        }
        x = /^client .* holds (.+), which this client does not hold/.exec(m);
        if (x) {
          return say(`Not saved: this client now holds ${x[1]}, which your token does not, so your token `
            + "cannot change it. Someone may have given it more since this page loaded.");
        }
        return say(`${not}. ${error.sentence}`);
      case "NOT_FOUND":
        if (creating) return say(`${not}. ${error.sentence}`);
        return say(`Not saved: client ${c.principal} no longer exists; someone may have deleted it.`);
      case "CONFLICT": {
        // A new client's principal taken (perhaps by someone else meanwhile): said at the field.
        if (creating && /already exists/.test(m)) {
          principalField.showError(`${capital(m)} Choose another principal, or edit that client.`);
          principal.focus();
          return say(`${not}: the principal is taken.`);
        }
        // Another transaction at the same moment: nothing to show, saving again may pass.
        if (creating || !/^client .* was changed at /.test(m)) return say(`${not}. ${error.sentence}`);
        // Changed since the form was filled: shown as it is now, so saving again is a choice.
        let now;
        try {
          now = (await gql(READ_CLIENT, { p: c.principal, a: c.accountId })).client;
        } catch (again) {
          return say("Not saved: someone changed this client after you opened this form. ", problem(again));
        }
        if (!now) return say(`Not saved: client ${c.principal} no longer exists; someone deleted it.`);
        base = now.modified;
        Object.assign(c, now);
        changed(c);
        return say(h("p", {}, "Not saved: someone changed this client after you opened this form. It is now:"),
          h("p", {}, "Name: ", h("strong", {}, now.name)),
          h("ul", {}, now.policies.map((p) => h("li", { class: "mono" }, policyText(p)))),
          h("p", {}, "Your edits are still in the form. Save changes to replace what it holds now with them, or "
            + "Cancel to keep it as it is."));
      }
      default:
        return outcome.replaceChildren(problem(error));
    }
  }

  const form = h("form", { class: "client-edit", "aria-labelledby": title.id, onsubmit: async (e) => {
    e.preventDefault();
    if (busy) return;
    nameField.showError("");
    if (creating) principalField.showError("");
    editor.clearErrors();
    outcome.replaceChildren();
    if (creating && !principal.value.trim()) {
      principalField.showError("Give the client a principal.");
      principal.focus();
      return;
    }
    if (!name.value.trim()) {
      nameField.showError("Give the client a name.");
      name.focus();
      return;
    }
    const problems = editor.problems();
    if (problems.length) {
      problems.reverse().forEach(([i, key, message]) => editor.showError(i, key, message));  // focus: the first
      return say(problems.length === 1 ? `${not}: correct the field marked below.`
        : `${not}: correct the ${problems.length} fields marked below.`);
    }
    busy = save.disabled = true;
    try {
      if (creating) {
        const input = { accountId, principal: principal.value.trim(), name: name.value, policies: editor.value() };
        await saved((await gql(CREATE_CLIENT, { input })).createClient);
      } else {
        const input = { name: name.value, policies: editor.value(), expectedModified: base };
        await saved((await gql(UPDATE_CLIENT, { p: c.principal, a: c.accountId, input })).updateClient);
      }
    } catch (error) {
      await refused(error);
    } finally {
      busy = save.disabled = false;
      if (form.isConnected && document.activeElement === document.body) save.focus();
    }
  } }, title,
  !creating && signedInAs(c) ? h("p", { class: "notice" }, "This is the client you are signed in as: grants you take from it, "
    + "this console loses as soon as you save.") : null,
  principalField, nameField, editor.element, outcome, save,
  h("button", { type: "button", class: "secondary", onclick: () => busy || cancelled() }, "Cancel"));
  form.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && !busy) {
      e.preventDefault();
      cancelled();
    } else if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      form.requestSubmit();  // from a text area, where Enter makes a new line
    }
  });
  return form;
}

// ---------------------------------------------------------------- activity

const ADMIN_EVENTS = `query($first: Int!, $after: String, $a: UUID, $t: UUID) {
  adminEvents(first: $first, after: $after, accountId: $a, tokenId: $t) {
    nodes { eventId accountId at actor actorAccountId actorTokenId operation targetKind target principal changes }
    pageInfo { hasNextPage endCursor } } }`;
const SMALL = 80; // characters of JSON a change of a kind not known here shows inline; longer, folded

// A token's ID, cut to its start on screen: one click selects all of it, to copy (the title shows
// it whole); `filter` adds a link that lists what the token changed.
function shortId(id, filter) {
  return [h("span", { class: "mono small-id copyable short-id", title: id }, id),
    filter ? [" ", h("a", { href: filter, class: "small-link", "aria-label": `Only token ${id}` }, "only this token")]
      : null];
}

// Who made a change: a client (with its account where that is another than the change's) and the
// token its request sent, or the words a start, the command line or (for a tenant) the operator
// is named by.
function actorOf(e, filter) {
  if (!e.actorAccountId) return h("span", { class: "muted" }, e.actor);
  return [h("bdi", { class: "mono" }, e.actor),
    e.actorAccountId !== e.accountId ? [" (account ", accountName(e.actorAccountId), ")"] : null,
    e.actorTokenId ? [h("br"), h("span", { class: "muted" }, "via token "), shortId(e.actorTokenId, filter(e.actorTokenId))]
      : null];
}

// What was changed, and in which account when the list spans several (a token's, in every account).
function targetOf(e, here) {
  let what;
  if (e.targetKind === "ACCOUNT") {
    const gone = !accountNames.has(e.target) && e.changes && typeof e.changes.name === "string";
    what = ["account ", gone ? [h("bdi", {}, e.changes.name), " ", h("span", { class: "mono small-id" }, e.target)]
      : accountName(e.target)];
  } else if (e.targetKind === "CLIENT") {
    what = ["client ", h("bdi", { class: "mono" }, e.target)];
  } else {
    what = ["token ", shortId(e.target), " of ", h("bdi", { class: "mono" }, e.principal || "")];
  }
  return [what, e.accountId !== here ? [h("br"), h("span", { class: "muted" }, "in account "), accountName(e.accountId)]
    : null];
}

const policyList = (policies) => (Array.isArray(policies) && policies.length
  ? h("ul", { class: "policies" }, policies.map((p) => h("li", { class: "mono" },
    p && p.effect && p.actions && p.resources ? policyText(p) : json(p))))
  : h("span", {}, "none"));

// An event's `changes` as sentences: names and policies with what they were, a token's expiry,
// the token revokeTokensIssuedBy was given; anything else as its JSON, folded when long.
function changesOf(e) {
  const c = e.changes && typeof e.changes === "object" && !Array.isArray(e.changes) ? { ...e.changes } : null;
  if (!c) return e.changes === null || e.changes === undefined ? "" : pre(e.changes);
  const items = [];
  if ("name" in c) {
    items.push("previousName" in c
      ? h("li", {}, "name “", h("bdi", {}, String(c.previousName)), "” → “", h("bdi", {}, String(c.name)), "”")
      : h("li", {}, "name “", h("bdi", {}, String(c.name)), "”"));
    delete c.name;
    delete c.previousName;
  }
  if ("policies" in c) {
    if ("previousPolicies" in c) {
      items.push(h("li", {}, "policies were ", policyList(c.previousPolicies)));
      items.push(h("li", {}, "policies now ", policyList(c.policies)));
    } else {
      items.push(h("li", {}, "policies ", policyList(c.policies)));
    }
    delete c.policies;
    delete c.previousPolicies;
  }
  if ("expires" in c) {
    items.push(h("li", {}, c.expires ? `expires ${when(c.expires)}` : "never expires"));
    delete c.expires;
  }
  if (e.operation === "revokeTokensIssuedBy" && typeof c.tokenId === "string") {
    items.push(h("li", {}, "revoked with the tokens issued by token ", shortId(c.tokenId)));
    delete c.tokenId;
  }
  for (const [key, value] of Object.entries(c)) {
    const text = JSON.stringify(value);
    items.push(text.length <= SMALL ? h("li", {}, `${key} `, h("span", { class: "mono" }, text))
      : h("li", {}, h("details", {}, h("summary", {}, key), pre(value))));
  }
  return items.length ? h("ul", { class: "changes" }, items) : "";
}

// The address's parameters: `account` (the operator's choice of account) and `token` (what one
// token changed), each a UUID; anything else is said, not ignored.
function activityParams(query) {
  const params = {};
  for (const part of (query || "").split("&").filter(Boolean)) {
    const at = part.indexOf("=");
    const [key, value] = at < 0 ? [part, ""] : [part.slice(0, at), part.slice(at + 1)];
    if (!["account", "token"].includes(key) || key in params) return { error: `the parameter “${key}”` };
    if (!UUID.test(value)) return { error: `“${value}” as the ${key} (a UUID is expected)` };
    params[key] = value.toLowerCase();
  }
  return params;
}

function activityAddress({ account = null, token = null }) {
  const query = [account ? `account=${account}` : null, token ? `token=${token}` : null].filter(Boolean).join("&");
  return query ? `#/activity?${query}` : "#/activity";
}

// Who changed the account's clients and tokens, or the account, newest first (adminEvents): the
// signed-in client's account, or the one the operator picks (#/activity?account=ID); with a
// token's ID (#/activity?token=ID), only what requests sending it changed, in every account the
// grants reach unless an account is named too.
async function activityView({ query = "" } = {}) {
  const out = [h("h1", { tabindex: -1 }, "Activity")];
  if (!can("adminEvents")) return [...out, refusal("adminEvents")];
  const params = activityParams(query);
  if (params.error) {
    return notFound(["The activity page's address takes an account and a token, each by its ID: ",
      h("span", { class: "mono" }, "#/activity?account=ID&token=ID"), `; not ${params.error}. `,
      link("#/activity", "Show this account's activity"), "."]);
  }
  const { account = null, token = null } = params;
  const here = account || viewer.accountId;
  accountNames = await readAccounts();
  if (accountNames.size > 1) {
    out.push(accountChoice(here, (id, own) => activityAddress({ account: own ? null : id, token }),
      "Whose changes this page lists."));
  }
  const input = h("input", { type: "text", name: "token", autocomplete: "off", spellcheck: false, class: "mono",
    value: token || "" });
  const tokenField = field("Token ID", input, "Only what requests sending this token changed, whether it was "
    + "revoked since or not" + (account ? "." : ", in every account your grants reach."));
  const filterForm = h("form", { class: "card filters", "aria-label": "Filter by token", onsubmit: (e) => {
    e.preventDefault();
    const id = input.value.trim().toLowerCase();
    const bad = id !== "" && !UUID.test(id);
    tokenField.showError(bad ? "A token ID is a UUID: 32 hexadecimal digits in groups of 8-4-4-4-12, such as "
      + "0b7c4f1e-2d3a-4b5c-8d9e-0f1a2b3c4d5e." : "");
    if (bad) {
      input.focus();
      return;
    }
    location.hash = activityAddress({ account, token: id || null });
  } }, tokenField, h("button", { type: "submit" }, "Filter"),
  token ? [" ", link(activityAddress({ account }), "Every token's changes")] : null);
  out.push(filterForm);

  const filter = (id) => (id === token ? null : activityAddress({ account, token: id }));
  const body = h("tbody");
  const listError = h("div");
  const more = moreButton("Show more", body, load);
  async function load(after) {
    const data = await gql(ADMIN_EVENTS, { first: PAGE, after: after || null, a: account, t: token });
    const page = data.adminEvents;
    append(body, page.nodes.map((e) => h("tr", {},
      h("td", { dataset: { label: "When" } }, when(e.at)),
      h("td", { dataset: { label: "Who" }, class: "wrap" }, actorOf(e, filter)),
      h("td", { dataset: { label: "Operation" }, class: "mono" }, e.operation),
      h("td", { dataset: { label: "Target" }, class: "wrap" }, targetOf(e, here)),
      h("td", { dataset: { label: "Changes" }, class: "wrap" }, changesOf(e)))));
    if (!after && !page.nodes.length) {
      append(body, [h("tr", {}, h("td", { colspan: 5 }, token ? "This token changed nothing here." : "No changes yet."))]);
    }
    more.hidden = !page.pageInfo.hasNextPage;
    more.dataset.after = page.pageInfo.endCursor || "";
  }
  try {
    await load(null);
  } catch (error) {
    append(listError, [problem(error)]);
  }
  const whose = account ? ["in account ", accountName(account)] : token ? ["in every account you reach"]
    : ["in this account"];
  const caption = h("caption", {}, "Changes ", token ? ["made with token ", shortId(token), " "] : null, whose,
    ", newest first");
  return [...out, listError, h("table", { class: "list activity" }, caption,
    h("thead", {}, h("tr", {}, ["When", "Who", "Operation", "Target", "Changes"].map((t) => h("th", {}, t)))), body),
  more];
}

// ---------------------------------------------------------------- routing

const ROUTES = [
  [/^\/?$/, agentsView, []],
  [/^\/clients$/, clientsView, []],
  [/^\/clients\?account=([^&]*)$/, clientsView, ["account"]],
  [/^\/activity$/, activityView, []],
  [/^\/activity\?(.*)$/, activityView, ["query"]],
  [/^\/agents\/new$/, newAgentView, []],
  [/^\/agents\/([^/]+)$/, agentView, ["actionId"]],
  [/^\/agents\/([^/]+)\/memories$/, memoriesView, ["actionId"]],
  [/^\/agents\/([^/]+)\/memories\?session=([^&]*)$/, memoriesView, ["actionId", "session"]],
  [/^\/agents\/([^/]+)\/memories\?/, badFilter, ["actionId"]],
  [/^\/agents\/([^/]+)\/memories\/([^/]+)$/, recordView, ["actionId", "memoryId"]],
  [/^\/agents\/([^/]+)\/sessions$/, sessionsView, ["actionId"]],
  [/^\/agents\/([^/]+)\/sessions\/([^/]+)$/, sessionView, ["actionId", "sessionId"]],
];

async function route() {
  if (!viewer) return;
  const path = location.hash.replace(/^#/, "") || "/";
  const mine = ++rendering;
  main.setAttribute("aria-busy", "true");
  let content;
  try {
    let view = null;
    const params = {};
    for (const [pattern, fn, names] of ROUTES) {
      const m = pattern.exec(path);
      if (m) {
        view = fn;
        try {
          names.forEach((n, i) => { params[n] = decodeURIComponent(m[i + 1]); });
        } catch {
          // A "%" not followed by two hex digits, or escapes that spell no text (a lone surrogate).
          view = () => notFound(`The address ${path} is not well-formed: each “%” in it must begin the escape `
            + "of a character, such as %25 for “%” itself, %26 for “&”, %23 for “#” and %3F for “?”.");
        }
        break;
      }
    }
    content = view ? await view(params) : notFound(`There is no page at ${path}.`);
  } catch (error) {
    content = [h("h1", { tabindex: -1 }, "Something went wrong"), problem(error)];
  }
  if (mine !== rendering) return;
  if (!viewer) {  // signed out meanwhile: the sign-in form is not busy
    main.removeAttribute("aria-busy");
    return;
  }
  clear(main);
  append(main, [content]);
  if (flash) {
    const heading = main.querySelector("h1");
    if (heading) heading.after(h("p", { class: "notice", role: "status" }, flash));
    flash = null;
  }
  main.removeAttribute("aria-busy");
  const heading = main.querySelector("h1");
  if (heading && document.activeElement === document.body) heading.focus();
}

window.addEventListener("hashchange", () => {
  // Only "#/..." names a page ("#main", the skip link's, is a place on this one).
  if (location.hash && !location.hash.startsWith("#/")) return;
  // Signed out on the way (the token expired), the sign-in form keeps the focus on its field.
  route().then(() => { const h1 = main.querySelector("h1"); if (h1 && viewer) h1.focus(); });
});

document.querySelector("a.skip").addEventListener("click", (event) => {
  event.preventDefault();  // the hash names pages: moving focus must not leave this one
  main.focus();
});

async function start() {
  const saved = token.get();
  if (!saved) return signIn();
  try {
    viewer = await loadViewer(saved);
  } catch (error) {
    if (error instanceof ApiError && error.code === "UNAUTHENTICATED") return signOut(error.sentence);
    // Not answering (down, restarting): the token is kept, shown once, and may be tried again.
    clear(main);
    main.removeAttribute("aria-busy");
    append(main, [h("h1", { tabindex: -1 }, "Engram is not answering"), problem(error),
      button("Try again", () => start())]);
    main.querySelector("h1").focus();
    return;
  }
  renderNav();
  await route();
}

start();

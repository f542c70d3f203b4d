// A client's policies as form fields: one group a policy, with its effect, verbs and resource
// patterns. Any form that gives a client policies (updateClient, createClient) uses this one.

import { field, h } from "./dom.js";

const EFFECTS = ["ALLOW", "DENY"];
const VERBS = ["SELECT", "INSERT", "UPDATE", "DELETE"];
const EXAMPLE = "financial.AgentMemory.*";

export function policyText(p) {
  return `${p.effect} ${p.actions.join(", ")} on ${p.resources.join(", ")}`;
}

// Checkboxes in a group with a legend, and a place for the error that names the group.
function choices(legend, values, chosen) {
  const boxes = values.map((v) => h("input", { type: "checkbox", value: v, checked: chosen.includes(v) }));
  const error = h("p", { class: "field-error", role: "alert", hidden: true });
  const group = h("fieldset", { class: "choices" }, h("legend", {}, legend),
    boxes.map((box, i) => h("label", {}, box, " ", values[i])), error);
  error.id = `f-${Math.random().toString(36).slice(2)}`;
  group.setAttribute("aria-describedby", error.id);
  group.showError = (message) => {
    error.textContent = message || "";
    error.hidden = !message;
    group.toggleAttribute("aria-invalid", Boolean(message));
  };
  group.value = () => boxes.filter((b) => b.checked).map((b) => b.value);
  group.focus = () => boxes[0].focus();
  return group;
}

function policyGroup(policy, remove) {
  const effect = h("select", {}, EFFECTS.map((e) => h("option", { value: e, selected: e === policy.effect }, e)));
  const resources = h("textarea", { rows: 3, class: "mono", spellcheck: false, autocomplete: "off" },
    policy.resources.join("\n"));
  const fields = {
    effect: field("Effect", effect),
    actions: choices("Verbs", VERBS, policy.actions),
    resources: field("Resources", resources),
  };
  const controls = { effect, actions: fields.actions, resources };
  // What the server refused is said until the field is changed.
  for (const [key, f] of Object.entries(fields)) {
    f.addEventListener(key === "actions" ? "change" : "input", () => f.showError(""));
  }
  const legend = h("legend", {});
  const removeButton = h("button", { type: "button", class: "secondary small", onclick: remove });
  const group = h("fieldset", { class: "policy" }, legend, h("div", { class: "row" }, fields.effect, fields.actions),
    fields.resources, removeButton);
  group.number = (n) => {
    legend.textContent = `Policy ${n}`;
    removeButton.textContent = "Remove this policy";
    removeButton.setAttribute("aria-label", `Remove policy ${n}`);
  };
  group.value = () => ({
    effect: effect.value,
    actions: fields.actions.value(),
    resources: resources.value.split(/[\s,]+/).filter(Boolean),
  });
  group.showError = (key, message) => fields[key].showError(message);
  group.clearErrors = () => Object.values(fields).forEach((f) => f.showError(""));
  group.focusOn = (key) => controls[key].focus();
  return group;
}

// `policies` prefill it. `value()` is the list updateClient takes, in the order shown, so that
// the server's "policies[1].resources: ..." names the second group.
export function policyEditor(policies) {
  const list = h("div", { class: "policies" });
  const empty = h("p", { class: "notice" }, "No policies: a client without any may do nothing.");
  const groups = [];
  const renumber = () => {
    groups.forEach((g, i) => g.number(i + 1));
    if (groups.length) empty.remove();
    else list.before(empty);
  };
  const addGroup = (policy) => {
    const group = policyGroup(policy, () => {
      const at = groups.indexOf(group);
      groups.splice(at, 1);
      group.remove();
      renumber();
      (groups[at] ? groups[at].querySelector("select") : add).focus();
    });
    groups.push(group);
    list.append(group);
    renumber();
    return group;
  };
  const add = h("button", { type: "button", class: "secondary", onclick: () => {
    addGroup({ effect: "ALLOW", actions: ["SELECT"], resources: [] }).focusOn("resources");
  } }, "Add a policy");
  const element = h("div", {}, h("h4", {}, "Policies"),
    h("p", { class: "hint" }, "A request is allowed when an ALLOW policy matches its verb and resource and no "
      + `DENY policy does. Resources: one pattern a line, such as ${EXAMPLE}; * matches any run of characters, `
      + "? one character."),
    list, add);
  policies.forEach(addGroup);
  renumber();

  return {
    element,
    value: () => groups.map((g) => g.value()),
    clearErrors: () => groups.forEach((g) => g.clearErrors()),
    // Shows `message` at policy `index`'s field `key` (effect, actions, resources), focused.
    showError(index, key, message) {
      const group = groups[index];
      if (!group) return false;
      group.showError(key, message);
      group.focusOn(key);
      return true;
    },
    // What the server would refuse, said first and in the same places: [index, key, message].
    problems() {
      const found = [];
      groups.forEach((g, i) => {
        const p = g.value();
        if (!p.actions.length) found.push([i, "actions", "Choose at least one verb."]);
        if (!p.resources.length) {
          found.push([i, "resources", `Name at least one resource pattern, such as ${EXAMPLE}.`]);
        }
      });
      return found;
    },
  };
}

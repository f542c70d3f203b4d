// DOM helpers. Data is only ever set as text (textContent, attributes, properties), never
// parsed as HTML, so whatever a record or a model said shows as written.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2).toLowerCase(), value);
    else if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key in el && typeof value !== "string") el[key] = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

// Characters that hide or reorder text around them: controls, bidi embeddings, overrides and
// isolates, zero-width spaces and the BOM (app/text.py's list, less the joiners and marks that
// scripts and emoji need). Data shows each as its code point, so a record's summary cannot pose
// as other text ("safe\u202Eexe.txt" reading "safetxt.exe"); a text area keeps them as stored.
const DISGUISING = /[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]/g;

export function codePoint(char) {
  return `U+${char.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}`;
}

function text(value) {
  const parts = value.split(DISGUISING);
  if (parts.length === 1) return document.createTextNode(value);
  const fragment = document.createDocumentFragment();
  const hidden = value.match(DISGUISING);
  parts.forEach((part, i) => {
    if (part) fragment.append(part);
    if (i < hidden.length) {
      const code = codePoint(hidden[i]);
      fragment.append(h("span", { class: "hidden-char", title: `${code}, a character that is not shown` }, code));
    }
  });
  return fragment;
}

// An ID a person must tell from another (a session's ID, a text typed to confirm), isolated
// from the sentence around it (<bdi>): besides what text() shows as code points, so do format
// characters (U+200E, U+200F, the joiners, a soft hyphen), spaces other than U+0020, and a
// U+0020 at either end or beside another. "s-1 ", "s-1\u200E" and "a  b" would read as "s-1" and
// "a b", and "\u200F12 34" as "34 12", each another session's ID.
const UNSEEN = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]|[^\S ]|^ +| +$| {2,}/gu;

export function exact(value) {
  const el = h("bdi", { class: "exact" });
  let at = 0;
  for (const m of String(value).matchAll(UNSEEN)) {
    append(el, [m.input.slice(at, m.index)]);
    for (const char of m[0]) {
      const code = codePoint(char);
      el.append(h("span", { class: "hidden-char", title: `${code}, a character that is not shown` }, code));
    }
    at = m.index + m[0].length;
  }
  append(el, [String(value).slice(at)]);
  return el;
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    if (child instanceof Node) el.append(child);
    else el.append(el instanceof HTMLTextAreaElement ? String(child) : text(String(child)));
  }
  return el;
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

export function json(value) {
  return JSON.stringify(value, null, 2);
}

export function when(value) {
  if (!value) return "";
  const d = new Date(value);
  return isNaN(d) ? String(value) : d.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

export function link(href, ...children) {
  return h("a", { href }, ...children);
}

// A field with its label and a place for the error that names it.
export function field(label, control, hint) {
  const id = control.id || `f-${Math.random().toString(36).slice(2)}`;
  control.id = id;
  const error = h("p", { class: "field-error", id: `${id}-error`, role: "alert", hidden: true });
  control.setAttribute("aria-describedby", `${id}-error`);
  const wrapper = h("div", { class: "field" },
    h("label", { for: id }, label), hint ? h("p", { class: "hint" }, hint) : null, control, error);
  wrapper.showError = (message) => {
    error.textContent = message || "";
    error.hidden = !message;
    control.toggleAttribute("aria-invalid", Boolean(message));
  };
  return wrapper;
}

// The page's one confirmation dialog: `title`, `body` (what the action does, its description)
// and the `ok` button's label. With `typed`, the operator types that text before `ok` is
// enabled: for what cannot be undone, so a stray Enter confirms nothing.
export function confirmDialog({ title, body, ok, typed }) {
  const dialog = document.getElementById("confirm");
  const place = document.getElementById("confirm-typed");
  append(clear(document.getElementById("confirm-title")), [title]);
  clear(document.getElementById("confirm-body"));
  append(document.getElementById("confirm-body"), [body]);
  const okButton = document.getElementById("confirm-ok");
  const cancel = document.getElementById("confirm-cancel");
  okButton.textContent = ok;
  let input = null;
  let matches = null;
  if (typed !== undefined) {
    // The text as typed, or as shown: a character shown as its code point ("s-1U+200E") may be
    // typed so, as few keyboards type a U+200E.
    const shown = exact(typed).textContent;
    matches = () => input.value === typed || input.value === shown;
    const id = `f-${Math.random().toString(36).slice(2)}`;
    input = h("input", { id, type: "text", autocomplete: "off", spellcheck: false, class: "mono",
      "aria-describedby": `${id}-hint` });
    append(place, [h("div", { class: "field" }, h("label", { for: id }, "Type ", h("strong", {}, exact(typed)), " to confirm"),
      h("p", { class: "hint", id: `${id}-hint` }, `“${ok}” is enabled once what is typed here matches exactly`,
        shown === typed ? "." : "; type a character shown as its code point (U+…) as the character or as shown."),
      input)]);
    okButton.disabled = true;
    input.oninput = () => { okButton.disabled = !matches(); };
  }
  return new Promise((resolve) => {
    const done = (answer) => {
      okButton.onclick = cancel.onclick = dialog.oncancel = null;
      okButton.disabled = false;
      clear(place);
      if (dialog.open) dialog.close();
      resolve(answer);
    };
    okButton.onclick = () => done(true);
    cancel.onclick = () => done(false);
    dialog.oncancel = () => done(false);
    if (input) {
      input.onkeydown = (e) => {
        if (e.key === "Enter" && matches()) done(true);
      };
    }
    dialog.showModal();
    (input || cancel).focus();
  });
}

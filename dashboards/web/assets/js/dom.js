// Tiny DOM helpers: build elements from plain data, re-render a region without losing focus.

const SVG_NS = "http://www.w3.org/2000/svg";

function apply(el, attrs) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") el.setAttribute("class", Array.isArray(value) ? value.filter(Boolean).join(" ") : value);
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (name.startsWith("on") && typeof value === "function") el.addEventListener(name.slice(2), value);
    else if (name === "text") el.textContent = value;
    else if (name === "value" && "value" in el) el.value = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** h("a", {href: "#/"}, "Home") → <a href="#/">Home</a>. Falsy children are skipped. */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  apply(el, attrs);
  append(el, children);
  return el;
}

/** The same for SVG elements. */
export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  apply(el, attrs);
  append(el, children);
  return el;
}

/**
 * Replace the content of `region` by `nodes`, keeping keyboard focus on the element with the
 * same `data-key` (a poll must not throw the user's focus back to the top of the page).
 */
export function render(region, ...nodes) {
  const active = document.activeElement;
  const key = active && region.contains(active) ? active.dataset.key : undefined;
  region.replaceChildren();
  append(region, nodes);
  if (key !== undefined) {
    const again = region.querySelector(`[data-key="${CSS.escape(key)}"]`);
    if (again) again.focus({ preventScroll: true });
  }
}

// Data: the CDI controller's live directory — every object with its owner, host, size and age —
// the ownership moves seen while this page is open, each minion (with whether its objects
// outlive a restart, and what its last restart kept) and the channel topics open now.

import { h, render } from "../dom.js";
import { api } from "../api.js";
import { poll } from "../live.js";
import { card, containerChip, containerHue, empty, errorBox, mono, statusPill, table } from "../components.js";
import { agoSeconds, bytes, clock, plural, shortId } from "../format.js";

const MOVES_KEPT = 60;

export function mount(root, ctx) {
  ctx.setTitle("Data");
  const tiles = h("div", { class: "tiles", id: "data-tiles" });
  const owners = h("div", { id: "owners" });
  const objects = h("div", { id: "objects" }, h("p", { class: "loading", style: "padding:0 16px" }, "Loading…"));
  const movesBox = h("div", { id: "moves" });
  const minions = h("div", { id: "minions" });
  const channels = h("div", { id: "channels" });
  const problems = h("div", { class: "slot" });
  const objectsNote = h("span", {}, "Refreshed every second");
  const moves = [];
  let previous = null; // key → object, from the last poll

  root.append(
    h(
      "div",
      { class: "page" },
      h(
        "div",
        { class: "page-head" },
        h("div", {}, h("h1", { tabindex: -1 }, "Data"), h("p", { class: "sub" }, "CDI objects in shared memory, live from the CDI controller. Exactly one container owns each object; watch ownership move as tasks run.")),
      ),
      problems,
      tiles,
      h(
        "div",
        { class: "grid-main grid-wide" },
        card("CDI objects", objects, { id: "card-objects", cls: "card-flush", subtitle: objectsNote }),
        h(
          "div",
          { style: "display:grid;gap:18px;min-width:0" },
          card("Who holds the data", owners, { id: "card-owners", subtitle: "Bytes by owning container" }),
          card("Ownership moves", movesBox, { id: "card-moves", subtitle: "Seen since this page opened" }),
          card("Minions", minions, { id: "card-minions", cls: "card-flush", subtitle: "One per host" }),
          card("Channels", channels, { id: "card-channels", cls: "card-flush", subtitle: "Shared-memory topics open now" }),
        ),
      ),
    ),
  );

  function track(list) {
    const now = Date.now();
    const current = new Map(list.map((o) => [o.key, o]));
    const changed = new Set();
    if (previous) {
      for (const o of list) {
        const before = previous.get(o.key);
        if (!before) moves.unshift({ key: o.key, wf: o.workflow_id, from: null, to: o.owner, at: now, what: "created" });
        else if (before.owner !== o.owner || before.generation !== o.generation) {
          // Every transfer bumps the generation: a quick there-and-back between two polls
          // still shows as a move, with how many hand-offs it took.
          const hops = Math.max(1, o.generation - before.generation);
          moves.unshift({ key: o.key, wf: o.workflow_id, from: before.owner, to: o.owner, at: now, what: "moved", hops });
          changed.add(o.key);
        }
      }
      for (const [key, o] of previous) {
        if (!current.has(key)) moves.unshift({ key, wf: o.workflow_id, from: o.owner, to: null, at: now, what: "released" });
      }
      moves.splice(MOVES_KEPT);
    }
    previous = current;
    return changed;
  }

  async function refresh() {
    const dir = await api.get("/api/cdi/objects");
    render(problems);
    const changed = track(dir.objects);
    const byOwner = new Map();
    for (const o of dir.objects) byOwner.set(o.owner, (byOwner.get(o.owner) || 0) + o.size);
    const alive = dir.minions.filter((m) => m.alive).length;

    render(
      tiles,
      tile("Objects", dir.objects.length.toLocaleString(), "in the directory", "objects"),
      tile("Bytes held", bytes(dir.total_bytes), "in shared memory", "bytes"),
      tile("Owners", String(byOwner.size), "containers holding data", "owners"),
      tile("Minions up", `${alive} / ${dir.minions.length}`, alive < dir.minions.length ? "some minions are silent" : "all reporting", "minions"),
    );

    render(
      owners,
      byOwner.size
        ? h(
            "div",
            { style: "display:grid;gap:10px" },
            h("div", { class: "owner-bar", role: "img", "aria-label": "Bytes by owner" }, [...byOwner].map(([owner, size]) => h("span", { style: `width:${(100 * size) / (dir.total_bytes || 1)}%;--hue:${containerHue(owner)}`, title: `${owner || "nobody"}: ${bytes(size)}` }))),
            h("ul", { class: "moves" }, [...byOwner].sort((a, b) => b[1] - a[1]).map(([owner, size]) => h("li", {}, containerChip(owner), h("span", { class: "when num" }, bytes(size))))),
          )
        : empty("Nobody holds any data", "Objects exist only while a workflow runs."),
    );

    render(
      objects,
      dir.objects.length
        ? table(
            [
              {
                label: "Key",
                cls: "key-cell",
                cell: (o) => (o.workflow_id ? h("a", { href: `#/workflows/${o.workflow_id}`, class: "mono", title: `${o.key} — open its workflow`, "data-key": `obj-${o.key}` }, o.key) : mono(o.key, { title: o.key })),
              },
              { label: "Owner", cell: (o) => containerChip(o.owner) },
              { label: "Host", cell: (o) => o.host },
              { label: "Size", align: "right", cls: "num nowrap", cell: (o) => h("span", { title: `${o.size.toLocaleString()} bytes` }, bytes(o.size)) },
              { label: "Gen.", align: "right", cls: "num", cell: (o) => String(o.generation) },
              { label: "Age", align: "right", cls: "num nowrap", cell: (o) => short(o.age_s) },
              { label: "Changed", align: "right", cls: "num nowrap", cell: (o) => short(Date.now() / 1000 - o.updated_at) },
            ],
            dir.objects,
            { rowAttrs: (o) => ({ "data-object": o.key, "data-owner": o.owner, class: changed.has(o.key) ? "flash" : null }), caption: "CDI objects", cls: "objects" },
          )
        : h("div", { style: "padding:0 16px 4px" }, empty("No CDI objects right now", "An object lives while its workflow runs: the scheduler creates it from the input and hands it from worker to worker. Start a workflow and watch it here.", h("a", { class: "btn", href: "#/workflows?start=1" }, "Start workflow"))),
    );

    render(
      movesBox,
      moves.length
        ? h(
            "ul",
            { class: "moves", id: "moves-list" },
            moves.map((m) =>
              h(
                "li",
                { "data-move": m.what, "data-workflow": m.wf || "" },
                m.what === "moved" ? [containerChip(m.from), "→", containerChip(m.to), m.hops > 1 ? h("span", { class: "muted", title: "Ownership changed this many times between two looks" }, `${m.hops} hand-offs`) : null] : m.what === "created" ? [h("span", { class: "tag", title: "First seen, with this owner" }, "new"), containerChip(m.to)] : [h("span", { class: "tag" }, "released"), containerChip(m.from)],
                m.wf ? h("a", { href: `#/workflows/${m.wf}`, class: "mono" }, shortId(m.wf)) : mono(m.key),
                h("span", { class: "when" }, clock(new Date(m.at))),
              ),
            ),
          )
        : empty("No moves yet", "Hand-offs appear here as the directory reports them."),
    );

    render(
      minions,
      dir.minions.length
        ? h(
            "ul",
            { class: "moves", style: "padding:0 16px 10px" },
            dir.minions.map((m) =>
              h(
                "li",
                { "data-minion": m.host },
                mono(m.host),
                statusPill(m.alive ? "UP" : "GONE"),
                h("span", { class: "muted" }, `${plural(m.containers, "container")} · ${plural(m.objects, "object")}`),
                survival(m),
                h("span", { class: "when" }, `heartbeat ${agoSeconds(m.heartbeat_age_s)}`),
              ),
            ),
          )
        : h("div", { style: "padding:0 16px 4px" }, empty("No minion has registered", null)),
    );

    render(
      channels,
      dir.channels.length
        ? h(
            "ul",
            { class: "moves", style: "padding:0 16px 10px" },
            dir.channels.map((c) =>
              h(
                "li",
                { "data-channel": c.name, "data-host": c.host },
                mono(c.name, { title: `channel/${c.name} on ${c.host}` }),
                containerChip(c.writer),
                "→",
                c.readers.length ? c.readers.map((r) => containerChip(r)) : h("span", { class: "muted" }, "no reader yet"),
                h("span", { class: "when num", title: "The ring's size" }, bytes(c.ring_bytes)),
              ),
            ),
          )
        : h("div", { style: "padding:0 16px 4px" }, empty("No channel open", "A topic (cdi.channels) shows here while its writer holds its ring: its writer, the readers that joined it and its ring's size.")),
    );
    objectsNote.textContent = `${plural(dir.objects.length, "object")} · refreshed every second`;
  }

  return poll(refresh, 1000, (err) => render(problems, errorBox(err.message, err.problems)));
}

/** Whether a minion's objects outlive its restarts (a state folder), how often it restarted and
 * what its last start found again. */
function survival(m) {
  if (!m.keeps_objects) return h("span", { class: "tag", "data-survival": "off", title: "No state folder: a restart of this minion loses its objects" }, "objects end with it");
  const text = m.restarts ? `kept ${plural(m.kept_objects, "object")} at restart ${m.restarts}` : "no restart yet";
  return h(
    "span",
    { class: "muted", "data-survival": "on", "data-restarts": String(m.restarts), "data-kept": String(m.kept_objects), title: "A state folder: its objects, owners and shares outlive a restart of the minion (not a host reboot)" },
    h("span", { class: "tag" }, "keeps objects"),
    " ",
    text,
  );
}

/** "now", "4 s", "3 min": an age that fits a narrow column. */
function short(seconds) {
  return seconds < 1 ? "now" : agoSeconds(seconds).replace(" ago", "");
}

function tile(label, value, note, key) {
  return h("div", { class: "tile t-data", "data-key": `tile-${key}` }, h("span", { class: "tile-label" }, label), h("span", { class: "tile-value", "data-tile": key }, value), h("span", { class: "tile-note" }, note));
}

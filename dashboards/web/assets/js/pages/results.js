// A run's stored results on its page: each named result ({step}.{output}; a list output's
// elements as {step}.{output}[i]) links to its download, fetched with the signed-in key (a
// plain link cannot send it) and saved under the name it was stored with.

import { h } from "../dom.js";
import { ApiError, downloadFile } from "../api.js";
import { empty, mono, table, toast } from "../components.js";

/** The run's results by name, as GET /api/workflows/{id}/results/{name} takes them. */
export function storedResults(wf) {
  const listed = wf.output?.results;
  const flat = [];
  if (!listed || typeof listed !== "object") return flat;
  for (const [name, uri] of Object.entries(listed)) {
    if (typeof uri === "string") flat.push({ name, uri });
    else if (Array.isArray(uri)) uri.forEach((u, i) => typeof u === "string" && flat.push({ name: `${name}[${i}]`, uri: u }));
  }
  return flat;
}

async function save(event, wf, result) {
  event.preventDefault();
  const filename = result.uri.split("/").pop();
  try {
    await downloadFile(`/api/workflows/${wf.id}/results/${encodeURI(result.name)}`, filename);
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    toast(`${result.name}: ${err.message}`, "error");
  }
}

export function resultsTable(wf) {
  if (wf.status !== "COMPLETED") {
    const why = ["PENDING", "RUNNING"].includes(wf.status) ? "They are stored when the run completes." : `The run is ${wf.status}: it stored none.`;
    return h("div", { style: "padding:0 16px 4px" }, empty("No results", why));
  }
  const results = storedResults(wf);
  if (!results.length) {
    return h("div", { style: "padding:0 16px 4px" }, empty("No stored results", "What the run made was small JSON: its output holds it."));
  }
  return table(
    [
      { label: "Result", cell: (r) => h("a", { href: `#/workflows/${wf.id}`, class: "mono", "data-result": r.name, title: `Download ${r.name}`, onclick: (event) => save(event, wf, r) }, r.name) },
      { label: "Stored as", cls: "wrap", cell: (r) => mono(r.uri) },
    ],
    results,
    { rowAttrs: (r) => ({ "data-result-row": r.name }), caption: "Stored results", cls: "results" },
  );
}

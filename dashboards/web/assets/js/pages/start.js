// The "Start a workflow" dialog: a definition and its version, the input as an S3 URI or a
// file uploaded through POST /api/inputs (as the image, or as a data field such as ar_video's
// `video`), JSON data every task gets as ctx.input, policy and data plane → POST /api/workflows.

import { h } from "../dom.js";
import { api, ApiError, uploadFile } from "../api.js";
import { errorBox, field, toast } from "../components.js";
import { shortId } from "../format.js";

const DATA_FIELD = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** Why the form cannot be sent as it is (and which control to fix), or null. */
function refusal(uri, file, passAs, dataText) {
  if (uri && !/^s3:\/\/[^/]+\/.+/.test(uri)) return ["image", "Write the image as s3://bucket/key."];
  if (file && passAs !== "image" && !DATA_FIELD.test(passAs)) return ["passAs", "Pass the file as image, or as a data field name (letters, digits, _), e.g. video."];
  if (file && passAs === "image" && uri) return ["image", "Give the image as an S3 URI or upload it, not both."];
  if (dataText) {
    try {
      const data = JSON.parse(dataText);
      if (data === null || typeof data !== "object" || Array.isArray(data)) return ["data", "Data must be a JSON object, e.g. {\"frames\": 25}."];
    } catch (err) {
      return ["data", `Data is not JSON: ${err.message}`];
    }
  }
  return null;
}

/** Resolves once the dialog is closed; a started run opens its page. */
export async function startWorkflowDialog(navigate) {
  let definitions = [];
  try {
    definitions = await api.get("/api/workflow-definitions");
  } catch (err) {
    toast(err.message, "error");
    return;
  }
  let last = localStorage.getItem("cdiflow.lastImage") || "";
  if (!last) {
    // Offer the newest run's input: most people start with an image the cluster already saw.
    const recent = await api.get("/api/workflows?limit=1").catch(() => null);
    last = recent?.items?.[0]?.input?.image || "";
  }
  const errors = h("div", { "aria-live": "polite" });
  const controls = {
    workflow: h("select", { name: "workflow" }, definitions.map((d) => h("option", { value: d.name }, d.name))),
    version: h("select", { name: "version" }),
    image: h("input", { name: "image", value: last, placeholder: "s3://bucket/path/image.jpg (empty: a dataless run)", spellcheck: "false", autocomplete: "off", class: "mono" }),
    file: h("input", { name: "file", type: "file" }),
    passAs: h("input", { name: "pass_as", value: "image", placeholder: "image, or a data field such as video", spellcheck: "false", autocomplete: "off", class: "mono" }),
    data: h("textarea", { name: "data", rows: 3, placeholder: '{"frames": 25}  (optional: every task gets it as ctx.input)', spellcheck: "false" }),
  };
  const start = h("button", { type: "submit", class: "btn btn-primary" }, "Start");
  const form = h(
    "form",
    { method: "dialog", novalidate: true },
    h("div", { class: "row" }, field("Workflow", controls.workflow), field("Version", controls.version)),
    field("Input image (S3 URI)", controls.image),
    h("div", { class: "row" }, field("Upload a file", controls.file), field("Pass the file as", controls.passAs)),
    field("Data (JSON object)", controls.data),
    h(
      "div",
      { class: "row" },
      field("Policy", h("select", { name: "policy" }, ["affinity", "transfer", "auto"].map((p) => h("option", { value: p }, p)))),
      field("Data plane", h("select", { name: "data_plane" }, ["cdi", "object-store"].map((p) => h("option", { value: p }, p)))),
    ),
    errors,
    h("div", { class: "buttons" }, h("button", { type: "button", class: "btn", value: "cancel", "data-close": "" }, "Cancel"), start),
  );
  const dialog = h("dialog", { "aria-labelledby": "start-title", id: "start-dialog" }, h("h2", { id: "start-title" }, "Start a workflow"), form);
  document.body.append(dialog);
  dialog.addEventListener("close", () => dialog.remove());
  form.querySelector("[data-close]").addEventListener("click", () => dialog.close());

  async function showVersions() {
    const name = controls.workflow.value;
    const current = h("option", { value: "" }, "current");
    controls.version.replaceChildren(current);
    if (!name) return;
    const versions = await api.get(`/api/workflow-definitions/${encodeURIComponent(name)}/versions`).catch(() => []);
    if (controls.workflow.value !== name) return; // another was chosen meanwhile
    if (versions.length) current.textContent = `current (v${versions[0].version})`;
    controls.version.append(...versions.map((v) => h("option", { value: String(v.version) }, `v${v.version}`)));
  }
  controls.workflow.addEventListener("change", showVersions);

  function refuse(control, message, problems = []) {
    for (const c of Object.values(controls)) c.removeAttribute("aria-invalid");
    if (control) {
      controls[control].setAttribute("aria-invalid", "true");
      controls[control].focus();
    }
    errors.replaceChildren(errorBox(message, problems));
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const uri = controls.image.value.trim();
    const file = controls.file.files[0] || null;
    const passAs = controls.passAs.value.trim() || "image";
    const dataText = controls.data.value.trim();
    const wrong = refusal(uri, file, passAs, dataText);
    if (wrong) {
      refuse(...wrong);
      return;
    }
    const input = uri ? { image: uri } : {};
    if (dataText) input.data = JSON.parse(dataText);
    start.disabled = true;
    try {
      if (file) {
        start.textContent = "Uploading…";
        const stored = await uploadFile(file);
        if (passAs === "image" && !stored.content_type.startsWith("image/")) {
          refuse("passAs", `${file.name} is ${stored.content_type}, not an image: pass it as the data field its workflow reads (ar_video reads video).`);
          return;
        }
        if (passAs === "image") input.image = stored.uri;
        else input.data = { ...(input.data || {}), [passAs]: stored.uri };
      }
      start.textContent = "Starting…";
      const body = Object.fromEntries(new FormData(form));
      const payload = { workflow: body.workflow, input, policy: body.policy, data_plane: body.data_plane };
      if (body.version) payload.version = Number(body.version);
      const run = await api.post("/api/workflows", payload);
      if (uri) localStorage.setItem("cdiflow.lastImage", uri);
      dialog.close();
      toast(`Started ${shortId(run.id)}`, "success");
      navigate(`/workflows/${run.id}`);
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      refuse(null, err.message, err.problems);
    } finally {
      start.disabled = false;
      start.textContent = "Start";
    }
  });
  dialog.showModal();
  showVersions();
  (last ? controls.workflow : controls.image).focus();
}

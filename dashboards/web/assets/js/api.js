// The REST API, same origin, with the signed-in API key. Errors carry the API's own words
// (detail, problems, known). The key lives in sessionStorage: it stays while the tab is open
// and leaves with it, and no cookie carries it to the API behind the user's back.

const KEY_ITEM = "cdiflow.apiKey";
const ROLES = ["viewer", "operator", "admin"];
let identity = null; // {id, name, role} of the signed-in key
const signedOut = new Set();

export function apiKey() {
  return sessionStorage.getItem(KEY_ITEM);
}

/** Remember `key` for this tab after the API accepted it; `who` is /api/whoami's answer. */
export function signIn(key, who) {
  sessionStorage.setItem(KEY_ITEM, key);
  identity = who;
}

/** Forget the key; `reason` says why when it was not the user's choice. */
export function signOut(reason = "") {
  sessionStorage.removeItem(KEY_ITEM);
  identity = null;
  for (const listener of signedOut) listener(reason);
}

const REFUSED = "The API no longer accepts the key you signed in with (it was revoked?); sign in again.";

/** Called with a reason when the key is dropped (signed out, or refused): the shell asks for one. */
export function onSignedOut(listener) {
  signedOut.add(listener);
}

export function whoAmI() {
  return identity;
}

export function setIdentity(who) {
  identity = who;
}

/** Whether the signed-in key's role may do what `needed` ("operator", "admin") may. */
export function allowed(needed) {
  return identity !== null && ROLES.indexOf(identity.role) >= ROLES.indexOf(needed);
}

export class ApiError extends Error {
  constructor(status, body, fallback) {
    super(ApiError.describe(body) || fallback);
    this.status = status;
    this.body = body;
  }

  /** Every problem as a sentence: ours ({detail, problems}) or FastAPI's ([{loc, msg}]). */
  get problems() {
    const body = this.body;
    if (body && Array.isArray(body.problems) && body.problems.length) return body.problems;
    if (body && Array.isArray(body.detail)) {
      return body.detail.map((e) => {
        const where = (e.loc || []).filter((p) => p !== "body").join(".");
        // A body that is not strict JSON: the reason is in ctx.error, the place is an offset.
        if (e.type === "json_invalid") return `${e.msg}: ${e.ctx?.error ?? "not JSON"}`;
        return where ? `${where}: ${e.msg}` : e.msg;
      });
    }
    return [];
  }

  static describe(body) {
    if (!body) return "";
    if (typeof body.detail === "string") return body.detail;
    if (Array.isArray(body.detail)) return "the request is not valid";
    return "";
  }
}

function headers(extra = {}) {
  const key = apiKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

// A GET the browser dropped without an answer is sent again, twice at most, after these pauses:
// Chromium drops requests in flight when the machine's network changes (ERR_NETWORK_CHANGED,
// e.g. a container or VPN interface coming up). Other methods are not sent again: the first
// may have landed.
const RESENDS_MS = [250, 1000];

async function call(method, path, body, key) {
  const init = { method, headers: key ? { Accept: "application/json", Authorization: `Bearer ${key}` } : headers({ Accept: "application/json" }) };
  if (body instanceof FormData) {
    init.body = body; // the browser writes the multipart Content-Type with its boundary
  } else if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = typeof body === "string" ? body : JSON.stringify(body);
  }
  let response;
  for (let sent = 0; response === undefined; sent++) {
    try {
      response = await fetch(path, init);
    } catch (err) {
      if (method !== "GET" || sent >= RESENDS_MS.length) {
        throw new ApiError(0, null, `the API is unreachable (${err.message})`);
      }
      await new Promise((resolve) => setTimeout(resolve, RESENDS_MS[sent]));
    }
  }
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (response.status === 401 && !key && apiKey()) signOut(REFUSED); // revoked while in use
  if (!response.ok) throw new ApiError(response.status, data, `${method} ${path}: HTTP ${response.status}`);
  return data;
}

export const api = {
  get: (path) => call("GET", path),
  post: (path, body) => call("POST", path, body),
  put: (path, body) => call("PUT", path, body),
  del: (path) => call("DELETE", path),
  /** GET with a key that is not (yet) the signed-in one: how the sign-in checks it. */
  getWith: (path, key) => call("GET", path, undefined, key),
};

/** Store a File through POST /api/inputs: the API's answer ({uri, content_type, bytes, ...}). */
export function uploadFile(file) {
  const form = new FormData();
  form.append("file", file, file.name);
  return call("POST", "/api/inputs", form);
}

async function fetchBlob(path) {
  let response;
  try {
    response = await fetch(path, { headers: headers() });
  } catch (err) {
    throw new ApiError(0, null, `the API is unreachable (${err.message})`);
  }
  if (response.status === 401 && apiKey()) signOut(REFUSED);
  if (!response.ok) {
    const body = await response.json().catch(() => null);
    throw new ApiError(response.status, body, `GET ${path}: HTTP ${response.status}`);
  }
  return response.blob();
}

/**
 * An image the API serves (a thumbnail) as an object URL: an <img src> cannot send the key.
 * The caller revokes it (URL.revokeObjectURL) when the image goes.
 */
export async function imageUrl(path) {
  return URL.createObjectURL(await fetchBlob(path));
}

/** Save a file the API serves (a run's result) as `filename`: a link cannot send the key. */
export async function downloadFile(path, filename) {
  const url = URL.createObjectURL(await fetchBlob(path));
  const link = document.createElement("a");
  link.href = url;
  link.download = filename;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000); // the browser has the bytes by then
}

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") q.set(k, v);
  }
  const text = q.toString();
  return text ? `?${text}` : "";
}

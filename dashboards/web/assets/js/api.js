// The REST API, same origin. Errors carry the API's own words (detail, problems, known).

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

async function call(method, path, body) {
  const init = { method, headers: { Accept: "application/json" } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = typeof body === "string" ? body : JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, null, `the API is unreachable (${err.message})`);
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
  if (!response.ok) throw new ApiError(response.status, data, `${method} ${path}: HTTP ${response.status}`);
  return data;
}

export const api = {
  get: (path) => call("GET", path),
  post: (path, body) => call("POST", path, body),
  put: (path, body) => call("PUT", path, body),
};

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") q.set(k, v);
  }
  const text = q.toString();
  return text ? `?${text}` : "";
}

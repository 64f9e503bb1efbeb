// The service's public API as the playground calls it: JSON in and out, the tab's API key as a
// bearer token, and the stage timings of each answer's Server-Timing header.

export const KEY_STORAGE = "tserve-api-key"; // sessionStorage: the key lives as long as the tab

export class ApiError extends Error {
  constructor(status, body, retryAfter) {
    const error = (body && body.error) || {};
    super(error.message || `HTTP ${status}`);
    this.status = status;
    this.type = error.type || "http_error";
    this.details = error.details || [];
    this.requestId = error.request_id;
    this.retryAfter = retryAfter;
  }
}

export class NetworkError extends Error {}

// What a 401 or 403 does besides failing the call (the page asks for a key).
let onUnauthorized = () => {};
export function whenUnauthorized(handler) {
  onUnauthorized = handler;
}

// GET without a body, POST with one, or the method named.
export async function call(path, body, method = body === undefined ? "GET" : "POST") {
  const headers = { Accept: "application/json" };
  const key = sessionStorage.getItem(KEY_STORAGE);
  if (key) headers.Authorization = `Bearer ${key}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const started = performance.now();
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (error) {
    throw new NetworkError(`the service could not be reached (${error.message})`);
  }
  let payload = null;
  try {
    payload = await response.json();
  } catch {
    payload = null; // a proxy's HTML error page, an empty body: the status still says what happened
  }
  const roundTrip = performance.now() - started;
  if (!response.ok) {
    const error = new ApiError(response.status, payload, response.headers.get("Retry-After"));
    if (response.status === 401 || response.status === 403) onUnauthorized(error);
    throw error;
  }
  return { payload, timings: parseServerTiming(response.headers.get("Server-Timing")), roundTrip };
}

// Split at `separator` outside double quotes (a description may hold commas and semicolons).
function splitUnquoted(text, separator) {
  const parts = [];
  let current = "";
  let quoted = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === "\\" && quoted) {
      current += c + (text[++i] ?? "");
      continue;
    }
    if (c === '"') quoted = !quoted;
    if (c === separator && !quoted) {
      parts.push(current.trim());
      current = "";
    } else {
      current += c;
    }
  }
  parts.push(current.trim());
  return parts;
}

// 'name;dur=1.2;desc="…", …' (W3C Server Timing) → [{name, dur, desc}]
function parseServerTiming(header) {
  if (!header) return [];
  return splitUnquoted(header, ",")
    .filter(Boolean)
    .map((metric) => {
      const [name, ...params] = splitUnquoted(metric, ";");
      const entry = { name, dur: null, desc: "" };
      for (const param of params) {
        const eq = param.indexOf("=");
        const key = param.slice(0, eq).trim().toLowerCase();
        const value = param
          .slice(eq + 1)
          .trim()
          .replace(/^"(.*)"$/, "$1")
          .replace(/\\(.)/g, "$1");
        if (key === "dur") entry.dur = Number(value);
        if (key === "desc") entry.desc = value;
      }
      return entry;
    });
}

// The JSON API over fetch, with the session cookie and Django's CSRF header.

let csrfToken = "";

export function setCsrfToken(token) {
  csrfToken = token;
}

export class ApiError extends Error {
  constructor(status, code, detail) {
    super(detail);
    this.status = status;
    this.code = code;
  }
}

export async function api(path, { method = "GET", body, signal } = {}) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET") headers["X-CSRFToken"] = csrfToken;
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
    signal,
  });
  if (response.status === 401) {
    // The session ended: back to the sign-in page, then here again.
    location.assign(`/accounts/login/?next=${encodeURIComponent(location.pathname)}`);
    throw new ApiError(401, "unauthenticated", "Sign in first.");
  }
  if (response.status === 204) return null;
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    const error = data?.error || {};
    throw new ApiError(response.status, error.code || "http", error.detail || `Request failed (${response.status}).`);
  }
  return data;
}

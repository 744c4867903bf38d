// The JSON API over fetch, with the session cookie and Django's CSRF header.
import { t } from "./i18n.js";

let csrfToken = "";

// This page's id, sent with each request: the server's word that a conversation changed
// (a `conversations` frame) names the page that asked, so that page knows it was its own doing.
export const TAB = Math.random().toString(36).slice(2, 12);

export function setCsrfToken(token) {
  csrfToken = token;
}

// A 503 means the server is busy (its database is not answering): reads are retried after a
// pause with jitter while the page says so; a change is not retried (the user decides).
const BUSY_RETRIES = 4;
let onBusy = () => {};

export function setBusyHandler(handler) {
  onBusy = handler;
}

function pause(response, attempt) {
  const asked = Number(response.headers.get("Retry-After")) || 2;
  const seconds = Math.min(30, asked * 2 ** attempt) * (0.75 + Math.random() * 0.5);
  return new Promise((resolve) => setTimeout(resolve, seconds * 1000));
}

export class ApiError extends Error {
  constructor(status, code, detail) {
    super(detail);
    this.status = status;
    this.code = code;
  }
}

export async function api(path, { method = "GET", body, signal } = {}) {
  const headers = { Accept: "application/json", "X-Chat-Tab": TAB };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET") headers["X-CSRFToken"] = csrfToken;
  const request = () =>
    fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "same-origin",
      signal,
    });
  let response = await request();
  for (let attempt = 0; response.status === 503 && method === "GET" && attempt < BUSY_RETRIES; attempt++) {
    onBusy(true);
    await pause(response, attempt);
    response = await request();
  }
  if (method === "GET") onBusy(response.status === 503);
  if (response.status === 401) {
    // The session ended: back to the sign-in page, then here again.
    location.assign(`/accounts/login/?next=${encodeURIComponent(location.pathname)}`);
    throw new ApiError(401, "unauthenticated", t("Sign in first."));
  }
  if (response.status === 204) return null;
  // An abort while the body is read (a newer request won) must stay an abort, not become `null`:
  // the sidebar's refresh read `null.conversations` and said so in a banner.
  const data = await response.json().catch((error) => {
    if (error.name === "AbortError") throw error;
    return null;
  });
  if (!response.ok) {
    const error = data?.error || {};
    throw new ApiError(response.status, error.code || "http", error.detail || t("Request failed (%(status)s).", { status: response.status }));
  }
  return data;
}

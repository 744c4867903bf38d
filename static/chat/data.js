// The settings page's "Your data": a JSON file of conversations brought back in, and the person's
// share links, listed and revoked. (See share.js on the words kept out of this comment.)
import { ApiError, api, setCsrfToken } from "./api.js";
import { dateTime } from "./formats.js";
import { t } from "./i18n.js";
import { shareKinds } from "./share.js";

const form = document.getElementById("import-form");
const file = document.getElementById("import-file");
const status = document.getElementById("import-status");
const list = document.getElementById("share-list");
const empty = document.getElementById("shares-empty");
setCsrfToken(form.querySelector("[name=csrfmiddlewaretoken]").value);

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/** The import's progress or outcome; a refusal looks like the site's other form errors. */
function showStatus(text, failed = false) {
  status.textContent = text;
  status.classList.toggle("form-error", failed);
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const chosen = file.files[0];
  if (!chosen) return;
  const max = Number(form.dataset.maxBytes);
  if (chosen.size > max) {
    // The server says the same (413); no need to send it to hear it.
    showStatus(t("The file is larger than %(size)s MB, the most this server imports.", { size: max / 1e6 }), true);
    return;
  }
  showStatus(t("Importing…"));
  try {
    // The file's text as the body: the server checks that it is an export (api() sends it as JSON).
    const response = await fetch("/api/import", {
      method: "POST",
      body: await chosen.arrayBuffer(),
      headers: {
        "Content-Type": "application/json",
        Accept: "application/json",
        "X-CSRFToken": form.querySelector("[name=csrfmiddlewaretoken]").value,
      },
      credentials: "same-origin",
    });
    const data = await response.json().catch(() => null);
    if (!response.ok) {
      throw new ApiError(response.status, data?.error?.code, data?.error?.detail || `HTTP ${response.status}`);
    }
    const count = data.conversations.length;
    showStatus("");
    status.replaceChildren(
      count === 1
        ? t("Imported “%(title)s”.", { title: data.conversations[0].title })
        : t("Imported %(count)s conversations.", { count }),
      " ",
    );
    // One: "Open it"; several: the link names the one it opens (the first in the file).
    const first = data.conversations[0];
    const open = element("a", "", count === 1 ? t("Open it") : t("Open “%(title)s”", { title: first.title }));
    open.href = `/c/${first.id}/`;
    status.append(open);
    form.reset();
  } catch (error) {
    showStatus(t("Not imported: %(error)s", { error: error.message }), true);
  }
});

function row(share) {
  const item = element("li", "share-row");
  item.dataset.shareId = share.id;
  const link = element("a", "share-title", share.title || t("Untitled"));
  link.href = share.url;
  const kind = [...shareKinds(share), dateTime(share.created)];
  const revoke = element("button", "button danger", t("Revoke"));
  revoke.type = "button";
  revoke.setAttribute("aria-label", t("Revoke the link to “%(title)s”", { title: share.title }));
  revoke.addEventListener("click", async () => {
    try {
      await api(`/api/shares/${share.id}`, { method: "DELETE" });
      item.remove();
      empty.hidden = list.children.length > 0;
    } catch (error) {
      revoke.textContent = t("Could not revoke: %(error)s", { error: error.message });
    }
  });
  item.append(link, element("span", "share-kind", kind.join(" · ")), revoke);
  return item;
}

async function loadShares() {
  const data = await api("/api/shares");
  list.replaceChildren(...data.shares.map(row));
  empty.hidden = data.shares.length > 0;
}

loadShares();

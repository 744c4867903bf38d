// The conversation list: newest first, server-side search, rename and delete behind in-page dialogs.
import { api } from "./api.js";
import { t } from "./i18n.js";
import { iconButton } from "./icons.js";

const SEARCH_DEBOUNCE_MS = 250;
// Cancel is a plain button, not the form's first submit button: Enter in a field submits with confirm.
for (const button of document.querySelectorAll("dialog [data-close]")) {
  button.addEventListener("click", () => button.closest("dialog").close(button.value));
}

/** Opens a <dialog> and resolves true when its form is submitted with the confirm button. */
function ask(dialog) {
  return new Promise((resolve) => {
    dialog.returnValue = "";
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "confirm"), { once: true });
    dialog.showModal();
  });
}

export async function confirmDelete(title) {
  const dialog = document.getElementById("confirm-dialog");
  document.getElementById("confirm-text").textContent = t("“%(title)s” and all its messages will be deleted.", { title });
  const confirmed = ask(dialog);
  document.getElementById("confirm-ok").focus();
  return confirmed;
}

export async function promptTitle(current) {
  const dialog = document.getElementById("rename-dialog");
  const input = document.getElementById("rename-input");
  input.value = current;
  const confirmed = ask(dialog);
  input.select();
  return (await confirmed) && input.value.trim() ? input.value.trim() : null;
}

export class Sidebar {
  /** handlers: open(id), renamed(id, title), deleted(id), error(message) */
  constructor(handlers) {
    this.handlers = handlers;
    this.list = document.getElementById("conversation-list");
    this.empty = document.getElementById("list-empty");
    this.search = document.getElementById("search");
    this.active = null;
    this.items = new Map(); // id -> summary
    this.request = null;
    this.debounce = 0;
    this.search.addEventListener("input", () => {
      clearTimeout(this.debounce);
      this.debounce = setTimeout(() => this.refresh(), SEARCH_DEBOUNCE_MS);
    });
    this.list.addEventListener("click", (event) => this.onClick(event));
  }

  async refresh() {
    // A newer query wins: an older answer arriving late must not overwrite it.
    this.request?.abort();
    const request = new AbortController();
    this.request = request;
    const query = this.search.value.trim();
    try {
      const data = await api(`/api/conversations${query ? `?q=${encodeURIComponent(query)}` : ""}`, {
        signal: request.signal,
      });
      if (this.request === request) this.render(data.conversations, query);
    } catch (error) {
      if (error.name !== "AbortError") this.handlers.error(t("Could not load conversations: %(error)s", { error: error.message }));
    }
  }

  render(conversations, query) {
    // A keyboard user's place in the list survives the redraw (after a rename, say).
    const focused = this.list.contains(document.activeElement) ? document.activeElement : null;
    const place = focused && [focused.closest("li")?.dataset.conversationId, focused.dataset.action];
    this.items = new Map(conversations.map((c) => [c.id, c]));
    const rows = conversations.map((conversation) => this.row(conversation));
    this.list.replaceChildren(...rows);
    if (place) {
      const row = this.list.querySelector(`li[data-conversation-id="${place[0]}"]`);
      row?.querySelector(place[1] ? `[data-action="${place[1]}"]` : "a")?.focus();
    }
    this.list.dataset.query = query;
    this.empty.textContent = query ? t("No conversation matches.") : t("No conversations yet.");
    this.empty.hidden = conversations.length > 0;
  }

  row(conversation) {
    const item = document.createElement("li");
    item.dataset.conversationId = conversation.id;
    item.classList.toggle("active", conversation.id === this.active);
    const link = document.createElement("a");
    link.href = `/c/${conversation.id}/`;
    link.textContent = conversation.title || t("New chat");
    link.title = conversation.title || t("New chat");
    if (conversation.id === this.active) link.setAttribute("aria-current", "page");
    const actions = document.createElement("span");
    actions.className = "conversation-actions";
    const title = conversation.title || t("New chat");
    actions.append(
      iconButton("rename", t("Rename “%(title)s”", { title }), 15),
      iconButton("delete", t("Delete “%(title)s”", { title }), 15),
    );
    item.append(link, actions);
    return item;
  }

  setActive(id) {
    this.active = id;
    for (const item of this.list.children) {
      const current = Number(item.dataset.conversationId) === id;
      item.classList.toggle("active", current);
      const link = item.querySelector("a");
      if (current) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
  }

  /** A conversation just started here: listed at once, before the next refresh answers. */
  upsert(id, title) {
    if (this.items.has(id) || this.search.value.trim()) return this.setTitle(id, title);
    const summary = { id, title, model: "", updated: new Date().toISOString() };
    this.items.set(id, summary);
    this.list.prepend(this.row(summary));
    this.empty.hidden = true;
  }

  /** Shows a title at once (a new conversation, a rename) before the next refresh. */
  setTitle(id, title) {
    const link = this.list.querySelector(`li[data-conversation-id="${id}"] a`);
    if (link) link.textContent = link.title = title;
  }

  async onClick(event) {
    const item = event.target.closest("li[data-conversation-id]");
    if (!item) return;
    const id = Number(item.dataset.conversationId);
    const button = event.target.closest("button[data-action]");
    if (!button) {
      const link = event.target.closest("a");
      // Let the browser handle new-tab clicks; a plain click opens in place.
      if (!link || event.ctrlKey || event.metaKey || event.shiftKey || event.button !== 0) return;
      event.preventDefault();
      this.handlers.open(id);
      return;
    }
    const title = this.items.get(id)?.title || t("New chat");
    if (button.dataset.action === "rename") await this.rename(id, title);
    else await this.remove(id, title);
  }

  async rename(id, current) {
    const title = await promptTitle(current);
    if (!title || title === current) return;
    try {
      const data = await api(`/api/conversations/${id}`, { method: "PATCH", body: { title } });
      this.setTitle(id, data.title);
      this.handlers.renamed(id, data.title);
      await this.refresh();
    } catch (error) {
      this.handlers.error(t("Could not rename: %(error)s", { error: error.message }));
    }
  }

  async remove(id, title) {
    if (!(await confirmDelete(title))) return;
    try {
      await api(`/api/conversations/${id}`, { method: "DELETE" });
      this.list.querySelector(`li[data-conversation-id="${id}"]`)?.remove();
      this.handlers.deleted(id);
      await this.refresh();
    } catch (error) {
      this.handlers.error(t("Could not delete: %(error)s", { error: error.message }));
    }
  }
}

const WARN_AT = 0.8;

function usd(amount) {
  const value = Number(amount);
  return `$${value.toFixed(value > 0 && value < 0.01 ? 4 : 2)}`;
}

/** The person's month so far under the conversation list: spent / budget, a thin bar, a warning at 80 %. */
export class BudgetMeter {
  constructor() {
    this.box = document.getElementById("budget");
    this.text = document.getElementById("budget-text");
    this.bar = document.getElementById("budget-bar");
    this.fill = document.getElementById("budget-fill");
    this.warning = document.getElementById("budget-warning");
  }

  async refresh() {
    try {
      this.render(await api("/api/budget"));
    } catch {
      // The meter is a hint: a failed refresh keeps the last figures, the next `done` tries again.
    }
  }

  render(month) {
    const parts = [];
    const spent = usd(month.usd.spent);
    if (month.usd.limit !== null) parts.push(t("%(spent)s of %(limit)s", { spent, limit: usd(month.usd.limit) }));
    else parts.push(t("%(spent)s spent", { spent }));
    if (month.tokens.limit !== null) {
      const [used, limit] = [month.tokens.spent.toLocaleString(), month.tokens.limit.toLocaleString()];
      parts.push(t("%(used)s of %(limit)s tokens", { used, limit }));
    }
    this.text.textContent = parts.join(" · ");
    // The bar shows the tighter of the two limits.
    const shares = [month.usd.share, month.tokens.share].filter((share) => share !== null);
    const share = shares.length ? Math.max(...shares) : null;
    this.bar.hidden = share === null;
    if (share !== null) {
      const percent = Math.min(100, Math.round(share * 100));
      this.fill.style.width = `${percent}%`;
      this.bar.setAttribute("aria-valuenow", String(percent));
    }
    const resets = new Date(`${month.resets_on}T00:00:00`).toLocaleDateString(undefined, { day: "numeric", month: "long" });
    this.box.classList.toggle("warn", share !== null && share >= WARN_AT && share < 1);
    this.box.classList.toggle("over", share !== null && share >= 1);
    this.warning.hidden = share === null || share < WARN_AT;
    this.warning.textContent =
      share !== null && share >= 1
        ? t("Your monthly budget is used up; it resets on %(resets)s.", { resets })
        : t("You have used %(percent)s of your monthly budget; it resets on %(resets)s.", {
            percent: `${Math.floor((share ?? 0) * 100)} %`,
            resets,
          });
    this.box.hidden = false;
  }
}

// The conversation list: pinned ones, folders, then date groups, newest first, a page at a time as
// it scrolls; server-side search (archived ones too); rename and delete behind in-page dialogs.
// Pin, archive and folders: folders.js.
import { api } from "./api.js";
import { dateGroup } from "./dategroups.js";
import {
  RowMenu,
  askFolder,
  askFolderName,
  confirmFolderDelete,
  enableDragAndDrop,
  folderApi,
  folderBlock,
  menuItems,
} from "./folders.js";
import { date, money, number, percent } from "./formats.js";
import { t } from "./i18n.js";
import { iconButton } from "./icons.js";
import { RovingList } from "./rovinglist.js";
import { highlighted } from "./snippets.js";

const SEARCH_DEBOUNCE_MS = 250;
const PAGE = 50; // rows of the first page; a refresh reloads as many as were shown, up to the API's 200
const MORE = 100; // rows of each next page: fewer round trips for a reader scrolling fast
const MAX_PAGE = 200;
const OPEN_FOLDERS = "chat.openFolders";
// Fingers, not a mouse: a row's rename and delete go into its menu (app.css hides their buttons alike).
const TOUCH = window.matchMedia("(hover: none), (pointer: coarse)");
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
  // The harmless choice first, as for any destructive confirm: a stray Enter deletes nothing.
  dialog.querySelector("[data-close]").focus();
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

/** Rows of the same list stay newest first: the one before which `summary` goes, or null (at the end). */
function rowAfter(list, summary, items) {
  for (const row of list.children) {
    const other = items.get(Number(row.dataset.conversationId));
    if (!other) continue;
    if (other.updated < summary.updated || (other.updated === summary.updated && other.id < summary.id)) return row;
  }
  return null;
}

export class Sidebar {
  /** handlers: open(id), deleted(id), changed(conversation JSON: renamed, archived, …), error(message) */
  constructor(handlers) {
    this.handlers = handlers;
    this.list = document.getElementById("conversation-list");
    this.nav = this.list.closest("nav");
    this.empty = document.getElementById("list-empty");
    this.search = document.getElementById("search");
    this.active = null;
    this.items = new Map(); // id -> summary, every row shown
    this.folders = [];
    this.openFolders = new Set(JSON.parse(localStorage.getItem(OPEN_FOLDERS) || "[]"));
    this.archived = false; // showing the archived ones instead
    this.next = null; // the cursor of the list's next page
    this.shownParams = null; // what the list shows (search, archived), to tell a redraw from another list
    this.keep = 0; // rows a redraw loads back, as many as were shown
    this.request = null;
    this.more = null; // the next page's request
    this.debounce = 0;
    this.menu = new RowMenu();
    this.build();
    this.roving = new RovingList(this.list);
    this.search.addEventListener("input", () => {
      clearTimeout(this.debounce);
      this.debounce = setTimeout(() => this.refresh(), SEARCH_DEBOUNCE_MS);
    });
    this.list.addEventListener("click", (event) => this.onClick(event));
    enableDragAndDrop(this.list, (id, zone) => this.dropped(id, zone));
    // The next page loads as the end of the list comes near (well before it shows).
    this.sentinel = document.createElement("div");
    this.sentinel.className = "list-sentinel";
    this.nav.append(this.sentinel);
    new IntersectionObserver((entries) => entries.some((e) => e.isIntersecting) && this.loadMore(), {
      root: this.nav,
      rootMargin: "0px 0px 400px 0px",
    }).observe(this.sentinel);
  }

  /** The sections inside the list, and the two buttons beside the search box. */
  build() {
    const section = (className, title) => {
      const box = document.createElement("section");
      box.className = `list-section ${className}`;
      const heading = document.createElement("h2");
      heading.className = "list-heading";
      heading.textContent = title;
      box.append(heading);
      return box;
    };
    this.archivedHead = section("archived-head", t("Archived conversations"));
    const back = document.createElement("button");
    back.type = "button";
    back.className = "link-button";
    back.dataset.action = "leave-archived";
    back.textContent = t("Back to all conversations");
    this.archivedHead.append(back);
    this.pinnedBox = section("pinned-section drop-zone", t("Pinned"));
    this.pinnedBox.dataset.drop = "pinned";
    this.pinnedList = document.createElement("ul");
    this.pinnedList.setAttribute("aria-label", t("Pinned"));
    this.pinnedBox.append(this.pinnedList);
    this.foldersBox = section("folders-section", t("Folders"));
    this.groupsBox = document.createElement("div");
    this.groupsBox.className = "date-groups drop-zone";
    this.groupsBox.dataset.drop = "unfiled";
    this.list.replaceChildren(this.archivedHead, this.pinnedBox, this.foldersBox, this.groupsBox);
    const tools = document.createElement("span");
    tools.className = "search-tools";
    const newFolder = iconButton("new-folder", t("New folder"), 18);
    newFolder.id = "new-folder";
    newFolder.addEventListener("click", () => this.createFolder());
    // Named for what it shows, its state in aria-pressed ("Show …, pressed" read as a contradiction once on).
    this.archiveToggle = iconButton("archive", t("Archived conversations"), 18);
    this.archiveToggle.title = t("Show archived conversations");
    this.archiveToggle.id = "show-archived";
    this.archiveToggle.setAttribute("aria-pressed", "false");
    this.archiveToggle.addEventListener("click", () => this.showArchived(!this.archived));
    tools.append(newFolder, this.archiveToggle);
    this.search.after(tools);
    this.search.parentElement.classList.add("search-row");
  }

  /** What the list asks for besides the cursor: the search, or the archived ones. */
  params() {
    const params = new URLSearchParams();
    const query = this.search.value.trim();
    if (query) params.set("q", query);
    else if (this.archived) params.set("archived", "1");
    return params;
  }

  async refresh() {
    // A newer query wins: an older answer arriving late must not overwrite it.
    this.request?.abort();
    this.more?.abort();
    this.more = null;
    const request = new AbortController();
    this.request = this.refreshing = request;
    const params = this.params();
    // The same list redrawn (after an answer, a rename) keeps as many rows as it showed, so the
    // reader's place stays; another search or view starts at the top.
    const same = params.toString() === this.shownParams;
    this.shownParams = params.toString();
    this.keep = same ? this.groupsBox.querySelectorAll("li").length : 0;
    if (!same) this.nav.scrollTop = 0;
    params.set("limit", String(Math.min(MAX_PAGE, Math.max(PAGE, this.keep))));
    try {
      const data = await api(`/api/conversations?${params}`, { signal: request.signal });
      if (this.request === request) this.render(data, params.get("q") || "");
    } catch (error) {
      if (error.name !== "AbortError") this.handlers.error(t("Could not load conversations: %(error)s", { error: error.message }));
    } finally {
      if (this.refreshing === request) this.refreshing = null;
    }
    this.checkMore();
  }

  render(data, query) {
    // A keyboard user's place in the list survives the redraw (after a rename, say).
    const focused = this.list.contains(document.activeElement) ? document.activeElement : null;
    const place = focused && [
      focused.closest("[data-conversation-id]")?.dataset.conversationId,
      focused.closest("[data-folder-id]")?.dataset.folderId,
      focused.dataset.action,
    ];
    this.menu.close(false);
    this.items = new Map();
    const plain = !query && !this.archived;
    this.archivedHead.hidden = !this.archived || Boolean(query);
    this.pinnedList.replaceChildren(...(plain ? data.pinned || [] : []).map((c) => this.row(c)));
    this.pinnedBox.hidden = !this.pinnedList.children.length;
    if (plain) this.folders = data.folders || this.folders;
    this.renderFolders(plain ? this.folders : []);
    this.groupsBox.replaceChildren();
    this.append(data.conversations);
    this.next = data.next;
    if (place) this.restoreFocus(place);
    this.list.dataset.query = query;
    this.empty.textContent = query
      ? t("No conversation matches.")
      : this.archived
        ? t("No archived conversations.")
        : t("No conversations yet.");
    this.updateEmpty();
  }

  restoreFocus([conversationId, folderId, action]) {
    const holder = conversationId
      ? this.list.querySelector(`li[data-conversation-id="${conversationId}"]`)
      : folderId && this.list.querySelector(`[data-folder-id="${folderId}"] .folder-head`);
    holder?.querySelector(action ? `[data-action="${action}"]` : "a, button")?.focus();
  }

  updateEmpty() {
    this.empty.hidden = this.items.size > 0 || this.foldersBox.querySelector(".folder") !== null;
  }

  renderFolders(folders) {
    const blocks = folders.map((folder) => folderBlock(folder, this.openFolders.has(folder.id)));
    this.foldersBox.replaceChildren(this.foldersBox.firstElementChild, ...blocks);
    this.foldersBox.hidden = !blocks.length;
    for (const block of blocks) if (this.openFolders.has(Number(block.dataset.folderId))) this.loadFolder(block);
  }

  /** Rows in the order the server gave (newest first) under their date groups. */
  append(conversations) {
    for (const conversation of conversations) {
      const group = dateGroup(new Date(conversation.updated));
      let box = this.groupsBox.lastElementChild;
      if (box?.dataset.group !== group.key) box = this.groupBox(group, null);
      box.querySelector("ul").append(this.row(conversation));
    }
  }

  /** A date group's section, put before `before` (null: at the end). */
  groupBox(group, before) {
    const box = document.createElement("section");
    box.className = "date-group";
    box.dataset.group = group.key;
    box.dataset.start = group.start;
    const heading = document.createElement("h2");
    heading.className = "list-heading";
    heading.textContent = group.label;
    heading.id = `group-${group.key}`;
    const list = document.createElement("ul");
    list.setAttribute("aria-labelledby", heading.id);
    box.append(heading, list);
    this.groupsBox.insertBefore(box, before);
    return box;
  }

  /** The next page, when the end of the list comes near and there is one. */
  async loadMore() {
    if (!this.next || this.more || this.refreshing) return;
    const more = new AbortController();
    this.more = more;
    const params = this.params();
    params.set("cursor", this.next);
    params.set("limit", String(MORE));
    try {
      const data = await api(`/api/conversations?${params}`, { signal: more.signal });
      if (this.more !== more) return;
      this.append(data.conversations);
      this.next = data.next;
      this.updateEmpty();
    } catch (error) {
      if (error.name !== "AbortError") this.handlers.error(t("Could not load conversations: %(error)s", { error: error.message }));
      return;
    } finally {
      if (this.more === more) this.more = null;
    }
    this.checkMore();
  }

  /**
   * A page that did not fill the list leaves the end in sight: the observer sees no change, so ask
   * here; and a redraw loads pages until the list is as long as before.
   */
  checkMore() {
    if (!this.next) return;
    const end = this.sentinel.getBoundingClientRect().top;
    const near = end < this.nav.getBoundingClientRect().bottom + 400 && this.nav.offsetParent !== null;
    if (near || this.groupsBox.querySelectorAll("li").length < this.keep) this.loadMore();
  }

  row(conversation) {
    this.items.set(conversation.id, conversation);
    const item = document.createElement("li");
    item.dataset.conversationId = conversation.id;
    item.draggable = !conversation.archived;
    item.classList.toggle("active", conversation.id === this.active);
    item.classList.toggle("archived", Boolean(conversation.archived));
    const link = document.createElement("a");
    link.href = `/c/${conversation.id}/`;
    const title = conversation.title || t("New chat");
    // The title in a span of its own: cut with an ellipsis, the badge and the snippet beside it kept whole.
    const name = document.createElement("span");
    name.className = "conversation-title";
    name.textContent = title;
    link.append(name);
    link.title = title;
    link.draggable = false; // the row is dragged, not the link's URL
    if (conversation.id === this.active) link.setAttribute("aria-current", "page");
    const query = this.search.value.trim();
    if (conversation.archived && query) {
      const badge = document.createElement("span");
      badge.className = "archived-badge";
      badge.textContent = t("Archived");
      link.append(" ", badge);
    }
    if (conversation.snippet && query) {
      const snippet = document.createElement("span");
      snippet.className = "conversation-snippet";
      snippet.append(highlighted(conversation.snippet, query));
      link.append(snippet);
    }
    const actions = document.createElement("span");
    actions.className = "conversation-actions";
    const more = iconButton("more", t("More actions for “%(title)s”", { title }), 15);
    more.setAttribute("aria-haspopup", "menu");
    more.setAttribute("aria-expanded", "false");
    actions.append(
      iconButton("rename", t("Rename “%(title)s”", { title }), 15),
      iconButton("delete", t("Delete “%(title)s”", { title }), 15),
      more,
    );
    item.append(link, actions);
    return item;
  }

  rows() {
    return this.list.querySelectorAll("li[data-conversation-id]");
  }

  setActive(id) {
    this.active = id;
    for (const item of this.rows()) {
      const current = Number(item.dataset.conversationId) === id;
      item.classList.toggle("active", current);
      const link = item.querySelector("a");
      if (current) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
  }

  /** A conversation just started here: listed at once (under Today), before the next refresh answers. */
  upsert(id, title) {
    if (this.items.has(id) || this.search.value.trim() || this.archived) return this.setTitle(id, title);
    const summary = { id, title, model: "", updated: new Date().toISOString(), pinned: false, archived: false, folder: null };
    const group = dateGroup(new Date(summary.updated));
    let box = this.groupsBox.querySelector(`.date-group[data-group="${group.key}"]`);
    box ??= this.groupBox(group, this.groupsBox.firstElementChild);
    const list = box.querySelector("ul");
    list.insertBefore(this.row(summary), rowAfter(list, summary, this.items));
    this.updateEmpty();
  }

  /** Shows a title at once (a new conversation, a rename) before the next refresh. */
  setTitle(id, title) {
    const link = this.list.querySelector(`li[data-conversation-id="${id}"] a`);
    if (link) link.querySelector(".conversation-title").textContent = link.title = title;
  }

  async onClick(event) {
    const button = event.target.closest("button[data-action]");
    const folder = event.target.closest("[data-folder-id]");
    if (button && folder && !button.closest("li")) return this.onFolderClick(button, folder);
    if (button?.dataset.action === "leave-archived") return this.showArchived(false);
    const item = event.target.closest("li[data-conversation-id]");
    if (!item) return;
    const id = Number(item.dataset.conversationId);
    if (!button) {
      const link = event.target.closest("a");
      // Let the browser handle new-tab clicks; a plain click opens in place.
      if (!link || event.ctrlKey || event.metaKey || event.shiftKey || event.button !== 0) return;
      event.preventDefault();
      this.handlers.open(id);
      return;
    }
    const summary = this.items.get(id);
    const title = summary?.title || t("New chat");
    if (button.dataset.action === "more") {
      if (button.getAttribute("aria-expanded") === "true") return this.menu.close();
      const items = menuItems(summary, {
        organise: (conversation, changes) => this.organise(conversation, changes),
        move: (conversation) => this.move(conversation),
      });
      // On a touch screen the row shows only this menu's button: rename and delete are in it.
      if (TOUCH.matches) {
        items.push(
          { action: "rename", label: t("Rename"), run: () => this.rename(id, title) },
          { action: "delete", label: t("Delete"), run: () => this.remove(id, title) },
        );
      }
      this.menu.open(button, items);
    } else if (button.dataset.action === "rename") await this.rename(id, title);
    else if (button.dataset.action === "delete") await this.remove(id, title);
  }

  async onFolderClick(button, block) {
    const id = Number(block.dataset.folderId);
    const folder = this.folders.find((f) => f.id === id);
    if (!folder) return;
    const action = button.dataset.action;
    if (action === "toggle-folder") {
      const open = button.getAttribute("aria-expanded") !== "true";
      button.setAttribute("aria-expanded", String(open));
      block.querySelector("ul").hidden = !open;
      if (open) this.openFolders.add(id);
      else this.openFolders.delete(id);
      localStorage.setItem(OPEN_FOLDERS, JSON.stringify([...this.openFolders]));
      block.querySelector(".show-more").hidden = !open || !block.dataset.next;
      if (open && !block.dataset.loaded) await this.loadFolder(block);
    } else if (action === "folder-more") {
      await this.loadFolder(block, block.dataset.next);
    } else if (action === "rename-folder") {
      const name = await askFolderName(t("Rename folder"), folder.name, t("Rename"));
      if (name && name !== folder.name) await this.tryTo(t("Could not rename the folder"), () => folderApi.rename(id, name));
    } else if (action === "delete-folder") {
      if (await confirmFolderDelete(folder.name)) {
        await this.tryTo(t("Could not delete the folder"), () => folderApi.remove(id));
      }
    }
  }

  /** One folder's conversations, a page at a time ("Show more" for the next). */
  async loadFolder(block, cursor = "") {
    const id = block.dataset.folderId;
    const params = new URLSearchParams({ folder: id });
    if (cursor) params.set("cursor", cursor);
    try {
      const data = await api(`/api/conversations?${params}`);
      const list = block.querySelector("ul");
      if (!cursor) list.replaceChildren();
      list.append(...data.conversations.map((c) => this.row(c)));
      block.dataset.loaded = "1";
      block.dataset.next = data.next || "";
      block.querySelector(".show-more").hidden = !data.next || list.hidden;
      this.updateEmpty();
    } catch (error) {
      this.handlers.error(t("Could not load the folder: %(error)s", { error: error.message }));
    }
  }

  showArchived(archived) {
    this.archived = archived;
    this.archiveToggle.setAttribute("aria-pressed", String(archived));
    this.archiveToggle.classList.toggle("pressed", archived);
    this.refresh();
  }

  /** Runs a change, says so when it fails, and redraws the list either way. */
  async tryTo(what, change) {
    try {
      return await change();
    } catch (error) {
      this.handlers.error(`${what}: ${error.message}`);
      return null;
    } finally {
      await this.refresh();
    }
  }

  async organise(conversation, changes) {
    const refocus = this.focusNear(conversation);
    const data = await this.tryTo(t("Could not change the conversation"), () => folderApi.organise(conversation, changes));
    if (data) this.handlers.changed(data); // archived or restored: the open conversation's banner follows
    refocus();
    return data;
  }

  /**
   * Before a change that may take row `id` out of the list (archive, a move into a closed folder, delete): a
   * function to call after it that puts a focus the change dropped on the page's body back in the list: on the
   * row's menu button if the row is still there, else on the row that followed it, else the one before, else
   * on the search box. A screen reader's place is not lost; a focus elsewhere is left alone.
   */
  focusNear(id) {
    const rows = [...this.list.querySelectorAll("li[data-conversation-id]")].map((row) => row.dataset.conversationId);
    const at = rows.indexOf(String(id));
    const others = at < 0 ? [] : [...rows.slice(at + 1), ...rows.slice(0, at).reverse()];
    return () => {
      if (document.activeElement && document.activeElement !== document.body) return;
      const row = (other) => this.list.querySelector(`li[data-conversation-id="${other}"]`);
      const own = row(id)?.querySelector('[data-action="more"]');
      const next = others.map(row).find(Boolean)?.querySelector("a");
      (own || next || this.search).focus();
    };
  }

  async createFolder() {
    const name = await askFolderName(t("New folder"), "", t("Create"));
    if (!name) return;
    const folder = await this.tryTo(t("Could not create the folder"), () => folderApi.create(name));
    if (folder) this.list.querySelector(`[data-folder-id="${folder.id}"] .folder-toggle`)?.focus();
  }

  /** The keyboard's way to file a conversation: a dialog with the folders to pick from. */
  async move(summary) {
    const chosen = await askFolder(summary.title || t("New chat"), this.folders, summary.folder);
    if (chosen === undefined) return;
    await this.organise(summary.id, chosen ? { folder: Number(chosen), pinned: false } : { folder: null });
  }

  /** A row dropped on the pinned section, a folder's heading, or the date groups (out of any folder). */
  dropped(id, zone) {
    if (zone.dataset.drop === "pinned") return this.organise(id, { pinned: true });
    if (zone.dataset.dropFolder) return this.organise(id, { folder: Number(zone.dataset.dropFolder), pinned: false });
    return this.organise(id, { folder: null, pinned: false });
  }

  async rename(id, current) {
    const title = await promptTitle(current);
    if (!title || title === current) return;
    try {
      const data = await api(`/api/conversations/${id}`, { method: "PATCH", body: { title } });
      this.setTitle(id, data.title);
      this.handlers.changed(data);
      await this.refresh();
    } catch (error) {
      this.handlers.error(t("Could not rename: %(error)s", { error: error.message }));
    }
  }

  async remove(id, title) {
    if (!(await confirmDelete(title))) return;
    const refocus = this.focusNear(id);
    try {
      await api(`/api/conversations/${id}`, { method: "DELETE" });
      this.list.querySelector(`li[data-conversation-id="${id}"]`)?.remove();
      this.handlers.deleted(id);
      await this.refresh();
      refocus();
    } catch (error) {
      this.handlers.error(t("Could not delete: %(error)s", { error: error.message }));
    }
  }
}

const WARN_AT = 0.8;

function usd(amount) {
  const value = Number(amount);
  return money(value, value > 0 && value < 0.01 ? 4 : 2);
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
      const [used, limit] = [number(month.tokens.spent), number(month.tokens.limit)];
      parts.push(t("%(used)s of %(limit)s tokens", { used, limit }));
    }
    this.text.textContent = parts.join(" · ");
    // The bar shows the tighter of the two limits.
    const shares = [month.usd.share, month.tokens.share].filter((share) => share !== null);
    const share = shares.length ? Math.max(...shares) : null;
    this.bar.hidden = share === null;
    if (share !== null) {
      const filled = Math.min(100, Math.round(share * 100));
      this.fill.style.width = `${filled}%`;
      this.bar.setAttribute("aria-valuenow", String(filled));
    }
    const resets = date(`${month.resets_on}T00:00:00`, { day: "numeric", month: "long" });
    this.box.classList.toggle("warn", share !== null && share >= WARN_AT && share < 1);
    this.box.classList.toggle("over", share !== null && share >= 1);
    this.warning.hidden = share === null || share < WARN_AT;
    this.warning.textContent =
      share !== null && share >= 1
        ? t("Your monthly budget is used up; it resets on %(resets)s.", { resets })
        : t("You have used %(percent)s of your monthly budget; it resets on %(resets)s.", {
            percent: percent(Math.floor((share ?? 0) * 100) / 100, 0),
            resets,
          });
    this.box.hidden = false;
  }
}

// Organising the sidebar: a conversation's menu (pin, archive, move to a folder), the folders'
// headings and dialogs, and drag and drop onto a folder. The list itself is sidebar.js.
import { api } from "./api.js";
import { nt, t } from "./i18n.js";
import { iconButton } from "./icons.js";

// Drag data of our own type: a link dragged in from elsewhere is not a conversation.
export const DRAG_TYPE = "application/x-chat-conversation";

// --- the JSON API ------------------------------------------------------------------

export const folderApi = {
  create: (name) => api("/api/folders", { method: "POST", body: { name } }),
  rename: (id, name) => api(`/api/folders/${id}`, { method: "PATCH", body: { name } }),
  remove: (id) => api(`/api/folders/${id}`, { method: "DELETE" }),
  /** changes: { pinned?, archived?, folder? } of one conversation; answers its summary. */
  organise: (id, changes) => api(`/api/conversations/${id}`, { method: "PATCH", body: changes }),
};

// --- dialogs, made here so the page template stays as it is ----------------------------

function dialog(title, build, confirmLabel, { danger = false } = {}) {
  const box = document.createElement("dialog");
  box.className = "dialog";
  const form = document.createElement("form");
  form.method = "dialog";
  const heading = document.createElement("h2");
  heading.id = `dialog-${Math.random().toString(36).slice(2)}`;
  heading.textContent = title;
  box.setAttribute("aria-labelledby", heading.id);
  const buttons = document.createElement("div");
  buttons.className = "dialog-buttons";
  const cancel = document.createElement("button");
  cancel.type = "button";
  cancel.className = "button";
  cancel.textContent = t("Cancel");
  cancel.addEventListener("click", () => box.close("cancel"));
  const ok = document.createElement("button");
  ok.type = "submit";
  ok.value = "confirm";
  ok.className = `button ${danger ? "danger" : "primary"}`;
  ok.textContent = confirmLabel;
  buttons.append(cancel, ok);
  form.append(heading, ...build(), buttons);
  box.append(form);
  document.body.append(box);
  return box;
}

/** Shows the dialog; resolves true when confirmed (Enter or the confirm button), false otherwise; then removes it. */
function run(box, focus) {
  return new Promise((resolve) => {
    box.addEventListener(
      "close",
      () => {
        resolve(box.returnValue === "confirm");
        box.remove();
      },
      { once: true },
    );
    box.showModal();
    focus?.focus();
  });
}

/** Asks for a folder's name: the new name, or null when cancelled or left empty. */
export async function askFolderName(title, current = "", confirmLabel = t("Save")) {
  const label = document.createElement("label");
  label.className = "visually-hidden";
  label.textContent = t("Folder name");
  const input = document.createElement("input");
  input.type = "text";
  input.maxLength = 100;
  input.required = true;
  input.value = current;
  input.id = label.htmlFor = "folder-name-input";
  const box = dialog(title, () => [label, input], confirmLabel);
  const confirmed = await run(box, input);
  return confirmed && input.value.trim() ? input.value.trim() : null;
}

export function confirmFolderDelete(name) {
  const text = document.createElement("p");
  text.textContent = t("The folder “%(name)s” is deleted; its conversations stay, out of any folder.", { name });
  return run(dialog(t("Delete folder?"), () => [text], t("Delete folder"), { danger: true }));
}

/** Asks which folder a conversation goes to: a folder id, "" for none, or undefined when cancelled. */
export async function askFolder(title, folders, current) {
  const label = document.createElement("label");
  label.textContent = t("Move “%(title)s” to", { title });
  const select = document.createElement("select");
  select.id = label.htmlFor = "move-folder-select";
  const none = new Option(t("No folder"), "");
  select.append(none, ...folders.map((folder) => new Option(folder.name, String(folder.id))));
  select.value = current === null || current === undefined ? "" : String(current);
  const parts = [label, select];
  if (!folders.length) {
    const hint = document.createElement("p");
    hint.textContent = t("No folders yet: make one with the folder button beside the search box.");
    parts.push(hint);
  }
  const box = dialog(t("Move to folder"), () => parts, t("Move"));
  box.classList.add("move-dialog");
  return (await run(box, select)) ? select.value : undefined;
}

// --- a conversation's menu --------------------------------------------------------------

/**
 * The "More" menu of a row: a list of menu items under its button. Arrow keys move, Escape
 * closes and gives the focus back to the button, a click elsewhere or Tab closes it.
 */
export class RowMenu {
  constructor() {
    this.menu = null;
    this.button = null;
    document.addEventListener("pointerdown", (event) => {
      if (this.menu && !this.menu.contains(event.target) && event.target.closest("button") !== this.button) {
        this.close();
      }
    });
  }

  /** items: [{ label, run }] */
  open(button, items) {
    this.close();
    const menu = document.createElement("div");
    menu.className = "row-menu";
    menu.setAttribute("role", "menu");
    menu.setAttribute("aria-label", button.getAttribute("aria-label"));
    for (const item of items) {
      const entry = document.createElement("button");
      entry.type = "button";
      entry.setAttribute("role", "menuitem");
      entry.textContent = item.label;
      entry.dataset.menuAction = item.action;
      entry.addEventListener("click", () => {
        this.close(); // the focus back on the row's button: the redraw after the change keeps it there
        item.run();
      });
      menu.append(entry);
    }
    menu.addEventListener("keydown", (event) => this.onKey(event));
    // In the row, under its button: it scrolls with the list, and a list holds only its rows.
    button.closest("li").append(menu);
    button.setAttribute("aria-expanded", "true");
    this.menu = menu;
    this.button = button;
    menu.querySelector("button").focus();
  }

  close(refocus = true) {
    if (!this.menu) return;
    this.menu.remove();
    this.button.setAttribute("aria-expanded", "false");
    if (refocus && this.button.isConnected) this.button.focus();
    this.menu = this.button = null;
  }

  onKey(event) {
    const entries = [...this.menu.querySelectorAll("button")];
    const at = entries.indexOf(document.activeElement);
    if (event.key === "Escape") {
      event.preventDefault();
      event.stopPropagation(); // not the page's "Escape stops the answer"
      this.close();
    } else if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      event.preventDefault();
      const step = event.key === "ArrowDown" ? 1 : -1;
      entries[(at + step + entries.length) % entries.length].focus();
    } else if (event.key === "Home" || event.key === "End") {
      event.preventDefault();
      entries.at(event.key === "Home" ? 0 : -1).focus();
    } else if (event.key === "Tab") {
      this.close(false);
    }
  }
}

/** The menu's items for one conversation (handlers: pin, archive, move: each (id, summary)). */
export function menuItems(summary, handlers) {
  const items = [];
  if (!summary.archived) {
    items.push({
      action: "pin",
      label: summary.pinned ? t("Unpin") : t("Pin"),
      run: () => handlers.organise(summary.id, { pinned: !summary.pinned }),
    });
  }
  items.push({
    action: "archive",
    label: summary.archived ? t("Restore") : t("Archive"),
    run: () => handlers.organise(summary.id, { archived: !summary.archived }),
  });
  if (!summary.archived) items.push({ action: "move", label: t("Move to folder…"), run: () => handlers.move(summary) });
  return items;
}

// --- the folders in the list --------------------------------------------------------------

/** A folder's block: a heading that opens and closes it, rename and delete, its list, "Show more". */
export function folderBlock(folder, open) {
  const block = document.createElement("section");
  block.className = "folder";
  block.dataset.folderId = folder.id;
  const head = document.createElement("div");
  head.className = "folder-head drop-zone";
  head.dataset.dropFolder = folder.id;
  const toggle = document.createElement("button");
  toggle.type = "button";
  toggle.className = "folder-toggle";
  toggle.dataset.action = "toggle-folder";
  toggle.setAttribute("aria-expanded", String(open));
  const name = document.createElement("span");
  name.className = "folder-name";
  name.textContent = folder.name;
  const count = document.createElement("span");
  count.className = "folder-count";
  count.textContent = folder.count ? String(folder.count) : "";
  count.setAttribute("aria-hidden", "true"); // said in words beside it: "Work (1 conversation)", not "Work 1 (1 …)"
  const counted = document.createElement("span");
  counted.className = "visually-hidden";
  counted.textContent = nt("(%(count)s conversation)", "(%(count)s conversations)", folder.count || 0);
  toggle.append(name, count, counted);
  const actions = document.createElement("span");
  actions.className = "conversation-actions folder-actions";
  actions.append(
    iconButton("rename", t("Rename folder “%(name)s”", { name: folder.name }), 15),
    iconButton("delete", t("Delete folder “%(name)s”", { name: folder.name }), 15),
  );
  for (const button of actions.querySelectorAll("button")) button.dataset.action += "-folder";
  head.append(toggle, actions);
  const list = document.createElement("ul");
  list.hidden = !open;
  list.setAttribute("aria-label", folder.name);
  const more = document.createElement("button");
  more.type = "button";
  more.className = "link-button show-more";
  more.dataset.action = "folder-more";
  more.textContent = t("Show more");
  more.hidden = true;
  block.append(head, list, more);
  return block;
}

/**
 * Drag and drop of rows onto drop zones (a folder's heading, the pinned section, the date groups):
 * drop(id, zone) decides what a zone means. A menu item does the same for keyboard users.
 */
export function enableDragAndDrop(container, drop) {
  container.addEventListener("dragstart", (event) => {
    const row = event.target.closest?.("li[data-conversation-id]");
    if (!row) return;
    event.dataTransfer.setData(DRAG_TYPE, row.dataset.conversationId);
    event.dataTransfer.effectAllowed = "move";
    row.classList.add("dragging");
  });
  container.addEventListener("dragend", (event) => {
    event.target.closest?.("li")?.classList.remove("dragging");
    for (const zone of container.querySelectorAll(".drop-over")) zone.classList.remove("drop-over");
  });
  container.addEventListener("dragover", (event) => {
    const zone = event.target.closest?.(".drop-zone");
    if (!zone || !event.dataTransfer.types.includes(DRAG_TYPE)) return;
    event.preventDefault(); // this zone accepts it
    event.dataTransfer.dropEffect = "move";
    for (const other of container.querySelectorAll(".drop-over")) if (other !== zone) other.classList.remove("drop-over");
    zone.classList.add("drop-over");
  });
  container.addEventListener("dragleave", (event) => {
    const zone = event.target.closest?.(".drop-zone");
    if (zone && !zone.contains(event.relatedTarget)) zone.classList.remove("drop-over");
  });
  container.addEventListener("drop", (event) => {
    const zone = event.target.closest?.(".drop-zone");
    const id = Number(event.dataTransfer.getData(DRAG_TYPE));
    if (!zone || !id) return;
    event.preventDefault();
    zone.classList.remove("drop-over");
    drop(id, zone);
  });
}

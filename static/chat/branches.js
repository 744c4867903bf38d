// Branches on the page: the ‹ 2 / 3 › switcher, "delete this pair" and Continue (protocol: docs/websocket.md).
import { t } from "./i18n.js";
import { iconButton } from "./icons.js";

function button(action, text, label) {
  const node = document.createElement("button");
  node.type = "button";
  node.dataset.action = action;
  node.textContent = text;
  if (label) {
    node.setAttribute("aria-label", label);
    node.title = label;
  }
  return node;
}

/** This module's controls on a message view: Delete on a user message at once, the switcher and
 * Continue only once needed (a message's text on the page stays its own). */
function controls(view) {
  if (view.branch) return view.branch;
  view.branch = { nav: null, previous: null, position: null, next: null, remove: null, resume: null };
  if (view.role === "user") {
    view.branch.remove = iconButton("delete", t("Delete, with its answer"));
    view.actions.append(view.branch.remove);
  }
  return view.branch;
}

function addSwitcher(view, branch) {
  branch.nav = document.createElement("span");
  branch.nav.className = "branch-nav";
  branch.nav.setAttribute("role", "group");
  branch.nav.setAttribute("aria-label", t("Versions"));
  branch.previous = button("branch-previous", "‹", t("Previous version"));
  branch.position = document.createElement("span");
  branch.position.className = "branch-position";
  branch.next = button("branch-next", "›", t("Next version"));
  branch.nav.append(branch.previous, branch.position, branch.next);
  view.actions.prepend(branch.nav);
}

function addContinue(view, branch) {
  branch.resume = button("continue", t("Continue"), t("Continue this answer"));
  branch.resume.className = "continue-button";
  view.actions.append(branch.resume);
}

/** Where a message sits in the tree (the API's `siblings`, `continuable`), shown on its view. */
export function showBranch(view, message) {
  const branch = controls(view);
  view.siblings = message.siblings?.length ? message.siblings : [view.id];
  view.continuable = Boolean(message.continuable);
  if (view.continuable && !branch.resume && view.role === "assistant") addContinue(view, branch);
  const index = view.siblings.indexOf(view.id);
  const count = view.siblings.length;
  if (count < 2) {
    branch.nav?.remove();
    branch.nav = null;
    return;
  }
  if (!branch.nav) addSwitcher(view, branch);
  branch.position.textContent = `${index + 1} / ${count}`;
  branch.position.setAttribute("aria-label", t("Version %(index)s of %(count)s", { index: index + 1, count }));
  branch.previous.disabled = index <= 0;
  branch.next.disabled = index >= count - 1;
}

/** The branches of the messages on the page, from GET /api/conversations/<id>. */
export function applyTree(views, messages) {
  for (const message of messages) {
    const view = views.get(message.id);
    if (!view) continue;
    showBranch(view, message);
    if (view.continued && message.usage) view.showUsage(message.usage); // the streams added up
  }
}

/** While an answer streams nothing changes the tree; Continue only on the last answer shown. */
export function updateBranchControls(thread, views, idle) {
  for (const view of views) {
    const branch = controls(view);
    if (branch.nav) {
      const index = view.siblings.indexOf(view.id);
      branch.previous.disabled = !idle || index <= 0;
      branch.next.disabled = !idle || index >= view.siblings.length - 1;
    }
    if (branch.remove) branch.remove.hidden = !idle || view.id === null || view.id === undefined;
    if (branch.resume) branch.resume.hidden = !idle || !view.continuable || view.article !== thread.lastElementChild;
  }
}

/** The in-page confirm (like the sidebar's delete): resolves true when Delete is chosen. */
let dialog = null;
function confirmDelete() {
  if (!dialog) {
    dialog = document.createElement("dialog");
    dialog.className = "dialog";
    dialog.id = "delete-pair-dialog";
    dialog.setAttribute("aria-labelledby", "delete-pair-title");
    const form = document.createElement("form");
    form.method = "dialog";
    const title = document.createElement("h2");
    title.id = "delete-pair-title";
    title.textContent = t("Delete this message?");
    const text = document.createElement("p");
    text.textContent = t("The message and its answers will be deleted. What followed them is kept.");
    const buttons = document.createElement("div");
    buttons.className = "dialog-buttons";
    const cancel = button("", t("Cancel"));
    delete cancel.dataset.action;
    cancel.className = "button";
    cancel.addEventListener("click", () => dialog.close("cancel"));
    const ok = button("", t("Delete"));
    delete ok.dataset.action;
    ok.type = "submit";
    ok.value = "confirm";
    ok.className = "button danger";
    buttons.append(cancel, ok);
    form.append(title, text, buttons);
    dialog.append(form);
    document.body.append(dialog);
  }
  return new Promise((resolve) => {
    dialog.returnValue = "";
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "confirm"), { once: true });
    dialog.showModal();
    dialog.querySelector("button:not(.danger)").focus(); // Cancel: a stray Enter deletes nothing
  });
}

/** Clicks on this module's controls: switch, delete (after a confirm), continue. */
export function handleBranchClicks(thread, { viewOf, send, continueAnswer }) {
  thread.addEventListener("click", async (event) => {
    const target = event.target.closest("button[data-action]");
    const article = target?.closest("article[data-message-id]");
    const view = article && viewOf(Number(article.dataset.messageId));
    if (!view) return;
    const action = target.dataset.action;
    if (action === "branch-previous" || action === "branch-next") {
      const index = view.siblings.indexOf(view.id) + (action === "branch-next" ? 1 : -1);
      if (index >= 0 && index < view.siblings.length) send({ type: "switch", message: view.siblings[index] });
    } else if (action === "delete") {
      if (await confirmDelete()) send({ type: "delete", message: view.id });
    } else if (action === "continue") {
      continueAnswer(view);
    }
  });
}

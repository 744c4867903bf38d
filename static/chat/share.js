// The share dialog of the chat page: a topbar button opens it to make read-only links to the open
// conversation (snapshot or live, with or without usage, public where the server allows it), list
// and revoke them, and download the conversation as Markdown or JSON.
// (No word for sending out or bringing in before the module lines: collectstatic's rewriting of
// module paths matches those words in comments too, and renamed a path twice.)
import { api } from "./api.js";
import { t } from "./i18n.js";

const ICON =
  '<svg viewBox="0 0 24 24" width="20" height="20" aria-hidden="true"><path fill="none" stroke="currentColor" ' +
  'stroke-width="2" stroke-linecap="round" stroke-linejoin="round" d="M12 3v12M7 8l5-5 5 5M5 13v6a2 2 0 0 0 2 2h10' +
  'a2 2 0 0 0 2-2v-6"/></svg>';

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/** What a link shows, in words ("live · public · with usage · with your name"): the dialog's and the settings' lists. */
export function shareKinds(share) {
  const kind = [share.live ? t("live") : t("snapshot")];
  if (share.public) kind.push(t("public"));
  if (share.show_usage) kind.push(t("with usage"));
  if (share.show_name) kind.push(t("with your name"));
  return kind;
}

function checkbox(name, label) {
  const wrap = element("label", "share-option");
  const input = element("input");
  input.type = "checkbox";
  input.name = name;
  wrap.append(input, ` ${label}`);
  return wrap;
}

function radio(name, value, label, checked = false) {
  const wrap = element("label", "share-option");
  const input = element("input");
  input.type = "radio";
  input.name = name;
  input.value = value;
  input.checked = checked;
  wrap.append(input, ` ${label}`);
  return wrap;
}

export class ShareDialog {
  /** conversation(): the open conversation's id, null for a new chat. */
  constructor({ conversation }) {
    this.openConversation = conversation;
    this.button = element("button", "icon-button");
    this.button.type = "button";
    this.button.id = "share-button";
    this.button.setAttribute("aria-label", t("Share or export"));
    this.button.setAttribute("aria-haspopup", "dialog");
    this.button.title = t("Share or export");
    this.button.innerHTML = ICON; // constant markup
    document.getElementById("settings-button").before(this.button);
    this.build();
    this.button.addEventListener("click", () => this.open());
  }

  build() {
    this.dialog = element("dialog", "dialog share-dialog");
    this.dialog.id = "share-dialog";
    this.dialog.setAttribute("aria-labelledby", "share-title");
    const title = element("h2", "", t("Share or export"));
    title.id = "share-title";
    this.empty = element("p", "", t("Send a first message, then share or export the conversation."));
    this.body = element("div", "share-body");

    this.form = element("form", "share-form");
    this.form.append(
      element("h3", "", t("Read-only link")),
      radio("mode", "snapshot", t("Snapshot: the conversation as it is now"), true),
      radio("mode", "live", t("Live: follows the conversation as it goes on")),
      checkbox("show_usage", t("Show tokens and cost")),
      checkbox("show_name", t("Show my name")),
    );
    this.public = checkbox("public", t("Public: anyone with the link, signed in or not"));
    this.audience = element("p", "share-audience", t("Links open for signed-in members of the team only."));
    const create = element("button", "button primary", t("Create link"));
    create.type = "submit";
    this.form.append(this.public, this.audience, create);
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.create();
    });

    this.status = element("p", "share-status");
    this.status.setAttribute("role", "status");
    this.list = element("ul", "share-list");
    this.list.setAttribute("aria-label", t("Links to this conversation"));
    this.list.addEventListener("click", (event) => this.onListClick(event));

    const exports = element("div", "share-export");
    this.markdown = element("a", "button", t("Export Markdown"));
    this.json = element("a", "button", t("Export JSON"));
    exports.append(element("h3", "", t("Export")), this.markdown, this.json);
    this.body.append(this.form, this.status, this.list, exports);

    const buttons = element("div", "dialog-buttons");
    const close = element("button", "button", t("Close"));
    close.type = "button";
    close.addEventListener("click", () => this.dialog.close());
    buttons.append(close);
    this.dialog.append(title, this.empty, this.body, buttons);
    document.body.append(this.dialog);
  }

  async open() {
    this.conversation = this.openConversation();
    this.empty.hidden = this.conversation !== null;
    this.body.hidden = this.conversation === null;
    this.status.textContent = "";
    this.list.replaceChildren();
    this.dialog.showModal();
    if (this.conversation === null) return;
    const base = `/api/conversations/${this.conversation}/export?format=`;
    this.markdown.href = `${base}md`;
    this.json.href = `${base}json`;
    await this.refresh();
  }

  async refresh() {
    try {
      const data = await api(`/api/conversations/${this.conversation}/shares`);
      this.public.hidden = !data.public_allowed;
      this.audience.hidden = data.public_allowed;
      this.list.replaceChildren(...data.shares.map((share) => this.row(share)));
    } catch (error) {
      this.status.textContent = t("Could not load the links: %(error)s", { error: error.message });
    }
  }

  row(share) {
    const item = element("li", "share-row");
    item.dataset.shareId = share.id;
    const url = new URL(share.url, location.origin).href;
    const field = element("input", "share-url");
    field.readOnly = true;
    field.value = url;
    field.setAttribute("aria-label", t("Link"));
    const kind = shareKinds(share);
    const copy = element("button", "button", t("Copy"));
    copy.type = "button";
    copy.dataset.action = "copy";
    const revoke = element("button", "button danger", t("Revoke"));
    revoke.type = "button";
    revoke.dataset.action = "revoke";
    item.append(field, element("span", "share-kind", kind.join(" · ")), copy, revoke);
    return item;
  }

  async create() {
    const data = new FormData(this.form);
    const body = {
      live: data.get("mode") === "live",
      show_usage: data.has("show_usage"),
      show_name: data.has("show_name"),
      public: !this.public.hidden && data.has("public"),
    };
    try {
      const share = await api(`/api/conversations/${this.conversation}/shares`, { method: "POST", body });
      this.list.prepend(this.row(share));
      this.status.textContent = t("Link created.");
      this.list.querySelector(".share-url")?.select();
    } catch (error) {
      this.status.textContent = t("Could not create the link: %(error)s", { error: error.message });
    }
  }

  async onListClick(event) {
    const button = event.target.closest("button[data-action]");
    if (!button) return;
    const item = button.closest("li");
    if (button.dataset.action === "copy") {
      const field = item.querySelector(".share-url");
      field.select();
      try {
        await navigator.clipboard.writeText(field.value);
        this.status.textContent = t("Link copied.");
      } catch {
        this.status.textContent = t("Press Ctrl+C to copy the selected link.");
      }
      return;
    }
    try {
      await api(`/api/shares/${item.dataset.shareId}`, { method: "DELETE" });
      item.remove();
      this.status.textContent = t("Link revoked: it no longer opens.");
    } catch (error) {
      this.status.textContent = t("Could not revoke the link: %(error)s", { error: error.message });
    }
  }
}

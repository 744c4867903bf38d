// An archived conversation, once opened, says so under the header and offers Restore.
import { api } from "./api.js";
import { t } from "./i18n.js";

export class ArchivedNotice {
  /** handlers: restored(id), error(message) */
  constructor(handlers) {
    this.handlers = handlers;
    this.box = document.getElementById("archived-notice");
    this.button = document.getElementById("archived-restore");
    this.id = null;
    this.button.addEventListener("click", () => this.restore());
  }

  /** The conversation shown (its JSON), or null for a new chat. */
  show(conversation) {
    this.id = conversation?.archived ? conversation.id : null;
    this.box.hidden = this.id === null;
  }

  async restore() {
    const id = this.id;
    if (id === null) return;
    this.button.disabled = true;
    try {
      await api(`/api/conversations/${id}`, { method: "PATCH", body: { archived: false } });
      if (this.id === id) this.show(null);
      this.handlers.restored(id);
    } catch (error) {
      this.handlers.error(t("Could not restore: %(error)s", { error: error.message }));
    } finally {
      this.button.disabled = false;
    }
  }
}

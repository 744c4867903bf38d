// Drafts: what is typed in the message box, kept per conversation in this tab's session storage, so that
// opening another conversation, a reload, or being signed out elsewhere and back in loses none of it, and a
// draft does not follow the person into the next conversation.

function stored(action) {
  try {
    return action();
  } catch {
    return null; // storage off or full: the box works as before
  }
}

export class Drafts {
  /** box: the message box; user: whose drafts (another person signing in on this tab sees none of them). */
  constructor(box, user) {
    this.box = box;
    this.prefix = `chat.draft.${user}.`;
    this.key = undefined;
  }

  /** The box now holds the draft of `conversation` (null: a new chat); what it held is kept for the one before. */
  switchTo(conversation) {
    const first = this.key === undefined;
    this.save();
    this.key = conversation === null ? "new" : String(conversation);
    if (first && this.box.value) {
      this.save(); // typed before the page was ready (early.js): it stays, and goes out
      return;
    }
    this.box.value = stored(() => sessionStorage.getItem(this.prefix + this.key)) || "";
  }

  /** A new chat's first message made it a conversation: the box's draft is that conversation's now. */
  became(conversation) {
    stored(() => sessionStorage.removeItem(`${this.prefix}new`));
    this.key = String(conversation);
    this.save();
  }

  /** Keep what the box holds (nothing: the draft goes). */
  save() {
    if (this.key === undefined) return;
    const name = this.prefix + this.key;
    const text = this.box.value;
    stored(() => (text ? sessionStorage.setItem(name, text) : sessionStorage.removeItem(name)));
  }
}

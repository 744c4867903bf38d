// The shared page (/s/<token>/): the branch shown, drawn read-only by the chat's own message views.
import { t } from "./i18n.js";
import { MessageView } from "./messages.js";
import { handleCopyClicks } from "./render.js";

const thread = document.getElementById("thread");
const messages = JSON.parse(document.getElementById("shared-messages").textContent);
thread.replaceChildren(
  ...messages.map((message) => {
    // An answer still being written when shared is drawn as the text it had, said so, not as a stream.
    const writing = message.status === "streaming";
    const view = new MessageView(writing ? { ...message, status: "complete" } : message);
    view.actions.remove(); // nothing to edit or regenerate here; code blocks keep their own tools
    if (writing) {
      view.statusLine.textContent = t("Still being written when this page was made");
      view.statusLine.hidden = false;
    }
    return view.article;
  }),
);
handleCopyClicks(thread);

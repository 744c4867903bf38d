// The shared page (/s/<token>/): the branch shown, drawn read-only by the chat's own message views.
import { MessageView } from "./messages.js";
import { handleCopyClicks } from "./render.js";

const thread = document.getElementById("thread");
const messages = JSON.parse(document.getElementById("shared-messages").textContent);
thread.replaceChildren(
  ...messages.map((message) => {
    const view = new MessageView(message);
    view.actions.remove(); // nothing to edit, regenerate or copy-into here but the code blocks' own tools
    return view.article;
  }),
);
handleCopyClicks(thread);

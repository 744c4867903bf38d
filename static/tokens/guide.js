// The API guide page: docs/api.md drawn by the same markdown code as the answers in the chat.
import { handleCopyClicks, renderMarkdown } from "../chat/render.js";

const root = document.getElementById("guide");
root.replaceChildren(renderMarkdown(JSON.parse(document.getElementById("guide-text").textContent)));
handleCopyClicks(root);

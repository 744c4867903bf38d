// The admin's review of a conversation (templates/admin/chat/conversation/change_form.html): each
// answer, sent as escaped text, drawn from markdown by the chat's own sanitising renderer.
import { handleCopyClicks, renderMarkdown } from "./render.js";

const review = document.getElementById("review");
if (review) {
  for (const answer of review.querySelectorAll("[data-markdown]")) {
    answer.replaceChildren(renderMarkdown(answer.textContent));
    answer.removeAttribute("data-markdown"); // drawn: no longer plain text
  }
  handleCopyClicks(review);
}

// Renders a long finished block's markdown to HTML text off the page's main thread (render-slices.js
// sanitizes it in slices), with the very code the page renders with: the result is the same.
import { toHtml } from "./markdown.js";

self.addEventListener("message", ({ data }) => {
  let reply;
  try {
    reply = { id: data.id, html: toHtml(data.source, data.options) };
  } catch (error) {
    reply = { id: data.id, error: String(error?.message || error) };
  }
  self.postMessage(reply);
});

// DOMPurify has the last word on every piece of an answer put in the page: model output is untrusted.
import DOMPurify from "../vendor/dompurify/purify.es.mjs";
import { t } from "./i18n.js";

// An instance of its own, configured once: a streaming answer is sanitized in many small pieces, and
// reading a config at each call (cloning its allowlists) was a third of each piece's cost. Its own, so
// that math.js's in-place sanitizing of KaTeX's output keeps its own config (and not our hook).
const purify = DOMPurify(window);

const PURIFY = {
  FORBID_TAGS: ["style", "form", "iframe", "object", "embed", "svg", "math"],
  FORBID_ATTR: ["style", "id", "name"], // style would trip the CSP; ids could clobber the page's own
  ADD_ATTR: ["target"],
  RETURN_DOM_FRAGMENT: true,
};
purify.setConfig(PURIFY);

purify.addHook("afterSanitizeAttributes", (node) => {
  // A wide table scrolls sideways inside the answer: reachable by the keyboard to scroll it.
  if (node.nodeName === "TABLE") node.setAttribute("tabindex", "0");
  if (node.nodeName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
  if (node.nodeName === "IMG") {
    // No request to another origin (a tracking pixel, a leak of the conversation).
    const src = node.getAttribute("src") || "";
    let url = null;
    try {
      url = new URL(src, location.href);
    } catch {
      url = null;
    }
    if (!url || (url.protocol !== "data:" && url.origin !== location.origin)) {
      // Shown as its alt text and a link instead (see showRemoteImages): never fetched by the page.
      node.removeAttribute("src");
      node.dataset.remote = url && /^https?:$/.test(url.protocol) ? url.href : "";
    }
  }
});

/** Each blocked remote image as "🖼 alt text" linking to the image, opened only if the user clicks. */
function showRemoteImages(fragment) {
  for (const img of fragment.querySelectorAll("img[data-remote]")) {
    const label = `🖼 ${img.getAttribute("alt") || t("image")}`;
    const link = document.createElement(img.dataset.remote ? "a" : "span");
    link.className = "remote-image";
    link.textContent = label;
    if (img.dataset.remote) {
      link.href = img.dataset.remote;
      link.target = "_blank";
      link.rel = "noopener noreferrer";
      link.title = t("Image not loaded: %(url)s", { url: img.dataset.remote });
    }
    img.replaceWith(link);
  }
  return fragment;
}

/** A sanitized DOM fragment for a piece of HTML. */
export function sanitize(html) {
  return showRemoteImages(purify.sanitize(html));
}

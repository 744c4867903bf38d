// Math in answers: marked keeps TeX as it was written (backslashes too), KaTeX draws it once a block is done.
import DOMPurify from "../vendor/dompurify/purify.es.mjs";

export { mathExtension } from "./math-syntax.js";

// KaTeX (a third of the page's scripts) is not on the way to a ready page: it is fetched when the first
// math is drawn, or once the page is ready (preloadMath). Math finished meanwhile waits for it.
let katex = globalThis.katex || null;
let loading = null;
const waiting = new Set();

function loadKatex() {
  loading ??= import("../vendor/katex/katex.min.js").then(() => {
    katex = globalThis.katex; // its UMD build sets globalThis.katex
    for (const node of waiting) typesetNode(node);
    waiting.clear();
  });
  return loading;
}

/** Fetch KaTeX in the background, so that math is drawn at once when it comes. */
export function preloadMath() {
  loadKatex().catch(() => {}); // tried again when math comes
}
const STYLESHEET = new URL("../vendor/katex/katex.min.css", import.meta.url).href;

// KaTeX builds its DOM itself (styles set through the CSSOM, which the CSP allows); DOMPurify then
// walks that DOM in place, keeping KaTeX's MathML and SVG but nothing that could run or navigate.
const PURIFY_MATH = {
  IN_PLACE: true,
  USE_PROFILES: { html: true, svg: true, mathMl: true },
  FORBID_TAGS: ["style", "form", "iframe", "object", "embed", "foreignObject", "a", "img"],
  FORBID_ATTR: ["id", "name", "href", "xlink:href"],
};

function ensureStylesheet() {
  if (document.querySelector(`link[href="${STYLESHEET}"]`)) return;
  const link = document.createElement("link");
  link.rel = "stylesheet";
  link.href = STYLESHEET;
  document.head.append(link);
}

export const MATH_PENDING = ".math:not([data-typeset])";

/** Draw every math placeholder under `root` with KaTeX; TeX it cannot read stays as source, marked. */
export function typesetMath(root) {
  for (const node of root.querySelectorAll(MATH_PENDING)) typesetNode(node);
}

/** Draw one math placeholder (render-slices.js draws a long block's one by one, between tasks). */
export function typesetNode(node) {
  if (!katex) {
    waiting.add(node); // drawn as soon as KaTeX is in
    loadKatex().catch(() => {
      loading = null;
    });
    return;
  }
  ensureStylesheet();
  const tex = node.textContent;
  try {
    katex.render(tex, node, {
      displayMode: node.classList.contains("math-display"),
      throwOnError: true, // KaTeX's own error output is HTML with a style attribute, refused by the CSP
      strict: "ignore",
      trust: false, // no \href, \url, \includegraphics, \htmlClass…
      maxSize: 20,
      maxExpand: 500,
    });
    DOMPurify.sanitize(node, PURIFY_MATH);
  } catch (error) {
    node.textContent = tex;
    node.classList.add("math-error");
    node.title = String(error?.message || error);
  }
  node.dataset.typeset = "";
  node.setAttribute("data-tex", tex); // the source, for copying and for tests
}

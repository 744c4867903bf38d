// Markdown to safe DOM: marked parses, highlight.js colours code, DOMPurify has the last word.
import { Marked } from "../vendor/marked/marked.esm.js";
import DOMPurify from "../vendor/dompurify/purify.es.mjs";
import hljs from "../vendor/highlight/highlight.min.js";

// A code block still growing in the tail is highlighted only while it is small (cost per frame).
const TAIL_HIGHLIGHT_LIMIT = 12000;
const FENCE_RE = /^ *(`{3,}|~{3,})/;
// A line that may continue the block above across a blank line: indented, or a list item.
const CONTINUES_RE = /^(?:[ \t]|[-*+][ \t]|\d{1,9}[.)][ \t])/;
// Link reference definitions reach back across blocks: only a whole render resolves them.
const REFERENCE_RE = /^ {0,3}\[[^\]]+\]:/m;

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
export function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

let highlightCode = true; // switched off while rendering a big unfinished tail

function codeBlock({ text, lang }) {
  const language = ((lang || "").match(/^\S*/) || [""])[0];
  const known = highlightCode && language && hljs.getLanguage(language);
  const body = known ? hljs.highlight(text, { language, ignoreIllegals: true }).value : escapeHtml(text);
  return (
    `<div class="code-block"><div class="code-head"><span class="code-lang">${escapeHtml(language || "text")}</span>` +
    `<button type="button" class="copy-code" aria-label="Copy code">Copy</button></div>` +
    `<pre tabindex="0"><code class="hljs${known ? ` language-${escapeHtml(language)}` : ""}">${body}</code></pre></div>`
  );
}

const marked = new Marked({
  gfm: true,
  breaks: false,
  renderer: {
    code: codeBlock,
    // Raw HTML from a model is shown as text, never interpreted.
    html({ text, block }) {
      return block ? `<p class="raw-html">${escapeHtml(text.replace(/\n+$/, ""))}</p>` : escapeHtml(text);
    },
  },
});

const PURIFY = {
  FORBID_TAGS: ["style", "form", "iframe", "object", "embed", "svg", "math"],
  FORBID_ATTR: ["style", "id", "name"], // style would trip the CSP; ids could clobber the page's own
  ADD_ATTR: ["target"],
  RETURN_DOM_FRAGMENT: true,
};

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
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
    const label = `🖼 ${img.getAttribute("alt") || "image"}`;
    const link = document.createElement(img.dataset.remote ? "a" : "span");
    link.className = "remote-image";
    link.textContent = label;
    if (img.dataset.remote) {
      link.href = img.dataset.remote;
      link.target = "_blank";
      link.rel = "noopener noreferrer";
      link.title = `Image not loaded: ${img.dataset.remote}`;
    }
    img.replaceWith(link);
  }
  return fragment;
}

/** Sanitized DOM fragment for a piece of markdown. */
export function renderMarkdown(source, { highlight = true } = {}) {
  highlightCode = highlight;
  try {
    return showRemoteImages(DOMPurify.sanitize(marked.parse(source), PURIFY));
  } finally {
    highlightCode = true;
  }
}

/**
 * Where completed top-level blocks end in `text` from `from` on: at the last blank line
 * outside a code fence that is followed by a line starting a new block (not indented,
 * not a list item, so loose lists stay whole). Fences are balanced before `from`.
 */
export function completedUpTo(text, from) {
  let split = from;
  let blank = -1; // just after the latest blank line, while no line has followed it
  let fence = null; // the opening marker while inside a fenced block
  let start = from;
  for (;;) {
    const end = text.indexOf("\n", start);
    if (end === -1) break; // the last line is unfinished: it stays in the tail
    const line = text.slice(start, end);
    const marker = line.match(FENCE_RE);
    if (fence) {
      const closing = marker && marker[1][0] === fence[0] && marker[1].length >= fence.length;
      if (closing && !line.trim().slice(marker[1].length).trim()) fence = null;
    } else if (!line.trim()) {
      blank = end + 1;
    } else {
      if (blank !== -1 && !CONTINUES_RE.test(line)) split = blank;
      blank = -1;
      if (marker) fence = marker[1];
    }
    start = end + 1;
  }
  return split;
}

/**
 * Renders a growing markdown answer into `root`. Completed blocks are rendered once and
 * kept; only the unfinished tail is rendered again, at most once per animation frame.
 */
export class StreamRenderer {
  constructor(root, onPaint) {
    this.root = root;
    this.onPaint = onPaint || (() => {});
    this.source = "";
    this.committed = 0; // source[0:committed] is in the DOM as finished blocks
    this.frame = 0;
    this.tail = document.createElement("div");
    this.tail.className = "md-tail";
    root.replaceChildren(this.tail);
  }

  append(text) {
    this.source += text;
    this.schedule();
  }

  reset(text) {
    this.source = text;
    this.committed = 0;
    this.root.replaceChildren(this.tail);
    this.schedule();
  }

  schedule() {
    if (!this.frame) this.frame = requestAnimationFrame(() => this.paint());
  }

  /** Paint now instead of at the next frame. */
  flush() {
    if (this.frame) cancelAnimationFrame(this.frame);
    this.paint();
  }

  paint() {
    this.frame = 0;
    const split = completedUpTo(this.source, this.committed);
    if (split > this.committed) {
      const blocks = renderMarkdown(this.source.slice(this.committed, split));
      this.tail.before(blocks);
      this.committed = split;
    }
    const rest = this.source.slice(this.committed);
    this.tail.replaceChildren(rest ? renderMarkdown(rest, { highlight: rest.length < TAIL_HIGHLIGHT_LIMIT }) : "");
    this.onPaint();
  }

  /** The stream ended: the tail becomes a block like the others (highlighted, however long). */
  finish() {
    if (this.frame) cancelAnimationFrame(this.frame);
    this.frame = 0;
    if (REFERENCE_RE.test(this.source)) {
      this.root.replaceChildren(renderMarkdown(this.source)); // as a reload will show it
    } else {
      this.tail.replaceWith(renderMarkdown(this.source.slice(this.committed)));
    }
    this.onPaint();
  }
}

/** Copy buttons of code blocks, by delegation from a container. */
export function handleCopyClicks(container) {
  container.addEventListener("click", async (event) => {
    const button = event.target.closest(".copy-code");
    if (!button) return;
    const code = button.closest(".code-block")?.querySelector("code");
    if (!code) return;
    try {
      await navigator.clipboard.writeText(code.textContent);
      button.textContent = "Copied";
    } catch {
      button.textContent = "Copy failed";
    }
    setTimeout(() => (button.textContent = "Copy"), 1500);
  });
}

// Markdown to HTML text: marked parses, highlight.js colours code. No DOM here, so that the markdown
// worker (markdown-worker.js) renders a long block off the main thread exactly as the page would;
// render.js sanitizes the text into DOM.
import { Marked } from "../vendor/marked/marked.esm.js";
import hljs from "../vendor/highlight/highlight.min.js";
import { mathExtension } from "./math-syntax.js";

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
export function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

// The code block buttons' text, translated by the page (render.js), which also hands it to the worker.
export const LABELS = {
  wrap: "Wrap",
  wrapLabel: "Wrap long lines",
  download: "Download",
  downloadLabel: "Download code",
  copy: "Copy",
  copyLabel: "Copy code",
};

let options = { highlight: true, labels: LABELS }; // of the render under way

export function languageOf(info) {
  return ((info || "").match(/^\S*/) || [""])[0];
}

/** Whether highlight.js knows `language`. */
export function knownLanguage(language) {
  return Boolean(language && hljs.getLanguage(language));
}

/** Code as highlighted HTML for a known language, else as escaped text. */
export function highlightHtml(text, language) {
  return knownLanguage(language) ? hljs.highlight(text, { language, ignoreIllegals: true }).value : escapeHtml(text);
}

function codeHead(language, labels) {
  const e = escapeHtml;
  return (
    `<div class="code-head"><span class="code-lang">${e(language || "text")}</span>` +
    `<span class="code-tools"><button type="button" class="wrap-code" aria-pressed="false" ` +
    `aria-label="${e(labels.wrapLabel)}">${e(labels.wrap)}</button>` +
    `<button type="button" class="download-code" aria-label="${e(labels.downloadLabel)}">${e(labels.download)}` +
    `</button><button type="button" class="copy-code" aria-label="${e(labels.copyLabel)}">${e(labels.copy)}` +
    `</button></span></div>`
  );
}

/** A fenced code block's HTML: its language, its buttons and its code. */
export function codeBlockHtml({ text, lang }) {
  const language = languageOf(lang);
  const known = options.highlight && knownLanguage(language);
  const body = known ? highlightHtml(text, language) : escapeHtml(text);
  return (
    `<div class="code-block" data-lang="${escapeHtml(language)}">${codeHead(language, options.labels)}` +
    `<pre tabindex="0"><code class="hljs${known ? ` language-${escapeHtml(language)}` : ""}">${body}</code></pre></div>`
  );
}

const marked = new Marked({
  gfm: true,
  breaks: false,
  renderer: {
    code: codeBlockHtml,
    // Raw HTML from a model is shown as text, never interpreted.
    html({ text, block }) {
      return block ? `<p class="raw-html">${escapeHtml(text.replace(/\n+$/, ""))}</p>` : escapeHtml(text);
    },
  },
});
marked.use(mathExtension);

/** The HTML of `source`, its code highlighted unless `highlight` is false, its buttons labelled by `labels`. */
export function toHtml(source, { highlight = true, labels = LABELS } = {}) {
  options = { highlight, labels };
  try {
    return marked.parse(source);
  } finally {
    options = { highlight: true, labels: LABELS };
  }
}

/** The HTML of a piece of one paragraph. */
export function inlineHtml(text) {
  return marked.parseInline(text);
}

/** The HTML of an empty code block, for one that is still streaming. */
export function emptyCodeBlockHtml(lang, labels = LABELS) {
  options = { highlight: true, labels };
  try {
    return codeBlockHtml({ text: "", lang });
  } finally {
    options = { highlight: true, labels: LABELS };
  }
}

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

// --- long blocks in parts ----------------------------------------------------------------------
// A long code block or paragraph is cut into parts (display: block), so that the page can put it in
// a few parts a frame (render-slices.js putInPlace) instead of laying all of it out at once. A cut in
// code falls between lines, one in a paragraph after a sentence: it starts a new line, as it did
// while the paragraph streamed (render.js OpenParagraph), so only very long paragraphs are cut.
// The sizes are those of a block's parts while it streams (render.js), so that it is cut alike.
export const PART_CLASS = "block-part";
export const PART_LINES = 100;
export const PART_CHARS = 2000;
const LONG_PARAGRAPH = 16000;
const SENTENCE_END = /[.!?:;] /g;

// Every tag marked and our renderers write; text has each "<" escaped, so a "<" always opens a tag.
export const TAG = /<(\/?)([a-zA-Z][a-zA-Z0-9-]*)\b[^>]*>/g;
const TOKEN = new RegExp(`${TAG.source}|[^<]+`, "g"); // a tag, or the text up to the next one
const VOID = new Set(["area", "br", "col", "embed", "hr", "img", "input", "source", "track", "wbr"]);

/** Whether `tag`, named `name`, opens an element that a closing tag ends (not a void or self-closed one). */
export function opensElement(tag, name) {
  return !VOID.has(name.toLowerCase()) && !tag.endsWith("/>");
}

/**
 * `html` (tags and escaped text) wrapped in parts, cut where `nextCut(text, depth)` says in a text:
 * the tags open at a cut are closed before it and written again after. Unchanged if never cut.
 */
function inParts(html, nextCut) {
  const open = []; // [name, tag] of the tags open here
  const opener = `<span class="${PART_CLASS}">`;
  let out = opener;
  let cuts = 0;
  for (const [token, closing, name] of html.matchAll(TOKEN)) {
    if (name) {
      if (closing) open.pop();
      else if (opensElement(token, name)) open.push([name, token]);
      out += token;
      continue;
    }
    let text = token;
    for (let at = nextCut(text, open.length); at !== -1; at = nextCut(text, open.length)) {
      const closed = open.map(([tag]) => `</${tag}>`).reverse().join("");
      out += `${text.slice(0, at)}${closed}</span>${opener}${open.map(([, tag]) => tag).join("")}`;
      text = text.slice(at);
      cuts += 1;
    }
    out += text;
  }
  if (!cuts) return html;
  return out.endsWith(opener) ? out.slice(0, -opener.length) : `${out}</span>`;
}

/** Cuts code after every PART_LINES lines. */
function everyLines() {
  let lines = 0;
  return (text) => {
    for (let at = text.indexOf("\n"); at !== -1; at = text.indexOf("\n", at + 1)) {
      lines += 1;
      if (lines === PART_LINES) {
        lines = 0;
        return at + 1;
      }
    }
    return -1;
  };
}

/** Cuts a paragraph's text outside inline markup: after a sentence once PART_CHARS long, at a space past twice that. */
function afterSentences() {
  let length = 0; // of the text since the last cut
  return (text, depth) => {
    if (!depth) {
      SENTENCE_END.lastIndex = Math.max(0, PART_CHARS - length);
      const sentence = SENTENCE_END.exec(text);
      let at = sentence ? sentence.index + 2 : -1;
      const space = text.indexOf(" ", Math.max(0, 2 * PART_CHARS - length));
      if (space !== -1 && (at === -1 || space + 1 < at)) at = space + 1;
      if (at !== -1) {
        length = 0;
        return at;
      }
    }
    length += text.length;
    return -1;
  };
}

/** A fenced code block's HTML: its language, its buttons and its code. */
export function codeBlockHtml({ text, lang }) {
  const language = languageOf(lang);
  const known = options.highlight && knownLanguage(language);
  const body = inParts(known ? highlightHtml(text, language) : escapeHtml(text), everyLines());
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
    paragraph({ tokens, text }) {
      if (text.length <= LONG_PARAGRAPH) return false; // marked's own
      return `<p>${inParts(this.parser.parseInline(tokens), afterSentences())}</p>\n`;
    },
    // Raw HTML from a model is shown as text, never interpreted.
    html({ text, block }) {
      return block ? `<p class="raw-html">${escapeHtml(text.replace(/\n+$/, ""))}</p>` : escapeHtml(text);
    },
  },
});
marked.use(mathExtension);

// Footnotes, which marked does not know: a "[^1]: note" line would be a link definition, and each "[^1]" a
// link to a relative address named after the note, opening a page that is not there. A reference is a
// superscript, a note a paragraph of its own starting with its label.
const FOOTNOTE_NOTE = /^\[\^([^\]\s]{1,20})\]:[ \t]*([^\n]*(?:\n(?![ \t]*\n|\[\^)[^\n]*)*)(?:\n+|$)/;
const FOOTNOTE_REF = /^\[\^([^\]\s]{1,20})\](?!:)/;
marked.use({
  extensions: [
    {
      name: "footnoteNote",
      level: "block",
      start: (source) => source.match(/^\[\^[^\]\s]{1,20}\]:/m)?.index,
      tokenizer(source) {
        const match = FOOTNOTE_NOTE.exec(source);
        if (!match) return undefined;
        return { type: "footnoteNote", raw: match[0], label: match[1], tokens: this.lexer.inlineTokens(match[2].trim()) };
      },
      renderer(token) {
        return `<p class="footnote"><sup>${escapeHtml(token.label)}</sup> ${this.parser.parseInline(token.tokens)}</p>\n`;
      },
    },
    {
      name: "footnoteRef",
      level: "inline",
      start: (source) => source.indexOf("[^"),
      tokenizer(source) {
        const match = FOOTNOTE_REF.exec(source);
        return match ? { type: "footnoteRef", raw: match[0], label: match[1] } : undefined;
      },
      renderer: (token) => `<sup class="footnote-ref">${escapeHtml(token.label)}</sup>`,
    },
  ],
});

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

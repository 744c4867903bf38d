// Math in answers: marked keeps TeX as it was written (backslashes too), KaTeX draws it once a block is done.
import "../vendor/katex/katex.min.js"; // its UMD build sets globalThis.katex
import DOMPurify from "../vendor/dompurify/purify.es.mjs";

const katex = globalThis.katex;
const STYLESHEET = new URL("../vendor/katex/katex.min.css", import.meta.url).href;

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const escape = (text) => String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);

// `$…$` as Pandoc reads it: no space just inside either dollar and no digit right after the closing
// one, so "$5 and $10" stays text. One line at most; `\$` is a dollar inside.
const INLINE_DOLLAR = /^\$(?![\s$])((?:\\.|[^\\$\n])+?)(?<![\s\\])\$(?!\d)/;
const INLINE_PAREN = /^\\\(([\s\S]+?)\\\)/;
const INLINE_DISPLAY = /^\$\$(?!\$)([\s\S]+?)\$\$/;
const BLOCK_DOLLARS = /^ {0,3}\$\$([\s\S]+?)\$\$[ \t]*(?:\n+|$)/;
const BLOCK_BRACKETS = /^ {0,3}\\\[([\s\S]+?)\\\][ \t]*(?:\n+|$)/;

function placeholder(tex, display) {
  const tag = display ? "div" : "span";
  return `<${tag} class="math${display ? " math-display" : ""}">${escape(tex.trim())}</${tag}>`;
}

/** A marked extension: math is a token of its own, its TeX shown as text until typesetMath() draws it. */
export const mathExtension = {
  extensions: [
    {
      name: "blockMath",
      level: "block",
      start: (src) => src.match(/^ {0,3}(?:\$\$|\\\[)/m)?.index,
      tokenizer(src) {
        const match = BLOCK_DOLLARS.exec(src) || BLOCK_BRACKETS.exec(src);
        if (match) return { type: "blockMath", raw: match[0], text: match[1], display: true };
        return undefined;
      },
      renderer: (token) => placeholder(token.text, true),
    },
    {
      name: "inlineMath",
      level: "inline",
      start: (src) => src.match(/\$|\\\(/)?.index,
      tokenizer(src) {
        let match = INLINE_DISPLAY.exec(src);
        if (match) return { type: "inlineMath", raw: match[0], text: match[1], display: true };
        match = INLINE_DOLLAR.exec(src) || INLINE_PAREN.exec(src);
        if (match) return { type: "inlineMath", raw: match[0], text: match[1], display: false };
        return undefined;
      },
      renderer: (token) => placeholder(token.text, token.display),
    },
  ],
};

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

/** Draw every math placeholder under `root` with KaTeX; TeX it cannot read stays as source, marked. */
export function typesetMath(root) {
  const nodes = root.querySelectorAll(".math:not([data-typeset])");
  if (!nodes.length) return;
  ensureStylesheet();
  for (const node of nodes) {
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
}

// Math syntax for marked: TeX kept as it was written (backslashes too), shown as text until math.js
// draws it. No DOM here, so the markdown worker (markdown-worker.js) parses math as the page does.

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

// Markdown to safe DOM: markdown.js turns it into HTML (marked, highlight.js), DOMPurify has the last
// word (sanitize.js); KaTeX (math.js) and Mermaid (diagrams.js) draw math and diagrams once their
// block is finished. A long block's final render is time-sliced (render-slices.js).
import { drawDiagrams } from "./diagrams.js";
import { t } from "./i18n.js";
import {
  emptyCodeBlockHtml,
  escapeHtml,
  highlightHtml,
  inlineHtml,
  knownLanguage,
  languageOf,
  PART_CHARS,
  PART_LINES,
  toHtml,
} from "./markdown.js";
import { typesetMath } from "./math.js";
import { nextTask, putInPlace, renderInSlices, warmUp } from "./render-slices.js";
import { sanitize } from "./sanitize.js";

export { escapeHtml };

// A tail that is neither one open paragraph nor one open code block is rendered whole at each
// frame; past this size its code is not highlighted (cost per frame).
const TAIL_HIGHLIGHT_LIMIT = 12000;
const FENCE_RE = /^ *(`{3,}|~{3,})(.*)$/;
// A line that may continue the block above across a blank line: indented, or a list item.
const CONTINUES_RE = /^(?:[ \t]|[-*+][ \t]|\d{1,9}[.)][ \t])/;
// Link reference definitions reach back across blocks: only a whole render resolves them.
const REFERENCE_RE = /^ {0,3}\[[^\]]+\]:/m;
// A line that may start or turn a paragraph into another block (heading, list, quote, table, fence,
// setext underline, HTML, math, indented code): an open paragraph with one is rendered whole.
const NOT_PLAIN_RE = /^(?:\s*$| {0,3}(?:[#>*+\-=_|`~<]|\d{1,9}[.)]|\$\$|\\\[)| {4}|\t)/;
// An open paragraph is rendered in segments of about this many characters, each once, and laid out
// in parts of about PART_CHARS characters; an open code block in parts of PART_LINES lines (markdown.js).
const SEGMENT = 240;
// At most one paint every this many ms (20 a second): a token or three a frame at a model's pace is
// not worth a frame's work each, least of all on a busy machine.
const PAINT_INTERVAL = 50;
// And, on a slow device, at most one every FRAME_SHARE times as long as the last paint's frame took
// (its script, style, layout and paint): the stream's frames then keep at most about a third of the
// main thread, and each one's work is spread over fewer frames however slow the device.
const FRAME_SHARE = 3;
const LONGEST_INTERVAL = 1000;

// Finished blocks longer than this (in characters of markdown) are rendered in slices, off the
// main thread where they can be: a whole render of 80 kB took over 100 ms at once.
const SLICE_ABOVE = 16000;

/** The code block buttons' text, in the page's language. */
function labels() {
  return {
    wrap: t("Wrap"),
    wrapLabel: t("Wrap long lines"),
    download: t("Download"),
    downloadLabel: t("Download code"),
    copy: t("Copy"),
    copyLabel: t("Copy code"),
  };
}

/**
 * Sanitized DOM fragment for a piece of markdown. `finished` (the default) also draws its math
 * and diagrams; an unfinished tail shows their source.
 */
export function renderMarkdown(source, { highlight = true, finished = true } = {}) {
  const fragment = sanitize(toHtml(source, { highlight, labels: labels() }));
  if (finished) {
    typesetMath(fragment);
    drawDiagrams(fragment);
  }
  return fragment;
}

/**
 * Finds where completed top-level blocks end in a growing text, reading each line once: at the
 * last blank line outside a code fence that is followed by a line starting a new block (not
 * indented, not a list item, so loose lists stay whole), or right after the closing fence of a
 * code block that started a block.
 */
export class BlockScanner {
  constructor(from = 0) {
    this.pos = from; // the next line to read starts here
    this.split = from;
    this.blank = from; // just after the latest blank line while no line has followed it (-1: none)
    this.fence = null; // the opening marker while inside a fenced block
    this.fenceStartsBlock = false;
  }

  /** The end of the completed blocks of `text` (which only ever grows). */
  advance(text) {
    for (;;) {
      const end = text.indexOf("\n", this.pos);
      if (end === -1) break; // the last line is unfinished: it stays in the tail
      const line = text.slice(this.pos, end);
      const marker = line.match(FENCE_RE);
      if (this.fence) {
        const closing = marker && marker[1][0] === this.fence[0] && marker[1].length >= this.fence.length;
        if (closing && !marker[2].trim()) {
          this.fence = null;
          if (this.fenceStartsBlock) this.split = end + 1;
        }
      } else if (!line.trim()) {
        this.blank = end + 1;
      } else {
        const startsBlock = this.blank !== -1 && !CONTINUES_RE.test(line);
        if (startsBlock) this.split = this.blank;
        this.blank = -1;
        if (marker) {
          this.fence = marker[1];
          this.fenceStartsBlock = startsBlock;
        }
      }
      this.pos = end + 1;
    }
    return this.split;
  }
}

/** Where `text` may be cut after `from` so that inline markup before the cut is closed, or -1. */
function segmentEnd(text, from) {
  let cut = text.lastIndexOf(" ", text.length - 2);
  for (let tries = 0; tries < 8 && cut > from; tries += 1, cut = text.lastIndexOf(" ", cut - 1)) {
    if (balanced(text.slice(from, cut + 1))) return cut + 1;
  }
  return -1;
}

function count(text, re) {
  return (text.match(re) || []).length;
}

function balanced(piece) {
  return (
    count(piece, /`/g) % 2 === 0 &&
    count(piece, /\*/g) % 2 === 0 &&
    count(piece, /~~/g) % 2 === 0 &&
    count(piece, /\$/g) % 2 === 0 &&
    count(piece, /\[/g) === count(piece, /\]/g) &&
    count(piece, /\(/g) === count(piece, /\)/g) &&
    !/\\$/.test(piece)
  );
}

/**
 * One open top-level paragraph: finished segments are rendered once, the last one at each frame.
 * The browser lays a paragraph's lines out again whenever it grows, so while it is open it is kept
 * in parts of about PART_CHARS characters (display: block, cut after a sentence when one comes soon):
 * only the last is laid out again. The closed paragraph is one <p> like any other.
 */
class OpenParagraph {
  constructor(tail, source, start) {
    this.start = start;
    this.done = start; // source[start:done] is rendered, before `live`
    this.checked = start; // lines before this were found plain
    this.partLength = 0;
    this.paragraph = document.createElement("p");
    this.paragraph.className = "open-paragraph";
    this.live = document.createElement("span");
    this.newPart();
    tail.replaceChildren(this.paragraph);
  }

  newPart() {
    const part = document.createElement("span");
    part.className = "open-part";
    part.append(this.live);
    this.paragraph.append(part);
    this.partLength = 0;
  }

  /** Still one plain paragraph? Reads only the lines that arrived since the last call. */
  stillPlain(source) {
    if (this.checked === this.start) {
      // Its first line, while too short to tell ("1" may become "1. item"): read again each time.
      const head = source.slice(this.start, this.start + 12).split("\n")[0];
      if (NOT_PLAIN_RE.test(head)) return false;
    }
    for (;;) {
      const end = source.indexOf("\n", this.checked);
      if (end === -1) return true;
      const next = source.slice(end + 1, end + 12);
      if (next && NOT_PLAIN_RE.test(next)) return false;
      if (next.length < 11 && !next.includes("\n")) return true; // too short to judge for good yet
      this.checked = end + 1;
    }
  }

  paint(source) {
    while (source.length - this.done > SEGMENT) {
      let end = segmentEnd(source, this.done);
      if (end === -1 && source.length - this.done > 8 * SEGMENT) {
        end = source.lastIndexOf(" ", source.length - 2) + 1; // markup left open that long: cut anyway
      }
      if (end <= this.done) break;
      const piece = source.slice(this.done, end);
      this.live.before(inline(piece));
      this.done = end;
      this.partLength += piece.length;
      if (this.partLength > 2 * PART_CHARS || (this.partLength > PART_CHARS && /[.!?:;] $/.test(piece))) {
        this.newPart();
      }
    }
    this.live.replaceChildren(inline(source.slice(this.done)));
  }
}

function inline(text) {
  return sanitize(inlineHtml(text));
}

/**
 * One open fenced code block: complete lines are highlighted and appended once, the last line is
 * text. Like an open paragraph, it is kept in parts (of PART_LINES lines) so that only the last is
 * laid out again as it grows.
 */
class OpenCode {
  constructor(tail, source, start, bodyStart, info) {
    this.start = start;
    this.done = bodyStart; // source[bodyStart:done] is in the code element
    this.language = languageOf(info);
    this.known = knownLanguage(this.language);
    const block = sanitize(emptyCodeBlockHtml(this.language, labels()));
    tail.replaceChildren(block);
    this.code = tail.querySelector("code");
    this.line = document.createTextNode("");
    this.newPart();
  }

  newPart() {
    const part = document.createElement("span");
    part.className = "open-part";
    part.append(this.line);
    this.code.append(part);
    this.partLines = 0;
  }

  paint(source) {
    const end = source.lastIndexOf("\n") + 1;
    if (end > this.done) {
      const lines = source.slice(this.done, end);
      this.line.before(sanitize(this.known ? highlightHtml(lines, this.language) : escapeHtml(lines)));
      this.done = end;
      this.partLines += count(lines, /\n/g);
      if (this.partLines >= PART_LINES) this.newPart();
    }
    this.line.data = source.slice(this.done);
  }
}

const GENERIC = "generic";

/**
 * Renders a growing markdown answer into `root`. Completed blocks are rendered once and kept; the
 * unfinished tail is redrawn at most once per animation frame, in time proportional to what
 * arrived when it is one paragraph or one code block, however long that grows.
 */
export class StreamRenderer {
  /** `sliceAbove`, `piece` and `group` (tests): see SLICE_ABOVE, render-slices.js PIECE and GROUP. */
  constructor(root, onPaint, { sliceAbove = SLICE_ABOVE, piece, group } = {}) {
    this.root = root;
    this.onPaint = onPaint || (() => {});
    this.sliceAbove = sliceAbove;
    this.piece = piece;
    this.group = group;
    this.source = "";
    this.frame = 0;
    this.timer = 0;
    this.painted = 0; // performance.now() of the last paint
    this.interval = PAINT_INTERVAL; // until the next paint, from how long the last frame took
    this.generation = 0; // reset() drops the slices under way for the text before
    this.rendering = Promise.resolve(); // the blocks rendered in slices, one after another
    this.slicing = 0; // how many of them are not in the page yet
    this.start(0);
  }

  start(committed) {
    this.committed = committed; // source[0:committed] is in the DOM as finished blocks
    this.scanner = new BlockScanner(committed);
    this.open = null; // an OpenParagraph or OpenCode drawing the tail, or null
    if (committed === 0) {
      this.generation += 1;
      this.slicing = 0;
      this.root.removeAttribute("aria-busy");
      this.tail = newTail();
      this.root.replaceChildren(this.tail);
    }
  }

  append(text) {
    this.source += text;
    this.schedule();
  }

  reset(text) {
    this.source = text;
    this.start(0);
    this.schedule();
  }

  /** Paint at the next frame, but not sooner than `interval` after the last paint. */
  schedule() {
    if (this.frame || this.timer) return;
    const wait = this.painted + this.interval - performance.now();
    if (wait <= 0) {
      this.frame = requestAnimationFrame(() => this.framePaint());
      return;
    }
    this.timer = setTimeout(() => {
      this.timer = 0;
      this.frame = requestAnimationFrame(() => this.framePaint());
    }, wait);
  }

  cancel() {
    if (this.frame) cancelAnimationFrame(this.frame);
    if (this.timer) clearTimeout(this.timer);
    this.frame = 0;
    this.timer = 0;
  }

  /** Paint now instead of at the next frame. */
  flush() {
    this.cancel();
    this.paint();
  }

  /** A paint at an animation frame, timed to the end of that frame. */
  framePaint() {
    this.paint();
    const painted = this.painted;
    // A task queued now runs once the browser has drawn this frame: the time until then is the frame's.
    nextTask().then(() => {
      const took = performance.now() - painted;
      this.interval = Math.min(LONGEST_INTERVAL, Math.max(PAINT_INTERVAL, took * FRAME_SHARE));
    });
  }

  paint() {
    this.frame = 0;
    this.painted = performance.now();
    const split = this.scanner.advance(this.source);
    if (split > this.committed) {
      const text = this.source.slice(this.committed, split);
      if (text.length > this.sliceAbove) {
        // The blocks stay as they streamed until their final render replaces them; what follows
        // waits, hidden (the streamed blocks may already show its first words).
        const shown = this.tail;
        this.tail = newTail();
        this.tail.hidden = true;
        shown.after(this.tail);
        this.renderLater(text, shown);
      } else {
        this.tail.before(renderMarkdown(text));
        this.tail.replaceChildren();
      }
      this.committed = split;
      this.open = null;
    }
    if (this.source.length - this.committed > this.sliceAbove / 2) warmUp();
    if (this.open && !this.stillOpen()) this.open = GENERIC;
    if (!this.open) this.open = this.openTail();
    if (this.open && this.open !== GENERIC) {
      this.open.paint(this.source);
    } else {
      const rest = this.source.slice(this.committed);
      const highlight = rest.length < TAIL_HIGHLIGHT_LIMIT;
      this.tail.replaceChildren(rest ? renderMarkdown(rest, { highlight, finished: false }) : "");
    }
    this.onPaint();
  }

  stillOpen() {
    if (this.open === GENERIC) return true;
    if (this.open instanceof OpenCode) return this.scanner.fence !== null;
    return this.open.stillPlain(this.source);
  }

  /**
   * How to draw the tail: an OpenParagraph or OpenCode, piece by piece; GENERIC, whole at each frame,
   * once its first line shows it is another kind of block; null while that cannot be told yet.
   */
  openTail() {
    let start = this.committed;
    while (this.source[start] === "\n") start += 1;
    const firstEnd = this.source.indexOf("\n", start);
    const head = this.source.slice(start, firstEnd === -1 ? start + 12 : Math.min(firstEnd, start + 12));
    const known = firstEnd !== -1 || head.length >= 12;
    if (!head) return null;
    const fence = firstEnd !== -1 && this.scanner.fence ? this.source.slice(start, firstEnd).match(FENCE_RE) : null;
    if (fence && fence[1] === this.scanner.fence && this.scanner.fenceStartsBlock) {
      return new OpenCode(this.tail, this.source, start, firstEnd + 1, fence[2].trim());
    }
    if (NOT_PLAIN_RE.test(head) || REFERENCE_RE.test(head)) return known ? GENERIC : null;
    const paragraph = new OpenParagraph(this.tail, this.source, start);
    return paragraph.stillPlain(this.source) ? paragraph : GENERIC;
  }

  /**
   * `text`'s finished blocks, rendered in slices (render-slices.js), replace `shown` (the tail they
   * streamed in; with `whole`, everything in the answer). The answer is aria-busy until all are in.
   */
  renderLater(text, shown, { whole = false } = {}) {
    shown.classList.add("md-pending");
    const generation = this.generation;
    const cancelled = () => generation !== this.generation;
    this.slicing += 1;
    this.root.setAttribute("aria-busy", "true");
    const options = { labels: labels(), piece: this.piece, cancelled };
    this.rendering = this.rendering
      .then(() => (cancelled() ? null : renderInSlices(text, options)))
      .catch((error) => {
        console.error(error);
        return renderMarkdown(text);
      })
      .then(async (fragment) => {
        if (!fragment || cancelled()) return;
        drawDiagrams(fragment);
        if (whole) for (const node of [...this.root.childNodes]) if (node !== shown) node.remove();
        await putInPlace(fragment, shown, { cancelled, group: this.group });
      })
      .catch((error) => console.error(error))
      .finally(() => {
        if (cancelled()) return; // reset: nothing of this is in the page any more
        this.slicing -= 1;
        if (!this.slicing) {
          this.root.removeAttribute("aria-busy");
          this.tail.hidden = false;
        }
        this.onPaint();
      });
  }

  /**
   * The stream ended: the tail becomes a block like the others (highlighted, however long). Returns
   * a promise of when the answer is final (at once unless blocks are still rendered in slices).
   */
  finish() {
    this.cancel();
    this.open = null;
    if (REFERENCE_RE.test(this.source)) {
      // As a reload will show it: rendered whole.
      if (this.source.length > this.sliceAbove) {
        this.generation += 1; // the blocks under way are in it
        this.slicing = 0;
        this.renderLater(this.source, this.tail, { whole: true });
      } else {
        this.root.replaceChildren(renderMarkdown(this.source));
      }
    } else {
      const text = this.source.slice(this.committed);
      if (text.length > this.sliceAbove) this.renderLater(text, this.tail);
      else this.tail.replaceWith(renderMarkdown(text));
    }
    this.onPaint();
    return this.rendering;
  }
}

function newTail() {
  const tail = document.createElement("div");
  tail.className = "md-tail";
  return tail;
}

// File name extensions for downloaded code, by the language named on the fence.
const EXTENSIONS = {
  python: "py", py: "py", javascript: "js", js: "js", typescript: "ts", ts: "ts", tsx: "tsx", jsx: "jsx",
  json: "json", html: "html", xml: "xml", css: "css", scss: "scss", markdown: "md", md: "md", bash: "sh",
  sh: "sh", shell: "sh", zsh: "sh", console: "txt", sql: "sql", yaml: "yaml", yml: "yml", toml: "toml",
  ini: "ini", go: "go", rust: "rs", rs: "rs", java: "java", kotlin: "kt", c: "c", cpp: "cpp", "c++": "cpp",
  csharp: "cs", cs: "cs", ruby: "rb", rb: "rb", php: "php", swift: "swift", lua: "lua", r: "r", perl: "pl",
  haskell: "hs", scala: "scala", dockerfile: "Dockerfile", makefile: "Makefile", mermaid: "mmd", latex: "tex",
  tex: "tex", diff: "diff", text: "txt", plaintext: "txt",
};

/** The file name a code block downloads as: "code.py" for python, "code.txt" when unknown. */
export function downloadName(language) {
  const key = (language || "").toLowerCase();
  const extension = EXTENSIONS[key] || (/^[a-z0-9]{1,8}$/.test(key) ? key : "txt");
  return /^[A-Z]/.test(extension) ? extension : `code.${extension}`;
}

function flash(button, text, label) {
  button.textContent = text;
  setTimeout(() => (button.textContent = label), 1500);
}

/** The buttons of code blocks (copy, wrap, download), by delegation from a container. */
export function handleCopyClicks(container) {
  container.addEventListener("click", async (event) => {
    const button = event.target.closest(".copy-code, .wrap-code, .download-code");
    const block = button?.closest(".code-block");
    const code = block?.querySelector("code");
    if (!code) return;
    if (button.classList.contains("wrap-code")) {
      const wrapped = block.classList.toggle("wrapped");
      button.setAttribute("aria-pressed", String(wrapped));
    } else if (button.classList.contains("download-code")) {
      const url = URL.createObjectURL(new Blob([code.textContent], { type: "text/plain;charset=utf-8" }));
      const link = document.createElement("a");
      link.href = url;
      link.download = downloadName(block.dataset.lang);
      link.hidden = true;
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
    } else {
      try {
        await navigator.clipboard.writeText(code.textContent);
        flash(button, t("Copied"), t("Copy"));
      } catch {
        flash(button, t("Copy failed"), t("Copy"));
      }
    }
  });
}

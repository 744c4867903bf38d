// A long block's final render without a long task, whatever its size: its markdown is parsed and its
// code highlighted in a worker (markdown-worker.js, the page's own code), then the HTML is sanitized
// and built into DOM in pieces, and its math drawn one formula at a time, yielding to the page every
// SLICE_MS. The result is the very DOM a whole render (render.js renderMarkdown) gives.
import { PART_CLASS, TAG, opensElement, toHtml } from "./markdown.js";
import { MATH_PENDING, typesetNode } from "./math.js";
import { sanitize } from "./sanitize.js";

const SLICE_MS = 8; // work at most about this long before the page may paint or handle input
export const PIECE = 8000; // characters of HTML sanitized at once (about a millisecond's work)
// Blocks of about this many characters of text are put in the page in one frame at first, then
// more (never fewer) while a frame takes under FRAME_MS. A long block comes in parts (markdown.js):
// laid out at once, 80 kB of one took about 50 ms on a quiet 2-core machine, over 100 on a busy one.
const GROUP = 16000;
const FRAME_MS = 40;

/** The HTML cannot be cut as expected (a parser fix-up): it is rendered whole instead. */
class Uncuttable extends Error {}

/** Resolves in a new task, after the page has had the chance to paint and handle input. */
export function nextTask() {
  if (globalThis.scheduler?.yield) return globalThis.scheduler.yield();
  return new Promise((resolve) => {
    const channel = new MessageChannel();
    channel.port1.onmessage = () => resolve();
    channel.port2.postMessage(null);
  });
}

// --- the worker --------------------------------------------------------------------------------

let worker = null; // a Worker, or false where none can run: the main thread renders then
let counter = 0;
const requests = new Map(); // id -> { resolve, reject }
const WORKER_WAIT_MS = 30_000; // then the page renders the block itself

function markdownWorker() {
  if (worker === null) {
    try {
      worker = new Worker(new URL("./markdown-worker.js", import.meta.url), { type: "module" });
      worker.addEventListener("message", ({ data }) => {
        const request = requests.get(data.id);
        requests.delete(data.id);
        if (typeof data.html === "string") request?.resolve(data.html);
        else request?.reject(new Error(data.error));
      });
      worker.addEventListener("error", (event) => {
        event.preventDefault();
        worker = false; // it did not start: the page renders from now on
        for (const request of requests.values()) request.reject(new Error("the markdown worker failed"));
        requests.clear();
      });
    } catch {
      worker = false;
    }
  }
  return worker;
}

/** Start the worker ahead of a long block's end, so that its modules are loaded by then. */
export function warmUp() {
  markdownWorker();
}

/** The HTML of `source`, rendered by the worker (by the page if there is none). */
async function htmlOf(source, options) {
  const target = markdownWorker();
  if (target) {
    const id = ++counter;
    try {
      return await new Promise((resolve, reject) => {
        requests.set(id, { resolve, reject });
        target.postMessage({ id, source, options });
        setTimeout(() => {
          requests.delete(id);
          reject(new Error("the markdown worker did not answer"));
        }, WORKER_WAIT_MS);
      });
    } catch {
      // fall through: rendered here
    }
  }
  return toHtml(source, options);
}

// --- sanitizing in pieces ----------------------------------------------------------------------

/**
 * Sanitizes well-formed HTML into one fragment, a piece at a time. Each piece is cut where a tag
 * starts (or, in a long run of text, outside an entity) and sanitized after the tags still open
 * there, written again; its nodes then join those already built, inside the elements they belong
 * to, a text node continuing the one before. Where the browser's parser would have moved things
 * (a block in a paragraph), the built tree no longer matches the open tags: Uncuttable.
 */
class PiecewiseSanitizer {
  constructor(html, piece = PIECE) {
    this.html = html;
    this.piece = piece;
    this.pos = 0;
    this.open = []; // the tags open at `pos`: { name, tag }
    this.fragment = document.createDocumentFragment();
    this.targets = [this.fragment]; // the built element of each open tag, after the fragment
  }

  get done() {
    return this.pos >= this.html.length;
  }

  /** Where the piece from `pos` ends: at a tag's "<", else (text only) not inside an entity. */
  cut() {
    const { html } = this;
    const from = this.pos + this.piece;
    if (from >= html.length) return html.length;
    const tag = html.substring(from, from + this.piece).indexOf("<"); // not past the next piece
    if (tag !== -1) return from + tag;
    let end = from;
    if (html.lastIndexOf("<", end - 1) > html.lastIndexOf(">", end - 1)) {
      return html.indexOf(">", end) + 1 || html.length; // inside a long tag: after it
    }
    const amp = html.lastIndexOf("&", end - 1);
    if (amp !== -1 && end - amp < 12) {
      const semicolon = html.indexOf(";", amp);
      if (semicolon !== -1 && semicolon >= end) end = semicolon + 1;
    }
    return end;
  }

  step() {
    const { html } = this;
    const end = this.cut();
    const reopened = this.open.slice();
    TAG.lastIndex = this.pos;
    for (let match = TAG.exec(html); match && match.index < end; match = TAG.exec(html)) {
      const name = match[2].toLowerCase();
      if (match[1]) {
        if (this.open.at(-1)?.name !== name) throw new Uncuttable(`</${name}>`);
        this.open.pop();
      } else if (opensElement(match[0], name)) {
        this.open.push({ name, tag: match[0] });
      }
    }
    const piece = html.slice(this.pos, end);
    const top = reopened.at(-1)?.name;
    if ((top === "pre" || top === "textarea") && piece.startsWith("\n")) throw new Uncuttable("newline");
    this.merge(sanitize(reopened.map((entry) => entry.tag).join("") + piece), reopened.length);
    this.pos = end;
    this.retarget();
  }

  /** Puts the nodes of a sanitized piece, whose first `depth` levels are tags written again, in place. */
  merge(piece, depth) {
    const levels = [piece];
    for (let level = 0; level < depth; level += 1) {
      const again = levels[level].firstChild;
      if (again?.nodeType !== Node.ELEMENT_NODE || again.localName !== this.targets[level + 1].localName) {
        throw new Uncuttable("reopened");
      }
      levels.push(again);
    }
    // The innermost level's nodes go into the innermost open element; each outer level's, after it.
    for (let level = depth; level >= 0; level -= 1) {
      const parent = levels[level];
      if (level < depth) parent.firstChild.remove(); // the tag written again, emptied just before
      appendJoined(this.targets[level], parent);
    }
  }

  /** The elements of the tags open now: the last child, level by level. */
  retarget() {
    const targets = [this.fragment];
    for (const entry of this.open) {
      const last = targets.at(-1).lastChild;
      if (last?.nodeType !== Node.ELEMENT_NODE || last.localName !== entry.name) throw new Uncuttable(entry.name);
      targets.push(last);
    }
    this.targets = targets;
  }
}

/** Moves `parent`'s children to the end of `target`; a first text node continues a last one. */
function appendJoined(target, parent) {
  const first = parent.firstChild;
  if (first?.nodeType === Node.TEXT_NODE && target.lastChild?.nodeType === Node.TEXT_NODE) {
    target.lastChild.appendData(first.data);
    first.remove();
  }
  target.append(...parent.childNodes);
}

/**
 * The sanitized fragment of a finished `source`, its math drawn (diagrams are drawn when it is put in
 * the page), built without a long task. `cancelled()` is asked between tasks: then it resolves to null.
 * `piece` (tests) is the size of the pieces of HTML sanitized at once.
 */
export async function renderInSlices(source, { labels, piece = PIECE, cancelled = () => false } = {}) {
  const html = await htmlOf(source, { highlight: true, labels });
  let started = performance.now();
  const pause = async () => {
    if (performance.now() - started < SLICE_MS) return false;
    await nextTask();
    started = performance.now();
    return cancelled();
  };
  if (cancelled()) return null;
  let fragment;
  try {
    const sanitizer = new PiecewiseSanitizer(html, piece);
    while (!sanitizer.done) {
      if (await pause()) return null;
      sanitizer.step();
    }
    fragment = sanitizer.fragment;
  } catch (error) {
    if (!(error instanceof Uncuttable)) throw error;
    fragment = sanitize(html); // in one go, as a whole render does
  }
  for (const node of fragment.querySelectorAll(MATH_PENDING)) {
    if (await pause()) return null;
    typesetNode(node);
  }
  return fragment;
}

/** After the page has painted: the next frame's layout is the work put in the page before it. */
function nextFrame() {
  return new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve)));
}

/**
 * Puts a rendered fragment in the page in place of `shown`, its blocks (and a long block's parts) in
 * groups of about `group` characters to start with, one group a frame, so that the browser lays out
 * one group at a time.
 */
export async function putInPlace(fragment, shown, { cancelled = () => false, group: least = GROUP } = {}) {
  let most = least;
  let group = document.createDocumentFragment();
  let size = 0;
  let first = true;
  for (const [holder, node] of piecesOf(fragment)) {
    const length = node.textContent.length;
    if (size && size + length > most) {
      if (first) shown.replaceChildren(); // the streamed blocks go as the final ones come
      first = false;
      const start = performance.now();
      shown.before(group);
      await nextFrame();
      if (cancelled()) return;
      const took = performance.now() - start; // the frame, with the layout of this group
      // Never fewer than `least`: on a busy machine every frame is slow, whatever it holds.
      most = Math.max(least, Math.min(most * 4, (most * FRAME_MS) / Math.max(took, 1)));
      group = document.createDocumentFragment();
      size = 0;
    }
    (holder || group).append(node); // a part joins its block, in the group or already in the page
    size += length;
  }
  shown.replaceWith(group);
}

// The parts of a long paragraph, or of a long code block's code.
const IN_PARTS = `:scope > .${PART_CLASS}, :scope > pre > code > .${PART_CLASS}`;

/** A fragment's blocks as [null, block]; a block in parts (markdown.js) empty, then [its holder, part] for each. */
function* piecesOf(fragment) {
  for (const node of [...fragment.childNodes]) {
    const part = node.nodeType === Node.ELEMENT_NODE && node.querySelector(IN_PARTS);
    const holder = part ? part.parentNode : null;
    const parts = holder ? [...holder.childNodes] : [];
    holder?.replaceChildren();
    yield [null, node];
    for (const each of parts) yield [holder, each];
  }
}

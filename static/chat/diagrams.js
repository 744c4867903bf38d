// Mermaid diagrams. Mermaid lays a diagram out with inline styles, which this page's policy refuses,
// so it runs in a sandboxed frame (/diagram-frame/, made only when a finished ```mermaid block first
// appears) that posts back the SVG, sanitized there by DOMPurify. The page never puts that SVG in its
// own DOM: it shows it as an <img>, which can run no script and load nothing, whatever it contains.
import { t } from "./i18n.js";

const FRAME_URL = "/diagram-frame/";
const TIMEOUT_MS = 20_000;

let frameReady = null;
let counter = 0;
const pending = new Map(); // request id -> { resolve, reject }

function withTimeout(promise, message) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(message)), TIMEOUT_MS);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

function frame() {
  frameReady ||= withTimeout(
    new Promise((resolve) => {
      const iframe = document.createElement("iframe");
      iframe.className = "diagram-frame";
      iframe.title = t("Diagram renderer");
      iframe.tabIndex = -1;
      iframe.setAttribute("aria-hidden", "true");
      iframe.sandbox = "allow-scripts"; // no allow-same-origin: nothing of this site is reachable from it
      iframe.src = FRAME_URL;
      window.addEventListener("message", (event) => {
        if (event.source !== iframe.contentWindow) return;
        const data = event.data || {};
        if (data.ready) return resolve(iframe);
        const waiting = pending.get(data.id);
        if (!waiting) return undefined;
        pending.delete(data.id);
        if (typeof data.svg === "string") waiting.resolve(data.svg);
        else waiting.reject(new Error(String(data.error || "the diagram could not be drawn")));
        return undefined;
      });
      document.body.append(iframe);
    }),
    "the diagram renderer did not start",
  );
  return frameReady;
}

async function renderSvg(source) {
  const iframe = await frame();
  const id = ++counter;
  // The theme chosen in the settings (theme.js), else the system's.
  const dark = Boolean(window.chatTheme?.dark() ?? window.matchMedia?.("(prefers-color-scheme: dark)").matches);
  const answer = new Promise((resolve, reject) => pending.set(id, { resolve, reject }));
  iframe.contentWindow.postMessage({ id, source, dark }, "*"); // a sandboxed frame's origin is opaque
  return withTimeout(answer, "drawing it took too long").finally(() => pending.delete(id));
}

function toDataUrl(svg) {
  const bytes = new TextEncoder().encode(svg);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return `data:image/svg+xml;base64,${btoa(binary)}`;
}

async function draw(block) {
  const source = block.querySelector("code")?.textContent || "";
  block.dataset.diagram = "drawing";
  try {
    const svg = (await renderSvg(source)).trim();
    if (!/^<svg[\s>]/.test(svg)) throw new Error("the diagram could not be drawn");
    const figure = document.createElement("figure");
    figure.className = "diagram";
    const image = document.createElement("img");
    image.alt = t("Diagram: %(first_line)s", { first_line: source.trim().split("\n")[0] });
    image.src = toDataUrl(svg);
    figure.append(image);
    // The source stays one click away, with its copy and download buttons.
    const fold = document.createElement("details");
    fold.className = "diagram-source";
    const summary = document.createElement("summary");
    summary.textContent = t("Diagram source");
    block.replaceWith(figure, fold);
    fold.append(summary, block);
    block.dataset.diagram = "drawn";
  } catch (error) {
    // The source stays as it is, with why it could not be drawn.
    // The parser's first line says where ("Parse error on line 2:"), the rest what it found and
    // expected: both shown, as text, under the source.
    const [headline, ...details] = String(error?.message || error).slice(0, 2000).split("\n");
    const note = document.createElement("div");
    note.className = "diagram-error";
    note.setAttribute("role", "note");
    const line = document.createElement("p");
    line.textContent = t("Could not draw this diagram: %(error)s", { error: headline });
    note.append(line);
    if (details.some((text) => text.trim())) {
      const detail = document.createElement("pre");
      detail.className = "diagram-error-detail";
      detail.textContent = details.join("\n").trimEnd();
      note.append(detail);
    }
    block.after(note);
    block.dataset.diagram = "failed";
  }
}

/** Draw the finished mermaid code blocks under `root`, each once, in the background. */
export function drawDiagrams(root) {
  for (const block of root.querySelectorAll('.code-block[data-lang="mermaid"]:not([data-diagram])')) {
    block.dataset.diagram = "queued";
    queueMicrotask(() => draw(block)); // once the fragment is in the page
  }
}

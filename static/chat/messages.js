// One message on the page: a user's text, or an assistant's answer with its thinking, status and usage.
import { attachmentList } from "./attachments.js";
import { duration, money, number } from "./formats.js";
import { t } from "./i18n.js";
import { iconButton } from "./icons.js";
import { StreamRenderer, renderMarkdown } from "./render.js";
import { ToolCallsView } from "./tools.js";

const NUMBER = new Intl.NumberFormat(globalThis.document?.documentElement.lang || "en-US");
// Seconds without a first token before the page says it is still waiting for the model.
const WAITING_AFTER = 10;
// Seconds without data on a stream that had started before the page says it is waiting: a silent
// stall (an upstream that stopped sending, a connection gone without a word) is never just a dot.
const STALL_AFTER = 4;
// The ends of an answer that a labelled Retry follows.
const RETRYABLE = new Set(["failed", "interrupted"]);

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

export function formatCost(cost) {
  if (cost === null || cost === undefined) return null;
  const value = Number(cost);
  if (value === 0) return money(0, 0);
  const decimals = value >= 0.01 ? 4 : Math.min(10, Math.ceil(-Math.log10(value)) + 1);
  return money(value, 0, decimals); // trailing zeros dropped, in the page's language
}

const formatMs = duration;

/** The parts of the usage line: tokens, cost, time to first token, speed. */
export function usageParts(usage) {
  const approx = usage.estimated ? "≈" : "";
  const parts = [[t("%(count)s in", { count: approx + NUMBER.format(usage.prompt_tokens) }), t("prompt tokens")]];
  let out = t("%(count)s out", { count: approx + NUMBER.format(usage.completion_tokens) });
  if (usage.reasoning_tokens) out += ` ${t("(%(count)s reasoning)", { count: NUMBER.format(usage.reasoning_tokens) })}`;
  parts.push([out, t("completion tokens")]);
  const cost = formatCost(usage.cost);
  if (cost) parts.push([cost, t("cost reported by the upstream")]);
  if (usage.ttft_ms !== null && usage.ttft_ms !== undefined) {
    parts.push([t("TTFT %(time)s", { time: formatMs(usage.ttft_ms) }), t("time to first token")]);
  }
  if (usage.tokens_per_second) {
    parts.push([t("%(rate)s tok/s", { rate: number(usage.tokens_per_second, 1) }), t("tokens per second")]);
  }
  if (usage.estimated) parts.push([t("estimated"), t("the upstream sent no usage; counts are estimates")]);
  return parts;
}

export function statusText(status, finishReason) {
  if (status === "stopped") return t("Stopped");
  if (status === "interrupted") return t("Interrupted: the answer ended early");
  if (status === "failed") return t("Failed");
  if (finishReason === "length") return t("Cut at the max tokens limit");
  return "";
}

export class MessageView {
  /** `message` has the API's shape (id, role, content, reasoning, status, ...). */
  constructor(message, { onPaint } = {}) {
    this.id = message.id;
    this.role = message.role;
    this.seq = 0; // the last delta applied
    this.awaitingSnapshot = false; // after attach: deltas wait for the snapshot
    this.article = element("article", `message ${message.role}`);
    const answer = message.model ? t("Answer from %(model)s", { model: message.model }) : t("Answer");
    this.article.setAttribute("aria-label", message.role === "user" ? t("You said") : answer);
    this.onPaint = onPaint || (() => {});
    if (message.role === "user") this.buildUser(message);
    else this.buildAssistant(message);
    this.setId(message.id);
    this.setStatus(message.status || "complete");
  }

  setId(id) {
    this.id = id;
    if (this.toolCalls) this.toolCalls.message = id;
    if (id === null || id === undefined) this.article.removeAttribute("data-message-id");
    else this.article.dataset.messageId = id;
  }

  setStatus(status) {
    this.status = status;
    this.article.dataset.status = status;
    // Kept once it ends (everyday.css): the finished answer keeps the block sizes laid out as it streamed.
    if (status === "streaming") this.article.classList.add("streamed");
  }

  buildUser(message) {
    this.text = element("div", "user-text", message.content);
    this.text.hidden = !message.content; // a message of attachments alone
    this.actions = element("div", "message-actions");
    this.actions.append(iconButton("edit", t("Edit")));
    if (message.attachments?.length) this.article.append(attachmentList(message.attachments));
    this.article.append(this.text, this.actions);
  }

  setUserText(content) {
    this.text.textContent = content;
    this.text.hidden = !content;
  }

  buildAssistant(message) {
    this.meta = element("div", "message-meta", message.model || "");
    this.thinking = element("details", "thinking");
    this.thinkingSummary = element("summary", "", t("Thinking…"));
    this.thinkingBody = element("div", "thinking-body");
    this.thinking.append(this.thinkingSummary, this.thinkingBody);
    this.thinking.hidden = true;
    this.answer = element("div", "answer");
    this.waiting = element("p", "message-waiting");
    this.waiting.hidden = true;
    this.waiting.setAttribute("role", "status");
    this.waitingText = element("span");
    this.waitingCount = element("span");
    this.waitingCount.setAttribute("aria-hidden", "true");
    this.waiting.append(this.waitingText, this.waitingCount);
    this.statusLine = element("p", "message-status");
    this.statusLine.hidden = true;
    this.error = element("p", "message-error");
    this.error.hidden = true;
    this.usage = element("div", "usage");
    this.usage.hidden = true;
    this.tools = element("div", "tool-calls");
    this.tools.hidden = true;
    // The MCP tool calls the server ran for this answer, round by round (tools.js).
    this.toolCalls = new ToolCallsView(message.id);
    this.toolCalls.setRounds(message.tool_rounds);
    this.actions = element("div", "message-actions");
    this.actions.append(iconButton("copy", t("Copy answer")), iconButton("regenerate", t("Regenerate")));
    // A failed or interrupted answer says how to get another, in words, whichever answer of the chat it is.
    this.retry = element("button", "retry-button", t("Retry"));
    this.retry.type = "button";
    this.retry.dataset.action = "retry";
    this.retry.title = t("Ask for this answer again");
    this.retry.hidden = true;
    this.actions.append(this.retry);
    this.article.append(
      this.meta, this.thinking, this.toolCalls.root, this.answer, this.tools, this.waiting, this.statusLine, this.error, this.usage,
      this.actions,
    );
    this.content = message.content || "";
    this.reasoning = message.reasoning || "";
    this.thinkingMs = message.thinking_ms ?? null; // measured here while it streams, else the server's
    if (message.status === "streaming") {
      this.startStreaming();
      this.setReasoning(this.reasoning);
      this.renderer.reset(this.content);
      this.answerStarted = Boolean(this.content);
      if (this.answerStarted) this.closeThinking();
      this.watchStall();
    } else {
      this.showFinished(message);
    }
  }

  startStreaming() {
    this.renderer = new StreamRenderer(this.answer, this.onPaint);
    this.answerStarted = false;
  }

  /** While it streams, a line says what is going on when nothing comes: before the first token, after
   * WAITING_AFTER seconds, "Waiting for the model… 12 s", counting; after it, STALL_AFTER seconds
   * without data; with the connection down, that it is lost and coming back. */
  watchStall() {
    this.lastDataAt = Date.now();
    clearInterval(this.waitingTimer);
    this.waitingTimer = setInterval(() => this.showStall(), 1000);
  }

  showStall() {
    if (!this.article.isConnected || this.status !== "streaming") return this.stopWaiting(); // left, or ended
    // A call that waits for the person or runs says so itself; the model's silence counts from its end.
    if (this.toolCalls.busy()) this.lastDataAt = Date.now();
    const seconds = Math.floor((Date.now() - this.lastDataAt) / 1000);
    const started = Boolean(this.content || this.reasoning);
    const down = document.documentElement.dataset.socket === "down" || navigator.onLine === false;
    // The line is a live region: its words are said once; the seconds counting beside them are not
    // (aria-hidden), or a screen reader would read the line again every second.
    let text = "";
    let count = "";
    if (down) text = t("Connection lost; reconnecting…");
    else if (!started && seconds >= WAITING_AFTER) {
      text = t("Waiting for the model…");
      count = t("%(seconds)s s", { seconds });
    } else if (started && seconds >= STALL_AFTER) {
      text = t("Waiting for the model…");
      count = t("nothing for %(seconds)s s", { seconds });
    }
    if (this.waitingText.textContent !== text) this.waitingText.textContent = text;
    this.waitingCount.textContent = count ? ` ${count}` : "";
    this.waiting.hidden = !text;
    return undefined;
  }

  /** Data came: the waiting line goes until the next silence. */
  gotData() {
    this.lastDataAt = Date.now();
    if (!this.waiting.hidden) this.waiting.hidden = true;
  }

  stopWaiting() {
    clearInterval(this.waitingTimer);
    this.waitingTimer = null;
    if (this.waiting) this.waiting.hidden = true;
  }

  setReasoning(text) {
    this.reasoning = text;
    this.thinkingBody.textContent = text;
    this.thinking.hidden = !text;
    if (text && !this.answerStarted) this.thinking.open = true;
  }

  appendReasoning(text) {
    this.gotData();
    if (!this.reasoning && !this.answerStarted) this.thinkingSince = performance.now();
    this.reasoning += text;
    // Follow the thinking as it grows, like the answer, unless the reader scrolled up in it.
    const body = this.thinkingBody;
    const following = body.scrollHeight - body.scrollTop - body.clientHeight < 24;
    body.append(text); // a text node: O(1) however long the thinking grows
    if (following) body.scrollTop = body.scrollHeight;
    if (this.thinking.hidden) {
      this.thinking.hidden = false;
      if (!this.answerStarted) this.thinking.open = true;
    }
    this.onPaint();
  }

  appendContent(text) {
    this.gotData();
    this.content += text;
    if (!this.answerStarted && text.trim()) {
      this.answerStarted = true;
      this.closeThinking();
    }
    this.renderer.append(text);
  }

  /** The answer starts: the thinking folds away, showing how long it was. */
  closeThinking() {
    if (this.thinkingSince !== undefined && this.thinkingMs === null) {
      this.thinkingMs = performance.now() - this.thinkingSince;
    }
    this.thinking.open = false;
    this.thinkingSummary.textContent = this.thoughtFor();
  }

  /** "Thought for 12 s": the time the model spent thinking, when known (not for a stream joined midway). */
  thoughtFor() {
    if (this.thinkingMs === null) return t("Thoughts");
    const seconds = Math.round(this.thinkingMs / 1000);
    if (seconds < 1) return t("Thought for less than a second");
    if (seconds < 60) return t("Thought for %(seconds)s s", { seconds });
    return t("Thought for %(minutes)s min %(seconds)s s", { minutes: Math.floor(seconds / 60), seconds: seconds % 60 });
  }

  /** A snapshot after attach: the text so far, replacing what the page had. */
  applySnapshot(frame) {
    this.awaitingSnapshot = false;
    this.seq = frame.seq ?? Number.MAX_SAFE_INTEGER;
    if (!this.renderer) this.startStreaming();
    this.content = frame.content || "";
    this.answerStarted = Boolean(this.content.trim());
    this.setReasoning(frame.reasoning || "");
    if (this.answerStarted) this.closeThinking();
    this.renderer.reset(this.content);
    if (frame.tool_rounds) this.toolCalls.setRounds(frame.tool_rounds);
    this.gotData();
  }

  /** `tool_arguments` and `tool_call` frames: the calls as they are asked for, approved, run and answered. */
  applyTool(frame) {
    this.gotData();
    if (frame.type === "tool_arguments") this.toolCalls.arguments(frame);
    else this.toolCalls.update(frame);
    this.onPaint();
  }

  /** A long snapshot comes as `snapshot` (more: true) then `snapshot_part` frames: append each. */
  applySnapshotPart(frame) {
    if (frame.reasoning) this.appendReasoning(frame.reasoning);
    if (frame.content) this.appendContent(frame.content);
  }

  applyDelta(frame) {
    if (this.awaitingSnapshot || frame.seq <= this.seq) return;
    this.seq = frame.seq;
    if (frame.reasoning) this.appendReasoning(frame.reasoning);
    if (frame.content) this.appendContent(frame.content);
  }

  /** `done`: final render, status, error and usage. */
  finish(frame) {
    this.stopWaiting();
    this.toolCalls.dropUnasked();
    if (this.renderer) this.renderer.finish();
    this.renderer = null;
    this.showFinished({ ...frame, content: this.content, reasoning: this.reasoning, rendered: true });
  }

  showFinished(message) {
    if (!message.rendered) this.answer.replaceChildren(renderMarkdown(message.content || ""));
    if (message.thinking_ms !== undefined && message.thinking_ms !== null) this.thinkingMs = message.thinking_ms;
    this.showToolCalls(message.tool_calls || []);
    this.setReasoning(message.reasoning || "");
    if (this.reasoning) {
      this.thinking.open = false;
      this.thinkingSummary.textContent = this.thoughtFor();
    }
    this.setStatus(message.status);
    this.retry.hidden = !RETRYABLE.has(message.status);
    // Retry says in words what Regenerate would do; an answer with no text has nothing to copy.
    this.actions.querySelector('[data-action="regenerate"]').hidden = !this.retry.hidden;
    this.actions.querySelector('[data-action="copy"]').hidden = !(message.content || "").trim();
    const label = statusText(message.status, message.finish_reason);
    this.statusLine.textContent = label;
    this.statusLine.hidden = !label;
    this.showError(message.error || "");
    // A stream that never produced anything shows no guessed usage ("≈8 in ≈0 out"), nor the nothing a refused
    // request is metered with ("0 in 0 out").
    const usage = message.usage;
    const nothing =
      usage && !usage.completion_tokens && message.status !== "complete" && (usage.estimated || !usage.prompt_tokens);
    this.showUsage(nothing ? null : message.usage);
    this.onPaint();
  }

  /** What a screen reader hears of the ended answer: its error's sentence if it has one, else its text as drawn
   * (not the markdown source), cut at a word. */
  spoken(limit = 200) {
    const error = this.error.hidden ? "" : this.error.firstChild?.textContent || "";
    const flat = (error || this.answer.textContent).replace(/\s+/g, " ").trim();
    if (flat.length <= limit) return flat;
    const space = flat.lastIndexOf(" ", limit);
    return `${flat.slice(0, space > limit / 2 ? space : limit)}…`;
  }

  /** An error as one sentence; anything longer (an upstream's page, a long message) folded under "Details". */
  showError(text) {
    this.error.replaceChildren();
    this.error.hidden = !text;
    if (!text) return;
    const flat = text.replace(/\s+/g, " ").trim();
    const end = flat.search(/[.!?](\s|$)/);
    const sentence = end > 0 && end < 200 ? flat.slice(0, end + 1) : flat.slice(0, 160);
    this.error.append(sentence.length < flat.length && !sentence.endsWith(".") ? `${sentence}…` : sentence);
    if (sentence.length < flat.length) {
      const fold = element("details");
      fold.append(element("summary", "", t("Details")));
      fold.append(element("pre", "", text));
      this.error.append(fold);
    }
  }

  /** Each tool call the model asked for: its name, and its arguments folded away. */
  showToolCalls(calls) {
    this.tools.replaceChildren();
    this.tools.hidden = calls.length === 0;
    for (const call of calls) {
      const fold = element("details", "tool-call");
      const name = call.function?.name || t("tool");
      fold.append(element("summary", "", t("Tool call: %(name)s", { name })));
      let args = call.function?.arguments || "";
      try {
        args = JSON.stringify(JSON.parse(args), null, 2);
      } catch {
        // not JSON (or cut short): shown as it came
      }
      const pre = element("pre");
      pre.append(element("code", "", args || t("(no arguments)")));
      fold.append(pre);
      this.tools.append(fold);
    }
  }

  showUsage(usage) {
    this.usage.replaceChildren();
    this.usage.hidden = !usage;
    if (!usage) return;
    for (const [text, title] of usageParts(usage)) {
      const part = element("span", "", text);
      part.title = title;
      this.usage.append(part);
    }
  }

  /** Inline editor for a user message (the edit becomes a new version); resolves with the new text, or null. */
  edit() {
    return new Promise((resolve) => {
      const box = element("form", "edit-box");
      const area = element("textarea");
      area.value = this.text.textContent;
      area.setAttribute("aria-label", t("Edit message"));
      const buttons = element("div");
      const cancel = element("button", "button", t("Cancel"));
      cancel.type = "button";
      const save = element("button", "button primary", t("Save and send"));
      save.type = "submit";
      buttons.append(cancel, save);
      box.append(area, buttons);
      this.text.hidden = true;
      this.actions.hidden = true;
      this.article.prepend(box);
      const close = (value) => {
        const hadFocus = box.contains(document.activeElement);
        box.remove();
        this.text.hidden = !this.text.textContent;
        this.actions.hidden = false;
        // Cancelled: back on the Edit button it came from (a sent edit's focus goes to the message box).
        if (hadFocus && value === null) this.actions.querySelector('[data-action="edit"]')?.focus();
        resolve(value);
      };
      cancel.addEventListener("click", () => close(null));
      box.addEventListener("submit", (event) => {
        event.preventDefault();
        close(area.value.trim() ? area.value : null);
      });
      area.addEventListener("keydown", (event) => {
        if (event.key === "Escape") {
          event.stopPropagation(); // Escape cancels the edit, it does not stop a stream
          close(null);
        } else if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
          event.preventDefault();
          box.requestSubmit();
        }
      });
      area.focus();
      area.setSelectionRange(area.value.length, area.value.length);
    });
  }
}

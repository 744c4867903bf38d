// Tools in the chat: each MCP tool call shown live inside its answer, and the composer's tools menu.
// Results are untrusted: every piece of a call is put on the page as text, never as HTML.
import { api } from "./api.js";
import { t } from "./i18n.js";

// Characters of a result shown before "Show all".
const FOLDED = 2000;

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function pretty(args) {
  try {
    return JSON.stringify(JSON.parse(args), null, 2);
  } catch {
    return args; // still streaming, or not JSON: as it came
  }
}

const STATUS = {
  pending: () => t("Queued"),
  waiting: () => t("Waiting for your approval"),
  running: () => t("Running"),
  ok: () => t("Done"),
  error: () => t("Failed"),
  timeout: () => t("Timed out"),
  invalid: () => t("Invalid arguments"),
  denied: () => t("Denied"),
  forbidden: () => t("Not available"),
  limited: () => t("Over the rate limit"),
  cancelled: () => t("Cancelled"),
};
// A call in these states holds the turn up, and its own line says why.
const BUSY = new Set(["pending", "waiting", "running"]);

/** The tool calls of one answer, round by round; `message` is the answer's id. */
export class ToolCallsView {
  constructor(message) {
    this.message = message;
    this.root = element("div", "tool-rounds");
    this.root.dataset.testid = "tool-rounds";
    this.root.hidden = true;
    // "round/call id" -> {box, call}: an upstream may give every round's first call the same id (call_0).
    this.calls = new Map();
    this.timer = null;
  }

  /** Stored or snapshotted rounds: [{at, calls: [...]}]. */
  setRounds(rounds) {
    this.root.replaceChildren();
    this.calls.clear();
    for (const [index, round] of (rounds || []).entries()) {
      for (const call of round.calls || []) this.upsert(call, index);
    }
  }

  /** A `tool_arguments` frame: the calls' names and arguments as the model writes them. */
  arguments(frame) {
    for (const call of frame.calls || []) {
      const known = this.calls.get(`${frame.round}/${call.id}`);
      if (known && known.call.status !== "streaming") continue;
      this.upsert({ ...call, status: "streaming", server: "", tool: call.name }, frame.round);
    }
  }

  /** The answer ended: calls the model was still writing, never asked of a tool (past the round limit), go. */
  dropUnasked() {
    for (const [key, { box, call }] of this.calls) {
      if (call.status !== "streaming") continue;
      box.remove();
      this.calls.delete(key);
    }
    this.root.hidden = this.calls.size === 0;
  }

  /** A `tool_call` frame: one call's new state. */
  update(frame) {
    this.upsert(frame.call, frame.round);
  }

  upsert(call, round) {
    this.root.hidden = false;
    const key = `${round}/${call.id}`;
    let entry = this.calls.get(key);
    if (!entry) {
      const box = element("details", "tool-run");
      box.dataset.call = call.id;
      box.dataset.round = round;
      this.root.append(box);
      entry = { box, call };
      this.calls.set(key, entry);
    }
    entry.call = { ...entry.call, ...call };
    this.draw(entry);
    this.tick();
  }

  draw({ box, call }) {
    const open = box.open;
    box.replaceChildren();
    box.dataset.status = call.status;
    const summary = element("summary");
    const name = call.server ? `${call.tool} · ${call.server}` : call.name;
    summary.append(element("span", "tool-name", name), " ");
    const status = element("span", "tool-status", STATUS[call.status]?.() ?? (call.status === "streaming" ? t("Asking…") : call.status));
    summary.append(status);
    if (call.status === "running") summary.append(" ", element("span", "tool-elapsed", ""));
    else if (call.duration_ms) summary.append(" ", element("span", "tool-elapsed", `${(call.duration_ms / 1000).toFixed(1)} s`));
    box.append(summary);
    const args = element("pre", "tool-arguments");
    args.append(element("code", "", pretty(call.arguments || "") || t("(no arguments)")));
    box.append(args);
    if (call.status === "waiting") {
      box.open = true;
      const buttons = element("div", "tool-approval");
      for (const [label, approve] of [[t("Approve"), true], [t("Deny"), false]]) {
        const button = element("button", approve ? "button primary" : "button", label);
        button.type = "button";
        button.addEventListener("click", () => {
          for (const b of buttons.querySelectorAll("button")) b.disabled = true;
          box.dispatchEvent(new CustomEvent("tool-decision", {
            bubbles: true, detail: { message: this.message, call: call.id, approve },
          }));
        });
        buttons.append(button);
      }
      box.append(buttons);
      return;
    }
    if (call.error) box.append(element("p", "tool-error", call.error));
    if (call.status === "ok") {
      const result = element("pre", "tool-result");
      const text = call.result || "";
      const code = element("code", "", text.length > FOLDED ? `${text.slice(0, FOLDED)}…` : text);
      result.append(code);
      box.append(result);
      if (text.length > FOLDED) {
        const all = element("button", "button tool-show-all", t("Show all"));
        all.type = "button";
        all.addEventListener("click", () => {
          code.textContent = text;
          all.remove();
        });
        box.append(all);
      }
      if (call.truncated) {
        box.append(element("p", "tool-note", t("The result was cut to its first %(count)s characters.", { count: text.length })));
      }
    }
    box.open = open;
  }

  /** Whether a call waits for the person or runs: the turn waits on it, not on the model. */
  busy() {
    return [...this.calls.values()].some(({ call }) => BUSY.has(call.status));
  }

  /** The elapsed time of running calls, every second while any runs. */
  tick() {
    const running = [...this.calls.values()].filter(({ call }) => call.status === "running");
    for (const { box, call } of running) {
      const seconds = Math.max(0, (Date.now() - (call.started_ms || Date.now())) / 1000);
      const span = box.querySelector(".tool-elapsed");
      if (span) span.textContent = `${seconds.toFixed(0)} s`;
    }
    if (running.length && this.timer === null) {
      this.timer = setInterval(() => {
        if (!this.root.isConnected) {
          clearInterval(this.timer);
          this.timer = null;
          return;
        }
        this.tick();
      }, 1000);
    } else if (!running.length && this.timer !== null) {
      clearInterval(this.timer);
      this.timer = null;
    }
  }
}

/** The composer's tools menu: the servers and tools this person may use, on or off for the conversation. */
export class ToolsMenu {
  constructor(button, panel) {
    this.button = button;
    this.panel = panel;
    this.servers = [];
    this.chosen = null; // null: every tool
    this.changed = false;
    button.addEventListener("click", () => {
      panel.hidden = !panel.hidden;
      button.setAttribute("aria-expanded", String(!panel.hidden));
    });
  }

  /** Loads the menu for a conversation (null: a new chat). */
  async load(conversation) {
    let data;
    try {
      data = await api(conversation ? `/api/tools?conversation=${conversation}` : "/api/tools");
    } catch {
      return;
    }
    this.servers = data.servers;
    this.chosen = data.chosen;
    this.changed = false;
    this.button.hidden = !this.servers.some((server) => server.tools.length);
    this.draw();
  }

  /** Every tool's name, a down server's too: "all on" made explicit must not switch those off for good. */
  names() {
    return this.servers.flatMap((server) => server.tools.map((tool) => tool.name));
  }

  draw() {
    this.panel.replaceChildren();
    for (const server of this.servers) {
      const group = element("fieldset", "tools-server");
      const legend = element("legend", "", server.server);
      if (server.health === "down") legend.append(" ", element("span", "tools-down", t("(down)")));
      group.append(legend);
      for (const tool of server.tools) {
        const label = element("label", "tools-tool");
        const box = element("input");
        box.type = "checkbox";
        box.value = tool.name;
        box.checked = this.chosen === null || this.chosen.includes(tool.name);
        box.disabled = server.health === "down";
        box.addEventListener("change", () => {
          const on = new Set(this.chosen === null ? this.names() : this.chosen);
          if (box.checked) on.add(tool.name);
          else on.delete(tool.name);
          this.chosen = [...on];
          this.changed = true;
        });
        const name = element("span", "tools-name", tool.tool);
        if (tool.asks_first) name.append(" ", element("span", "tools-asks", t("asks first")));
        const text = element("span", "tools-text");
        text.append(name);
        // Shown, not only as a tooltip: a phone or a keyboard never hovers.
        if (tool.description) text.append(element("span", "tools-description", tool.description));
        label.append(box, text);
        group.append(label);
      }
      this.panel.append(group);
    }
  }

  /** What a `send` frame carries: the choice when the person changed it, else nothing (the conversation keeps its). */
  forSend() {
    return this.changed ? this.chosen : undefined;
  }
}

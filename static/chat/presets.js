// Prompt presets in the composer ("/" at the start opens them) and the person's defaults for a new chat.
import { api } from "./api.js";
import { t } from "./i18n.js";

// The settings panel's own fields; a preset's other params (top_p, stop, …) are sent as they are.
const PANEL_PARAMS = ["temperature", "max_tokens"];

/** The picker's option for a model id, plain (`gpt-5`) or qualified (`provider/gpt-5`); null if none. */
function optionFor(picker, model) {
  if (!model) return null;
  const values = [...picker.select.options].map((option) => option.value);
  return values.find((value) => value === model) ?? values.find((value) => value.endsWith(`/${model}`)) ?? null;
}

export class NewChatSetup {
  /** Where a new chat starts from: the person's defaults, then a preset chosen with "/". */
  constructor({ picker, settings }) {
    this.picker = picker;
    this.settings = settings;
    this.defaults = null; // {model, temperature, system_prompt} from /api/defaults
    this.extra = {}; // a chosen preset's params the panel has no field for
  }

  async load() {
    this.defaults = await api("/api/defaults");
  }

  /** A new chat's model: the person's default when set and offered, else null (the picker's own choice). */
  get model() {
    return optionFor(this.picker, this.defaults?.model);
  }

  /** Called once the panel is cleared for a new chat: it starts from the defaults. */
  fill() {
    this.extra = {};
    if (!this.defaults) return;
    const { temperature, system_prompt: systemPrompt } = this.defaults;
    if (this.model) this.picker.select.value = this.model;
    this.settings.temperature.value = temperature ?? "";
    this.settings.systemPrompt.value = systemPrompt || "";
    this.settings.check(this.settings.temperature);
  }

  /** A preset chosen in a new chat: its model, system prompt and params (those it sets) replace the panel's. */
  apply(preset, newChat) {
    const model = optionFor(this.picker, preset.model);
    if (model) this.picker.select.value = model;
    if (!newChat) return; // an open conversation keeps its own settings
    if (preset.system_prompt) this.settings.systemPrompt.value = preset.system_prompt;
    const params = preset.params || {};
    for (const name of PANEL_PARAMS) {
      if (params[name] === undefined) continue;
      const input = name === "temperature" ? this.settings.temperature : this.settings.maxTokens;
      input.value = params[name];
      this.settings.check(input);
    }
    this.extra = Object.fromEntries(Object.entries(params).filter(([name]) => !PANEL_PARAMS.includes(name)));
  }

  /** The first `send` of a new chat: the panel's values, a preset's other params, and the panel's
   * blanks said out loud, so that a default the person cleared for this chat is not applied by the server. */
  forNewChat(fromPanel) {
    const extra = { ...fromPanel };
    if (Object.keys(this.extra).length) extra.params = { ...this.extra, ...extra.params };
    if (this.defaults?.system_prompt && extra.system_prompt === undefined) extra.system_prompt = "";
    if (this.defaults?.temperature != null && extra.params?.temperature === undefined) {
      extra.params = { ...extra.params, temperature: null };
    }
    return extra;
  }
}

let menus = 0;

export class PresetMenu {
  /** A list under "/" at the start of the message box; onChoose(preset) once its text is inserted. */
  constructor({ input, composer, onChoose, onError }) {
    this.input = input;
    this.onChoose = onChoose;
    this.onError = onError;
    this.presets = null; // loaded when "/" is first typed, again after each choice (they may have changed)
    this.loading = null;
    this.shown = [];
    this.active = 0;
    this.list = document.createElement("ul");
    this.list.id = `preset-menu-${++menus}`;
    this.list.className = "preset-menu";
    this.list.setAttribute("role", "listbox");
    this.list.setAttribute("aria-label", t("Prompt presets"));
    this.list.dataset.testid = "preset-menu";
    this.list.hidden = true;
    composer.prepend(this.list);
    input.setAttribute("aria-controls", this.list.id);
    input.setAttribute("aria-autocomplete", "list");
    input.addEventListener("input", () => this.inserting || this.update());
    input.addEventListener("blur", () => this.close());
    // Captured on the form, before the box's own Enter (send) handler sees the key.
    composer.addEventListener("keydown", (event) => this.onKey(event), true);
    this.list.addEventListener("mousedown", (event) => event.preventDefault()); // the box keeps the focus
    this.list.addEventListener("click", (event) => {
      const item = event.target.closest("li[data-index]");
      if (item) this.choose(Number(item.dataset.index));
    });
  }

  /** The text after "/" while the box holds nothing else on its first line, else null. */
  query() {
    const match = this.input.value.match(/^\/([^\n]*)$/);
    return match ? match[1].trim().toLowerCase() : null;
  }

  async update() {
    const query = this.query();
    if (query === null) return this.close();
    if (this.presets === null) {
      // Keys typed while the list loads wait for the same request.
      this.loading ??= api("/api/presets").finally(() => (this.loading = null));
      try {
        this.presets = (await this.loading).presets;
      } catch (error) {
        this.onError(t("Could not load the prompt presets: %(error)s", { error: error.message }));
        return this.close();
      }
      if (this.query() === null) return this.close();
    }
    const words = this.query().split(/\s+/).filter(Boolean);
    this.shown = this.presets.filter((preset) => {
      const name = preset.name.toLowerCase();
      return words.every((word) => name.includes(word));
    });
    this.active = 0;
    this.render();
  }

  render() {
    const items = this.shown.map((preset, index) => {
      const item = document.createElement("li");
      item.id = `${this.list.id}-${index}`;
      item.dataset.index = index;
      item.setAttribute("role", "option");
      const name = document.createElement("span");
      name.className = "preset-name";
      name.textContent = preset.name;
      const text = document.createElement("span");
      text.className = "preset-text";
      text.textContent = preset.text.split("\n")[0];
      item.append(name, text);
      if (!preset.mine) {
        const badge = document.createElement("span");
        badge.className = "preset-badge";
        badge.textContent = t("shared");
        item.append(badge);
      }
      return item;
    });
    if (!items.length) {
      const empty = document.createElement("li");
      empty.className = "preset-empty";
      empty.textContent = this.presets.length
        ? t("No preset matches.")
        : t("No prompt presets yet: add some in Settings.");
      items.push(empty);
    }
    this.list.replaceChildren(...items);
    this.list.hidden = false;
    this.highlight();
  }

  highlight() {
    for (const item of this.list.querySelectorAll("li[data-index]")) {
      const on = Number(item.dataset.index) === this.active;
      item.setAttribute("aria-selected", String(on));
      if (on) item.scrollIntoView({ block: "nearest" });
    }
    if (this.shown.length) this.input.setAttribute("aria-activedescendant", `${this.list.id}-${this.active}`);
    else this.input.removeAttribute("aria-activedescendant");
  }

  get open() {
    return !this.list.hidden;
  }

  close() {
    this.list.hidden = true;
    this.input.removeAttribute("aria-activedescendant");
  }

  onKey(event) {
    if (!this.open || event.target !== this.input || event.isComposing) return;
    const count = this.shown.length;
    if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      if (count) this.active = (this.active + (event.key === "ArrowDown" ? 1 : count - 1)) % count;
      this.highlight();
    } else if ((event.key === "Enter" && !event.shiftKey) || event.key === "Tab") {
      if (!count) return this.close(); // nothing to choose: Enter sends the text as typed
      this.choose(this.active);
    } else if (event.key === "Escape") {
      this.close();
    } else {
      return;
    }
    this.stop(event);
  }

  stop(event) {
    event.preventDefault();
    event.stopPropagation();
  }

  choose(index) {
    const preset = this.shown[index];
    if (!preset) return;
    this.close();
    this.input.value = preset.text;
    this.input.setSelectionRange(preset.text.length, preset.text.length);
    this.inserting = true;
    this.input.dispatchEvent(new Event("input")); // the box grows to its text
    this.inserting = false;
    this.presets = null;
    this.onChoose(preset);
  }
}

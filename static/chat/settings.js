// The model picker and the request settings (temperature, max tokens, system prompt) of a conversation.
import { api } from "./api.js";
import { t } from "./i18n.js";

const MODEL_KEY = "chat.model";

export class ModelPicker {
  constructor(select) {
    this.select = select;
    this.defaultModel = null;
    this.select.addEventListener("change", () => {
      // The last explicit choice is the starting point of every new chat.
      if (this.select.value) localStorage.setItem(MODEL_KEY, this.select.value);
    });
  }

  async load() {
    const data = await api("/api/models");
    this.defaultModel = data.default;
    this.models = new Map(data.models.map((model) => [model.qualified, model]));
    const groups = new Map();
    // A closed picker shows only the option: a model two providers serve names its provider too.
    const served = new Map();
    for (const model of data.models) served.set(model.id, (served.get(model.id) || 0) + 1);
    for (const model of data.models) {
      if (!groups.has(model.provider)) {
        const group = document.createElement("optgroup");
        group.label = model.provider;
        groups.set(model.provider, group);
      }
      const option = document.createElement("option");
      option.value = model.qualified;
      // Which models take images, at a glance: the picker is where a person chooses one for a photo.
      const name = served.get(model.id) > 1 ? `${model.id} · ${model.provider}` : model.id;
      option.textContent = model.images ? t("%(model)s · images", { model: name }) : name;
      if (model.images) option.dataset.images = "1";
      groups.get(model.provider).append(option);
    }
    this.select.replaceChildren(...groups.values());
    this.select.disabled = data.models.length === 0;
    return data;
  }

  has(value) {
    return Boolean(value) && [...this.select.options].some((option) => option.value === value);
  }

  /** A conversation's own model wins; else the last choice; else the server's default. */
  choose(conversationModel) {
    const saved = localStorage.getItem(MODEL_KEY);
    for (const candidate of [conversationModel, saved, this.defaultModel]) {
      if (this.has(candidate)) {
        this.select.value = candidate;
        return;
      }
    }
  }

  /** The chosen model's entry from /api/models ({id, qualified, provider, images}), or null. */
  get chosen() {
    return this.models?.get(this.select.value) || null;
  }

  get value() {
    return this.select.value || undefined;
  }
}

export class SettingsPanel {
  /** onError(message); `conversation()` returns the open conversation's id or null. */
  constructor({ conversation, onError }) {
    this.conversation = conversation;
    this.onError = onError;
    this.panel = document.getElementById("settings-panel");
    this.button = document.getElementById("settings-button");
    this.note = document.getElementById("settings-note");
    this.temperature = document.getElementById("param-temperature");
    this.maxTokens = document.getElementById("param-max-tokens");
    this.systemPrompt = document.getElementById("param-system-prompt");
    this.button.addEventListener("click", () => this.toggle());
    this.temperature.addEventListener("change", () => {
      if (this.check(this.temperature)) this.save({ params: { temperature: this.number(this.temperature) } });
    });
    this.maxTokens.addEventListener("change", () => {
      if (this.check(this.maxTokens)) this.save({ params: { max_tokens: this.integer(this.maxTokens) } });
    });
    this.systemPrompt.addEventListener("change", () => this.save({ system_prompt: this.systemPrompt.value }));
  }

  toggle(open = this.panel.hidden) {
    this.panel.hidden = !open;
    this.button.setAttribute("aria-expanded", String(open));
  }

  /** A field out of its range says so under itself and is not saved or sent; true when it is fine. */
  check(input) {
    const error = document.getElementById(input.getAttribute("aria-describedby").split(" ")[1]);
    const ok = input.checkValidity();
    const { min, max } = input;
    error.textContent = ok ? "" : t("Enter a number from %(min)s to %(max)s, or leave it empty for the default.", { min, max });
    error.hidden = ok;
    input.setAttribute("aria-invalid", String(!ok));
    return ok;
  }

  /** The message to show instead of sending when a field is out of range, or null. */
  problem() {
    const bad = [this.temperature, this.maxTokens].find((input) => !this.check(input));
    if (!bad) return null;
    this.toggle(true);
    bad.focus();
    return t("A request setting is out of range; see the settings panel.");
  }

  /** The first message of a new chat created its conversation: settings now save on it. */
  started() {
    this.note.textContent = t("Saved on this conversation when changed.");
  }

  number(input) {
    return input.value === "" || Number.isNaN(input.valueAsNumber) ? null : input.valueAsNumber;
  }

  integer(input) {
    const value = this.number(input);
    return value === null ? null : Math.round(value);
  }

  /** Fill from a conversation (or clear for a new chat). */
  fill(conversation) {
    const params = conversation?.params || {};
    this.temperature.value = params.temperature ?? "";
    this.maxTokens.value = params.max_tokens ?? "";
    this.systemPrompt.value = conversation?.system_prompt || "";
    for (const input of [this.temperature, this.maxTokens]) this.check(input);
    this.note.textContent = conversation
      ? t("Saved on this conversation when changed.")
      : t("Sent with the first message of this new chat.");
  }

  /** What the first `send` of a new chat carries. */
  forNewChat() {
    const params = {};
    const temperature = this.number(this.temperature);
    const maxTokens = this.integer(this.maxTokens);
    if (temperature !== null) params.temperature = temperature;
    if (maxTokens !== null) params.max_tokens = maxTokens;
    const extra = {};
    if (Object.keys(params).length) extra.params = params;
    if (this.systemPrompt.value.trim()) extra.system_prompt = this.systemPrompt.value;
    return extra;
  }

  async save(change) {
    const id = this.conversation();
    if (id === null) return; // a new chat sends them with its first message
    try {
      await api(`/api/conversations/${id}`, { method: "PATCH", body: change });
      this.note.textContent = t("Saved.");
    } catch (error) {
      this.onError(t("Could not save the settings: %(error)s", { error: error.message }));
    }
  }
}

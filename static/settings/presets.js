// The settings page's "Defaults for new chats" and "Prompt presets" sections (templates/settings/defaults.html).
import { api, setCsrfToken } from "../chat/api.js";
import { t } from "../chat/i18n.js";

const $ = (id) => document.getElementById(id);
setCsrfToken(document.querySelector("#defaults-form [name=csrfmiddlewaretoken]").value);

function say(element, text) {
  element.textContent = text;
}

/** A number field's value, or null when empty. */
function number(input) {
  return input.value === "" || Number.isNaN(input.valueAsNumber) ? null : input.valueAsNumber;
}

/** Both model pickers list what this person may use, by provider. */
async function loadModels() {
  const data = await api("/api/models");
  for (const select of [$("default-model"), $("preset-model")]) {
    for (const model of data.models) {
      const option = document.createElement("option");
      option.value = model.qualified;
      option.textContent = `${model.id} (${model.provider})`;
      select.append(option);
    }
  }
}

/** Select a stored model id, keeping one no longer offered visible rather than silently dropping it. */
function selectModel(select, model) {
  if (model && ![...select.options].some((option) => option.value === model)) {
    const option = document.createElement("option");
    option.value = model;
    option.textContent = t("%(model)s (not offered now)", { model });
    select.append(option);
  }
  select.value = model || "";
}

// --- defaults for new chats ------------------------------------------------------------

async function loadDefaults() {
  try {
    const defaults = await api("/api/defaults");
    selectModel($("default-model"), defaults.model);
    $("default-temperature").value = defaults.temperature ?? "";
    $("default-system-prompt").value = defaults.system_prompt;
  } finally {
    // Usable once the stored values are in (or could not be read): nothing typed before is overwritten.
    for (const id of ["default-model", "default-temperature", "default-system-prompt", "defaults-save"]) {
      $(id).disabled = false;
    }
  }
}

// The tools a new chat starts with: sent only once the person changed them (else the group's default holds).
let toolsChanged = false;

async function loadTools() {
  let data;
  try {
    data = await api("/api/tools"); // "chosen": the effective default for a new chat, null: every tool
  } catch {
    return;
  }
  const list = $("default-tools-list");
  list.replaceChildren();
  for (const server of data.servers) {
    for (const tool of server.tools) {
      const label = document.createElement("label");
      const box = document.createElement("input");
      box.type = "checkbox";
      box.value = tool.name;
      box.checked = data.chosen === null || data.chosen.includes(tool.name);
      box.addEventListener("change", () => {
        toolsChanged = true;
      });
      label.append(box, " ", `${server.server}: ${tool.tool}`);
      list.append(label);
    }
  }
  $("default-tools").hidden = list.children.length === 0;
}

function chosenTools() {
  if (!toolsChanged) return undefined;
  return [...$("default-tools-list").querySelectorAll("input:checked")].map((box) => box.value);
}

$("defaults-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const status = $("defaults-status");
  if (!$("default-temperature").checkValidity()) {
    say(status, t("Enter a temperature from 0 to 2, or leave it empty."));
    return;
  }
  try {
    await api("/api/defaults", {
      method: "PUT",
      body: {
        model: $("default-model").value,
        temperature: number($("default-temperature")),
        system_prompt: $("default-system-prompt").value,
        tools: chosenTools(),
      },
    });
    say(status, t("Saved."));
  } catch (error) {
    say(status, t("Could not save: %(error)s", { error: error.message }));
  }
});

// --- prompt presets ------------------------------------------------------------------------

let editing = null; // the id of the preset the form changes, null: a new one
let presets = [];

function button(text, action, id) {
  const element = document.createElement("button");
  element.type = "button";
  element.className = "link-button";
  element.textContent = text;
  element.dataset.action = action;
  element.dataset.id = id;
  return element;
}

function renderPresets() {
  const rows = presets.map((preset) => {
    const item = document.createElement("li");
    item.dataset.presetId = preset.id;
    const name = document.createElement("strong");
    name.textContent = preset.name;
    const text = document.createElement("span");
    text.className = "preset-text";
    text.textContent = preset.text.split("\n")[0];
    item.append(name, " ", text);
    if (preset.published) {
      const badge = document.createElement("span");
      badge.className = "preset-badge";
      badge.textContent = preset.mine ? t("published") : t("shared by %(owner)s", { owner: preset.owner });
      item.append(" ", badge);
    }
    if (preset.mine) {
      const edit = button(t("Edit"), "edit", preset.id);
      edit.setAttribute("aria-label", t("Edit “%(name)s”", { name: preset.name }));
      const remove = button(t("Delete"), "delete", preset.id);
      remove.setAttribute("aria-label", t("Delete “%(name)s”", { name: preset.name }));
      item.append(" ", edit, " ", remove);
    }
    return item;
  });
  $("preset-list").replaceChildren(...rows);
  $("preset-list-empty").hidden = rows.length > 0;
}

async function loadPresets() {
  presets = (await api("/api/presets")).presets;
  renderPresets();
}

function fillForm(preset) {
  editing = preset?.id ?? null;
  $("preset-name").value = preset?.name || "";
  $("preset-text").value = preset?.text || "";
  $("preset-system-prompt").value = preset?.system_prompt || "";
  selectModel($("preset-model"), preset?.model || "");
  $("preset-temperature").value = preset?.params?.temperature ?? "";
  $("preset-max-tokens").value = preset?.params?.max_tokens ?? "";
  if ($("preset-published")) $("preset-published").checked = Boolean(preset?.published);
  $("preset-form-heading").textContent = preset ? t("Edit “%(name)s”", { name: preset.name }) : t("New preset");
  $("preset-save").textContent = preset ? t("Save preset") : t("Add preset");
  $("preset-cancel").hidden = !preset;
}

$("preset-list").addEventListener("click", async (event) => {
  const target = event.target.closest("button[data-action]");
  if (!target) return;
  const preset = presets.find((p) => p.id === Number(target.dataset.id));
  if (!preset) return;
  if (target.dataset.action === "edit") {
    fillForm(preset);
    $("preset-name").focus();
    return;
  }
  if (!window.confirm(t("Delete the preset “%(name)s”?", { name: preset.name }))) return;
  try {
    await api(`/api/presets/${preset.id}`, { method: "DELETE" });
    if (editing === preset.id) fillForm(null);
    await loadPresets();
    say($("preset-status"), t("Deleted."));
  } catch (error) {
    say($("preset-status"), t("Could not delete: %(error)s", { error: error.message }));
  }
});

$("preset-cancel").addEventListener("click", () => fillForm(null));

$("preset-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const status = $("preset-status");
  const fields = ["preset-name", "preset-text", "preset-temperature", "preset-max-tokens"].map($);
  const bad = fields.find((input) => !input.checkValidity() || (input.required && !input.value.trim()));
  if (bad) {
    say(status, t("Check “%(field)s”.", { field: document.querySelector(`label[for=${bad.id}]`).textContent }));
    bad.focus();
    return;
  }
  const body = {
    name: $("preset-name").value,
    text: $("preset-text").value,
    system_prompt: $("preset-system-prompt").value,
    model: $("preset-model").value,
    params: { temperature: number($("preset-temperature")), max_tokens: number($("preset-max-tokens")) },
  };
  if ($("preset-published")) body.published = $("preset-published").checked;
  try {
    if (editing === null) await api("/api/presets", { method: "POST", body });
    else await api(`/api/presets/${editing}`, { method: "PATCH", body });
    say(status, editing === null ? t("Preset added.") : t("Preset saved."));
    fillForm(null);
    await loadPresets();
  } catch (error) {
    say(status, t("Could not save the preset: %(error)s", { error: error.message }));
  }
});

loadModels()
  .catch(() => {}) // the pickers then offer only "default"; everything else still works
  .then(() => Promise.all([loadDefaults(), loadPresets(), loadTools()]))
  .catch((error) => say($("preset-status"), t("Could not load your settings: %(error)s", { error: error.message })));

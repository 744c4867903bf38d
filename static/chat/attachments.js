// Attachments: the composer's tray (button, drop, paste; upload; chips) and the chips shown on a sent message.
import { ApiError } from "./api.js";
import { nt, t } from "./i18n.js";

const NUMBER = new Intl.NumberFormat(globalThis.document?.documentElement.lang || "en-US");

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

export function formatSize(bytes) {
  if (bytes < 1000) return nt("%(count)s byte", "%(count)s bytes", bytes);
  const units = [t("KB"), t("MB"), t("GB")];
  let value = bytes;
  let unit = "";
  for (unit of units) {
    value /= 1000;
    if (value < 1000) break;
  }
  return `${value.toFixed(value < 10 ? 1 : 0)} ${unit}`;
}

/** One attachment as a chip: a thumbnail (images) or the file's name, size and, for documents, tokens. */
export function chip(attachment, { removable = false } = {}) {
  const item = element("li", "chip");
  item.dataset.kind = attachment.kind || "pending";
  if (attachment.id) item.dataset.attachmentId = attachment.id;
  if (attachment.kind === "image" && attachment.url) {
    const open = element("button", "chip-thumb");
    open.type = "button";
    open.dataset.action = "view-image";
    open.dataset.url = attachment.url;
    open.setAttribute("aria-label", t("Open %(name)s full size", { name: attachment.name }));
    const image = element("img");
    image.src = attachment.url;
    image.alt = attachment.name;
    image.loading = "lazy";
    open.append(image);
    item.append(open);
  }
  const label = element("span", "chip-label");
  const name = attachment.kind === "document" && attachment.url ? element("a", "chip-name") : element("span", "chip-name");
  name.textContent = attachment.name;
  if (name.tagName === "A") name.href = attachment.url; // a download: served as Content-Disposition: attachment
  const details = [formatSize(attachment.size)];
  if (attachment.kind === "document") details.push(t("≈%(count)s tokens", { count: NUMBER.format(attachment.tokens) }));
  if (!attachment.kind) details.push(t("uploading…"));
  label.append(name, element("span", "chip-detail", details.join(" · ")));
  item.append(label);
  if (removable) {
    const remove = element("button", "chip-remove", "×");
    remove.type = "button";
    remove.dataset.action = "remove-attachment";
    remove.setAttribute("aria-label", t("Remove %(name)s", { name: attachment.name }));
    remove.title = t("Remove");
    item.append(remove);
  }
  return item;
}

/** The chips under a sent message. */
export function attachmentList(attachments) {
  const list = element("ul", "chips message-attachments");
  list.setAttribute("aria-label", "Attachments");
  for (const attachment of attachments) list.append(chip(attachment));
  return list;
}

async function upload(file, csrfToken) {
  const body = new FormData();
  body.append("file", file, file.name || "pasted");
  const response = await fetch("/api/attachments", {
    method: "POST",
    body,
    headers: { "X-CSRFToken": csrfToken, Accept: "application/json" },
    credentials: "same-origin",
  });
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    const error = data?.error || {};
    const detail = response.status === 413 && !error.detail ? t("The file is too large to upload.") : error.detail;
    throw new ApiError(response.status, error.code || "http", detail || t("Upload failed (%(status)s).", { status: response.status }));
  }
  return data;
}

/** upload(), waiting while the person's other tabs have the server's uploads at once in progress. */
async function uploadWhenFree(file, csrfToken) {
  for (let attempt = 1; ; attempt += 1) {
    try {
      return await upload(file, csrfToken);
    } catch (error) {
      if (error.code !== "too_many_uploads" || attempt >= 60) throw error;
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
  }
}

/** The composer's attachments: chosen by button, dropped, or pasted; uploaded (a few at a time); sent by id. */
export class AttachmentTray {
  /** limits: the server's (maxFileBytes, maxMessageBytes, maxMessageTokens, maxPerMessage). */
  constructor({ list, button, input, dropZone, pasteTarget, limits, csrfToken, onError, onChange }) {
    this.onChange = onChange || (() => {});
    this.list = list;
    this.input = input;
    this.limits = limits;
    this.csrfToken = csrfToken;
    this.onError = onError;
    this.items = []; // {file, attachment (after upload), node, promise}
    // The server takes a few uploads of a person at once (limits.uploadsAtOnce): the others wait here, in order.
    this.running = 0;
    this.waiting = [];
    button.addEventListener("click", () => input.click());
    input.addEventListener("change", () => {
      this.add([...input.files]);
      input.value = ""; // the same file can be chosen again
    });
    dropZone.addEventListener("dragover", (event) => {
      if (![...(event.dataTransfer?.types || [])].includes("Files")) return;
      event.preventDefault();
      dropZone.classList.add("dropping");
    });
    dropZone.addEventListener("dragleave", (event) => {
      if (!dropZone.contains(event.relatedTarget)) dropZone.classList.remove("dropping");
    });
    dropZone.addEventListener("drop", (event) => {
      dropZone.classList.remove("dropping");
      const files = [...(event.dataTransfer?.files || [])];
      if (!files.length) return;
      event.preventDefault();
      this.add(files);
    });
    pasteTarget.addEventListener("paste", (event) => {
      const files = [...(event.clipboardData?.files || [])];
      if (!files.length) return; // plain text pastes as usual
      // A screenshot is only a file; copied text that brings a picture along still pastes its text.
      if (!event.clipboardData.types.includes("text/plain")) event.preventDefault();
      this.add(files);
    });
    // A file dropped anywhere else must not make the browser leave the chat to show it.
    for (const type of ["dragover", "drop"]) {
      window.addEventListener(type, (event) => {
        if ([...(event.dataTransfer?.types || [])].includes("Files")) event.preventDefault();
      });
    }
    this.list.addEventListener("click", (event) => {
      const button = event.target.closest("button[data-action=remove-attachment]");
      const item = this.items.find((entry) => entry.node.contains(button));
      if (item) this.remove(item, { discard: true });
    });
  }

  add(files) {
    for (const file of files) {
      if (this.items.length >= this.limits.maxPerMessage) {
        this.onError(t("At most %(count)s attachments can go with one message.", { count: this.limits.maxPerMessage }));
        return;
      }
      if (file.size > this.limits.maxFileBytes) {
        this.onError(
          t("%(name)s is %(size)s, over the limit of %(limit)s per file.", {
            name: file.name,
            size: formatSize(file.size),
            limit: formatSize(this.limits.maxFileBytes),
          }),
        );
        continue;
      }
      const name = file.name || t("pasted image");
      const item = { file, attachment: null, node: chip({ name, size: file.size }, { removable: true }) };
      item.node.dataset.state = "uploading";
      this.items.push(item);
      this.list.append(item.node);
      // Removed while it waited: never sent.
      item.promise = this.queued(() => (this.items.includes(item) ? uploadWhenFree(file, this.csrfToken) : null)).then(
        (attachment) => {
          if (!attachment) return undefined;
          item.attachment = attachment;
          if (!this.items.includes(item)) return this.discard(attachment); // removed while uploading
          const node = chip(attachment, { removable: true });
          node.dataset.state = "ready";
          item.node.replaceWith(node);
          item.node = node;
          this.onChange({ uploaded: name });
          return undefined;
        },
        (error) => {
          this.remove(item);
          this.onError(error.message);
        },
      );
    }
    this.render();
  }

  /** `start()`'s promise, started once fewer than the server's uploads at once run from this tray. */
  queued(start) {
    return new Promise((resolve, reject) => {
      const run = () => {
        this.running += 1;
        Promise.resolve(start())
          .then(resolve, reject)
          .finally(() => {
            this.running -= 1;
            this.waiting.shift()?.();
          });
      };
      if (this.running < (this.limits.uploadsAtOnce || 4)) run();
      else this.waiting.push(run);
    });
  }

  remove(item, { discard = false } = {}) {
    this.items = this.items.filter((entry) => entry !== item);
    item.node.remove();
    if (discard && item.attachment) this.discard(item.attachment);
    this.render();
    if (discard) this.onChange({ uploaded: false });
  }

  discard(attachment) {
    fetch(`/api/attachments/${attachment.id}`, {
      method: "DELETE",
      headers: { "X-CSRFToken": this.csrfToken },
      credentials: "same-origin",
    }).catch(() => {}); // left unsent, it is removed after a day anyway
  }

  render() {
    this.list.hidden = this.items.length === 0;
  }

  get uploading() {
    return this.items.some((item) => !item.attachment);
  }

  get ready() {
    return this.items.map((item) => item.attachment).filter(Boolean);
  }

  /** Why the attachments cannot go with a message to `model`, or null. */
  problem(model, text) {
    if (this.uploading) return t("Wait until the attachments have finished uploading.");
    const ready = this.ready;
    if (model && !model.images && ready.some((attachment) => attachment.kind === "image")) {
      return t("%(model)s does not accept images: remove the image, or pick a model that accepts them.", { model: model.id });
    }
    const size = ready.reduce((sum, attachment) => sum + attachment.size, 0);
    if (size > this.limits.maxMessageBytes) {
      return t("The attachments add up to %(size)s, over the limit of %(limit)s per message.", {
        size: formatSize(size),
        limit: formatSize(this.limits.maxMessageBytes),
      });
    }
    const tokens = Math.ceil(text.length / 4) + ready.reduce((sum, attachment) => sum + attachment.tokens, 0);
    if (tokens > this.limits.maxMessageTokens) {
      return t(
        "The message with its attachments comes to about %(tokens)s tokens, over the limit of %(limit)s per message; attach less, or a shorter document.",
        { tokens: NUMBER.format(tokens), limit: NUMBER.format(this.limits.maxMessageTokens) },
      );
    }
    return null;
  }

  /** Take the uploaded attachments for a message being sent; `restore` puts them back if it is refused. */
  take() {
    const taken = this.items;
    this.items = [];
    for (const item of taken) item.node.remove();
    this.render();
    return taken;
  }

  restore(taken) {
    this.items = [...taken, ...this.items];
    this.list.prepend(...taken.map((item) => item.node));
    this.render();
  }
}

// The full-size viewer of an attached image: the whole image fitted to the screen, centred; a click
// (or Enter) zooms in to its own size, at least twice the fitted one, and another click fits it again.
import { t } from "./i18n.js";

export class ImageViewer {
  constructor(dialog, image) {
    this.dialog = dialog;
    this.image = image;
    this.image.tabIndex = 0;
    this.image.addEventListener("click", (event) => this.toggle(event));
    this.image.addEventListener("keydown", (event) => {
      if (event.key === "Enter" || event.key === " ") {
        event.preventDefault();
        this.toggle(null);
      }
    });
    this.dialog.addEventListener("close", () => this.fit());
    // A click on the dark around the image closes it, as in every other viewer.
    this.dialog.addEventListener("click", (event) => {
      if (event.target === this.dialog || event.target.classList.contains("image-stage")) this.dialog.close();
    });
  }

  open(url, alt) {
    this.fit();
    this.image.src = url;
    this.image.alt = alt;
    this.dialog.showModal();
  }

  get zoomed() {
    return this.dialog.classList.contains("zoomed");
  }

  fit() {
    this.dialog.classList.remove("zoomed");
    this.image.style.removeProperty("width");
    this.image.title = t("Click to zoom in");
  }

  /** Zoom in around the point clicked (the centre from the keyboard), or back to fit. */
  toggle(event) {
    if (this.zoomed) return this.fit();
    const box = this.image.getBoundingClientRect();
    const x = event ? (event.clientX - box.left) / box.width : 0.5;
    const y = event ? (event.clientY - box.top) / box.height : 0.5;
    const width = Math.max(this.image.naturalWidth, Math.round(box.width * 2));
    this.dialog.classList.add("zoomed");
    this.image.style.width = `${width}px`;
    this.image.title = t("Click to fit the screen");
    const stage = this.dialog.querySelector(".image-stage");
    const height = (width * box.height) / box.width;
    stage.scrollLeft = x * width - stage.clientWidth / 2;
    stage.scrollTop = y * height - stage.clientHeight / 2;
    return undefined;
  }
}

// The API tokens page: copy a new token's secret with one click, and say so.
import { t } from "../chat/i18n.js";

const button = document.getElementById("copy-token");
const status = document.getElementById("copy-status");
if (button) {
  button.addEventListener("click", async () => {
    const secret = document.getElementById(button.dataset.copy).textContent.trim();
    try {
      await navigator.clipboard.writeText(secret);
      status.textContent = t("Copied to the clipboard.");
    } catch {
      status.textContent = t("Could not copy: select the token and copy it by hand.");
    }
  });
  // The button is rendered disabled so that a click before this module runs is not lost in silence.
  button.disabled = false;
}

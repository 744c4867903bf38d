// The API tokens page: copy a new token's secret with one click, and say so.
const button = document.getElementById("copy-token");
const status = document.getElementById("copy-status");
if (button) {
  button.addEventListener("click", async () => {
    const secret = document.getElementById(button.dataset.copy).textContent.trim();
    try {
      await navigator.clipboard.writeText(secret);
      status.textContent = "Copied to the clipboard.";
    } catch {
      status.textContent = "Could not copy: select the token and copy it by hand.";
    }
  });
}

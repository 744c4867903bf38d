// Loaded before the page is drawn (a classic script in the head), so it listens from the first moment
// the message box can be typed into, a second or more before the page's modules are ready on a slow
// link or a busy machine. Enter or Send meanwhile is kept, never a new line nor a native form submit
// that would lose the message; app.js sends it once it is ready. Nothing here is shown in words.
(() => {
  const early = { ready: false, send: false };
  window.chatEarly = early;
  function queue(event) {
    event.preventDefault();
    early.send = true;
    document.documentElement.dataset.earlySend = ""; // the Send button shows the message is waiting
  }
  document.addEventListener(
    "keydown",
    (event) => {
      if (early.ready || event.target.id !== "input") return;
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) queue(event);
    },
    true,
  );
  document.addEventListener(
    "submit",
    (event) => {
      if (!early.ready && event.target.id === "composer") queue(event);
    },
    true,
  );
})();

// Loaded before the page is drawn (a classic script in the head), so it listens from the first moment
// the message box can be typed into, a second or more before the page's modules are ready on a slow
// link or a busy machine. Enter or Send meanwhile is kept, never a new line nor a native form submit
// that would lose the message; app.js sends it once it is ready. Nothing here is shown in words.
(() => {
  // On a touch screen with no mouse (a phone, a tablet) Enter starts a new line and Send sends, as in
  // the phone apps of chat services: there is no Shift to hold on a screen keyboard.
  const touch = matchMedia("(hover: none) and (pointer: coarse)");
  const early = {
    ready: false,
    send: false,
    enterSends: (event) => event.key === "Enter" && !event.shiftKey && !event.isComposing && !touch.matches,
  };
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
      if (early.enterSends(event)) queue(event);
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

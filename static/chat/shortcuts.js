// The chat page's keyboard shortcuts, the ones people know from other chat apps: Ctrl+K search,
// Ctrl+Shift+O new chat, Ctrl+Shift+C copy the last answer, Shift+Esc the message box, Esc stop (or close
// the phone's drawer), Ctrl+/ their list (templates/chat/shortcuts.html, also on the settings page). Cmd on a Mac.

// Fields whose own Escape comes first (a search box clears, a select closes): not a stop. The message box is not one.
const OWN_ESCAPE = "input:not(#input), select, textarea:not(#input)";

/**
 * actions: search(), newChat(), copyLast(), focusComposer(), stop() (true when it stopped something),
 * showList(), closeDrawer() (true when the phone's drawer was open). Returns nothing; listens on the document.
 */
export function installShortcuts(actions) {
  document.addEventListener("keydown", (event) => {
    if (event.defaultPrevented || event.isComposing) return;
    const mod = event.ctrlKey || event.metaKey;
    const key = event.key.toLowerCase();
    // A modal dialog of the page keeps its own keys (Escape closes it).
    const modal = document.querySelector("dialog[open]");
    let done = false;
    if (mod && !event.shiftKey && !event.altKey && key === "k") {
      if (!modal) done = actions.search() !== false; // the browser's own Ctrl+K focuses its address bar
    } else if (mod && event.shiftKey && !event.altKey && (key === "o" || event.code === "KeyO")) {
      if (!modal) done = actions.newChat() !== false;
    } else if (mod && event.shiftKey && !event.altKey && (key === "c" || event.code === "KeyC")) {
      // With text selected, the browser copies it (Ctrl+Shift+C is not Ctrl+C, but be careful).
      if (!modal && !String(window.getSelection?.() || "")) done = actions.copyLast() !== false;
    } else if (mod && !event.altKey && (key === "/" || event.code === "Slash")) {
      done = actions.showList() !== false;
    } else if (event.key === "Escape" && event.shiftKey && !mod) {
      if (!modal) done = actions.focusComposer() !== false;
    } else if (event.key === "Escape" && !event.shiftKey && !mod && !modal) {
      done = actions.closeDrawer() === true || (!event.target.matches?.(OWN_ESCAPE) && actions.stop() === true);
    }
    if (done) event.preventDefault();
  });
}

/** The Ctrl+/ dialog (in the page's template): opened, or closed when it is open. */
export function toggleShortcutList() {
  const dialog = document.getElementById("shortcuts-dialog");
  if (!dialog) return false;
  if (dialog.open) dialog.close();
  else dialog.showModal();
  return true;
}

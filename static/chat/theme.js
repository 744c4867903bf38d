// The colour theme a person chose in the settings (system, light or dark), applied before the page is
// drawn: a classic script at the end of <head>, after the stylesheets, which it runs after. The
// stylesheets say light and dark with prefers-color-scheme; a chosen theme turns those conditions
// into always or never (CSSOM, allowed by the content security policy, unlike inline styles).
(() => {
  const KEY = "chat.theme";
  const THEMES = ["system", "light", "dark"];
  const original = new WeakMap(); // a media list -> its text as written
  const SCHEME = /\(\s*prefers-color-scheme\s*:\s*(light|dark)\s*\)/g;
  const HAS_SCHEME = /prefers-color-scheme/;

  function chosen() {
    try {
      const theme = localStorage.getItem(KEY);
      return THEMES.includes(theme) ? theme : "system";
    } catch {
      return "system";
    }
  }

  /** A media text with its colour-scheme conditions decided for `theme` (null: the browser's). */
  function decided(text, theme) {
    if (theme === "system") return text;
    // "(prefers-color-scheme: dark)" becomes "all" or "not all"; `and`/`,` lists keep their other parts.
    return text
      .split(",")
      .map((query) => {
        let never = false;
        const rest = query.replace(SCHEME, (_, scheme) => {
          if (scheme !== theme) never = true;
          return "";
        });
        if (rest === query) return query;
        const kept = rest.replace(/^\s*and\s+|\s+and\s*$/g, "").replace(/\s+and\s+and\s+/g, " and ").trim();
        if (never) return "not all";
        return kept || "all";
      })
      .join(", ");
  }

  function applyTo(list, theme) {
    if (!list) return;
    if (!original.has(list)) {
      if (!HAS_SCHEME.test(list.mediaText)) return;
      original.set(list, list.mediaText);
    }
    list.mediaText = decided(original.get(list), theme);
  }

  function walk(rules, theme) {
    for (const rule of rules) {
      if (rule.media) applyTo(rule.media, theme);
      if (rule.cssRules) walk(rule.cssRules, theme);
    }
  }

  function apply(theme) {
    const root = document.documentElement;
    if (theme === "system") delete root.dataset.theme;
    else root.dataset.theme = theme;
    root.style.colorScheme = theme === "system" ? "" : theme;
    // <link media="(prefers-color-scheme: …)">: the attribute, as written the first time.
    for (const link of document.querySelectorAll("link[rel=stylesheet][media]")) {
      if (!("media" in link.dataset)) link.dataset.media = link.media;
      link.media = decided(link.dataset.media, theme);
    }
    // @media rules inside the stylesheets.
    for (const sheet of document.styleSheets) {
      try {
        walk(sheet.cssRules, theme);
      } catch {
        // A stylesheet of another origin cannot be read; ours are all same-origin.
      }
    }
  }

  function set(theme) {
    try {
      if (theme === "system") localStorage.removeItem(KEY);
      else localStorage.setItem(KEY, theme);
    } catch {
      // Storage refused (a private window): the choice lasts for this page.
    }
    apply(theme);
    document.dispatchEvent(new CustomEvent("chat:theme", { detail: { theme } }));
  }

  window.chatTheme = { chosen, set, dark: () => (chosen() === "system" ? matchMedia("(prefers-color-scheme: dark)").matches : chosen() === "dark") };
  apply(chosen());
  // Another tab changed it: follow.
  addEventListener("storage", (event) => event.key === KEY && apply(chosen()));
  // The settings page's switch (templates/settings/theme.html).
  document.addEventListener("DOMContentLoaded", () => {
    apply(chosen()); // stylesheets of the body, if any
    const form = document.getElementById("theme-form");
    if (!form) return;
    const current = form.querySelector(`input[value="${chosen()}"]`);
    if (current) current.checked = true;
    form.addEventListener("change", (event) => set(event.target.value));
  });
})();

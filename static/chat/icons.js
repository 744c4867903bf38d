// Small stroke icons as SVG markup (inline SVG needs no extra request and obeys currentColor).

const STROKE = 'fill="none" stroke="currentColor" stroke-width="2" stroke-linecap="round" stroke-linejoin="round"';
const PATHS = {
  edit: `<path ${STROKE} d="M4 20h4L19 9l-4-4L4 16v4ZM13.5 6.5l4 4"/>`,
  regenerate: `<path ${STROKE} d="M20 11a8 8 0 1 0-2.3 5.7M20 5v6h-6"/>`,
  copy:
    `<rect x="8" y="8" width="12" height="12" rx="2" ${STROKE}/>` +
    `<path ${STROKE} d="M16 8V6a2 2 0 0 0-2-2H6a2 2 0 0 0-2 2v8a2 2 0 0 0 2 2h2"/>`,
  rename: `<path ${STROKE} d="M4 20h4L19 9l-4-4L4 16v4Z"/>`,
  delete: `<path ${STROKE} d="M4 7h16M10 11v6M14 11v6M6 7l1 13h10l1-13M9 7V4h6v3"/>`,
  more: [5, 12, 19].map((x) => `<circle cx="${x}" cy="12" r="1.6" fill="currentColor"/>`).join(""),
  "new-folder": `<path ${STROKE} d="M3 7a2 2 0 0 1 2-2h4l2 2h8a2 2 0 0 1 2 2v8a2 2 0 0 1-2 2H5a2 2 0 0 1-2-2V7ZM12 10v6M9 13h6"/>`,
  check: `<path ${STROKE} d="M5 12.5l4.5 4.5L19 7"/>`,
  cross: `<path ${STROKE} d="M6 6l12 12M18 6 6 18"/>`,
  archive: `<path ${STROKE} d="M3 4h18v4H3zM5 8v11h14V8M10 12h4"/>`,
};

function svg(name, size) {
  return `<svg viewBox="0 0 24 24" width="${size}" height="${size}" aria-hidden="true">${PATHS[name]}</svg>`;
}

/** Another icon on an icon button, the same size (constant markup, never user text). */
export function setIcon(button, name) {
  const size = button.querySelector("svg")?.getAttribute("width") || 16;
  button.innerHTML = svg(name, size);
}

/** An icon-only button: the label is its accessible name and its tooltip. */
export function iconButton(name, label, size = 16) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "icon-button";
  button.dataset.action = name;
  button.setAttribute("aria-label", label);
  button.title = label;
  button.innerHTML = svg(name, size); // constant markup, never user text
  return button;
}

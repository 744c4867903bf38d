// Inside the sandboxed diagram frame (see chat/views/diagrams.py): draws the Mermaid source the chat
// page posts and answers with the SVG, sanitized by DOMPurify, or with why it could not. Sanitizing
// happens here because parsing an SVG's styles on the page would trip its policy. A classic script,
// not a module: the frame has an opaque origin, and modules would need CORS.
(() => {
  const { mermaid, DOMPurify } = globalThis;
  const PURIFY_SVG = {
    USE_PROFILES: { svg: true, svgFilters: true },
    ADD_TAGS: ["style"], // the diagram's own stylesheet, inside the image only
    FORBID_TAGS: ["foreignObject", "script", "a", "image", "use"],
    FORBID_ATTR: ["href", "xlink:href"],
  };
  let theme = null;

  /** The sanitized SVG as a standalone image: XML, sized by its viewBox (Mermaid says width="100%"). */
  function asImage(body) {
    const svg = body.querySelector("svg");
    if (!svg) throw new Error("the diagram could not be drawn");
    const [, , width, height] = (svg.getAttribute("viewBox") || "").split(/[\s,]+/).map(Number);
    if (width > 0 && height > 0) {
      svg.setAttribute("width", String(Math.ceil(width)));
      svg.setAttribute("height", String(Math.ceil(height)));
      svg.style.removeProperty("max-width");
    }
    return new XMLSerializer().serializeToString(svg);
  }

  window.addEventListener("message", async (event) => {
    if (event.source !== window.parent) return;
    const { id, source, dark } = event.data || {};
    if (typeof source !== "string") return;
    const wanted = dark ? "dark" : "default";
    if (theme !== wanted) {
      mermaid.initialize({
        startOnLoad: false,
        securityLevel: "strict", // labels are text: no HTML, no links, no click handlers
        htmlLabels: false, // SVG <text>, not <foreignObject>, which the page's image would drop
        flowchart: { htmlLabels: false },
        theme: wanted,
      });
      theme = wanted;
    }
    try {
      const { svg } = await mermaid.render(`diagram-${id}`, source);
      // Only the chat page can frame this page (frame-ancestors 'self'), so its parent is that page.
      const clean = asImage(DOMPurify.sanitize(svg, { ...PURIFY_SVG, RETURN_DOM: true }));
      window.parent.postMessage({ id, svg: clean }, "*");
    } catch (error) {
      // The parser's whole message (where, what it expected), not only its first line; bounded.
      window.parent.postMessage({ id, error: String(error?.message || error).slice(0, 2000) }, "*");
    }
  });
  window.parent.postMessage({ ready: true }, "*");
})();

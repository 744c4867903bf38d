// Translation for the page's modules: Django's JavaScript catalogue (/jsi18n/) defines
// gettext, ngettext and interpolate on the window; without it the text stays as written.

/** The translated text, with %(name)s filled from `values` when given. */
export function t(text, values) {
  const translated = globalThis.gettext ? globalThis.gettext(text) : text;
  return values ? fill(translated, values) : translated;
}

/** The singular or plural translation for `count`, with %(name)s filled from `values`. */
export function nt(singular, plural, count, values) {
  const translated = globalThis.ngettext
    ? globalThis.ngettext(singular, plural, count)
    : count === 1 ? singular : plural;
  return fill(translated, { count, ...values });
}

function fill(text, values) {
  return text.replace(/%\(([a-z_]+)\)s/g, (whole, name) => (name in values ? String(values[name]) : whole));
}

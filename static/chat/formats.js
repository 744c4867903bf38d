// Numbers, money, shares and dates in the page's language (<html lang>), through Intl: one decimal
// separator on a page, "0,00 $US" in French as "$0.00" in English.

export const LOCALE = globalThis.document?.documentElement.lang || "en-US";

const cache = new Map();
function formatter(options) {
  const key = JSON.stringify(options);
  if (!cache.has(key)) cache.set(key, new Intl.NumberFormat(LOCALE, options));
  return cache.get(key);
}

/** A count or measure: `digits` decimals exactly (0 by default). */
export function number(value, digits = 0) {
  return formatter({ minimumFractionDigits: digits, maximumFractionDigits: digits }).format(Number(value));
}

/** Dollars: `min` to `max` decimals. */
export function money(value, min = 2, max = min) {
  const options = { style: "currency", currency: "USD", minimumFractionDigits: min, maximumFractionDigits: max };
  return formatter(options).format(Number(value));
}

/** A share (0.333) as a percentage with `digits` decimals ("33.3%", "33,3 %"). */
export function percent(share, digits = 1) {
  return formatter({ style: "percent", minimumFractionDigits: digits, maximumFractionDigits: digits }).format(Number(share));
}

/** A duration: milliseconds under a second, else seconds with two decimals. */
export function duration(ms) {
  return ms < 1000 ? `${number(Math.round(ms))} ms` : `${number(ms / 1000, 2)} s`;
}

/** A date (and time) in the page's language. */
export function dateTime(value, options) {
  return new Date(value).toLocaleString(LOCALE, options);
}

export function date(value, options) {
  return new Date(value).toLocaleDateString(LOCALE, options);
}

const FORMATS = {
  count: (value) => number(value),
  decimal1: (value) => number(value, 1),
  usd: (value) => money(value, 4),
  // Whole cents, unless a sum under a dollar would read as $0.00 beside the rows it adds up.
  usd2: (value) => money(value, value !== 0 && Math.abs(value) < 1 ? 4 : 2),
  percent: (value) => percent(value, 1),
  ms: (value) => `${number(Math.round(value))} ms`,
};

/** Figures the server wrote (data-format, data-number: the raw value) written again in the page's language. */
export function localiseFigures(root = document) {
  for (const element of root.querySelectorAll("[data-format][data-number]")) {
    const format = FORMATS[element.dataset.format];
    const raw = element.dataset.number;
    if (format && raw !== "" && Number.isFinite(Number(raw))) element.textContent = format(Number(raw));
  }
}

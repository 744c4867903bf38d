// The sidebar's date groups (Today, Yesterday, Previous 7 days, Previous 30 days, then months),
// in the browser's time zone: a day starts at the reader's midnight, not the server's.
import { t } from "./i18n.js";

function daysBefore(now, days) {
  // Calendar arithmetic, not 24 h steps: a day around a DST change is 23 or 25 hours long.
  return new Date(now.getFullYear(), now.getMonth(), now.getDate() - days);
}

/** The group of a conversation last updated at `date`: { key, label, start } (start orders the groups). */
export function dateGroup(date, now = new Date()) {
  const named = [
    [0, "today", t("Today")],
    [1, "yesterday", t("Yesterday")],
    [7, "week", t("Previous 7 days")],
    [30, "month", t("Previous 30 days")],
  ];
  for (const [days, key, label] of named) {
    const start = daysBefore(now, days);
    if (date >= start) return { key, label, start: start.getTime() };
  }
  const start = new Date(date.getFullYear(), date.getMonth(), 1);
  const label = date.toLocaleDateString(document.documentElement.lang || undefined, { month: "long", year: "numeric" });
  return { key: `${date.getFullYear()}-${date.getMonth() + 1}`, label, start: start.getTime() };
}

// One Tab stop for the whole conversation list (a roving tabindex): Up and Down move between the
// rows (and folder headings), Home and End to the first and last, Left and Right between a row's
// title and its buttons. Tab leaves the list from wherever the focus is in it.

// The row heads: what Up and Down move between. A row's own buttons are reached with Left and Right.
const STOPS = "li[data-conversation-id] > a, .folder-toggle, .show-more, .archived-head .link-button";
const CONTROLS = "a, button";

function shown(element) {
  return element.offsetParent !== null && !element.closest("[hidden]");
}

/** The controls of one row (its title, then its buttons), the row a focused control belongs to. */
function rowOf(element) {
  return element.closest("li[data-conversation-id], .folder-head") || element;
}

function rowControls(row) {
  if (row.matches(CONTROLS)) return [row];
  return [...row.querySelectorAll(CONTROLS)].filter((control) => !control.closest(".row-menu") && shown(control));
}

export class RovingList {
  constructor(list) {
    this.list = list;
    this.current = null; // the stop that takes the Tab focus
    // Rows come and go (pages, searches, redraws): every change leaves one stop, once per task.
    this.pending = false;
    new MutationObserver(() => this.schedule()).observe(list, { childList: true, subtree: true });
    list.addEventListener("focusin", (event) => this.onFocus(event.target));
    list.addEventListener("keydown", (event) => this.onKey(event));
  }

  schedule() {
    if (this.pending) return;
    this.pending = true;
    queueMicrotask(() => {
      this.pending = false;
      this.sync();
    });
  }

  stops() {
    return [...this.list.querySelectorAll(STOPS)].filter(shown);
  }

  /** Every control out of the Tab order but one: the focused row's, else the open conversation's, else the first. */
  sync() {
    for (const control of this.list.querySelectorAll(CONTROLS)) {
      if (!control.closest(".row-menu")) control.tabIndex = -1;
    }
    const focused = this.list.contains(document.activeElement) ? document.activeElement : null;
    let stop = focused && !focused.closest(".row-menu") ? focused : null;
    if (!stop && this.current?.isConnected && this.list.contains(this.current) && shown(this.current)) stop = this.current;
    stop ??= this.list.querySelector("li.active > a[aria-current]");
    if (stop && !shown(stop)) stop = null;
    stop ??= this.stops()[0];
    if (stop) stop.tabIndex = 0;
    this.current = stop || null;
  }

  onFocus(target) {
    if (target.closest(".row-menu") || !target.matches(CONTROLS)) return;
    if (this.current && this.current !== target && this.current.isConnected) this.current.tabIndex = -1;
    target.tabIndex = 0;
    this.current = target;
  }

  onKey(event) {
    const target = event.target;
    if (target.closest(".row-menu") || event.altKey || event.ctrlKey || event.metaKey || !target.matches(CONTROLS)) return;
    const key = event.key;
    if (key === "ArrowDown" || key === "ArrowUp" || key === "Home" || key === "End") {
      const stops = this.stops();
      if (!stops.length) return;
      const head = rowControls(rowOf(target))[0] || target;
      const at = stops.indexOf(head);
      let next;
      if (key === "Home") next = stops[0];
      else if (key === "End") next = stops.at(-1);
      else if (key === "ArrowDown") next = stops[Math.min(stops.length - 1, at + 1)];
      else next = stops[Math.max(0, at - 1)];
      event.preventDefault();
      next?.focus();
      next?.scrollIntoView({ block: "nearest" });
    } else if (key === "ArrowRight" || key === "ArrowLeft") {
      const controls = rowControls(rowOf(target));
      const at = controls.indexOf(target);
      if (at < 0 || controls.length < 2) return;
      event.preventDefault();
      const step = key === "ArrowRight" ? 1 : -1;
      controls[(at + step + controls.length) % controls.length].focus();
    }
  }
}

// The usage dashboard: draws the two stacked bar charts and the people table from the page's JSON, sorts the tables,
// shows the custom range.
import "../vendor/chartjs/chart.umd.min.js"; // sets globalThis.Chart (UMD build: see refreshvendor.py)
import { localiseFigures, money as formatMoney, number, percent } from "./formats.js";
import { t } from "./i18n.js";

const Chart = globalThis.Chart;
// Twenty hues that stay apart on a white and on a near-black background.
const PALETTE = [
  "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
  "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
];

function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

// In the page's language, as localiseFigures() rewrites the server's figures.
const money = { format: (value) => formatMoney(value, 0, 4) };
const count = { format: (value) => number(value) };

function drawChart(canvas, days, series, format) {
  const models = Object.keys(series);
  const text = cssVar("--text");
  const muted = cssVar("--muted");
  const grid = cssVar("--border");
  return new Chart(canvas, {
    type: "bar",
    data: {
      labels: days.map((day) => day.slice(5)),
      datasets: models.map((model, n) => ({
        label: model,
        data: series[model],
        backgroundColor: PALETTE[n % PALETTE.length],
        borderWidth: 0,
      })),
    },
    options: {
      animation: false,
      maintainAspectRatio: false,
      interaction: { mode: "index", intersect: false },
      scales: {
        x: { stacked: true, ticks: { color: muted, maxRotation: 0, autoSkip: true }, grid: { display: false } },
        y: {
          stacked: true,
          beginAtZero: true,
          ticks: { color: muted, callback: (value) => format(value) },
          grid: { color: grid },
        },
      },
      plugins: {
        legend: { position: "bottom", labels: { color: text, boxWidth: 12, boxHeight: 12 } },
        tooltip: {
          filter: (item) => item.raw > 0,
          callbacks: {
            title: (items) => days[items[0].dataIndex],
            label: (item) => `${item.dataset.label}: ${format(item.raw)}`,
          },
        },
      },
    },
  });
}

function drawCharts(data) {
  for (const [id, series, format] of [
    ["cost-chart", data.cost, (v) => money.format(v)],
    ["tokens-chart", data.tokens, (v) => count.format(v)],
  ]) {
    const canvas = document.getElementById(id);
    if (!Object.keys(series).length) {
      const empty = document.createElement("p");
      empty.className = "chart-empty";
      empty.textContent = t("No usage in this period.");
      canvas.replaceWith(empty);
    } else {
      drawChart(canvas, data.days, series, format);
    }
  }
  document.documentElement.dataset.charts = "drawn";
}

function cell(row, text, value, numeric = true) {
  const td = row.insertCell();
  if (numeric) td.className = "num";
  td.dataset.value = value ?? "";
  if (text instanceof Node) td.append(text);
  else td.textContent = text;
}

// One row per person, in the order the server sorted them (by cost); names link to their own figures for staff.
function fillPeople(data) {
  const table = document.getElementById("people-table");
  if (!table || !data.people.length) return;
  const rows = data.people.map((person) => {
    const row = document.createElement("tr");
    row.dataset.user = person.user_id;
    let name = person.username;
    if (table.dataset.links) {
      const query = new URLSearchParams(window.location.search);
      query.set("user", person.user_id);
      name = document.createElement("a");
      name.href = `?${query}`;
      name.textContent = person.username;
    }
    cell(row, name, person.username, false);
    for (const column of ["requests", "prompt_tokens", "completion_tokens", "reasoning_tokens"]) {
      cell(row, count.format(person[column]), person[column]);
    }
    cell(row, formatMoney(person.cost, 4), person.cost);
    const share = person.budget_share;
    cell(row, share === null ? "–" : percent(share, 1), share);
    cell(row, person.last_active_shown, person.last_active, false);
    return row;
  });
  table.tBodies[0].replaceChildren(...rows);
}

function cellValue(row, column, numeric) {
  const raw = row.cells[column]?.dataset.value ?? "";
  if (!numeric) return raw.toLowerCase();
  return raw === "" ? -Infinity : Number(raw);
}

// Every column header becomes a button; a click sorts by it, a second click reverses.
function makeSortable(table) {
  const headers = [...table.tHead.rows[0].cells];
  const body = table.tBodies[0];
  if (body.rows.length < 2 || !body.rows[0].cells[1]) return;
  headers.forEach((header, column) => {
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = header.textContent;
    header.replaceChildren(button);
    button.addEventListener("click", () => {
      const numeric = header.dataset.type !== "text";
      const descending = header.getAttribute("aria-sort") !== "descending";
      for (const other of headers) other.removeAttribute("aria-sort");
      header.setAttribute("aria-sort", descending ? "descending" : "ascending");
      const rows = [...body.rows].sort((a, b) => {
        const x = cellValue(a, column, numeric);
        const y = cellValue(b, column, numeric);
        const order = x < y ? -1 : x > y ? 1 : 0;
        return descending ? -order : order;
      });
      body.append(...rows);
    });
  });
}

function customRange() {
  const period = document.getElementById("period");
  const range = document.getElementById("custom-range");
  const sync = () => {
    range.hidden = period.value !== "custom";
  };
  period.addEventListener("change", sync);
  sync();
}

customRange();
localiseFigures();
const figures = document.getElementById("usage-data");
const data = figures ? JSON.parse(figures.textContent) : null; // none when the filters were refused
if (data) fillPeople(data);
for (const table of document.querySelectorAll("table[data-sortable]")) makeSortable(table);
if (data) drawCharts(data);

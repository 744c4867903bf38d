// The usage dashboard: draws the two stacked bar charts from the page's JSON, sorts the tables, shows the custom range.
import "../vendor/chartjs/chart.umd.min.js"; // sets globalThis.Chart (UMD build: see refreshvendor.py)

const Chart = globalThis.Chart;
// Twenty hues that stay apart on a white and on a near-black background.
const PALETTE = [
  "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
  "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
];

function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

const money = new Intl.NumberFormat("en-US", { style: "currency", currency: "USD", maximumFractionDigits: 4 });
const count = new Intl.NumberFormat("en-US");

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

function drawCharts() {
  const element = document.getElementById("usage-data");
  if (!element) return;
  const data = JSON.parse(element.textContent);
  for (const [id, series, format] of [
    ["cost-chart", data.cost, (v) => money.format(v)],
    ["tokens-chart", data.tokens, (v) => count.format(v)],
  ]) {
    const canvas = document.getElementById(id);
    if (!Object.keys(series).length) {
      const empty = document.createElement("p");
      empty.className = "chart-empty";
      empty.textContent = "No usage in this period.";
      canvas.replaceWith(empty);
    } else {
      drawChart(canvas, data.days, series, format);
    }
  }
  document.documentElement.dataset.charts = "drawn";
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
for (const table of document.querySelectorAll("table[data-sortable]")) makeSortable(table);
drawCharts();

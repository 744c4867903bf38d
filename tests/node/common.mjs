// What every scenario script shares: the server's address and token from the environment, and one JSON
// line of results on stdout (tests/views/test_node_clients.py reads it), one entry per scenario.
export const baseURL = process.env.API_BASE_URL;
export const apiKey = process.env.API_TOKEN;
export const model = process.env.API_MODEL;
// [[reasoning:3]]: the fake upstream thinks first on every dialect; [[echo]]: it answers with the text.
export const THINK = "[[reasoning:3]] ";
export const WEATHER_SCHEMA = {
  type: "object",
  properties: { city: { type: "string" }, unit: { type: "string" } },
  required: ["city"],
};

const results = {};

// Runs one scenario; a failure is recorded with the client's message and status, and the next one still runs.
export async function scenario(name, run) {
  try {
    results[name] = { ok: true, ...(await run()) };
  } catch (error) {
    results[name] = {
      ok: false,
      error: String(error?.message ?? error),
      status: error?.status ?? error?.statusCode ?? null,
      body: error?.error ?? error?.responseBody ?? null,
    };
  }
}

export function report() {
  process.stdout.write(JSON.stringify(results) + "\n");
}

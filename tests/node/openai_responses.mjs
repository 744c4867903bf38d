// openai-node on /v1/responses: responses.create and responses.stream, two turns by previous_response_id
// and a two-step tool loop answering function calls with function_call_output items.
import OpenAI from "openai";
import { THINK, WEATHER_SCHEMA, apiKey, baseURL, model, report, scenario } from "./common.mjs";

const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 30000 });
const tools = [{ type: "function", name: "get_weather", description: "The weather in a city.", parameters: WEATHER_SCHEMA, strict: false }];

// finalResponse() has no output_text unless the request is auto-parseable (as with OpenAI itself): read the items.
const textOf = (response) => response.output
  .filter((item) => item.type === "message")
  .flatMap((item) => item.content.filter((part) => part.type === "output_text").map((part) => part.text))
  .join("");

async function ask(stream, body) {
  if (!stream) return client.responses.create(body);
  const running = client.responses.stream(body);
  const kinds = new Set();
  running.on("event", (event) => kinds.add(event.type));
  const final = await running.finalResponse();
  for (const kind of ["response.created", "response.output_text.delta", "response.completed"]) {
    if (!kinds.has(kind) && !(kind === "response.output_text.delta" && final.output.some((i) => i.type === "function_call"))) {
      throw new Error(`no ${kind} event`);
    }
  }
  return final;
}

for (const stream of [false, true]) {
  const suffix = stream ? "_stream" : "";
  await scenario(`two_turns${suffix}`, async () => {
    const first = await ask(stream, { model, input: `${THINK}[[echo]] first question`, instructions: "Be brief." });
    const second = await ask(stream, { model, input: `${THINK}[[echo]] second question`, previous_response_id: first.id });
    return {
      texts: [textOf(first), textOf(second)],
      reasoning: first.output.filter((item) => item.type === "reasoning").map((item) => item.summary[0]?.text ?? ""),
      usage: second.usage,
    };
  });
  await scenario(`tool_loop${suffix}`, async () => {
    const first = await ask(stream, { model, input: `${THINK}[[tools]] What is the weather in Paris and Tokyo?`, tools });
    const calls = first.output.filter((item) => item.type === "function_call");
    const outputs = calls.map((call) => ({
      type: "function_call_output", call_id: call.call_id, output: `sunny in ${JSON.parse(call.arguments).city}`,
    }));
    const second = await ask(stream, { model, input: outputs, tools, previous_response_id: first.id });
    return { calls: calls.map((call) => call.name), text: textOf(second) };
  });
}
report();

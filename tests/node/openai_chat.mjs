// openai-node on /v1/chat/completions: two turns and a two-step tool loop, with create() and with the
// .stream() helper's finalChatCompletion(), each reply appended to the history as the SDK gives it.
import OpenAI from "openai";
import { THINK, WEATHER_SCHEMA, apiKey, baseURL, model, report, scenario } from "./common.mjs";

const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 30000 });
const tools = [{ type: "function", function: { name: "get_weather", description: "The weather in a city.", parameters: WEATHER_SCHEMA } }];

async function ask(stream, body) {
  if (!stream) return client.chat.completions.create(body);
  const running = client.chat.completions.stream({ ...body, stream_options: { include_usage: true } });
  let deltas = "";
  running.on("content", (delta) => { deltas += delta; });
  const final = await running.finalChatCompletion();
  if (deltas !== (final.choices[0].message.content ?? "")) throw new Error(`content events ${deltas} != final`);
  return final;
}

for (const stream of [false, true]) {
  const suffix = stream ? "_stream" : "";
  await scenario(`two_turns${suffix}`, async () => {
    const messages = [{ role: "user", content: `${THINK}[[echo]] first question` }];
    const first = await ask(stream, { model, messages });
    messages.push(first.choices[0].message);
    messages.push({ role: "user", content: `${THINK}[[echo]] second question` });
    const second = await ask(stream, { model, messages });
    return { texts: [first.choices[0].message.content, second.choices[0].message.content], usage: second.usage ?? null };
  });
  await scenario(`tool_loop${suffix}`, async () => {
    const messages = [{ role: "user", content: `${THINK}[[tools]] What is the weather in Paris and Tokyo?` }];
    const first = await ask(stream, { model, messages, tools });
    const reply = first.choices[0].message;
    messages.push(reply);
    for (const call of reply.tool_calls ?? []) {
      const { city } = JSON.parse(call.function.arguments);
      messages.push({ role: "tool", tool_call_id: call.id, content: `sunny in ${city}` });
    }
    const second = await ask(stream, { model, messages, tools });
    return {
      finish: first.choices[0].finish_reason,
      calls: (reply.tool_calls ?? []).map((call) => call.function.name),
      text: second.choices[0].message.content,
    };
  });
}
report();

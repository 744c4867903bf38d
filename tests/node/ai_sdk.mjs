// The AI SDK: @ai-sdk/openai-compatible (chat completions) and @ai-sdk/openai's default model (the
// Responses API). Two turns with generateText and the response's messages appended, and a two-step
// tool loop with streamText (stopWhen: stepCountIs(2)) and generateText. API_PROVIDER picks the provider.
import { createOpenAI } from "@ai-sdk/openai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateText, jsonSchema, stepCountIs, streamText, tool } from "ai";
import { THINK, WEATHER_SCHEMA, apiKey, baseURL, model, report, scenario } from "./common.mjs";

const provider = process.env.API_PROVIDER === "responses"
  ? createOpenAI({ baseURL, apiKey })
  : createOpenAICompatible({ name: "team-chat", baseURL, apiKey, includeUsage: true });
const llm = provider(model);
const tools = {
  get_weather: tool({
    description: "The weather in a city.",
    inputSchema: jsonSchema(WEATHER_SCHEMA),
    execute: async ({ city }) => `sunny in ${city}`,
  }),
};
const common = { model: llm, maxRetries: 0 };

await scenario("two_turns", async () => {
  const messages = [{ role: "user", content: `${THINK}[[echo]] first question` }];
  const first = await generateText({ ...common, messages });
  messages.push(...first.response.messages);
  messages.push({ role: "user", content: `${THINK}[[echo]] second question` });
  const second = await generateText({ ...common, messages });
  return { texts: [first.text, second.text], reasoning: first.reasoningText ?? "", usage: second.usage };
});

await scenario("two_turns_stream", async () => {
  const messages = [{ role: "user", content: `${THINK}[[echo]] first question` }];
  const first = streamText({ ...common, messages });
  let reasoning = "";
  for await (const part of first.fullStream) {
    if (part.type === "reasoning-delta") reasoning += part.text;
    if (part.type === "error") throw part.error;
  }
  messages.push(...(await first.response).messages);
  messages.push({ role: "user", content: `${THINK}[[echo]] second question` });
  const second = streamText({ ...common, messages });
  return { texts: [await first.text, await second.text], reasoning, usage: await second.usage };
});

await scenario("tool_loop_stream", async () => {
  let failure = null;
  const result = streamText({
    ...common, tools, stopWhen: stepCountIs(2), onError: ({ error }) => { failure = error; },
    prompt: `${THINK}[[tools]] What is the weather in Paris and Tokyo?`,
  });
  const text = await result.text;
  if (failure) throw failure;
  const steps = await result.steps;
  return { steps: steps.length, calls: steps[0].toolCalls.map((call) => call.toolName), text };
});

await scenario("tool_loop", async () => {
  const result = await generateText({
    ...common, tools, stopWhen: stepCountIs(2), prompt: `${THINK}[[tools]] What is the weather in Paris and Tokyo?`,
  });
  return { steps: result.steps.length, calls: result.steps[0].toolCalls.map((call) => call.toolName), text: result.text };
});
report();

// The official OpenAI Node SDK against kvserve, unchanged user code:
//   node sdk_test.mjs http://127.0.0.1:PORT MODEL
// Exits non-zero (with the failed check) on any mismatch; prints "SDK OK".
import OpenAI from "openai";
import assert from "node:assert/strict";

const [url, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: url + "/v1", apiKey: "unused", maxRetries: 0, timeout: 60000 });

// Completions, not streamed, greedy, n = 2: both choices equal.
const c = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 24, temperature: 0, n: 2 });
assert.equal(c.object, "text_completion");
assert.equal(c.choices.length, 2);
assert.equal(c.choices[0].text, c.choices[1].text);
assert.ok(c.choices[0].text.length > 0);
assert.equal(c.usage.prompt_tokens > 0, true);
assert.equal(c.usage.completion_tokens <= 48, true);
assert.equal(typeof c.usage.prompt_tokens_details.cached_tokens, "number");

// Completions streamed: the chunks add up to the same greedy text.
const s = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 24, temperature: 0, stream: true });
let text = "";
let finish = null;
for await (const ch of s) {
  text += ch.choices[0]?.text ?? "";
  if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason;
}
assert.equal(text, c.choices[0].text);
assert.ok(finish === "stop" || finish === "length");

// Stop strings: the text ends before the stop string, finish_reason "stop".
const full = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 60, temperature: 0 });
const words = full.choices[0].text.split(" ").filter((w) => w.length > 2);
if (words.length > 3) {
  const stop = words[3];
  const cut = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 60, temperature: 0, stop: [stop] });
  assert.equal(cut.choices[0].finish_reason, "stop");
  assert.ok(!cut.choices[0].text.includes(stop), "stop string must not be in the text");
  assert.equal(cut.choices[0].text, full.choices[0].text.slice(0, full.choices[0].text.indexOf(stop)));
}

// Chat, not streamed and streamed (n = 2, seeded sampling).
const msgs = [{ role: "system", content: "You tell stories." }, { role: "user", content: "A story about a cat." }];
const chat = await client.chat.completions.create({ model, messages: msgs, max_tokens: 16, temperature: 0 });
assert.equal(chat.object, "chat.completion");
assert.equal(chat.choices[0].message.role, "assistant");
assert.equal(typeof chat.choices[0].message.content, "string");
const cs = await client.chat.completions.create({ model, messages: msgs, max_tokens: 16, temperature: 0.9, seed: 7, n: 2, stream: true,
  stream_options: { include_usage: true } });
const parts = ["", ""];
let usage = null;
for await (const ch of cs) {
  for (const choice of ch.choices) parts[choice.index] += choice.delta?.content ?? "";
  if (ch.usage) usage = ch.usage;
}
assert.ok(parts[0].length > 0 && parts[1].length > 0);
assert.ok(usage && usage.completion_tokens > 0);

// Logprobs (chat).
const lp = await client.chat.completions.create({ model, messages: msgs, max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 3 });
assert.equal(lp.choices[0].logprobs.content.length, lp.usage.completion_tokens);
assert.equal(lp.choices[0].logprobs.content[0].top_logprobs.length, 3);

// Errors surface as the SDK's typed errors.
await assert.rejects(client.completions.create({ model: "no-such-model", prompt: "x" }), (e) => e.status === 404);
await assert.rejects(client.completions.create({ model, prompt: "x", max_tokens: 100000 }),
  (e) => e.status === 400 && e.code === "context_length_exceeded");

const models = await client.models.list();
assert.equal(models.data[0].id, model);
console.log("SDK OK");

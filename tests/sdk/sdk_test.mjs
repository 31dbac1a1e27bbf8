// The official OpenAI Node SDK against kvserve, as user code calls it:
//   node sdk_test.mjs URL MODEL KEY QUOTA_KEY QUEUE_URL QUEUE_MODEL TOOLS_URL TOOLS_MODEL
// URL serves MODEL under --api-keys (KEY: a plain tenant, QUOTA_KEY: a
// tenant whose block quota no request fits); QUEUE_URL serves QUEUE_MODEL
// without keys, one sequence at a time and one waiting request at most;
// TOOLS_URL serves TOOLS_MODEL with a chat template that teaches tool calls
// (Qwen3's, Hermes format).
// Each check prints "ok <name>"; the first failure exits non-zero naming it.
// Prints "SDK OK" at the end.
import OpenAI from "openai";
import assert from "node:assert/strict";

const [url, model, key, quotaKey, queueUrl, queueModel, toolsUrl, toolsModel] = process.argv.slice(2);
const opts = { maxRetries: 0, timeout: 120000 };
const client = new OpenAI({ baseURL: url + "/v1", apiKey: key, ...opts });

async function check(name, fn) {
  try {
    await fn();
    console.log("ok " + name);
  } catch (e) {
    console.error("FAILED " + name + ": " + (e?.stack ?? e));
    process.exit(1);
  }
}

// Resolves to the SDK error a call rejects with.
async function apiError(promise) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIError, "expected an APIError, got " + e);
    return e;
  }
  assert.fail("the call succeeded");
}

async function metric(base, name) {
  const text = await (await fetch(base + "/metrics")).text();
  const line = text.split("\n").find((l) => l.startsWith(name + " "));
  return line === undefined ? NaN : Number(line.slice(name.length + 1));
}

// After abort() the SDK's stream ends (possibly after chunks it had already
// read) or throws an abort error; it must not keep going.
async function drainAborted(it) {
  for (let i = 0; i < 10000; ++i) {
    try {
      if ((await it.next()).done) return;
    } catch (e) {
      assert.ok(e instanceof OpenAI.APIUserAbortError || e?.name === "AbortError", "unexpected error: " + e);
      return;
    }
  }
  assert.fail("the stream went on after abort()");
}

async function waitFor(what, cond, ms = 20000) {
  const t0 = Date.now();
  while (!(await cond())) {
    if (Date.now() - t0 > ms) assert.fail("timed out waiting for " + what);
    await new Promise((r) => setTimeout(r, 20));
  }
}

const greedy = { model, temperature: 0, max_tokens: 24 };
const onceIds = [1, 403, 407, 261, 378]; // "Once upon a time" with BOS (stories260K)
let once = null;

await check("completions: string prompt, n", async () => {
  const c = await client.completions.create({ ...greedy, prompt: "Once upon a time", n: 2 });
  assert.equal(c.object, "text_completion");
  assert.equal(c.choices.length, 2);
  assert.deepEqual(c.choices.map((x) => x.index), [0, 1]);
  assert.equal(c.choices[0].text, c.choices[1].text);
  assert.ok(c.choices[0].text.length > 0);
  assert.equal(c.usage.prompt_tokens, onceIds.length);
  assert.equal(typeof c.usage.prompt_tokens_details.cached_tokens, "number");
  assert.equal(typeof c.system_fingerprint, "string");
  once = c;
});

await check("completions: token ids", async () => {
  const c = await client.completions.create({ ...greedy, prompt: onceIds });
  assert.equal(c.choices[0].text, once.choices[0].text);
  assert.equal(c.usage.prompt_tokens, onceIds.length);
});

await check("completions: list of strings x n, prompt-major indices", async () => {
  const other = await client.completions.create({ ...greedy, prompt: "The cat" });
  const c = await client.completions.create({ ...greedy, prompt: ["Once upon a time", "The cat"], n: 2 });
  assert.equal(c.choices.length, 4);
  const byIndex = [...c.choices].sort((a, b) => a.index - b.index);
  assert.deepEqual(byIndex.map((x) => x.index), [0, 1, 2, 3]);
  assert.equal(byIndex[0].text, once.choices[0].text);
  assert.equal(byIndex[1].text, once.choices[0].text);
  assert.equal(byIndex[2].text, other.choices[0].text);
  assert.equal(byIndex[3].text, other.choices[0].text);
  assert.equal(c.usage.prompt_tokens, once.usage.prompt_tokens + other.usage.prompt_tokens);
  // `once` had n = 2 already.
  assert.equal(c.usage.completion_tokens, once.usage.completion_tokens + 2 * other.usage.completion_tokens);
});

await check("completions: list of token-id lists", async () => {
  const c = await client.completions.create({ ...greedy, prompt: [onceIds, onceIds] });
  assert.equal(c.choices.length, 2);
  for (const ch of c.choices) assert.equal(ch.text, once.choices[0].text);
  assert.equal(c.usage.prompt_tokens, 2 * onceIds.length);
});

await check("completions: streamed, several prompts", async () => {
  const s = await client.completions.create({ ...greedy, prompt: ["Once upon a time", "The cat"], stream: true,
    stream_options: { include_usage: true } });
  const text = ["", ""];
  const finish = [null, null];
  let usage = null;
  for await (const ch of s) {
    for (const c of ch.choices) {
      text[c.index] += c.text;
      if (c.finish_reason) finish[c.index] = c.finish_reason;
    }
    if (ch.usage) usage = ch.usage;
  }
  assert.equal(text[0], once.choices[0].text);
  assert.ok(text[1].length > 0);
  assert.ok(finish.every((f) => f === "stop" || f === "length"), String(finish));
  assert.ok(usage.prompt_tokens > onceIds.length);
});

await check("completions: stop", async () => {
  const full = await client.completions.create({ ...greedy, prompt: "Once upon a time", max_tokens: 60 });
  const words = full.choices[0].text.split(" ").filter((w) => w.length > 2);
  assert.ok(words.length > 3, "the greedy text is too short to pick a stop string");
  const stop = words[3];
  const cut = await client.completions.create({ ...greedy, prompt: "Once upon a time", max_tokens: 60, stop: [stop] });
  assert.equal(cut.choices[0].finish_reason, "stop");
  assert.ok(!cut.choices[0].text.includes(stop), "stop string must not be in the text");
  assert.equal(cut.choices[0].text, full.choices[0].text.slice(0, full.choices[0].text.indexOf(stop)));
});

await check("completions: logprobs", async () => {
  const c = await client.completions.create({ ...greedy, prompt: "Once upon a time", max_tokens: 6, logprobs: 2 });
  const lp = c.choices[0].logprobs;
  assert.equal(lp.tokens.length, c.usage.completion_tokens);
  assert.equal(lp.token_logprobs.length, lp.tokens.length);
  assert.ok(lp.token_logprobs.every((x) => typeof x === "number" && x <= 0));
  assert.equal(Object.keys(lp.top_logprobs[0]).length, 2);
  assert.equal(lp.text_offset.length, lp.tokens.length);
});

await check("completions: echo", async () => {
  const c = await client.completions.create({ ...greedy, prompt: "Once upon a time", echo: true });
  assert.equal(c.choices[0].text, "Once upon a time" + once.choices[0].text);
  const s = await client.completions.create({ ...greedy, prompt: "Once upon a time", echo: true, stream: true });
  let text = "";
  for await (const ch of s) text += ch.choices[0]?.text ?? "";
  assert.equal(text, c.choices[0].text);
  // echo + logprobs (lm-eval-style scoring): the prompt's tokens lead the
  // arrays, the first with null logprob.
  const lp = await client.completions.create({ ...greedy, prompt: "Once upon a time", echo: true, logprobs: 1,
    max_tokens: 2 });
  const L = lp.choices[0].logprobs;
  assert.equal(L.tokens.length, lp.usage.prompt_tokens + lp.usage.completion_tokens);
  assert.equal(L.token_logprobs[0], null);
  assert.ok(L.token_logprobs.slice(1).every((x) => typeof x === "number" && x <= 0));
  assert.equal(L.top_logprobs[0], null);
});

await check("unknown and unsupported fields are 400 naming them", async () => {
  const e = await apiError(client.completions.create({ ...greedy, prompt: "x", temprature: 0.5 }));
  assert.equal(e.status, 400);
  assert.equal(e.param, "temprature");
  const t = await apiError(client.completions.create({ ...greedy, prompt: "x", suffix: "y" }));
  assert.equal(t.param, "suffix");
});

await check("penalties and logit_bias", async () => {
  const plain = await client.completions.create({ ...greedy, prompt: "Once upon a time", max_tokens: 64 });
  const pen = await client.completions.create({ ...greedy, prompt: "Once upon a time", max_tokens: 64,
    presence_penalty: 2, frequency_penalty: 2 });
  assert.notEqual(pen.choices[0].text, plain.choices[0].text);
  // Ban the first token of the greedy story (/tokenize of prompt + text,
  // past the prompt's own tokens, names it): it never appears.
  const ids = async (text) => (await (await fetch(`${url}/tokenize`, { method: "POST",
    headers: { Authorization: `Bearer ${key}` }, body: JSON.stringify({ content: text }) })).json()).tokens;
  const promptIds = await ids("Once upon a time");
  const gen = (await ids("Once upon a time" + plain.choices[0].text)).slice(promptIds.length);
  const first = gen[0];
  const banned = await client.completions.create({ ...greedy, prompt: "Once upon a time", max_tokens: 24,
    logit_bias: { [first]: -100 } });
  const after = (await ids("Once upon a time" + banned.choices[0].text)).slice(promptIds.length);
  assert.ok(after.length > 0);
  assert.ok(!after.includes(first), `${first} in ${banned.choices[0].text}`);
});

await check("completions: empty prompt starts from BOS", async () => {
  const c = await client.completions.create({ ...greedy, prompt: "", max_tokens: 4 });
  assert.equal(c.usage.prompt_tokens, 1);
});

const msgs = [{ role: "system", content: "You tell stories." }, { role: "user", content: "A story about a cat." }];

await check("chat: json_schema through the SDK's parse helper, 50 seeds at temperature 1", async () => {
  const schema = { type: "object",
    properties: { animal: { enum: ["cat", "dog", "bird"] }, age: { type: "integer" }, happy: { type: "boolean" },
      name: { type: "string", maxLength: 10 },
      friends: { type: "array", items: { type: "string", maxLength: 6 }, maxItems: 2 } },
    required: ["animal", "age", "happy", "name", "friends"], additionalProperties: false };
  for (let seed = 0; seed < 50; seed++) {
    // parse() throws on a length finish and JSON.parses the content.
    const c = await client.chat.completions.parse({ model, messages: msgs, temperature: 1, seed, max_tokens: 400,
      response_format: { type: "json_schema", json_schema: { name: "pet", strict: true, schema } } });
    const p = c.choices[0].message.parsed;
    assert.deepEqual(Object.keys(p), ["animal", "age", "happy", "name", "friends"], JSON.stringify(p));
    assert.ok(["cat", "dog", "bird"].includes(p.animal));
    assert.ok(Number.isInteger(p.age) && typeof p.happy === "boolean" && p.name.length <= 10);
    assert.ok(Array.isArray(p.friends) && p.friends.length <= 2);
  }
  // json_object bounds nothing (this model does not close its object
  // within max_tokens): every output is an object's start, and parses when
  // it stopped (test_engine_loop checks each is a prefix of valid JSON).
  for (let seed = 0; seed < 3; seed++) {
    const j = await client.chat.completions.create({ model, messages: msgs, temperature: 1, seed, max_tokens: 60,
      response_format: { type: "json_object" } });
    const text = j.choices[0].message.content;
    assert.ok(text.trimStart().startsWith("{"), text);
    if (j.choices[0].finish_reason === "stop") assert.equal(typeof JSON.parse(text), "object");
    else assert.equal(j.choices[0].finish_reason, "length");
  }
  const e = await apiError(client.chat.completions.create({ model, messages: msgs, response_format: { type: "json_schema",
    json_schema: { name: "x", schema: { type: "string", format: "email" } } } }));
  assert.equal(e.status, 400);
  assert.equal(e.param, "response_format");
});

await check("responses: created, streamed with the SDK's events, continued by previous_response_id", async () => {
  const r = await client.responses.create({ model, input: "Once upon a time", instructions: "Tell a story.",
    max_output_tokens: 12, temperature: 0 });
  assert.equal(r.object, "response");
  assert.ok(r.output_text.length > 0, JSON.stringify(r));
  const s = await client.responses.create({ model, input: "Once upon a time", instructions: "Tell a story.",
    max_output_tokens: 12, temperature: 0, stream: true });
  let text = "";
  let done = null;
  for await (const ev of s) {
    if (ev.type === "response.output_text.delta") text += ev.delta;
    if (ev.type === "response.completed" || ev.type === "response.incomplete") done = ev.response;
  }
  assert.ok(done);
  assert.equal(text, done.output[0].content[0].text);
  assert.equal(text, r.output_text);
  const c = await client.responses.create({ model, input: "And then?", previous_response_id: r.id,
    max_output_tokens: 6, temperature: 0 });
  assert.equal(c.previous_response_id, r.id);
  assert.ok(c.usage.input_tokens > r.usage.input_tokens);
});

await check("chat: refusal, fingerprint, logprobs", async () => {
  const c = await client.chat.completions.create({ model, messages: msgs, max_tokens: 4, temperature: 0, logprobs: true,
    top_logprobs: 3 });
  assert.equal(c.object, "chat.completion");
  assert.ok(c.system_fingerprint.startsWith("fp_"), c.system_fingerprint);
  const ch = c.choices[0];
  assert.equal(ch.message.role, "assistant");
  assert.equal(typeof ch.message.content, "string");
  assert.equal(ch.message.refusal, null);
  assert.equal(ch.logprobs.refusal, null);
  assert.equal(ch.logprobs.content.length, c.usage.completion_tokens);
  assert.equal(ch.logprobs.content[0].top_logprobs.length, 3);
});

await check("chat: streamed, n, include_usage, logprobs", async () => {
  const s = await client.chat.completions.create({ model, messages: msgs, max_tokens: 16, temperature: 0.9, seed: 7,
    n: 2, stream: true, stream_options: { include_usage: true }, logprobs: true, top_logprobs: 2 });
  const parts = ["", ""];
  const roles = [null, null];
  let usage = null, lpTokens = 0, chunks = 0;
  for await (const ch of s) {
    ++chunks;
    assert.ok(ch.system_fingerprint.startsWith("fp_"));
    for (const choice of ch.choices) {
      parts[choice.index] += choice.delta?.content ?? "";
      if (choice.delta?.role) roles[choice.index] = choice.delta.role;
      if (choice.logprobs) {
        assert.equal(choice.logprobs.refusal, null);
        lpTokens += choice.logprobs.content.length;
      }
    }
    if (ch.usage) usage = ch.usage;
  }
  assert.ok(chunks > 2);
  assert.deepEqual(roles, ["assistant", "assistant"]);
  assert.ok(parts[0].length > 0 && parts[1].length > 0);
  assert.ok(usage && usage.completion_tokens > 0);
  assert.equal(lpTokens, usage.completion_tokens);
});

await check("models.list", async () => {
  const models = await client.models.list();
  assert.equal(models.data[0].id, model);
  assert.ok(models.data[0].created > 1000000000, "created must be a unix time: " + models.data[0].created);
});

await check("400: bad request and context length", async () => {
  const e = await apiError(client.completions.create({ model, prompt: "x", temperature: 5 }));
  assert.ok(e instanceof OpenAI.BadRequestError);
  assert.equal(e.param, "temperature");
  const c = await apiError(client.completions.create({ model, prompt: "x", max_tokens: 100000 }));
  assert.equal(c.status, 400);
  assert.equal(c.code, "context_length_exceeded");
});

await check("401: invalid key; lowercase bearer works", async () => {
  const bad = new OpenAI({ baseURL: url + "/v1", apiKey: "not-a-key", ...opts });
  const e = await apiError(bad.completions.create({ model, prompt: "x", max_tokens: 1 }));
  assert.ok(e instanceof OpenAI.AuthenticationError);
  assert.equal(e.code, "invalid_api_key");
  assert.equal((await apiError(bad.models.list())).status, 401);
  const lower = new OpenAI({ baseURL: url + "/v1", apiKey: "unused", defaultHeaders: { Authorization: "bearer " + key },
    ...opts });
  const c = await lower.completions.create({ model, prompt: "x", max_tokens: 1 });
  assert.equal(c.choices.length, 1);
  assert.equal((await lower.models.list()).data[0].id, model);
});

await check("404: model not found", async () => {
  const e = await apiError(client.completions.create({ model: "no-such-model", prompt: "x" }));
  assert.ok(e instanceof OpenAI.NotFoundError);
  assert.equal(e.code, "model_not_found");
});

await check("429: tenant quota", async () => {
  const q = new OpenAI({ baseURL: url + "/v1", apiKey: quotaKey, ...opts });
  const e = await apiError(q.completions.create({ model, prompt: "Once upon a time", max_tokens: 200 }));
  assert.ok(e instanceof OpenAI.RateLimitError);
  assert.equal(e.code, "tenant_quota");
  assert.ok(Number(e.headers.get("retry-after")) >= 1);
});

// One sequence at a time and one waiting request: A runs, B waits, C is
// turned away. Aborting A and B mid-stream frees every block.
await check("429: queue full; abort mid-stream frees blocks", async () => {
  const qc = new OpenAI({ baseURL: queueUrl + "/v1", apiKey: "unused", ...opts });
  const long = { model: queueModel, prompt: "Once upon a time", max_tokens: 1800, ignore_eos: true, stream: true };
  const acA = new AbortController(), acB = new AbortController();
  const a = await qc.completions.create(long, { signal: acA.signal });
  const itA = a[Symbol.asyncIterator]();
  for (let i = 0; i < 3; ++i) assert.ok(!(await itA.next()).done);
  const b = qc.completions.create(long, { signal: acB.signal });  // its head comes with its first token
  await waitFor("B to queue", async () => (await metric(queueUrl, 'kvserve_queue_depth{class="interactive"}')) >= 1);
  const e = await apiError(qc.completions.create({ model: queueModel, prompt: "x", max_tokens: 1 }));
  assert.ok(e instanceof OpenAI.RateLimitError);
  assert.equal(e.code, "queue_full");
  assert.ok(Number(e.headers.get("retry-after")) >= 1);
  acA.abort();
  await drainAborted(itA);
  const bs = await b;  // admitted once A's blocks were freed
  const itB = bs[Symbol.asyncIterator]();
  assert.ok(!(await itB.next()).done);
  acB.abort();
  await drainAborted(itB);
  await waitFor("blocks to be freed", async () =>
    (await metric(queueUrl, "kvserve_kv_blocks_used")) === 0 && (await metric(queueUrl, "kvserve_running_requests")) === 0);
  assert.ok((await metric(queueUrl, "kvserve_client_disconnects_total")) >= 2);
  const ok = await qc.completions.create({ model: queueModel, prompt: "Once", max_tokens: 4 });
  assert.equal(ok.choices.length, 1);
  assert.equal(await metric(queueUrl, "kvserve_kv_blocks_used"), 0);
});

const tc = new OpenAI({ baseURL: toolsUrl + "/v1", apiKey: "none", ...opts });
const weather = {
  type: "function",
  function: {
    name: "get_weather", description: "The weather in a city",
    parameters: { type: "object", properties: { city: { type: "string", maxLength: 16 }, unit: { enum: ["c", "f"] } },
                  required: ["city", "unit"], additionalProperties: false },
  },
};
const clock = { type: "function", function: { name: "get_time", parameters: { type: "object",
  properties: { tz: { type: "string", maxLength: 8 } }, required: ["tz"] } } };
const ask = [{ role: "user", content: "What is the weather in Paris?" }];

function checkCalls(calls, names) {
  assert.ok(Array.isArray(calls) && calls.length >= 1, "no tool_calls");
  for (const c of calls) {
    assert.equal(c.type, "function");
    assert.ok(typeof c.id === "string" && c.id.length > 0);
    assert.ok(names.includes(c.function.name), c.function.name);
    const a = JSON.parse(c.function.arguments);
    if (c.function.name === "get_weather") {
      assert.equal(typeof a.city, "string");
      assert.ok(["c", "f"].includes(a.unit));
    } else {
      assert.equal(typeof a.tz, "string");
    }
  }
}

await check("tools: required, not streamed, over seeds", async () => {
  for (let seed = 0; seed < 10; ++seed) {
    const r = await tc.chat.completions.create({ model: toolsModel, messages: ask, tools: [weather, clock],
      tool_choice: "required", parallel_tool_calls: false, temperature: 1, seed, max_tokens: 120 });
    const ch = r.choices[0];
    assert.equal(ch.finish_reason, "tool_calls", JSON.stringify(ch));
    assert.equal(ch.message.tool_calls.length, 1);
    checkCalls(ch.message.tool_calls, ["get_weather", "get_time"]);
    assert.equal(ch.message.content, null);
  }
});

await check("tools: named, streamed, deltas assembled by the SDK", async () => {
  const stream = tc.chat.completions.stream({ model: toolsModel, messages: ask, tools: [weather, clock],
    tool_choice: { type: "function", function: { name: "get_weather" } }, temperature: 0.8, seed: 7, max_tokens: 120 });
  let deltas = 0;
  for await (const chunk of stream) if (chunk.choices[0]?.delta?.tool_calls) ++deltas;
  const done = await stream.finalChatCompletion();
  assert.ok(deltas >= 1);
  assert.equal(done.choices[0].finish_reason, "tool_calls");
  assert.equal(done.choices[0].message.tool_calls.length, 1);
  checkCalls(done.choices[0].message.tool_calls, ["get_weather"]);
});

await check("tools: auto, and a tool result back through the template", async () => {
  const r = await tc.chat.completions.create({ model: toolsModel, messages: ask, tools: [weather], temperature: 0,
    max_tokens: 8 });
  assert.ok(["stop", "length", "tool_calls"].includes(r.choices[0].finish_reason));
  const call = { id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris","unit":"c"}' } };
  const msgs = [...ask, { role: "assistant", content: null, tool_calls: [call] },
                { role: "tool", tool_call_id: "call_1", content: "18 C, sunny" }];
  const after = await tc.chat.completions.create({ model: toolsModel, messages: msgs, tools: [weather], max_tokens: 4 });
  assert.equal(after.choices.length, 1);
  const prompt = await (await fetch(toolsUrl + "/apply-template", { method: "POST",
    body: JSON.stringify({ messages: msgs, tools: [weather] }) })).json();
  assert.ok(prompt.prompt.includes("<tool_response>\n18 C, sunny\n</tool_response>"), prompt.prompt);
  assert.ok(prompt.prompt.includes('"arguments": {"city": "Paris", "unit": "c"}'), prompt.prompt);
  const e = await apiError(tc.chat.completions.create({ model: toolsModel, messages: ask, tools: [weather],
    tool_choice: "required", response_format: { type: "json_object" } }));
  assert.equal(e.param, "tool_choice");
  const plain = await apiError(client.chat.completions.create({ model, messages: ask, tools: [weather] }));
  assert.equal(plain.param, "tools");  // stories260K's plain template teaches no call format
});

await check("responses: function tools, streamed, and a function_call_output continued", async () => {
  const rtool = { type: "function", name: "get_weather", parameters: weather.function.parameters, strict: true };
  const r = await tc.responses.create({ model: toolsModel, input: "What is the weather in Paris?", tools: [rtool],
    tool_choice: "required", parallel_tool_calls: false, max_output_tokens: 120, temperature: 0.7, seed: 3 });
  const calls = r.output.filter((o) => o.type === "function_call");
  assert.equal(calls.length, 1, JSON.stringify(r.output));
  assert.equal(calls[0].name, "get_weather");
  assert.ok(["c", "f"].includes(JSON.parse(calls[0].arguments).unit));
  assert.equal(r.tool_choice, "required");
  const stream = await tc.responses.create({ model: toolsModel, input: "Weather?", tools: [rtool], stream: true,
    tool_choice: { type: "function", name: "get_weather" }, max_output_tokens: 120 });
  let args = "", done;
  for await (const ev of stream) {
    if (ev.type === "response.function_call_arguments.delta") args += ev.delta;
    if (ev.type === "response.completed") done = ev.response;
  }
  assert.ok(done, "no response.completed");
  const item = done.output.find((o) => o.type === "function_call");
  assert.equal(item.arguments, args);
  JSON.parse(args);
  const next = await tc.responses.create({ model: toolsModel, previous_response_id: r.id, tools: [rtool],
    input: [{ type: "function_call_output", call_id: calls[0].call_id, output: "18 C, sunny" }], max_output_tokens: 4 });
  assert.equal(next.previous_response_id, r.id);
  assert.equal(next.output[0].type, "message");
});

console.log("SDK OK");

// Times the picker's per-request steps in Node's V8 (the engine Envoy embeds):
//   node run.js <module.wasm> <body bytes>...
// prints one JSON line per body: {"body": n, "ns": {"parse": ..., "decide": ..., "request": ...}}.
const fs = require('fs');
const [wasmPath, ...sizes] = process.argv.slice(2);
const STEPS = ['parse', 'decide', 'request'];
const instance = new WebAssembly.Instance(new WebAssembly.Module(fs.readFileSync(wasmPath)), {});
const { setup, run, tick } = instance.exports;

// Best of several timed batches, after a warm-up long enough for V8 to optimize the hot code.
function nsPerCall(step, bodyBytes) {
  const n = Math.max(20, Math.min(20000, Math.floor(64e6 / bodyBytes)));
  run(step, n);
  let best = Infinity;
  for (let batch = 0; batch < 5; batch++) {
    const started = process.hrtime.bigint();
    const routed = run(step, n);
    const elapsed = Number(process.hrtime.bigint() - started);
    if (routed !== n) throw new Error(`step ${STEPS[step]} routed ${routed} of ${n}`);
    best = Math.min(best, elapsed / n);
  }
  return best;
}

for (const size of sizes.map(Number)) {
  if (setup(size) !== 1) throw new Error(`the picker does not route a ${size}-byte body`);
  const ns = {};
  STEPS.forEach((name, step) => { ns[name] = nsPerCall(step, size); });
  console.log(JSON.stringify({ body: size, ns }));
}

// The scraping VM's tick, each with its two scrapes' answers (a real vLLM 0.32 dump each).
{
  tick(200);
  let best = Infinity;
  for (let batch = 0; batch < 5; batch++) {
    const started = process.hrtime.bigint();
    const answered = tick(200);
    const elapsed = Number(process.hrtime.bigint() - started);
    if (answered === 0) throw new Error('the ticks scraped nothing');
    best = Math.min(best, elapsed / 200);
  }
  console.log(JSON.stringify({ tick_ns: best }));
}

// Runs a Rust test binary built for wasm32-wasip1 under Node's V8 (the engine family Envoy
// embeds), through Node's WASI: `node tests/wasm/run-wasi.mjs path/to/tests.wasm [args...]`.
// Exits with the test binary's exit code.
import { readFile } from "node:fs/promises";
import { WASI } from "node:wasi";
import { argv, env, exit } from "node:process";

const [file, ...args] = argv.slice(2);
const wasi = new WASI({ version: "preview1", args: [file, ...args], env, returnOnExit: true });
const module = await WebAssembly.compile(await readFile(file));
// The filter's proxy-wasm imports ("env") are linked but never called by the unit tests.
const hostOnly = new Proxy({}, {
  get: (_, name) => () => {
    throw new Error(`proxy-wasm host call ${String(name)} in a unit test`);
  },
});
const instance = await WebAssembly.instantiate(module, { ...wasi.getImportObject(), env: hostOnly });
// The filter's entry point (`_initialize`, for Envoy) is not the test harness's: run `_start`.
const { _initialize, ...exports } = instance.exports;
exit(wasi.start({ exports }));

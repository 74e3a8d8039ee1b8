// LiteRT.js plumbing shared by the demo page and the sweep harness: load the runtime once, compile a
// .tflite on an accelerator, run with Float32Array inputs, capture the delegate's partition report.
// LiteRT.js comes from the npm package served under /vendor/ (import map in the page), never a CDN.

let runtime = null; // {liteRt, variant, threads}
let wasmDir = '/vendor/@litertjs/core/wasm/'; // the static site serves it relative to the page (setWasmDir)
export function setWasmDir(dir) {
  wasmDir = dir;
}
const consoleLines = [];

// LiteRT prints its INFO/WARN lines through console.*; keep them to parse the partition report.
for (const level of ['log', 'info', 'warn', 'error', 'debug']) {
  const orig = console[level].bind(console);
  console[level] = (...args) => {
    try {
      consoleLines.push(args.map((a) => (typeof a === 'string' ? a : String(a))).join(' '));
    } catch (e) {
      /* unprintable argument: ignore */
    }
    orig(...args);
  };
}

export function consoleSince(mark) {
  return consoleLines.slice(mark);
}
export function consoleMark() {
  return consoleLines.length;
}

// variant: 'threads' (multi-threaded wasm, needs cross-origin isolation), 'jspi' (lets a WebGPU graph run
// its rejected ops on wasm), or 'plain'. Falls back to 'plain' when the browser lacks the feature.
export async function loadRuntime(variant = 'threads') {
  if (runtime) return runtime;
  const core = await import('@litertjs/core');
  const tries = variant === 'plain' ? ['plain'] : [variant, 'plain'];
  let lastError = null;
  for (const v of tries) {
    if (v === 'threads' && !(self.crossOriginIsolated && navigator.hardwareConcurrency > 1)) continue;
    try {
      const opts = v === 'threads' ? { threads: true } : v === 'jspi' ? { jspi: true } : {};
      const liteRt = await core.loadLiteRt(wasmDir, opts);
      runtime = { core, liteRt, variant: v, threads: v === 'threads' ? liteRt.liteRtWasm.getThreadCount?.() ?? null : 1 };
      return runtime;
    } catch (e) {
      lastError = e;
    }
  }
  throw lastError || new Error('LiteRT.js could not load');
}

// WebGPU adapter facts, or null when the browser has none.
export async function adapterInfo() {
  if (!navigator.gpu) return null;
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) return null;
  const info = adapter.info || {};
  return {
    vendor: info.vendor || '',
    architecture: info.architecture || '',
    device: info.device || '',
    description: info.description || '',
    isFallbackAdapter: Boolean(info.isFallbackAdapter ?? adapter.isFallbackAdapter),
    features: [...adapter.features].sort(),
  };
}

// "N operations will run on the GPU, and the remaining M operations will run on the CPU" (isFullyAccelerated
// is not trustworthy: it said true for partly delegated graphs).
export function parseDelegation(lines) {
  const report = [];
  let inList = false;
  for (const l of lines) {
    if (/not supported by GPU delegate/i.test(l)) {
      inList = true;
      report.push(l);
    } else if (inList && /^[A-Z][A-Z0-9_]*: /.test(l)) {
      report.push(l); // "RESHAPE: Tensor dimensions must be less than 5. ..."
    } else {
      inList = false;
      if (/operations will run on the GPU|Falling back|Partially delegating|not fully compiled/i.test(l)) report.push(l);
    }
  }
  let gpu = null;
  let cpu = null;
  for (const l of report) {
    const m = l.match(/(\d+)\s+operations? will run on the GPU,?\s+and the remaining\s+(\d+)\s+operations? will run on the CPU/i);
    if (m) {
      gpu = (gpu || 0) + Number(m[1]);
      cpu = (cpu || 0) + Number(m[2]);
    }
  }
  const fellBack = report.some((l) => /Falling back to WASM/i.test(l));
  const rejected = report.filter((l) => /^[A-Z][A-Z0-9_]*: /.test(l)).map((l) => l.slice(0, 200));
  return { gpu_ops: gpu, cpu_ops: cpu, whole_graph_fell_back: fellBack, rejected_ops: rejected, report: report.slice(0, 40) };
}

export async function compile(url, accelerator) {
  const { liteRt } = await loadRuntime();
  const model = await liteRt.loadAndCompile(url, { accelerator });
  if (accelerator === 'webgpu') watchDevice(liteRt.getWebGpuDevice());
  return model;
}

// Log a lost WebGPU device or an uncaptured WebGPU error into the console (the sweep keeps it as evidence):
// otherwise a lost device just yields zero-filled outputs.
const watched = new WeakSet();
export const gpuErrors = [];
function watchDevice(device) {
  if (!device || watched.has(device)) return;
  watched.add(device);
  device.lost.then((info) => {
    gpuErrors.push(`device lost: ${info.message}`);
    console.error(`WebGPU device lost (${info.reason}): ${info.message}`);
  });
  device.addEventListener('uncapturederror', (ev) => {
    gpuErrors.push(ev.error.message.split('\n')[0]);
    console.error(`WebGPU uncaptured error: ${ev.error.message}`);
  });
}

// Run with positional Float32Array inputs (shapes from the model) -> Float32Array outputs (copied out).
export async function runModel(model, arrays) {
  const { core } = runtime;
  const details = model.getInputDetails();
  const inputs = arrays.map((a, i) => new core.Tensor(a, Array.from(details[i].shape)));
  let outputs = [];
  try {
    outputs = await model.run(inputs);
    const result = [];
    for (const t of outputs) result.push((await t.data()).slice());
    return result;
  } finally {
    for (const t of inputs) t.delete();
    for (const t of outputs) t.delete();
  }
}

// Tensor names without converter decorations ("serving_default_x:0" -> "x").
export function cleanName(name) {
  return String(name).replace(/^serving_default_/, '').replace(/:0$/, '');
}

// Arrays in the model's input order: by name when every model input is in `named`, else `fallback` order.
export function orderInputs(model, named, fallback) {
  const names = model.getInputDetails().map((d) => cleanName(d.name));
  if (names.every((n) => n in named)) return names.map((n) => named[n]);
  return fallback.map((n) => named[n]);
}

// Outputs keyed by name: the model's names when they are the expected ones, else `fallback` order.
export function nameOutputs(model, outs, expected, fallback) {
  const names = model.getOutputDetails().map((d) => cleanName(d.name));
  const use = expected.every((n) => names.includes(n)) ? names : fallback;
  return Object.fromEntries(use.map((n, i) => [n, outs[i]]));
}

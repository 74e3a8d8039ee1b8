// Browser sweep harness (driven by `sam2edge sweep`): compile one .tflite with LiteRT.js on one accelerator,
// run it on the inputs the Python side wrote, time it, and hand back outputs + the delegate's report.
// Query: model=URL, inputs=URL of inputs.json, accel=wasm|webgpu, runs=N, warmup=N.
// Result in window.sweepResult: {ok, stage, error, compile_ms, run_ms[], outputs[{name, shape, b64}], ...}.
import * as lrt from './litert.js';

const q = new URLSearchParams(location.search);

function b64(f32) {
  const bytes = new Uint8Array(f32.buffer, f32.byteOffset, f32.byteLength);
  let s = '';
  const chunk = 0x8000;
  for (let i = 0; i < bytes.length; i += chunk) s += String.fromCharCode.apply(null, bytes.subarray(i, i + chunk));
  return btoa(s);
}

async function main() {
  if (!q.get('model')) {
    window.sweepResult = { idle: true };
    return;
  }
  const accel = q.get('accel') || 'wasm';
  const runs = Number(q.get('runs') || 5);
  const warmup = Number(q.get('warmup') || 1);
  const result = { ok: false, stage: 'runtime', accelerator: accel, user_agent: navigator.userAgent };
  window.sweepResult = null;
  const mark = lrt.consoleMark();
  window.sweepConsole = () => lrt.consoleSince(mark).slice(-40);
  try {
    result.adapter = await lrt.adapterInfo();
    if (accel === 'webgpu' && !result.adapter) throw new Error('no WebGPU adapter in this browser');
    // jspi lets LiteRT.js run a partly delegated WebGPU graph (rejected ops on wasm); threads for wasm.
    const rt = await lrt.loadRuntime(accel === 'webgpu' ? 'jspi' : 'threads');
    result.runtime_variant = rt.variant;
    result.threads = rt.threads;
    result.cross_origin_isolated = self.crossOriginIsolated;
    result.stage = 'inputs';
    const spec = await (await fetch(q.get('inputs'))).json();
    const arrays = [];
    for (const inp of spec.inputs) arrays.push(new Float32Array(await (await fetch(inp.url)).arrayBuffer()));
    result.stage = 'compile';
    let t = performance.now();
    const model = await lrt.compile(q.get('model'), accel);
    result.compile_ms = performance.now() - t;
    result.is_fully_accelerated_claim = model.isFullyAccelerated;
    result.input_details = model.getInputDetails().map((d) => ({ name: d.name, shape: Array.from(d.shape), dtype: d.dtype }));
    const named = Object.fromEntries(spec.inputs.map((inp, i) => [inp.name, arrays[i]]));
    const ordered = lrt.orderInputs(model, named, spec.inputs.map((inp) => inp.name));
    const outDetails = model.getOutputDetails().map((d) => ({ name: d.name, shape: Array.from(d.shape), dtype: d.dtype }));
    result.output_details = outDetails;
    result.stage = 'run';
    let outs = null;
    result.run_ms = [];
    for (let i = 0; i < warmup + runs; i++) {
      t = performance.now();
      outs = await lrt.runModel(model, ordered); // includes the copy of every output back to the page
      const ms = performance.now() - t;
      if (i >= warmup) result.run_ms.push(ms);
      if (i === 0) result.first_run_ms = ms;
    }
    result.outputs = outs.map((o, i) => ({ name: lrt.cleanName(outDetails[i].name), shape: outDetails[i].shape, b64: b64(o) }));
    model.delete();
    result.ok = true;
  } catch (e) {
    result.error = String((e && (e.stack || e.message)) || e).slice(0, 2000);
  }
  result.console = lrt.consoleSince(mark).slice(0, 400);
  result.delegation = lrt.parseDelegation(result.console);
  window.sweepResult = result;
}

main();

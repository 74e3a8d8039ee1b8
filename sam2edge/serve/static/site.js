// The static site's page: every model stage in the browser with LiteRT.js. config.json (written by
// `sam2edge web`) names the graphs; each model file is checked against model/manifest.json (SHA-256, Web
// Crypto) before it is compiled. Photo -> preprocessing here (RGB /255, bilinear antialiased resize to S x S as
// torchvision, ImageNet mean/std) -> encoder -> decoder per tap.
import { adapterInfo, loadRuntime, nameOutputs, orderInputs, runModel, setWasmDir } from './litert.js';
import { chooseMask, encodePoints, noMaskDense, promptLayout, upsampleMask } from './sam.js';
import { setUpLive } from './camera.js';
import { FramePipeline } from './pipeline.js';
import { preprocess } from './encoder.js'; // runtime.preprocess.preprocess, shared with the serve page

const $ = (id) => document.getElementById(id);
const state = { ready: false, busy: false, image: null, error: null, decodes: 0, runtime: null, lastMask: null };
window.sam2edge = state;

function setStatus(text, isError = false) {
  $('status').textContent = text;
  $('status').classList.toggle('error', isError);
  if (isError) state.error = text;
  state.statusCount = (state.statusCount || 0) + 1;
}

async function sha256Hex(bytes) {
  const digest = new Uint8Array(await crypto.subtle.digest('SHA-256', bytes));
  return Array.from(digest, (b) => b.toString(16).padStart(2, '0')).join('');
}

// The bytes of a model file, refused (Error naming it) when they differ from the manifest's SHA-256.
async function verifiedBytes(url, manifest) {
  const name = url.replace(/^model\//, '');
  const entry = manifest[name];
  if (!entry) throw new Error(`model file ${name} is not in model/manifest.json; rebuild the site with sam2edge web`);
  const res = await fetch(url);
  if (!res.ok) throw new Error(`model file ${name} failed to load (HTTP ${res.status}); rebuild the site with sam2edge web`);
  const bytes = new Uint8Array(await res.arrayBuffer());
  const hex = await sha256Hex(bytes);
  if (hex !== entry.sha256) {
    throw new Error(`model file ${name} fails its SHA-256 check (modified or corrupt); refused. Rebuild the site with sam2edge web`);
  }
  return bytes;
}

// The tracking graphs (a --video bundle), compiled on first use with each file's SHA-256 checked; one promise
// per page, retried after a failure.
let pipeline = null;
function loadPipeline(onStatus) {
  if (!state.ready) return Promise.reject(new Error(`the page did not load its models (${state.error || 'still loading'}); reload it`));
  if (!pipeline) {
    const { rt, manifest } = state.loaded;
    const compile = async (url) => rt.liteRt.loadAndCompile(await verifiedBytes(url, manifest), { accelerator: state.runtime.accelerator });
    const fetchF32 = async (url) => new Float32Array((await verifiedBytes(url, manifest)).buffer);
    pipeline = FramePipeline.load(state.cfg, state.encoder, compile, fetchF32, onStatus).catch((e) => {
      pipeline = null;
      throw e;
    });
  }
  return pipeline;
}

async function chooseAccelerator() {
  const asked = new URLSearchParams(location.search).get('accel');
  if (asked === 'wasm' || asked === 'webgpu') return asked;
  const info = await adapterInfo().catch(() => null);
  return info && !info.isFallbackAdapter ? 'webgpu' : 'wasm';
}

// The photo graphs (encoder, decoder, prompt tables) of config entry `cfg`, each file's SHA-256 checked.
async function loadGraphs(cfg, rt, manifest, accel) {
  const compile = async (url) => rt.liteRt.loadAndCompile(await verifiedBytes(url, manifest), { accelerator: accel });
  state.encoder = await compile(cfg.encoder.url);
  state.decoder = await compile(cfg.decoder.url);
  state.tables = {};
  for (const [k, url] of Object.entries(cfg.decoder.tables)) {
    state.tables[k] = new Float32Array((await verifiedBytes(url, manifest)).buffer);
  }
  state.numTokens = state.decoder.getInputDetails().find((d) => /sparse_valid/.test(d.name))?.shape[1] ?? 8;
}

// The picker: another model resolution (config.json `models`, one bundle each). Live tracking stops, the graphs
// of that resolution load (hash-checked), tracking starts again from no objects on the same source.
async function switchResolution(res) {
  const entry = state.base.models && state.base.models[String(res)];
  if (!entry || !state.ready || res === state.cfg.resolution) return;
  const source = state.live.running ? state.live.session : null;
  if (source) state.live.stop();
  state.ready = false;
  pipeline = null; // the tracking graphs of the old resolution are dropped; loadPipeline compiles the new ones
  setStatus(`loading the ${res} px model…`);
  try {
    state.cfg = { ...state.base, ...entry };
    await loadGraphs(state.cfg, state.loaded.rt, state.loaded.manifest, state.runtime.accelerator);
    state.ready = true;
    state.switches = (state.switches || 0) + 1;
    document.body.dataset.resolution = String(res);
    const photo = state.photoFile;
    if (photo && state.image && !source) await openPhoto(photo);
    if (source) await state.live.restart(source);
    const then = source ? 'tracking restarted with no objects: tap the object again' : 'tap to segment';
    setStatus(`model resolution ${res} px: graphs reloaded, tracking reset · ${then}`);
  } catch (e) {
    setStatus(`the ${res} px model failed to load: ${e.message}; pick another resolution or reload the page`, true);
  }
}

async function init() {
  const cfg = await (await fetch('config.json')).json();
  const manifest = (await (await fetch(cfg.manifest)).json()).files;
  state.cfg = cfg;
  state.base = cfg;
  setUpLive(state, setStatus, loadPipeline, switchResolution);
  setWasmDir(new URL('vendor/@litertjs/core/wasm/', location.href).href);
  const rt = await loadRuntime('threads');
  const accel = await chooseAccelerator();
  const threads =
    rt.variant === 'threads'
      ? `wasm with ${rt.threads ?? '?'} threads`
      : 'single-threaded wasm: the host does not send the COOP/COEP headers (see README.md)';
  state.runtime = { variant: rt.variant, threads: rt.threads, accelerator: accel };
  $('runtime-status').textContent = `LiteRT.js ${cfg.litertjs} · ${accel} · ${threads} · all stages in the page`;
  await loadGraphs(cfg, rt, manifest, accel);
  state.loaded = { rt, manifest };
  state.ready = true;
  document.body.dataset.resolution = String(cfg.resolution);
  const track = cfg.tracker
    ? 'or press Camera / open a video to track'
    : `tracking needs a bundle exported with --video (${cfg.tracker_note})`;
  setStatus(`ready: open a photo · ${cfg.bundle} ${cfg.resolution}px · ${track}`);
}

async function openPhoto(file) {
  state.busy = true;
  state.photoFile = file;
  try {
    const bmp = await createImageBitmap(file);
    const c = $('photo-layer');
    c.width = bmp.width;
    c.height = bmp.height;
    const ctx = c.getContext('2d');
    ctx.drawImage(bmp, 0, 0);
    const { data } = ctx.getImageData(0, 0, c.width, c.height);
    const s = state.cfg.resolution;
    const t0 = performance.now();
    const outs = await runModel(state.encoder, [preprocess(data, c.width, c.height, s)]);
    const named = nameOutputs(state.encoder, outs, state.cfg.encoder.outputs, state.cfg.encoder.outputs);
    state.image = { w: c.width, h: c.height, feats: named, points: [], box: null };
    $('mask-layer').width = c.width;
    $('mask-layer').height = c.height;
    $('clear').disabled = false;
    setStatus(`${c.width}x${c.height} photo · encoder (page) ${(performance.now() - t0).toFixed(0)} ms`);
  } catch (e) {
    setStatus(`cannot open this photo: ${e.message}; pick a PNG or JPEG`, true);
  } finally {
    state.busy = false;
  }
}

async function decode() {
  const im = state.image;
  const s = state.cfg.resolution;
  const e = s / 16;
  const { coords, labels } = promptLayout(im.points, im.box, im.w, im.h, s);
  const { tokens, valid } = encodePoints(coords, labels, state.tables, s, state.numTokens);
  const named = { ...im.feats, sparse_prompt: tokens, sparse_valid: valid, dense_prompt: noMaskDense(state.tables, e) };
  const t0 = performance.now();
  const outs = await runModel(state.decoder, orderInputs(state.decoder, named, state.cfg.decoder.inputs));
  const out = nameOutputs(state.decoder, outs, state.cfg.decoder.outputs, state.cfg.decoder.outputs);
  const multimask = im.points.length === 1 && !im.box;
  const { logits } = chooseMask(out, 4 * e, multimask);
  const mask = upsampleMask(logits, 4 * e, im.h, im.w);
  state.lastMask = mask;
  const ctx = $('mask-layer').getContext('2d');
  const img = ctx.createImageData(im.w, im.h);
  for (let i = 0; i < mask.length; i++) if (mask[i]) img.data.set([30, 144, 255, 120], 4 * i);
  ctx.putImageData(img, 0, 0);
  state.decodes += 1;
  document.body.dataset.decodes = String(state.decodes);
  $('latency').textContent = `decoder (page) ${(performance.now() - t0).toFixed(1)} ms`;
}

function photoXY(ev) {
  const r = $('mask-layer').getBoundingClientRect();
  return { x: ((ev.clientX - r.left) / r.width) * state.image.w, y: ((ev.clientY - r.top) / r.height) * state.image.h };
}

function wire() {
  $('file').addEventListener('change', (ev) => ev.target.files[0] && openPhoto(ev.target.files[0]));
  $('clear').addEventListener('click', () => {
    if (!state.image) return;
    state.image.points = [];
    state.image.box = null;
    $('mask-layer').getContext('2d').clearRect(0, 0, state.image.w, state.image.h);
  });
  const layer = $('mask-layer');
  let down = null;
  layer.addEventListener('contextmenu', (ev) => ev.preventDefault());
  layer.addEventListener('mousedown', (ev) => {
    if (state.image && state.ready) down = { ...photoXY(ev), button: ev.button, alt: ev.altKey };
  });
  layer.addEventListener('mouseup', (ev) => {
    if (!down || state.busy) return;
    const up = photoXY(ev);
    const start = down;
    down = null;
    const dragged = Math.hypot(up.x - start.x, up.y - start.y) > 5 && start.button === 0;
    if (dragged) {
      state.image.box = { x0: Math.min(start.x, up.x), y0: Math.min(start.y, up.y), x1: Math.max(start.x, up.x), y1: Math.max(start.y, up.y) };
    } else {
      state.image.points.push({ x: up.x, y: up.y, label: start.button === 2 || start.alt ? 0 : 1 });
    }
    state.busy = true;
    decode()
      .catch((e) => setStatus(`the decoder failed: ${e.message}; press Clear and try again`, true))
      .finally(() => {
        state.busy = false;
      });
  });
}

wire();
init().catch((e) => setStatus(e.message, true));

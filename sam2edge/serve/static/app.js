// The tap-to-segment page: photo -> encoder (once) -> decoder per tap, both in the browser (LiteRT.js); the server
// encodes or decodes only as the fallback (a bundle without those LiteRT graphs, a browser that cannot run them).
// The page says where each runs. Query options: ?accel=wasm|webgpu, ?encode=server (the server's encoder),
// ?decoder=server (the server's decoder, and then its encoder too).
import * as lrt from './litert.js';
import { encodeImage, preprocess } from './encoder.js';
import { setUpEverything } from './everything.js';
import { setUpTracking } from './track.js';
import { chooseMask, encodePoints, noMaskDense, promptLayout, upsampleMask } from './sam.js';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const LOGICAL_OUT = ['masks', 'iou_scores', 'single_mask', 'single_iou', 'object_score'];

const state = {
  info: null,
  session: null,
  image: null, // {id, width, height, features: {image_embed, feat_s0, feat_s1}: Float32Array}
  points: [], // [{x, y, label}] photo pixels
  box: null, // {x0, y0, x1, y1} photo pixels
  history: [], // snapshots for undo
  mask: null, // Uint8Array h*w of the drawn mask
  decoder: null, // {where: 'browser'|'server', model, accelerator, tables, numTokens, dense}
  encoder: null, // {where: 'browser'|'server', model, accelerator, inputs, outputs | reason}
  busy: false,
  lastDecode: null,
};
window.sam2edge = state; // for tests and curious users

function setStatus(text, isError = false) {
  $('status').textContent = text;
  $('status').classList.toggle('error', isError);
}

async function api(path, opts = {}) {
  const headers = { ...(opts.headers || {}) };
  if (state.session) headers['X-Session'] = state.session;
  const res = await fetch(path, { ...opts, headers });
  if (!res.ok) {
    let msg = `${res.status} ${res.statusText}`;
    try {
      msg = (await res.json()).error || msg;
    } catch (e) {
      /* not JSON */
    }
    throw new Error(msg);
  }
  return res;
}

async function fetchF32(url) {
  const res = await fetch(url);
  if (!res.ok) throw new Error(`${url.split('/').pop()} failed to load (HTTP ${res.status})`);
  return new Float32Array(await res.arrayBuffer());
}

// ---- decoder set-up -------------------------------------------------------------------------------
async function setUpDecoder() {
  const info = state.info;
  const why = [];
  if (params.get('decoder') === 'server') why.push('forced by ?decoder=server');
  if (!info.decoder) why.push(info.decoder_note || 'the bundle has no browser decoder');
  if (!why.length) {
    try {
      let accel = params.get('accel');
      const adapter = await lrt.adapterInfo();
      if (!accel) accel = adapter && !adapter.isFallbackAdapter ? 'webgpu' : 'wasm';
      if (accel === 'webgpu' && !adapter) throw new Error('WebGPU was asked for but the browser has no adapter');
      const rt = await lrt.loadRuntime(accel === 'webgpu' ? 'jspi' : 'threads');
      const model = await lrt.compile(info.decoder.url, accel);
      const tables = {};
      for (const [k, url] of Object.entries(info.decoder.tables)) tables[k] = await fetchF32(url);
      const details = model.getInputDetails();
      const byName = details.find((dt) => lrt.cleanName(dt.name) === 'sparse_prompt');
      const numTokens = (byName || details[info.decoder.inputs.indexOf('sparse_prompt')]).shape[1];
      state.decoder = {
        where: 'browser', model, accelerator: accel, tables, numTokens,
        dense: noMaskDense(tables, info.embed_size), runtime: rt.variant, threads: rt.threads, adapter,
      };
      $('decoder-status').textContent =
        `decoder: in this browser · LiteRT.js ${info.litertjs_version} · ${accel}` +
        (accel === 'wasm' ? ` (${rt.variant === 'threads' ? `${rt.threads} threads` : 'single thread'})` : '') +
        ` · ${numTokens} prompt slots`;
      return;
    } catch (e) {
      why.push(`LiteRT.js could not run the decoder here: ${e.message || e}`);
    }
  }
  state.decoder = { where: 'server', numTokens: info.server_prompt_slots, reason: why.join('; ') };
  $('decoder-status').textContent = `decoder: on the server (fallback: ${state.decoder.reason})`;
}

// The image encoder in the page, on the decoder's accelerator (wasm when WebGPU refuses it); else the server's.
async function setUpEncoder() {
  const info = state.info;
  const why = [];
  if (params.get('encode') === 'server') why.push('forced by ?encode=server');
  if (!info.encoder) why.push(info.encoder_note || 'the bundle has no LiteRT encoder');
  if (state.decoder.where !== 'browser') why.push('the decoder runs on the server');
  if (!why.length) {
    let accel = state.decoder.accelerator;
    try {
      let model;
      try {
        model = await lrt.compile(info.encoder.url, accel);
      } catch (e) {
        if (accel === 'wasm') throw e;
        accel = 'wasm'; // the WebGPU delegate refused it
        model = await lrt.compile(info.encoder.url, accel);
      }
      state.encoder = { where: 'browser', model, accelerator: accel, inputs: info.encoder.inputs, outputs: info.encoder.outputs };
      $('encoder-status').textContent = `encoder: in this browser · ${accel}`;
      return;
    } catch (e) {
      why.push(`LiteRT.js could not run the encoder here: ${e.message || e}`);
    }
  }
  state.encoder = { where: 'server', reason: why.join('; ') };
  $('encoder-status').textContent = `encoder: on the server (fallback: ${state.encoder.reason})`;
}

// The photo the server holds (its PNG: orientation applied, alpha over white) -> features, encoded here.
async function encodeHere(photoBlob, meta) {
  const bmp = await createImageBitmap(photoBlob, { premultiplyAlpha: 'none', colorSpaceConversion: 'none' });
  const c = document.createElement('canvas');
  c.width = bmp.width;
  c.height = bmp.height;
  const ctx = c.getContext('2d', { willReadFrequently: true });
  ctx.drawImage(bmp, 0, 0);
  const { data } = ctx.getImageData(0, 0, c.width, c.height);
  const t0 = performance.now();
  const x = preprocess(data, meta.width, meta.height, state.info.resolution);
  const errorsBefore = lrt.gpuErrors.length;
  let out = await encodeImage(state.encoder, x);
  if (lrt.gpuErrors.length > errorsBefore) {
    // WebGPU failed: its outputs are zeros, not features; the encoder moves to wasm
    state.encoder.model = await lrt.compile(state.info.encoder.url, 'wasm');
    state.encoder.accelerator = 'wasm';
    $('encoder-status').textContent = `encoder: in this browser · wasm (WebGPU failed here: ${lrt.gpuErrors[errorsBefore]})`;
    out = await encodeImage(state.encoder, x);
  }
  state.lastEncode = { ms: performance.now() - t0, where: 'browser', accelerator: state.encoder.accelerator };
  return { image_embed: out.image_embeddings, feat_s0: out.feat_s0, feat_s1: out.feat_s1 };
}

async function serverFeatures(meta) {
  const featBuf = await (await api(`/api/images/${meta.id}/features.bin`)).arrayBuffer();
  const features = {};
  let offset = 0;
  for (const k of ['image_embed', 'feat_s0', 'feat_s1']) {
    const n = meta.features[k].reduce((a, b) => a * b, 1);
    features[k] = new Float32Array(featBuf, offset * 4, n);
    offset += n;
  }
  state.lastEncode = { ms: meta.encode_ms, where: 'server' };
  return features;
}

// ---- photos ---------------------------------------------------------------------------------------
async function openPhoto(body, sample) {
  if (state.busy) return;
  state.busy = true;
  setStatus(sample ? `encoding ${sample}…` : 'uploading and encoding…');
  try {
    const [kind, name] = sample && sample.startsWith('stored:') ? ['stored', sample.slice(7)] : ['sample', sample];
    const here = state.encoder.where === 'browser';
    const query = [sample ? `${kind}=${encodeURIComponent(name)}` : '', here ? 'encode=page' : ''].filter(Boolean);
    const url = `/api/images${query.length ? `?${query.join('&')}` : ''}`;
    const meta = await (await api(url, { method: 'POST', body: body || '' })).json();
    const photoBlob = await (await api(`/api/images/${meta.id}/photo.png`)).blob();
    const features = meta.features ? await serverFeatures(meta) : await encodeHere(photoBlob, meta);
    const img = $('photo');
    const loaded = new Promise((resolve, reject) => {
      img.onload = resolve;
      img.onerror = () => reject(new Error('the photo could not be displayed'));
    });
    if (img.src) URL.revokeObjectURL(img.src);
    img.src = URL.createObjectURL(photoBlob);
    await loaded;
    state.image = { id: meta.id, width: meta.width, height: meta.height, features };
    for (const c of [$('mask-layer'), $('prompt-layer')]) {
      c.width = meta.width;
      c.height = meta.height;
    }
    $('placeholder').hidden = true;
    resetPrompts();
    const enc = state.lastEncode;
    const where = enc.where === 'browser' ? `this browser, ${enc.accelerator}` : `${state.info.encoder_backend}, server`;
    setStatus(`${meta.width}x${meta.height} photo · encoder (${where}) ${Number(enc.ms).toFixed(1)} ms`);
  } catch (e) {
    setStatus(`could not open the photo: ${e.message}`, true);
  } finally {
    state.busy = false;
  }
}

function resetPrompts() {
  state.points = [];
  state.box = null;
  state.history = [];
  state.mask = null;
  redraw();
}

// ---- decoding -------------------------------------------------------------------------------------
async function decodeBrowser(coords, labels) {
  const d = state.decoder;
  const { tokens, valid } = encodePoints(coords, labels, d.tables, state.info.resolution, d.numTokens);
  const f = state.image.features;
  const named = {
    image_embeddings: f.image_embed, feat_s0: f.feat_s0, feat_s1: f.feat_s1,
    sparse_prompt: tokens, sparse_valid: valid, dense_prompt: d.dense,
  };
  const outs = await lrt.runModel(d.model, lrt.orderInputs(d.model, named, state.info.decoder.inputs));
  return lrt.nameOutputs(d.model, outs, LOGICAL_OUT, state.info.decoder.outputs);
}

async function decodeServer(coords, labels) {
  const res = await api(`/api/images/${state.image.id}/decode`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ coords, labels }),
  });
  const all = new Float32Array(await res.arrayBuffer());
  const n = state.info.mask_side ** 2;
  const sizes = [3 * n, 3, n, 1, 1];
  const out = {};
  let o = 0;
  LOGICAL_OUT.forEach((k, i) => {
    out[k] = all.subarray(o, o + sizes[i]);
    o += sizes[i];
  });
  return out;
}

let pending = null;
async function segment() {
  if (!state.image) return;
  if (!state.points.length && !state.box) {
    state.mask = null;
    redraw();
    $('latency').textContent = '';
    countDecode();
    return;
  }
  if (pending) {
    pending.again = true;
    return;
  }
  pending = { again: false };
  try {
    const { coords, labels } = promptLayout(state.points, state.box, state.image.width, state.image.height, state.info.resolution);
    const t0 = performance.now();
    const errorsBefore = lrt.gpuErrors.length;
    let out = state.decoder.where === 'browser' ? await decodeBrowser(coords, labels) : await decodeServer(coords, labels);
    if (lrt.gpuErrors.length > errorsBefore) {
      // WebGPU failed (e.g. a texture above the adapter's limit): its outputs are zeros, not a mask
      const why = lrt.gpuErrors[errorsBefore];
      state.decoder.model = await lrt.compile(state.info.decoder.url, 'wasm');
      state.decoder.accelerator = 'wasm';
      $('decoder-status').textContent = `decoder: in this browser · LiteRT.js · wasm (WebGPU failed here: ${why})`;
      out = await decodeBrowser(coords, labels);
    }
    const t1 = performance.now();
    const multimask = state.points.length === 1 && !state.box;
    const side = state.info.mask_side;
    const chosen = chooseMask(out, side, multimask);
    state.mask = upsampleMask(chosen.logits, side, state.image.height, state.image.width);
    redraw();
    const t2 = performance.now();
    state.lastDecode = { ms: t1 - t0, total_ms: t2 - t0, where: state.decoder.where, iou: chosen.iou, candidate: chosen.index, coords, labels };
    $('latency').textContent =
      `decoder ${(t1 - t0).toFixed(1)} ms (${state.decoder.where}) · mask drawn ${(t2 - t0).toFixed(1)} ms · ` +
      `predicted IoU ${chosen.iou.toFixed(3)}`;
    setStatus(`${state.points.length} point(s)${state.box ? ' + box' : ''}`);
  } catch (e) {
    setStatus(`decoding failed: ${e.message || e}`, true);
  } finally {
    const again = pending.again;
    pending = null;
    if (again) await segment();
    else countDecode();
  }
}

// A counter tests (and anyone scripting the page) can wait on: bumped once the shown mask is up to date.
function countDecode() {
  document.body.dataset.decodes = String(Number(document.body.dataset.decodes || 0) + 1);
}

// ---- drawing --------------------------------------------------------------------------------------
function redraw() {
  const m = $('mask-layer');
  const mctx = m.getContext('2d');
  mctx.clearRect(0, 0, m.width, m.height);
  if (state.mask) {
    const img = mctx.createImageData(m.width, m.height);
    const px = img.data;
    for (let i = 0; i < state.mask.length; i++) {
      if (state.mask[i]) {
        px[4 * i] = 30;
        px[4 * i + 1] = 144;
        px[4 * i + 2] = 255;
        px[4 * i + 3] = 128;
      }
    }
    mctx.putImageData(img, 0, 0);
  }
  const p = $('prompt-layer');
  const ctx = p.getContext('2d');
  ctx.clearRect(0, 0, p.width, p.height);
  const scale = p.width / Math.max(1, p.getBoundingClientRect().width || p.width);
  ctx.lineWidth = 2 * scale;
  if (state.box || dragBox) {
    const b = state.box || dragBox;
    ctx.strokeStyle = '#ffd54f';
    ctx.strokeRect(b.x0, b.y0, b.x1 - b.x0, b.y1 - b.y0);
  }
  for (const pt of state.points) {
    ctx.beginPath();
    ctx.arc(pt.x, pt.y, 6 * scale, 0, 2 * Math.PI);
    ctx.fillStyle = pt.label === 1 ? '#00e676' : '#ff5252';
    ctx.fill();
    ctx.strokeStyle = '#fff';
    ctx.stroke();
  }
  const has = Boolean(state.points.length || state.box);
  $('undo').disabled = !state.history.length;
  $('clear').disabled = !has;
  $('download').disabled = !state.mask;
}

// ---- input ----------------------------------------------------------------------------------------
function toPhoto(ev) {
  const r = $('prompt-layer').getBoundingClientRect();
  const x = ((ev.clientX - r.left) * state.image.width) / r.width;
  const y = ((ev.clientY - r.top) * state.image.height) / r.height;
  return { x: Math.min(Math.max(x, 0), state.image.width - 1), y: Math.min(Math.max(y, 0), state.image.height - 1) };
}

function pushHistory() {
  state.history.push({ points: state.points.map((p) => ({ ...p })), box: state.box && { ...state.box } });
}

let down = null;
let dragBox = null;
function onDown(ev) {
  if (!state.image) return;
  ev.preventDefault();
  down = { ...toPhoto(ev), cx: ev.clientX, cy: ev.clientY, button: ev.button, alt: ev.altKey };
}
function onMove(ev) {
  if (!down || down.button !== 0) return;
  if (Math.hypot(ev.clientX - down.cx, ev.clientY - down.cy) < 5) return;
  const p = toPhoto(ev);
  dragBox = { x0: Math.min(down.x, p.x), y0: Math.min(down.y, p.y), x1: Math.max(down.x, p.x), y1: Math.max(down.y, p.y) };
  redraw();
}
function onUp(ev) {
  if (!down) return;
  const start = down;
  down = null;
  const maxPoints = state.decoder.numTokens - 1 - (state.box || dragBox ? 2 : 0);
  if (dragBox) {
    pushHistory();
    state.box = dragBox;
    dragBox = null;
    while (state.points.length > state.decoder.numTokens - 3) state.points.pop();
  } else {
    if (state.points.length >= maxPoints) {
      setStatus(`at most ${maxPoints} points fit this decoder; undo or clear first`, true);
      return;
    }
    pushHistory();
    const negative = start.button === 2 || start.alt || ev.altKey;
    state.points.push({ x: start.x, y: start.y, label: negative ? 0 : 1 });
  }
  redraw();
  segment();
}

function downloadMask() {
  if (!state.mask) return;
  const c = document.createElement('canvas');
  c.width = state.image.width;
  c.height = state.image.height;
  const ctx = c.getContext('2d');
  const img = ctx.createImageData(c.width, c.height);
  for (let i = 0; i < state.mask.length; i++) {
    const v = state.mask[i] ? 255 : 0;
    img.data[4 * i] = v;
    img.data[4 * i + 1] = v;
    img.data[4 * i + 2] = v;
    img.data[4 * i + 3] = 255;
  }
  ctx.putImageData(img, 0, 0);
  c.toBlob((blob) => {
    const a = document.createElement('a');
    a.href = URL.createObjectURL(blob);
    a.download = 'mask.png';
    a.click();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  }, 'image/png');
}

function wire() {
  const layer = $('prompt-layer');
  layer.addEventListener('pointerdown', onDown);
  window.addEventListener('pointermove', onMove);
  window.addEventListener('pointerup', onUp);
  layer.addEventListener('contextmenu', (ev) => ev.preventDefault());
  $('file').addEventListener('change', (ev) => ev.target.files[0] && openPhoto(ev.target.files[0]));
  $('sample').addEventListener('change', (ev) => ev.target.value && openPhoto(null, ev.target.value));
  $('undo').addEventListener('click', () => {
    const prev = state.history.pop();
    if (!prev) return;
    state.points = prev.points;
    state.box = prev.box;
    redraw();
    segment();
  });
  $('clear').addEventListener('click', () => {
    pushHistory();
    state.points = [];
    state.box = null;
    segment();
  });
  $('download').addEventListener('click', downloadMask);
  window.addEventListener('dragover', (ev) => {
    ev.preventDefault();
    document.body.classList.add('dragging');
  });
  window.addEventListener('dragleave', () => document.body.classList.remove('dragging'));
  window.addEventListener('drop', (ev) => {
    ev.preventDefault();
    document.body.classList.remove('dragging');
    const f = ev.dataTransfer.files[0];
    if (f) openPhoto(f);
  });
}

async function main() {
  wire();
  try {
    state.info = await (await api('/api/info')).json();
    state.session = (await (await api('/api/session', { method: 'POST' })).json()).session;
  } catch (e) {
    setStatus(`the server did not answer: ${e.message}`, true);
    return;
  }
  document.querySelector('h1 span').textContent = `${state.info.model} · ${state.info.resolution} px · tap to segment`;
  for (const s of [...state.info.samples, ...(state.info.stored || []).map((n) => `stored:${n}`)]) {
    const o = document.createElement('option');
    o.value = s;
    o.textContent = s;
    $('sample').appendChild(o);
  }
  if (state.info.synthetic_weights) {
    $('warning').hidden = false;
    $('warning').textContent =
      'SYNTHETIC weights: masks are meaningless. Export or serve with real weights (--checkpoint sam2.1_hiera_tiny.pt).';
  }
  setStatus('setting up the decoder…');
  await setUpDecoder();
  setStatus('setting up the encoder…');
  await setUpEncoder();
  setUpEverything(state, api, setStatus);
  setUpTracking(state, api, setStatus);
  setStatus('ready: open or drop a photo, or pick a sample');
  document.body.dataset.ready = '1';
}

main();

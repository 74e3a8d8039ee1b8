// Tracking a short video in the page, offered when /api/info has `video` (a LiteRT bundle exported with --video).
// The server decodes the upload and resizes its frames (Sam2VideoPredictor.init_state); every model stage runs
// here with LiteRT.js: the frame encoder (app.js's, on the frame's S x S pixels; the server's encoder only as the
// fallback, see app.js), the memory attention, the video decoder and the memory encoder, and tracker.js (the
// port of Sam2VideoPredictor and its memory bank) keeps every object's memory. The graphs' inputs are the
// bundle's own (SAM 2.1 or EdgeTAM: /api/info's video.graphs). Left click: object point on the shown
// frame, right click or Alt+click: background point, drag: box; "Track" propagates every object through the clip.
import * as lrt from './litert.js';
import { encodePoints, upsampleMask } from './sam.js';
import { Tracker, TrackingError } from './tracker.js';
import { encodeImage, normalizeFrame, visionOf } from './encoder.js';

const $ = (id) => document.getElementById(id);
const COLOURS = [[230, 25, 75], [60, 180, 75], [255, 225, 25], [0, 130, 200], [245, 130, 48], [145, 30, 180]];
const STAGES = ['features', 'memory_attention', 'decoder', 'memory_encoder'];

async function fetchF32(url) {
  const res = await fetch(url);
  if (!res.ok) throw new Error(`${url.split('/').pop()} failed to load (HTTP ${res.status}); re-export the bundle with --video`);
  return new Float32Array(await res.arrayBuffer());
}

// The three video graphs on one accelerator, with per-stage timings of the frame being tracked.
async function loadGraphs(info, accel, setStatus) {
  const vi = info.video;
  const graphs = {};
  for (const [role, g] of Object.entries(vi.graphs)) {
    setStatus(`compiling ${g.file} (${accel})…`);
    let model;
    try {
      model = await lrt.compile(g.url, accel);
    } catch (e) {
      if (accel === 'wasm') throw new Error(`${g.file} failed to load (${e.message || e}); re-export the bundle with --video`);
      return loadGraphs(info, 'wasm', setStatus); // the WebGPU delegate refused it: every graph on wasm
    }
    graphs[role] = { ...g, model };
  }
  const tables = {};
  for (const [k, url] of Object.entries(info.decoder.tables)) tables[k] = await fetchF32(url);
  return { graphs, accel, tables, ...(await videoTables(vi, info.d_model, info.embed_size)) };
}

// The host tables of the video graphs, checked against the bundle's layout: video_const.bin (no_mem_embed [C] |
// no_obj_ptr [C] | mask downsampler), rope_tables.bin (cos | sin [e*e, C], then EdgeTAM's key tables cos_k |
// sin_k [N, C]) and EdgeTAM's perceiver latents [N, M] (the memory encoder's input).
export async function videoTables(vi, c, e) {
  const constants = await fetchF32(vi.tables.const);
  const rope = await fetchF32(vi.tables.rope);
  const hw = e * e * c;
  const kw = (vi.rope_key_rows || 0) * c;
  if (rope.length !== 2 * (hw + kw)) {
    throw new Error(`rope_tables.bin holds ${rope.length} floats, expected ${2 * (hw + kw)}; re-export the bundle with --video`);
  }
  const out = {
    noMemEmbed: constants.slice(0, c),
    ropeCos: rope.subarray(0, hw),
    ropeSin: rope.subarray(hw, 2 * hw),
    ropeCosK: rope.subarray(2 * hw, 2 * hw + kw),
    ropeSinK: rope.subarray(2 * hw + kw),
    latents: null,
  };
  if (vi.tables.latents) {
    out.latents = await fetchF32(vi.tables.latents);
    const want = vi.memory_tokens * vi.config.mem_dim;
    if (out.latents.length !== want) {
      throw new Error(`perceiver_latents.bin holds ${out.latents.length} floats, expected ${want}; re-export the bundle with --video`);
    }
  }
  return out;
}

async function run(g, named, times, stage) {
  const t0 = performance.now();
  const errors = lrt.gpuErrors.length;
  const outs = await lrt.runModel(g.model, lrt.orderInputs(g.model, named, g.inputs));
  if (lrt.gpuErrors.length > errors) {
    throw new Error(`WebGPU failed in ${g.file} (${lrt.gpuErrors[errors]}); reload the page with ?accel=wasm`);
  }
  times[stage] = (times[stage] || 0) + performance.now() - t0;
  return lrt.nameOutputs(g.model, outs, g.outputs, g.outputs);
}

// tracker.js's graph protocol over LiteRT.js models (BundleVideoBackend's calls, in the page).
function graphProtocol(rt, info, times) {
  const numTokens = info.video.num_tokens;
  const side = info.mask_side;
  const g = rt.graphs;
  return {
    async memoryAttention(vision, inputs) {
      const named = { vision, ...inputs, rope_cos: rt.ropeCos, rope_sin: rt.ropeSin, rope_cos_k: rt.ropeCosK, rope_sin_k: rt.ropeSinK };
      return (await run(g['memory-attention'], named, times, 'memory_attention')).pix_feat;
    },
    async decode(pix, feats, coords, labels, maskInput) {
      if (labels.length > numTokens) {
        throw new TrackingError(`${labels.length} prompt tokens exceed the ${numTokens} video prompt slots; use at most ${numTokens - 1} points on a frame`);
      }
      const { tokens, valid } = encodePoints(coords, labels, rt.tables, info.resolution, numTokens);
      const named = {
        pix_feat: pix, feat_s0: feats.feat_s0, feat_s1: feats.feat_s1, sparse_prompt: tokens, sparse_valid: valid,
        mask_input: maskInput || new Float32Array(side * side), has_mask: Float32Array.of(maskInput ? 1 : 0),
      };
      return run(g['video-decoder'], named, times, 'decoder');
    },
    async encodeMemory(vision, lowRes, binarize, score) {
      const named = { vision, low_res: lowRes, binarize: Float32Array.of(binarize ? 1 : 0), score: Float32Array.of(score), latents: rt.latents };
      return (await run(g['memory-encoder'], named, times, 'memory_encoder')).memory;
    },
  };
}

// The page's shared objects (app.js's state, its API call and status line), set by setUpTracking.
let state = null;
let api = null;
let setStatus = null;
let rt = null; // compiled graphs, shared by every clip
const v = { clip: null, tracker: null, frame: 0, obj: 1, objects: [1], calls: [], results: new Map(), prompts: [], busy: false, times: [] };

let cached = null; // the most recent frame's features, as Sam2VideoPredictor's cache
const times = {}; // ms per stage of the frame (or prompt) in progress; the graphs add to it
const resetTimes = () => STAGES.forEach((s) => delete times[s]);
async function features(frame) {
  if (cached && cached.frame === frame) return cached.feats;
  const t0 = performance.now();
  const feats = state.encoder.where === 'browser' ? await encodeFrame(frame) : await serverFeatures(frame);
  times.features = (times.features || 0) + performance.now() - t0;
  cached = { frame, feats };
  return feats;
}

// The frame's S x S pixels from the server, encoded here (BundleVideoBackend.encode_frame in the page).
async function encodeFrame(frame) {
  const s = state.info.resolution;
  const rgb = new Uint8Array(await (await api(`/api/videos/${v.clip.id}/pixels/${frame}`)).arrayBuffer());
  if (rgb.length !== s * s * 3) throw new Error(`frame ${frame} came as ${rgb.length} bytes, expected ${s * s * 3}`);
  const errors = lrt.gpuErrors.length;
  const out = await encodeImage(state.encoder, normalizeFrame(rgb, s));
  if (lrt.gpuErrors.length > errors) {
    throw new Error(`WebGPU failed in the frame encoder (${lrt.gpuErrors[errors]}); reload the page with ?accel=wasm`);
  }
  return { vision: visionOf(out.image_embeddings, rt.noMemEmbed, state.info.embed_size), feat_s0: out.feat_s0, feat_s1: out.feat_s1 };
}

// The fallback: the server's frame encoder (vision | feat_s0 | feat_s1, float32).
async function serverFeatures(frame) {
  const buf = await (await api(`/api/videos/${v.clip.id}/features/${frame}`)).arrayBuffer();
  const feats = {};
  let offset = 0;
  for (const [k, shape] of Object.entries(state.info.video.features)) {
    const n = shape.reduce((a, b) => a * b, 1);
    feats[k] = new Float32Array(buf, offset * 4, n);
    offset += n;
  }
  return feats;
}

const encoderWhere = () => (state.encoder.where === 'browser' ? `frame encoder here (${state.encoder.accelerator})` : 'frame encoder on the server');

function trackerMeta(clip) {
  const info = state.info;
  const c = info.video.config;
  return {
    numFrames: clip.num_frames, width: clip.width, height: clip.height, imageSize: info.resolution,
    side: info.mask_side, e: info.embed_size, C: info.d_model, M: c.mem_dim, K: c.memory_slots, P: c.max_obj_ptrs,
    numMaskmem: c.num_maskmem, maxObjPtrs: c.max_obj_ptrs, noObjScore: c.no_obj_score,
    stabilityDelta: info.video.stability.delta, stabilityThresh: info.video.stability.thresh,
    fillHoleArea: info.video.fill_hole_area, noMemEmbed: rt.noMemEmbed, memoryTokens: info.video.memory_tokens || null,
  };
}

async function openVideo(file) {
  if (v.busy) return;
  v.busy = true;
  setStatus('uploading and decoding the video…');
  try {
    if (!rt) {
      const accel = new URLSearchParams(location.search).get('accel') || state.decoder.accelerator || 'wasm';
      rt = await loadGraphs(state.info, accel, setStatus);
    }
    const clip = await (await api('/api/videos', { method: 'POST', body: file })).json();
    Object.assign(v, { clip, frame: 0, obj: 1, objects: [1], calls: [], results: new Map(), prompts: [], times: [] });
    cached = null;
    v.tracker = new Tracker(trackerMeta(clip), graphProtocol(rt, state.info, times), features);
    state.image = null; // the photo tools stand down while a video is open
    for (const c of [$('mask-layer'), $('prompt-layer')]) {
      c.width = clip.width;
      c.height = clip.height;
    }
    $('placeholder').hidden = true;
    $('videobar').hidden = false;
    $('frame').max = String(clip.num_frames - 1);
    fillObjects();
    await show(0);
    setStatus(`${clip.width}x${clip.height} video, ${clip.num_frames} frames · ${encoderWhere()} · video graphs here (${rt.accel}) · click the object to track`);
  } catch (e) {
    setStatus(`could not open the video: ${e.message || e}`, true);
  } finally {
    v.busy = false;
  }
}

function fillObjects() {
  const sel = $('object');
  sel.textContent = '';
  for (const id of v.objects) {
    const o = document.createElement('option');
    o.value = String(id);
    o.textContent = `object ${id}`;
    sel.appendChild(o);
  }
  sel.value = String(v.obj);
}

// The label map of one frame (video pixels, value = object id, later objects win), from the low-res logits.
function labelMap(frame) {
  const { width: w, height: h } = v.clip;
  const out = new Uint8Array(w * h);
  const res = v.results.get(frame);
  if (!res) return out;
  res.objIds.forEach((id, i) => {
    const m = upsampleMask(res.lows[i], state.info.mask_side, h, w);
    for (let p = 0; p < m.length; p++) if (m[p]) out[p] = id;
  });
  return out;
}
// For tests and scripts: a frame's label map, or one object's mask (1 = object), as base64 bytes.
v.labelMapB64 = (frame, objIndex = null) => {
  const res = v.results.get(frame);
  const bits = objIndex === null ? labelMap(frame) : upsampleMask(res.lows[objIndex], state.info.mask_side, v.clip.height, v.clip.width);
  let s = '';
  for (let i = 0; i < bits.length; i += 4096) s += String.fromCharCode.apply(null, bits.subarray(i, i + 4096));
  return btoa(s);
};

async function show(frame) {
  v.frame = frame;
  $('frame').value = String(frame);
  $('frame-label').textContent = `frame ${frame} / ${v.clip.num_frames - 1}`;
  const blob = await (await api(`/api/videos/${v.clip.id}/frame/${frame}`)).blob();
  const img = $('photo');
  const loaded = new Promise((resolve, reject) => {
    img.onload = resolve;
    img.onerror = () => reject(new Error('the frame could not be displayed'));
  });
  if (img.src.startsWith('blob:')) URL.revokeObjectURL(img.src);
  img.src = URL.createObjectURL(blob);
  await loaded;
  drawMasks(frame);
}

function drawMasks(frame) {
  const m = $('mask-layer');
  const ctx = m.getContext('2d');
  const img = ctx.createImageData(m.width, m.height);
  const labels = labelMap(frame);
  for (let i = 0; i < labels.length; i++) {
    if (!labels[i]) continue;
    const [r, g, b] = COLOURS[(labels[i] - 1) % COLOURS.length];
    img.data.set([r, g, b, 128], 4 * i);
  }
  ctx.putImageData(img, 0, 0);
  const p = $('prompt-layer');
  const pctx = p.getContext('2d');
  pctx.clearRect(0, 0, p.width, p.height);
  pctx.lineWidth = 2;
  for (const q of v.prompts.filter((q) => q.frame === frame)) {
    pctx.strokeStyle = `rgb(${COLOURS[(q.obj - 1) % COLOURS.length].join(',')})`;
    if (q.box) pctx.strokeRect(q.box[0], q.box[1], q.box[2] - q.box[0], q.box[3] - q.box[1]);
    else {
      pctx.beginPath();
      pctx.arc(q.x, q.y, 6, 0, 2 * Math.PI);
      pctx.fillStyle = q.label === 1 ? '#00e676' : '#ff5252';
      pctx.fill();
      pctx.stroke();
    }
  }
}

function done() {
  document.body.dataset.tracks = String(Number(document.body.dataset.tracks || 0) + 1);
}

async function guarded(what, fn) {
  if (v.busy || !v.tracker) return;
  v.busy = true;
  try {
    await fn();
  } catch (e) {
    setStatus(`${what} failed: ${e.message || e}`, true);
  } finally {
    v.busy = false;
    done();
  }
}

// One prompt -> Tracker.addNewPointsOrBox (logged in v.calls, which a test replays in Python).
async function prompt(call) {
  await guarded('the prompt', async () => {
    resetTimes();
    const res = await v.tracker.addNewPointsOrBox(call.frame, call.obj, { points: call.points, labels: call.labels, box: call.box, clearOldPoints: call.clear });
    v.calls.push({ op: 'add', ...call });
    v.results.set(res.frame, res);
    drawMasks(res.frame);
    setStatus(`object ${call.obj} on frame ${call.frame} · ${stageText(times)}`);
  });
}

async function trackAll() {
  await guarded('tracking', async () => {
    if (!v.tracker.objIds.length) throw new TrackingError('click the object to track first (a point or a box)');
    const passes = $('backwards').checked ? [false, true] : [false];
    const start = Math.min(...v.tracker.memory.flatMap((m) => [...m.cond.keys(), ...m.tempCond.keys()]));
    const total = v.clip.num_frames - start + (passes.length > 1 ? start + 1 : 0);
    let step = 0;
    v.times = [];
    $('track-progress').max = total;
    for (const reverse of passes) {
      resetTimes();
      let t0 = performance.now();
      await v.tracker.propagate({
        reverse,
        onFrame: async (f, objIds, lows) => {
          v.results.set(f, { objIds, lows });
          v.times.push({ frame: f, ...times, total: performance.now() - t0 }); // total: features + graphs + host
          resetTimes();
          $('track-progress').value = ++step;
          setStatus(`tracking ${reverse ? 'backwards' : 'forwards'}: frame ${f} · ${step}/${total}`);
          await show(f);
          t0 = performance.now();
        },
      });
      v.calls.push({ op: 'propagate', reverse });
    }
    renderTimes();
    setStatus(`tracked ${v.tracker.objIds.length} object(s) through ${step} frame steps · ${encoderWhere()} · video graphs here (${rt.accel})`);
  });
}

function stageText(t) {
  return STAGES.filter((s) => t[s] !== undefined).map((s) => `${s.replace('_', ' ')} ${t[s].toFixed(1)} ms`).join(' · ');
}

function renderTimes() {
  const median = (xs) => {
    const s = [...xs].sort((a, b) => a - b);
    return s.length ? s[(s.length - 1) >> 1] : NaN;
  };
  const tracked = v.times.filter((t) => t.memory_attention !== undefined); // prompted frames run no graph
  const label = (s) => (s === 'features' ? `features (${state.encoder.where === 'browser' ? 'encoder here' : 'server encoder'})` : s.replace('_', ' '));
  const rows = [...STAGES, 'total'].map((s) => `<tr><th>${label(s)}</th><td>${median(tracked.map((t) => t[s] || 0)).toFixed(1)}</td></tr>`);
  $('latency').innerHTML = `<table id="stage-times"><tr><th>per tracked frame, median of ${tracked.length} (${rt.accel})</th><th>ms</th></tr>${rows.join('')}</table>`;
}


// ---- input on the shown frame -----------------------------------------------------------------------
let down = null;
const toVideo = (ev) => {
  const r = $('prompt-layer').getBoundingClientRect();
  const x = ((ev.clientX - r.left) * v.clip.width) / r.width;
  const y = ((ev.clientY - r.top) * v.clip.height) / r.height;
  return { x: Math.min(Math.max(x, 0), v.clip.width - 1), y: Math.min(Math.max(y, 0), v.clip.height - 1) };
};
const active = () => v.tracker && $('videobar').hidden === false;
function onDown(ev) {
  if (!active()) return;
  ev.preventDefault();
  down = { ...toVideo(ev), cx: ev.clientX, cy: ev.clientY, negative: ev.button === 2 || ev.altKey };
}

function onUp(ev) {
  if (!down || !active()) return;
  const start = down;
  down = null;
  const end = toVideo(ev);
  const base = { frame: v.frame, obj: v.obj };
  if (Math.hypot(ev.clientX - start.cx, ev.clientY - start.cy) >= 5) {
    const box = [Math.min(start.x, end.x), Math.min(start.y, end.y), Math.max(start.x, end.x), Math.max(start.y, end.y)];
    v.prompts = v.prompts.filter((q) => q.frame !== base.frame || q.obj !== base.obj); // a box clears them
    v.prompts.push({ ...base, box });
    prompt({ ...base, points: null, labels: null, box, clear: true });
  } else {
    const label = start.negative ? 0 : 1;
    v.prompts.push({ ...base, x: start.x, y: start.y, label });
    prompt({ ...base, points: [[start.x, start.y]], labels: [label], box: null, clear: false });
  }
}

function wire() {
  $('prompt-layer').addEventListener('pointerdown', onDown);
  window.addEventListener('pointerup', onUp);
  $('video-file').addEventListener('change', (ev) => ev.target.files[0] && openVideo(ev.target.files[0]));
  $('frame').addEventListener('input', () => v.clip && !v.busy && show(Number($('frame').value)));
  $('object').addEventListener('change', () => (v.obj = Number($('object').value)));
  $('new-object').addEventListener('click', () => {
    v.obj = Math.max(...v.objects) + 1;
    v.objects.push(v.obj);
    fillObjects();
  });
  $('track').addEventListener('click', trackAll);
  const leave = () => ($('videobar').hidden = true); // a photo replaces the video
  $('file').addEventListener('change', leave);
  $('sample').addEventListener('change', leave);
}

// Shown when /api/info offers tracking; `state` is app.js's (state.video = this page's clip and tracker).
export function setUpTracking(pageState, pageApi, pageStatus) {
  if (!pageState.info.video) {
    $('video-status').textContent = `video: no tracking here (${pageState.info.video_note})`;
    return;
  }
  [state, api, setStatus] = [pageState, pageApi, pageStatus];
  state.video = v;
  $('open-video').hidden = false;
  wire();
}

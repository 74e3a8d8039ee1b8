// The frame pipeline of the static site: a frame's pixels (camera, clip) -> the bundle's frame encoder ->
// tracker.js (memory attention, video decoder, memory encoder), every stage in LiteRT.js, one processed frame at
// a time. No DOM here. Preprocessing is Sam2VideoPredictor.init_state's: PIL's bicubic resize to S x S (8-bit,
// fixed point, as Pillow's Resample.c), then /255 (float64 -> float32), ImageNet mean/std, NCHW.
// Live tracking numbers the frames it processes 0, 1, 2, ...; the stream has no known length, so the tracker
// sees an unbounded video (pointer temporal positions use max_obj_ptrs - 1 as their scale, as for any clip
// longer than max_obj_ptrs frames). Memory older than the frames the memory attention can read is dropped.
import { nameOutputs, orderInputs, runModel } from './litert.js';
import { encodePoints } from './sam.js';
import { Tracker, TrackingError } from './tracker.js';

export const STAGES = ['encoder', 'memory_attention', 'decoder', 'memory_encoder'];
const MEAN = [0.485, 0.456, 0.406];
const STD = [0.229, 0.224, 0.225];
const f32 = Math.fround;
const PRECISION_BITS = 32 - 8 - 2; // Pillow's 8-bit resample: fixed-point coefficients
const UNBOUNDED = 2 ** 31 - 1; // frames of a live stream, as the tracker sees it

function bicubic(x) {
  const a = -0.5;
  x = Math.abs(x);
  if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
  return 0;
}

// Pillow's precompute_coeffs + normalize_coeffs_8bpc for one axis: [{xmin, k: Int32 coefficients}].
function pilCoeffs(inSize, outSize) {
  const scale = inSize / outSize;
  const filterscale = Math.max(scale, 1);
  const support = 2 * filterscale;
  const rows = [];
  for (let xx = 0; xx < outSize; xx++) {
    const center = (xx + 0.5) * scale;
    const ss = 1 / filterscale;
    const xmin = Math.max(Math.trunc(center - support + 0.5), 0);
    const xmax = Math.min(Math.trunc(center + support + 0.5), inSize) - xmin;
    const w = [];
    let ww = 0;
    for (let x = 0; x < xmax; x++) {
      const v = bicubic((x + xmin - center + 0.5) * ss);
      w.push(v);
      ww += v;
    }
    const k = w.map((v) => {
      const n = ww !== 0 ? v / ww : v;
      return n < 0 ? Math.trunc(-0.5 + n * (1 << PRECISION_BITS)) : Math.trunc(0.5 + n * (1 << PRECISION_BITS));
    });
    rows.push({ xmin, k });
  }
  return rows;
}

const clip8 = (v) => (v >= 1 << PRECISION_BITS << 8 ? 255 : v <= 0 ? 0 : Math.floor(v / (1 << PRECISION_BITS)));

// RGBA pixels (w x h) -> RGB uint8 s x s, as PIL Image.resize((s, s)) (bicubic; horizontal pass first).
export function resizeRGB(rgba, w, h, s) {
  const ax = pilCoeffs(w, s);
  const ay = pilCoeffs(h, s);
  const half = 1 << (PRECISION_BITS - 1);
  const yFirst = ay[0].xmin;
  const yLast = ay[s - 1].xmin + ay[s - 1].k.length;
  let tmp; // RGB rows yFirst..yLast-1, width s (or w when no horizontal pass)
  let tw = w;
  if (w !== s) {
    tw = s;
    tmp = new Uint8Array((yLast - yFirst) * s * 3);
    for (let y = yFirst; y < yLast; y++) {
      for (let x = 0; x < s; x++) {
        const { xmin, k } = ax[x];
        for (let c = 0; c < 3; c++) {
          let acc = half;
          for (let j = 0; j < k.length; j++) acc += rgba[4 * (y * w + xmin + j) + c] * k[j];
          tmp[((y - yFirst) * s + x) * 3 + c] = clip8(acc);
        }
      }
    }
  } else {
    tmp = new Uint8Array((yLast - yFirst) * w * 3);
    for (let y = yFirst; y < yLast; y++) {
      for (let x = 0; x < w; x++) for (let c = 0; c < 3; c++) tmp[((y - yFirst) * w + x) * 3 + c] = rgba[4 * (y * w + x) + c];
    }
  }
  if (h === s) return tmp;
  const out = new Uint8Array(s * s * 3);
  for (let y = 0; y < s; y++) {
    const { xmin, k } = ay[y];
    for (let x = 0; x < tw; x++) {
      for (let c = 0; c < 3; c++) {
        let acc = half;
        for (let j = 0; j < k.length; j++) acc += tmp[((xmin - yFirst + j) * tw + x) * 3 + c] * k[j];
        out[(y * s + x) * 3 + c] = clip8(acc);
      }
    }
  }
  return out;
}

// RGB uint8 s x s -> 1x3xSxS float32: x / 255 (in float64, then float32), (x - mean) / std in float32.
export function normalize(rgb, s) {
  const out = new Float32Array(3 * s * s);
  for (let c = 0; c < 3; c++) {
    const m = f32(MEAN[c]);
    const d = f32(STD[c]);
    for (let i = 0; i < s * s; i++) out[c * s * s + i] = f32(f32(f32(rgb[3 * i + c] / 255) - m) / d);
  }
  return out;
}

// Split rope_tables.bin: frame cos | sin [e*e, C], then (EdgeTAM) the keys' cos | sin [N, C].
function ropeTables(rope, hw, c) {
  const frame = 2 * hw * c;
  const k = (rope.length - frame) / 2;
  return {
    rope_cos: rope.subarray(0, hw * c),
    rope_sin: rope.subarray(hw * c, frame),
    ...(k > 0 ? { rope_cos_k: rope.subarray(frame, frame + k), rope_sin_k: rope.subarray(frame + k) } : {}),
  };
}

// The bundle's graphs for tracking: the frame encoder, the three video graphs, their tables. cfg: config.json
// (sam2edge web); compile(url) -> LiteRT.js model (hash-checked); fetchF32(url) -> Float32Array (hash-checked).
export class FramePipeline {
  static async load(cfg, encoder, compile, fetchF32, onStatus = () => {}) {
    if (!cfg.tracker) throw new TrackingError(`tracking needs a bundle exported with --video (${cfg.tracker_note})`);
    const graphs = {};
    for (const [role, g] of Object.entries(cfg.tracker.graphs)) {
      onStatus(`checking and compiling ${g.file}…`);
      graphs[role] = { ...g, model: await compile(g.url) };
    }
    const tables = {};
    for (const [k, url] of Object.entries(cfg.decoder.tables)) tables[k] = await fetchF32(url);
    const m = cfg.model;
    const consts = await fetchF32(cfg.tracker.tables.const); // no_mem_embed [C] | no_obj_ptr [C] | ...
    const extra = ropeTables(await fetchF32(cfg.tracker.tables.rope), m.embed_size * m.embed_size, m.d_model);
    if (cfg.tracker.tables.latents) extra.latents = await fetchF32(cfg.tracker.tables.latents);
    return new FramePipeline(cfg, encoder, graphs, tables, consts.slice(0, m.d_model), extra);
  }

  constructor(cfg, encoder, graphs, tables, noMemEmbed, extra) {
    Object.assign(this, { cfg, encoder, graphs, tables, noMemEmbed, extra });
    this.times = {}; // ms per stage of the frame in progress
  }

  async timed(stage, model, named, io) {
    const t0 = performance.now();
    const outs = await runModel(model, orderInputs(model, named, io.inputs));
    this.times[stage] = (this.times[stage] || 0) + performance.now() - t0;
    return nameOutputs(model, outs, io.outputs, io.outputs);
  }

  // RGBA (w x h) -> {vision (no no_mem_embed), feat_s0, feat_s1}, as Sam2VideoPredictor.frame_features.
  async encode(rgba, w, h) {
    const s = this.cfg.resolution;
    const t0 = performance.now();
    const x = normalize(resizeRGB(rgba, w, h, s), s);
    const enc = this.cfg.encoder;
    const outs = await runModel(this.encoder, [x]);
    const named = nameOutputs(this.encoder, outs, enc.outputs, enc.outputs);
    const { d_model: c, embed_size: e } = this.cfg.model;
    const vision = new Float32Array(named.image_embeddings.length);
    for (let k = 0; k < c; k++) {
      for (let i = k * e * e; i < (k + 1) * e * e; i++) vision[i] = f32(named.image_embeddings[i] - this.noMemEmbed[k]);
    }
    this.times.encoder = (this.times.encoder || 0) + performance.now() - t0;
    return { vision, feat_s0: named.feat_s0, feat_s1: named.feat_s1 };
  }

  // tracker.js's graph protocol over the LiteRT.js models (BundleVideoBackend's calls).
  protocol() {
    const g = this.graphs;
    const m = this.cfg.model;
    const numTokens = this.cfg.tracker.num_tokens;
    return {
      memoryAttention: async (vision, inputs) => {
        const named = { vision, ...inputs, ...this.extra };
        return (await this.timed('memory_attention', g['memory-attention'].model, named, g['memory-attention'])).pix_feat;
      },
      decode: async (pix, feats, coords, labels, maskInput) => {
        if (labels.length > numTokens) {
          throw new TrackingError(`${labels.length} prompt tokens exceed the ${numTokens} video prompt slots; use at most ${numTokens - 1} points on a frame`);
        }
        const { tokens, valid } = encodePoints(coords, labels, this.tables, this.cfg.resolution, numTokens);
        const side = m.mask_side;
        const named = {
          pix_feat: pix, feat_s0: feats.feat_s0, feat_s1: feats.feat_s1, sparse_prompt: tokens, sparse_valid: valid,
          mask_input: maskInput || new Float32Array(side * side), has_mask: Float32Array.of(maskInput ? 1 : 0),
        };
        return this.timed('decoder', g['video-decoder'].model, named, g['video-decoder']);
      },
      encodeMemory: async (vision, lowRes, binarize, score) => {
        const named = { vision, low_res: lowRes, binarize: Float32Array.of(binarize ? 1 : 0), score: Float32Array.of(score), ...this.extra };
        return (await this.timed('memory_encoder', g['memory-encoder'].model, named, g['memory-encoder'])).memory;
      },
    };
  }

  // tracker.js's meta for a stream of (width x height) frames.
  meta(width, height) {
    const m = this.cfg.model;
    const c = this.cfg.tracker.config;
    return {
      numFrames: UNBOUNDED, width, height, imageSize: this.cfg.resolution, side: m.mask_side, e: m.embed_size,
      C: m.d_model, M: c.mem_dim, K: c.memory_slots, P: c.max_obj_ptrs, numMaskmem: c.num_maskmem,
      maxObjPtrs: c.max_obj_ptrs, noObjScore: c.no_obj_score, stabilityDelta: m.stability.delta,
      stabilityThresh: m.stability.thresh, fillHoleArea: m.fill_hole_area, noMemEmbed: this.noMemEmbed,
      memoryTokens: this.cfg.tracker.memory_tokens || null, // EdgeTAM: N perceiver tokens a slot; SAM 2.1: e*e map
    };
  }
}

// Tracking on a stream, one processed frame at a time: step(rgba, prompts) tracks every prompted object on the
// new frame (memory attention + decoder + memory encoder), then applies the prompts given on it (a new object
// starts there; an object already tracked gets a correction). `calls` logs what Sam2VideoPredictor must replay:
// {op: 'track', frame} = propagate_in_video(start_frame_idx=frame, max_frame_num_to_track=0), {op: 'add', ...}
// = add_new_points_or_box.
export class LiveTracker {
  constructor(pipeline, width, height) {
    this.pipeline = pipeline;
    this.width = width;
    this.height = height;
    this.frame = -1;
    this.feats = null;
    this.calls = [];
    this.tracker = new Tracker(pipeline.meta(width, height), pipeline.protocol(), async (f) => {
      if (f !== this.frame) throw new TrackingError(`frame ${f} is no longer held; only the newest frame is`);
      return this.feats;
    });
    const c = pipeline.cfg.tracker.config;
    this.keep = Math.max(c.num_maskmem, c.max_obj_ptrs); // frames the memory attention can still read
  }

  // prompts: [{obj, points [[x, y]] | null, labels | null, box [x0, y0, x1, y1] | null, clear}] in frame pixels.
  // -> {frame, objIds, lows (per object low-res logits), times (ms per stage)}
  async step(rgba, prompts = []) {
    const p = this.pipeline;
    p.times = {};
    const f = ++this.frame;
    this.feats = await p.encode(rgba, this.width, this.height);
    const t = this.tracker;
    let lows = [];
    if (t.objIds.length) {
      await t.preflight();
      for (const [idx, mem] of t.memory.entries()) {
        let out = mem.cond.get(f);
        if (!out) {
          out = await t.infer(idx, f, false, null, false, true, null);
          mem.nonCond.set(f, out);
        }
        t.tracked[idx].set(f, false);
        lows.push(out.predMasks);
      }
      this.calls.push({ op: 'track', frame: f });
    }
    for (const q of prompts) {
      const res = await t.addNewPointsOrBox(f, q.obj, { points: q.points, labels: q.labels, box: q.box, clearOldPoints: q.clear });
      this.calls.push({ op: 'add', frame: f, obj: q.obj, points: q.points, labels: q.labels, box: q.box, clear: q.clear });
      lows = res.lows;
    }
    if (prompts.length) await t.preflight(); // the prompted frame's memory, while its features are held
    this.prune(f);
    return { frame: f, objIds: [...t.objIds], lows, times: { ...p.times } };
  }

  // Forget non-conditioning outputs the memory attention can no longer select (older than `keep` frames).
  prune(f) {
    const old = f - this.keep;
    for (const [idx, mem] of this.tracker.memory.entries()) {
      for (const k of [...mem.nonCond.keys()]) if (k < old) mem.nonCond.delete(k);
      for (const k of [...this.tracker.tracked[idx].keys()]) if (k < old) this.tracker.tracked[idx].delete(k);
    }
  }
}

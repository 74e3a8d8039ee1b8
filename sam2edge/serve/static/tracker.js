// Tracking in the page: the JavaScript port of sam2edge.runtime.video.memory_bank (which past frames fill the video
// graphs' fixed slots) and of Sam2VideoPredictor's per-object logic (prompts, upstream's mask selection, the
// memory bank's stores, hole filling, propagation). No DOM here: the three video graphs and the frame features
// are passed in (track.js runs them with LiteRT.js), so node can test this file against the Python host.
// Arrays are Float32Array, row-major, in runtime/video/backend.py's shapes (S image size, e = S/16, side = 4e,
// C d_model, M mem_dim, K memory slots, P pointer slots, N memory tokens of a slot: EdgeTAM's perceiver output,
// absent for SAM 2.1 whose slots are M x e x e maps); float32 rounding (Math.fround) follows numpy.

const f32 = Math.fround;

// One object's outputs by frame index, as upstream's output_dict_per_obj (values: FrameOutput
// {predMasks side*side logits, objPtr C, score (object-score logit), maskmem M*e*e or N*M | null}).
export class ObjectMemory {
  constructor() {
    this.cond = new Map();
    this.nonCond = new Map();
    this.tempCond = new Map();
    this.tempNonCond = new Map();
  }

  // Upstream's order: the temporary output of this kind, then conditioning, then non-conditioning.
  lookup(frame, isCond) {
    for (const store of [isCond ? this.tempCond : this.tempNonCond, this.cond, this.nonCond]) {
      if (store.has(frame)) return store.get(frame);
    }
    return null;
  }
}

const byDistance = (frame) => (a, b) => Math.abs(a[0] - frame) - Math.abs(b[0] - frame); // stable, as sorted()

// [[tPos, frame, out]]: conditioning frames (tPos 0, nearest first), then the previous frames in the direction.
function spatialEntries(mem, frame, v, reverse) {
  const entries = [...mem.cond.entries()].sort(byDistance(frame)).map(([t, out]) => [0, t, out]);
  for (let tPos = 1; tPos < v.numMaskmem; tPos++) {
    const prev = reverse ? frame + (v.numMaskmem - tPos) : frame - (v.numMaskmem - tPos);
    if (mem.nonCond.has(prev)) entries.push([tPos, prev, mem.nonCond.get(prev)]);
  }
  return entries;
}

// [[0 conditioning | 1 other, signed distance, frame, out]] and tMax, as upstream's pos_and_ptrs.
function pointerEntries(mem, frame, numFrames, v, reverse) {
  const maxPtrs = Math.min(numFrames, v.maxObjPtrs);
  const sign = reverse ? -1 : 1;
  const past = [...mem.cond.entries()].filter(([t]) => (reverse ? t >= frame : t <= frame)).sort(byDistance(frame));
  const entries = past.map(([t, o]) => [0, (frame - t) * sign, t, o]);
  for (let d = 1; d < maxPtrs; d++) {
    const t = reverse ? frame + d : frame - d;
    if (t < 0 || t >= numFrames) break;
    if (mem.nonCond.has(t)) entries.push([mem.cond.has(t) ? 0 : 1, d, t, mem.nonCond.get(t)]);
  }
  return { entries, tMax: Math.max(1, maxPtrs - 1) };
}

// At most `slots` entries: the conditioning ones (first, nearest first) give way from the far end.
function fit(entries, slots) {
  if (entries.length <= slots) return { kept: entries, dropped: 0 };
  const nCond = entries.filter((e) => e[0] === 0).length;
  const others = entries.slice(nCond);
  const keepCond = nCond ? Math.max(1, slots - others.length) : 0;
  const kept = entries.slice(0, keepCond).concat(others).slice(0, slots);
  return { kept, dropped: entries.length - kept.length };
}

// Floats of one memory slot: N*M perceiver tokens (v.memoryTokens, EdgeTAM) or an M x e x e map (SAM 2.1).
export const slotSize = (v) => v.M * (v.memoryTokens ? v.memoryTokens : v.e * v.e);

// The memory attention's fixed-shape inputs for one object on one frame (memory_bank.select_memory); ptr_pos is
// filled for every model (a graph without pointer positions does not take it).
// v: {e, M, C, K, P, numMaskmem, maxObjPtrs, memoryTokens?}.
export function selectMemory(mem, frame, numFrames, v, reverse) {
  const slot = slotSize(v);
  const spatial = fit(spatialEntries(mem, frame, v, reverse), v.K);
  const { entries, tMax } = pointerEntries(mem, frame, numFrames, v, reverse);
  const pointers = fit(entries, v.P);
  const inputs = {
    mem_feats: new Float32Array(v.K * slot),
    mem_tpos: new Float32Array(v.K),
    mem_valid: new Float32Array(v.K),
    ptrs: new Float32Array(v.P * v.C),
    ptr_pos: new Float32Array(v.P),
    ptr_valid: new Float32Array(v.P),
  };
  spatial.kept.forEach(([tPos, , out], i) => {
    inputs.mem_feats.set(out.maskmem, i * slot);
    inputs.mem_tpos[i] = v.numMaskmem - tPos - 1;
    inputs.mem_valid[i] = 1;
  });
  pointers.kept.forEach(([, d, , out], i) => {
    inputs.ptrs.set(out.objPtr, i * v.C);
    inputs.ptr_pos[i] = f32(d / tMax);
    inputs.ptr_valid[i] = 1;
  });
  return {
    inputs,
    spatial: spatial.kept.map((e) => e[1]),
    pointers: pointers.kept.map((e) => e[2]),
    dropped: spatial.dropped + pointers.dropped,
  };
}

// Index of the best multimask candidate (tokens 1..3) by predicted IoU; the first on a tie (numpy argmax).
export function bestCandidate(iou) {
  let k = 1;
  for (let i = 2; i < 4; i++) if (iou[i] > iou[k]) k = i;
  return k;
}

// SAM 2.1's dynamic single mask: token 0 if its stability score reaches the threshold, else the best candidate.
// masks: 4 * n logits. numpy compares against the Python floats as float32 (NEP 50), so do we.
export function stableToken(masks, iou, n, delta, thresh) {
  const hi = f32(delta);
  const lo = f32(-delta);
  let inter = 0;
  let union = 0;
  for (let i = 0; i < n; i++) {
    if (masks[i] > hi) inter++;
    if (masks[i] > lo) union++;
  }
  const stability = union > 0 ? f32(inter / union) : 1;
  return stability >= f32(thresh) ? 0 : bestCandidate(iou);
}

// Upstream's fill_holes_in_mask_scores: background (logit <= 0) components of 8-connected area <= maxArea get 0.1.
export function fillHoles(logits, side, maxArea) {
  const out = Float32Array.from(logits);
  const seen = new Uint8Array(side * side);
  const stack = new Int32Array(side * side);
  const comp = [];
  for (let start = 0; start < side * side; start++) {
    if (seen[start] || logits[start] > 0) continue;
    let top = 0;
    comp.length = 0;
    stack[top++] = start;
    seen[start] = 1;
    while (top) {
      const p = stack[--top];
      comp.push(p);
      const y = (p / side) | 0;
      const x = p - y * side;
      for (let dy = -1; dy <= 1; dy++) {
        for (let dx = -1; dx <= 1; dx++) {
          const yy = y + dy;
          const xx = x + dx;
          if (yy < 0 || yy >= side || xx < 0 || xx >= side) continue;
          const q = yy * side + xx;
          if (!seen[q] && !(logits[q] > 0)) {
            seen[q] = 1;
            stack[top++] = q;
          }
        }
      }
    }
    if (comp.length <= maxArea) for (const p of comp) out[p] = f32(0.1);
  }
  return out;
}

export class TrackingError extends Error {}

// Sam2VideoPredictor over the page's graphs, for points and boxes (mask prompts stay in Python).
// meta: {numFrames, width, height, imageSize, side, e, C, M, K, P, numMaskmem, maxObjPtrs, noObjScore,
//        stabilityDelta, stabilityThresh, fillHoleArea, noMemEmbed: Float32Array(C), memoryTokens?: N (EdgeTAM)}
// graphs: async memoryAttention(vision, inputs) -> pix; decode(pix, feats, coords, labels, maskInput | null)
//         -> {masks, iou_scores, object_score, obj_ptrs}; encodeMemory(vision, lowRes, binarize, score) -> memory
// features: async frame -> {vision, feat_s0, feat_s1} (vision without no_mem_embed, as encode_frame)
export class Tracker {
  constructor(meta, graphs, features) {
    Object.assign(this, { meta, graphs, features });
    this.objIds = [];
    this.points = []; // obj index -> Map frame -> {coords, labels}
    this.memory = []; // obj index -> ObjectMemory
    this.tracked = []; // obj index -> Map frame -> reverse
    this.droppedSlots = 0;
  }

  objIndex(objId) {
    const i = this.objIds.indexOf(objId);
    if (i >= 0) return i;
    this.objIds.push(objId);
    this.points.push(new Map());
    this.memory.push(new ObjectMemory());
    this.tracked.push(new Map());
    return this.objIds.length - 1;
  }

  checkFrame(frame) {
    const n = this.meta.numFrames;
    if (!(Number.isInteger(frame) && frame >= 0 && frame < n)) {
      throw new TrackingError(`frame ${frame} is out of range; the video has frames 0..${n - 1}`);
    }
  }

  // Upstream's layout in model-input pixels: box corners (labels 2, 3), then points (1 object, 0 background).
  promptPoints(points, labels, box, clearOldPoints) {
    const { width, height, imageSize } = this.meta;
    if (!points && !box) throw new TrackingError('at least one of points or box must be provided as input');
    const coords = [];
    const labs = [];
    if (box) {
      if (!clearOldPoints) throw new TrackingError('cannot add a box without clearing old points; pass clearOldPoints');
      coords.push([box[0], box[1]], [box[2], box[3]]);
      labs.push(2, 3);
    }
    (points || []).forEach((p, i) => {
      coords.push(p);
      labs.push(labels[i]);
    });
    const s = f32(imageSize);
    const scaled = coords.map(([x, y]) => [f32(f32(f32(x) / width) * s), f32(f32(f32(y) / height) * s)]);
    return { coords: scaled, labels: labs };
  }

  // add_new_points_or_box: points [[x, y]] (video pixels), labels, box [x0, y0, x1, y1] -> every object's
  // low-res logits on that frame {frame, objIds, lows}.
  async addNewPointsOrBox(frame, objId, { points = null, labels = null, box = null, clearOldPoints = true } = {}) {
    this.checkFrame(frame);
    if (points && (!labels || labels.length !== points.length)) {
      throw new TrackingError('give one label per point (1 object, 0 background)');
    }
    let prompt = this.promptPoints(points, labels, box, clearOldPoints);
    const idx = this.objIndex(objId);
    const old = this.points[idx].get(frame);
    if (!clearOldPoints && old) {
      prompt = { coords: old.coords.concat(prompt.coords), labels: old.labels.concat(prompt.labels) };
    }
    this.points[idx].set(frame, prompt);
    const mem = this.memory[idx];
    const isInit = !this.tracked[idx].has(frame);
    const reverse = isInit ? false : this.tracked[idx].get(frame);
    const prior = mem.lookup(frame, isInit);
    const prev = prior ? prior.predMasks.map((v) => Math.min(Math.max(v, -32), 32)) : null;
    const out = await this.infer(idx, frame, isInit, prompt, reverse, false, prev);
    (isInit ? mem.tempCond : mem.tempNonCond).set(frame, out);
    return { frame, objIds: [...this.objIds], lows: this.consolidate(frame, isInit) };
  }

  // Every object's low-res logits on one frame (absent objects: the no-object score).
  consolidate(frame, isCond) {
    const n = this.meta.side * this.meta.side;
    return this.memory.map((m) => {
      const o = m.lookup(frame, isCond);
      return o ? o.predMasks : new Float32Array(n).fill(this.meta.noObjScore);
    });
  }

  async preflight() {
    if (!this.objIds.length) throw new TrackingError('no points or box given for any object; add a prompt first');
    for (const [idx, mem] of this.memory.entries()) {
      for (const [temp, store] of [[mem.tempNonCond, mem.nonCond], [mem.tempCond, mem.cond]]) {
        for (const [f, out] of temp) {
          if (out.maskmem === null) {
            const feats = await this.features(f);
            out.maskmem = await this.graphs.encodeMemory(feats.vision, out.predMasks, true, out.score);
          }
          store.set(f, out);
        }
        temp.clear();
      }
      if (!mem.cond.size) {
        throw new TrackingError(`object ${this.objIds[idx]} has no prompt; add points or a box first`);
      }
      for (const f of mem.cond.keys()) mem.nonCond.delete(f);
    }
  }

  // propagate_in_video: onFrame(frame, objIds, lows) per frame, in tracking order.
  async propagate({ start = null, reverse = false, onFrame = () => {} } = {}) {
    await this.preflight();
    const n = this.meta.numFrames;
    const from = start === null ? Math.min(...this.memory.flatMap((m) => [...m.cond.keys()])) : start;
    this.checkFrame(from);
    const order = [];
    if (reverse) for (let f = from; f >= 0 && from > 0; f--) order.push(f);
    else for (let f = from; f < n; f++) order.push(f);
    for (const f of order) {
      const lows = [];
      for (const [idx, mem] of this.memory.entries()) {
        let out = mem.cond.get(f);
        if (!out) {
          out = await this.infer(idx, f, false, null, reverse, true, null);
          mem.nonCond.set(f, out);
        }
        this.tracked[idx].set(f, reverse);
        lows.push(out.predMasks);
      }
      await onFrame(f, [...this.objIds], lows);
    }
  }

  // Upstream track_step for one object: memory (or none on a first prompt) + SAM heads, then the memory encoder.
  async infer(idx, frame, isInit, prompt, reverse, runMem, prev) {
    const feats = await this.features(frame);
    let pix;
    if (isInit) {
      const { C, e } = this.meta;
      pix = new Float32Array(feats.vision.length);
      for (let c = 0; c < C; c++) {
        for (let i = c * e * e; i < (c + 1) * e * e; i++) pix[i] = feats.vision[i] + this.meta.noMemEmbed[c];
      }
    } else {
      const sel = selectMemory(this.memory[idx], frame, this.meta.numFrames, this.meta, reverse);
      this.droppedSlots += sel.dropped;
      pix = await this.graphs.memoryAttention(feats.vision, sel.inputs);
    }
    const out = await this.samHeads(pix, feats, prompt, prev);
    if (runMem) out.maskmem = await this.graphs.encodeMemory(feats.vision, out.predMasks, prompt !== null, out.score);
    if (this.meta.fillHoleArea > 0) out.predMasks = fillHoles(out.predMasks, this.meta.side, this.meta.fillHoleArea);
    return out;
  }

  // Decode with upstream's multimask rule (0 or 1 prompt points) and mask selection; one pad point appended.
  async samHeads(pix, feats, prompt, prev) {
    const { side, C } = this.meta;
    const n = side * side;
    let coords = prompt ? prompt.coords : [[0, 0]];
    let labels = prompt ? prompt.labels : [-1];
    const multimask = (prompt ? prompt.labels.length : 0) <= 1;
    coords = coords.concat([[0, 0]]);
    labels = labels.concat([-1]);
    const dec = await this.graphs.decode(pix, feats, coords, labels, prev);
    const k = multimask ? bestCandidate(dec.iou_scores) : stableToken(dec.masks, dec.iou_scores, n, this.meta.stabilityDelta, this.meta.stabilityThresh);
    const ptrToken = multimask ? k : 0;
    const score = dec.object_score[0];
    const predMasks = score > 0 ? dec.masks.slice(k * n, (k + 1) * n) : new Float32Array(n).fill(this.meta.noObjScore);
    return { predMasks, objPtr: dec.obj_ptrs.slice(ptrToken * C, (ptrToken + 1) * C), score, maskmem: null };
  }
}

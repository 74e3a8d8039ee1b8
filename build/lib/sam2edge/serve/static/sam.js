// Prompt encoding and mask post-processing: the JavaScript port of sam2edge.runtime.prompts.encode_points,
// Sam2Predictor._prompt_points (upstream's prompt order) and the predictor's mask upsampling
// (bilinear, align_corners=False, threshold 0). float32 rounding (Math.fround) follows numpy / torch.

const f32 = Math.fround;

// Tables (Float32Array, row-major): gaussian (2, C/2), point_embed (4, C), not_a_point (C), no_mask (C).
export function tableShapes(tables) {
  const c = tables.not_a_point.length;
  return { c, half: c / 2 };
}

// Upstream's prompt order in model-input pixels: box corners (labels 2, 3), then points, then one pad (-1).
// points: [{x, y, label}] in photo pixels; box: {x0, y0, x1, y1} | null; (w, h) photo size; s model side.
export function promptLayout(points, box, w, h, s) {
  const sx = (x) => f32(f32(f32(x) / f32(w)) * s); // as the predictor: (x / w) * S in float32
  const sy = (y) => f32(f32(f32(y) / f32(h)) * s);
  const coords = [];
  const labels = [];
  if (box) {
    coords.push([sx(box.x0), sy(box.y0)], [sx(box.x1), sy(box.y1)]);
    labels.push(2, 3);
  }
  for (const p of points) {
    coords.push([sx(p.x), sy(p.y)]);
    labels.push(p.label);
  }
  if (points.length || box) {
    coords.push([0, 0]);
    labels.push(-1);
  }
  return { coords, labels };
}

// coords [[X, Y]] model-input pixels, labels -> {tokens Float32Array K*C, valid Float32Array K} (ignored slots 0).
export function encodePoints(coords, labels, tables, imageSize, numTokens) {
  const { c, half } = tableShapes(tables);
  const n = labels.length;
  if (n > numTokens) {
    throw new Error(`${n} prompt tokens do not fit the decoder's ${numTokens} slots`);
  }
  const tokens = new Float32Array(numTokens * c);
  const valid = new Float32Array(numTokens);
  const g = tables.gaussian;
  const twoPi = f32(2 * Math.PI);
  for (let i = 0; i < n; i++) {
    valid[i] = 1;
    const lab = labels[i];
    const row = tokens.subarray(i * c, (i + 1) * c);
    if (lab === -1) {
      row.set(tables.not_a_point);
      continue;
    }
    const cx = f32(f32(2 * f32(f32(coords[i][0] + 0.5) / imageSize)) - 1);
    const cy = f32(f32(2 * f32(f32(coords[i][1] + 0.5) / imageSize)) - 1);
    const emb = tables.point_embed.subarray(lab * c, (lab + 1) * c);
    for (let j = 0; j < half; j++) {
      const proj = f32(twoPi * f32(f32(cx * g[j]) + f32(cy * g[half + j])));
      row[j] = f32(f32(Math.sin(proj)) + emb[j]);
      row[half + j] = f32(f32(Math.cos(proj)) + emb[half + j]);
    }
  }
  return { tokens, valid };
}

// The dense prompt for "no mask input": no_mask broadcast to 1 x C x e x e.
export function noMaskDense(tables, e) {
  const c = tables.no_mask.length;
  const out = new Float32Array(c * e * e);
  for (let k = 0; k < c; k++) out.fill(tables.no_mask[k], k * e * e, (k + 1) * e * e);
  return out;
}

// Which answer the page shows: one click alone is ambiguous -> best of the 3 candidates by predicted IoU
// (upstream multimask_output=True); anything more -> the single-mask output (multimask_output=False).
export function chooseMask(out, side, multimask) {
  const n = side * side;
  if (!multimask) return { logits: out.single_mask.subarray(0, n), iou: out.single_iou[0], index: -1 };
  let best = 0;
  for (let i = 1; i < 3; i++) if (out.iou_scores[i] > out.iou_scores[best]) best = i;
  return { logits: out.masks.subarray(best * n, (best + 1) * n), iou: out.iou_scores[best], index: best };
}

// PyTorch's source index for bilinear, align_corners=False: scale = in / out; src = scale*(dst+0.5)-0.5, >= 0.
function axis(inSize, outSize) {
  const scale = f32(inSize / outSize);
  const i0 = new Int32Array(outSize);
  const i1 = new Int32Array(outSize);
  const l1 = new Float32Array(outSize);
  for (let d = 0; d < outSize; d++) {
    let src = f32(f32(scale * f32(d + 0.5)) - 0.5);
    if (src < 0) src = 0;
    const i = Math.floor(src);
    i0[d] = i;
    i1[d] = i < inSize - 1 ? i + 1 : i;
    l1[d] = f32(src - i);
  }
  return { i0, i1, l1 };
}

// Low-res logits side x side -> binary mask h x w (Uint8Array, 1 = object): bilinear, align_corners=False, > 0.
export function upsampleMask(logits, side, h, w) {
  const ax = axis(side, w);
  const ay = axis(side, h);
  const mask = new Uint8Array(h * w);
  for (let y = 0; y < h; y++) {
    const r0 = ay.i0[y] * side;
    const r1 = ay.i1[y] * side;
    const ly1 = ay.l1[y];
    const ly0 = f32(1 - ly1);
    const o = y * w;
    for (let x = 0; x < w; x++) {
      const c0 = ax.i0[x];
      const c1 = ax.i1[x];
      const lx1 = ax.l1[x];
      const lx0 = f32(1 - lx1);
      const top = f32(f32(lx0 * logits[r0 + c0]) + f32(lx1 * logits[r0 + c1]));
      const bot = f32(f32(lx0 * logits[r1 + c0]) + f32(lx1 * logits[r1 + c1]));
      const v = f32(f32(ly0 * top) + f32(ly1 * bot));
      mask[o + x] = v > 0 ? 1 : 0;
    }
  }
  return mask;
}

// The image encoder in the page (LiteRT.js): the serve page's photos and clip frames. No DOM here.
// Photos: RGBA pixels -> runtime.preprocess.preprocess (RGB / 255, torchvision's antialiased bilinear resize to
// S x S, ImageNet mean/std, 1x3xSxS float32). Clip frames: the S x S x 3 uint8 frame Sam2VideoPredictor.init_state
// made (the server's /pixels/N) -> Sam2VideoPredictor.frame_features' normalisation. Then the bundle's encoder ->
// {image_embeddings 1xCxexe, feat_s0, feat_s1}; a tracked frame's vision is image_embeddings - no_mem_embed.
import { nameOutputs, orderInputs, runModel } from './litert.js';

export const ENCODER_OUT = ['image_embeddings', 'feat_s0', 'feat_s1'];
const MEAN = [0.485, 0.456, 0.406];
const STD = [0.229, 0.224, 0.225];
const f32 = Math.fround;

// torchvision's antialiased bilinear weights along one axis (PyTorch _upsample_bilinear2d_aa).
function aaWeights(inSize, outSize) {
  const scale = inSize / outSize;
  const support = scale >= 1 ? scale : 1;
  const inv = scale >= 1 ? 1 / scale : 1;
  const rows = [];
  for (let i = 0; i < outSize; i++) {
    const center = scale * (i + 0.5);
    const xmin = Math.max(Math.trunc(center - support + 0.5), 0);
    const xmax = Math.min(Math.trunc(center + support + 0.5), inSize);
    const w = [];
    let total = 0;
    for (let j = xmin; j < xmax; j++) {
      const x = Math.abs((j - center + 0.5) * inv);
      const v = x < 1 ? 1 - x : 0;
      w.push(v);
      total += v;
    }
    rows.push({ xmin, w: w.map((v) => (total ? v / total : 0)) });
  }
  return rows;
}

// RGBA pixels (w x h) -> 1x3xSxS float32, as runtime.preprocess.preprocess (a photo).
export function preprocess(rgba, w, h, s) {
  const out = new Float32Array(3 * s * s);
  const ax = aaWeights(w, s);
  const ay = aaWeights(h, s);
  const tmp = new Float32Array(3 * h * s); // horizontal pass: 3 x h x S
  for (let c = 0; c < 3; c++) {
    for (let y = 0; y < h; y++) {
      for (let x = 0; x < s; x++) {
        if (w === s) {
          tmp[(c * h + y) * s + x] = f32(rgba[4 * (y * w + x) + c] / 255);
          continue;
        }
        const { xmin, w: wt } = ax[x];
        let acc = 0;
        for (let k = 0; k < wt.length; k++) acc += wt[k] * f32(rgba[4 * (y * w + xmin + k) + c] / 255);
        tmp[(c * h + y) * s + x] = acc;
      }
    }
    for (let y = 0; y < s; y++) {
      const { xmin, w: wt } = ay[y];
      for (let x = 0; x < s; x++) {
        let v;
        if (h === s) v = tmp[(c * h + y) * s + x];
        else {
          v = 0;
          for (let k = 0; k < wt.length; k++) v += wt[k] * tmp[(c * h + xmin + k) * s + x];
        }
        out[(c * s + y) * s + x] = f32(f32(f32(v) - f32(MEAN[c])) / f32(STD[c]));
      }
    }
  }
  return out;
}

// S x S x 3 uint8 RGB (HWC) -> 1x3xSxS float32: (x / 255 in float64, to float32 - mean) / std in float32,
// as Sam2VideoPredictor.frame_features (a clip frame).
export function normalizeFrame(rgb, s) {
  const out = new Float32Array(3 * s * s);
  for (let c = 0; c < 3; c++) {
    const m = f32(MEAN[c]);
    const sd = f32(STD[c]);
    for (let i = 0; i < s * s; i++) out[c * s * s + i] = f32(f32(f32(rgb[3 * i + c] / 255) - m) / sd);
  }
  return out;
}

// The encoder on one preprocessed image -> {image_embeddings, feat_s0, feat_s1} (Float32Array each).
// enc: {model (LiteRT.js), inputs, outputs} (the I/O names of /api/info's encoder, tensor order).
export async function encodeImage(enc, x) {
  const outs = await runModel(enc.model, orderInputs(enc.model, { image: x }, enc.inputs));
  return nameOutputs(enc.model, outs, ENCODER_OUT, enc.outputs);
}

// vision = image_embeddings - no_mem_embed per channel (float32), as BundleVideoBackend.encode_frame.
export function visionOf(embed, noMemEmbed, e) {
  const out = new Float32Array(embed.length);
  const ee = e * e;
  for (let c = 0; c < noMemEmbed.length; c++) {
    for (let i = c * ee; i < (c + 1) * ee; i++) out[i] = f32(embed[i] - noMemEmbed[c]);
  }
  return out;
}

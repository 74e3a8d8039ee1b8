// Recording the live view: the overlay (frame + masks, as the model saw it) as a WebM through MediaRecorder,
// and every processed frame's label map as a PNG (pixel value = object id, 0 = background) in a zip.
// node_modules holds no zip library, so the zip is written here: STORE only (PNGs are already compressed).

const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();

export function crc32(bytes) {
  let c = 0xffffffff;
  for (let i = 0; i < bytes.length; i++) c = CRC_TABLE[(c ^ bytes[i]) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

// [{name, bytes: Uint8Array}] -> a zip archive (Uint8Array), every entry stored (method 0), no data descriptors.
export function zipStore(files) {
  const enc = new TextEncoder();
  const parts = [];
  const central = [];
  let offset = 0;
  for (const f of files) {
    const name = enc.encode(f.name);
    const crc = crc32(f.bytes);
    const local = new DataView(new ArrayBuffer(30));
    local.setUint32(0, 0x04034b50, true); // local file header
    local.setUint16(4, 20, true); // version needed: 2.0
    local.setUint16(8, 0, true); // method: store
    local.setUint32(14, crc, true);
    local.setUint32(18, f.bytes.length, true);
    local.setUint32(22, f.bytes.length, true);
    local.setUint16(26, name.length, true);
    parts.push(new Uint8Array(local.buffer), name, f.bytes);
    const cd = new DataView(new ArrayBuffer(46));
    cd.setUint32(0, 0x02014b50, true); // central directory entry
    cd.setUint16(4, 20, true);
    cd.setUint16(6, 20, true);
    cd.setUint32(16, crc, true);
    cd.setUint32(20, f.bytes.length, true);
    cd.setUint32(24, f.bytes.length, true);
    cd.setUint16(28, name.length, true);
    cd.setUint32(42, offset, true);
    central.push(new Uint8Array(cd.buffer), name);
    offset += 30 + name.length + f.bytes.length;
  }
  const cdSize = central.reduce((a, b) => a + b.length, 0);
  const end = new DataView(new ArrayBuffer(22));
  end.setUint32(0, 0x06054b50, true); // end of central directory
  end.setUint16(8, files.length, true);
  end.setUint16(10, files.length, true);
  end.setUint32(12, cdSize, true);
  end.setUint32(16, offset, true);
  const all = [...parts, ...central, new Uint8Array(end.buffer)];
  const out = new Uint8Array(all.reduce((a, b) => a + b.length, 0));
  let at = 0;
  for (const p of all) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

// A label map (Uint8Array w*h, object ids) -> PNG bytes (grey: every channel = the id, opaque).
async function labelPng(labels, w, h) {
  const c = new OffscreenCanvas(w, h);
  const ctx = c.getContext('2d');
  const img = ctx.createImageData(w, h);
  for (let i = 0; i < labels.length; i++) img.data.set([labels[i], labels[i], labels[i], 255], 4 * i);
  ctx.putImageData(img, 0, 0);
  return new Uint8Array(await (await c.convertToBlob({ type: 'image/png' })).arrayBuffer());
}

function download(blob, name) {
  const a = document.createElement('a');
  a.href = URL.createObjectURL(blob);
  a.download = name;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 60_000);
}

// start(canvas) records the canvas's stream; addMasks(frame, labels, w, h) per processed frame; stop() ->
// {webm: Blob, zip: Uint8Array, frames} and offers both as downloads.
export class Recorder {
  constructor() {
    this.recorder = null;
  }

  get active() {
    return this.recorder !== null;
  }

  start(canvas) {
    if (typeof MediaRecorder === 'undefined') throw new Error('this browser has no MediaRecorder; recording is unavailable');
    const type = ['video/webm;codecs=vp9', 'video/webm;codecs=vp8', 'video/webm'].find((t) => MediaRecorder.isTypeSupported(t));
    if (!type) throw new Error('this browser cannot record WebM; recording is unavailable');
    this.chunks = [];
    this.pngs = [];
    this.recorder = new MediaRecorder(canvas.captureStream(), { mimeType: type });
    this.recorder.ondataavailable = (ev) => ev.data.size && this.chunks.push(ev.data);
    this.recorder.start(500);
  }

  addMasks(frame, labels, w, h) {
    if (!this.recorder) return;
    const name = `frame_${String(frame).padStart(6, '0')}.png`;
    this.pngs.push(labelPng(labels, w, h).then((bytes) => ({ name, bytes })));
  }

  async stop(save = true) {
    const rec = this.recorder;
    this.recorder = null;
    const stopped = new Promise((resolve) => (rec.onstop = resolve));
    if (rec.state !== 'inactive') rec.stop();
    await stopped;
    const webm = new Blob(this.chunks, { type: 'video/webm' });
    const files = await Promise.all(this.pngs);
    const zip = zipStore(files);
    if (save) {
      const stamp = new Date().toISOString().replace(/[:.]/g, '-');
      download(webm, `sam2edge-${stamp}.webm`);
      download(new Blob([zip], { type: 'application/zip' }), `sam2edge-${stamp}-masks.zip`);
    }
    return { webm, zip, frames: files.length };
  }
}

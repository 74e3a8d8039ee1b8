// Live tracking in the static site: the camera (getUserMedia) or a video file the user opens, decoded by a
// <video> element and read through a canvas. Tracking always runs on the NEWEST frame: while the model works on
// one frame the camera keeps presenting, and every frame presented in between is dropped (counted), never
// queued. A tap adds a point to the current object (right click: background), a drag a box; the prompt lands on
// the next processed frame. The page shows the achieved frames per second and per-stage milliseconds.
// `?keep=frames` keeps every processed frame's pixels and masks (for tests: window.sam2edge.live).
import { STAGES, LiveTracker } from './pipeline.js';
import { Recorder } from './record.js';
import { upsampleMask } from './sam.js';
import { TrackingError } from './tracker.js';

const $ = (id) => document.getElementById(id);
const COLOURS = [[230, 25, 75], [60, 180, 75], [255, 225, 25], [0, 130, 200], [245, 130, 48], [145, 30, 180]];
const KEEP_LIMIT = 600; // processed frames kept with ?keep=frames

let page = null; // {state, setStatus, loadPipeline}
const live = {
  running: false, source: null, processed: 0, presented: 0, dropped: 0, fps: 0, times: {}, obj: 1, objects: [1],
  pending: [], calls: [], kept: [], error: null, stops: 0, recording: null, history: [],
};
const HISTORY = 200; // per processed frame: {frame, t (ms, page clock), presented, dropped, ms per stage}
const recorder = new Recorder();
const keep = new URLSearchParams(location.search).get('keep') === 'frames';

// Explanations of getUserMedia's failures: one line naming the problem and the fix.
function cameraError(e) {
  const name = e && e.name;
  if (name === 'NotAllowedError' || name === 'SecurityError') {
    return 'camera permission denied: allow the camera for this page in the browser (site settings) and press Camera again';
  }
  if (name === 'NotFoundError' || name === 'OverconstrainedError') return 'no camera found: connect a camera and press Camera again';
  if (name === 'NotReadableError' || name === 'AbortError') {
    return 'the camera is in use by another program or failed to start: close it there and press Camera again';
  }
  return `the camera could not start (${(e && e.message) || e}); press Camera again`;
}

function setStats() {
  const t = live.times;
  const stages = STAGES.filter((s) => t[s] !== undefined).map((s) => `${s.replace('_', ' ')} ${t[s].toFixed(1)} ms`);
  const src = live.source === 'camera' ? 'camera frames' : 'video frames';
  $('live-stats').textContent = `${live.fps.toFixed(2)} FPS · ${src} ${live.presented} · processed ${live.processed} · dropped ${live.dropped}` + (stages.length ? ` · ${stages.join(' · ')}` : '');
  document.body.dataset.processed = String(live.processed);
}

// The label map (frame pixels, value = object id, later objects win) from the objects' low-res logits.
function labelMap(lows, w, h) {
  const out = new Uint8Array(w * h);
  const side = page.state.cfg.model.mask_side;
  lows.forEach((low, i) => {
    const m = upsampleMask(low, side, h, w);
    for (let p = 0; p < m.length; p++) if (m[p]) out[p] = live.tracker.tracker.objIds[i];
  });
  return out;
}

function drawOverlay(ctx, labels, w, h) {
  const img = ctx.createImageData(w, h);
  for (let i = 0; i < labels.length; i++) {
    if (!labels[i]) continue;
    const [r, g, b] = COLOURS[(labels[i] - 1) % COLOURS.length];
    img.data.set([r, g, b, 128], 4 * i);
  }
  return img;
}

// Wait for a frame the loop has not taken yet (requestVideoFrameCallback counts presented frames).
function nextFrame(s) {
  return new Promise((resolve) => {
    const check = () => (!s.running || s.presented > s.taken ? resolve(s.running) : (s.wake = check));
    check();
  });
}

async function loop(s) {
  const { video, w, h } = s;
  const grab = document.createElement('canvas');
  grab.width = w;
  grab.height = h;
  const gctx = grab.getContext('2d', { willReadFrequently: true });
  const overlay = $('live-layer').getContext('2d');
  const rec = s.recordCanvas.getContext('2d');
  const stamps = [];
  while (await nextFrame(s)) {
    if (s.track && s.track.readyState === 'ended') {
      stop(s, 'the camera stopped (unplugged, or turned off by the system); press Camera to start it again', true);
      break;
    }
    const presented = s.presented;
    gctx.drawImage(video, 0, 0, w, h);
    const { data } = gctx.getImageData(0, 0, w, h);
    live.dropped += Math.max(0, presented - s.taken - 1);
    s.taken = presented;
    const prompts = live.pending.splice(0);
    let res;
    try {
      res = await live.tracker.step(data, prompts);
    } catch (e) {
      if (e instanceof TrackingError && s.running) {
        page.setStatus(`${e.message}`, true); // a prompt the tracker refused; tracking goes on
        continue;
      }
      stop(s, `tracking stopped: ${e.message || e}`, true);
      break;
    }
    if (!s.running) break;
    live.processed += 1;
    live.presented = presented;
    live.times = res.times;
    stamps.push(performance.now());
    if (stamps.length > 10) stamps.shift();
    live.fps = stamps.length > 1 ? ((stamps.length - 1) * 1000) / (stamps[stamps.length - 1] - stamps[0]) : 0;
    const labels = labelMap(res.lows, w, h);
    const img = drawOverlay(overlay, labels, w, h);
    overlay.putImageData(img, 0, 0);
    rec.putImageData(new ImageData(data, w, h), 0, 0);
    const tmp = new OffscreenCanvas(w, h);
    tmp.getContext('2d').putImageData(img, 0, 0);
    rec.drawImage(tmp, 0, 0);
    recorder.addMasks(res.frame, labels, w, h);
    live.history.push({ frame: res.frame, t: stamps[stamps.length - 1], presented, dropped: live.dropped, ...res.times });
    if (live.history.length > HISTORY) live.history.shift();
    if (keep && live.kept.length < KEEP_LIMIT) live.kept.push({ frame: res.frame, presented, rgba: data, lows: res.lows, labels });
    setStats();
  }
}

function stop(s, message = null, isError = false) {
  if (!s || !s.running) return;
  s.running = false;
  live.running = false;
  if (s.wake) s.wake();
  if (s.stream) for (const t of s.stream.getTracks()) t.stop();
  s.video.pause();
  $('stop').hidden = true;
  if (recorder.active) finishRecording();
  live.stops += 1;
  document.body.dataset.liveStops = String(live.stops);
  if (message) page.setStatus(message, isError);
}

async function start(source, file = null) {
  if (live.running) stop(live.session);
  page.setStatus(source === 'camera' ? 'starting the camera…' : 'opening the video…');
  let pipeline;
  try {
    pipeline = await page.loadPipeline((m) => page.setStatus(m));
  } catch (e) {
    page.setStatus(e.message || String(e), true);
    return;
  }
  const video = $('live-video');
  const s = { source, file, video, running: true, presented: 0, taken: 0, wake: null, stream: null, track: null };
  try {
    if (source === 'camera') {
      if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
        throw Object.assign(new Error('the camera needs a secure page (https:// or http://localhost)'), { name: 'Insecure' });
      }
      s.stream = await navigator.mediaDevices.getUserMedia({ video: true, audio: false });
      s.track = s.stream.getVideoTracks()[0];
      s.track.addEventListener('ended', () => {
        stop(s, 'the camera stopped (unplugged, or turned off by the system); press Camera to start it again', true);
      });
      video.removeAttribute('src');
      video.srcObject = s.stream;
    } else {
      video.srcObject = null;
      if (video.src.startsWith('blob:')) URL.revokeObjectURL(video.src);
      video.src = URL.createObjectURL(file);
    }
    await new Promise((resolve, reject) => {
      video.onloadeddata = resolve;
      video.onerror = () => reject(Object.assign(new Error('the browser cannot decode this video; pick an MP4 (H.264) or WebM file'), { name: 'Decode' }));
    });
    video.onerror = () => stop(s, 'the video failed while playing; open it again or pick another file', true);
    video.onended = () => stop(s, `the video ended: ${live.processed} frames processed, ${live.dropped} dropped`);
    await video.play();
  } catch (e) {
    s.running = false;
    if (s.stream) for (const t of s.stream.getTracks()) t.stop();
    const msg = source === 'camera' && e.name !== 'Insecure' ? cameraError(e) : e.message || String(e);
    page.setStatus(msg, true);
    return;
  }
  if (!video.requestVideoFrameCallback) {
    stop(s, 'this browser lacks requestVideoFrameCallback; live tracking needs Chrome, Edge or Safari', true);
    return;
  }
  s.w = video.videoWidth;
  s.h = video.videoHeight;
  s.recordCanvas = document.createElement('canvas');
  s.recordCanvas.width = s.w;
  s.recordCanvas.height = s.h;
  const layer = $('live-layer');
  layer.width = s.w;
  layer.height = s.h;
  const onFrame = (now, meta) => {
    if (!s.running) return;
    s.presented = meta.presentedFrames;
    if (s.wake) {
      const w = s.wake;
      s.wake = null;
      w();
    }
    video.requestVideoFrameCallback(onFrame);
  };
  video.requestVideoFrameCallback(onFrame);
  Object.assign(live, {
    running: true, source, session: s, processed: 0, presented: 0, dropped: 0, fps: 0, times: {}, obj: 1,
    objects: [1], pending: [], kept: [], history: [], width: s.w, height: s.h, recording: null,
  });
  live.tracker = new LiveTracker(pipeline, s.w, s.h);
  live.calls = live.tracker.calls;
  page.state.image = null; // the photo tools stand down while live
  $('stage').style.display = 'none'; // style.css shows #stage as inline-block, over the hidden attribute
  $('live').hidden = false;
  for (const id of ['stop', 'new-object', 'object-label', 'record', 'resolution-wrap']) $(id).hidden = false;
  $('record').textContent = 'Record';
  showObject();
  const what = source === 'camera' ? 'camera' : `video ${file.name}`;
  page.setStatus(`${what} ${s.w}x${s.h} · tap the object to track (frames the model cannot keep up with are dropped)`);
  setStats();
  loop(s).catch((e) => stop(s, `tracking stopped: ${e.message || e}`, true));
}

function showObject() {
  $('object-label').textContent = `object ${live.obj}`;
}

async function finishRecording() {
  try {
    const out = await recorder.stop(true);
    live.recording = { webmBytes: out.webm.size, zip: out.zip, frames: out.frames };
    $('record').textContent = 'Record';
    page.setStatus(`saved the recording (WebM, ${(out.webm.size / 1e3).toFixed(0)} kB) and ${out.frames} mask PNGs (zip)`);
  } catch (e) {
    page.setStatus(`the recording failed: ${e.message || e}`, true);
  }
  document.body.dataset.recordings = String(Number(document.body.dataset.recordings || 0) + 1);
}

function toggleRecording() {
  if (recorder.active) {
    finishRecording();
    return;
  }
  if (!live.running) return;
  try {
    recorder.start(live.session.recordCanvas);
    $('record').textContent = 'Stop recording';
  } catch (e) {
    page.setStatus(e.message, true);
  }
}

// ---- taps on the live view ----------------------------------------------------------------------------
let down = null;
function toFrame(ev) {
  const r = $('live-layer').getBoundingClientRect();
  const x = ((ev.clientX - r.left) * live.width) / r.width;
  const y = ((ev.clientY - r.top) * live.height) / r.height;
  return { x: Math.min(Math.max(x, 0), live.width - 1), y: Math.min(Math.max(y, 0), live.height - 1) };
}

function onDown(ev) {
  if (!live.running) return;
  ev.preventDefault();
  down = { ...toFrame(ev), cx: ev.clientX, cy: ev.clientY, negative: ev.button === 2 || ev.altKey };
}

function onUp(ev) {
  if (!down || !live.running) return;
  const start = down;
  down = null;
  const end = toFrame(ev);
  if (Math.hypot(ev.clientX - start.cx, ev.clientY - start.cy) >= 5) {
    const box = [Math.min(start.x, end.x), Math.min(start.y, end.y), Math.max(start.x, end.x), Math.max(start.y, end.y)];
    live.pending.push({ obj: live.obj, points: null, labels: null, box, clear: true });
  } else {
    live.pending.push({ obj: live.obj, points: [[start.x, start.y]], labels: [start.negative ? 0 : 1], box: null, clear: false });
  }
}

// For tests and scripts: a kept frame's RGB pixels, or one object's mask (1 = object) there, as base64 bytes.
function b64(bytes) {
  let s = '';
  for (let i = 0; i < bytes.length; i += 4096) s += String.fromCharCode.apply(null, bytes.subarray(i, i + 4096));
  return btoa(s);
}
live.frameB64 = (i) => {
  const { rgba } = live.kept[i];
  const rgb = new Uint8Array((rgba.length / 4) * 3);
  for (let p = 0, q = 0; p < rgba.length; p += 4, q += 3) rgb.set(rgba.subarray(p, p + 3), q);
  return b64(rgb);
};
live.maskB64 = (i, obj) => b64(upsampleMask(live.kept[i].lows[obj], page.state.cfg.model.mask_side, live.height, live.width));
live.zipB64 = () => (live.recording ? b64(live.recording.zip) : null);
live.labelsB64 = (i) => b64(live.kept[i].labels);
live.stop = () => stop(live.session);
live.restart = (s) => start(s.source, s.file); // the same camera or video, from no objects

export function setUpLive(state, setStatus, loadPipeline, switchResolution) {
  page = { state, setStatus, loadPipeline };
  state.live = live;
  const sel = $('resolution');
  for (const r of state.cfg.resolutions || [state.cfg.resolution]) {
    const o = document.createElement('option');
    o.value = String(r);
    o.textContent = `${r} px`;
    sel.appendChild(o);
  }
  sel.value = String(state.cfg.resolution);
  sel.disabled = sel.options.length < 2; // a site of one bundle offers its one resolution
  if (!sel.disabled) $('resolution-wrap').hidden = false; // photos too
  sel.addEventListener('change', async () => {
    sel.disabled = true;
    await switchResolution(Number(sel.value));
    sel.value = String(state.cfg.resolution);
    sel.disabled = false;
  });
  $('camera').addEventListener('click', () => start('camera'));
  $('video-file').addEventListener('change', (ev) => ev.target.files[0] && start('clip', ev.target.files[0]));
  $('stop').addEventListener('click', () => stop(live.session, `stopped: ${live.processed} frames processed, ${live.dropped} dropped`));
  $('new-object').addEventListener('click', () => {
    live.obj = Math.max(...live.objects) + 1;
    live.objects.push(live.obj);
    showObject();
  });
  $('record').addEventListener('click', toggleRecording);
  const layer = $('live-layer');
  layer.addEventListener('contextmenu', (ev) => ev.preventDefault());
  layer.addEventListener('pointerdown', onDown);
  window.addEventListener('pointerup', onUp);
  $('file').addEventListener('change', () => {
    stop(live.session);
    $('live').hidden = true;
    $('stage').style.display = '';
  });
}

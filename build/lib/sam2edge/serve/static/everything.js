// "Segment everything": shown when /api/info says the server's model decodes B prompts per call (a bundle with
// the batched decoder, or eager weights). The server runs a 32x32 grid with upstream's filters on the photo's
// features and answers the photo with each mask in its own colour; it replaces the photo until Clear or the next
// photo. Query option: ?everything_side=N (grid points per side).

const $ = (id) => document.getElementById(id);

export function setUpEverything(state, api, setStatus) {
  const button = $('everything');
  button.hidden = !state.info.everything;
  if (!state.info.everything) return;
  const side = new URLSearchParams(location.search).get('everything_side');
  let plain = null; // the photo's own URL while the overlay is shown
  button.addEventListener('click', async () => {
    if (!state.image) return setStatus('open a photo first', true);
    if (state.busy) return;
    state.busy = true;
    button.disabled = true;
    setStatus('segmenting everything on the server…');
    const t0 = performance.now();
    try {
      const query = side ? `?points_per_side=${encodeURIComponent(side)}` : '';
      const res = await api(`/api/images/${state.image.id}/everything${query}`, { method: 'POST' });
      const blob = await res.blob();
      const img = $('photo');
      if (plain === null) plain = img.src;
      img.src = URL.createObjectURL(blob);
      state.everything = { masks: Number(res.headers.get('X-Masks')), ms: performance.now() - t0 };
      setStatus(`segment everything: ${state.everything.masks} masks · ${state.everything.ms.toFixed(0)} ms (server)`);
    } catch (e) {
      setStatus(`segment everything failed: ${e.message}`, true);
    } finally {
      state.busy = false;
      button.disabled = false;
    }
  });
  const restore = () => {
    if (plain !== null && $('photo').src !== plain) $('photo').src = plain;
    plain = null;
  };
  $('clear').addEventListener('click', restore);
  $('file').addEventListener('change', () => (plain = null));
  $('sample').addEventListener('change', () => (plain = null));
}

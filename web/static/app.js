// rtcedge demo page: one call through the relays to the pods' backend (the
// echo, or a model server speaking the OpenAI Realtime protocol), with live
// getStats() charts and the events data channel. Plain browser
// JavaScript: no build step, no external assets, works offline.
//
// window.rtcedge holds the page's state as plain data (state, region,
// cluster, pop, backend, lastError, stats, timings, events) for people in the
// console and for the browser tests; <body data-state> mirrors its state.
(() => {
  'use strict';

  const API = ''; // signaling serves this page, so the API is same-origin
  const HISTORY = 60; // samples per chart, one a second
  const GATHER_TIMEOUT_MS = 5000; // the server takes one complete offer
  const CONNECT_TIMEOUT_MS = 20000;
  const MAX_EVENTS = 50;
  const RTT_WINDOW = 10; // samples (seconds) in the RTT's moving mean

  const $ = (id) => document.getElementById(id);

  const rtcedge = {
    state: 'idle',
    region: null, cluster: null, pop: null, backupPop: null,
    location: null, session: null, backend: null,
    connectionState: null, iceState: null, remoteAddress: null,
    lastError: null,
    stats: null,
    stalledSeconds: 0,
    timings: {},
    events: [],
    // turns: the pod's figures per turn (rtcedge.turn events): reply delay,
    // barge-in stop time and the audio sent before it.
    turns: [],
    iceRestarts: 0, // ICE restarts done by PATCH (see restartIce)
  };
  // The live RTCPeerConnection (kept after hang-up until the next call).
  // Not enumerable, so that JSON.stringify(rtcedge) stays plain data.
  Object.defineProperty(rtcedge, 'pc', { value: null, writable: true, enumerable: false });
  window.rtcedge = rtcedge;

  // An error to show: a message for people, a code for machines.
  class UIError extends Error {
    constructor(message, code, status) {
      super(message);
      this.code = code || 'error';
      this.status = status || 0;
    }
  }
  // Thrown inside a call that was hung up while it was being set up.
  class Aborted extends Error {}

  const ACTIVE = new Set(['minting', 'media', 'gathering', 'signaling', 'connecting', 'connected', 'disconnected']);

  function setState(s) {
    rtcedge.state = s;
    document.body.dataset.state = s;
    const pill = $('state-pill');
    pill.textContent = s;
    pill.dataset.state = s;
    $('call').disabled = ACTIVE.has(s) || s === 'hanging-up';
    $('hangup').disabled = !ACTIVE.has(s);
    $('send').disabled = !(call && call.dc && call.dc.readyState === 'open');
  }

  function showError(err) {
    const e = err instanceof UIError ? err : new UIError(String(err && err.message || err), 'error');
    rtcedge.lastError = { message: e.message, code: e.code, status: e.status };
    $('error-message').textContent = e.message;
    $('error-code').textContent = e.status ? `${e.code} · HTTP ${e.status}` : e.code;
    $('error').hidden = false;
    console.error('rtcedge:', e.code, e.message);
  }

  function clearError() {
    rtcedge.lastError = null;
    $('error').hidden = true;
  }

  function setText(id, v) { $(id).textContent = v == null || v === '' ? '—' : String(v); }

  // apiError turns a failed API response into a UIError, using the JSON
  // error body {"error":{"type","code","message"}} when there is one.
  async function apiError(res, what) {
    let body = null;
    try { body = await res.json(); } catch (_) { /* not JSON */ }
    const e = body && body.error;
    if (e && e.message) return new UIError(`${what}: ${e.message}`, e.code || e.type, res.status);
    return new UIError(`${what}: HTTP ${res.status} ${res.statusText}`.trim(), `http_${res.status}`, res.status);
  }

  async function request(what, url, init) {
    try {
      return await fetch(API + url, init);
    } catch (e) {
      throw new UIError(`${what}: could not reach signaling (${e.message})`, 'network_error');
    }
  }

  function micError(e) {
    switch (e && e.name) {
      case 'NotAllowedError':
      case 'SecurityError':
        return new UIError('Microphone access was refused. Allow the microphone for this page and call again.', 'mic_denied');
      case 'NotFoundError':
      case 'OverconstrainedError':
        return new UIError('No microphone was found.', 'no_microphone');
      case 'NotReadableError':
        return new UIError('The microphone is in use by another program or cannot be opened.', 'mic_unavailable');
      default:
        return new UIError(`Could not open the microphone: ${e && e.message || e}`, 'mic_error');
    }
  }

  // waitGathering resolves when ICE gathering is complete, or after a
  // timeout: the server (ICE-lite, relay candidates only) does not need
  // our candidates, so a partial offer still works.
  function waitGathering(pc, ms) {
    if (pc.iceGatheringState === 'complete') return Promise.resolve(true);
    return new Promise((resolve) => {
      const done = (ok) => {
        clearTimeout(timer);
        pc.removeEventListener('icegatheringstatechange', check);
        resolve(ok);
      };
      const check = () => { if (pc.iceGatheringState === 'complete') done(true); };
      const timer = setTimeout(() => done(false), ms);
      pc.addEventListener('icegatheringstatechange', check);
    });
  }

  // ---- the call ----------------------------------------------------------

  let call = null; // the current call; null when there is none

  function newCall() {
    return {
      t0: performance.now(), ended: false,
      secret: null, stream: null, pc: null, dc: null, location: null,
      statsTimer: 0, connectTimer: 0, prev: null, lastPackets: -1, rttPair: null, rttRing: [],
    };
  }

  async function startCall() {
    if (call) return;
    clearError();
    resetView();
    const c = newCall();
    call = c;
    const live = () => { if (c.ended) throw new Aborted(); };
    try {
      setState('minting');
      const sres = await request('Minting a client secret', '/v1/realtime/client_secrets', {
        method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{}',
      });
      if (!sres.ok) throw await apiError(sres, 'Minting a client secret failed');
      c.secret = (await sres.json()).value;
      live();

      setState('media');
      if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
        throw new UIError('The microphone API is unavailable: open this page over https, or over http on localhost or 127.0.0.1.', 'insecure_context');
      }
      try {
        c.stream = await navigator.mediaDevices.getUserMedia({ audio: true });
      } catch (e) {
        throw micError(e);
      }
      live();

      const pc = new RTCPeerConnection();
      c.pc = pc;
      rtcedge.pc = pc;
      watchPeer(c);
      const track = c.stream.getAudioTracks()[0];
      pc.addTransceiver(track, { direction: 'sendrecv', streams: [c.stream] });
      c.dc = pc.createDataChannel('oai-events');
      watchChannel(c);

      setState('gathering');
      const tg = performance.now();
      await pc.setLocalDescription(await pc.createOffer());
      const complete = await waitGathering(pc, GATHER_TIMEOUT_MS);
      rtcedge.timings.gatheringMs = Math.round(performance.now() - tg);
      rtcedge.timings.gatheringComplete = complete;
      live();

      setState('signaling');
      const t1 = performance.now();
      const res = await request('Placing the call', '/v1/realtime/calls', {
        method: 'POST',
        headers: { Authorization: `Bearer ${c.secret}`, 'Content-Type': 'application/sdp' },
        body: pc.localDescription.sdp,
      });
      if (res.status !== 201) throw await apiError(res, 'Placing the call failed');
      c.location = res.headers.get('Location');
      const answer = await res.text();
      rtcedge.timings.signalingMs = Math.round(performance.now() - t1);
      showRoute(res.headers, c.location);
      live();

      setState('connecting');
      await pc.setRemoteDescription({ type: 'answer', sdp: answer });
      c.connectTimer = setTimeout(() => {
        if (call === c && rtcedge.state === 'connecting') {
          fail(c, new UIError(`No media path after ${CONNECT_TIMEOUT_MS / 1000} s: ICE did not reach the relay POP.`, 'connect_timeout'));
        }
      }, CONNECT_TIMEOUT_MS);
      c.statsTimer = setInterval(() => collect(c).catch(() => {}), 1000);
    } catch (e) {
      if (e instanceof Aborted) return;
      fail(c, e);
    }
  }

  function watchPeer(c) {
    const pc = c.pc;
    pc.addEventListener('track', (e) => {
      $('remote').srcObject = e.streams[0] || new MediaStream([e.track]);
    });
    pc.addEventListener('iceconnectionstatechange', () => {
      rtcedge.iceState = pc.iceConnectionState;
      setText('ice-state', pc.iceConnectionState);
    });
    pc.addEventListener('connectionstatechange', () => {
      const s = pc.connectionState;
      rtcedge.connectionState = s;
      setText('conn-state', s);
      if (call !== c) return;
      switch (s) {
        case 'connected':
          if (rtcedge.timings.clickToConnectedMs == null) {
            rtcedge.timings.clickToConnectedMs = Math.round(performance.now() - c.t0);
          }
          clearTimeout(c.connectTimer);
          setState('connected');
          showTimings();
          collect(c).catch(() => {});
          break;
        case 'disconnected':
          setState('disconnected');
          break;
        case 'failed':
          fail(c, new UIError('The connection failed: the relay POP stopped answering (ICE or DTLS failure).', 'connection_failed'));
          break;
      }
    });
  }

  function watchChannel(c) {
    const dc = c.dc;
    dc.addEventListener('open', () => { if (call === c) $('send').disabled = false; });
    dc.addEventListener('close', () => { $('send').disabled = true; });
    // Events are JSON text; a server that sends them as binary messages
    // still gets shown, decoded as UTF-8.
    dc.binaryType = 'arraybuffer';
    dc.addEventListener('message', (e) => {
      addEvent('in', typeof e.data === 'string' ? e.data : new TextDecoder().decode(e.data));
    });
  }

  function sendEvent() {
    if (!call || !call.dc || call.dc.readyState !== 'open') return;
    const text = $('event-text').value.trim() || '{"type":"response.create"}';
    call.dc.send(text);
    addEvent('out', text);
  }

  // eventType is an event's "type", or '' when it is not a JSON object.
  function eventType(data) {
    try {
      const v = JSON.parse(data);
      return v && typeof v.type === 'string' ? v.type : '';
    } catch (_) {
      return '';
    }
  }

  // noteBackend says which backend answers, from its events: the echo
  // answers rtcedge.echo, a Realtime server greets with session.created.
  function noteBackend(type, data) {
    let b = null;
    if (type === 'rtcedge.echo') b = 'echo';
    else if (type === 'session.created') {
      const s = JSON.parse(data).session || {};
      b = `OpenAI Realtime${s.model ? ` · ${s.model}` : ''}`;
    }
    if (b && rtcedge.backend !== b) {
      rtcedge.backend = b;
      setText('backend', b);
    }
  }

  // noteTurn shows the pod's turn figures (docs/backends.md, "Paced output
  // and barge-in").
  function noteTurn(data) {
    const v = JSON.parse(data);
    rtcedge.turns.push(v);
    if (typeof v.reply_delay_ms === 'number') setText('turn-reply', `${v.reply_delay_ms} ms`);
    if (typeof v.bargein_stop_ms === 'number') {
      setText('turn-bargein', `stopped in ${v.bargein_stop_ms} ms (${v.bargein_source}), after ${v.audio_end_ms} ms of reply`);
    }
  }

  function addEvent(dir, data) {
    const type = eventType(data);
    if (dir === 'in' && type === 'rtcedge.turn') noteTurn(data);
    rtcedge.events.push({ dir, type, data, at: Date.now() });
    if (rtcedge.events.length > MAX_EVENTS) rtcedge.events.shift();
    if (dir === 'in') noteBackend(type, data);
    const li = document.createElement('li');
    li.className = dir;
    const tag = document.createElement('span');
    tag.className = 'dir';
    tag.textContent = dir === 'out' ? '→ sent' : '← received';
    const name = document.createElement('b');
    name.className = 'type';
    name.textContent = type;
    // Long events (session.created holds the whole session) show their
    // start; the full text is in the tooltip and in rtcedge.events.
    const body = document.createElement('span');
    body.className = 'json';
    body.textContent = data.length > 160 ? `${data.slice(0, 160)}…` : data;
    li.title = data;
    li.append(tag, name, body);
    const list = $('events');
    list.prepend(li);
    while (list.children.length > MAX_EVENTS) list.lastChild.remove();
  }

  // teardown ends a call: DELETE the session (so the server stops at once
  // rather than after its idle timeout), close the connection, stop the
  // microphone. It returns the error of the DELETE, if any.
  // ICE restart the WHIP way (RFC 9725 section 4.4.1): when the network
  // changes (Wi-Fi to cellular, a new address) the browser gathers again
  // with new ICE credentials; they go to the session by PATCH, and the
  // server's new credentials come back. Same call, same session, no new
  // DTLS handshake.
  async function restartIce(c) {
    if (!c || c.ended || !c.location || !c.pc || c.restarting) return false;
    c.restarting = true;
    const t0 = performance.now();
    rtcedge.timings.restartAt = t0;
    try {
      c.pc.restartIce();
      const offer = await c.pc.createOffer();
      await c.pc.setLocalDescription(offer);
      const frag = offer.sdp.split(/\r?\n/).filter((l) => /^a=ice-(ufrag|pwd):/.test(l)).join('\r\n') + '\r\n';
      const res = await fetch(API + c.location, {
        method: 'PATCH',
        headers: {
          Authorization: `Bearer ${c.secret}`, 'Content-Type': 'application/trickle-ice-sdpfrag', 'If-Match': '*',
        },
        body: frag,
      });
      if (res.status !== 200) throw await apiError(res, 'Restarting ICE failed');
      const got = await res.text();
      rtcedge.timings.restartPatchMs = Math.round(performance.now() - t0);
      const ufrag = /^a=ice-ufrag:(\S+)/m.exec(got), pwd = /^a=ice-pwd:(\S+)/m.exec(got);
      if (!ufrag || !pwd) throw new UIError('Restarting ICE failed: the server sent no ICE credentials.', 'bad_restart_answer');
      const sdp = c.pc.remoteDescription.sdp
        .replace(/^a=ice-ufrag:.*$/gm, `a=ice-ufrag:${ufrag[1]}`)
        .replace(/^a=ice-pwd:.*$/gm, `a=ice-pwd:${pwd[1]}`);
      await c.pc.setRemoteDescription({ type: 'answer', sdp });
      rtcedge.iceRestarts++;
      return true;
    } finally {
      c.restarting = false;
    }
  }
  // For the console and the tests: restart ICE of the current call.
  rtcedge.restartIce = () => restartIce(call);

  async function teardown(c) {
    if (c.ended) return null;
    c.ended = true;
    clearTimeout(c.connectTimer);
    clearInterval(c.statsTimer);
    if (call === c) call = null;
    let err = null;
    if (c.location) {
      try {
        const res = await fetch(API + c.location, {
          method: 'DELETE', headers: { Authorization: `Bearer ${c.secret}` },
        });
        if (res.status !== 204 && res.status !== 404) err = await apiError(res, 'Hanging up failed');
      } catch (e) {
        err = new UIError(`Hanging up failed: could not reach signaling (${e.message})`, 'network_error');
      }
    }
    if (c.dc) c.dc.close();
    if (c.pc) c.pc.close();
    if (c.stream) c.stream.getTracks().forEach((t) => t.stop());
    $('remote').srcObject = null;
    $('send').disabled = true;
    return err;
  }

  async function hangup() {
    const c = call;
    if (!c) return;
    setState('hanging-up');
    const err = await teardown(c);
    rtcedge.connectionState = c.pc ? c.pc.connectionState : null;
    setText('conn-state', rtcedge.connectionState);
    if (err) showError(err);
    setState('ended');
  }

  async function fail(c, err) {
    showError(err);
    setState('failed');
    const derr = await teardown(c);
    if (derr) console.warn('rtcedge: cleanup after failure:', derr.message);
    setState('failed');
  }

  function showRoute(h, loc) {
    rtcedge.region = h.get('X-Rtcedge-Region');
    rtcedge.cluster = h.get('X-Rtcedge-Cluster');
    rtcedge.pop = h.get('X-Rtcedge-Pop');
    rtcedge.backupPop = h.get('X-Rtcedge-Backup-Pop');
    rtcedge.location = loc;
    rtcedge.session = loc ? loc.split('/').pop() : null;
    setText('region', rtcedge.region);
    setText('cluster', rtcedge.cluster);
    setText('pop', rtcedge.pop);
    setText('backup-pop', rtcedge.backupPop);
    setText('session', rtcedge.session);
  }

  function showTimings() {
    const t = rtcedge.timings;
    const parts = [];
    if (t.clickToConnectedMs != null) parts.push(`connected ${t.clickToConnectedMs} ms after the click`);
    if (t.signalingMs != null) parts.push(`signaling ${t.signalingMs} ms`);
    if (t.gatheringMs != null) parts.push(`ICE gathering ${t.gatheringMs} ms`);
    let s = parts.join(' · ');
    if (rtcedge.stalledSeconds >= 3) s += ` · no audio from the server for ${rtcedge.stalledSeconds} s`;
    $('timing').textContent = s;
  }

  // ---- statistics ----------------------------------------------------------

  const ms = (v) => `${v < 10 ? v.toFixed(2) : v.toFixed(1)} ms`;
  const METRICS = {
    rtt: { min: 5, fmt: ms },
    jitter: { min: 5, fmt: ms },
    lost: { min: 5, fmt: (v) => `${v}` },
    kbpsIn: { min: 40, fmt: (v) => `${v.toFixed(1)} kbit/s` },
    kbpsOut: { min: 40, fmt: (v) => `${v.toFixed(1)} kbit/s` },
    levelIn: { min: 0.05, fmt: (v) => v.toFixed(3) },
  };
  const history = {};

  function resetView() {
    for (const k of Object.keys(METRICS)) history[k] = [];
    Object.assign(rtcedge, {
      region: null, cluster: null, pop: null, backupPop: null, location: null, session: null, backend: null,
      connectionState: null, iceState: null, remoteAddress: null, stats: null, stalledSeconds: 0, timings: {},
    });
    for (const id of ['region', 'cluster', 'pop', 'backup-pop', 'session', 'backend', 'conn-state', 'ice-state', 'remote-addr',
      'v-rtt', 'v-jitter', 'v-lost', 'v-kbpsIn', 'v-kbpsOut', 'v-levelIn', 'v-packets', 'v-energy', 'v-levelOut']) {
      setText(id, null);
    }
    $('timing').textContent = '';
    drawCharts();
  }

  async function collect(c) {
    if (call !== c || !c.pc) return;
    const report = await c.pc.getStats();
    const byId = new Map();
    let transport = null, inbound = null, outbound = null, source = null;
    report.forEach((s) => {
      byId.set(s.id, s);
      if (s.type === 'transport') transport = s;
      else if (s.type === 'inbound-rtp' && s.kind === 'audio') inbound = s;
      else if (s.type === 'outbound-rtp' && s.kind === 'audio') outbound = s;
      else if (s.type === 'media-source' && s.kind === 'audio') source = s;
    });
    let pair = transport && transport.selectedCandidatePairId ? byId.get(transport.selectedCandidatePairId) : null;
    if (!pair) {
      report.forEach((s) => { if (s.type === 'candidate-pair' && s.nominated && s.state === 'succeeded') pair = s; });
    }
    const remote = pair ? byId.get(pair.remoteCandidateId) : null;
    const now = performance.now();
    const prev = c.prev;
    const kbps = (bytes, prevBytes) =>
      prev && bytes != null && prevBytes != null ? ((bytes - prevBytes) * 8) / (now - prev.at) : null;
    // Chromium measures each STUN round trip in whole milliseconds, so
    // currentRoundTripTime reads 0 or 1 on a LAN. The mean over the
    // responses of the last RTT_WINDOW samples is steadier and finer.
    let rttMs = pair && pair.currentRoundTripTime != null ? pair.currentRoundTripTime * 1000 : null;
    if (pair) {
      if (c.rttPair !== pair.id) {
        c.rttPair = pair.id;
        c.rttRing = [];
      }
      c.rttRing.push({ n: pair.responsesReceived || 0, total: pair.totalRoundTripTime || 0 });
      if (c.rttRing.length > RTT_WINDOW) c.rttRing.shift();
      const first = c.rttRing[0], last = c.rttRing[c.rttRing.length - 1];
      if (last.n > first.n) rttMs = ((last.total - first.total) * 1000) / (last.n - first.n);
    }
    const st = {
      at: now,
      rttMs,
      jitterMs: inbound && inbound.jitter != null ? inbound.jitter * 1000 : null,
      packetsLost: inbound ? inbound.packetsLost || 0 : null,
      packetsReceived: inbound ? inbound.packetsReceived || 0 : 0,
      bytesReceived: inbound ? inbound.bytesReceived : null,
      bytesSent: outbound ? outbound.bytesSent : null,
      packetsSent: outbound ? outbound.packetsSent || 0 : 0,
      audioLevelIn: inbound && inbound.audioLevel != null ? inbound.audioLevel : null,
      audioLevelOut: source && source.audioLevel != null ? source.audioLevel : null,
      totalAudioEnergy: inbound && inbound.totalAudioEnergy != null ? inbound.totalAudioEnergy : 0,
      remoteAddress: remote ? `${remote.address || remote.ip}:${remote.port}` : null,
    };
    st.kbpsIn = kbps(st.bytesReceived, prev && prev.bytesReceived);
    st.kbpsOut = kbps(st.bytesSent, prev && prev.bytesSent);
    c.prev = st;
    if (call !== c) return;

    // After the server ends a session the browser can stay "connected"
    // for a while; a counter that stops is the honest signal.
    if (rtcedge.state === 'connected' && st.packetsReceived === c.lastPackets) rtcedge.stalledSeconds++;
    else rtcedge.stalledSeconds = 0;
    c.lastPackets = st.packetsReceived;

    rtcedge.stats = st;
    rtcedge.remoteAddress = st.remoteAddress;
    setText('remote-addr', st.remoteAddress);
    push('rtt', st.rttMs);
    push('jitter', st.jitterMs);
    push('lost', st.packetsLost);
    push('kbpsIn', st.kbpsIn);
    push('kbpsOut', st.kbpsOut);
    push('levelIn', st.audioLevelIn);
    setText('v-packets', st.packetsReceived);
    setText('v-energy', st.totalAudioEnergy.toFixed(4));
    setText('v-levelOut', st.audioLevelOut == null ? null : st.audioLevelOut.toFixed(3));
    showTimings();
    drawCharts();
  }

  function push(k, v) {
    if (v == null || Number.isNaN(v)) return;
    const h = history[k];
    h.push(v);
    if (h.length > HISTORY) h.shift();
    setText(`v-${k}`, METRICS[k].fmt(v));
  }

  function drawCharts() {
    const color = getComputedStyle(document.documentElement).getPropertyValue('--chart').trim() || '#2563eb';
    for (const fig of document.querySelectorAll('.chart')) {
      spark(fig.querySelector('canvas'), history[fig.dataset.metric] || [], METRICS[fig.dataset.metric].min, color);
    }
  }

  // spark draws a sparkline of the last HISTORY values, scaled to the
  // larger of their maximum and a floor (so that noise stays small).
  function spark(canvas, values, floor, color) {
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(1, Math.round(canvas.clientWidth * dpr));
    const h = Math.max(1, Math.round(canvas.clientHeight * dpr));
    if (canvas.width !== w || canvas.height !== h) {
      canvas.width = w;
      canvas.height = h;
    }
    const g = canvas.getContext('2d');
    g.clearRect(0, 0, w, h);
    g.strokeStyle = 'rgba(127,127,127,.18)';
    g.lineWidth = dpr;
    g.beginPath();
    g.moveTo(0, h - 0.5 * dpr);
    g.lineTo(w, h - 0.5 * dpr);
    g.stroke();
    if (values.length === 0) return;
    const max = Math.max(floor, ...values) * 1.15;
    const pad = 2 * dpr;
    const x = (i) => w - (values.length - 1 - i) * (w / (HISTORY - 1));
    const y = (v) => h - pad - (v / max) * (h - 2 * pad);
    g.beginPath();
    values.forEach((v, i) => (i === 0 ? g.moveTo(x(i), y(v)) : g.lineTo(x(i), y(v))));
    g.lineWidth = 1.6 * dpr;
    g.strokeStyle = color;
    g.lineJoin = 'round';
    g.stroke();
    g.lineTo(x(values.length - 1), h);
    g.lineTo(x(0), h);
    g.closePath();
    g.globalAlpha = 0.12;
    g.fillStyle = color;
    g.fill();
    g.globalAlpha = 1;
    const last = values[values.length - 1];
    g.beginPath();
    g.arc(x(values.length - 1) - 2 * dpr, y(last), 2.5 * dpr, 0, 2 * Math.PI);
    g.fillStyle = color;
    g.fill();
  }

  // ---- wiring --------------------------------------------------------------

  $('call').addEventListener('click', startCall);
  $('hangup').addEventListener('click', hangup);
  $('send').addEventListener('click', sendEvent);
  $('event-text').addEventListener('keydown', (e) => { if (e.key === 'Enter') sendEvent(); });
  // Leaving the page mid-call: tell the server now instead of letting the
  // session idle out. keepalive lets the request outlive the page.
  window.addEventListener('pagehide', () => {
    if (call && call.location) {
      fetch(API + call.location, { method: 'DELETE', keepalive: true, headers: { Authorization: `Bearer ${call.secret}` } });
    }
  });
  window.addEventListener('resize', drawCharts);
  // A network change (the browser came back online, or its connection type
  // changed) may have taken the call's address away: restart ICE at once
  // rather than wait for ICE to notice.
  const onNetworkChange = () => {
    if (call && rtcedge.state !== 'connecting') {
      restartIce(call).catch((e) => console.warn('rtcedge: ICE restart:', e.message));
    }
  };
  window.addEventListener('online', onNetworkChange);
  if (navigator.connection) navigator.connection.addEventListener('change', onNetworkChange);
  $('api-base').textContent = location.origin;
  resetView();
  setState('idle');
})();

// An app server written against OpenAI's `openai` SDK, pointed at rtcedge
// by its base URL alone (e2e/sdk_server_test.go). It speaks JSON lines:
// the test writes the caller's SDP offer, then {"connected":true} once the
// call is up; the script writes one line per step ({"step": ...}) and
// {"step":"fail"} on any unexpected error.
//
// env: RTCEDGE_BASE (https://HOST:PORT/v1), OPENAI_API_KEY, and
// NODE_EXTRA_CA_CERTS for rtcedge's certificate; WRONG_KEY, when set, a
// key the server must refuse.
import readline from 'node:readline';
import OpenAI from 'openai';
import { OpenAIRealtimeWS } from 'openai/realtime/ws';

const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');
const baseURL = process.env.RTCEDGE_BASE;

const inbox = [];
let waiting = null;
readline.createInterface({ input: process.stdin }).on('line', (line) => {
  const msg = JSON.parse(line);
  if (waiting) {
    const w = waiting;
    waiting = null;
    w(msg);
  } else {
    inbox.push(msg);
  }
});
const recv = () => (inbox.length ? Promise.resolve(inbox.shift()) : new Promise((r) => { waiting = r; }));

// describe is what the test checks of an error: OpenAI's class for it.
const describe = (e) => ({
  class: e?.constructor?.name, status: e?.status, code: e?.code, type: e?.type,
  api_error: e instanceof OpenAI.APIError,
  authentication_error: e instanceof OpenAI.AuthenticationError,
  not_found_error: e instanceof OpenAI.NotFoundError,
});

async function expectError(what, fn) {
  try {
    await fn();
    return { class: 'none', what };
  } catch (e) {
    return describe(e);
  }
}

// sideband attaches to the call, as OpenAI's docs show, and drives it.
async function sideband(client, callID) {
  const rt = new OpenAIRealtimeWS({ callID }, client);
  const events = [];
  const waiters = [];
  rt.on('event', (ev) => {
    events.push(ev);
    for (const w of [...waiters]) {
      if (w.pred(ev)) {
        waiters.splice(waiters.indexOf(w), 1);
        w.resolve(ev);
      }
    }
  });
  const errors = [];
  rt.on('error', (err) => errors.push(String(err?.message ?? err)));
  const waitFor = (what, pred, ms = 30000) => {
    const seen = events.find(pred);
    if (seen) return Promise.resolve(seen);
    return new Promise((resolve, reject) => {
      const w = { pred, resolve };
      waiters.push(w);
      setTimeout(() => reject(new Error(`no ${what} on the sideband after ${ms} ms; got ${events.map((e) => e.type)}; errors ${errors}`)), ms);
    });
  };
  await new Promise((resolve, reject) => {
    rt.socket.once('open', resolve);
    rt.socket.once('error', reject);
  });
  await waitFor('session.created', (ev) => ev.type === 'session.created');
  rt.send({ type: 'session.update', session: { type: 'realtime', instructions: 'FROM-SIDEBAND' } });
  const updated = await waitFor('session.updated with the sideband instructions',
    (ev) => ev.type === 'session.updated' && ev.session?.instructions === 'FROM-SIDEBAND');
  rt.send({ type: 'response.create' });
  const done = await waitFor('response.done', (ev) => ev.type === 'response.done');
  const closed = new Promise((resolve) => rt.socket.once('close', resolve));
  rt.close();
  await closed;
  return {
    url: rt.url.toString(), types: events.map((e) => e.type), errors,
    instructions: updated.session.instructions, response_status: done.response?.status,
  };
}

async function main() {
  // Retries as an app's client makes them (the SDK honours Retry-After): a
  // dev world on a loaded machine may answer 503 "retry shortly" while its
  // gossip catches up. The error checks below retry nothing.
  const client = new OpenAI({ apiKey: process.env.OPENAI_API_KEY, baseURL, maxRetries: 4 });

  const cs = await client.realtime.clientSecrets.create({
    expires_after: { anchor: 'created_at', seconds: 600 },
    session: { type: 'realtime', instructions: 'SEALED-BY-THE-APP', audio: { output: { voice: 'marin' } } },
  });
  out({ step: 'client_secret', value: cs.value, expires_at: cs.expires_at, session: cs.session });

  const { offer } = await recv();
  const res = await client.realtime.calls.create({
    sdp: offer, session: { type: 'realtime', instructions: 'FROM-CALLS-CREATE' },
  });
  const answer = await res.text();
  const location = res.headers.get('location');
  out({ step: 'answer', status: res.status, location, sdp: answer });
  const callID = location.split('/').pop();

  await recv(); // the caller is connected
  out({ step: 'sideband', ...(await sideband(client, callID)) });

  await client.realtime.calls.hangup(callID);
  out({ step: 'hangup' });

  const errors = {
    hangup_again: await expectError('hangup of an ended call', () => client.realtime.calls.hangup(callID)),
    bad_secret: await expectError('a forged client secret', () =>
      new OpenAI({ apiKey: 'ek_forged', baseURL, maxRetries: 0 }).realtime.clientSecrets.create({})),
  };
  if (process.env.WRONG_KEY) {
    errors.wrong_key = await expectError('a wrong API key', () =>
      new OpenAI({ apiKey: process.env.WRONG_KEY, baseURL, maxRetries: 0 }).realtime.clientSecrets.create({}));
  }
  out({ step: 'errors', ...errors });
  out({ step: 'done' });
}

main().then(() => process.exit(0), (e) => {
  out({ step: 'fail', error: String(e?.stack ?? e), detail: describe(e) });
  process.exit(1);
});

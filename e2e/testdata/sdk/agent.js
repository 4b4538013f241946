// A browser app written against OpenAI's Agents SDK
// (@openai/agents-realtime), pointed at rtcedge by the transport's baseUrl
// alone; e2e/sdk_browser_test.go bundles it with esbuild and serves it on
// an origin other than signaling's. window.agentTest records what the test
// checks: the connection, the session's events, and every error event.
import { OpenAIRealtimeWebRTC, RealtimeAgent, RealtimeSession, tool } from '@openai/agents-realtime';

const state = { status: 'idle', error: null, errors: [], events: [] };
window.agentTest = state;

// The agent's tool has the name of the one the app sealed, with its own
// description: the sealed definition must stay at the model (the app
// answers its calls over the sideband).
const lookup = tool({
  name: 'lookup',
  description: 'AGENT-TOOL',
  parameters: { type: 'object', properties: {}, required: [], additionalProperties: false },
  strict: true,
  execute: async () => 'agent',
});

// start connects with the client secret the app server minted; baseUrl is
// signaling's /v1/realtime/calls.
window.startAgent = async ({ baseUrl, secret }) => {
  const agent = new RealtimeAgent({ name: 'Assistant', instructions: 'AGENT-INSTRUCTIONS', tools: [lookup] });
  const transport = new OpenAIRealtimeWebRTC({ baseUrl });
  const session = new RealtimeSession(agent, {
    transport,
    model: 'gpt-realtime',
    config: {
      audio: {
        // No response of its own: the app asks for the one reply.
        input: { turnDetection: { type: 'semantic_vad', eagerness: 'high', createResponse: false, interruptResponse: false } },
        output: { voice: 'verse' },
      },
    },
  });
  state.transport = transport;
  state.session = session;
  session.on('error', (e) => {
    const err = e?.error ?? e;
    state.errors.push(err instanceof Error ? `${err.name}: ${err.message}` : JSON.stringify(err));
  });
  session.on('transport_event', (ev) => {
    if (state.events.length < 500) state.events.push(ev);
  });
  state.status = 'connecting';
  try {
    await session.connect({ apiKey: secret });
    state.status = 'connected';
  } catch (e) {
    state.status = 'failed';
    state.error = String(e?.message ?? e);
  }
};

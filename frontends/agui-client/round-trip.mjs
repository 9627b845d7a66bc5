// Drives agentloop's AG-UI view with @ag-ui/client's HttpAgent, as an app would:
//   1. a user message ("pay"): the run ends in an interrupt (a call waiting for approval);
//   2. a run without answering it: the client itself refuses (its pending interrupts);
//   3. the interrupt answered through resume ({approved: true}): the call runs, the answer streams;
//   4. a new HttpAgent on the same thread with no messages (a reload): the persisted chat
//      comes back as a MESSAGES_SNAPSHOT.
// Prints one JSON object: every event each run received (as the client's verifier let it
// through), the messages each agent held at the end, and what step 2 threw.
// Usage: node round-trip.mjs <agentloop ag-ui url> <chat pk>, with AGENTLOOP_COOKIE (the
// session and CSRF cookies) and AGENTLOOP_CSRF (the token) in the environment.
import { HttpAgent } from "@ag-ui/client";

const [url, threadId] = process.argv.slice(2);
const headers = {
  Cookie: process.env.AGENTLOOP_COOKIE,
  "X-CSRFToken": process.env.AGENTLOOP_CSRF,
};
const received = [];

function recording(run) {
  return { onEvent: ({ event }) => void received.push({ run, ...event }) };
}

function lastFinished(run) {
  return received.filter((e) => e.run === run && e.type === "RUN_FINISHED").at(-1);
}

const agent = new HttpAgent({ url, threadId, headers });
agent.addMessage({ id: "client-1", role: "user", content: "pay" });
await agent.runAgent({ runId: "run-1" }, recording("run-1"));

let refused = "";
try {
  await agent.runAgent({ runId: "run-unanswered" }, recording("run-unanswered"));
} catch (error) {
  refused = String(error.message);
}

const interrupts = lastFinished("run-1")?.outcome?.interrupts ?? [];
const resume = interrupts.map((interrupt) => ({
  interruptId: interrupt.id,
  status: "resolved",
  payload: { approved: true },
}));
await agent.runAgent({ runId: "run-2", resume }, recording("run-2"));

const reloaded = new HttpAgent({ url, threadId, headers });
await reloaded.runAgent({ runId: "run-3" }, recording("run-3"));

console.log(
  JSON.stringify({
    events: received,
    messages: agent.messages,
    reloadedMessages: reloaded.messages,
    reloadedState: reloaded.state,
    refused,
  }),
);

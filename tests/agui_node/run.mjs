// Runs one turn on a Signalbox gateway with the real AG-UI client (@ag-ui/client's HttpAgent)
// and prints, one JSON object a line, every AG-UI event the client accepted, then the
// messages it assembled from them: {"messages": [...]}. Exit 0 when the run ended, 1 (with
// {"error": "..."} last) when the client refused the stream or the run failed.
//
//   node run.mjs <gateway url> <token> <conversation id> <run id> <text>
import { HttpAgent } from "@ag-ui/client";

const [url, token, threadId, runId, text] = process.argv.slice(2);
if (!url || !token || !threadId || !runId || !text) {
  console.error("usage: node run.mjs <gateway url> <token> <conversation id> <run id> <text>");
  process.exit(2);
}

const print = (value) => process.stdout.write(JSON.stringify(value) + "\n");

const agent = new HttpAgent({
  url: `${url}/api/agui`,
  headers: { Authorization: `Bearer ${token}` },
  threadId,
  initialMessages: [{ id: `${runId}-user`, role: "user", content: text }],
});

try {
  await agent.runAgent(
    { runId },
    {
      onEvent({ event }) {
        print(event);
      },
    },
  );
  print({ messages: agent.messages });
} catch (error) {
  print({ error: String(error && error.message ? error.message : error) });
  process.exit(1);
}

// A chat with an agentloop chat through useChat: messages, tool calls, approvals, cancel;
// a denied call shows "denied" (and the reason), a call a cancel kept from running "cancelled".
// Everything shown comes from models and tools: React renders it as text, never as HTML.
import { useChat } from "@ai-sdk/react";
import {
  DefaultChatTransport,
  isToolUIPart,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  type UIMessage,
} from "ai";
import { useState } from "react";
import { cancelRun, csrfToken, type History } from "./agentloop";

type Props = { chatId: string; api: string; cancelUrl: string; history: History };

export function Chat({ chatId, api, cancelUrl, history }: Props) {
  const { messages, sendMessage, status, error, addToolApprovalResponse } = useChat({
    id: chatId, // agentloop's chat pk: POST {api}, resume from GET {api}/{id}/stream
    messages: history.messages, // from the database, never from the browser's memory
    resume: true, // after a reload: the run in flight goes on streaming (204: none)
    transport: new DefaultChatTransport({
      api,
      headers: () => ({ "X-CSRFToken": csrfToken() }), // Django's CSRF check
    }),
    // Once every waiting call is approved or denied, send the decisions.
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
  });
  const [text, setText] = useState("");
  const busy = status === "submitted" || status === "streaming";

  return (
    <main>
      <p>
        Status: <span id="status">{status}</span>
      </p>
      <ol id="messages">
        {messages.map((message) => (
          <Message key={message.id} message={message} decide={addToolApprovalResponse} />
        ))}
      </ol>
      {error && <p id="error">{error.message}</p>}
      {(error === undefined && history.error) && <p id="error">{history.error}</p>}
      <form
        onSubmit={(event) => {
          event.preventDefault();
          if (!text.trim()) return;
          sendMessage({ text });
          setText("");
        }}
      >
        <textarea name="text" value={text} onChange={(event) => setText(event.target.value)} />
        <button type="submit" disabled={busy}>
          Send
        </button>
        <button type="button" id="cancel" disabled={!busy} onClick={() => cancelRun(cancelUrl)}>
          Cancel
        </button>
      </form>
    </main>
  );
}

type Decide = ReturnType<typeof useChat>["addToolApprovalResponse"];

// What agentloop puts in an answer's metadata after a cancel: the calls it kept from running.
type Metadata = { cancelled?: boolean; cancelledCalls?: string[] } | undefined;

function Message({ message, decide }: { message: UIMessage; decide: Decide }) {
  const metadata = message.metadata as Metadata;
  const cancelled = metadata?.cancelled;
  const cancelledCalls = metadata?.cancelledCalls ?? [];
  return (
    <li className={`msg msg-${message.role}${cancelled ? " cancelled" : ""}`} data-id={message.id}>
      {message.parts.map((part, index) => {
        if (part.type === "text") return <p key={index} className="text">{part.text}</p>;
        if (part.type === "reasoning")
          return (
            <details key={index} className="reasoning">
              <summary>Thinking</summary>
              {part.text}
            </details>
          );
        if (isToolUIPart(part)) {
          const name = part.type === "dynamic-tool" ? part.toolName : part.type.slice(5);
          const callCancelled = cancelledCalls.includes(part.toolCallId);
          const state = callCancelled ? "cancelled" : part.state;
          return (
            <div key={index} className={`call ${state}`} data-call-id={part.toolCallId}>
              <span className="tool">{name}</span>{" "}
              <code className="args">{JSON.stringify(part.input ?? {})}</code>
              {callCancelled && <span className="result">cancelled</span>}
              {!callCancelled && part.state === "output-available" && (
                <span className="result">{String(part.output)}</span>
              )}
              {!callCancelled && part.state === "output-error" && <span className="result">{part.errorText}</span>}
              {part.state === "output-denied" && (
                <span className="result">
                  denied{part.approval?.reason ? `: ${part.approval.reason}` : ""}
                </span>
              )}
              {part.state === "approval-requested" && (
                <span className="approval">
                  <button onClick={() => decide({ id: part.approval.id, approved: true })}>Approve</button>
                  <button onClick={() => decide({ id: part.approval.id, approved: false, reason: "No." })}>
                    Deny
                  </button>
                </span>
              )}
            </div>
          );
        }
        return null;
      })}
      {cancelled && <span className="marker">cancelled</span>}
    </li>
  );
}

// What the page needs from agentloop besides useChat: Django's CSRF token, the history of
// the chat, and its cancel view.
import type { UIMessage } from "ai";

/** Django's CSRF token, from its cookie (CSRF_COOKIE_NAME is "csrftoken" by default). */
export function csrfToken(): string {
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]*)/);
  return match ? decodeURIComponent(match[1]) : "";
}

export type History = {
  id: string;
  state: string;
  running: boolean;
  error: string;
  messages: UIMessage[];
};

/** The chat as UIMessages, from the database (GET {api}/{id}/messages). */
export async function loadHistory(api: string, chatId: string): Promise<History> {
  const response = await fetch(`${api}/${encodeURIComponent(chatId)}/messages`, {
    credentials: "same-origin",
  });
  if (!response.ok) throw new Error(`The chat could not be loaded (${response.status}).`);
  return response.json();
}

/** Ask the chat's run to stop (agentloop's cancel view); the stream then ends with it. */
export async function cancelRun(cancelUrl: string): Promise<void> {
  await fetch(cancelUrl, {
    method: "POST",
    credentials: "same-origin",
    headers: { "X-CSRFToken": csrfToken() },
  });
}

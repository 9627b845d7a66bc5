// Mounts the chat in #root; the Django page gives the chat's id and agentloop's URLs.
import { createRoot } from "react-dom/client";
import { Chat } from "./Chat";
import { loadHistory } from "./agentloop";
import "./usechat.css";

const root = document.getElementById("root")!;
const { chatId = "", api = "", cancelUrl = "" } = root.dataset;

loadHistory(api, chatId).then(
  (history) =>
    createRoot(root).render(
      <Chat chatId={chatId} api={api} cancelUrl={cancelUrl} history={history} />,
    ),
  (error: Error) => {
    root.textContent = error.message;
  },
);

// The live chat page: reads the chat's event stream (agentloop's SSE view) and draws it.
//
// Events: "message" (a saved message: shown, or replacing what streamed), "partial" (the
// text of the answer streaming now, without Redis), "chunk" (a piece of it, with Redis),
// "state" (idle/queued/running/waiting/..., a pending cancel, the calls waiting for a
// person), "superseded" (with Redis: messages an edit or a regenerated answer replaced).
// Buttons POST to agentloop's cancel/approve/deny/answer/edit/regenerate views with the
// CSRF token.
(() => {
  "use strict";

  // Example prompts fill the message box (on the chat list and the chat page).
  for (const button of document.querySelectorAll("button.example")) {
    button.addEventListener("click", () => {
      const box = document.querySelector("form.composer textarea");
      if (box) {
        box.value = button.textContent;
        box.focus();
      }
    });
  }

  const root = document.getElementById("chat");
  if (!root) return;

  const transcript = document.getElementById("transcript");
  const stateBadge = document.getElementById("state");
  const connection = document.getElementById("connection");
  const cancelButton = document.getElementById("cancel");
  const pendingBox = document.getElementById("pending");
  const errorBox = document.getElementById("error");
  const form = document.getElementById("send");
  const regenerateButton = document.getElementById("regenerate");
  const canEdit = root.dataset.canEdit === "1";
  const csrfToken = document.querySelector('meta[name="csrf-token"]').content;
  let busy = false; // a run is queued or running: editing waits for it (or a cancel)

  // -- drawing -------------------------------------------------------------------------
  function element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function nearBottom() {
    return window.innerHeight + window.scrollY >= document.body.scrollHeight - 120;
  }

  function keepScrolled(draw) {
    const follow = nearBottom();
    draw();
    if (follow) window.scrollTo(0, document.body.scrollHeight);
  }

  function callCard(call) {
    const card = element("li", "call " + (call.state || "pending"));
    card.dataset.call = call.id;
    const head = element("div", "call-head");
    head.append(element("span", "tool", call.name));
    head.append(element("code", "args", JSON.stringify(call.arguments)));
    card.append(head, element("div", "result", "…"));
    return card;
  }

  function messageItem(message) {
    const item = element("li", "msg msg-" + message.role);
    item.dataset.id = message.id;
    const bubble = element("div", "bubble");
    if (message.role === "summary") {
      bubble.append(element("span", "marker", "summary of earlier messages"));
    }
    if (message.thinking) {
      // Collapsed, and as text: a model's thinking is untrusted like its answer.
      const thinking = element("details", "thinking");
      thinking.append(element("summary", "", "Thinking"));
      thinking.append(element("div", "thinking-text", message.thinking));
      bubble.append(thinking);
    }
    bubble.append(element("div", "text", message.content));
    item.append(bubble);
    if (message.status === "cancelled") markCancelled(item);
    if (message.status === "blocked") {
      // A guardrail's block: the reason, as text (an answer's own text is not sent).
      bubble.append(element("span", "marker", message.blocked || "blocked by a guardrail"));
    }
    if (message.tool_calls && message.tool_calls.length) {
      const calls = element("ul", "calls");
      for (const call of message.tool_calls) calls.append(callCard(call));
      item.append(calls);
    }
    withEditButton(item);
    return item;
  }

  // -- edit and regenerate ------------------------------------------------------------------
  function withEditButton(item) {
    if (!canEdit || !item.matches("li.msg-user") || item.querySelector("button.edit")) return;
    const button = element("button", "button edit", "Edit");
    button.type = "button";
    button.disabled = busy;
    button.addEventListener("click", () => openEditor(item));
    item.append(button);
  }

  // The items an edit (or a regenerate) replaces: this one and every one after it, as the
  // page shows them now. Rows the run adds meanwhile (the replacement) are not among them.
  function fromHere(item) {
    const items = [];
    for (let node = item; node; node = node.nextElementSibling) items.push(node);
    return items;
  }

  function openEditor(item) {
    if (item.querySelector(".editor")) return;
    const bubble = item.querySelector(".bubble");
    const editor = element("form", "editor");
    const box = element("textarea");
    box.name = "text";
    box.rows = 3;
    box.required = true;
    box.value = bubble.querySelector(".text").textContent; // text, never markup
    const save = element("button", "button primary", "Save and answer");
    save.type = "submit";
    const cancel = element("button", "button", "Discard");
    cancel.type = "button";
    const row = element("div", "row");
    row.append(cancel, save);
    editor.append(box, row);
    // Not the hidden attribute: the site's styles give both a display of their own.
    bubble.style.display = "none";
    item.querySelector("button.edit").style.display = "none";
    item.append(editor);
    box.focus();
    const close = () => {
      editor.remove();
      bubble.style.display = "";
      item.querySelector("button.edit").style.display = "";
    };
    cancel.addEventListener("click", close);
    editor.addEventListener("submit", async (event) => {
      event.preventDefault();
      const text = box.value.trim();
      if (!text) return;
      const replaced = fromHere(item);
      save.disabled = true;
      const url = root.dataset.editUrl.replace(/\/messages\/0\//, `/messages/${item.dataset.id}/`);
      if (await post(url, { text })) {
        for (const node of replaced) node.remove();
      } else {
        save.disabled = false;
      }
    });
  }

  function dropSuperseded(data) {
    for (const id of data.ids || []) {
      const item = transcript.querySelector(`li.msg[data-id="${id}"]`);
      if (item) item.remove();
    }
    enableEditing();
  }

  function enableEditing() {
    for (const button of transcript.querySelectorAll("button.edit")) button.disabled = busy;
    if (regenerateButton) {
      regenerateButton.disabled = busy || !transcript.querySelector("li.msg-user");
    }
  }

  if (regenerateButton) {
    regenerateButton.addEventListener("click", async () => {
      const users = transcript.querySelectorAll("li.msg-user");
      if (!users.length) return;
      const replaced = fromHere(users[users.length - 1]);
      regenerateButton.disabled = true;
      if (await post(root.dataset.regenerateUrl, {})) {
        for (const node of replaced) node.remove();
      } else {
        enableEditing();
      }
    });
  }
  for (const item of transcript.querySelectorAll("li.msg-user")) withEditButton(item);

  function markCancelled(item) {
    item.classList.add("cancelled");
    if (!item.querySelector(".marker")) {
      item.querySelector(".bubble").append(element("span", "marker", "cancelled"));
    }
  }

  function streamingItem(id) {
    let item = id !== undefined ? transcript.querySelector(`li.msg[data-id="${id}"]`) : null;
    item = item || transcript.querySelector("li.msg.streaming");
    if (!item) {
      item = messageItem({ id: id === undefined ? "" : id, role: "assistant", content: "" });
      transcript.append(item);
    }
    item.classList.add("streaming");
    if (id !== undefined) item.dataset.id = id;
    return item;
  }

  function showResult(message) {
    const card = transcript.querySelector(`li.call[data-call="${message.tool_call_id}"]`);
    if (!card) return;
    card.className = "call " + (message.is_error ? "failed" : "done");
    card.querySelector(".result").textContent = message.content;
  }

  function showMessage(message) {
    if (message.role === "system") return;
    if (message.role === "tool") return keepScrolled(() => showResult(message));
    keepScrolled(() => {
      const fresh = messageItem(message);
      const existing =
        transcript.querySelector(`li.msg[data-id="${message.id}"]`) ||
        (message.role === "assistant" ? transcript.querySelector("li.msg.streaming") : null);
      if (existing) {
        // Results already shown for its calls stay.
        for (const card of existing.querySelectorAll("li.call.done, li.call.failed")) {
          const twin = fresh.querySelector(`li.call[data-call="${card.dataset.call}"]`);
          if (twin) twin.replaceWith(card);
        }
        existing.replaceWith(fresh);
      } else {
        transcript.append(fresh);
      }
    });
  }

  function showPartial(data) {
    keepScrolled(() => {
      streamingItem(data.id).querySelector(".text").textContent = data.content;
    });
  }

  function showChunk(data) {
    keepScrolled(() => {
      streamingItem().querySelector(".text").textContent += data.text;
    });
  }

  function showError(text) {
    errorBox.textContent = text;
    errorBox.hidden = !text;
  }

  // -- state and the people-in-the-loop panel ---------------------------------------------
  let stateShown = 0; // how many states the page has shown (a cancel's reply may be older)

  function showState(state) {
    stateShown += 1;
    busy = state.state === "queued" || state.state === "running";
    enableEditing();
    stateBadge.textContent = state.cancel_requested && busy
      ? "cancelling…"
      : state.waiting_for ? "waiting for " + state.waiting_for : state.state;
    stateBadge.className = "state state-" + state.state;
    // A chat that waits for a person can be cancelled too: its held calls are answered as
    // cancelled (their results arrive as messages) and it goes back to idle.
    cancelButton.disabled = !(busy || state.pending.length > 0) || state.cancel_requested;
    if (form) {
      // A message typed while an answer streams is queued and answered after it.
      const blocked = state.pending.length > 0;
      form.querySelector("button").disabled = blocked;
      form.classList.toggle("blocked", blocked);
    }
    if (state.state === "failed") showError("The run failed: " + (state.error || "unknown error"));
    else if (state.state === "stopped") showError("Stopped: " + state.stop_reason);
    else if (errorBox.dataset.sticky !== "1") showError("");
    if (!busy) {
      for (const item of transcript.querySelectorAll("li.msg.streaming")) {
        item.classList.remove("streaming");
      }
    }
    drawPending(state.pending);
  }

  const waitingText = {
    approval: "waiting for your approval",
    question: "waiting for your answer",
    subagent: "the subagent is working on it…",
  };

  function drawPending(pending) {
    const shown = new Set(pending.map((call) => String(call.id)));
    for (const card of pendingBox.querySelectorAll("[data-call]")) {
      if (!shown.has(card.dataset.call)) card.remove();
    }
    for (const card of transcript.querySelectorAll("li.call.waiting")) {
      if (!shown.has(card.dataset.call)) {
        card.className = "call running"; // decided: it runs (or its result is on the way)
        card.querySelector(".result").textContent = "…";
      }
    }
    for (const call of pending) {
      const card = transcript.querySelector(`li.call[data-call="${call.id}"]`);
      if (card && !card.matches(".done, .failed")) {
        card.className = "call waiting";
        card.querySelector(".result").textContent = waitingText[call.wait_reason] || "waiting";
      }
      if (call.wait_reason === "subagent") continue;
      if (pendingBox.querySelector(`[data-call="${call.id}"]`)) continue;
      pendingBox.append(call.wait_reason === "question" ? questionCard(call) : approvalCard(call));
    }
    pendingBox.hidden = pendingBox.children.length === 0;
  }

  function approvalCard(call) {
    const card = element("form", "decision approval");
    card.dataset.call = call.id;
    const title = element("p", "", "");
    title.append("The assistant wants to run ", element("strong", "", call.name), " with ");
    title.append(element("code", "", JSON.stringify(call.arguments)), ".");
    const reason = element("input");
    reason.name = "reason";
    reason.placeholder = "Reason (optional, for Deny)";
    const approve = element("button", "button primary", "Approve");
    approve.type = "button";
    approve.name = "approve";
    const deny = element("button", "button danger", "Deny");
    deny.type = "button";
    deny.name = "deny";
    approve.addEventListener("click", () => decide(card, root.dataset.approveUrl, call.id, {}));
    deny.addEventListener("click", () =>
      decide(card, root.dataset.denyUrl, call.id, { reason: reason.value }),
    );
    const row = element("div", "row");
    row.append(reason, approve, deny);
    card.append(title, row);
    return card;
  }

  function questionCard(call) {
    const card = element("form", "decision question");
    card.dataset.call = call.id;
    card.append(element("p", "", call.question));
    const answer = element("input");
    answer.name = "text";
    answer.required = true;
    answer.placeholder = "Your answer";
    const send = element("button", "button primary", "Answer");
    send.type = "submit";
    card.addEventListener("submit", (event) => {
      event.preventDefault();
      decide(card, root.dataset.answerUrl, call.id, { text: answer.value });
    });
    const row = element("div", "row");
    row.append(answer, send);
    card.append(row);
    return card;
  }

  async function decide(card, template, callId, fields) {
    for (const control of card.querySelectorAll("button, input")) control.disabled = true;
    const url = template.replace(/\/tool-calls\/0\//, `/tool-calls/${callId}/`);
    const ok = await post(url, fields);
    if (!ok) for (const control of card.querySelectorAll("button, input")) control.disabled = false;
  }

  // -- requests -----------------------------------------------------------------------------
  async function post(url, fields) {
    const body = new FormData();
    for (const [name, value] of Object.entries(fields)) body.append(name, value);
    try {
      const response = await fetch(url, {
        method: "POST",
        body,
        headers: { "X-CSRFToken": csrfToken, Accept: "*/*" },
        credentials: "same-origin",
      });
      if (response.ok) {
        errorBox.dataset.sticky = "";
        showError("");
        return true;
      }
      errorBox.dataset.sticky = "1";
      showError((await response.text()) || `The request failed (${response.status}).`);
    } catch (error) {
      errorBox.dataset.sticky = "1";
      showError("The request failed: " + error);
    }
    return false;
  }

  cancelButton.addEventListener("click", async () => {
    cancelButton.disabled = true;
    const shown = stateShown;
    // Unless the chat's next state came first (a chat waiting for a person is cancelled at
    // once: its "idle" can arrive before this reply), say the run is being stopped.
    if ((await post(root.dataset.cancelUrl, {})) && stateShown === shown) {
      stateBadge.textContent = "cancelling…";
    }
  });

  if (form) {
    const box = form.querySelector("textarea");
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const text = box.value.trim();
      if (!text) return;
      form.querySelector("button").disabled = true;
      if (await post(root.dataset.sendUrl, { text })) box.value = "";
      else form.querySelector("button").disabled = false;
    });
    box.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey) {
        event.preventDefault();
        form.requestSubmit();
      }
    });
  }

  // -- the event stream ---------------------------------------------------------------------
  const url = new URL(root.dataset.eventsUrl, window.location.href);
  url.searchParams.set("after", root.dataset.position);
  // After a dropped connection the browser reconnects by itself, sending Last-Event-ID:
  // the stream resumes after the last event this page got.
  const source = new EventSource(url);
  const handlers = {
    message: showMessage,
    partial: showPartial,
    chunk: showChunk,
    state: showState,
    superseded: dropSuperseded,
  };
  for (const [type, handler] of Object.entries(handlers)) {
    source.addEventListener(type, (event) => handler(JSON.parse(event.data)));
  }
  source.addEventListener("open", () => {
    connection.hidden = true;
  });
  source.addEventListener("error", () => {
    connection.hidden = source.readyState === EventSource.OPEN;
  });
  window.addEventListener("pagehide", () => source.close());
  root.dataset.live = "1";
})();

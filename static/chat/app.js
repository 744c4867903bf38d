// The chat page: wires the socket, the sidebar, the settings and the message views together.
import { ApiError, TAB, api, setBusyHandler, setCsrfToken } from "./api.js";
import { AttachmentTray } from "./attachments.js";
import { Drafts } from "./drafts.js";
import { applyTree, handleBranchClicks, updateBranchControls } from "./branches.js";
import { dateTime, number } from "./formats.js";
import { t } from "./i18n.js";
import { setIcon } from "./icons.js";
import { ImageViewer } from "./image-viewer.js";
import { preloadMath } from "./math.js";
import { MessageView } from "./messages.js";
import { handleCopyClicks } from "./render.js";
import { NewChatSetup, PresetMenu } from "./presets.js";
import { ModelPicker, SettingsPanel } from "./settings.js";
import { ShareDialog } from "./share.js";
import { installShortcuts, toggleShortcutList } from "./shortcuts.js";
import { ArchivedNotice } from "./archived.js";
import { BudgetMeter, Sidebar } from "./sidebar.js";
import { ChatSocket, socketUrl } from "./socket.js";
import { ToolsMenu } from "./tools.js";

const config = JSON.parse(document.getElementById("chat-config").textContent);
setCsrfToken(config.csrfToken);

const $ = (id) => document.getElementById(id);
const ui = {
  layout: $("layout"),
  title: $("chat-title"),
  messages: $("messages"),
  thread: $("thread"),
  earlier: $("earlier"),
  empty: $("empty-state"),
  composer: $("composer"),
  input: $("input"),
  send: $("send"),
  stop: $("stop"),
  reconnecting: $("reconnecting"),
  reconnectingText: $("reconnecting-text"),
  notice: $("notice"),
  noticeText: $("notice-text"),
  menu: $("menu-button"),
};

const drafts = new Drafts(ui.input, config.username);

const state = {
  conversation: null, // the open conversation's id, null for a new chat
  title: t("New chat"),
  views: new Map(), // message id -> MessageView, for the open conversation only
  streaming: null, // the reply streaming in the open conversation
  pending: null, // a send/edit/regenerate waiting for its `started` (or `error`)
  watched: new Set(), // conversations this socket attached to
  loadSeq: 0, // only the latest openConversation() may render
  loaded: false, // the open conversation's messages are on the page
  model: null, // the open conversation's own model
  stopQueued: null, // a reply whose Stop was pressed while disconnected
};

// --- small helpers -------------------------------------------------------------

// kind: "connection" notices go when the socket is back, "load" ones when a conversation opens,
// "attachment" ones (a file refused) when a file is attached or a message sent, "compose" ones (a
// message refused before sending) when their cause is gone or a message goes out.
let noticeKind = null;
function showNotice(text, kind = null) {
  ui.noticeText.textContent = text;
  ui.notice.hidden = false;
  noticeKind = kind;
}
function clearNotice(kind) {
  if (noticeKind === kind) ui.notice.hidden = true;
}

// The server answers `server_busy` (a frame) or 503 (HTTP) while its database is not answering.
const BUSY_TEXT = t("The server is busy; retrying…");
const DATABASE_DOWN_TEXT = t("The server cannot reach its database; your conversations are safe. Retrying…");
const BUSY_RETRIES = 4;
function showBusy(busy) {
  if (busy) showNotice(BUSY_TEXT);
  else if (ui.noticeText.textContent === BUSY_TEXT) ui.notice.hidden = true;
}
setBusyHandler(showBusy);
$("notice-close").addEventListener("click", () => (ui.notice.hidden = true));

// The demo notice: shown until dismissed, then not again in this browser.
const DEMO_DISMISSED = "chat.demoBannerDismissed";
if ($("demo-banner")) {
  $("demo-banner").hidden = localStorage.getItem(DEMO_DISMISSED) === "1";
  $("demo-banner-close").addEventListener("click", () => {
    $("demo-banner").hidden = true;
    localStorage.setItem(DEMO_DISMISSED, "1");
  });
}

// Follow the bottom while the user is there; scrolling up to read stops the following.
let stuckToBottom = true;
// Scrolled up with more below: a button brings the reader back down (and following again).
const toBottom = $("to-bottom");
function updateToBottom() {
  const { scrollTop, scrollHeight, clientHeight } = ui.messages;
  toBottom.hidden = stuckToBottom || scrollHeight - scrollTop - clientHeight < 80;
}
// A scroll event comes a frame after the scroll: by then the answer may have grown further below, so
// only a move up (the reader's own) lets go of the bottom; getting near it takes hold again.
let lastScrollTop = 0;
ui.messages.addEventListener("scroll", () => {
  const { scrollTop, scrollHeight, clientHeight } = ui.messages;
  if (scrollHeight - scrollTop - clientHeight < 80) stuckToBottom = true;
  else if (scrollTop < lastScrollTop) stuckToBottom = false;
  lastScrollTop = scrollTop;
  updateToBottom();
  if (scrollTop < 200 && !ui.earlier.hidden) loadEarlier();
});
function followBottom() {
  if (stuckToBottom) holdBottom();
  else updateToBottom();
}
// At the bottom the button has nothing to bring back: hidden, whatever showed it while the reader was up.
function holdBottom() {
  ui.messages.scrollTop = ui.messages.scrollHeight;
  toBottom.hidden = true;
}
// What changes size (an answer growing as it streams, a finished answer's usage line and buttons,
// Continue, a banner, the composer growing) keeps a reader who was at the bottom there, with the last
// answer's buttons in view. A message's paints leave following to this observer: it is called after
// the frame's layout, so reading the scroll height here costs nothing, where reading it after each
// paint forced a layout of its own (the longest part of a paint on a slow device).
const keepAtBottom = new ResizeObserver(followBottom);
keepAtBottom.observe(ui.thread);
keepAtBottom.observe(ui.messages);
toBottom.addEventListener("click", () => {
  stuckToBottom = true;
  holdBottom();
});

function setTitle(title) {
  state.title = title || t("New chat");
  ui.title.textContent = state.title;
  document.title = `${state.title} · ${t("Team chat")}`;
}

function updateComposer() {
  const streaming = state.streaming !== null;
  // The box stays usable (and keeps the focus) while an answer streams: the next message can be
  // typed meanwhile; it is sent once the answer is done.
  if (!streaming) {
    ui.stop.disabled = false;
    ui.stop.setAttribute("aria-label", t("Stop"));
    ui.stop.title = t("Stop (Esc)");
  }
  ui.send.hidden = streaming;
  ui.stop.hidden = !streaming;
  ui.send.disabled = state.pending !== null;
  ui.empty.hidden = state.views.size > 0 || state.pending !== null;
  updateActions();
}

/** Any user message can be edited and any answer regenerated (a new branch), while nothing streams. */
function updateActions() {
  const views = [...state.views.values()];
  const idle = state.streaming === null && state.pending === null;
  for (const view of views) {
    const button = view.article.querySelector(view.role === "user" ? "[data-action=edit]" : "[data-action=regenerate]");
    button.hidden = !idle || Boolean(view.retry && !view.retry.hidden); // Retry, in words, stands in for it
    if (view.retry) view.retry.disabled = !idle;
  }
  updateBranchControls(ui.thread, views, idle);
}

function autogrow() {
  ui.input.style.height = "auto";
  ui.input.style.height = `${ui.input.scrollHeight}px`;
}

function addView(message) {
  const view = new MessageView(message);
  if (view.id !== null && view.id !== undefined) state.views.set(view.id, view);
  ui.thread.append(view.article);
  return view;
}

function clearThread() {
  state.views.clear();
  state.streaming = null;
  ui.thread.replaceChildren();
  ui.earlier.hidden = true;
}

/** A long conversation opens at its last messages (the server sends a page of them); the ones before come a page
 * at a time when the thread is scrolled to its top or "Show earlier messages" is pressed. */
let loadingEarlier = false;
async function loadEarlier() {
  const first = ui.thread.firstElementChild;
  if (loadingEarlier || !first?.dataset.messageId || state.conversation === null) return;
  const seq = state.loadSeq;
  const id = state.conversation;
  loadingEarlier = true;
  let data;
  try {
    data = await api(`/api/conversations/${id}?before=${first.dataset.messageId}`);
  } catch (error) {
    showNotice(t("Could not load earlier messages: %(error)s", { error: error.message }), "load");
    return;
  } finally {
    loadingEarlier = false;
  }
  if (seq !== state.loadSeq || id !== state.conversation || first.parentNode !== ui.thread) return;
  const below = ui.messages.scrollHeight - ui.messages.scrollTop; // the reader's place, kept as rows go in above
  for (const message of data.messages) {
    const view = new MessageView(message);
    state.views.set(view.id, view);
    ui.thread.insertBefore(view.article, first);
  }
  applyTree(state.views, data.messages);
  updateActions();
  ui.earlier.hidden = !data.earlier;
  ui.messages.scrollTop = ui.messages.scrollHeight - below;
}

// --- opening conversations -----------------------------------------------------

function attach(id) {
  if (socket.send({ type: "attach", conversation: id })) state.watched.add(id);
}

async function openConversation(id, { push = true } = {}) {
  const seq = ++state.loadSeq;
  state.loaded = false;
  if (push && location.pathname !== `/c/${id}/`) history.pushState({}, "", `/c/${id}/`);
  closeSidebar();
  drafts.switchTo(id);
  autogrow();
  let data;
  try {
    data = await api(`/api/conversations/${id}`);
  } catch (error) {
    if (seq !== state.loadSeq) return;
    // The URL already names this conversation: the page must not go on showing the previous one.
    state.conversation = id;
    state.model = null;
    state.pending = null;
    clearThread();
    setTitle("…");
    sidebar.setActive(id);
    updateComposer();
    const retry = error instanceof ApiError ? "" : ` ${t("It opens when the connection is back.")}`;
    showNotice(t("Could not open the conversation: %(error)s", { error: error.message }) + retry, "load");
    return;
  }
  clearNotice("load");
  if (seq !== state.loadSeq) return; // the user went elsewhere meanwhile
  state.conversation = data.id;
  state.model = data.model;
  state.pending = null;
  clearThread();
  setTitle(data.title);
  archivedNotice.show(data);
  showReviews(data.reviewed_by);
  sidebar.setActive(data.id);
  picker.choose(data.model);
  settings.fill(data);
  toolsMenu.load(data.id);
  for (const message of data.messages) {
    const view = addView(message);
    if (message.status === "streaming") {
      view.awaitingSnapshot = true;
      state.streaming = message.id;
    }
  }
  applyTree(state.views, data.messages);
  ui.earlier.hidden = !data.earlier;
  state.loaded = true;
  updateComposer();
  stuckToBottom = true;
  followBottom();
  attach(data.id); // the snapshot and live deltas of a running answer, and other tabs' turns
}

/** "Reviewed by …": who else read this conversation (shown only where the server is set to tell owners). */
function showReviews(reads) {
  const line = $("reviewed-by");
  line.hidden = !reads?.length;
  if (!reads?.length) return;
  const names = [...new Set(reads.map((read) => read.reader || t("a deleted user")))];
  const last = dateTime(reads[0].read);
  line.textContent = t("Reviewed by %(names)s (last %(last)s)", { names: names.join(", "), last });
}

/** A new chat. `replace`: the open conversation is gone (deleted), so its address leaves the history too (Back
 * must not lead to it); `push` false: the address is the caller's affair. */
function newChat({ push = true, replace = false } = {}) {
  showReviews(null);
  archivedNotice.show(null);
  state.loadSeq += 1;
  state.loaded = false;
  state.conversation = null;
  state.model = null;
  state.pending = null;
  clearThread();
  setTitle(t("New chat"));
  sidebar.setActive(null);
  picker.choose(null);
  settings.fill(null);
  toolsMenu.load(null);
  setup.fill(); // the person's defaults (presets.js)
  if (replace) history.replaceState({}, "", "/");
  else if (push && location.pathname !== "/") history.pushState({}, "", "/");
  closeSidebar();
  drafts.switchTo(null);
  autogrow();
  updateComposer();
  ui.input.focus();
}

function conversationInUrl() {
  const match = location.pathname.match(/^\/c\/(\d+)\/$/);
  return match ? Number(match[1]) : null;
}

function route({ push = false } = {}) {
  const id = conversationInUrl();
  if (id !== null) openConversation(id, { push });
  else newChat({ push });
}

// --- sending -------------------------------------------------------------------

// A turn asked for while the socket is connecting (the page just loaded, or it is reconnecting)
// waits for it, this long at most, before the user is told it was not sent.
const QUEUE_MS = 20000;

function submit(frame, pending) {
  clearNotice("connection");
  clearNotice("compose");
  clearNotice("attachment");
  state.pending = Object.assign(pending, { frame, tries: 0, queued: false });
  if (!socket.send(frame)) queue(pending);
  updateComposer();
  return true;
}

/** The turn waits for the socket (connecting, or back after a restart), QUEUE_MS at most. */
function queue(pending) {
  pending.queued = true;
  ui.reconnectingText.textContent = socket.everOpened
    ? t("Reconnecting… your message goes out once connected.")
    : t("Connecting…");
  ui.reconnecting.hidden = false;
  pending.giveUp = setTimeout(() => {
    if (state.pending === pending && pending.queued) {
      onError({ code: "disconnected", detail: t("Could not reach the server, so the message was not sent.") });
    }
  }, QUEUE_MS);
}

/** The socket is open: a queued turn goes out now. */
function sendQueued() {
  const pending = state.pending;
  if (!pending?.queued) return false;
  clearTimeout(pending.giveUp);
  pending.queued = false;
  socket.send(pending.frame);
  return true;
}

// Nothing was stored for a frame refused as busy, so sending it again cannot duplicate it.
function retryBusy(pending) {
  pending.tries += 1;
  showBusy(true);
  const delay = Math.min(16000, 1000 * 2 ** pending.tries) * (0.75 + Math.random() * 0.5);
  setTimeout(() => {
    if (state.pending !== pending) return;
    if (!socket.send(pending.frame)) {
      onError({ code: "disconnected", detail: t("Not connected to the server; try again once it is back.") });
    }
  }, delay);
}

/** Whether a message's text is over the server's limit (bytes of UTF-8, as the server counts them). */
function tooLong(content) {
  return new TextEncoder().encode(content).length > config.maxContentBytes;
}

function sendMessage() {
  const content = ui.input.value;
  if ((!content.trim() && !tray.items.length) || state.pending || state.streaming) return;
  if (tooLong(content)) {
    const bytes = number(config.maxContentBytes);
    showNotice(t("The message is too long (over %(bytes)s bytes).", { bytes }), "compose");
    return;
  }
  // Refused here, before anything is sent: a model that takes no images, uploads still running, the limits.
  const outOfRange = settings.problem();
  if (outOfRange) {
    showNotice(outOfRange);
    return;
  }
  const problem = tray.problem(picker.chosen, content);
  if (problem) {
    showNotice(problem, "compose");
    return;
  }
  const frame = { type: "send", conversation: state.conversation, content, model: picker.value };
  if (state.conversation === null) Object.assign(frame, setup.forNewChat(settings.forNewChat()));
  const attachments = tray.ready;
  if (attachments.length) frame.attachments = attachments.map((attachment) => attachment.id);
  const tools = toolsMenu.forSend();
  if (tools !== undefined) frame.tools = tools;
  const view = new MessageView({ id: null, role: "user", content, status: "pending", attachments });
  const taken = tray.take();
  if (!submit(frame, { kind: "send", conversation: state.conversation, view, content, taken })) {
    tray.restore(taken);
    return;
  }
  ui.thread.append(view.article);
  ui.input.value = "";
  drafts.save();
  autogrow();
  stuckToBottom = true;
  followBottom();
}

function regenerate(answer) {
  if (state.conversation === null || state.streaming) return;
  submit({ type: "regenerate", conversation: state.conversation, message: answer.id, model: picker.value }, {
    kind: "regenerate",
    conversation: state.conversation,
    answer,
  });
}

function continueAnswer(answer) {
  if (state.conversation === null || state.streaming || state.pending) return;
  submit({ type: "continue", message: answer.id, model: picker.value }, {
    kind: "continue",
    conversation: state.conversation,
    answer,
  });
}

/** The tree's ids, siblings and "can continue" after a turn (branches.js shows them). */
async function refreshTree() {
  const seq = state.loadSeq;
  const id = state.conversation;
  let data;
  try {
    data = await api(`/api/conversations/${id}`);
  } catch {
    return; // the controls stay as they were; the next load shows them
  }
  if (seq !== state.loadSeq || id !== state.conversation) return;
  applyTree(state.views, data.messages);
  updateActions();
}

/** Takes `article` and every message after it off the page: a new branch replaces them there. */
function dropFrom(article) {
  while (article) {
    const next = article.nextElementSibling;
    state.views.delete(Number(article.dataset.messageId));
    article.remove();
    article = next;
  }
}

async function editMessage(view) {
  const content = await view.edit();
  if (content === null || state.streaming) return;
  submit({ type: "edit", message: view.id, content, model: picker.value }, {
    kind: "edit",
    conversation: state.conversation,
    view,
    content,
  });
}

function stop() {
  if (state.streaming === null) return;
  ui.stop.disabled = true; // until its `done`; the button says what is happening
  ui.stop.setAttribute("aria-label", t("Stopping…"));
  ui.stop.title = t("Stopping…");
  // While disconnected the stop waits for the socket and goes out first thing when it is back.
  if (!socket.send({ type: "stop", message: state.streaming })) state.stopQueued = state.streaming;
}

// --- frames from the server ----------------------------------------------------

function isOurs(frame) {
  const pending = state.pending;
  if (!pending) return false;
  // A brand-new conversation is one this socket has never watched.
  if (pending.conversation === null) return !state.watched.has(frame.conversation);
  return pending.conversation === frame.conversation;
}

function onStarted(frame) {
  if (isOurs(frame)) {
    const pending = state.pending;
    showBusy(false);
    state.pending = null;
    if (state.conversation === null) {
      state.conversation = frame.conversation;
      drafts.became(frame.conversation);
      history.pushState({}, "", `/c/${frame.conversation}/`);
      settings.started();
    }
    state.watched.add(frame.conversation);
    if (pending.view) {
      state.views.delete(pending.view.id); // an edit: the view shows the new sibling now
      pending.view.setId(frame.user_message);
      pending.view.setStatus("complete");
      pending.view.setUserText(pending.content);
      state.views.set(frame.user_message, pending.view);
    }
    // An edit or a regeneration is a new branch: the old one leaves the page (it stays on the server).
    if (pending.kind === "edit") dropFrom(pending.view.article.nextElementSibling);
    if (pending.kind === "regenerate") dropFrom(pending.answer.article);
    setTitle(frame.title);
    announce("");
    const view = frame.continued
      ? continued(frame)
      : addView({ id: frame.message, role: "assistant", status: "streaming", model: frame.model });
    state.streaming = frame.message;
    updateComposer();
    stuckToBottom = true;
    followBottom();
    sidebar.setActive(frame.conversation);
    sidebar.upsert(frame.conversation, frame.title);
    sidebar.refresh();
    return view;
  }
  if (frame.conversation === state.conversation) {
    openConversation(frame.conversation, { push: false }); // another tab's turn: reload, then attach
  } else {
    sidebar.refresh();
  }
  return null;
}

/** A continued answer streams again in place: its text so far, then the new deltas. */
function continued(frame) {
  const old = state.views.get(frame.message);
  const { content, reasoning } = old || {};
  const message = { id: frame.message, role: "assistant", status: "streaming", model: frame.model, content, reasoning };
  const view = new MessageView(message);
  view.continued = true;
  if (old) old.article.replaceWith(view.article);
  else ui.thread.append(view.article);
  state.views.set(frame.message, view);
  return view;
}

// Screen readers hear a finished answer once, not every token.
function announce(text) {
  $("announce").textContent = text;
}

function onDone(frame) {
  const view = state.views.get(frame.message);
  if (view) view.finish(frame);
  if (view && frame.conversation === state.conversation) {
    const how = { complete: t("Answer finished"), stopped: t("Answer stopped"), interrupted: t("Answer interrupted") };
    announce(t("%(how)s: %(text)s", { how: how[frame.status] || t("Answer failed"), text: view.spoken() }));
  }
  if (state.streaming === frame.message) {
    state.streaming = null;
    updateComposer();
    if (document.activeElement === document.body || !document.activeElement) ui.input.focus();
  }
  sidebar.refresh();
  budget.refresh();
  if (frame.conversation !== state.conversation) return;
  // Ended by a sweep after its process died: what is stored (the last save) may be shorter than what was shown.
  if (frame.recovered) openConversation(frame.conversation, { push: false });
  else refreshTree();
}

function onAttached(frame) {
  if (frame.conversation !== state.conversation) return;
  const streamingView = [...state.views.values()].find((view) => view.status === "streaming");
  if (frame.message === null && streamingView) {
    openConversation(frame.conversation, { push: false }); // it ended between the load and the attach
  } else if (frame.message !== null && !state.views.has(frame.message)) {
    openConversation(frame.conversation, { push: false }); // it started between the load and the attach
  } else if (frame.message !== null && state.streaming !== frame.message) {
    state.streaming = frame.message;
    updateComposer();
  }
}

function onError(frame) {
  const pending = state.pending;
  if (frame.code === "server_busy" && pending && pending.tries < BUSY_RETRIES) {
    retryBusy(pending);
    return;
  }
  if (frame.code === "server_restarting" && pending && !pending.queued) {
    // Nothing was stored; the server closes this socket (1012) and the turn goes out on the next one.
    queue(pending);
    return;
  }
  if (pending && frame.code !== "not_streaming") {
    clearTimeout(pending.giveUp);
    state.pending = null;
    if (pending.kind === "send") {
      pending.view.article.remove();
      if (!ui.input.value) ui.input.value = pending.content; // nothing typed is lost
      drafts.save();
      tray.restore(pending.taken); // nor anything attached
      autogrow();
    }
  }
  updateComposer();
  if (frame.code !== "not_streaming") {
    showNotice(frame.detail || t("Error: %(code)s", { code: frame.code }), frame.code === "disconnected" ? "connection" : null);
  }
  if (frame.code === "budget_exceeded") budget.refresh();
}

/** Conversations changed over the JSON API, in this tab (`frame.tab`) or another: follow the one shown. */
function onConversations(frame) {
  sidebar.refresh();
  const open = state.conversation;
  if (open !== null && frame.deleted?.includes(open)) {
    newChat({ replace: true });
    if (frame.tab !== TAB) showNotice(t("The conversation that was open here was deleted in another tab."));
  } else if (frame.changed) {
    followChange(frame.changed);
  }
}

/** A conversation's new title and archive state (a PATCH's answer, or another tab's), if it is the one shown. */
function followChange(conversation) {
  if (conversation.id !== state.conversation) return;
  setTitle(conversation.title);
  archivedNotice.show(conversation);
}

function onFrame(frame) {
  switch (frame.type) {
    case "started":
      return onStarted(frame);
    case "delta":
      return state.views.get(frame.message)?.applyDelta(frame);
    case "snapshot":
      return state.views.get(frame.message)?.applySnapshot(frame);
    case "snapshot_part":
      return state.views.get(frame.message)?.applySnapshotPart(frame);
    case "attached":
      return onAttached(frame);
    case "tool_arguments":
    case "tool_call":
      return state.views.get(frame.message)?.applyTool(frame);
    case "done":
      return onDone(frame);
    case "error":
      return onError(frame);
    case "switched":
    case "deleted":
      // The path shown changed (here or in another tab): show it as stored, the version switched to in view.
      if (frame.conversation !== state.conversation) return undefined;
      return openConversation(frame.conversation, { push: false }).then(() => {
        if (frame.type === "switched") switchedTo(state.views.get(frame.message));
      });
    case "conversations":
      return onConversations(frame);
    case "title": // a model wrote a conversation's title
      sidebar.setTitle(frame.conversation, frame.title);
      sidebar.refresh(); // a refresh asked for at `done` may have read the title before it changed
      if (frame.conversation === state.conversation) setTitle(frame.title);
      return undefined;
    default:
      return undefined;
  }
}

// A version's arrow pressed by keyboard: once the path is drawn again, the focus is on the arrows of the version
// switched to (the same one, or the other when that one is now at the end), not lost with the old drawing.
let arrowPressed = null;
ui.thread.addEventListener(
  "click",
  (event) => {
    const arrow = event.target.closest("button[data-action^='branch-']");
    if (arrow) arrowPressed = arrow.matches(":focus-visible") ? arrow.dataset.action : null;
  },
  true,
);
function switchedTo(view) {
  view?.article.scrollIntoView({ block: "nearest" });
  const arrows = view ? [...view.article.querySelectorAll("button[data-action^='branch-']")] : [];
  if (arrowPressed) (arrows.find((b) => b.dataset.action === arrowPressed && !b.disabled) || arrows.find((b) => !b.disabled))?.focus();
  arrowPressed = null;
}

// --- wiring --------------------------------------------------------------------

const sidebar = new Sidebar({
  open: (id) => openConversation(id),
  deleted: (id) => id === state.conversation && newChat({ replace: true }),
  changed: followChange,
  error: showNotice,
});
const budget = new BudgetMeter();
const archivedNotice = new ArchivedNotice({ restored: () => sidebar.refresh(), error: showNotice });
const picker = new ModelPicker($("model"));
const settings = new SettingsPanel({ conversation: () => state.conversation, onError: showNotice });
new ShareDialog({ conversation: () => state.conversation }); // its own button in the topbar
const setup = new NewChatSetup({ picker, settings });
new PresetMenu({
  input: ui.input,
  composer: ui.composer,
  onChoose: (preset) => setup.apply(preset, state.conversation === null),
  onError: showNotice,
});
const toolsMenu = new ToolsMenu($("tools-button"), $("tools-panel"));
const tray = new AttachmentTray({
  list: $("attachment-chips"),
  button: $("attach"),
  input: $("file-input"),
  dropZone: document.querySelector("main.main"),
  pasteTarget: ui.input,
  limits: config.attachments,
  csrfToken: config.csrfToken,
  onError: (text) => showNotice(text, "attachment"),
  onChange: ({ uploaded }) => {
    if (uploaded) clearNotice("attachment"); // a file went in: the one refused before is old news
    if (uploaded) announce(t("%(name)s attached", { name: uploaded })); // the chip alone says nothing to a reader
    recheckComposer();
  },
});

/** A message refused before sending ("does not accept images") stops saying so once it no longer is. */
function recheckComposer() {
  const text = ui.input.value;
  if (noticeKind === "compose" && !tooLong(text) && !tray.uploading && !tray.problem(picker.chosen, text)) {
    clearNotice("compose");
  }
}
$("model").addEventListener("change", recheckComposer);

const socket = new ChatSocket(socketUrl(config.wsPath), {
  onFrame,
  onOpen(reconnect) {
    document.documentElement.dataset.socket = "open"; // a hook for tests and styles
    ui.reconnecting.hidden = true;
    clearNotice("connection");
    state.watched.clear(); // a new socket watches nothing yet
    if (state.stopQueued !== null) {
      socket.send({ type: "stop", message: state.stopQueued });
      state.stopQueued = null;
    }
    const queued = state.pending?.queued;
    if (reconnect && !queued) {
      sidebar.refresh();
      // The URL says where the user is, even if they moved while disconnected.
      if (conversationInUrl() !== null) route();
      else if (state.conversation !== null) newChat({ push: false });
    } else if (state.conversation !== null && state.loaded) {
      attach(state.conversation);
    }
    if (queued) {
      if (reconnect) sidebar.refresh();
      sendQueued();
    }
  },
  onDown(busy, databaseDown) {
    document.documentElement.dataset.socket = "down";
    ui.reconnectingText.textContent = databaseDown ? DATABASE_DOWN_TEXT : busy ? BUSY_TEXT : t("Reconnecting…");
    ui.reconnecting.hidden = false;
    // A sent turn with no answer yet may or may not be stored: say so. A queued one waits.
    if (state.pending && !state.pending.queued) {
      onError({ code: "disconnected", detail: t("The connection dropped before the server answered.") });
    }
  },
  onSignedOut() {
    location.assign(`/accounts/login/?next=${encodeURIComponent(location.pathname)}`);
  },
});

// Signing out closes this socket with 4401 too; the form's own redirect is where to go, not ?next=.
document.querySelector("form.sign-out")?.addEventListener("submit", () => socket.leave());

ui.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  sendMessage();
});
ui.input.addEventListener("keydown", (event) => {
  if (early.enterSends(event)) {
    event.preventDefault();
    sendMessage();
  }
});
ui.input.addEventListener("input", () => {
  autogrow();
  drafts.save();
  if (noticeKind === "compose") recheckComposer(); // "too long" goes once it no longer is
});
ui.stop.addEventListener("click", stop);
$("retry-now").addEventListener("click", () => socket.retryNow());
ui.earlier.addEventListener("click", () => loadEarlier());
$("new-chat").addEventListener("click", () => newChat());
$("skip-link").addEventListener("click", (event) => {
  event.preventDefault();
  ui.input.focus();
});

// Approve or Deny on a tool call that asks first (tools.js): to the process running the answer.
ui.thread.addEventListener("tool-decision", (event) => {
  const { message, call, approve } = event.detail;
  if (!socket.send({ type: "tool_approval", message, call, approve })) showNotice(t("Not connected: try again."));
});

ui.thread.addEventListener("click", (event) => {
  const button = event.target.closest("button[data-action]");
  const article = button?.closest("article[data-message-id]");
  if (!article) return;
  const view = state.views.get(Number(article.dataset.messageId));
  if (!view) return;
  if (button.dataset.action === "regenerate" || button.dataset.action === "retry") regenerate(view);
  else if (button.dataset.action === "edit") editMessage(view);
  else if (button.dataset.action === "copy") copyAnswer(button, view);
});

/** Copies the answer's markdown (without the blank lines models often start with) and says so on the
 * button itself for two seconds: a check, "Copied" as its name and tooltip, then Copy again. */
async function copyAnswer(button, view) {
  let said = t("Copied");
  try {
    await navigator.clipboard.writeText(view.content.replace(/^(?:[ \t]*\n)+/, "").trimEnd());
  } catch {
    said = t("Copy failed");
  }
  if (!button.dataset.feedback) button.dataset.label = button.getAttribute("aria-label");
  button.dataset.feedback = said;
  announce(said); // heard also when the copy came from Ctrl+Shift+C, with the focus elsewhere
  button.setAttribute("aria-label", said);
  button.title = said;
  setIcon(button, said === t("Copied") ? "check" : "cross");
  clearTimeout(button.feedbackTimer);
  button.feedbackTimer = setTimeout(() => {
    delete button.dataset.feedback;
    button.setAttribute("aria-label", button.dataset.label);
    button.title = button.dataset.label;
    setIcon(button, "copy");
  }, 2000);
}
handleCopyClicks(ui.thread);
handleBranchClicks(ui.thread, {
  viewOf: (id) => state.views.get(id),
  send: (frame) => socket.send(frame) || showNotice(t("Not connected to the server; try again once it is back.")),
  continueAnswer,
});

// An attached image's thumbnail opens it full size, in the page (its URL itself is a download).
const imageViewer = new ImageViewer($("image-dialog"), $("image-full"));
document.addEventListener("click", (event) => {
  const thumb = event.target.closest("button[data-action=view-image]");
  if (thumb) imageViewer.open(thumb.dataset.url, thumb.querySelector("img")?.alt || "");
});

// A focus a change took away (its control removed, hidden or disabled: Regenerate, Continue, a branch's last
// arrow, Scroll to the bottom, an attachment's remove button) goes to a usable control beside it, else to the
// message box, not to the page's body, where a screen reader's place is lost. A click elsewhere is left alone,
// and so is a tap's focus (not :focus-visible): a phone's keyboard must not pop up after a tap on Regenerate.
const usable = (element) => element.isConnected && !element.disabled && element.getClientRects().length > 0;
let lastFocused = null;
document.addEventListener("focusin", (event) => {
  const inMain = document.querySelector("main.main").contains(event.target);
  lastFocused = inMain && event.target.matches(":focus-visible") ? event.target : null;
});
new MutationObserver(() => {
  if (document.activeElement !== document.body || !lastFocused || usable(lastFocused)) return;
  const beside = lastFocused.isConnected ? [...lastFocused.parentElement.querySelectorAll("button")].find(usable) : null;
  lastFocused = null;
  (beside || ui.input).focus();
}).observe(document.querySelector("main.main"), {
  subtree: true,
  childList: true,
  attributes: true,
  attributeFilter: ["hidden", "disabled", "class"],
});

// Phone-sized screens (and a desktop zoomed in): the sidebar slides over the page behind the menu button,
// as a drawer: focus goes into it, the page behind takes no focus or clicks (inert), Escape or the close
// button closes it and focus returns to the menu button.
const behindDrawer = [document.querySelector("main.main"), $("skip-link")];
const sidebarOpen = () => ui.layout.classList.contains("sidebar-open");
function openSidebar(focus = $("close-sidebar")) {
  ui.layout.classList.add("sidebar-open");
  ui.menu.setAttribute("aria-expanded", "true");
  for (const element of behindDrawer) element.inert = true;
  focus.focus();
}
/** Close the drawer; true when it was open. Focus left inside it (now hidden) goes back to the menu button. */
function closeSidebar() {
  if (!sidebarOpen()) return false;
  ui.layout.classList.remove("sidebar-open");
  ui.menu.setAttribute("aria-expanded", "false");
  for (const element of behindDrawer) element.inert = false;
  const sidebarElement = $("sidebar");
  if (sidebarElement.contains(document.activeElement) || document.activeElement === document.body) {
    if (getComputedStyle(ui.menu).display !== "none") ui.menu.focus();
  }
  return true;
}
ui.menu.addEventListener("click", () => (sidebarOpen() ? closeSidebar() : openSidebar()));
$("scrim").addEventListener("click", closeSidebar);
$("close-sidebar").addEventListener("click", closeSidebar);
// Widened past the phone layout while open: the sidebar is part of the page again, and the page usable.
window.matchMedia("(max-width: 800px)").addEventListener("change", (event) => {
  if (!event.matches) closeSidebar();
});

installShortcuts({
  search() {
    // On a phone the list is behind the menu button: open it first, on the search box.
    if (getComputedStyle(ui.menu).display !== "none" && !sidebarOpen()) openSidebar($("search"));
    $("search").focus();
    $("search").select();
  },
  closeDrawer: closeSidebar,
  newChat: () => newChat(),
  copyLast() {
    const button = [...ui.thread.querySelectorAll("article.message.assistant [data-action=copy]")].at(-1);
    if (!button) return false;
    button.click();
    return true;
  },
  focusComposer: () => ui.input.focus(),
  stop() {
    if (state.streaming === null) return false;
    stop();
    return true;
  },
  showList: toggleShortcutList,
});

window.addEventListener("popstate", () => route());

// --- start ---------------------------------------------------------------------

// Ready: from here the composer's own listeners above take Enter and Send (early.js held them until now).
const early = window.chatEarly; // early.js, in the head of the page before this module
early.ready = true;
ui.send.removeAttribute("aria-disabled");
document.documentElement.dataset.ready = "";
performance.mark("chat-ready");
/** A message sent before the page was ready goes out now that it is, with the models and defaults in. */
function sendEarly() {
  if (!early.send) return;
  early.send = false;
  delete document.documentElement.dataset.earlySend;
  ui.input.value = ui.input.value.replace(/\n+$/, "");
  autogrow();
  sendMessage();
}

sidebar.refresh();
budget.refresh();
const defaultsLoaded = setup.load().catch(() => {}); // without them a new chat starts as it did
const modelsLoaded = picker
  .load()
  .then(() => picker.choose(state.model))
  .then(() => defaultsLoaded)
  .then(() => state.conversation === null && state.pending === null && setup.fill())
  .catch((error) => showNotice(t("Could not load the models: %(error)s", { error: error.message })));
const shown = config.conversation ? openConversation(config.conversation, { push: false }) : newChat({ push: false });
// A message sent early goes to the conversation of the URL (once it is open) with the models in.
Promise.allSettled([modelsLoaded, shown]).then(() => {
  sendEarly();
  preloadMath(); // the page is ready: KaTeX now, in the background
});

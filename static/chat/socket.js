// The chat websocket: JSON frames in and out, reconnecting by itself with backoff and jitter.

const FIRST_DELAY_MS = 500;
const MAX_DELAY_MS = 10000;
const UNAUTHENTICATED = 4401; // the server's close code for a signed-out session
const TRY_AGAIN_LATER = 4013; // the server is overloaded (chat/ws/overload.py): back off harder
const DATABASE_UNAVAILABLE = 4503; // the server cannot read its database now (chat/ws/overload.py)
const BUSY_FIRST_ATTEMPT = 2; // so the first retry after a 4013 comes after about 2 s, not 0.5 s
const SETTLE_MS = 200;

export function socketUrl(path) {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${location.host}${path}`;
}

export class ChatSocket {
  /** handlers: onFrame(frame), onOpen(isReconnect), onDown(busy, databaseDown), onSignedOut() */
  constructor(url, handlers) {
    this.url = url;
    this.handlers = handlers;
    this.attempt = 0;
    this.everOpened = false;
    this.timer = 0;
    this.ws = null;
    this.leaving = false;
    this.connect();
    // A laptop waking up or a phone regaining signal: try at once instead of waiting.
    window.addEventListener("online", () => this.retryNow());
    // Gone offline: the open socket is as good as dead, though it may not close for minutes. Down now,
    // so the page says so and reconnects (and reloads what it missed) once the network is back.
    window.addEventListener("offline", () => this.drop());
  }

  /** Treat the open socket as closed: down at once, reconnecting with backoff. */
  drop() {
    const ws = this.ws;
    if (ws === null || this.leaving || ws.readyState !== WebSocket.OPEN) return;
    this.ws = null; // its close event, whenever it comes, is no news
    ws.close();
    this.handlers.onDown(false);
    this.scheduleReconnect();
  }

  get isOpen() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }

  connect() {
    this.timer = 0;
    const ws = new WebSocket(this.url);
    this.ws = ws;
    let settling = 0;
    ws.addEventListener("open", () => {
      // An overloaded server accepts and closes at once (4013): only a socket that stays open
      // counts, so a refused one neither resets the backoff nor makes the page reload its data.
      settling = setTimeout(() => {
        settling = 0;
        const reconnect = this.everOpened || this.attempt > 0;
        this.attempt = 0;
        this.everOpened = true;
        this.handlers.onOpen(reconnect);
      }, SETTLE_MS);
    });
    ws.addEventListener("message", (event) => {
      let frame;
      try {
        frame = JSON.parse(event.data);
      } catch {
        return; // the server only sends JSON; ignore anything else
      }
      this.handlers.onFrame(frame);
    });
    ws.addEventListener("close", (event) => {
      clearTimeout(settling);
      if (this.ws !== ws || this.leaving) return;
      this.ws = null;
      if (event.code === UNAUTHENTICATED) {
        this.handlers.onSignedOut();
        return;
      }
      const databaseDown = event.code === DATABASE_UNAVAILABLE;
      const busy = event.code === TRY_AGAIN_LATER || databaseDown;
      if (busy) this.attempt = Math.max(this.attempt, BUSY_FIRST_ATTEMPT);
      this.handlers.onDown(busy, databaseDown);
      this.scheduleReconnect();
    });
  }

  scheduleReconnect() {
    // 0.5 s doubling to 10 s; the jitter keeps a whole team from reconnecting in step after a restart.
    const base = Math.min(MAX_DELAY_MS, FIRST_DELAY_MS * 2 ** this.attempt);
    const delay = base * (0.75 + Math.random() * 0.5);
    this.attempt += 1;
    this.timer = setTimeout(() => this.connect(), delay);
  }

  /** The page is navigating away on purpose (signing out): a close now is no news to act on. */
  leave() {
    this.leaving = true;
    clearTimeout(this.timer);
  }

  retryNow() {
    if (this.timer) {
      clearTimeout(this.timer);
      this.connect();
    }
  }

  /** Sends a frame; false when the socket is down (the caller tells the user). */
  send(frame) {
    if (!this.isOpen) return false;
    this.ws.send(JSON.stringify(frame));
    return true;
  }
}

// The embedded transport: direct WebRTC with the service. One RTCPeerConnection at a time, with a receive-only video
// transceiver and a data channel labelled "control" (control protocol v1 both ways). The offer is POSTed with its
// candidates (no trickle). Every new offer rebinds the same session, so reconnecting is simply offering again:
// on "failed" at once, on "disconnected" if it has not recovered after DISCONNECTED_GRACE_MS. A viewer offers to its
// watch URL with its viewer credential; when that is refused (401: expired), it asks `refresh` for new details.

const GATHER_TIMEOUT_MS = 3000;
const DISCONNECTED_GRACE_MS = 2000;
const RETRY_MS = [500, 1000, 2000, 4000, 4000, 4000];

function gathered(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, GATHER_TIMEOUT_MS); // offer what was gathered so far
    pc.addEventListener("icegatheringstatechange", () => {
      if (pc.iceGatheringState === "complete") {
        clearTimeout(timer);
        resolve();
      }
    });
  });
}

export class EmbeddedLink {
  // details: the session's transport ({kind: "embedded", offer_url, data_channel}, or a viewer's with `viewer_token`);
  // handlers: onOpen(), onStatus(msg), onStream(MediaStream, RTCRtpReceiver), onState(text), onFatal(error);
  // refresh: () => a promise of fresh viewer details (viewers only).
  constructor(api, details, handlers, refresh = null) {
    this.kind = "embedded";
    this.refresh = refresh;
    this.api = api;
    this.details = details;
    this.handlers = handlers;
    this.pc = null;
    this.channel = null;
    this.generation = 0;
    this.closed = false;
    this.timer = null;
    this.failures = 0;
  }

  // Offer a new peer connection (the first one, or a rebind replacing the current one).
  async connect() {
    if (this.closed) return;
    clearTimeout(this.timer);
    this.timer = null;
    const generation = ++this.generation;
    if (this.pc) this.pc.close();
    const pc = new RTCPeerConnection({ iceServers: [] });
    this.pc = pc;
    const current = () => this.pc === pc && !this.closed;
    pc.addTransceiver("video", { direction: "recvonly" });
    const channel = pc.createDataChannel(this.details.data_channel || "control");
    this.channel = channel;
    channel.onopen = () => current() && this.handlers.onOpen();
    channel.onmessage = (event) => {
      if (!current()) return;
      try {
        this.handlers.onStatus(JSON.parse(event.data));
      } catch (error) {
        console.warn("lingstream: unreadable status message", error);
      }
    };
    pc.ontrack = (event) => {
      if (current()) this.handlers.onStream(event.streams[0] || new MediaStream([event.track]), event.receiver);
    };
    pc.onconnectionstatechange = () => {
      if (!current()) return;
      const state = pc.connectionState;
      this.handlers.onState(`${state} (peer connection ${generation})`);
      if (state === "connected") {
        this.failures = 0;
        clearTimeout(this.timer);
        this.timer = null;
      } else if (state === "failed") {
        this.reconnectLater(0);
      } else if (state === "disconnected") {
        this.reconnectLater(DISCONNECTED_GRACE_MS);
      }
    };
    try {
      await pc.setLocalDescription(await pc.createOffer());
      await gathered(pc);
      if (!current()) return;
      const token = this.details.viewer_token || null;
      const { body } = await this.api.offer(this.details.offer_url, pc.localDescription.sdp, token);
      if (!current()) return;
      await pc.setRemoteDescription(body);
    } catch (error) {
      if (!current()) return;
      if (error.status === 404 || error.status === 409) {
        this.handlers.onFatal(error); // the session is gone or ending: nothing to reconnect to
        return;
      }
      if (error.status === 401 && this.refresh !== null) {
        try {
          this.details = await this.refresh(); // a viewer whose credential expired: a new one, a new place
        } catch (refreshError) {
          this.handlers.onFatal(refreshError);
          return;
        }
      }
      this.handlers.onState(`offer failed: ${error.message}`);
      this.reconnectLater(RETRY_MS[Math.min(this.failures++, RETRY_MS.length - 1)]);
    }
  }

  reconnectLater(delay) {
    if (this.closed || this.timer !== null) return;
    this.timer = setTimeout(() => {
      this.timer = null;
      const state = this.pc ? this.pc.connectionState : "closed";
      if (!this.closed && state !== "connected") this.connect();
    }, delay);
  }

  send(message) {
    if (this.channel === null || this.channel.readyState !== "open") return false;
    this.channel.send(JSON.stringify(message));
    return true;
  }

  close() {
    this.closed = true;
    clearTimeout(this.timer);
    this.timer = null;
    if (this.pc) this.pc.close();
    this.channel = null;
  }
}

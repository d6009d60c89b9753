// The LiveKit transport: join the session's room with livekit-client (served by the service from its vendored npm
// package, imported on first use), show the service participant's video track, send control as data on the control
// topic (snapshots lossy, commands reliable) and read status from the status topic. livekit-client resumes a dropped
// connection by itself; if it gives up (a disconnect that does not mean "over"), the page fetches fresh join details
// (same identity, new token) and joins again, within the service's reconnect grace. The service participant's
// attributes carry the session's state (`lingstream.state`, synced to late joiners): read on joining and on each
// change, so a viewer or a rejoining tab shows the state before the next status broadcast.

const OVER = new Set([1, 2, 4, 5, 10]); // DisconnectReason: CLIENT_INITIATED, DUPLICATE_IDENTITY, PARTICIPANT_REMOVED,
// ROOM_DELETED, ROOM_CLOSED: the session (or this tab's part in it) is over; do not rejoin.
const REJOIN_MS = [500, 1000, 2000, 4000];

export class LiveKitLink {
  // bundleUrl: the livekit-client ES module; details: the session's transport ({kind: "livekit", url, room, token,
  // identity, service_identity, control_topic, status_topic}); refresh(): fresh details; handlers as EmbeddedLink's.
  constructor(bundleUrl, details, refresh, handlers) {
    this.kind = "livekit";
    this.bundleUrl = bundleUrl;
    this.details = details;
    this.refresh = refresh;
    this.handlers = handlers;
    this.room = null;
    this.closed = false;
    this.rejoins = 0;
    this.attributes = {}; // the service participant's, as last read
    this.encoder = new TextEncoder();
    this.decoder = new TextDecoder();
  }

  get pc() {
    return null; // livekit-client owns its peer connections
  }

  async connect() {
    if (!this.bundleUrl) throw new Error("the livekit-client bundle is not installed on this server");
    const lk = await import(this.bundleUrl);
    const details = this.details;
    const room = new lk.Room({ adaptiveStream: false, dynacast: false });
    const current = () => this.room === room && !this.closed;
    room.on(lk.RoomEvent.TrackSubscribed, (track, _publication, participant) => {
      if (current() && track.kind === lk.Track.Kind.Video && participant.identity === details.service_identity) {
        this.handlers.onStream(new MediaStream([track.mediaStreamTrack]), track.receiver);
      }
    });
    room.on(lk.RoomEvent.DataReceived, (payload, participant, _kind, topic) => {
      if (!current() || topic !== details.status_topic) return;
      if (participant && participant.identity !== details.service_identity) return;
      try {
        this.handlers.onStatus(JSON.parse(this.decoder.decode(payload)));
      } catch (error) {
        console.warn("lingstream: unreadable status message", error);
      }
    });
    room.on(lk.RoomEvent.ParticipantAttributesChanged, (changed, participant) => {
      if (current() && participant.identity === details.service_identity && "lingstream.state" in changed) {
        this.stateFromAttributes(participant);
      }
    });
    room.on(lk.RoomEvent.ConnectionStateChanged, (state) => current() && this.handlers.onState(`LiveKit ${state}`));
    room.on(lk.RoomEvent.Disconnected, (reason) => {
      if (!current()) return;
      if (OVER.has(reason)) {
        this.handlers.onState(`LiveKit: left the room (reason ${reason})`);
        return;
      }
      this.rejoinLater();
    });
    this.room = room;
    await room.connect(details.url, details.token, { autoSubscribe: true });
    if (!current()) {
      await room.disconnect();
      return;
    }
    this.rejoins = 0;
    this.handlers.onOpen();
    const service = room.remoteParticipants.get(details.service_identity);
    if (service) this.stateFromAttributes(service);
  }

  stateFromAttributes(participant) {
    // The attributes as a `state` status: the page handles both the same way (the newest wins).
    const state = participant.attributes["lingstream.state"];
    this.attributes = { ...participant.attributes };
    if (state) this.handlers.onStatus({ v: 1, type: "state", state, from: "attributes" });
  }

  rejoinLater() {
    const delay = REJOIN_MS[Math.min(this.rejoins++, REJOIN_MS.length - 1)];
    this.handlers.onState(`LiveKit: disconnected, joining again in ${delay} ms`);
    setTimeout(async () => {
      if (this.closed) return;
      try {
        this.details = await this.refresh();
        await this.connect();
      } catch (error) {
        if (error.status === 404 || error.status === 409) this.handlers.onFatal(error);
        else if (!this.closed) this.rejoinLater();
      }
    }, delay);
  }

  send(message, reliable) {
    const room = this.room;
    if (room === null || room.state !== "connected") return false;
    const payload = this.encoder.encode(JSON.stringify(message));
    room.localParticipant
      .publishData(payload, { reliable, topic: this.details.control_topic })
      .catch((error) => console.warn("lingstream: sending control failed", error));
    return true;
  }

  close() {
    this.closed = true;
    if (this.room) this.room.disconnect();
  }
}

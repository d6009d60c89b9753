// A lingstream world in a React app, as an integrator writes it: one hook, one component. The service's address comes
// from `?service=` (default: this page's origin); a client token from `?token_url=` (your backend's token endpoint,
// docs/integrate.md), else `?api_key=` (development only), else none (a service without API keys).
import { useState } from "react";
import { createRoot } from "react-dom/client";
import { tokenEndpoint } from "@lingstream/client";
import { useLingstream, WorldView } from "@lingstream/react";

const query = new URLSearchParams(window.location.search);
const auth = query.get("token_url")
  ? { tokenProvider: tokenEndpoint(query.get("token_url")) }
  : query.get("api_key")
    ? { apiKey: query.get("api_key") }
    : {};

function World() {
  const world = useLingstream({
    baseUrl: query.get("service") ?? "",
    ...auth,
    config: { width: Number(query.get("width") ?? 128), height: Number(query.get("height") ?? 96) },
  });
  const [text, setText] = useState("");
  window.world = world; // for the test and the console
  const { status, queuePosition, stats, error, done } = world;
  return (
    <main>
      <h1>A lingstream world</h1>
      <WorldView lingstream={world} id="world" width={416} />
      <p>
        Status: <strong id="status">{status}</strong>
        {queuePosition !== null && <span id="queue"> (number {queuePosition} in the queue)</span>}
      </p>
      <p id="figures">
        {stats ? `${stats.fps} fps, ${stats.frames} frames, control → photon ${stats.photonMs === null ? "–" : Math.round(stats.photonMs)} ms` : "–"}
      </p>
      {error && <p id="error">{error.code}: {error.message}</p>}
      {done && <p id="done">Over: {done}</p>}
      <p>
        <button id="forward" onPointerDown={() => world.keys.hold("w")} onPointerUp={() => world.keys.release("w")}>
          Hold to go forward (or W A S D)
        </button>
        <button id="pause" onClick={() => world.pause()}>{status === "paused" ? "Resume" : "Pause"}</button>
        <button id="stop" onClick={() => world.stop()}>Stop</button>
      </p>
      <form
        onSubmit={(event) => {
          event.preventDefault();
          world.prompt(text);
        }}
      >
        <input id="prompt" value={text} onChange={(event) => setText(event.target.value)} placeholder="a snowy night" />
        <button type="submit">Apply prompt</button>
      </form>
    </main>
  );
}

createRoot(document.getElementById("root")).render(<World />);

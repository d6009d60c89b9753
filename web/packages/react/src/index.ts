// @lingstream/react: a lingstream world in a React app. `useLingstream({tokenProvider})` creates a session when the
// component mounts (a client token from your backend: docs/integrate.md), follows its queue, joins it into the video
// `<WorldView/>` renders, and hands back what a view needs: the status, the queue position, the figures, and the
// controls (held keys, prompt, pause). Unmounting stops the session and lets go of everything (close() is bounded).
// Everything else is @lingstream/client's Session, which the hook also returns.

import { createElement, useEffect, useMemo, useRef, useState, type ReactElement, type VideoHTMLAttributes } from "react";
import {
  createSession,
  type CommandOutcome,
  type CreateOptions,
  type ErrorStatus,
  type Session,
  type Stats,
} from "@lingstream/client";

export const VERSION = "0.1.0";

/** What the hook shows: "idle" before it starts, "creating", a session state, or "error" when the create failed. */
export type Status = "idle" | "creating" | "error" | string;

export interface UseLingstreamOptions extends CreateOptions {
  /** Keyboard control (W A S D, I J K L, the arrows) on the window while the session runs; default true. */
  keyboard?: boolean;
  /** Gamepad control (the first pad, standard mapping); default false. */
  gamepad?: boolean;
}

export interface Lingstream {
  status: Status;
  queuePosition: number | null;
  /** Give it to the <video> that shows the world (or render <WorldView lingstream={...}/>). */
  videoRef: { current: HTMLVideoElement | null };
  keys: { hold(key: string): boolean; release(key: string): boolean };
  prompt(text: string): Promise<CommandOutcome>;
  /** Pauses a running session, resumes a paused one. */
  pause(): Promise<CommandOutcome>;
  stop(): Promise<void>;
  stats: Stats | null;
  /** Why the create failed, or the last error the session reported. */
  error: { code: string; message: string } | null;
  /** Why the session ended (the `done` reason), once it did. */
  done: string | null;
  session: Session | null;
}

export function useLingstream(options: UseLingstreamOptions): Lingstream {
  const videoRef = useRef<HTMLVideoElement | null>(null);
  const optionsRef = useRef(options);
  optionsRef.current = options;
  const [session, setSession] = useState<Session | null>(null);
  const [status, setStatus] = useState<Status>("idle");
  const [queuePosition, setQueuePosition] = useState<number | null>(null);
  const [stats, setStats] = useState<Stats | null>(null);
  const [error, setError] = useState<{ code: string; message: string } | null>(null);
  const [done, setDone] = useState<string | null>(null);

  useEffect(() => {
    const { keyboard = true, gamepad = false, ...create } = optionsRef.current;
    let cancelled = false;
    let current: Session | null = null;
    setStatus("creating");
    createSession(create).then(
      (created) => {
        if (cancelled) {
          void created.stop().finally(() => created.close());
          return;
        }
        current = created;
        created.on("state", ({ state }) => setStatus(state));
        created.on("queue", ({ position }) => setQueuePosition(position));
        created.on("stats", (figures) => setStats(figures));
        created.on("error", (status: ErrorStatus) => setError({ code: status.code, message: status.message }));
        created.on("done", ({ reason, state }) => {
          setDone(reason);
          setStatus(state);
        });
        if (keyboard) created.attachKeyboard();
        if (gamepad) created.attachGamepad();
        setSession(created);
        setStatus(created.state);
        setQueuePosition(created.queuePosition);
        void created.join(videoRef.current);
      },
      (failure: unknown) => {
        if (cancelled) return;
        const code = typeof (failure as { code?: unknown }).code === "string" ? (failure as { code: string }).code : "create_failed";
        setError({ code, message: failure instanceof Error ? failure.message : String(failure) });
        setStatus("error");
      },
    );
    return () => {
      cancelled = true;
      if (current !== null) {
        const ending = current;
        void ending.stop().finally(() => ending.close());
      }
    };
  }, []);

  const controls = useMemo(
    () => ({
      keys: {
        hold: (key: string) => (session !== null ? session.keys.hold(key) : false),
        release: (key: string) => (session !== null ? session.keys.release(key) : false),
      },
      prompt: (text: string) => (session !== null ? session.prompt(text) : Promise.resolve(false as const)),
      pause: () =>
        session === null ? Promise.resolve(false as const) : session.state === "paused" ? session.resume() : session.pause(),
      stop: () => (session !== null ? session.stop() : Promise.resolve()),
    }),
    [session],
  );

  return { status, queuePosition, videoRef, stats, error, done, session, ...controls };
}

export interface WorldViewProps extends VideoHTMLAttributes<HTMLVideoElement> {
  lingstream: Pick<Lingstream, "videoRef">;
}

/** The video of the world: muted, inline, autoplaying (what browsers allow without a click). */
export function WorldView({ lingstream, ...props }: WorldViewProps): ReactElement {
  return createElement("video", { autoPlay: true, muted: true, playsInline: true, ...props, ref: lingstream.videoRef });
}

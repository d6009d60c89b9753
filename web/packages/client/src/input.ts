// Keyboard and gamepad → held keys. The keyboard controller listens on a target (the window by default), skips keys
// typed into form fields and modified keys (Ctrl, Alt, Meta: the browser's shortcuts), and releases everything when
// the window loses focus (a key released elsewhere would otherwise stay held). The gamepad controller polls the
// standard mapping: the left stick or the D-pad moves (w a s d), the right stick turns and looks (j l, i k).

import type { Controls } from "./controls.js";

function isEditable(target: EventTarget | null): boolean {
  if (typeof HTMLElement === "undefined" || !(target instanceof HTMLElement)) return false;
  return (
    target instanceof HTMLInputElement ||
    target instanceof HTMLTextAreaElement ||
    target instanceof HTMLSelectElement ||
    target.isContentEditable
  );
}

export interface InputController {
  /** Stops listening (and releases what this controller held). */
  detach(): void;
}

/** Held keys from the keyboard; `detach()` stops listening. */
export function keyboardController(controls: Controls, target: EventTarget = window): InputController {
  const onKey = (event: Event, down: boolean): void => {
    const key = event as KeyboardEvent;
    if (!controls.active || isEditable(key.target)) return;
    if (key.ctrlKey || key.metaKey || key.altKey) return;
    const name = key.key.length === 1 ? key.key.toLowerCase() : key.key;
    if (down ? controls.hold(name) : controls.release(name)) key.preventDefault();
  };
  const down = (event: Event): void => onKey(event, true);
  const up = (event: Event): void => onKey(event, false);
  const blur = (): void => controls.releaseAll();
  target.addEventListener("keydown", down);
  target.addEventListener("keyup", up);
  window.addEventListener("blur", blur);
  return {
    detach() {
      target.removeEventListener("keydown", down);
      target.removeEventListener("keyup", up);
      window.removeEventListener("blur", blur);
      controls.releaseAll();
    },
  };
}

const STICK = 0.5;
const POLL_MS = 50;

/** The keys a standard-mapping gamepad holds: axes 0/1 (left stick), 2/3 (right stick), buttons 12–15 (D-pad). */
export function gamepadKeys(pad: Pick<Gamepad, "axes" | "buttons">): Set<string> {
  const keys = new Set<string>();
  const axis = (index: number): number => pad.axes[index] ?? 0;
  const button = (index: number): boolean => Boolean(pad.buttons[index]?.pressed);
  if (axis(1) < -STICK || button(12)) keys.add("w");
  if (axis(1) > STICK || button(13)) keys.add("s");
  if (axis(0) < -STICK || button(14)) keys.add("a");
  if (axis(0) > STICK || button(15)) keys.add("d");
  if (axis(2) < -STICK) keys.add("j");
  if (axis(2) > STICK) keys.add("l");
  if (axis(3) < -STICK) keys.add("i");
  if (axis(3) > STICK) keys.add("k");
  return keys;
}

/** Held keys from the first connected gamepad, polled every 50 ms; `detach()` stops. */
export function gamepadController(
  controls: Controls,
  pads: () => ReadonlyArray<Gamepad | null> = () => navigator.getGamepads(),
): InputController {
  let held = new Set<string>();
  const poll = (): void => {
    const pad = pads().find((candidate) => candidate !== null && candidate.connected) ?? null;
    const now = pad === null ? new Set<string>() : gamepadKeys(pad);
    for (const key of held) if (!now.has(key)) controls.release(key);
    for (const key of now) if (!held.has(key)) controls.hold(key);
    held = now;
  };
  const timer = setInterval(poll, POLL_MS);
  return {
    detach() {
      clearInterval(timer);
      for (const key of held) controls.release(key);
      held = new Set();
    },
  };
}

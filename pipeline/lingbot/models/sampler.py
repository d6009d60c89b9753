"""The four-step Fast flow-matching sampler and one chunk's full denoise (sampling plus the clean cache pass).

Schedule (the reference's UniPC flow schedule, used only for its table): 1000 training steps, sigmas from 0.999
down to 0 in 1000 equal steps, shifted by `s' = shift * s / (1 + (shift - 1) * s)` with shift 5.0, timesteps
`int(s' * 1000)` (truncated). The Fast variant takes the entries [0, 179, 358, 679]: t = 999, 957, 899, 702.

Each step: `v = model(x_t, t)`, `x0 = x_t - sigma * v` (in float64), then, except after the last step, re-noise to
the next timestep with fresh noise from the session's generator: `x = (1 - sigma') * x0 + sigma' * noise`. No
classifier-free guidance. The reference looks the sigmas up from the integer timestep, and truncation makes some
timesteps repeat (957 at entries 179..182, 899 at 357..359): x0 uses the first entry with the step's timestep
(argmin), re-noising the second when there are several (the scheduler's `index_for_timestep`). This module keeps
those exact lookups (`FastSchedule`), a ~1e-4 difference in sigma that matters for parity with the reference.

Latents stay float32 between steps (the reference keeps them in the model's dtype); the model's inputs are cast to
its dtype by the model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.lingbot.errors import ModelInputError
from pipeline.lingbot.models.cache import KVCache, TextKV
from pipeline.lingbot.models.dit import LingBotFastDiT
from pipeline.lingbot.models.errors import ModelConfigError

__all__ = ["FAST_SCHEDULE", "FastSchedule", "denoise_chunk", "fast_schedule", "prefill_chunk", "sample_chunk"]

Predictor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""`(x_t [B, 16, F, h, w] float32, t [B] float32) -> velocity`, the model with everything else bound."""


@dataclass(frozen=True, slots=True)
class FastSchedule:
    """The per-step values the sampler uses (sigmas are float32 values, as the reference stores them)."""

    timesteps: tuple[int, ...]
    x0_sigmas: tuple[float, ...]
    """Sigma turning step i's velocity into x0."""
    renoise_sigmas: tuple[float, ...]
    """Sigma of the re-noising after step i (one fewer than the steps)."""

    def __post_init__(self) -> None:
        steps = len(self.timesteps)
        if steps < 1 or len(self.x0_sigmas) != steps or len(self.renoise_sigmas) != steps - 1:
            raise ModelConfigError(f"FastSchedule: inconsistent lengths for {steps} steps")


def fast_schedule(
    indices: Sequence[int] = (0, 179, 358, 679), *, train_steps: int = 1000, shift: float = 5.0
) -> FastSchedule:
    """The schedule at the given entries of the shifted `train_steps` table (defaults: LingBot-World-Fast)."""
    if not indices or any(not 0 <= i < train_steps for i in indices):
        raise ModelConfigError(f"schedule indices must lie in 0..{train_steps - 1}, got {list(indices)}")
    sigma_max = float(np.float32(1.0 - 1.0 / train_steps))
    sigmas = np.linspace(sigma_max, 0.0, train_steps + 1)[:-1]
    sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
    timesteps = torch.from_numpy(sigmas * train_steps).to(torch.int64).tolist()
    stored = [float(value) for value in sigmas.astype(np.float32)]

    def first(t: int) -> float:
        return stored[timesteps.index(t)]

    def lookup(t: int) -> float:
        matches = [i for i, value in enumerate(timesteps) if value == t]
        return stored[matches[1] if len(matches) > 1 else matches[0]]

    steps = [timesteps[i] for i in indices]
    return FastSchedule(
        timesteps=tuple(steps),
        x0_sigmas=tuple(first(t) for t in steps),
        renoise_sigmas=tuple(lookup(t) for t in steps[1:]),
    )


FAST_SCHEDULE = fast_schedule()
"""t = 999, 957, 899, 702."""


def sample_chunk(
    predict: Predictor,
    noise: torch.Tensor,
    generator: torch.Generator | None,
    schedule: FastSchedule = FAST_SCHEDULE,
) -> torch.Tensor:
    """Runs the schedule from `noise` and returns x0 (float32). Re-noising draws from `generator` in order, so a
    seeded generator makes the session reproducible."""
    x = noise.float()
    batch = x.shape[0]
    # The chunk's timesteps and sigmas in one device table: one host-to-device copy for the chunk, none in or
    # between its steps, and no Python number baked into a step. Made on the CPU and moved with `.to`, so the
    # workload counter sees the copy (`torch.tensor(..., device=...)` copies below the dispatcher, unseen). The
    # values are float32 as before (timesteps are integers, the sigmas float32 values), so the results are equal.
    steps = len(schedule.timesteps)
    table = torch.tensor(
        [schedule.timesteps, schedule.x0_sigmas, (*schedule.renoise_sigmas, 0.0)], dtype=torch.float32
    ).to(x.device)
    timesteps, x0_sigmas, renoise_sigmas = table.unbind(0)
    for step in range(steps):
        velocity = predict(x, timesteps[step].expand(batch))
        x0 = (x.double() - x0_sigmas[step].double() * velocity.double()).float()
        if step == steps - 1:
            return x0
        fresh = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=torch.float32)
        renoise = renoise_sigmas[step]
        x = (1 - renoise) * x0 + renoise * fresh
    raise AssertionError("unreachable: the schedule has at least one step")


def denoise_chunk(
    model: LingBotFastDiT,
    cache: KVCache,
    text: TextKV,
    condition: torch.Tensor,
    noise: torch.Tensor,
    generator: torch.Generator | None,
    control: torch.Tensor | None = None,
    schedule: FastSchedule = FAST_SCHEDULE,
) -> torch.Tensor:
    """One chunk: reserve its cache slot, sample x0 from `noise` `[B, 16, F, h, w]` given `condition`
    `[B, 20, F, h, w]` (first-frame mask, then image latent), then one clean pass at t = 0 so the cache holds
    the chunk's final K/V. The camera's per-block modulation is made once for the chunk's 5 forwards. Returns x0
    `[B, 16, F, h, w]` float32."""
    if noise.ndim != 5 or condition.shape[0] != noise.shape[0] or condition.shape[2:] != noise.shape[2:]:
        raise ModelInputError(
            f"noise {list(noise.shape)} and condition {list(condition.shape)} must share batch, frames and size"
        )
    with torch.inference_mode():
        slot = cache.begin_chunk(noise.shape[2])
        cond = condition.to(noise.device, torch.float32)
        camera = model.camera_modulation(control) if control is not None else None

        def predict(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            velocity: torch.Tensor = model(torch.cat([x, cond], dim=1), t, text, cache, slot, camera=camera)
            return velocity

        x0 = sample_chunk(predict, noise, generator, schedule)
        predict(x0, torch.zeros(noise.shape[0], dtype=torch.float32, device=noise.device))
    return x0


def prefill_chunk(
    model: LingBotFastDiT,
    cache: KVCache,
    text: TextKV,
    condition: torch.Tensor,
    x0: torch.Tensor,
    control: torch.Tensor | None = None,
) -> None:
    """A chunk already generated, written into the cache again (a re-seed's prefill, docs/continuity.md): only the
    clean pass of `denoise_chunk`, over its final latent `x0` `[B, 16, F, h, w]` with the same `condition`, camera
    and text. With the same cache before it, the same inputs and the same slot, it writes exactly the K/V the
    chunk's own clean pass wrote (the same operations on the same values)."""
    if x0.ndim != 5 or condition.shape[0] != x0.shape[0] or condition.shape[2:] != x0.shape[2:]:
        raise ModelInputError(
            f"latent {list(x0.shape)} and condition {list(condition.shape)} must share batch, frames and size"
        )
    with torch.inference_mode():
        slot = cache.begin_chunk(x0.shape[2])
        latent = x0.float()
        cond = condition.to(latent.device, torch.float32)
        camera = model.camera_modulation(control) if control is not None else None
        t = torch.zeros(latent.shape[0], dtype=torch.float32, device=latent.device)
        model(torch.cat([latent, cond], dim=1), t, text, cache, slot, camera=camera)

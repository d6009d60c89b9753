"""LingBot: the session policy, its graph and the world models behind one small seam, grouped by what they do.

- At the top, the building blocks both world models and the policy share: `chunks` (the chunk contract), `controls`
  and `camera` (held keys to poses and the per-chunk `CameraChunk`), `config` (a session's config and its limits),
  `seam` (the `WorldModel` protocols: encode, denoise, decode), `stage_sessions` (a stage's per-session states),
  `hud` (the on-frame HUD) and `errors` (the package's exception tree).
- `policy/`: the LingBot session policy — `LingBotService` (the `BidirectionalService` of a model worker), one
  session's loop, playout timing and prompt handling.
- `graph/`: the orchestrator's graph and actors for one model worker, on threads or worker processes, and the
  placement planner.
- `reference/`: the built-in reference world model (no weights) and how it reads a prompt.
- `models/`: LingBot-World-Fast (the DiT, the Wan VAE, the umt5 text encoder).

Nothing is re-exported here: importing `pipeline.lingbot.errors` (or `chunks`, `config`) must not load torch, and
most modules here do. Import from the module that defines a name.
"""

"""The LingBot session policy: `LingBotService` (a model worker's `BidirectionalService`), one session's loop,
when its next chunk starts (`playout`) and how its prompt changes (`prompts`)."""

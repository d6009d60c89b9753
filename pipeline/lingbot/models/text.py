"""The umt5 text encoder (transformers' `UMT5EncoderModel` and its tokenizer): a prompt to the DiT's text states,
each distinct prompt encoded once per worker.

What the DiT reads (`LingBotFastDiT.encode_text`) is `[1, text_len, text_dim]`: the encoder's last hidden states
for the prompt tokenised to `text_len` (512) tokens (end-of-sequence token added, padded, truncated), with every
position past the prompt's own tokens set to zero, as the reference serving code does. The full-size encoder is
umt5-xxl's (d_model 4096, 24 layers, 5.7 B parameters, ~11 GB in bf16).

The default prompt. A session without a prompt (`prompt=""` at the seam) is conditioned on `DEFAULT_PROMPT`, the
empty string, which is what the reference serving code encodes when a request has no prompt: umt5 over the
end-of-sequence token alone. The model has no unconditional branch (no classifier-free guidance in the Fast
sampler), so "no prompt" has to be some text; the empty one is the model's own default.

Caching: states are kept per distinct prompt string in a bounded LRU (`PromptCache`, default 16 prompts; 4 MB each
at full size in bf16), shared by every session of the worker, so a prompt switched back and forth is encoded once.
The DiT's per-layer cross-attention K/V built from the states are per session (`bytes_per_session` counts them).

Layout (the Wan-Diffusers repositories' `text_encoder/` and `tokenizer/`): an encoder folder with `config.json`
and `model.safetensors` (or `model.safetensors.index.json` and its shards), loaded strictly (the tied alias
`encoder.embed_tokens.weight` may be absent: savers drop it); a tokenizer folder that `AutoTokenizer` loads
offline (`tokenizer.json`, or umt5's `spiece.model` with its configs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from pipeline.lingbot.errors import ModelInputError
from pipeline.lingbot.models.checkpoint import load_strict, locate_checkpoint
from pipeline.lingbot.models.errors import CheckpointError
from pipeline.lingbot.policy.prompts import PromptCache, PromptCacheStatistics

__all__ = [
    "DEFAULT_PROMPT",
    "TEXT_ENCODER_WEIGHTS",
    "TINY_UMT5_CONFIG",
    "UMT5TextEncoder",
    "load_text_encoder",
    "write_tiny_text_encoder",
]

DEFAULT_PROMPT = ""
"""What a session without a prompt is conditioned on (the module docstring says why the empty string)."""

TEXT_ENCODER_WEIGHTS = "model.safetensors"
_TIED_ALIAS = "encoder.embed_tokens.weight"

TINY_UMT5_CONFIG: dict[str, Any] = {
    "d_kv": 8,
    "d_ff": 32,
    "num_layers": 2,
    "num_heads": 3,
    "relative_attention_num_buckets": 8,
    "relative_attention_max_distance": 16,
    "feed_forward_proj": "gated-gelu",
    "is_encoder_decoder": False,
    "use_cache": False,
    "tie_word_embeddings": False,
}
"""A umt5 encoder of the real architecture at test size (`d_model` is the DiT's `text_dim`, given separately)."""


class UMT5TextEncoder:
    """A loaded umt5 encoder and tokenizer with a per-worker cache of prompt states.

    `encode` is called from the denoiser's thread; the cache's statistics may be read from any thread.
    """

    def __init__(self, encoder: Any, tokenizer: Any, *, text_len: int, cache_size: int = 16) -> None:
        if text_len < 1:
            raise ModelInputError(f"text_len must be >= 1, got {text_len}")
        self._encoder = encoder.eval().requires_grad_(False)
        self._tokenizer = tokenizer
        self._text_len = text_len
        self._cache: PromptCache[torch.Tensor] = PromptCache(cache_size)

    @property
    def text_dim(self) -> int:
        return int(self._encoder.config.d_model)

    @property
    def text_len(self) -> int:
        return self._text_len

    @property
    def device(self) -> torch.device:
        device: torch.device = next(self._encoder.parameters()).device
        return device

    def encode(self, prompt: str) -> torch.Tensor:
        """`[1, text_len, text_dim]` states of `prompt` ("" is `DEFAULT_PROMPT`), zero past its tokens; cached
        per distinct prompt. The returned tensor is shared: do not modify it."""
        return self._cache.get(prompt or DEFAULT_PROMPT, lambda: self._encode(prompt or DEFAULT_PROMPT))

    def statistics(self) -> PromptCacheStatistics:
        return self._cache.statistics()

    def _encode(self, prompt: str) -> torch.Tensor:
        tokens = self._tokenizer(
            [prompt],
            padding="max_length",
            max_length=self._text_len,
            truncation=True,
            add_special_tokens=True,
            return_attention_mask=True,
            return_tensors="pt",
        )
        ids = tokens["input_ids"].to(self.device)
        mask = tokens["attention_mask"].to(self.device)
        with torch.inference_mode():
            states: torch.Tensor = self._encoder(input_ids=ids, attention_mask=mask).last_hidden_state
            length = int(mask[0].sum())
            states = states.clone()
            states[:, length:] = 0
        return states


def load_text_encoder(
    encoder_dir: Path | str,
    tokenizer_dir: Path | str,
    *,
    text_len: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    cache_size: int = 16,
) -> UMT5TextEncoder:
    """The umt5 encoder from its folder (strict: every missing, unexpected, mis-shaped or mis-typed tensor named in
    one `CheckpointError`) and its tokenizer, offline."""
    from transformers import AutoTokenizer, UMT5Config, UMT5EncoderModel

    root = Path(encoder_dir)
    try:
        raw = json.loads((root / "config.json").read_text(encoding="utf-8"))
        config = UMT5Config(**{key: value for key, value in raw.items() if not key.startswith("_")})
    except (OSError, ValueError, TypeError) as exc:
        raise CheckpointError(
            f"text encoder folder {root}: config.json is missing or not a umt5 config: {exc}"
        ) from exc
    layout = locate_checkpoint(root, TEXT_ENCODER_WEIGHTS)
    with torch.device("meta"):
        model = UMT5EncoderModel(config)
    load_strict(
        model, layout, "the umt5 encoder in its config.json", dtype=dtype, device=device, optional={_TIED_ALIAS}
    )
    model.encoder.embed_tokens = model.shared
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"tokenizer folder {tokenizer_dir} cannot be loaded: {exc}") from exc
    return UMT5TextEncoder(model, tokenizer, text_len=text_len, cache_size=cache_size)


def write_tiny_text_encoder(
    encoder_dir: Path | str, tokenizer_dir: Path | str, *, d_model: int, seed: int = 0
) -> tuple[Path, Path]:
    """A random umt5 encoder (`TINY_UMT5_CONFIG`, `d_model` wide) and a byte-level tokenizer (every string
    tokenises; end-of-sequence appended like umt5's), saved in the real folder layouts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

    specials = ["<pad>", "</s>", "<unk>"]
    vocab = {token: i for i, token in enumerate(specials + sorted(pre_tokenizers.ByteLevel.alphabet()))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    tokenizer_root = Path(tokenizer_dir)
    tokenizer.save_pretrained(str(tokenizer_root))

    config = UMT5Config(vocab_size=len(vocab), d_model=d_model, pad_token_id=0, eos_token_id=1, **TINY_UMT5_CONFIG)
    with torch.random.fork_rng(devices=[]):  # transformers initialises from the global generator: seed a copy
        torch.manual_seed(seed)
        model = UMT5EncoderModel(config).eval()
    encoder_root = Path(encoder_dir)
    model.save_pretrained(str(encoder_root), safe_serialization=True)
    return encoder_root, tokenizer_root

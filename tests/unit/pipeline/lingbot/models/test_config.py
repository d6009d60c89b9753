"""The full-size model's parameter set, checked on the meta device against the documented checkpoint keys."""

from __future__ import annotations

import pytest
import torch

from pipeline.lingbot.errors import LingBotError
from pipeline.lingbot.models import LINGBOT_FAST_14B, TINY_DIT, DiTConfig, LingBotFastDiT, ModelConfigError

DIM, FFN, LAYERS = 5120, 13824, 40


def documented_shapes() -> dict[str, tuple[int, ...]]:
    """The checkpoint key set of the research note, with Wan2.2-A14B's shapes, written out by hand."""
    shapes: dict[str, tuple[int, ...]] = {
        "patch_embedding.weight": (DIM, 36, 1, 2, 2),
        "patch_embedding.bias": (DIM,),
        "patch_embedding_wancamctrl.weight": (DIM, 6 * 64 * 4),
        "patch_embedding_wancamctrl.bias": (DIM,),
        "text_embedding.0.weight": (DIM, 4096),
        "text_embedding.0.bias": (DIM,),
        "text_embedding.2.weight": (DIM, DIM),
        "text_embedding.2.bias": (DIM,),
        "time_embedding.0.weight": (DIM, 256),
        "time_embedding.0.bias": (DIM,),
        "time_embedding.2.weight": (DIM, DIM),
        "time_embedding.2.bias": (DIM,),
        "time_projection.1.weight": (6 * DIM, DIM),
        "time_projection.1.bias": (6 * DIM,),
        "head.head.weight": (16 * 4, DIM),
        "head.head.bias": (16 * 4,),
        "head.modulation": (1, 2, DIM),
    }
    for layer in (1, 2):
        shapes[f"c2ws_hidden_states_layer{layer}.weight"] = (DIM, DIM)
        shapes[f"c2ws_hidden_states_layer{layer}.bias"] = (DIM,)
    for n in range(LAYERS):
        block = f"blocks.{n}"
        shapes[f"{block}.modulation"] = (1, 6, DIM)
        for attn in ("self_attn", "cross_attn"):
            for proj in ("q", "k", "v", "o"):
                shapes[f"{block}.{attn}.{proj}.weight"] = (DIM, DIM)
                shapes[f"{block}.{attn}.{proj}.bias"] = (DIM,)
            shapes[f"{block}.{attn}.norm_q.weight"] = (DIM,)
            shapes[f"{block}.{attn}.norm_k.weight"] = (DIM,)
        shapes[f"{block}.norm3.weight"] = (DIM,)
        shapes[f"{block}.norm3.bias"] = (DIM,)
        shapes[f"{block}.ffn.0.weight"] = (FFN, DIM)
        shapes[f"{block}.ffn.0.bias"] = (FFN,)
        shapes[f"{block}.ffn.2.weight"] = (DIM, FFN)
        shapes[f"{block}.ffn.2.bias"] = (DIM,)
        for cam in ("cam_injector_layer1", "cam_injector_layer2", "cam_scale_layer", "cam_shift_layer"):
            shapes[f"{block}.{cam}.weight"] = (DIM, DIM)
            shapes[f"{block}.{cam}.bias"] = (DIM,)
    return shapes


def test_full_size_model_on_meta_has_exactly_the_documented_keys_and_shapes() -> None:
    with torch.device("meta"):
        model = LingBotFastDiT(LINGBOT_FAST_14B)
    actual = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    expected = documented_shapes()
    assert sorted(set(actual) - set(expected)) == []
    assert sorted(set(expected) - set(actual)) == []
    assert {k: v for k, v in actual.items() if expected[k] != v} == {}
    assert all(t.is_meta for t in model.state_dict().values())


def test_full_size_config_values() -> None:
    config = LINGBOT_FAST_14B
    assert (config.dim, config.ffn_dim, config.num_layers, config.num_heads) == (5120, 13824, 40, 40)
    assert config.head_dim == 128
    assert config.rope_split == (44, 42, 42)
    assert (config.in_dim, config.out_dim, config.text_dim, config.text_len) == (36, 16, 4096, 512)
    assert (config.control_map_channels, config.control_patch_dim) == (384, 1536)
    assert config.frame_tokens(60, 104) == 1560
    assert config.rope_frames == 1024


@pytest.mark.parametrize(("dim", "heads"), [(48, 2), (64, 2), (128, 1)])
def test_head_dims_whose_third_is_even_are_accepted(dim: int, heads: int) -> None:
    DiTConfig(dim=dim, ffn_dim=8, num_layers=1, num_heads=heads)


def test_head_dim_16_is_refused_with_the_rope_rule() -> None:
    with pytest.raises(ModelConfigError, match=r"head_dim // 3 even"):
        DiTConfig(dim=32, ffn_dim=8, num_layers=1, num_heads=2)


@pytest.mark.parametrize(
    "overrides",
    [{"num_heads": 3}, {"patch_size": (2, 2, 2)}, {"freq_dim": 33}, {"num_layers": 0}, {"eps": 0.0}],
)
def test_inconsistent_configs_are_refused(overrides: dict[str, object]) -> None:
    values: dict[str, object] = {"dim": 64, "ffn_dim": 96, "num_layers": 2, "num_heads": 2}
    values.update(overrides)
    with pytest.raises(ModelConfigError):
        DiTConfig(**values)  # type: ignore[arg-type]


def test_config_errors_are_lingbot_value_errors() -> None:
    assert issubclass(ModelConfigError, LingBotError)
    assert issubclass(ModelConfigError, ValueError)


def test_tiny_config_frame_tokens_refuse_odd_latents() -> None:
    with pytest.raises(ModelConfigError, match="patches"):
        TINY_DIT.frame_tokens(5, 6)

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pipeline.lingbot.models import TINY_DIT, LingBotFastDiT, load_dit, write_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random TINY_DIT checkpoint in the single-file layout, written once (read-only for tests)."""
    pytest.importorskip("safetensors", reason="the lingbot extra (safetensors) is not installed")
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-dit"), TINY_DIT, seed=1)


@pytest.fixture(scope="session")
def tiny_model(tiny_checkpoint: Path) -> LingBotFastDiT:
    return load_dit(tiny_checkpoint, TINY_DIT)


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Tiny tensors gain nothing from threads, and on a loaded machine OpenMP's spinning threads make these tests
    fifty times slower; the previous count is restored after each test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

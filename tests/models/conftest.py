"""Shared by the model tests: a small batch of token ids with one left-padded row."""

from __future__ import annotations

import pytest
import torch

N, L = 3, 12


@pytest.fixture
def padded_ids() -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)``, both ``[N, L]``; row 1 is left-padded by 4 tokens."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, 1000, (N, L), generator=generator)
    attention_mask = torch.ones(N, L, dtype=torch.long)
    attention_mask[1, :4] = 0
    return input_ids, attention_mask

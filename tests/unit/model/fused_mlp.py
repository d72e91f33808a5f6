"""A module shaped like GatedMLP after fuse(): fc and gate (8 -> 16 each, no bias), their weights also fused into
fc_gate (32, 8), and proj (proj_in -> 8, with a bias); the prepacking tests' model of what prepack_linears swaps."""
from __future__ import annotations

import torch
from torch import nn


class FusedMlp(nn.Module):
    def __init__(self, proj_in: int = 16) -> None:
        super().__init__()
        self.fc, self.gate, self.proj = nn.Linear(8, 16, bias=False), nn.Linear(8, 16, bias=False), nn.Linear(proj_in, 8)
        self.fc_gate = torch.cat([self.fc.weight, self.gate.weight]).detach()

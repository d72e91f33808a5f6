"""backend.model refuses a torch older than it runs on by name (pip enforces pyproject's bound; a container's own
torch or --no-deps bypasses it), instead of failing at the first attention call."""
from __future__ import annotations

import importlib

import pytest
import torch
from torch.torch_version import TorchVersion

import backend.model


def test_an_older_torch_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(torch, "__version__", TorchVersion("2.4.1+cpu"))
    try:
        with pytest.raises(ImportError, match=r"torch>=2\.5; this environment has torch 2\.4\.1\+cpu"):
            importlib.reload(backend.model)
    finally:
        monkeypatch.undo()
        importlib.reload(backend.model)


def test_this_torch_is_accepted():
    assert torch.__version__ >= backend.model.MIN_TORCH
    assert TorchVersion("2.10.0") >= backend.model.MIN_TORCH  # compared as versions: "2.10" < "2.5" as strings

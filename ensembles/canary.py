"""Canary rollout of LLM model versions: start a canary beside the stable version, shift its weight, promote it
or roll it back, without failing a request.

Two levers, each graceful:
- which versions of tensorrt_llm are loaded: Triton's model-control API in explicit mode, loading the model with a
  config override whose version_policy lists the versions (Triton loads the new set in the background, swaps,
  and unloads a dropped version once its in-flight requests are done);
- how requests are split: the router's routing table file (backend/policy/canary_router.py), replaced atomically; the
  router re-reads it by mtime, so nothing is reloaded.
The loaded set is also written into tensorrt_llm/config.pbtxt, so a restarted server loads what the table routes to.
Promote / roll back: weight 100 to the survivor, wait `drain_s` (requests already routed to the other version
start), drop the other version from the table, then unload it (Triton waits for its in-flight requests).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from backend.formats.versions import LLM_MODEL, list_versions
from backend.policy.canary_router import RoutingTable
from ensembles.canary_render import persist_versions, routing_file
from ensembles.server import ADMIN_HEADER


class CanaryError(ValueError):
    """A canary operation refused (bad version or weight, wrong state) or failed on the server."""


def check_weight(weight: int) -> int:
    if not isinstance(weight, int) or not 0 <= weight <= 100:
        raise CanaryError(f"weight must be an integer in [0, 100], got {weight!r}")
    return weight


@dataclass(frozen=True)
class ControlOptions:
    url: str  # Triton HTTP endpoint, host:port
    model_repository: Path  # the served repository (the routing table lives in it)
    admin_key: str | None = None  # sent as header `admin_header` when the server restricts model control
    admin_header: str = ADMIN_HEADER  # the launcher's (ensembles/server.py)
    drain_s: float = 1.0  # after the weight goes to 0 and before the version is dropped
    model: str = LLM_MODEL

    def __post_init__(self) -> None:
        if not routing_file(self.model_repository).is_file():
            raise CanaryError(f"{routing_file(self.model_repository)} not found: render the repository with --canary")
        if self.drain_s < 0:
            raise CanaryError(f"drain_s must be >= 0, got {self.drain_s}")


class CanaryController:
    def __init__(self, opts: ControlOptions, client: httpclient.InferenceServerClient | None = None) -> None:
        self.opts = opts
        self.client = client or httpclient.InferenceServerClient(opts.url, network_timeout=600.0)
        self.headers = {opts.admin_header: opts.admin_key} if opts.admin_key else None

    def close(self) -> None:
        self.client.close()

    # -- state -------------------------------------------------------------------------------------------------
    def table(self) -> RoutingTable:
        try:
            return RoutingTable.from_json(routing_file(self.opts.model_repository).read_text())
        except ValueError as exc:
            raise CanaryError(f"{routing_file(self.opts.model_repository)}: {exc}") from exc

    def loaded_versions(self) -> list[int]:
        index = self._call(self.client.get_model_repository_index, headers=self.headers)
        return sorted(int(m["version"]) for m in index
                      if m["name"] == self.opts.model and m.get("state") == "READY" and m.get("version"))

    def status(self) -> dict:
        table = self.table()
        return {"stable": table.stable, "canary": table.canary,
                "weights": {str(v): w for v, w in sorted(table.weights.items())},
                "loaded": self.loaded_versions(),
                "installed": list_versions(self.opts.model_repository, self.opts.model)}

    # -- operations ----------------------------------------------------------------------------------------------
    def start(self, version: int, weight: int) -> RoutingTable:
        check_weight(weight)
        table = self.table()
        installed = list_versions(self.opts.model_repository, self.opts.model)
        if version not in installed:
            raise CanaryError(f"version {version} of {self.opts.model} is not installed (installed: {installed})")
        if table.canary is not None:
            raise CanaryError(f"version {table.canary} is already the canary: promote or roll it back first")
        if version == table.stable:
            raise CanaryError(f"version {version} is the stable version; a canary must be another one")
        self._load([table.stable, version])
        return self._write(RoutingTable({table.stable: 100 - weight, version: weight}, table.stable, version))

    def set_weight(self, weight: int) -> RoutingTable:
        check_weight(weight)
        table = self._with_canary()
        return self._write(RoutingTable({table.stable: 100 - weight, table.canary: weight}, table.stable, table.canary))

    def promote(self) -> RoutingTable:
        table = self._with_canary()
        return self._finish(keep=table.canary, drop=table.stable)

    def rollback(self) -> RoutingTable:
        table = self._with_canary()
        return self._finish(keep=table.stable, drop=table.canary)

    # -- steps ---------------------------------------------------------------------------------------------------
    def _with_canary(self) -> RoutingTable:
        table = self.table()
        if table.canary is None:
            raise CanaryError(f"no canary running (stable version {table.stable}): start one first")
        return table

    def _finish(self, keep: int, drop: int) -> RoutingTable:
        """All traffic to `keep`, let requests already routed to `drop` start, then unload `drop`."""
        self._write(RoutingTable({keep: 100, drop: 0}, stable=keep, canary=drop))
        time.sleep(self.opts.drain_s)
        final = self._write(RoutingTable({keep: 100}, stable=keep))
        self._load([keep])
        return final

    def _write(self, table: RoutingTable) -> RoutingTable:
        table.write(routing_file(self.opts.model_repository))
        return table

    def _load(self, versions: list[int]) -> None:
        """(Re)load the model serving exactly `versions`; returns once they are all ready."""
        config = self._call(self.client.get_model_config, self.opts.model, headers=self.headers)
        config["version_policy"] = {"specific": {"versions": sorted(versions)}}
        self._call(self.client.load_model, self.opts.model, headers=self.headers, config=json.dumps(config))
        for version in versions:
            if not self._call(self.client.is_model_ready, self.opts.model, str(version), headers=self.headers):
                raise CanaryError(f"{self.opts.model} version {version} did not become ready; see the server log")
        persist_versions(self.opts.model_repository, versions, self.opts.model)

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except InferenceServerException as exc:
            raise CanaryError(f"server refused {fn.__name__}: {exc.message()}") from exc
        except OSError as exc:
            raise CanaryError(f"cannot reach Triton at {self.opts.url}: {exc}") from exc

"""The parameters a config.pbtxt file holds, as written (string values, ${...} placeholders kept): what Triton would
hand the model's initialize(), for the tests that read our rendered and template configs."""
from __future__ import annotations

import re
from pathlib import Path

_PARAMETER = re.compile(r'parameters \{ key: "(\w+)" value: \{ string_value: "([^"]*)" \} \}')


def pbtxt_parameters(config_pbtxt: Path) -> dict[str, str]:
    return dict(_PARAMETER.findall(Path(config_pbtxt).read_text()))


def as_model_config(config_pbtxt: Path) -> dict:
    """Its parameters in the JSON form Triton passes to initialize() (args["model_config"], parsed)."""
    return {"parameters": {k: {"string_value": v} for k, v in pbtxt_parameters(config_pbtxt).items()}}

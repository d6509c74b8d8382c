"""The engine on one GPU (issue 41): correctness under CUDA graphs, decode tokens/s against Hugging Face `generate`
and against the replay bound of a bare graph step, and GRPO steps' time and peak memory. Prints a JSON report.

    python benchmarks/gpu_check.py --tokenizer ~/.cache/agentgrad/models/Qwen2.5-Coder-0.5B-Instruct [--out DIR]
    python benchmarks/gpu_check.py --tokenizer ... --tiny --device cpu    # the whole script in seconds, on a CPU

Weights are random, in the real shapes of Qwen2.5-0.5B, 1.5B and 7B (`SHAPES`: their config.json numbers; speed
does not depend on the values), with a Qwen2.5 tokenizer from `--tokenizer` (`make qwen`'s folder: only those small
files travel to the GPU machine). One prepared run of about 5 minutes on an H200, in sections, each written to
`OUT/gpu_check.json` as it ends (a section that fails records its error and the next runs):

- correctness: fp32, Qwen2.5-0.5B shape: the decode from replayed CUDA graphs (`decode="static"`) against the
  dynamic cache's eager step (greedy tokens, logprobs), the logprobs against one forward pass, constrained rows
  under the graphs, and the written-out step's LoRA product against peft's forward (bf16);
- decode: per shape, tokens/s at 8 / 64 / 256 rows (`--rows`) of `--new-tokens` each on the same prompts, for the
  engine (from submit to the last token), `generate` of the same bf16 model (greedy, exactly that many tokens), and
  the bound: one captured decode step replayed alone (`rows / step time`);
- GRPO: one 8 × 8 step (`--tasks`, `--group`; `--response` tokens each) through `LocalPolicy` and `LocalUpdate` as
  a run uses them (rollouts on the engine, the update, the publish) of the 1.5B shape with full weights (fp32
  master weights under bf16 autocast, `engine/training.py`) and of the 7B shape with LoRA r16 over a bf16 base held
  once (`Engine(frozen_base=True)`), gradient checkpointing, micro-batches of 4; the GPU's peak memory from the
  section's start (what torch allocated, and reserved).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "qwen2.5-1.5b": {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "qwen2.5-7b": {
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
    },
}
"""The three shapes, from Qwen2.5-{0.5B,1.5B,7B}-Instruct's config.json (rope_theta 1e6, rms_norm_eps 1e-6 for all)."""
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
QUESTIONS = [
    "What is {a} + {b}?",
    "Write one sentence about the number {a}.",
    "List {b} colours.",
    "Explain in a few words why {a} is smaller than {b}.",
]

report: dict[str, Any] = {}
began = time.perf_counter()
decode_mode = {"mode": "auto"}
"""How the decode and GRPO sections' engines decode: "dynamic" if the correctness section could not run the graphs
(then the other figures still come back)."""


def save(out: Path) -> None:
    report["elapsed_s"] = round(time.perf_counter() - began, 1)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))


BUDGET_SECONDS = 420.0
"""A section that would start later than this is left out (the run must end within the GPU machine's 8 minutes)."""


def run_section(name: str, out: Path, fn: Callable[..., None], *args: Any, **kwargs: Any) -> None:
    """A part of the report, `fn(entry, *args)`; its error (if any) is recorded and the run goes on."""
    entry: dict[str, Any] = {}
    report[name] = entry
    started = time.perf_counter()
    if started - began > BUDGET_SECONDS:
        entry["skipped"] = f"not started: {started - began:.0f} s had passed (budget {BUDGET_SECONDS:.0f} s)"
    else:
        try:
            fn(entry, *args, **kwargs)
        except Exception as exc:  # the next sections still run
            entry["error"] = f"{type(exc).__name__}: {exc}"
            entry["traceback"] = traceback.format_exc()[-3000:]
            print(f"[{name}] failed: {entry['error']}", file=sys.stderr, flush=True)
    entry["seconds"] = round(time.perf_counter() - started, 1)
    free()
    save(out)
    shown = json.dumps({k: v for k, v in entry.items() if k != "traceback"}, default=str)
    print(f"[{name}] {entry['seconds']} s: {shown[:1500]}", flush=True)


def free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def make_folder(name: str, tokenizer: Path, root: Path, tiny: bool, device: str) -> Path:
    """A model folder of random bf16 weights in `name`'s shape with the tokenizer's files (made on the device: fast)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    folder = root / name
    if (folder / "config.json").exists():
        return folder
    base = json.loads((tokenizer / "config.json").read_text())
    shape = {**SHAPES[name], **(TINY if tiny else {})}
    config = Qwen2Config(**{**base, **shape, "layer_types": None, "max_position_embeddings": 32768})
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    del model
    for file in tokenizer.iterdir():
        if file.name.startswith("tokenizer") or file.name in ("chat_template.jinja", "generation_config.json"):
            shutil.copy(file, folder / file.name)
    free()
    return folder


def prompts(engine: Any, count: int) -> list[list[int]]:
    return [
        engine.chat_prompt_ids([{"role": "user", "content": QUESTIONS[i % 4].format(a=10 + i, b=3 + i % 7)}])
        for i in range(count)
    ]


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    sync()
    started = time.perf_counter()
    result = fn()
    sync()
    return time.perf_counter() - started, result


def correctness(entry: dict[str, Any], folder: Path, device: str) -> None:
    """fp32 on the device: graphs against the dynamic cache's eager step, and against one forward pass."""
    from agentgrad.engine import Engine, SamplingParams
    from agentgrad.engine.constraints import json_schema_grammar

    engines = {
        mode: Engine(folder, device=device, sampling_dtype="float32", decode=mode, prefix_cache_bytes=0)
        for mode in ("static", "dynamic")
    }
    try:
        ps = prompts(engines["static"], 12)
        runs: dict[str, Any] = {}
        for mode, engine in engines.items():
            greedy = engine.generate(ps, SamplingParams(max_tokens=32, temperature=0))
            sampled = engine.generate(ps[:6], SamplingParams(max_tokens=32, temperature=1.0, seed=7, n=2))
            runs[mode] = [c for g in greedy + sampled for c in g.completions]
            entry[f"{mode}_decode"] = engine.stats["decode"]
        entry["graph_steps"] = engines["static"].stats["graph_steps"]
        pairs = list(zip(runs["static"], runs["dynamic"]))
        entry["fp32_same_tokens"] = f"{sum(a.token_ids == b.token_ids for a, b in pairs)}/{len(pairs)}"
        entry["fp32_logprob_max_abs_diff_graph_vs_dynamic"] = max(
            abs(x - y) for a, b in pairs if a.token_ids == b.token_ids for x, y in zip(a.logprobs, b.logprobs)
        )
        engine = engines["static"]
        worst = 0.0
        for prompt, completion in zip(ps, runs["static"][:12]):
            with torch.no_grad():
                ids = torch.tensor([prompt + completion.token_ids], device=device)
                logprobs = torch.log_softmax(engine.model(ids).logits[0].float(), -1)
            reference = [logprobs[len(prompt) - 1 + i, t].item() for i, t in enumerate(completion.token_ids)]
            worst = max(worst, max(abs(a - b) for a, b in zip(reference, completion.logprobs)))
        entry["fp32_logprob_max_abs_diff_graph_vs_forward"] = worst
        schema = {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
        }
        grammar = json_schema_grammar(schema)
        constrained = {}
        for mode, engine in engines.items():
            futures = [
                engine.submit(
                    p, SamplingParams(max_tokens=48, temperature=1.0, seed=i, grammar=grammar if i % 2 else None)
                )
                for i, p in enumerate(ps[:8])
            ]
            constrained[mode] = [f.result(300).completions[0] for f in futures]
        entry["constrained_same_tokens"] = all(
            a.token_ids == b.token_ids for a, b in zip(constrained["static"], constrained["dynamic"])
        )
        entry["constrained_rows_forced_somewhere"] = all(
            1 in (c.allowed_tokens or []) for c in constrained["static"][1::2]
        )
    finally:
        for engine in engines.values():
            engine.close()


def lora_product(entry: dict[str, Any], folder: Path, device: str) -> None:
    """The written-out step's LoRA term against peft's forward, on the device in bf16."""
    from peft import LoraConfig, get_peft_model

    from agentgrad.engine.decode import LeanDecoder
    from agentgrad.engine.kv_cache import new_cache
    from agentgrad.engine.model import load_model

    model, _ = load_model(folder, dtype=torch.bfloat16, device=device)
    adapted = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear", init_lora_weights=False)).eval()
    decoder = LeanDecoder.build(adapted)
    entry["lora_decoder_built"] = decoder is not None
    ids = torch.randint(0, 1000, (4, 12), device=device)
    with torch.inference_mode():
        theirs, mine = new_cache(), new_cache()
        adapted(input_ids=ids, cache=theirs, use_cache=True)
        adapted(input_ids=ids, cache=mine, use_cache=True)
        tokens, positions = ids[:, -1], torch.full((4,), 12, device=device)
        mask = torch.ones(4, 13, dtype=torch.long, device=device)
        expected = (
            adapted(
                input_ids=tokens[:, None],
                attention_mask=mask,
                position_ids=positions[:, None],
                cache=theirs,
                use_cache=True,
            )
            .logits[:, -1]
            .float()
        )
        if decoder is not None:
            found = decoder(tokens, positions, mask, mine).float()
            entry["lora_logits_max_abs_diff_bf16"] = (found - expected).abs().max().item()
            entry["lora_logits_scale"] = expected.abs().max().item()
    del model, adapted
    from agentgrad.engine import Engine, SamplingParams

    engine = Engine(folder, device=device, prefix_cache_bytes=0)  # fp32 weights and a bf16 copy
    try:
        before = torch.cuda.memory_allocated() if device == "cuda" else 0
        engine.freeze_base()  # what LocalPolicy does to a given engine before LoRA: the weights once, in bf16
        free()
        entry["freeze_base_weights_dtype"] = str(next(engine.model.parameters()).dtype)
        if device == "cuda":
            entry["freeze_base_freed_gib"] = round((before - torch.cuda.memory_allocated()) / 2**30, 2)
        generated = engine.generate(prompts(engine, 4), SamplingParams(max_tokens=8, temperature=0))
        entry["freeze_base_then_decode"] = [
            engine.stats["decode"],
            [len(g.completions[0].token_ids) for g in generated],
        ]
    finally:
        engine.close()


def decode_speed(entry: dict[str, Any], folder: Path, device: str, rows: list[int], new_tokens: int) -> None:
    """Tokens/s of the engine, of `generate` and of a bare replayed step, at each row count, on the same prompts:
    an engine that serves only (`frozen_base`: its weights once, in bf16, which `generate` runs too)."""
    from agentgrad.engine import Engine, SamplingParams

    engine = Engine(
        folder,
        device=device,
        max_batch_size=max(rows),
        frozen_base=True,
        prefix_cache_bytes=0,
        decode=decode_mode["mode"],
    )
    try:
        params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
        engine.generate(prompts(engine, 2), SamplingParams(max_tokens=4))
        hf = engine.model
        pad = engine.tokenizer.pad_token_id
        for count in rows:
            ps = prompts(engine, count)
            engine.generate(ps, params)  # captures this row count's graphs
            steps = engine.stats["graph_steps"]
            seconds, _ = timed(lambda ps=ps: engine.generate(ps, params))
            cell = {
                "engine_tok_s": round(count * new_tokens / seconds, 1),
                "engine_s": round(seconds, 3),
                "graph_steps": engine.stats["graph_steps"] - steps,
                "decode": engine.stats["decode"],
            }
            width = max(len(p) for p in ps)
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in ps], device=device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ps], device=device)

            def generate(ids: torch.Tensor = ids, mask: torch.Tensor = mask) -> Any:
                return hf.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens,
                    do_sample=False,
                    pad_token_id=pad,
                )

            with torch.inference_mode():
                generate()
                seconds, out = timed(generate)
            assert out.shape[1] == width + new_tokens
            cell["hf_generate_tok_s"] = round(count * new_tokens / seconds, 1)
            cell["engine_vs_hf"] = round(cell["engine_tok_s"] / cell["hf_generate_tok_s"], 2)
            if device == "cuda":
                cell["bound_tok_s"] = bare_step_bound(hf, count, width + new_tokens, device)
                cell["engine_vs_bound"] = round(cell["engine_tok_s"] / cell["bound_tok_s"], 2)
            entry[f"rows_{count}"] = cell
            print(f"  {folder.name} x{count}: {cell}", flush=True)
    finally:
        engine.close()


def bare_step_bound(model: Any, rows: int, columns: int, device: str) -> float:
    """Tokens/s of the decode step alone, replayed from its captured graph (no sampling, no host work)."""
    from agentgrad.engine.decode import LeanDecoder
    from agentgrad.engine.slots import SlotBatch, StaticDecoding

    decoder = LeanDecoder.build(model)
    assert decoder is not None
    static = StaticDecoding(model, rows, columns + 64, torch.device(device), graphs=True)
    start = columns - 32  # every step in one column bucket
    batch = SlotBatch(
        [None] * rows,
        torch.full((rows,), start, device=device),
        torch.zeros(rows, dtype=torch.long, device=device),
        [start] * rows,
    )
    with torch.inference_mode():
        for _ in range(3):
            static.logits(decoder, batch)
        seconds, _ = timed(lambda: [static.logits(decoder, batch) for _ in range(20)])
    return round(rows * 20 / seconds, 1)


def grpo_step(
    entry: dict[str, Any], folder: Path, device: str, *, lora: int, tasks: int, group: int, response: int, steps: int
) -> None:
    """GRPO steps as a run makes them (`LocalPolicy`, `LocalUpdate`), without the agents and the gateway: each task's
    group sampled on the engine, random rewards, the update and the publish. Peak memory from here."""
    from agentgrad.adapters import Trajectory
    from agentgrad.algorithms.grpo_config import GRPOConfig
    from agentgrad.algorithms.grpo_update import LocalUpdate, group_advantages
    from agentgrad.engine import Engine, SamplingParams
    from agentgrad.policy.config import PolicyConfig
    from agentgrad.policy.local import LocalPolicy
    from agentgrad.store import MemoryStore

    free()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    engine = Engine(
        folder, device=device, max_batch_size=tasks * group, frozen_base=lora > 0, decode=decode_mode["mode"]
    )
    entry["weights_dtype"] = str(next(engine.model.parameters()).dtype)
    cfg = GRPOConfig(
        micro_batch_size=4 if lora else 8,
        gradient_checkpointing=bool(lora),
        max_tokens=response,
        policy=PolicyConfig(lora_rank=lora),
    )
    policy = LocalPolicy(MemoryStore(), engine, lora_rank=lora)
    update = LocalUpdate(policy, cfg)
    rng = random.Random(0)
    try:
        ps = prompts(engine, tasks)
        for step in range(steps):
            params = SamplingParams(max_tokens=response, temperature=1.0, n=group, ignore_eos=True)
            rollout_s, generations = timed(
                lambda params=params: [f.result() for f in [engine.submit(p, params) for p in ps]]
            )
            trajectories, rewards, groups = [], [], []
            for task, (prompt, generation) in enumerate(zip(ps, generations)):
                for completion in generation.completions:
                    trajectories.append(
                        Trajectory(
                            token_ids=prompt + completion.token_ids,
                            loss_mask=[0] * len(prompt) + [1] * len(completion.token_ids),
                            logprobs=[0.0] * len(prompt) + completion.logprobs,
                            prompt_length=len(prompt),
                        )
                    )
                    rewards.append(float(rng.random() < 0.5))
                    groups.append(task)
            advantages = group_advantages(rewards, groups)
            batch = list(zip(trajectories, advantages))
            update_s, stats = timed(lambda batch=batch: update.step(batch))
            entry[f"step_{step + 1}"] = {
                "rollout_s": round(rollout_s, 2),
                "update_s": round(update_s, 2),
                "step_s": round(rollout_s + update_s, 2),
                "rollout_tok_s": round(sum(len(t.token_ids) - t.prompt_length for t in trajectories) / rollout_s, 1),
                "logprob_diff": round(stats.get("logprob_diff", float("nan")), 4),
                "decode": engine.stats["decode"],
            }
            print(f"  {folder.name} GRPO step {step + 1}: {entry[f'step_{step + 1}']}", flush=True)
        if device == "cuda":
            entry["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
            entry["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 2)
        entry["engine_peak_memory_gib"] = round(engine.peak_memory_bytes() / 2**30, 2)
    finally:
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, required=True, help="a Qwen2.5 model folder (tokenizer, config)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu_check"), help="where the random weights go")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="2-layer shapes, few rows and tokens: the script on a CPU")
    parser.add_argument("--rows", default="8,64,256")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--response", type=int, default=256)
    parser.add_argument("--steps", type=int, default=2, help="GRPO steps per shape (the first warms up)")
    parser.add_argument("--only", default="correctness,lora,decode,grpo")
    args = parser.parse_args()
    if args.tiny:
        args.rows, args.new_tokens, args.tasks, args.group, args.response = "2,4", 8, 2, 2, 16
    args.out.mkdir(parents=True, exist_ok=True)
    import transformers

    report.update(
        {
            "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "transformers": transformers.__version__,
            "tiny": args.tiny,
            "settings": {k: str(v) for k, v in vars(args).items()},
        }
    )
    save(args.out)
    rows = [int(r) for r in args.rows.split(",")]
    only = set(args.only.split(","))
    folders = {name: make_folder(name, args.tokenizer, args.work, args.tiny, args.device) for name in SHAPES}
    if "correctness" in only:
        run_section("correctness_fp32_0.5b", args.out, correctness, folders["qwen2.5-0.5b"], args.device)
        if "error" in report["correctness_fp32_0.5b"]:
            decode_mode["mode"] = report["fallback_decode"] = "dynamic"
    if "lora" in only:
        run_section("lora_product_bf16_0.5b", args.out, lora_product, folders["qwen2.5-0.5b"], args.device)
    if "decode" in only:
        for name in ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"):
            run_section(f"decode_{name}", args.out, decode_speed, folders[name], args.device, rows, args.new_tokens)
    if "grpo" in only:
        for name, lora in (("qwen2.5-1.5b", 0), ("qwen2.5-7b", 16)):
            run_section(
                f"grpo_{name}_{'lora16' if lora else 'full'}",
                args.out,
                grpo_step,
                folders[name],
                args.device,
                lora=lora,
                tasks=args.tasks,
                group=args.group,
                response=args.response,
                steps=args.steps,
            )
    save(args.out)
    print(json.dumps({k: v for k, v in report.items()}, indent=1, default=str)[-6000:])


if __name__ == "__main__":
    main()

"""The engine and a GRPO update on a GPU: correctness first, then tokens/s. Prints a JSON report.

    AGENTGRAD_SHAPE=~/.cache/agentgrad/models/SmolLM2-135M-Instruct python benchmarks/gpu_check.py

Weights are random, in the shape of the model whose config and tokenizer are in $AGENTGRAD_SHAPE
(so only those small files need to reach a GPU machine); speed does not depend on the values.
DEVICE=cpu runs it here; BATCHES and LENGTHS choose the throughput grid."""
import json, os, sys, time, statistics
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

out = os.environ.get("OUT", "/tmp")
DEVICE = os.environ.get("DEVICE", "cuda")
SYNC = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
report = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu"}
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
src = os.path.expanduser(os.environ.get("AGENTGRAD_SHAPE", "~/.cache/agentgrad/models/SmolLM2-135M-Instruct"))
config = AutoConfig.from_pretrained(src)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(config)
model.save_pretrained("/tmp/smol"); AutoTokenizer.from_pretrained(src).save_pretrained("/tmp/smol")
for f in ("chat_template.jinja",):
    import shutil; shutil.copy(f"{src}/{f}", f"/tmp/smol/{f}")

from agentgrad.engine import Engine, SamplingParams
from agentgrad.engine.training import ScoredSequence, sequence_logprobs
from agentgrad.adapters import Trajectory
from agentgrad.algorithms.grpo import GRPOConfig
from agentgrad.algorithms.grpo_update import grpo_update

# ---- correctness in fp32 on the GPU
e = Engine("/tmp/smol", device=DEVICE, sampling_dtype="float32", name="smol")
prompts = [e.chat_prompt_ids([{"role": "user", "content": f"What is {a} + {b}?"}]) for a, b in [(1, 2), (33, 44), (5, 6), (33, 44)]]
gens = e.generate(prompts, SamplingParams(max_tokens=24, temperature=1.0, seed=3))
worst = 0.0
for p, g in zip(prompts, gens):
    c = g.completions[0]
    with torch.no_grad():
        lp = torch.log_softmax(e.model(torch.tensor([p + c.token_ids], device=DEVICE)).logits[0].float(), -1)
    ref = [lp[len(p) - 1 + i, t].item() for i, t in enumerate(c.token_ids)]
    worst = max(worst, max(abs(a - b) for a, b in zip(ref, c.logprobs)))
report["fp32_logprob_max_abs_diff"] = worst
greedy = SamplingParams(max_tokens=24, temperature=0)
alone = [e.generate([p], greedy)[0].completions[0].token_ids for p in prompts]
together = [g.completions[0].token_ids for g in e.generate(prompts, greedy)]
report["fp32_greedy_batched_equals_alone"] = alone == together
# training step on the GPU, fp32 master weights
seqs = [Trajectory(token_ids=prompts[i % 4] + gens[i % 4].completions[0].token_ids, loss_mask=[0] * len(prompts[i % 4]) + [1] * len(gens[i % 4].completions[0].token_ids),
                   logprobs=[0.0] * len(prompts[i % 4]) + gens[i % 4].completions[0].logprobs, prompt_length=len(prompts[i % 4])) for i in range(64)]
batch = [(t, 1.0 if i % 2 else -1.0) for i, t in enumerate(seqs)]
opt = torch.optim.AdamW([p for p in e.model.parameters() if p.requires_grad], lr=1e-5)
with e.training() as m:
    times = []
    for _ in range(3):
        SYNC(); t = time.perf_counter()
        stats = grpo_update(m, opt, batch, GRPOConfig(micro_batch_size=64), e.tokenizer.pad_token_id)
        SYNC(); times.append(time.perf_counter() - t)
e.publish()
report["grpo_update_64_seqs_seconds"] = [round(x, 3) for x in times]
report["grpo_update_stats"] = stats
e.close()

# ---- throughput in the default (bf16) sampling dtype
e = Engine("/tmp/smol", device=DEVICE, name="smol", max_batch_size=256)
report["default_sampling_dtype"] = str(e.sampling_dtype)
e.generate(prompts, SamplingParams(max_tokens=8))
rows = {}
for batch_size in [int(b) for b in os.environ.get('BATCHES', '1,8,32,64,128,256').split(',')]:
    ps = [e.chat_prompt_ids([{"role": "user", "content": f"List {i} colours."}]) for i in range(batch_size)]
    for n in [int(n) for n in os.environ.get('LENGTHS', '32,128').split(',')]:
        SYNC(); t = time.perf_counter()
        gs = e.generate(ps, SamplingParams(max_tokens=n, temperature=1.0, ignore_eos=True))
        SYNC(); dt = time.perf_counter() - t
        rows[f"batch {batch_size}, {n} tokens"] = round(sum(len(c.token_ids) for g in gs for c in g.completions) / dt, 1)
report["tokens_per_s"] = rows
import threading
first = []
for i in range(5):
    ev = threading.Event(); t = time.perf_counter()
    f = e.submit(prompts[i % 4], SamplingParams(max_tokens=4, temperature=0), on_token=lambda *a: ev.set())
    ev.wait(30); first.append(time.perf_counter() - t); f.result(30)
report["ttft_ms_median"] = round(1000 * statistics.median(first), 1)
e.close()
print(json.dumps(report, indent=1))
open(f"{out}/gpu_report.json", "w").write(json.dumps(report, indent=1))

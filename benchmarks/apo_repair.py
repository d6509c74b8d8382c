"""How often the editor's rewrites can replace the prompt, before and after it is told why one cannot.

    .venv/bin/python benchmarks/apo_repair.py STORE.db [STORE.db ...] [--model qwen2.5-coder-0.5b] [--repeats 1]

Reads every rewrite an APO run stored (its parent prompt, critique and edit style: snapshots with `edit_style`),
and asks the editor again for each, through `apo_critic.Critic.edit` with `joint_vs_alone.py`'s settings (the policy
as its own editor, lenient replies, one try), `--model` served by the engine behind a gateway. Printed: the
rewrites `check_rewrite` accepts at the first reply, those it refused that the editor repaired once told why
(`repair_tries=1`), and the reasons of the refusals left, beside what the stored run had (no repair then).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from joint_vs_alone import APO_SETTINGS, served

import agentgrad as ag
from agentgrad.algorithms.apo_config import APOConfig
from agentgrad.algorithms.apo_critic import Critic
from agentgrad.algorithms.apo_text import check_rewrite


async def stored_edits(path: Path) -> tuple[list[tuple[ag.PromptTemplate, str, str]], Counter[str]]:
    """Each stored rewrite's (parent prompt, critique, edit style), and the stored outcomes: scored, or the
    refusal's reason (its first words)."""
    store = ag.SqliteStore(path)
    snapshots = {s.resources_id: s for s in await store.query_resources()}
    edits, outcomes = [], Counter()
    for snapshot in snapshots.values():
        meta = snapshot.metadata
        if "edit_style" not in meta:
            continue
        parent = next(r for r in snapshots[meta["parent"]].resources.values() if isinstance(r, ag.PromptTemplate))
        edits.append((parent, meta["critique"], meta["edit_style"]))
        outcomes[reason_kind(meta.get("reason")) if meta["status"] == "rejected" else "accepted"] += 1
    await store.close()
    return edits, outcomes


def reason_kind(reason: str | None) -> str:
    """A refusal's reason without its particulars ("drops placeholder(s) schema, which ..." -> "drops placeholder")."""
    if reason is None:
        return "accepted"
    for kind in ("drops placeholder", "adds placeholder", "does not parse", "does not render", "same template"):
        if reason.startswith(kind):
            return kind
    return reason.split(":")[0]


async def ask_again(critic: Critic, edits: list[tuple[ag.PromptTemplate, str, str]]) -> Counter[str]:
    """Every edit asked of `critic` at once; the outcomes: accepted at once, repaired, or the reason left."""
    replies = await asyncio.gather(*(critic.edit(p, c, s) for p, c, s in edits))
    outcomes: Counter[str] = Counter()
    for (parent, _, _), reply in zip(edits, replies):
        if reply.text is None:
            outcomes["no usable reply"] += 1
            continue
        reason = check_rewrite(parent, parent.model_copy(update={"template": reply.text}))
        outcomes["repaired" if reason is None and reply.tally.repaired else reason_kind(reason)] += 1
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stores", nargs="+", type=Path)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--max-tokens", type=int, default=384, help="per editor reply (joint_vs_alone's SQL setting)")
    parser.add_argument("--repeats", type=int, default=1, help="times each stored edit is asked again")
    args = parser.parse_args()
    from agentgrad.engine import Engine

    edits, stored = [], Counter()
    for path in args.stores:
        found, outcomes = asyncio.run(stored_edits(path))
        edits += found
        stored += outcomes
    print(f"{len(edits)} stored rewrites in {len(args.stores)} stores; as stored (no repair): {dict(stored)}")
    engine = Engine(args.model, sampling_dtype="float32", name=args.model)
    store = ag.MemoryStore()
    results = {}
    with served(engine, store) as policy:
        llm = policy.llm()
        for repair_tries in (0, 1):
            config = APOConfig(**{**APO_SETTINGS, "max_tokens": args.max_tokens, "repair_tries": repair_tries,
                                  "base_url": llm.base_url, "api_key": llm.api_key, "critic_model": args.model})  # fmt: skip

            async def run(config: APOConfig = config) -> Counter[str]:
                critic = Critic.of(config, {})
                try:
                    total: Counter[str] = Counter()
                    for _ in range(args.repeats):
                        total += await ask_again(critic, edits)
                    return total
                finally:
                    await critic.close()

            results[repair_tries] = asyncio.run(run())
            print(f"repair_tries={repair_tries}: {dict(results[repair_tries])}", flush=True)
    engine.close()
    print("\n| editor | rewrites | accepted at the first reply | repaired when told why | refused |")
    print("|---|---|---|---|---|")
    for label, counts in (("as stored", stored), *((f"repair_tries={k}", v) for k, v in results.items())):
        refused = {k: v for k, v in counts.items() if k not in ("accepted", "repaired")}
        print(f"| {label} | {sum(counts.values())} | {counts['accepted']} | {counts['repaired']} | "
              f"{sum(refused.values())} ({', '.join(f'{k} {v}' for k, v in sorted(refused.items())) or '-'}) |")  # fmt: skip


if __name__ == "__main__":
    main()

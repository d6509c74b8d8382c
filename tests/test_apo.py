"""APO against a deterministic OpenAI-compatible server over real HTTP, with the real `openai` client.

The server (`fake_openai.py`) plays the ticket router's model, the critic and the editor, so that
the seed prompt scores 0, a prompt asking for one word about 0.8, and one that also says where
parcel refunds go 1.0.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agentgrad as ag
from agentgrad.algorithms.apo_critic import APOError
from agentgrad.algorithms.apo_text import between_markers, check_rewrite
from agentgrad.cli import main as cli
from agentgrad.serving import ServerThread
from agentgrad.store import SqliteStore
from agentgrad.types import ResourcesSnapshot
from tests.fake_openai import FORMAT_RULE, REFUND_RULE, USELESS_RULE, FakeLLM, app, is_parcel_refund

EXAMPLE_FILE = Path(__file__).resolve().parents[1] / "examples" / "ticket_routing.py"


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("ticket_routing_example", EXAMPLE_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


example = load_example()
ONE_WORD_SCORE = 1 - sum(is_parcel_refund(t["ticket"], t["team"]) for t in example.val_data) / len(example.val_data)


@pytest.fixture(scope="module")
def served() -> Iterator[FakeLLM]:
    fake = FakeLLM(answers={t["ticket"]: t["team"] for t in example.train_data + example.val_data})
    with ServerThread(app(fake)) as server:
        fake.base_url = server.url + "/v1"
        yield fake


@pytest.fixture
def fake(served: FakeLLM) -> FakeLLM:
    """The fake server, with no request recorded and no malformed reply pending."""
    with served.lock:
        served.requests.clear()
        served.malformed.clear()
        served.repairs = False
    return served


def apo(**options: Any) -> ag.APO:
    settings: dict[str, Any] = {"rounds": 2, "train_batch_size": 12, "critic_model": "critic-model",
                                "editor_model": "editor-model", **options}
    return ag.APO(**settings)


def fit(
    fake: FakeLLM,
    algorithm: ag.Algorithm,
    store: ag.Store,
    prompt: ag.PromptTemplate | None = None,
    val_data: list[dict[str, Any]] | None = None,
) -> Any:
    llm = ag.LLM(base_url=fake.base_url, model="agent-model", sampling_parameters={"temperature": 0.0})
    resources = {"prompt": prompt or example.seed_prompt, "llm": llm}
    return ag.Trainer(algorithm, n_runners=4, store=store, resources=resources).fit(
        example.agent, example.train_data, val_data or example.val_data
    )


def history(store: ag.Store) -> list[ResourcesSnapshot]:
    return asyncio.run(store.query_resources())


def metric(store: ag.Store, name: str) -> list[float]:
    return [m.value for m in asyncio.run(store.query_metrics(name=name))]


def test_apo_beats_the_seed_prompt_and_leaves_the_search_history_in_sqlite(tmp_path: Path, fake: FakeLLM) -> None:
    store = SqliteStore(tmp_path / "apo.db")
    result = fit(fake, apo(), store)

    assert result.seed_score == 0.0
    assert result.round_best == [0.0, pytest.approx(ONE_WORD_SCORE), 1.0] and 0 < ONE_WORD_SCORE < 1
    assert result.score == 1.0
    assert result.prompt.template == f"{example.seed_prompt.template}\n{FORMAT_RULE}\n{REFUND_RULE}"

    # the critic read real failures: the tasks with their expected team and what the agent answered
    first_critique_request = fake.of("critic-model")[0]
    assert '"team": "shipping"' in first_critique_request and "team should handle this ticket" in first_critique_request
    assert example.seed_prompt.template in first_critique_request

    # every prompt tried is a snapshot, with its parent, round, critique, score or rejection
    snapshots = history(SqliteStore(tmp_path / "apo.db"))  # read back from the file, as a later process would
    by_id = {s.resources_id: s for s in snapshots}
    seed, *candidates, final = snapshots
    assert seed.metadata | {"algorithm": "apo"} == seed.metadata
    assert (seed.metadata["status"], seed.metadata["round"], seed.metadata["score"]) == ("seed", 0, 0.0)
    assert [c.metadata["round"] for c in candidates] == [1] * 3 + [2] * 6  # beam 1 then 2, three rewrites each
    for candidate in candidates:
        meta = candidate.metadata
        parent = by_id[meta["parent"]]
        assert parent.metadata["round"] < meta["round"] and parent.metadata["status"] in ("seed", "scored")
        assert meta["critique"] and meta["edit_style"]
        assert candidate.resources["llm"] == seed.resources["llm"]  # the agent's other resources come along
        assert isinstance(candidate.resources["prompt"], ag.PromptTemplate)
        if meta["status"] == "scored":
            assert 0.0 <= meta["score"] <= 1.0 and meta["reason"] is None
        else:
            assert meta["status"] == "rejected" and "score" not in meta
    reasons = sorted(c.metadata["reason"] for c in candidates if c.metadata["status"] == "rejected")
    round_1 = [c for c in candidates if c.metadata["round"] == 1 and c.metadata["status"] == "scored"]
    one_word, useless = sorted(round_1, key=lambda c: -c.metadata["score"])
    assert (one_word.metadata["score"], useless.metadata["score"]) == (pytest.approx(ONE_WORD_SCORE), 0.0)
    assert reasons == [
        "drops placeholder(s) ticket, which the agent fills",
        "drops placeholder(s) ticket, which the agent fills",
        "drops placeholder(s) ticket, which the agent fills",
        f"same template as {one_word.resources_id}",  # the seed, criticized again, was rewritten the same way
        f"same template as {useless.resources_id}",
    ]

    # the winner's lineage: seed -> one word -> refund rule; it is also the latest snapshot
    assert final.metadata["status"] == "best" and final.resources_id == result.resources_id
    assert final.resources["prompt"] == result.prompt
    winner = by_id[final.metadata["source"]]
    assert winner.metadata["score"] == 1.0 and "lost or damaged parcels" in winner.metadata["critique"]
    assert winner.metadata["parent"] == one_word.resources_id and one_word.metadata["parent"] == seed.resources_id
    assert asyncio.run(store.get_latest_resources()) == final

    assert metric(store, "apo/best_score") == [0.0, pytest.approx(ONE_WORD_SCORE), 1.0]
    assert metric(store, "apo/round_best") == [0.0, pytest.approx(ONE_WORD_SCORE), 1.0]
    assert metric(store, "apo/candidates") == [3, 6] and metric(store, "apo/rejected") == [1, 4]
    assert metric(store, "apo/scored") == [2, 2] and metric(store, "apo/skipped") == [0, 0]

    # the rollouts ran with the candidates' snapshots: 24 validation tasks per scored prompt
    val = asyncio.run(store.query_rollouts(mode="val"))
    assert len(val) == 24 * 5
    scored = {c.resources_id for c in candidates if c.metadata["status"] == "scored"}
    assert {r.resources_id for r in val} == {seed.resources_id} | scored


def test_the_best_prompt_replaces_the_seed_only_when_it_wins_past_chance_as_the_best_of_those_scored(
    fake: FakeLLM,
) -> None:
    seed = ag.PromptTemplate(template=f"{example.seed_prompt.template}\n{FORMAT_RULE}")  # wrong on parcel refunds only
    refunds = [t for t in example.val_data if is_parcel_refund(t["ticket"], t["team"])]
    others = [t for t in example.val_data if not is_parcel_refund(t["ticket"], t["team"])]
    for val, kept in (([refunds[0], *others[:7]], False), ([*refunds, *others[:3]], True)):
        store = ag.MemoryStore()
        result = fit(fake, apo(rounds=1), store, prompt=seed, val_data=val)
        assert result.round_best[1] == 1.0  # the refund rule fixed every task the seed got wrong ...
        seed_snapshot, *candidates, final = history(store)
        assert len([c for c in candidates if c.metadata["status"] == "scored"]) == 2
        if kept:  # ... 5 of 8: 3.4 standard errors, past the 1.96 of the best of two scored
            assert result.prompt.template == f"{seed.template}\n{REFUND_RULE}" and result.score == 1.0
            assert final.metadata["source"] != seed_snapshot.resources_id
        else:  # ... 1 of 8: 1.0 standard error, which the best of two reaches by chance: the seed stays
            assert result.prompt == seed and result.score == result.seed_score == 7 / 8
            assert final.metadata["source"] == seed_snapshot.resources_id and final.resources["prompt"] == seed


def test_a_jinja_prompt_is_optimized_the_same_way(fake: FakeLLM) -> None:
    seed = ag.PromptTemplate(engine="jinja", template="Which team should handle this ticket?\n{{ ticket }}")
    store = ag.MemoryStore()
    result = fit(fake, apo(val_batch_size=12), store, prompt=seed)
    assert result.score == 1.0 and result.prompt.engine == "jinja"
    assert result.prompt.template == f"{seed.template}\n{FORMAT_RULE}\n{REFUND_RULE}"
    rejected = [s for s in history(store) if s.metadata.get("status") == "rejected"]
    assert rejected and all(s.resources["prompt"].engine == "jinja" for s in rejected)
    assert "drops placeholder(s) ticket, which the agent fills" in {s.metadata["reason"] for s in rejected}
    assert "Jinja syntax" in fake.of("editor-model")[0]
    assert len(asyncio.run(store.query_rollouts(mode="val"))) == 12 * 5  # the validation sample, for every prompt


def test_malformed_critic_replies_are_retried(fake: FakeLLM, caplog: pytest.LogCaptureFixture) -> None:
    fake.malformed["critic-model"] = 2  # no markers, then an empty reply; the third try is fine
    store = ag.MemoryStore()
    result = fit(fake, apo(rounds=1), store)
    assert result.score == pytest.approx(ONE_WORD_SCORE)
    assert len(fake.of("critic-model")) == 3
    assert metric(store, "apo/unusable_replies") == [2] and metric(store, "apo/skipped") == [0]
    warnings = [r.getMessage() for r in caplog.records if r.name == "agentgrad.algorithms.apo_critic"]
    assert len(warnings) == 2
    assert "(try 1 of 3): the reply has no <critique> ... </critique> block: 'I think the prompt" in warnings[0]
    assert "(try 2 of 3): the reply is empty" in warnings[1]


def test_a_critic_that_never_answers_well_is_skipped_and_the_seed_kept(
    fake: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    fake.malformed["critic-model"] = 100
    store = ag.MemoryStore()
    result = fit(fake, apo(rounds=1, max_tries=3), store)
    assert len(fake.of("critic-model")) == 3 and fake.of("editor-model") == []
    assert "(try 3 of 3): the reply was cut off at the token limit before </critique>" in caplog.text
    assert result.prompt == example.seed_prompt and result.score == 0.0 and result.round_best == [0.0, None]
    assert metric(store, "apo/unusable_replies") == [3] and metric(store, "apo/skipped") == [1]
    assert [s.metadata["status"] for s in history(store)] == ["seed", "best"]


def test_malformed_editor_replies_are_retried_then_skipped_without_a_snapshot(fake: FakeLLM) -> None:
    fake.malformed["editor-model"] = 7  # 3 rewrites x 2 tries = 6 malformed: every rewrite given up; then one more
    store = ag.MemoryStore()
    result = fit(fake, apo(rounds=1, max_tries=2), store)
    assert len(fake.of("editor-model")) == 6
    assert result.prompt == example.seed_prompt and result.round_best == [0.0, None]
    assert metric(store, "apo/unusable_replies") == [6] and metric(store, "apo/skipped") == [3]
    assert metric(store, "apo/candidates") == [0]
    assert [s.metadata["status"] for s in history(store)] == ["seed", "best"]


def test_a_rewrite_the_checks_refuse_goes_back_to_the_editor_with_the_reason_and_its_repair_is_scored(
    fake: FakeLLM,
) -> None:
    fake.repairs = True  # the whole rewrite drops {ticket}; told so, the editor puts it back
    store = ag.MemoryStore()
    fit(fake, apo(rounds=1), store)
    told = [m for m in fake.of("editor-model") if m.startswith("That template cannot be used")]
    assert told == [
        "That template cannot be used (drops placeholder(s) ticket, which the agent fills). Write the complete new "
        "template again, along the critique, keeping every placeholder of the original exactly as it is written there "
        "(its placeholders: ticket) and adding none. Reply with it between <new_prompt> and </new_prompt>."
    ]
    candidates = [s for s in history(store) if "edit_style" in s.metadata]  # the round's rewrites
    assert [c.metadata["status"] for c in candidates] == ["scored"] * 3  # none rejected: the third was repaired
    repaired = candidates[2].resources["prompt"].template
    assert repaired.startswith("You route support tickets") and repaired.endswith("\nTicket: {ticket}")
    assert metric(store, "apo/repaired") == [1] and metric(store, "apo/rejected") == [0]

    # an editor that writes the same again: asked once (repair_tries=1), then the rewrite is rejected with the reason
    fake.repairs = False
    store = ag.MemoryStore()
    fit(fake, apo(rounds=1), store)
    rejected = [s for s in history(store) if s.metadata.get("status") == "rejected"]
    assert [s.metadata["reason"] for s in rejected] == ["drops placeholder(s) ticket, which the agent fills"]
    assert metric(store, "apo/repaired") == [0]
    with pytest.raises(ValueError, match="repair_tries must be an integer of at least 0, got -1"):
        ag.APO(repair_tries=-1)


def test_an_unknown_critic_model_stops_with_an_error_naming_it(fake: FakeLLM) -> None:
    with pytest.raises(APOError, match="cannot call model 'no-such-model'.*does not exist"):
        fit(fake, apo(rounds=1, critic_model="no-such-model"), ag.MemoryStore())
    assert fake.of("no-such-model") == []  # refused at once, not retried


def test_an_agent_that_fails_every_task_stops_apo_after_the_seed(fake: FakeLLM) -> None:
    broken = ag.LLM(base_url=fake.base_url, model="no-such-agent-model")
    trainer = ag.Trainer(apo(), n_runners=2, store="memory", resources={"prompt": example.seed_prompt, "llm": broken})
    with pytest.raises(APOError, match="every validation rollout of the seed prompt failed, the first with: NotFound"):
        trainer.fit(example.agent, example.train_data, example.val_data[:4])
    assert fake.of("critic-model") == []


def test_apo_says_what_is_missing_from_its_setup(fake: FakeLLM) -> None:
    with pytest.raises(ValueError, match="beam_width must be an integer of at least 1, got 0"):
        ag.APO(beam_width=0)
    with pytest.raises(ValueError, match="store has none: pass Trainer\\(resources="):
        ag.Trainer(apo(), store="memory").fit(example.agent, example.train_data, example.val_data)
    llm = ag.LLM(base_url=fake.base_url, model="agent-model")
    with pytest.raises(ValueError, match="resources hold 0 \\(\\[\\]\\): publish the agent's prompt as a Prompt"):
        ag.Trainer(apo(), store="memory", resources={"llm": llm}).fit(
            example.agent, example.train_data, example.val_data
        )
    two = {"a": example.seed_prompt, "b": example.seed_prompt, "llm": llm}
    with pytest.raises(ValueError, match="name one with APO\\(prompt_name=...\\)"):
        ag.Trainer(apo(), store="memory", resources=two).fit(example.agent, example.train_data, example.val_data)
    with pytest.raises(ValueError, match="needs validation tasks"):
        ag.Trainer(apo(), store="memory", resources={"prompt": example.seed_prompt, "llm": llm}).fit(
            example.agent, example.train_data, None
        )


def test_the_agent_written_for_apo_runs_unchanged_under_baseline(fake: FakeLLM) -> None:
    llm = ag.LLM(base_url=fake.base_url, model="agent-model")
    tuned = f"{example.seed_prompt.template}\n{FORMAT_RULE}\n{REFUND_RULE}"
    prompts = {
        "seed": example.seed_prompt,
        "tuned": ag.PromptTemplate(template=tuned),
        "tuned jinja": ag.PromptTemplate(engine="jinja", template=tuned.replace("{ticket}", "{{ ticket }}")),
    }
    scores = {
        name: ag.Trainer(store="memory", n_runners=2, resources={"prompt": prompt, "llm": llm}).fit(
            example.agent, example.val_data
        )["train"].reward_mean
        for name, prompt in prompts.items()
    }
    assert scores == {"seed": 0.0, "tuned": 1.0, "tuned jinja": 1.0}


# ----------------------------------------------------------------------------- checking a rewrite


def test_a_rewrite_must_keep_exactly_the_placeholders_and_render() -> None:
    original = ag.PromptTemplate(template="Route {ticket} for {customer.name}")

    def why(template: str, engine: str = "f-string") -> str | None:
        return check_rewrite(original, ag.PromptTemplate(template=template, engine=engine))  # type: ignore[arg-type]

    assert why("Route this: {ticket}. Customer: {customer.name}. One word.") is None
    assert why("Route {ticket} for {customer[name]}") is None  # same placeholder, indexed
    assert why("Route {ticket}") == "drops placeholder(s) customer, which the agent fills"
    assert why('Route {ticket} for {customer.name} as {"team": ...}') == (
        'adds placeholder(s) "team", which the agent does not fill (literal braces are written {{ and }})'
    )
    assert why('Route {ticket} for {customer.name} as {{"team": ...}}') is None
    assert why("Route {ticket for {customer.name}").startswith("does not parse as a f-string template: ValueError")
    assert why("Route {ticket} for {customer.name} {}").startswith("does not render: IndexError")
    assert why("Route {ticket} for {customer.name}\n") == "unchanged"

    jinja = ag.PromptTemplate(engine="jinja", template="Route {{ ticket }} for {{ customer.name }}")
    reordered = jinja.model_copy(update={"template": "{{ ticket }}, {{ customer.name }}: team?"})
    assert check_rewrite(jinja, reordered) is None
    assert check_rewrite(jinja, jinja.model_copy(update={"template": "Route {{ ticket }}"})) == (
        "drops placeholder(s) customer, which the agent fills"
    )
    broken = check_rewrite(jinja, jinja.model_copy(update={"template": "Route {{ ticket }} {% if %}"}))
    assert broken is not None and broken.startswith("does not parse as a jinja template: TemplateSyntaxError")


def test_replies_are_read_between_their_markers_or_refused_with_the_reason() -> None:
    assert between_markers("Sure.\n<new_prompt>\nLine 1\nLine 2\n</new_prompt>\n", "new_prompt") == "Line 1\nLine 2"
    # a marker mentioned before the real block does not confuse it
    mentioned = "I put it in <new_prompt> tags:\n<new_prompt>\nP {x}\n</new_prompt>"
    assert between_markers(mentioned, "new_prompt") == "P {x}"
    for reply, reason in [
        (None, "the reply is empty"),
        ("  ", "the reply is empty"),
        ("Here is a better prompt: do X.", "the reply has no <new_prompt> ... </new_prompt> block"),
        ("<new_prompt>\nunfinished", "the reply has no <new_prompt> ... </new_prompt> block"),
        ("<new_prompt>\n \n</new_prompt>", "the reply's <new_prompt> block is empty"),
    ]:
        with pytest.raises(ValueError, match=reason.replace("(", "\\(")):
            between_markers(reply, "new_prompt")


# ----------------------------------------------------------------------------- the CLI


def agentgrad_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentgrad.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200", **env}, timeout=120)


@pytest.mark.slow
def test_cli_apo_optimizes_the_example_against_an_openai_compatible_endpoint(tmp_path: Path, fake: FakeLLM) -> None:
    path = tmp_path / "apo.db"
    done = agentgrad_cli(
        "apo", "--base-url", fake.base_url, "--model", "agent-model", "--critic-model", "critic-model",
        "--editor-model", "editor-model", "--rounds", "2", "--beam-width", "2", "--branch-factor", "3",
        "--train-batch-size", "12", "--store", str(path), env={"OPENAI_API_KEY": "sk-test"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "APO: validation score by round" in out
    assert "│ 0 (seed) │          0.000 │       0.000 │" in out
    assert f"│        1 │          {ONE_WORD_SCORE:.3f} │       {ONE_WORD_SCORE:.3f} │" in out
    assert "│        2 │          1.000 │       1.000 │" in out
    assert "best prompt (printed above): score 1.000 (seed 0.000)" in out and f"store: {path}" in out
    best = out.split("APO best prompt: ", 1)[1].split("APO: validation score by round")[0]
    assert best.startswith("res-")
    assert best.split("\n", 1)[1].strip() == f"{example.seed_prompt.template}\n{FORMAT_RULE}\n{REFUND_RULE}"
    snapshots = history(SqliteStore(path))
    assert snapshots[-1].metadata["status"] == "best" and snapshots[-1].metadata["score"] == 1.0
    assert snapshots[0].resources["llm"].model == "agent-model"
    assert {"critic-model", "editor-model", "agent-model"} <= {r["model"] for r in fake.requests}
    assert USELESS_RULE not in snapshots[-1].resources["prompt"].template
    # the key stayed in the CLI's process: its gateway called the endpoint, and recorded the calls
    written = b"".join(p.read_bytes() for p in tmp_path.glob("apo.db*"))
    assert b"Which team" in written and b"sk-test" not in written
    store = SqliteStore(path)
    rollout = asyncio.run(store.query_rollouts(limit=1))[0]
    assert any(s.attributes.get("gen_ai.request.model") == "agent-model" for s in asyncio.run(store.query_spans(rollout.rollout_id)))


def test_cli_apo_says_what_is_missing(tmp_path: Path, fake: FakeLLM, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    common = ["apo", "--base-url", fake.base_url, "--model", "agent-model", "--store", str(tmp_path / "x.db")]

    def run(*args: str) -> str:
        assert cli.main([*common, *args]) == 2
        return " ".join(capsys.readouterr().out.split())  # as one line, however rich wrapped it

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert "set OPENAI_API_KEY" in run()
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    assert "no agent file at" in run("--agent-file", str(tmp_path / "nope.py"))
    (tmp_path / "half.py").write_text("agent = print\n")
    assert "does not define seed_prompt, train_data, val_data" in run("--agent-file", str(tmp_path / "half.py"))
    assert "APO steps must be an integer of at least 0, got -1" in run("--rounds", "-1")  # the older flag
    assert "cannot call model 'gpt-nope'" in run("--critic-model", "gpt-nope", "--val-batch-size", "4")


@pytest.mark.slow
def test_cli_apo_never_prints_or_stores_a_key_the_endpoint_echoes_in_an_unusable_reply(
    tmp_path: Path, fake: FakeLLM, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    key = "apo-endpoint-key-424242"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    fake.leak_key["critic-model"] = 1
    path = tmp_path / "apo.db"
    assert cli.main(["apo", "--base-url", fake.base_url, "--model", "agent-model", "--critic-model", "critic-model",
                     "--editor-model", "editor-model", "--rounds", "1", "--train-batch-size", "4",
                     "--store", str(path)]) == 0
    printed = capsys.readouterr()
    unusable = [r.getMessage() for r in caplog.records if "unusable" in r.getMessage()]
    assert len(unusable) == 1 and "for key [redacted]" in unusable[0]  # the echo was there
    for text in (printed.out, printed.err, caplog.text):
        assert key not in text
    assert key.encode() not in b"".join(p.read_bytes() for p in tmp_path.glob("apo.db*"))

"""How the suite shares two workers (`pytest -n 2 --dist loadgroup`, pytest-xdist): the Qwen tests run on one worker
one after another, and so do the other vLLM tests; these two groups start first (they are the longest), and every
other test goes to whichever worker is free.

pytest-xdist's own groups (the `xdist_group` marker) work by renaming each test `name@group`, which pytest 9.2's
node ids no longer allow. So each worker writes the group of every heavy test it collected to a file that the
controller, which collects nothing itself, reads when it splits the run into units of work."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

HEAVY_GROUPS = ("qwen", "vllm")
"""A test with one of these markers belongs to the first one's group: the Qwen tests (one 0.5B model at a time, its
vLLM server included: 24 GiB hold one, not two beside everything else) and the other vLLM tests (one SmolLM2 server
for them all, tests/conftest.py)."""
GROUPS_FILE = "agentgrad_groups_file"


def heavy_group(item: pytest.Item) -> str | None:
    return next((marker for marker in HEAVY_GROUPS if item.get_closest_marker(marker)), None)


class GroupedScheduling(LoadScopeScheduling):
    """pytest-xdist's scope scheduling, a scope being a heavy group or else a single test."""

    def __init__(self, config: pytest.Config, log: Any, groups_file: Path) -> None:
        super().__init__(config, log)
        self.groups_file = groups_file
        self.groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self.groups is None:  # the workers wrote them before reporting their collection
            self.groups = {}
            for written in sorted(self.groups_file.parent.glob(self.groups_file.name + ".*")):
                self.groups.update(json.loads(written.read_text()))
        return self.groups.get(nodeid, nodeid)


class GroupsPlugin:
    """Registered on the controller and on each worker (tests/conftest.py)."""

    def __init__(self, config: pytest.Config) -> None:
        self.groups_file: Path | None = None
        if config.getvalue("dist") == "loadgroup":  # the controller (a worker's is "no"), before it starts them
            import tempfile

            self.groups_file = Path(tempfile.mkdtemp(prefix="agentgrad-xdist-")) / "groups"

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        return None if self.groups_file is None else GroupedScheduling(config, log, self.groups_file)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        if self.groups_file is not None:
            node.workerinput[GROUPS_FILE] = str(self.groups_file)

    @pytest.hookimpl(tryfirst=True)  # before the worker reports its collection to the controller
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        workerinput = getattr(session.config, "workerinput", {})
        if GROUPS_FILE in workerinput:
            groups = {item.nodeid: group for item in session.items if (group := heavy_group(item))}
            Path(f"{workerinput[GROUPS_FILE]}.{workerinput['workerid']}").write_text(json.dumps(groups))

    def pytest_sessionfinish(self) -> None:
        if self.groups_file is not None:
            import shutil

            shutil.rmtree(self.groups_file.parent, ignore_errors=True)

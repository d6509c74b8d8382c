"""A second host for tests and benchmarks: a network namespace with a veth pair, an address on each side.

It shares no loopback with this host, so only what is served on this side's address of the link is reachable
from it, as from another machine. Making one needs root and iproute2 (`ip`).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


class NoSecondHost(Exception):
    """Network namespaces cannot be made here; the message says why."""


@dataclass(frozen=True)
class SecondHost:
    namespace: str
    here: str  # this host's address on the link between the two
    there: str  # the second host's

    def run(self, *command: str, **options: object) -> subprocess.Popen[bytes]:
        """`command` started on the second host (its environment and working folder are this process's)."""
        return subprocess.Popen(["ip", "netns", "exec", self.namespace, *command], **options)  # type: ignore[call-overload]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextmanager
def second_host() -> Iterator[SecondHost]:
    """A new namespace linked to this one on a /30 of its own; removed on the way out."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        raise NoSecondHost("a second host needs a network namespace: run as root with iproute2 (`ip`) installed")
    name = f"ag{uuid.uuid4().hex[:8]}"
    subnet = f"10.{random.randint(100, 250)}.{random.randint(0, 255)}"
    here, there = f"{subnet}.1", f"{subnet}.2"
    try:
        _ip("netns", "add", name)
    except subprocess.CalledProcessError as exc:
        raise NoSecondHost(f"cannot make a network namespace here ({exc.stderr.decode().strip()})") from None
    try:
        _ip("link", "add", f"{name}a", "type", "veth", "peer", "name", f"{name}b")
        _ip("link", "set", f"{name}b", "netns", name)
        _ip("addr", "add", f"{here}/30", "dev", f"{name}a")
        _ip("link", "set", f"{name}a", "up")
        _ip("-n", name, "addr", "add", f"{there}/30", "dev", f"{name}b")
        _ip("-n", name, "link", "set", f"{name}b", "up")
        _ip("-n", name, "link", "set", "lo", "up")
        yield SecondHost(name, here, there)
    finally:
        subprocess.run(["ip", "link", "del", f"{name}a"], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)

"""Does every node see the head's ``OUTPUT_DIR``? A token the head writes and a mark each node writes back.

A multi-node run writes its checkpoints from every rank into one directory and resumes from it; on a directory that is
local to each node (a path not mounted from the shared file system, or the container's own disk) every node keeps only
its own shards, and the first resume fails or, worse, loads a mix. So before the launch the head writes a fresh random
token under ``OUTPUT_DIR/.r1-ascend/cluster/``; each node, once joined, reads it there and writes it back under
``nodes/<its IP>``; the head launches only when every node that joined has written the current token. A node that sees
no token leaves the cluster saying why; the head names the nodes whose mark is missing. Nothing here depends on the
nodes' clocks.
"""

from __future__ import annotations

import secrets
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

from r1_ascend.atomic import atomic_write_text

TOKEN = "token"
NODES = "nodes"
#: Random bytes of a token (written as hex): two starts never share one.
TOKEN_BYTES = 16
#: Seconds between looks at the shared directory (a network file system may show a new file after a while).
POLL_SECONDS = 0.5


def write_token(shared: Path) -> str:
    """A fresh token for this cluster start (earlier nodes' marks are removed with the old one)."""
    shutil.rmtree(shared / NODES, ignore_errors=True)
    (shared / NODES).mkdir(parents=True)
    token = secrets.token_hex(TOKEN_BYTES)
    atomic_write_text(shared / TOKEN, token + "\n")
    return token


def read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def mark(shared: Path, node_ip: str, timeout: float, poll: float = POLL_SECONDS) -> str:
    """Write the head's token back as this node's mark; ``FileNotFoundError`` naming the path when no token appears
    within ``timeout`` seconds (this node does not see the head's directory)."""
    deadline = time.monotonic() + timeout
    while (token := read_text(shared / TOKEN)) is None:
        if time.monotonic() >= deadline:
            msg = (
                f"no token at {shared / TOKEN} after {timeout:g} s: the head writes it there before it starts Ray, so "
                "this node does not see the head's OUTPUT_DIR (a local directory, or another mount)"
            )
            raise FileNotFoundError(msg)
        time.sleep(poll)
    (shared / NODES).mkdir(exist_ok=True)  # the head made it with the token; a node only fills it
    atomic_write_text(shared / NODES / node_ip, token + "\n")
    return token


def unmarked(shared: Path, node_ips: Iterable[str]) -> list[str]:
    """The nodes among ``node_ips`` whose mark is missing or carries another token than the current one."""
    token = read_text(shared / TOKEN)
    return sorted(ip for ip in node_ips if token is None or read_text(shared / NODES / ip) != token)

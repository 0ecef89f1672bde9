"""Ports of this host: a free one for a server, and who holds one (Linux /proc)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

from bench.serve.launch import HOST


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_listener(port: int) -> int | None:
    """The pid of the process listening on TCP `port` of this host, or None when there is no
    listener or /proc cannot tell (Linux only). Host-networked containers' sockets show too."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    return int(entry.name)
        except OSError:
            continue  # gone, or not ours to look into
    return None


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def foreign_port_holder(port: int, owns: Callable[[int], bool]) -> str | None:
    """Who else holds a TCP port of this host, described ("pid 12 (nc)"), or None when nobody
    or the server itself (`owns`) does. For handles whose server runs on this host, in its
    network namespace (a local process group, a host-networked container)."""
    owner = port_listener(port)
    if owner is None or owns(owner):
        return None
    return f"pid {owner} ({process_name(owner)})"

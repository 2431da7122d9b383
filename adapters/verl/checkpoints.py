"""MegaScale's two-stage checkpoint, in verl's own layout.

**Stage 1**, every ``snapshot_every`` steps, on the trainer's critical path: verl's own FSDP
checkpoint code writes each rank's model, optimizer and extra state into host memory (a tmpfs
folder, ``snapshot_dir``, ``/dev/shm`` by default). That memory belongs to no process, so it
survives every trainer rank; rebuilding a trainer group restores from it with verl's own loader.

**Stage 2**, at verl's ``save_freq``, off the critical path: a :class:`SnapshotHost` for each
node (in the trainer's process for its own node, a Ray actor on any other) copies its ranks'
files into ``default_local_dir/global_step_N`` in the background, hashing them as they go; the
trainer adds verl's ``data.pt`` and a manifest (every file's size
and SHA-256), and the folder appears under its final name by one rename of a
``global_step_N.rlweave-partial`` folder, after which the tracker file
``latest_checkpointed_iteration.txt`` is replaced atomically too. So verl's ``resume_mode=auto``
finds it, also with rlweave off, and a crash mid-write never leaves a half checkpoint under
the name verl loads. (verl 0.9 writes no tracker at all for ``checkpoint.async_save=True``, so
``auto`` never finds an async checkpoint; here the tracker is written when the background
write has finished, which is the fix.)

**Restore**: on resume, the newest checkpoint is staged from storage into host memory by the
node's :class:`SnapshotHost`, verifying each file against the manifest as it is read: storage is
read once per node, and the node's ranks load their shards from memory. A checkpoint that fails
(a checksum differs, a file is missing or cut short) is skipped for the previous good one,
with a message. A ``global_step_N`` without a manifest was written by verl itself; it is loaded
unverified, as verl would.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import socket
from collections.abc import Callable, Iterable
from pathlib import Path

import ray

MANIFEST = "rlweave_manifest.json"
TRACKER = "latest_checkpointed_iteration.txt"
PARTIAL = ".rlweave-partial"
RANK_FILE = re.compile(r"_rank_(\d+)\.pt$")
CHUNK = 1 << 22


def step_folder(root: str | os.PathLike, step: int) -> Path:
    return Path(root) / f"global_step_{step}"


def _copy_hashing(src: Path, dst: Path) -> tuple[int, str]:
    """Copy ``src`` to ``dst``, fsynced; returns (size, sha256) of what was read."""
    digest, size = hashlib.sha256(), 0
    dst.parent.mkdir(parents=True, exist_ok=True)
    with src.open("rb") as fin, dst.open("wb") as fout:
        while chunk := fin.read(CHUNK):
            digest.update(chunk)
            fout.write(chunk)
            size += len(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    return size, digest.hexdigest()


def hash_file(path: Path) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _mine(relative: str, ranks: set[int] | None) -> bool:
    """Whether a host with ``ranks`` copies this file: its ranks' shards and (on the host of
    rank 0) the files that belong to no rank."""
    m = RANK_FILE.search(relative)
    if ranks is None:
        return True
    return int(m.group(1)) in ranks if m else 0 in ranks


class SnapshotHost:
    """One per node of the trainer ranks: moves their checkpoint files between host memory and
    storage, hashing what it reads."""

    def node(self) -> str:
        return socket.gethostname()

    def persist(self, source: str, target: str, ranks: list[int] | None) -> dict[str, list]:
        """Copy this node's files of snapshot ``source`` into ``target``: relative path ->
        [size, sha256]."""
        out = {}
        wanted = None if ranks is None else set(ranks)
        for path in sorted(Path(source).rglob("*")):
            relative = str(path.relative_to(source))
            if path.is_file() and _mine(relative, wanted):
                out[relative] = list(_copy_hashing(path, Path(target) / relative))
        return out

    def stage(self, source: str, target: str, files: dict[str, list] | None,
              ranks: list[int] | None) -> list[str]:
        """Copy this node's files of checkpoint ``source`` into host memory ``target``, checking
        each against the manifest's ``files`` as it is read; returns what is wrong."""
        wanted = None if ranks is None else set(ranks)
        problems = []
        listed = files if files is not None else {str(p.relative_to(source)): None
                                                   for p in Path(source).rglob("*") if p.is_file()}
        for relative, expected in sorted(listed.items()):
            if not _mine(relative, wanted):
                continue
            src = Path(source) / relative
            if not src.is_file():
                problems.append(f"{relative}: missing")
                continue
            size, digest = _copy_hashing(src, Path(target) / relative)
            if expected is not None and size != expected[0]:
                problems.append(f"{relative}: {size} bytes, {expected[0]} recorded (cut short or grown)")
            elif expected is not None and digest != expected[1]:
                problems.append(f"{relative}: checksum differs from the one recorded")
        return problems

    def remove(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)


def start_hosts(nodes: dict[str, list[int]], here: str) -> dict[str, object]:
    """A :class:`SnapshotHost` for each Ray node id in ``nodes`` (node -> its trainer ranks):
    on node ``here`` (the caller's) an object in this process, elsewhere a Ray actor on that
    node. (An actor of its own would cost an idle Ray worker's CPU all job long, on the node
    whose host processes the trainer's step shares.)"""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    cls = ray.remote(SnapshotHost)
    return {node: SnapshotHost() if node == here else
            cls.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
            for node in nodes}


def on_each_host(hosts: dict[str, object], method: str, args_of: Callable[[str], tuple]) -> list:
    """``method(*args_of(node))`` on every node's host, the remote ones in parallel with the
    local one; the answers in the order of ``hosts``."""
    remote = {node: getattr(host, method).remote(*args_of(node))
              for node, host in hosts.items() if not isinstance(host, SnapshotHost)}
    local = {node: getattr(host, method)(*args_of(node))
             for node, host in hosts.items() if isinstance(host, SnapshotHost)}
    return [local[node] if node in local else ray.get(remote[node]) for node in hosts]


def write_json_atomically(path: Path, value: object) -> None:
    tmp = path.with_name(path.name + PARTIAL)
    with tmp.open("w") as f:
        json.dump(value, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_tracker(root: Path, step: int) -> None:
    """verl's tracker file, replaced atomically (a reader sees the old step or the new one)."""
    tmp = root / (TRACKER + PARTIAL)
    tmp.write_text(str(step))
    with tmp.open("rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, root / TRACKER)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def finish_persist(root: Path, step: int, files: dict[str, list], dataloader_state: bytes,
                   world_size: int, keep: int | None) -> Path:
    """Stage 2's last part, once every host has copied: verl's ``data.pt``, the manifest, the
    rename to ``global_step_<step>``, the tracker, and the retention verl's
    ``max_actor_ckpt_to_keep`` asks for. Returns the final folder."""
    partial = root / f"global_step_{step}{PARTIAL}"
    data = partial / "data.pt"
    data.write_bytes(dataloader_state)
    files = {**files, "data.pt": list(hash_file(data))}
    write_json_atomically(partial / MANIFEST, {"step": step, "world_size": world_size, "files": files,
                                               "writer": "rlweave.resilience"})
    _fsync_dir(partial)
    final = step_folder(root, step)
    if final.exists():  # a redone step's earlier checkpoint
        shutil.rmtree(final)
    os.rename(partial, final)
    _fsync_dir(root)
    write_tracker(root, step)
    if keep:
        for old in sorted(persisted_steps(root))[:-keep]:
            shutil.rmtree(step_folder(root, old), ignore_errors=True)
    return final


def persisted_steps(root: str | os.PathLike) -> list[int]:
    """Steps with a ``global_step_N`` folder under ``root`` (partial writes excluded)."""
    out = []
    for path in Path(root).glob("global_step_*"):
        m = re.fullmatch(r"global_step_(\d+)", path.name)
        if m and path.is_dir():
            out.append(int(m.group(1)))
    return sorted(out)


def read_manifest(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        return {"files": {}, "unreadable": True}


def quick_problems(folder: Path, manifest: dict | None) -> list[str]:
    """What a look at the sizes finds wrong (the checksums are checked while staging)."""
    if manifest is None:
        return []
    if manifest.get("unreadable"):
        return [f"{MANIFEST}: unreadable"]
    problems = []
    for relative, (size, _) in sorted(manifest["files"].items()):
        path = folder / relative
        if not path.is_file():
            problems.append(f"{relative}: missing")
        elif path.stat().st_size != size:
            problems.append(f"{relative}: {path.stat().st_size} bytes, {size} recorded (cut short or grown)")
    return problems


def serialized_dataloader(state: object) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def corrupt(folder: Path, how: str = "flip") -> str:
    """The chaos tool's checkpoint fault: damage the largest shard of ``folder`` (``flip``
    bytes in its middle, ``truncate`` it to half, or ``delete`` it). Returns what was done."""
    shards = sorted((p for p in folder.rglob("*.pt")), key=lambda p: p.stat().st_size)
    if not shards:
        raise FileNotFoundError(f"no checkpoint shard (*.pt) under {folder}")
    victim = shards[-1]
    size = victim.stat().st_size
    if how == "truncate":
        with victim.open("r+b") as f:
            f.truncate(size // 2)
    elif how == "delete":
        victim.unlink()
    else:
        with victim.open("r+b") as f:
            f.seek(size // 2)
            chunk = f.read(64)
            f.seek(size // 2)
            f.write(bytes(b ^ 0xFF for b in chunk))
    return f"{how} {victim.relative_to(folder)} ({size} bytes)"


def newest_first(root: str | os.PathLike) -> Iterable[int]:
    return reversed(persisted_steps(root))

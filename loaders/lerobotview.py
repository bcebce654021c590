"""``make_loader(..., output="lerobot")``: minibatches shaped as LeRobot's ``LeRobotDataset`` items, batched.

LeRobot's training code reads a batch as a mapping of LeRobot feature keys (with dots) to tensors,
images as float32 ``(B, C, H, W)`` in [0, 1], scalars as ``(B,)``, and ``task``: the task string of
each sample. This module renames and converts a loader's minibatch accordingly (in the main process,
after the gather; a few µs per key plus the image conversion). The work done where a minibatch is
gathered (``delta_timestamps`` windows with ``<key>_is_pad``, imported video frames decoded from
their packets) is loaders/lerobotwindows.py's.
"""

from __future__ import annotations

from typing import Any

import torch

from replaystore.schemas import Dense, Schema

GYM_KEYS = {"obs": "observation.state", "action": "action", "reward": "next.reward", "terminated": "next.done"}
"""The LeRobot keys of the step fields of a store not imported from LeRobot (an image ``obs`` is
``observation.image``; other names have ``__`` spelled ``.``); the LeRobot export uses the same."""

PACKET_SUFFIXES = ("__pts", "__dts", "__key", "__offsets")
"""The companion fields of an imported video feature's packets (left out of the view with the packets)."""


def is_frames(f: Any) -> bool:
    """Whether ``f`` is a field of uint8 frames ``(H, W, C)``, C 1 or 3, H and W at least 16.

    Parameters
    ----------
    f : Field
        A schema field.

    Returns
    -------
    bool
        True for image fields.
    """
    return (isinstance(f, Dense) and f.dtype == "uint8" and len(f.shape) == 3 and f.shape[2] in (1, 3)
            and f.shape[0] >= 16 and f.shape[1] >= 16)


def lerobot_keys(schema: Schema) -> dict[str, str]:
    """The LeRobot feature key of each field of ``schema`` the view (and the export) carries.

    A store imported from LeRobot keeps its keys (schema metadata ``lerobot.keys``; its video
    packets are left out); any other store maps ``obs``, ``action``, ``reward``, ``terminated`` as
    :data:`GYM_KEYS` and other dense fields with ``__`` spelled ``.`` (``next_obs``, ``truncated``
    and ragged fields are left out).

    Parameters
    ----------
    schema : Schema
        The table's schema.

    Returns
    -------
    dict of str to str
        Field name to LeRobot key, in field order.
    """
    keep = schema.metadata.get("lerobot")
    if isinstance(keep, dict) and isinstance(keep.get("keys"), dict):
        videos = set(keep.get("videos") or {})
        return {n: k for n, k in keep["keys"].items() if k not in videos and n in schema}
    out = {}
    for f in schema.fields:
        if not isinstance(f, Dense) or f.name in ("next_obs", "truncated"):
            continue
        key = GYM_KEYS.get(f.name) or f.name.replace("__", ".")
        out[f.name] = "observation.image" if f.name == "obs" and is_frames(f) else key
    return out


def video_fields(schema: Schema) -> dict[str, str]:
    """The imported video features of ``schema``: packet field name to LeRobot key.

    Parameters
    ----------
    schema : Schema
        The table's schema.

    Returns
    -------
    dict of str to str
        Empty for a store not imported from LeRobot or without videos.
    """
    keep = schema.metadata.get("lerobot")
    if not isinstance(keep, dict) or not isinstance(keep.get("keys"), dict):
        return {}
    videos = set(keep.get("videos") or {})
    return {n: k for n, k in keep["keys"].items() if k in videos and n in schema}


def tasks_of(schema: Schema) -> list[str]:
    """The task strings by task index: an imported dataset's tasks, else one (``env_id`` or the schema's name).

    Parameters
    ----------
    schema : Schema
        The table's schema.

    Returns
    -------
    list of str
        At least one task.
    """
    keep = schema.metadata.get("lerobot")
    if isinstance(keep, dict) and isinstance(keep.get("tasks"), list) and keep["tasks"]:
        return [str(t) for t in keep["tasks"]]
    env = schema.metadata.get("env_id")
    return [env if isinstance(env, str) else schema.name]


def to_lerobot(batch: dict[str, Any], schema: Schema) -> dict[str, Any]:
    """A loader minibatch as a batch of LeRobot items.

    Fields take their LeRobot keys (:func:`lerobot_keys`); frames become float32
    ``(..., C, H, W)`` in [0, 1] (a stack or window keeps its leading dimensions), as
    ``LeRobotDataset`` returns decoded images; ``task`` is the list of each sample's task string
    (from ``task_index`` when the batch has it). ``indices`` and the sampler's outputs keep their
    names; fields without a LeRobot key (``next_obs``, ragged fields, an imported video's packets
    and their companion fields) are left out. An imported video field the worker half decoded
    (uint8 frames) takes its key and becomes float32 frames; ``<field>_is_pad`` becomes
    ``<key>_is_pad``.

    Parameters
    ----------
    batch : dict of str to Any
        As the loader yields it (tensors).
    schema : Schema
        The table's schema.

    Returns
    -------
    dict of str to Any
        The LeRobot-shaped batch.
    """
    keys = lerobot_keys(schema)
    videos = video_fields(schema)
    keys.update(videos)
    keys.update({n + "_is_pad": k + "_is_pad" for n, k in list(keys.items())})
    fields = {f.name: f for f in schema.fields}
    names = set(schema.names) | {n + s for n in schema.names for s in PACKET_SUFFIXES}  # (left out)
    out: dict[str, Any] = {}
    for name, value in batch.items():
        if name in keys:
            f = fields.get(name)
            if (is_frames(f) or name in videos) and isinstance(value, torch.Tensor):
                value = value.movedim(-1, -3).to(torch.float32).div_(255.0)
            out[keys[name]] = value
        elif name not in names and not name.endswith("_offsets"):
            out[name] = value  # indices, the sampler's outputs
    tasks = tasks_of(schema)
    ix = batch.get("task_index")
    n = len(batch["indices"]) if "indices" in batch else 0
    if isinstance(ix, torch.Tensor) and ix.ndim >= 1:
        flat = ix.reshape(len(ix), -1)[:, -1].tolist()
        out["task"] = [tasks[i] if 0 <= i < len(tasks) else str(i) for i in flat]
    else:
        out["task"] = [tasks[0]] * n
    return out

"""Stacked observations stored as frames: each frame once, the stacks rebuilt by the ``stack=`` samplers.

An observation stacked by gymnasium's ``FrameStackObservation`` (a new leading axis of ``k``
frames) or by SB3's ``VecFrameStack`` (``k`` frames of ``C`` channels concatenated along the
channel axis, first or last) is the last ``k`` frames of its episode, padded at the episode's
start by repeating its first frame (``"reset"``) or with zeros (``"zero"``). The recorders and
the SB3 buffers store only the newest frame of each observation (the ``frames`` layout); the
loaders' frame stacking (``stack=k``, ``stack_padding=``) rebuilds the stacks. :class:`FrameStack`
checks each observation against that rule, so what is sampled equals what was observed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from replaystore.errors import RecordingError

PADDINGS = ("reset", "zero")
"""Episode-start paddings: repeat the episode's first frame (gymnasium's default), or zeros (SB3's)."""

DEFAULT_CODEC = "zstd"
"""The frame field's codec."""


def frame_field(sfx: str) -> str:
    """The frame field of an observation leaf: ``"frame"``, or ``"frame_<key>"`` for leaf ``obs__<key>``.

    Parameters
    ----------
    sfx : str
        The leaf's column suffix (``""``, ``"__image"``, ``"__pos__0"``).

    Returns
    -------
    str
        A top-level dense field (``"frame_pos_0"``): the loaders' ``stack_field=``.
    """
    return "frame" + sfx.replace("__", "_")


class FrameStack:
    """How a stacked observation splits into frames, and the checks that it is one.

    Parameters
    ----------
    name : str
        The observation's name in errors (``"obs"``, ``"obs__image"``).
    obs_shape : tuple of int
        One (unbatched) observation's shape.
    stack : int
        Frames per observation.
    padding : str
        ``"reset"`` or ``"zero"``.
    axis : int
        The stacking axis of one observation: 0 or -1.
    new_axis : bool
        Whether the frames were stacked on a new axis (``FrameStackObservation``: the frame
        shape is ``obs_shape[1:]``); otherwise they are concatenated along ``axis``
        (``VecFrameStack``: the frame keeps ``obs_shape[axis] // stack`` channels there).

    Raises
    ------
    RecordingError
        ``stack`` not an int of at least 2, a ``padding`` not in :data:`PADDINGS`, or a shape
        that does not split into ``stack`` frames along ``axis``.
    """

    def __init__(self, name: str, obs_shape: tuple[int, ...], stack: Any, padding: Any, *, axis: int = 0,
                 new_axis: bool = True) -> None:
        if not isinstance(stack, (int, np.integer)) or isinstance(stack, bool) or int(stack) < 2:
            raise RecordingError(f"frame_stack: expected an int >= 2 (frames per observation), got {stack!r}")
        if padding not in PADDINGS:
            raise RecordingError(f"frame_padding: expected one of {PADDINGS}, got {padding!r}")
        shape = tuple(int(d) for d in obs_shape)
        if not shape or shape[axis] % int(stack):
            raise RecordingError(f"frame_stack: observation {name!r} of shape {shape} does not split into "
                                 f"{int(stack)} frames along axis {axis}")
        self.name, self.stack, self.padding, self.axis = name, int(stack), str(padding), axis
        self.obs_shape = shape
        self.new_axis = bool(new_axis and axis == 0 and shape[0] == self.stack)
        self.channels = shape[axis] // self.stack
        if self.new_axis:
            self.frame_shape: tuple[int, ...] = shape[1:]
        elif axis == 0:
            self.frame_shape = (self.channels, *shape[1:])
        else:
            self.frame_shape = (*shape[:-1], self.channels)
        self.frame_bytes = math.prod(self.frame_shape)

    def _split(self, obs: np.ndarray) -> np.ndarray:
        """``[n, *obs_shape]`` as ``[n, stack, *frame_shape]`` (a view where it can be)."""
        n = obs.shape[0]
        if self.new_axis:
            return obs
        if self.axis == 0:
            return obs.reshape(n, self.stack, *self.frame_shape)
        split = obs.reshape(n, *self.obs_shape[:-1], self.stack, self.channels)
        return np.moveaxis(split, -2, 1)

    def newest(self, obs: np.ndarray) -> np.ndarray:
        """The newest frame of each observation: ``[n, *obs_shape]`` to ``[n, *frame_shape]`` (a copy).

        Parameters
        ----------
        obs : numpy.ndarray
            Observations, one per row.

        Returns
        -------
        numpy.ndarray
            The frames.
        """
        return np.ascontiguousarray(self._split(obs)[:, -1])

    def join(self, stacked: np.ndarray) -> np.ndarray:
        """Sampled stacks ``[n, stack, *frame_shape]`` as observations ``[n, *obs_shape]``.

        Parameters
        ----------
        stacked : numpy.ndarray
            What a ``stack=`` sampler gives for ``obs`` or ``next_obs``.

        Returns
        -------
        numpy.ndarray
            The observations, as the environment gave them.
        """
        n = stacked.shape[0]
        if self.new_axis or self.axis == 0:
            return stacked.reshape(n, *self.obs_shape)
        return np.moveaxis(stacked, 1, -2).reshape(n, *self.obs_shape)

    def slides(self, obs: np.ndarray, next_obs: np.ndarray) -> np.ndarray:
        """Whether each ``next_obs`` is its ``obs`` moved on by one frame (per row).

        Parameters
        ----------
        obs, next_obs : numpy.ndarray
            ``[n, *obs_shape]`` each.

        Returns
        -------
        numpy.ndarray
            bool per row.
        """
        a, b = self._split(obs), self._split(next_obs)
        n = a.shape[0]
        return (a[:, 1:] == b[:, :-1]).reshape(n, -1).all(axis=1)

    def starts(self, obs: np.ndarray) -> np.ndarray:
        """Whether each observation is an episode's first: its newest frame and the padding before it.

        Parameters
        ----------
        obs : numpy.ndarray
            ``[n, *obs_shape]``.

        Returns
        -------
        numpy.ndarray
            bool per row.
        """
        a = self._split(obs)
        n = a.shape[0]
        older = a[:, :-1]
        if self.padding == "zero":
            return np.asarray(~older.reshape(n, -1).any(axis=1))
        return np.asarray((older == a[:, -1:]).reshape(n, -1).all(axis=1))

    def refuse(self, what: str, rows: np.ndarray) -> RecordingError:
        """The error for observations that are not stacks of this kind.

        Parameters
        ----------
        what : str
            What was wrong (``"does not continue the last observation"``).
        rows : numpy.ndarray
            The offending env indices.

        Returns
        -------
        RecordingError
            Naming the observation, the env indices and the stacking expected.
        """
        return RecordingError(
            f"{self.name}: the observation of env {rows.tolist()} {what}, so it is not a stack of the last "
            f"{self.stack} frames with {self.padding!r} padding (frame_stack={self.stack}, "
            f"frame_padding={self.padding!r}); nothing of the step is kept")

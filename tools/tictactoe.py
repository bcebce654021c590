"""Tic-tac-toe, vectorised over many parallel games, emitting DqnBatch-shaped records.

The demo's built-in game: legal-action sets change every move, games end in wins,
losses or draws, and the turn alternates, so each player's records bootstrap from
its own next decision (one-step windows: ``discounts`` is gamma where the player
moves again and 0 on the final record of each player).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ACTIONS = 9
OBSERVATION_SIZE = 18  # own marks (9) then opponent marks (9), from the mover's perspective
LINES = np.array([[0, 1, 2], [3, 4, 5], [6, 7, 8], [0, 3, 6], [1, 4, 7], [2, 5, 8], [0, 4, 8], [2, 4, 6]])


def observe(board: np.ndarray, player: int) -> np.ndarray:
    """Boards ``(games, 9)`` with 1/-1/0 marks -> mover-perspective float32 observations.

    Parameters
    ----------
    board : numpy.ndarray
        ``(games, 9)`` boards.
    player : int
        The mover (0 plays 1, 1 plays -1).

    Returns
    -------
    numpy.ndarray
        ``(games, 18)``: own marks, then the opponent's.
    """
    mine = (board == (1 if player == 0 else -1)).astype(np.float32)
    theirs = (board == (-1 if player == 0 else 1)).astype(np.float32)
    return np.concatenate([mine, theirs], axis=-1)


def winner(board: np.ndarray) -> np.ndarray:
    """+1 / -1 where that mark completed a line, else 0 (per game).

    Parameters
    ----------
    board : numpy.ndarray
        ``(games, 9)`` boards.

    Returns
    -------
    numpy.ndarray
        Per game.
    """
    sums = board[:, LINES].sum(axis=2)
    return np.where((sums == 3).any(axis=1), 1, np.where((sums == -3).any(axis=1), -1, 0))


@dataclass
class DqnRecords:
    """DqnBatch fields for a set of decisions (built by :func:`play`).

    Each attribute is the DqnBatch field of the same name (see
    :func:`replaystore.schemas.dqn`).
    """

    obs: np.ndarray
    next_obs: np.ndarray
    players: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    can_bootstrap: np.ndarray
    discounts: np.ndarray
    masks: np.ndarray
    legal_ids: np.ndarray
    legal_offsets: np.ndarray
    next_legal_ids: np.ndarray
    next_legal_offsets: np.ndarray


def _csr(legal_rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(legal_rows) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in legal_rows], out=offsets[1:])
    ids = np.concatenate(legal_rows).astype(np.int64) if legal_rows else np.zeros(0, np.int64)
    return ids, offsets


def play(policy, rng: np.random.Generator, gamma: float = 0.99) -> tuple[DqnRecords, int]:
    """Play one game with ``policy(obs, legal_ids, player, rng) -> action`` for both players.

    Parameters
    ----------
    policy : callable
        Chooses an action.
    rng : numpy.random.Generator
        Passed to ``policy``.
    gamma : float, optional
        The discount of a record whose player moves again.

    Returns
    -------
    records : DqnRecords
        The game's DQN records, in decision order.
    result : int
        The result from player 0's perspective (+1 win, 0 draw, -1 loss).
    """
    board = np.zeros((1, 9), dtype=np.int8)
    decisions: list[dict] = []
    player = 0
    result = 0
    while True:
        legal = np.flatnonzero(board[0] == 0)
        obs = observe(board, player)[0]
        action = int(policy(obs, legal, player, rng))
        board[0, action] = 1 if player == 0 else -1
        decisions.append({"player": player, "obs": obs, "legal": legal, "action": action})
        w = int(winner(board)[0])
        if w or not (board[0] == 0).any():
            result = w
            break
        player = 1 - player
    final_board = board.copy()
    rows = []
    for i, d in enumerate(decisions):
        nxt = next((decisions[j] for j in range(i + 1, len(decisions)) if decisions[j]["player"] == d["player"]),
                   None)
        sign = 1 if d["player"] == 0 else -1
        if nxt is None:  # this player's last decision: the game ends before it moves again
            reward = float(result * sign)
            rows.append((d, reward, True, observe(final_board, d["player"])[0], np.zeros(0, np.int64)))
        else:
            rows.append((d, 0.0, False, nxt["obs"], nxt["legal"]))
    ids, offsets = _csr([r[0]["legal"] for r in rows])
    next_ids, next_offsets = _csr([r[4] for r in rows])
    tail = np.array([r[2] for r in rows])
    return DqnRecords(
        obs=np.stack([r[0]["obs"] for r in rows]),
        next_obs=np.stack([r[3] for r in rows]),
        players=np.array([r[0]["player"] for r in rows], dtype=np.int64),
        actions=np.array([r[0]["action"] for r in rows], dtype=np.int64),
        rewards=np.array([r[1] for r in rows], dtype=np.float64),
        dones=tail.copy(),
        can_bootstrap=~tail,
        discounts=np.where(tail, 0.0, gamma).astype(np.float64),
        masks=np.ones((len(rows), 1), dtype=np.float32),
        legal_ids=ids,
        legal_offsets=offsets,
        next_legal_ids=next_ids,
        next_legal_offsets=next_offsets,
    ), result


def random_policy(obs: np.ndarray, legal: np.ndarray, player: int, rng: np.random.Generator) -> int:
    """A uniformly random legal action.

    Parameters
    ----------
    obs : numpy.ndarray
        The observation (unused).
    legal : numpy.ndarray
        The legal actions.
    player : int
        The mover (unused).
    rng : numpy.random.Generator
        The randomness.

    Returns
    -------
    int
        The action.
    """
    return int(rng.choice(legal))

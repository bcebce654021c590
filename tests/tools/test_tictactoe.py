"""The demo's built-in game emits valid DqnBatch records with the format's bootstrap rules."""

from __future__ import annotations

import numpy as np

from replaystore.schemas import dqn
from replaystore.tools import tictactoe


def test_games_emit_valid_dqn_records_with_format_tails():
    schema = dqn(tictactoe.OBSERVATION_SIZE, heads=1, actions=tictactoe.ACTIONS)
    rng = np.random.default_rng(0)
    results = []
    for _ in range(200):
        records, result = tictactoe.play(tictactoe.random_policy, rng)
        cols = schema.validate(records)
        results.append(result)
        next_counts = np.diff(cols["next_legal_offsets"])
        # can_bootstrap is true exactly when the next-legal slice is non-empty
        np.testing.assert_array_equal(cols["can_bootstrap"], next_counts > 0)
        np.testing.assert_array_equal(cols["discounts"][~cols["can_bootstrap"]], 0.0)
        assert (cols["discounts"][cols["can_bootstrap"]] > 0).all()
        # each player has exactly one final record; the game is zero-sum
        assert (~cols["can_bootstrap"]).sum() == 2
        assert cols["rewards"].sum() == 0.0
        # the chosen action was legal, and the next state's legal set excludes it
        for i in range(len(cols)):
            legal = cols["legal_ids"][cols["legal_offsets"][i]:cols["legal_offsets"][i + 1]]
            nxt = cols["next_legal_ids"][cols["next_legal_offsets"][i]:cols["next_legal_offsets"][i + 1]]
            assert cols["actions"][i] in legal and cols["actions"][i] not in nxt
    results = np.array(results)
    assert 0.45 < np.mean(results == 1) < 0.7  # random play: the first mover wins about 58%

"""Named seed streams: no attacker seed ever equals a client's.

The bug this guards against (main at 8b73000): the attacker's random
extractor estimate and a victim's private initial extractor were both
``derive_seed(0, 7, p)`` in round 7, so the "random" estimate was the
victim's own. Every seed now comes from ``derive_seed(stream, *parts)``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from flwr.app import RecordDict

from fedsim.clients.base import ClientEnv
from fedsim.core.scenario_file import scenario_from_dict
from fedsim.core.seeds import Party, SeedStream, choose, choose_below, derive_seed, stream_rng
from fedsim.scenario.components import client_spec

ROUNDS = range(1, 201)
PARTITIONS = range(201)
RESTARTS = range(8)


def _values(stream: SeedStream, seed: int) -> np.ndarray:
    """Every seed ``stream`` gives over rounds 1..200 and partitions 0..200."""
    axes = {"seed": [seed], "round": ROUNDS, "partition": PARTITIONS, "batch": PARTITIONS}
    parts = [axes[p] for p in stream.parts]
    return np.array([derive_seed(stream, *combo) for combo in itertools.product(*parts)])


def test_no_attacker_seed_equals_a_federation_seed() -> None:
    seed = 0  # federation.seed and audit.seed equal, as compare sets them
    federation = np.concatenate(
        [_values(s, seed) for s in SeedStream if s.party is Party.FEDERATION and s.parts]
    )
    # fedsim attack seeds per (round, partition), the audit's batches per round.
    attack_seeds = np.concatenate(
        [_values(SeedStream.ATTACK, seed), _values(SeedStream.AUDIT_ATTACK, seed)]
    )
    derived = [
        np.array(
            [derive_seed(SeedStream.ATTACK_RESTART, a, r) for a in attack_seeds for r in RESTARTS]
        ),
        np.array([derive_seed(SeedStream.ATTACK_MODEL, a) for a in attack_seeds]),
        np.array([derive_seed(SeedStream.ATTACK_CODES, a) for a in attack_seeds]),
    ]
    others = [
        _values(s, seed)
        for s in SeedStream
        if s.party is Party.ATTACKER and s.parts and "attack-seed" not in s.parts
    ]
    attacker = np.concatenate(
        [attack_seeds, *derived, *others, [derive_seed(SeedStream.LABEL_DUMMIES)]]
    )

    assert len(federation) > 200_000 and len(attacker) > 400_000
    assert not np.isin(attacker, federation).any()
    # Bare parts can no longer meet: round 7 of an attack vs a private init.
    assert derive_seed(SeedStream.ATTACK, 0, 7, 3) != derive_seed(SeedStream.PRIVATE_INIT, 0, 3)


def test_the_code_draws_from_the_named_streams() -> None:
    scenario = scenario_from_dict(
        {"federation": {"num-clients": 3, "seed": 5}, "data": {"samples-per-client": 20}}
    )
    env = ClientEnv.create(client_spec(scenario), 2, RecordDict())

    assert env.seed(7) == derive_seed(SeedStream.CLIENT_TRAIN, 5, 7, 2)
    assert env.private_seed() == derive_seed(SeedStream.PRIVATE_INIT, 5, 2)
    assert env.private_seed() != env.seed(7)


def test_streams_are_distinct_and_well_formed() -> None:
    tags = [s.tag for s in SeedStream]
    codes = {s.code for s in SeedStream}

    assert len(set(tags)) == len(tags) and len(codes) == len(tags)
    assert all(0 <= derive_seed(s, *([1] * len(s.parts))) < 2**63 for s in SeedStream)
    with pytest.raises(ValueError, match="takes"):
        derive_seed(SeedStream.CLIENT_TRAIN, 0, 1)


def test_choose_depends_on_the_set_not_the_order() -> None:
    items = [5, 1, 9, 3, 7]

    picked = choose(items, 2, SeedStream.SAMPLE_TRAIN, 0, 4)

    assert picked == choose(list(reversed(items)), 2, SeedStream.SAMPLE_TRAIN, 0, 4)
    assert len(picked) == 2 and set(picked) <= set(items)
    assert choose(items, 9, SeedStream.SAMPLE_TRAIN, 0, 4) == sorted(items)


def test_choose_below_draws_what_drawing_from_the_listed_range_drew() -> None:
    # A round's sample of 100,000 partitions is drawn without listing them, and is the
    # draw that listing them gave (runs sample the clients they sampled before).
    for size, count in [(10, 3), (1000, 10), (100_000, 100)]:
        for server_round in (1, 2):
            rng = stream_rng(SeedStream.SAMPLE_TRAIN, 0, server_round)
            listed = sorted(int(i) for i in rng.choice(list(range(size)), count, replace=False))
            assert choose_below(size, count, SeedStream.SAMPLE_TRAIN, 0, server_round) == listed
    assert choose_below(5, 9, SeedStream.SAMPLE_TRAIN, 0, 1) == [0, 1, 2, 3, 4]
